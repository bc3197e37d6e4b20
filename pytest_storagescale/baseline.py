"""Baselines: an earlier run's JSON results, to compare each step with the same step.

A step matches the baseline step with the same thresholds section (``op``),
concurrency, label (``before``, ``probe 1``...) and side. Relative rules
(``rate_hz >= 0.9 * baseline``) read the matched step's metric; a step the baseline
does not have is reported (``new``), never failed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import StorageScaleUsageError


def step_key(record: dict[str, Any]) -> tuple:
    return (record.get("op"), record.get("clients"), record.get("label"), record.get("side"))


def record_metric(record: dict[str, Any], name: str) -> float | None:
    """A rule metric read back from a results-file step (None when it has none)."""
    side, _, bare = name.rpartition(".")
    source = record.get("sides", {}).get(side, {}) if side else record
    if bare in record.get("derived", {}):
        value = record["derived"][bare]
    elif bare.endswith("_s") and bare[:-2] in source.get("latency_s", {}):
        value = source["latency_s"][bare[:-2]]
    else:
        value = source.get(bare)
    if value is None or not isinstance(value, (int, float)):
        return None
    return float(value)


class Baseline:
    """The steps of an earlier run, indexed for matching."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise StorageScaleUsageError(
                f"--storage-baseline {path}: cannot read it ({exc.strerror}). Give the JSON "
                f"results file of an earlier run (--storage-results)."
            ) from None
        except json.JSONDecodeError as exc:
            raise StorageScaleUsageError(
                f"--storage-baseline {path}: not JSON ({exc}). Give the JSON results file "
                f"of an earlier run (--storage-results)."
            ) from None
        steps = document.get("steps") if isinstance(document, dict) else None
        if not isinstance(steps, list):
            raise StorageScaleUsageError(
                f"--storage-baseline {path}: no 'steps' list; this is not a pytest-storagescale "
                f"results file. Give the file an earlier run wrote with --storage-results."
            )
        self.run = document.get("run", {})
        self.steps = {step_key(step): step for step in steps if isinstance(step, dict)}

    @property
    def version(self) -> str:
        return str(self.run.get("version", "?"))

    def find(self, record: dict[str, Any]) -> dict[str, Any] | None:
        return self.steps.get(step_key(record))


def rate_change(record: dict[str, Any], base: dict[str, Any] | None) -> float | None:
    """Relative change of the rate against the baseline step (-0.12 for -12 %)."""
    if base is None:
        return None
    before, now = record_metric(base, "rate_hz"), record_metric(record, "rate_hz")
    if not before or now is None or math.isnan(now):
        return None
    return (now - before) / before
