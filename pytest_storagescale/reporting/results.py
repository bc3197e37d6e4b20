"""The JSON results file (``--storage-results``).

Rewritten atomically after every step, so a run killed half-way keeps every step
it finished::

    {"run": {"endpoint", "system", "version", "thresholds_file", "started", "client"},
     "steps": [{"test", "op", "clients", "duration_s", "started", "ended", "succeeded",
                "failed", "hung", "rate_hz", "mb_s", "latency_s": {...}, "errors",
                "verdict", "violations", ...}]}
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN (nothing measured) and infinity (never recovered) -> null
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as stream:
        json.dump(_clean(document), stream, indent=1, allow_nan=False)
        stream.write("\n")
    os.replace(temporary, path)


class ResultsFile:
    """The run's results document, written after each step."""

    def __init__(self, path: Path | None, run: dict[str, Any]) -> None:
        self.path = path
        self.run = run
        self.steps: list[dict[str, Any]] = []

    def flush(self) -> None:
        if self.path is not None:
            write_json_atomic(self.path, {"run": self.run, "steps": self.steps})

