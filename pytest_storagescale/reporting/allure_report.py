"""Allure: each load step as an Allure test with stable parameters and attachments.

Active only when allure-pytest runs (``--alluredir``). Parameters that identify a
step (op, clients, endpoint, storage version) are plain, so Allure's history links
the same step across runs; measured numbers are *excluded* parameters (shown, not
part of the history id) and attachments: the seeds-style table (HTML and CSV), the
timeline, the latency ECDF, the step's JSON and, for a scan, rate vs clients with
the thresholds drawn (built from every step of the scan so far, any worker's).
``environment.properties`` and ``categories.json`` are written once per session by
the process that owns the results (the xdist controller).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from . import plots
from .html import table_csv, table_html

#: Allure categories, first match wins (hangs before other threshold failures)
CATEGORIES = [
    {"name": "Hung clients", "matchedStatuses": ["failed"],
     "messageRegex": "(?s).*broke its thresholds.*hung[^\\n]*VIOLATED.*"},
    {"name": "Threshold violations", "matchedStatuses": ["failed"],
     "messageRegex": "(?s).*broke its thresholds.*"},
    {"name": "Storage errors", "matchedStatuses": ["failed", "broken"],
     "messageRegex": "(?s).*(could not run|StorageError|StorageNotFound|StorageTimeout|"
                     "StorageUnreachable|StoragePermissionDenied).*"},
    {"name": "Test infrastructure", "matchedStatuses": ["broken", "failed"]},
]


def allure_dir(config: pytest.Config) -> Path | None:
    if not config.pluginmanager.hasplugin("allure_pytest"):
        return None
    directory = getattr(config.option, "allure_report_dir", None)
    return Path(directory) if directory else None


def attach_step(record: dict[str, Any], run_info: dict[str, Any],
                scan: list[dict[str, Any]]) -> None:
    """Describe the running test's step to Allure (called inside the test)."""
    import allure

    allure.dynamic.parameter("op", record["op"])
    allure.dynamic.parameter("clients", record["clients"])
    allure.dynamic.parameter("endpoint", run_info.get("endpoint_id", run_info["endpoint"]))
    allure.dynamic.parameter("storage version", run_info["version"])
    if record.get("label"):
        allure.dynamic.parameter(f"step {record['label']}", record["verdict"], excluded=True)
    for name in ("rate_hz", "mb_s", "succeeded", "failed", "hung"):
        if name in record:
            value = record[name]
            allure.dynamic.parameter(f"{name} ({record.get('label') or 'step'})",
                                     round(value, 3) if isinstance(value, float) else value,
                                     excluded=True)
    title = plots.step_title(record)
    allure.attach(table_html([record]), f"table: {title}", allure.attachment_type.HTML)
    allure.attach(table_csv([record]), f"table: {title} (CSV)", allure.attachment_type.CSV)
    if record.get("verdict") != "error":
        allure.attach(plots.timeline_png(record), f"timeline: {title}",
                      allure.attachment_type.PNG)
        allure.attach(plots.ecdf_png(record), f"latency ECDF: {title}",
                      allure.attachment_type.PNG)
    allure.attach(json.dumps(record, indent=1, default=str), f"step JSON: {title}",
                  allure.attachment_type.JSON)
    if scan and not record.get("label"):
        allure.attach(plots.scan_png(scan), f"scan: {record['op']} (rate, failed, hung "
                      f"vs clients)", allure.attachment_type.PNG)


def write_session_files(directory: Path, run_info: dict[str, Any]) -> None:
    """``environment.properties`` and ``categories.json`` (once, by the results owner)."""
    directory.mkdir(parents=True, exist_ok=True)
    client = run_info.get("client", {})
    properties = {
        "storage.system": run_info.get("system"),
        "storage.version": run_info.get("version"),
        "storage.endpoint": run_info.get("endpoint"),
        "storage.thresholds": run_info.get("thresholds_file"),
        "client.host": client.get("host"),
        **{f"client.{name}": version for name, version in client.get("versions", {}).items()},
    }
    lines = [f"{key}={_escape(str(value))}" for key, value in properties.items()
             if value is not None]
    (directory / "environment.properties").write_text("\n".join(lines) + "\n")
    (directory / "categories.json").write_text(json.dumps(CATEGORIES, indent=1))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(
        ":", "\\:")
