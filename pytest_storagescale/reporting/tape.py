"""What changed on the tape path between two runs (``storagescale compare``, at the top
beside the behaviour changes): the dCache suite's tape steps (``suites/dcache/test_tape.py``:
sections ``flush``, ``stage``, ``stage_bulk``, ``tape_write``) matched by section, label
(a stage's interface: ``srm``, ``root``, ``tape-rest``, ``tape-rest token``; a central-
flushing step's ``disk``/``tape``), door and clients, one line each: whether the step
was served (every operation succeeded), what it measured (rate, p99, MB/s for the
writes, the flushes beside them) or what failed it (dCache's answer), the test's
outcome when it was not ``passed`` (a known issue's ``xfailed``), and the rate's change.
A step served in one run and not in the other, failed with another kind of error,
or run in only one, is a **change** and is listed first (``stage[root]``: 10.2.25's
door accepts ``prepare -s`` and stages nothing, 11.2.5's refuses it, while
``tape-rest`` serves both).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..records import StepRecord
from ..units import format_change, format_rate, format_seconds

#: the thresholds sections of the tape steps
SECTIONS = ("flush", "stage", "stage_bulk", "tape_write")
#: the longest piece of an error quoted on a line
ERROR_CHARS = 160

#: a step's key: section, label, door, clients
Key = tuple[str, str, str, int]


def _key(step: StepRecord) -> Key:
    label = step.label or str(step.params.get("interface") or step.params.get("into") or "")
    return step.section, label, step.door, step.clients


def _name(key: Key) -> str:
    section, label, door, clients = key
    shown = f"{section}[{label}]" if label else section
    return (f"{shown}{f' over {door}' if door else ''}, {clients} "
            f"client{'s' * (clients != 1)}")


def served(step: StepRecord) -> bool:
    """Every operation of the step succeeded (and at least one ran)."""
    total = step.total
    return bool(total is not None and total.succeeded and not total.failed and not total.hung)


def _error(step: StepRecord) -> str:
    total = step.total
    examples = total.error_examples if total is not None else {}
    text = step.error or next(iter(examples.values()), "") or ""
    text = " ".join(str(text).split())
    return text[:ERROR_CHARS] + ("..." if len(text) > ERROR_CHARS else "")


def describe(step: StepRecord, outcome: str = "") -> str:
    """One run's step in a phrase: served with its figures, or what failed it."""
    total = step.total
    marker = f" [{outcome}]" if outcome and outcome != "passed" else ""
    if total is None:
        return f"not measured ({step.verdict}: {_error(step) or 'no result'}){marker}"
    figures = f"{format_rate(total.rate_hz)}, p99 {format_seconds(total.latency_s.get('p99'))}"
    if step.section == "tape_write":
        flushes = step.derived.get("flushes_during")
        figures = (f"{total.mb_s:.1f} MB/s, p99 {format_seconds(total.latency_s.get('p99'))}"
                   + (f", {flushes:g} flushes beside" if flushes is not None else ""))
    if served(step):
        return f"served: {total.succeeded} in {figures}{marker}"
    done = total.succeeded + total.failed + total.hung
    hung = f", {total.hung} hung" if total.hung else ""
    error = _error(step)
    return (f"NOT served: {total.failed} of {done} failed{hung}"
            + (f" ({error})" if error else "") + marker)


def _failures(step: StepRecord) -> set[str]:
    total = step.total
    return set(total.errors) if total is not None else {str(step.verdict)}


def changed(was: StepRecord, now: StepRecord) -> bool:
    """Served in one run and not in the other, or not served in either but failed
    otherwise (another kind of error: 10.2.25's stage through the xrootd door timed
    out, 11.2.5's was refused)."""
    if served(was) != served(now):
        return True
    return not served(was) and _failures(was) != _failures(now)


def _rate(step: StepRecord) -> float | None:
    total = step.total
    if total is None:
        return None
    return total.mb_s if step.section == "tape_write" else total.rate_hz


def tape_lines(before: tuple[str, list[StepRecord], Mapping[str, str]],
               after: tuple[str, list[StepRecord], Mapping[str, str]]) -> list[str]:
    """The tape path's lines for two runs, each ``(letter, steps, test outcomes by node
    id)``; none when neither run has a tape step."""
    (first, old_steps, old_tests), (second, new_steps, new_tests) = before, after
    old = {_key(step): step for step in old_steps if step.section in SECTIONS}
    new = {_key(step): step for step in new_steps if step.section in SECTIONS}
    if not old and not new:
        return []
    changes: list[str] = []
    same: list[str] = []
    for key in sorted(set(old) | set(new), key=lambda k: (SECTIONS.index(k[0]), k[1:])):
        was, now = old.get(key), new.get(key)
        if was is None or now is None:
            there = f"{first if now is None else second} only" if (was or now) else ""
            step = was or now
            assert step is not None
            tests = old_tests if now is None else new_tests
            changes.append(f"  {_name(key)}: {there}: {describe(step, tests.get(step.test, ''))}")
            continue
        line = (f"  {_name(key)}: {first} {describe(was, old_tests.get(was.test, ''))} -> "
                f"{second} {describe(now, new_tests.get(now.test, ''))}")
        before_rate, now_rate = _rate(was), _rate(now)
        if served(was) and served(now) and before_rate and now_rate is not None:
            line += f" ({format_change((now_rate - before_rate) / before_rate)})"
        (changes if changed(was, now) else same).append(line)
    heading = (f"tape path ({first} -> {second}): {len(changes)} "
               f"change{'s' * (len(changes) != 1)} in what is served or how it fails")
    return [heading + (":" if changes else ""), *changes,
            *(["  the same in both (served or not in each):"] if same else []),
            *(f"  {line}" for line in same)]
