"""Baselines: an earlier run's JSON results, to compare each step with the same step.

A step matches the baseline step with the same thresholds section, concurrency,
label (``before``, ``probe 1``...), side and door (:attr:`StepRecord.key`): a davs
step is compared with the baseline's davs step, never with its root step. A baseline
written before doors were recorded holds steps of its main door: they match the steps
of this run's main door (``main_door``). Relative rules
(``rate_hz >= 0.9 * baseline``) read the matched step's metric through the same
lookup as the step's own (:meth:`StepRecord.metric`); a step the baseline does not
have is reported (``new``), never failed. A matched baseline step that measured
nothing (:func:`measured_nothing`) makes a step with a relative rule an ``error``:
compared with zeros, the rule would pass whatever was measured. Results of the previous release (no
``format`` key) load as they are.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .errors import StorageScaleUsageError
from .records import BaselineComparison, RunInfo, StepRecord


class Baseline:
    """The steps of an earlier run, indexed for matching. Read and checked when
    made, so a file of the wrong shape stops the session before any load runs."""

    def __init__(self, path: Path, *, main_door: str | None = None) -> None:
        self.path = path
        #: this run's main door (None: a step of any door matches a door-less step)
        self.main_door = main_door
        document = self._read(path)
        try:
            self.run = RunInfo.from_json(document.get("run") or {})
            steps = [StepRecord.from_json(step) for step in document["steps"]]
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise self._wrong_shape(f"a step it holds cannot be read ({exc})") from None
        for step in steps:  # a step without door ran over its run's main door
            step.door = step.door or self.run.door
        self.steps = {step.key: step for step in steps}

    def _read(self, path: Path) -> dict:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise StorageScaleUsageError(
                f"--storage-baseline {path}: cannot read it ({exc.strerror}). Give the JSON "
                f"results file of an earlier run (--storage-results)."
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StorageScaleUsageError(
                f"--storage-baseline {path}: not JSON ({exc}). Give the JSON results file "
                f"of an earlier run (--storage-results)."
            ) from None
        steps = document.get("steps") if isinstance(document, dict) else None
        if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
            raise self._wrong_shape("no 'steps' list of step objects")
        return document

    def _wrong_shape(self, what: str) -> StorageScaleUsageError:
        return StorageScaleUsageError(
            f"--storage-baseline {self.path}: {what}; this is not a pytest-storagescale "
            f"results file. Give the file an earlier run wrote with --storage-results."
        )

    @property
    def version(self) -> str:
        return self.run.version or "?"

    def mismatches(self, system: str, thresholds_file: str, scale: float) -> list[str]:
        """How this baseline's run differs from the run compared with it (a baseline of
        another storage system, plan or plan scale compares other steps)."""
        run, found = self.run, []
        if run.system and run.system != system:
            found.append(f"storage system {run.system!r}, not {system!r}")
        if run.thresholds_file and Path(run.thresholds_file).name != Path(thresholds_file).name:
            found.append(f"thresholds file {Path(run.thresholds_file).name}, not "
                         f"{Path(thresholds_file).name}")
        if run.scale != scale:
            found.append(f"plan scale {run.scale:g}, not {scale:g}")
        return found

    def warning(self, system: str, thresholds_file: str, scale: float) -> str | None:
        found = self.mismatches(system, thresholds_file, scale)
        if not found:
            return None
        return (f"WARNING: baseline {self.path} is from {'; '.join(found)}: its steps are "
                f"compared all the same; give a baseline of the same system and plan.")

    def find(self, step: StepRecord) -> StepRecord | None:
        """The baseline's step with ``step``'s key; a step of this run's main door also
        matches a step of a baseline that recorded no doors."""
        found = self.steps.get(step.key)
        if found is None and (self.main_door is None or step.door in ("", self.main_door)):
            found = self.steps.get(step.key[:4])  # the key without door
        return found

    def compare(self, step: StepRecord) -> BaselineComparison:
        """How ``step`` compares with its baseline step (the table's ``vs base``)."""
        base = self.find(step)
        return BaselineComparison(
            file=str(self.path), version=self.version, matched=base is not None,
            rate_hz=base.metric_or_none("rate_hz") if base else None,
            rate_change=rate_change(step, base),
        )


def measured_nothing(base: StepRecord) -> str | None:
    """Why the baseline step ``base`` cannot be compared with, or None: it gave no
    verdict (``error``, ``interrupted``) or no operation succeeded, so its metrics are
    zeros or missing and a relative rule (``rate_hz >= 0.9 * baseline``) checked
    against them would hold whatever the step measured."""
    total = base.total
    succeeded = total.succeeded if total is not None else 0
    if base.verdict.value not in ("error", "interrupted") and succeeded > 0:
        return None
    why = f": {base.error}" if base.error else ""
    return f"verdict {base.verdict.value}, {succeeded} succeeded{why}"


def rate_change(step: StepRecord, base: StepRecord | None) -> float | None:
    """Relative change of the rate against the baseline step (-0.12 for -12 %)."""
    if base is None:
        return None
    before, now = base.metric_or_none("rate_hz"), step.metric("rate_hz")
    if not before or math.isnan(now):
        return None
    return (now - before) / before
