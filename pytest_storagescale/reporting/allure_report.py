"""Allure: each load step as an Allure test with stable parameters and attachments.

Active only when allure-pytest runs (``--alluredir``). Parameters that identify a
step (op, clients, endpoint, storage version) are plain, so Allure's history links
the same step across runs; measured numbers are *excluded* parameters (shown, not
part of the history id) and attachments: the seeds-style table (HTML and CSV), the
timeline, the latency ECDF, the step's JSON and, for a scan, rate vs clients with
the thresholds drawn (built from every step of the scan so far, any worker's).
``environment.properties`` and ``categories.json`` are written once per session by
the process that owns the results (the xdist controller).

Categories match failures by exception class. allure-pytest writes a failure's
``statusDetails.message`` as pytest's ``ExceptionInfo.exconly()``, which begins with
the class's qualified name::

    pytest_storagescale.errors.HungClientsViolation: ls step at 3 clients broke ...

and, for the outcome exceptions a step raises (``pytrace=False``), a ``trace`` that
is the message text alone, without the class. So every category is a
``messageRegex`` on that prefix, and rewording a message cannot move a failure to
another category. Allure puts a result into *every* category that matches (not the
first), so the regexes exclude each other: a hang is not also a threshold violation,
and "Test infrastructure" is whatever the others do not claim.

"Storage errors" is every failure the storage's answer caused, whatever test found
it: a driver's :class:`~..errors.StorageError` (any subclass), a load step that could
not run, a conformance check's finding (:class:`~..errors.StorageCheckFailure`) and
an ``assert`` in a test (``AssertionError``: a functional test asserts what the storage
answered). "Test infrastructure" is the harness and the client host: any other
exception (Allure's *broken*), a ``pytest.fail`` of a fixture, a usage problem.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ..cluster.hosts import ClusterError
from ..errors import (
    HungClientsViolation,
    StepError,
    StorageCheckFailure,
    StorageError,
    ThresholdViolation,
)
from ..load.executors import ClientsCrashed
from ..records import RunInfo, StepRecord
from ..redact import redact_html, redact_text
from . import plots
from .html import table_csv, table_html
from .results import json_text
from .table import format_derived

#: StorageError subclasses raised for the client side's fault: a client process that
#: crashed, a cluster of client hosts that cannot run the step
CLIENT_SIDE: tuple[type[BaseException], ...] = (ClientsCrashed, ClusterError)


def storage_failures() -> tuple[type[BaseException], ...]:
    """What the storage's answer caused: :class:`StorageError` and every subclass
    (a driver's, a site's; not :data:`CLIENT_SIDE`), a step that could not run
    (:class:`StepError`), a conformance check's finding (:class:`StorageCheckFailure`)
    and an ``assert`` in a test (a functional test asserts what the storage answered)."""
    found: list[type[BaseException]] = [StepError, StorageCheckFailure, AssertionError]
    pending: list[type[BaseException]] = [StorageError]
    while pending:
        cls = pending.pop(0)
        if cls not in found and cls not in CLIENT_SIDE:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return tuple(found)


#: an optional module path, then exactly one of these class names, then the message
_CLASS_PREFIX = r"(?:[\w.]+\.)?(?:{names})"


def _names(classes: tuple[type[BaseException], ...]) -> str:
    return "|".join(cls.__name__ for cls in classes)


def class_regex(*classes: type[BaseException]) -> str:
    """A regex matching an ``exconly()`` message of exactly one of ``classes`` (not
    of their subclasses), as Allure applies it: the whole message, dot matching
    newlines."""
    return "(?s)" + _CLASS_PREFIX.format(names=_names(classes)) + r"(?::.*)?"


def other_regex(*classes: type[BaseException]) -> str:
    """A regex matching every message that :func:`class_regex` of ``classes`` does not."""
    claimed = _CLASS_PREFIX.format(names=_names(classes))
    return rf"(?s)(?!{claimed}(?::|\Z)).*"


def categories() -> list[dict]:
    """Allure's categories (categories.json), matched by exception class: the storage
    errors are :func:`storage_failures` (known when the file is written, so a driver's
    own :class:`StorageError` subclass is one); "Test infrastructure" is the harness
    and the client host: whatever the others do not claim."""
    storage = storage_failures()
    return [
        {"name": "Hung clients", "matchedStatuses": ["failed"],
         "messageRegex": class_regex(HungClientsViolation)},
        {"name": "Threshold violations", "matchedStatuses": ["failed"],
         "messageRegex": class_regex(ThresholdViolation)},
        {"name": "Storage errors", "matchedStatuses": ["failed", "broken"],
         "messageRegex": class_regex(*storage)},
        {"name": "Test infrastructure", "matchedStatuses": ["failed", "broken"],
         "messageRegex": other_regex(HungClientsViolation, ThresholdViolation, *storage)},
    ]


def allure_dir(config: pytest.Config) -> Path | None:
    """The ``--alluredir`` folder when allure-pytest runs, else None."""
    if not config.pluginmanager.hasplugin("allure_pytest"):
        return None
    directory = getattr(config.option, "allure_report_dir", None)
    return Path(directory) if directory else None


#: measured numbers shown as excluded parameters (and every derived metric, such as
#: ``mix_ratio`` and ``recovery_s``); counts are whole numbers
_SHOWN = (("rate_hz", False), ("mb_s", False), ("succeeded", True), ("failed", True),
          ("hung", True), ("throttled", True))


def _parameters(record: StepRecord, run: RunInfo, *, door_parameter: bool) -> None:
    import allure

    allure.dynamic.parameter("op", record.section)
    allure.dynamic.parameter("clients", record.clients)
    if record.arrival_rate:  # an open loop: its clients are the cap, its rate the scan's
        allure.dynamic.parameter("arrival rate", f"{record.arrival_rate:g}/s")
    if door_parameter:  # the test runs once per door: the door tells the runs apart
        allure.dynamic.parameter("door", record.door)
    if record.door:  # a label, not a parameter: one-door runs keep their history ids
        allure.dynamic.label("door", record.door)
    allure.dynamic.parameter("endpoint", run.endpoint_id or run.endpoint)
    allure.dynamic.parameter("storage version", run.version)
    if record.label:
        allure.dynamic.parameter(f"step {record.label}", str(record.verdict), excluded=True)
    for name, whole in _SHOWN:
        value = record.metric_or_none(name)
        if value is not None:
            allure.dynamic.parameter(f"{name} ({record.label or 'step'})",
                                     int(value) if whole else round(value, 3), excluded=True)
    for name, value in record.derived.items():  # the seeds' mix_ratio, recovery_s
        if not math.isnan(value):  # infinite: "never" (a recovery that never came)
            shown = round(value, 3) if math.isfinite(value) else format_derived(name, value)
            allure.dynamic.parameter(f"{name} ({record.label or 'step'})", shown,
                                     excluded=True)


def attach_step(record: StepRecord, run: RunInfo, scan: list[StepRecord], *,
                door_parameter: bool = False) -> None:
    """Describe the running test's step to Allure (called inside the test). ``scan``:
    the measured steps of the record's section (and door) so far (:func:`plots.scan_of`);
    ``door_parameter``: the test runs once per door (``--storage-load-doors``), so the
    door is a parameter (else a label only)."""
    import allure

    _parameters(record, run, door_parameter=door_parameter)
    title = record.title
    allure.attach(redact_html(table_html([record], run.door)), f"table: {title}",
                  allure.attachment_type.HTML)
    allure.attach(redact_text(table_csv([record], run.door)), f"table: {title} (CSV)",
                  allure.attachment_type.CSV)
    if record.measured:
        allure.attach(plots.timeline_png(record), f"timeline: {title}",
                      allure.attachment_type.PNG)
        allure.attach(plots.ecdf_png(record), f"latency ECDF: {title}",
                      allure.attachment_type.PNG)
        if record.hosts:  # a cluster step: rate per client host
            allure.attach(plots.hosts_png(record), f"per host: {title}",
                          allure.attachment_type.PNG)
    allure.attach(json_text(record.to_json()), f"step JSON: {title}",
                  allure.attachment_type.JSON)
    if scan and not record.label:
        door = f"@{record.door}" if door_parameter else ""
        allure.attach(plots.scan_png(scan), f"scan: {record.section}{door} (rate, failed, "
                      f"hung vs clients)", allure.attachment_type.PNG)


def write_session_files(directory: Path, run: RunInfo,
                        verdict: dict[str, str] | None = None) -> None:
    """``environment.properties`` and ``categories.json`` (once, by the results owner).
    ``verdict``: what the overview's Environment names first (``run.verdict``,
    ``run.baseline``, ``run.behaviour_gate``)."""
    directory.mkdir(parents=True, exist_ok=True)
    properties = {
        **(verdict or {}),
        "storage.system": run.system,
        "storage.version": run.version,
        "storage.endpoint": run.endpoint,
        "storage.thresholds": run.thresholds_file,
        "client.host": run.client.host,
        **{f"client.{name}": version for name, version in run.client.versions.items()},
    }
    lines = [f"{key}={_escape(redact_text(str(value)))}"
             for key, value in properties.items() if value]
    (directory / "environment.properties").write_text("\n".join(lines) + "\n")
    (directory / "categories.json").write_text(json.dumps(categories(), indent=1))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(
        ":", "\\:")
