"""Results in pytest-benchmark's JSON format (``--storage-benchmark-json PATH``), so
its compare tooling works on storage runs::

    pytest-benchmark compare old.json new.json --group-by name --columns min,median,max,ops

One benchmark per step: ``stats`` are the step's latencies in seconds (from its
HdrHistogram), ``rounds`` its succeeded operations, ``ops`` its rate (operations per
second across all clients, not 1/mean as for a single-threaded benchmark). Nothing
of pytest-benchmark's code is used; this writes the file format only.
"""

from __future__ import annotations

import datetime
import platform
import socket
from pathlib import Path
from typing import Any

from ..records import RunInfo, StepRecord
from .results import write_json_atomic
from .table import several_doors

#: the pytest-benchmark file format version this writer follows
FORMAT_VERSION = "5.1.0"


def _stats(step: StepRecord) -> dict[str, Any] | None:
    """pytest-benchmark's ``stats`` from the step's latency histogram; None when the
    step measured nothing."""
    from hdrh.histogram import HdrHistogram

    total = step.total
    if total is None or not total.histogram or step.result is None:
        return None
    histogram = HdrHistogram.decode(total.histogram.encode("ascii"))
    if not histogram.get_total_count():
        return None

    def at(percentile: float) -> float:
        return histogram.get_value_at_percentile(percentile) / 1e6

    q1, median, q3 = at(25), at(50), at(75)
    iqr = q3 - q1
    return {
        "min": histogram.get_min_value() / 1e6, "max": histogram.get_max_value() / 1e6,
        "mean": histogram.get_mean_value() / 1e6, "stddev": histogram.get_stddev() / 1e6,
        "rounds": total.succeeded, "median": median, "iqr": iqr, "q1": q1, "q3": q3,
        "iqr_outliers": 0, "stddev_outliers": 0, "outliers": "0;0",
        "ld15iqr": max(q1 - 1.5 * iqr, 0.0), "hd15iqr": q3 + 1.5 * iqr,
        "ops": total.rate_hz, "total": step.result.duration_s, "iterations": 1,
    }


def _benchmark(run: RunInfo, step: StepRecord, stats: dict[str, Any], *,
               with_door: bool = False) -> dict[str, Any]:
    """One benchmark; ``with_door``: the steps ran over several doors, so the door is
    part of its name (``stat[c10-davs]``) and parameters."""
    label = f" ({step.label})" if step.label else ""
    side = f"/{step.side}" if step.side else ""
    door = f"-{step.door}" if with_door else ""
    # an open loop's steps are told apart by their offered rate (``stat_open[r50hz]``)
    point = f"r{step.arrival_rate:g}hz" if step.arrival_rate else f"c{step.clients}"
    name = f"{step.section}{side}[{point}{door}]{label}"
    return {
        "group": f"{run.system} {step.section}{side}",
        "name": name,
        "fullname": f"{step.test}::{name}",
        "params": {"clients": step.clients, **({"door": step.door} if with_door else {}),
                   **({"arrival_rate": step.arrival_rate} if step.arrival_rate else {})},
        "param": f"{point if step.arrival_rate else step.clients}{door}",
        "extra_info": {
            "storage_version": run.version, "endpoint": run.endpoint, "door": step.door,
            "rate_hz": step.metric("rate_hz"), "mb_s": step.metric("mb_s"),
            "failed": int(step.metric("failed")), "hung": int(step.metric("hung")),
            "throttled": int(step.metric("throttled")),
            "redirects": int(step.metric("redirects")),
            "verdict": str(step.verdict),
        },
        "options": {"timer": "hdrhistogram", "disable_gc": False, "warmup": False},
        "stats": stats,
    }


def benchmark_document(run: RunInfo, steps: list[StepRecord]) -> dict[str, Any]:
    """The pytest-benchmark document of ``steps`` (steps without latencies left out)."""
    benchmarks = []
    with_door = several_doors(steps, run.door)
    for step in steps:
        stats = _stats(step)
        if stats is not None:
            benchmarks.append(_benchmark(run, step, stats, with_door=with_door))
    return {
        "machine_info": {
            "node": socket.gethostname(), "processor": platform.processor(),
            "machine": platform.machine(), "python_implementation":
                platform.python_implementation(),
            "python_version": platform.python_version(), "system": platform.system(),
            "release": platform.release(),
        },
        "commit_info": {"id": None, "dirty": False, "project": "pytest-storagescale",
                        "branch": None, "storage_version": run.version},
        "benchmarks": benchmarks,
        "datetime": datetime.datetime.fromtimestamp(run.started, tz=datetime.UTC).isoformat(),
        "version": FORMAT_VERSION,
    }


def write_benchmark_json(path: Path, run: RunInfo, steps: list[StepRecord]) -> None:
    write_json_atomic(path, benchmark_document(run, steps))
