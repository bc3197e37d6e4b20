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

A recovery probe (``probe 3``) is matched by time, not by number: with the baseline's
probe whose time since its overload ended (:func:`since_fault`) is nearest its own,
so a version that recovers in one probe is compared with the baseline's state at the
same moment after the fault, and its judged probe with the baseline's recovery.
:func:`read_results` reads a results file for the baseline and for
``storagescale compare``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import StorageScaleUsageError
from .records import BaselineComparison, RunInfo, StepRecord
from .reporting.results import InputFileError, read_input_file


class Baseline:
    """The steps of one or several earlier runs, indexed for matching. Read and
    checked when made, so a file of the wrong shape stops the session before any load
    runs. The first run is *the* baseline (its steps are compared in the table and by
    relative rules); the others (:attr:`more`) add their steps' window samples to the
    gate's pool (:meth:`matches`)."""

    def __init__(self, path: Path | Sequence[Path], *, main_door: str | None = None) -> None:
        paths = [path] if isinstance(path, Path) else list(path)
        if not paths:
            raise ValueError("a baseline needs at least one results file")
        self.path = paths[0]
        #: every run's results file, the first one's first
        self.paths = paths
        #: this run's main door (None: a step of any door matches a door-less step)
        self.main_door = main_door
        self.run, steps, _ = read_results(self.path, "--storage-baseline")
        self.steps = {step.key: step for step in steps}
        #: each recovery probe's seconds since its overload ended, by step id
        self.since_fault = {step.step_id: since_fault(step, steps) for step in steps
                            if is_probe(step)}
        #: the other baseline runs (``--storage-baseline`` given more than once)
        self.more = [Baseline(other, main_door=main_door) for other in paths[1:]]

    def matches(self, step: StepRecord, since: float | None = None) -> list[StepRecord]:
        """The step's match in each baseline run that has it (the gate's pool)."""
        found = [run.find(step, since) for run in (self, *self.more)]
        return [base for base in found if base is not None]

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
        """What the run should know of its baseline, said once before any load: a
        WARNING for another storage system or plan scale (other steps are compared);
        another thresholds file is the normal upgrade (a new version chooses its own
        file), said plainly as a fact. None when nothing differs."""
        found = self.mismatches(system, thresholds_file, scale)
        if not found:
            return None
        other_file = [text for text in found if text.startswith("thresholds file")]
        serious = [text for text in found if text not in other_file]
        if not serious:
            return (f"baseline {self.path} ({self.run.system} {self.version}) was planned "
                    f"by {Path(self.run.thresholds_file).name}, this run by "
                    f"{Path(thresholds_file).name}: steps of the same section, concurrency "
                    f"and door are compared, the others are 'new'.")
        return (f"WARNING: baseline {self.path} is from {'; '.join(found)}: its steps are "
                f"compared all the same; give a baseline of the same system and plan scale.")

    def find(self, step: StepRecord, since: float | None = None) -> StepRecord | None:
        """The baseline's step with ``step``'s key; a step of this run's main door also
        matches a step of a baseline that recorded no doors. A recovery probe given
        its seconds since the overload ended (``since``, :func:`since_fault`) is matched
        with the baseline's probe nearest that time, whatever their numbers."""
        if since is not None and is_probe(step):
            found = self._nearest_probe(step, since)
            if found is not None:
                return found
        found = self.steps.get(step.key)
        if found is None and (self.main_door is None or step.door in ("", self.main_door)):
            found = self.steps.get(step.key[:4])  # the key without door
        return found

    def _nearest_probe(self, step: StepRecord, since: float) -> StepRecord | None:
        """The baseline probe of ``step``'s section, concurrency, side and door whose
        time since its overload is nearest ``since`` (on a tie, the later one)."""
        door_less = self.main_door is None or step.door in ("", self.main_door)
        timed = [(abs(self.since_fault[base.step_id] - since), -base.started, base)
                 for base in self.steps.values()
                 if is_probe(base) and self.since_fault.get(base.step_id) is not None
                 and (base.section, base.clients, base.side) ==
                 (step.section, step.clients, step.side)
                 and (base.door == step.door or (door_less and not base.door))]
        return min(timed, key=lambda item: item[:2])[2] if timed else None

    def compare(self, step: StepRecord, since: float | None = None) -> BaselineComparison:
        """How ``step`` compares with its baseline step (the table's ``vs base``)."""
        base = self.find(step, since)
        if base is None:
            return BaselineComparison(file=str(self.path), version=self.version, matched=False)
        failed, hung = base.metric_or_none("failed"), base.metric_or_none("hung")
        return BaselineComparison(
            file=str(self.path), version=self.version, matched=True,
            rate_hz=base.metric_or_none("rate_hz"), rate_change=rate_change(step, base),
            p99_s=base.metric_or_none("p99_s"),
            failed=None if failed is None else int(failed),
            hung=None if hung is None else int(hung), verdict=base.verdict.value,
            derived=dict(base.derived),
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


def _not_results(path: Path, source: str, what: str) -> StorageScaleUsageError:
    return StorageScaleUsageError(
        f"{source} {path}: {what}; this is not a pytest-storagescale results file. Give "
        f"the file an earlier run wrote with --storage-results."
    )


#: a number a results file holds is at most this large in magnitude (bytes of a long
#: run fit; a float of it is exact enough, and no conversion of it overflows)
MAX_NUMBER = 1e18
#: a time in a results file (``started``, ``ended``: seconds since 1970) is below this
#: (the year 5138): a date is printed from it
MAX_TIME = 1e11


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 is read as infinity
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _constant(text: str) -> float:
    raise ValueError(f"{text} is not a number of a results file")


def _numbers(document: object) -> Iterable[float]:
    """Every number in ``document``, walked without recursion."""
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield value


def _check_numbers(document: dict) -> None:
    """Numbers in range: every one at most :data:`MAX_NUMBER` in magnitude, the run's
    and steps' times between 0 and :data:`MAX_TIME` (ValueError saying which)."""
    for value in _numbers(document):
        if abs(value) > MAX_NUMBER:
            raise ValueError(f"the number {value:.3g} is out of range")
    run = document.get("run")
    times = [("run.started", run.get("started"))] if isinstance(run, dict) else []
    for index, step in enumerate(document.get("steps") or ()):
        times += [(f"steps[{index}].{key}", step.get(key)) for key in ("started", "ended")]
    for where, value in times:
        if value is not None and not (isinstance(value, int | float)
                                      and 0 <= value < MAX_TIME):
            raise ValueError(f"{where} = {value!r} is not a time (seconds since 1970)")


def read_results(path: Path, source: str) -> tuple[RunInfo, list[StepRecord], dict]:
    """The run, its steps and the whole document of the results file ``path``, checked
    when read: a file that is missing, not a regular file (a FIFO, a device), larger
    than :data:`~.reporting.results.MAX_INPUT_BYTES`, not JSON, nested too deep, of
    another shape or with numbers out of range is one usage error naming ``source``
    (``--storage-baseline``, ``storagescale compare``) and the file. A step without
    door ran over its run's main door."""
    try:
        data = read_input_file(path)
    except InputFileError as exc:
        raise StorageScaleUsageError(
            f"{source} {path}: {exc}. Give the JSON results file of an earlier run "
            f"(--storage-results)."
        ) from None
    try:
        document = json.loads(data.decode("utf-8"), parse_float=_finite,
                              parse_constant=_constant)
    except RecursionError:
        raise _not_results(path, source, "its JSON is nested too deep to read") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise StorageScaleUsageError(
            f"{source} {path}: not JSON ({str(exc)[:200]}). Give the JSON results file of "
            f"an earlier run (--storage-results)."
        ) from None
    steps = document.get("steps") if isinstance(document, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise _not_results(path, source, "no 'steps' list of step objects")
    try:
        _check_numbers(document)
        run = RunInfo.from_json(document.get("run") or {})
        records = [StepRecord.from_json(step) for step in steps]
    except RecursionError:
        raise _not_results(path, source, "a step it holds is nested too deep") from None
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
        raise _not_results(path, source,
                           f"a step it holds cannot be read ({str(exc)[:200]})") from None
    for record in records:
        record.door = record.door or run.door
    return run, records, document


#: the label of a recovery test's overload step, and the start of its probes' labels
#: (:func:`~.scenarios.recovery`)
OVERLOAD, PROBE = "overload", "probe "


def is_probe(step: StepRecord) -> bool:
    return bool(step.label and step.label.startswith(PROBE))


def since_fault(step: StepRecord, steps: Iterable[StepRecord]) -> float | None:
    """Seconds from the end of the overload a recovery probe follows (the fault: the
    latest ``overload`` step of the same test and door that ended before the probe
    began) to the probe's end; None for a step that is no probe or has no overload."""
    if not is_probe(step):
        return None
    ends = [other.ended for other in steps
            if other.label == OVERLOAD and other.test == step.test
            and other.door == step.door and other.ended <= step.started + 1.0]
    return step.ended - max(ends) if ends else None
