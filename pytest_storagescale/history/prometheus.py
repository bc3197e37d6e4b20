"""Each step's figures as Prometheus metrics, pushed to a Pushgateway at the end of each
step and of the session (``--storage-pushgateway URL``), or written as an OpenMetrics
text file (``--storage-openmetrics PATH``), through ``prometheus_client``.

Gauges ``storagescale_step_<figure>`` (:data:`FIGURES`) labelled ``storage``,
``version``, ``operation``, ``door``, ``clients``; ``storagescale_step_verdict`` is 1
for the step's verdict (label ``verdict``). They are pushed (HTTP PUT) under the job
``storagescale`` and the grouping key ``storage``, ``version``, ``door``: a run replaces
the figures of the earlier run of the same storage version and door, and the versions
stand side by side for a query such as
``storagescale_step_rate_hz{storage="xrootd", operation="stat"}`` by ``version``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..redact import redact_text, redact_url

#: the metric (without ``storagescale_step_``) -> how it is read from a results step
FIGURES = {
    "rate_hz": ("rate_hz",), "mb_s": ("mb_s",), "p50_seconds": ("latency_s", "p50"),
    "p99_seconds": ("latency_s", "p99"), "succeeded": ("succeeded",), "failed": ("failed",),
    "hung": ("hung",), "throttled": ("throttled",), "dropped": ("dropped",),
}
LABELS = ("storage", "version", "operation", "door", "clients")
#: the push's deadline (seconds)
DEADLINE_S = 30
JOB = "storagescale"


def _figure(step: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = step
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(
        value, bool) else None


def registry_of(document: Mapping[str, Any]) -> Any:
    """A registry holding the run's steps (a results document) as gauges."""
    from prometheus_client import CollectorRegistry, Gauge

    registry = CollectorRegistry()
    info = document.get("run") or {}
    gauges = {name: Gauge(f"storagescale_step_{name}", f"the step's {name}", LABELS,
                          registry=registry) for name in FIGURES}
    verdicts = Gauge("storagescale_step_verdict", "1 for the step's verdict",
                     (*LABELS, "verdict"), registry=registry)
    for step in document.get("steps") or ():
        labels = {"storage": str(info.get("system", "")),
                  "version": str(info.get("version", "")),
                  "operation": str(step.get("op") or step.get("operation") or ""),
                  "door": str(step.get("door") or ""), "clients": str(step.get("clients"))}
        for name, path in FIGURES.items():
            value = _figure(step, path)
            if value is not None:
                gauges[name].labels(**labels).set(value)
        verdicts.labels(**labels, verdict=str(step.get("verdict") or "")).set(1)
    return registry


def write_openmetrics(path: Path, document: Mapping[str, Any]) -> str:
    """The run's steps as an OpenMetrics text file at ``path`` (replaced whole: a
    temporary file renamed); the line that says so, or why not."""
    try:
        from prometheus_client.openmetrics.exposition import generate_latest
    except ImportError:
        return ("storagescale: OpenMetrics file NOT written: prometheus_client is not "
                "installed (pip install 'pytest-storagescale[prometheus]')")
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(generate_latest(registry_of(document)))
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        return f"storagescale: OpenMetrics file NOT written to {path}: {exc.strerror or exc}"
    return f"openmetrics: {path}"


def push_run(url: str, document: Mapping[str, Any]) -> str:
    """Push the run's steps to the Pushgateway at ``url``: the line that says so, or
    why not (the run's exit status is not changed)."""
    try:
        from prometheus_client import push_to_gateway
    except ImportError:
        return ("storagescale: Pushgateway NOT pushed: prometheus_client is not installed "
                "(pip install 'pytest-storagescale[prometheus]')")
    info = document.get("run") or {}
    steps = len(document.get("steps") or ())
    shown = redact_text(redact_url(url))
    try:
        push_to_gateway(url, job=JOB, registry=registry_of(document), timeout=DEADLINE_S,
                        grouping_key={"storage": str(info.get("system") or "unknown"),
                                      "version": str(info.get("version") or "unknown"),
                                      "door": str(info.get("door") or "unknown")})
    except Exception as exc:  # noqa: BLE001 - urllib's and the gateway's errors, said
        return f"storagescale: Pushgateway NOT pushed to {shown}: {redact_text(str(exc))}"
    return f"pushgateway: {steps} steps pushed to {shown}"
