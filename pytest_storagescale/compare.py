"""Two or more runs side by side: ``storagescale compare A.json B.json ...``.

The seeds kept one table per dCache version (Run 1 ... Run 8: concurrency, succeeded
(rate), failed) and were read across. Here each run is a column group of one table
(succeeded (rate), p99, failed, hung, verdict, and from the second run on the rate's
change against the run before), one row per step, the steps of a section together,
by concurrency; the derived metrics (``mix_ratio``, ``recovery_s``) get a row of
their own. A recovery test shows its judged probe (``last probe``: the one with
``recovery_s``), since probes are as many as each run needed. Under the table: each
run's facts (storage and version, how it was found, client libraries, thresholds
file, scale, verdict), the steps whose verdict changed and the functional and
conformance checks whose outcome changed (a results file holds every test's outcome,
``tests``), and what changed on the tape path (:func:`tape_changes`, under the
gate's lines). :func:`write_page` writes the same as one HTML page with each scan's
runs overlaid (rate and p99 vs clients, :func:`~.reporting.plots.overlay_png`).
:func:`attach_to_allure` gives a step's Allure test its baseline step beside it.
"""

from __future__ import annotations

import html
import re
import string
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .baseline import Baseline, is_probe, read_results
from .errors import StorageScaleUsageError
from .gate import GateVerdict, StepGate
from .load.stats import SideResult
from .records import RunInfo, StepRecord, Verdict
from .redact import redact_html, redact_text
from .reporting import plots, tape
from .reporting.behaviour import Acceptance, BehaviourGate, outcome_changes, step_changes
from .reporting.html import _STYLE, _img
from .reporting.table import format_derived, render, table_order
from .units import format_change, format_rate, format_seconds

#: a run's columns; the second run on adds the rate's change against the run before
RUN_COLUMNS = ("succeeded (rate)", "p99", "failed", "hung", "verdict")
#: the label a recovery test's judged probe is compared under
LAST_PROBE = "last probe"
#: where the command's name is said in its messages
COMMAND = "storagescale compare"


@dataclass(frozen=True)
class TestResult:
    """One functional, conformance or load test's outcome in a results file."""

    __test__ = False

    outcome: str
    cause: str = ""


@dataclass
class ComparedRun:
    """One results file: its run, steps, and tests' outcomes (``tests``; empty in a
    file written before they were recorded)."""

    path: Path
    letter: str
    run: RunInfo
    steps: list[StepRecord]
    tests: dict[str, TestResult] = field(default_factory=dict)
    verdict: str = ""
    #: the file's step objects as written (what :class:`StepRecord` does not keep: the
    #: statistical gate's ``gate`` key)
    raw_steps: list[dict] = field(default_factory=list)
    #: the file holds its tests' outcomes (a file of an earlier release does not)
    tests_known: bool = False

    @property
    def title(self) -> str:
        """``A: xrootd 5.5.3``."""
        return f"{self.letter}: {self.run.system or '?'} {self.run.version or '?'}"

    def facts(self) -> str:
        """The run in one line: file, storage and how its version was found, client
        libraries, thresholds, scale, date, verdict."""
        run = self.run
        source = f" ({run.version_source})" if run.version_source else ""
        libraries = ", ".join(f"{name} {version}" for name, version in
                              run.client.versions.items() if name in CLIENT_LIBRARIES)
        scale = f", plan scale {run.scale:g}" if run.scale != 1 else ""
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run.started)) \
            if run.started else "?"
        return (f"{self.title}{source} at {run.endpoint_id or run.endpoint}; {self.path}; "
                f"thresholds {Path(run.thresholds_file).name or '?'}{scale}; {when}; "
                f"client {run.client.host or '?'}"
                + (f" ({libraries})" if libraries else "") + f"; verdict {self.verdict}")


#: the client libraries a run's facts name (what an old client of a new server shows)
CLIENT_LIBRARIES = ("xrootd", "pycurl", "gfal2", "python", "pytest-storagescale")


def _bad(what: str) -> StorageScaleUsageError:
    return StorageScaleUsageError(f"{COMMAND}: {what}")


def load_runs(paths: list[Path]) -> list[ComparedRun]:
    """Read every results file (a missing, unreadable or foreign file, or fewer than
    two, is one usage error naming it)."""
    if len(paths) < 2:
        raise _bad(
            f"give two or more results files to compare (got {len(paths)}): the files "
            f"runs wrote with --storage-results, the earlier version first, e.g. "
            f"'storagescale compare before.json after.json'.")
    if len(paths) > len(string.ascii_uppercase):
        raise _bad(f"at most {len(string.ascii_uppercase)} results files (got {len(paths)}).")
    runs = []
    for letter, path in zip(string.ascii_uppercase, paths, strict=False):
        run, steps, document = read_results(path, COMMAND)
        listed = document.get("tests")  # none in a file written before they were kept
        tests = {str(test.get("nodeid")): TestResult(str(test.get("outcome", "")),
                                                      str(test.get("cause") or ""))
                 for test in (listed if isinstance(listed, list) else [])
                 if isinstance(test, dict)}
        runs.append(ComparedRun(path, letter, run, steps, tests,
                                str(document.get("verdict") or _step_verdict(steps)),
                                raw_steps=list(document["steps"]),
                                tests_known=isinstance(listed, list)))
    return runs


def _step_verdict(steps: list[StepRecord]) -> str:
    """A run's verdict from its load steps alone (a file without ``verdict``)."""
    bad = any(step.verdict in (Verdict.FAIL, Verdict.ERROR, Verdict.INTERRUPTED)
              for step in steps)
    return "FAILED (load steps)" if bad else "PASSED (load steps)"


# -- aligning the runs' steps ----------------------------------------------------------

#: a row: section, door, label, side name, scan point (clients, or an open loop's
#: offered rate: ``"20/s"``)
RowKey = tuple[str, str, str, str, int | str]


@dataclass
class Row:
    """One row of the comparison: the step (or one side of it) in each run."""

    key: RowKey
    name: str
    #: the step's first (or only) side: its derived metrics and verdict are said here
    first_side: bool = True
    #: where the row sorts in its scan: its clients, or an open loop's offered rate
    point: float = 0.0
    cells: dict[str, tuple[StepRecord, SideResult | None]] = field(default_factory=dict)


def _label(step: StepRecord) -> str | None:
    """The label a step is compared under: a recovery test's judged probe is its
    ``last probe``; its other probes are not compared (None); else its own."""
    if is_probe(step):
        return LAST_PROBE if step.verdict is not Verdict.INFO else None
    return step.label or ""


def _entries(step: StepRecord) -> Iterator[tuple[RowKey, str, bool, SideResult | None]]:
    """The rows of one step: one per side of a composite step, else one."""
    label = _label(step)
    if label is None:
        return
    shown = f" ({label})" if label and label != step.side else ""
    sides: dict[str, SideResult | None] = dict(step.sides) or {"": None}
    several = len(sides) > 1
    for index, (name, side) in enumerate(sides.items()):
        side_name = name if several else (step.side or "")
        section = f"{step.section}/{side_name}" if side_name else step.section
        yield (step.section, step.door, label, side_name, step.scan_point), \
            f"{section}{shown}", index == 0, side


def align(runs: list[ComparedRun]) -> list[Row]:
    """Every step of every run as rows: the sections in the order the first run that
    has them ran them (:func:`~.reporting.table.table_order`), a section's plain scan
    steps by concurrency, then its labelled steps in the order they ran."""
    rows: dict[RowKey, Row] = {}
    order: dict[tuple[str, str], int] = {}
    for compared in runs:
        for step in table_order(compared.steps):
            for key, name, first_side, side in _entries(step):
                order.setdefault(key[:2], len(order))
                row = rows.setdefault(key, Row(key, name, first_side,
                                               step.arrival_rate or step.clients))
                row.cells.setdefault(compared.letter, (step, side))
    first_seen = {key: index for index, key in enumerate(rows)}
    return sorted(rows.values(), key=lambda row: (
        order[row.key[:2]], bool(row.key[2]), row.point if not row.key[2] else 0,
        first_seen[row.key]))


# -- the table -----------------------------------------------------------------------------

def _rate(step: StepRecord, side: SideResult | None) -> float | None:
    if side is not None:
        return side.rate_hz
    return step.metric_or_none("rate_hz") if step.measured else None


def _run_cells(step: StepRecord, side: SideResult | None) -> list[str]:
    """succeeded (rate) .. verdict of one run's step."""
    if side is None and step.total is None:
        return ["-", "-", "-", "-", str(step.verdict)]
    measured = side if side is not None else step.total
    assert measured is not None
    return [f"{measured.succeeded} ({format_rate(measured.rate_hz)})",
            format_seconds(measured.latency_s.get("p99")), str(measured.failed),
            str(measured.hung), str(step.verdict)]


def _change(before: float | None, now: float | None) -> str:
    if before is None or now is None or not before:
        return "-"
    return format_change((now - before) / before)


def columns_for(runs: list[ComparedRun], doors: bool) -> list[str]:
    columns = ["op", *(["door"] if doors else []), "clients"]
    for index, compared in enumerate(runs):
        columns += [f"{compared.letter} {name}" if name == "verdict" else name
                    for name in RUN_COLUMNS]
        if index:
            columns.append(f"rate vs {runs[index - 1].letter}")
    return columns


def _row_cells(row: Row, runs: list[ComparedRun], doors: bool) -> list[list[str]]:
    """The row's line, then a line per derived metric of its steps."""
    line = [row.name, *([row.key[1] or "-"] if doors else []), str(row.key[4])]
    derived: dict[str, list[str]] = {}
    previous: float | None = None
    for index, compared in enumerate(runs):
        step, side = row.cells.get(compared.letter, (None, None))
        line += _run_cells(step, side) if step is not None else [""] * len(RUN_COLUMNS)
        rate = _rate(step, side) if step is not None else None
        if index:
            line.append(_change(previous, rate))
        previous = rate
        for name, value in (step.derived.items() if step is not None else ()):
            derived.setdefault(name, [""] * len(runs))[index] = format_derived(name, value)
    lines = [line]
    if not row.first_side:
        return lines
    for metric, shown in derived.items():  # once per step (its first side's row)
        extra = [f"  {metric}", *([""] if doors else []), ""]
        for index, text in enumerate(shown):
            extra += [text, *[""] * (len(RUN_COLUMNS) - 1), *([""] if index else [])]
        lines.append(extra)
    return lines


def several_doors(runs: list[ComparedRun]) -> bool:
    return len({step.door for compared in runs for step in compared.steps}) > 1


def table_lines(runs: list[ComparedRun], rows: list[Row]) -> list[str]:
    """The comparison table: a line of run titles over their column groups, the
    columns, then the rows, a blank line between sections."""
    doors = several_doors(runs)
    columns = columns_for(runs, doors)
    body: list[list[str]] = []
    breaks: set[int] = set()
    for index, row in enumerate(rows):
        if index and row.key[:2] != rows[index - 1].key[:2]:
            breaks.add(len(body))
        body.extend(_row_cells(row, runs, doors))
    lines = render(body, tuple(columns),
                   text=tuple(c for c in columns if c.endswith(" verdict")))
    header, rendered = lines[0], lines[1:]
    titles = _titles(header, columns, runs, doors)
    out = [titles, header]
    for index, line in enumerate(rendered):
        if index in breaks:
            out.append("")
        out.append(line)
    return out


def _titles(header: str, columns: list[str], runs: list[ComparedRun], doors: bool) -> str:
    """Each run's title above its first column (found in the rendered header)."""
    line, position = "", 0
    start = 2 + int(doors)
    for compared in runs:
        first = header.index(columns[start], position)
        # a right-aligned column begins where its padding does: after the column before
        begin = header.rfind("  ", 0, first) + 2 if first else 0
        begin = max(begin, len(line) + 2 if line else begin)
        line = line.ljust(begin) + compared.title
        position = first + len(columns[start])
        start += len(RUN_COLUMNS) + (1 if compared is not runs[0] else 0)
    return line.rstrip()


# -- what changed ----------------------------------------------------------------------------

def changed_verdicts(runs: list[ComparedRun], rows: list[Row]) -> list[str]:
    """The steps whose verdict differs from the run before, with the broken rules."""
    lines = []
    for row in (row for row in rows if row.first_side):  # a step once, not per side
        for before, after in zip(runs, runs[1:], strict=False):
            old, new = row.cells.get(before.letter), row.cells.get(after.letter)
            if old is None or new is None or old[0].verdict == new[0].verdict:
                continue
            point = row.key[4]
            lines.append(f"{new[0].name} at {point}"
                         + (" clients" if isinstance(point, int) else "")
                         + (f" over {row.key[1]}" if several_doors(runs) else "")
                         + f": {before.letter} {old[0].verdict} -> {after.letter} "
                           f"{new[0].verdict}" + _why(before, old[0], after, new[0]))
    return lines


def _why(before: ComparedRun, old: StepRecord, after: ComparedRun, new: StepRecord) -> str:
    """The broken rules (or the error) of the step that did not pass, naming its run
    when that is the earlier one."""
    for compared, step in ((after, new), (before, old)):
        why = "; ".join(step.violations) or step.error or ""
        if why:
            return f" ({why})" if step is new else f" ({compared.letter}: {why})"
    return ""


def changed_outcomes(runs: list[ComparedRun], *, load: bool = False) -> list[str]:
    """The tests (functional and conformance checks; not load steps, whose verdicts
    say more) whose outcome differs from the run before: ``xfailed -> passed`` is a
    known issue the new version fixed."""
    lines = []
    for before, after in zip(runs, runs[1:], strict=False):
        for nodeid in dict.fromkeys([*before.tests, *after.tests]):
            if not load and _is_load_test(nodeid, before, after):
                continue
            old = before.tests.get(nodeid, TestResult("not run"))
            new = after.tests.get(nodeid, TestResult("not run"))
            if old.outcome != new.outcome:
                cause = f": {new.cause.splitlines()[0]}" if new.cause else ""
                lines.append(f"{nodeid}: {before.letter} {old.outcome} -> {after.letter} "
                             f"{new.outcome}{cause}")
    return lines


def _is_load_test(nodeid: str, *runs: ComparedRun) -> bool:
    return any(step.test == nodeid for compared in runs for step in compared.steps)


# -- the gate --------------------------------------------------------------------------------

#: what a terminal would act on in a text from a results file: C0 and C1 control
#: characters (ESC starts a control sequence), DEL, Unicode's direction overrides
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character written as its escape (``\\x1b``): what
    a results file holds is shown, never acted on by the terminal."""
    return _CONTROLS.sub(lambda match: (f"\\x{ord(match.group()):02x}"
                                        if ord(match.group()) < 0x100
                                        else f"\\u{ord(match.group()):04x}"), text)


#: a step's own verdicts that mean it measured nothing the gate could judge
UNMEASURED = (Verdict.ERROR, Verdict.INTERRUPTED)
#: a test outcome that fails a run
FAILING_OUTCOMES = ("failed", "error", "interrupted")


@dataclass
class Gate:
    """``storagescale compare``'s verdict: the last run against the one before it.
    It fails on a behaviour change the acceptance file does not list, on a rate or
    latency regression (the statistical gate's ``regressed`` steps when the file holds
    them, else the steps whose rules failed), and on the later run's own failures
    (a failed check, a step that measured nothing): never green on a failed run."""

    before: ComparedRun
    after: ComparedRun
    behaviour: BehaviourGate
    regressions: list[str]
    failures: list[str]
    #: where the regressions come from
    source: str
    #: steps the statistical gate found inconclusive (they decide nothing)
    inconclusive: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not (self.behaviour.blocking or self.regressions or self.failures)

    def headline(self) -> str:
        counts = [_count(len(self.behaviour.blocking), "behaviour change") + " not accepted",
                  _count(len(self.regressions), "regression"),
                  _count(len(self.failures), "failure") + f" of {self.after.letter}"]
        return (f"gate: {'PASSED' if self.passed else 'FAILED'}: {self.after.title} against "
                f"{self.before.title} ({', '.join(counts)})")

    def lines(self) -> list[str]:
        """The verdict, then what changed: behaviour changes first, then regressions,
        then the later run's own failures, then what was accepted and the notes."""
        behaviour = self.behaviour
        lines = [self.headline()]
        if not self.before.tests_known or not self.after.tests_known:
            missing = self._without_tests()
            lines.append(f"  behaviour: not compared: {' and '.join(missing)} "
                         f"hold{'s' * (len(missing) == 1)} no test outcomes (written "
                         f"before they were kept)")
        blocking = behaviour.blocking
        lines += [f"behaviour changes not accepted ({len(blocking)}; list each in an "
                  f"acceptance file with a reason to accept it: --accept FILE):"
                  if blocking else "behaviour changes not accepted: none"]
        lines += [f"  {change.text()}" for change in blocking]
        lines += [f"regressions ({self.source}):" if self.regressions else
                  f"regressions ({self.source}): none"]
        lines += [f"  {line}" for line in self.regressions]
        if self.failures:
            lines += [f"failures of {self.after.letter}:",
                      *(f"  {line}" for line in self.failures)]
        accepted = [change for change in behaviour.changes if change.accepted]
        if accepted:
            lines += [f"behaviour changes accepted by {behaviour.accept_file}:",
                      *(f"  {change.text()}" for change in accepted)]
        notes = [change for change in behaviour.changes if not change.fails]
        if notes:
            lines += ["behaviour notes (do not fail the gate):",
                      *(f"  {change.text()}" for change in notes)]
        if self.inconclusive:
            lines += ["inconclusive (decide nothing either way):",
                      *(f"  {line}" for line in self.inconclusive)]
        return lines

    def _without_tests(self) -> list[str]:
        return [str(compared.path) for compared in (self.before, self.after)
                if not compared.tests_known]


def _where(step: StepRecord) -> str:
    """A step's title and, when the run recorded one, its door: a run over several
    doors has one ``ls at 1 clients`` per door."""
    return f"{step.title} over {step.door}" if step.door else step.title


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' * (number != 1)}"


def _check_outcomes(compared: ComparedRun, *others: ComparedRun) -> dict[str, str]:
    """The outcomes of ``compared``'s checks (its load tests left out: their steps are
    judged by their rules and the statistical gate)."""
    return {nodeid: test.outcome for nodeid, test in compared.tests.items()
            if not _is_load_test(nodeid, compared, *others)}


def _statistical(compared: ComparedRun) -> dict[str, StepGate | None] | None:
    """Each step's statistical gate (its ``gate`` key, :mod:`.gate`) by step id, None
    for one whose key cannot be read; None when no step of the file holds one."""
    found: dict[str, StepGate | None] = {}
    for raw, step in zip(compared.raw_steps, compared.steps, strict=False):
        data = raw.get("gate")
        if not isinstance(data, dict):
            continue
        try:
            step_gate = StepGate.from_json(data)
            step_gate.short()  # its numbers can be written
        except (TypeError, ValueError, AttributeError, OverflowError):
            found[step.step_id] = None
            continue
        found[step.step_id] = step_gate
    return found or None


def gate(runs: list[ComparedRun], acceptance: Acceptance | None = None) -> Gate:
    """The last run judged against the one before it."""
    before, after = runs[-2], runs[-1]
    changes = outcome_changes(_check_outcomes(before, after), _check_outcomes(after, before),
                              {nodeid: test.cause for nodeid, test in after.tests.items()})
    changes += step_changes(before.steps, after.steps)
    acceptance = acceptance or Acceptance()
    behaviour = BehaviourGate(str(before.path), tuple(acceptance.judge(changes)),
                              str(acceptance.path or ""))
    statistical = _statistical(after)
    failures, notes = [], []
    if statistical is None:
        source = "the steps' rules"
        regressions = [f"{step.title}: {step.verdict}: {'; '.join(step.violations)}"
                       for step in after.steps if step.verdict is Verdict.FAIL]
    else:
        source = "the statistical gate: ratio to the baseline [95 % interval]"
        regressions = []
        for step in after.steps:
            if step.step_id in statistical and statistical[step.step_id] is None:
                regressions.append(f"{_where(step)}: its gate cannot be read")
                continue
            judged = statistical.get(step.step_id)
            reason = f" ({judged.reason})" if judged is not None and judged.reason else ""
            if judged is not None and judged.fails:
                regressions.append(f"{_where(step)}: {judged.short()}{reason}")
            elif step.verdict is Verdict.FAIL:
                failures.append(f"{_where(step)}: {step.verdict}: "
                                f"{'; '.join(step.violations)}")
            if judged is not None and judged.verdict is GateVerdict.INCONCLUSIVE:
                notes.append(f"{_where(step)}: {judged.short()}{reason}")
    failures += [f"{_where(step)}: {step.verdict}" + (f": {step.error}" if step.error else "")
                 for step in after.steps if step.verdict in UNMEASURED]
    blocking = {change.test for change in behaviour.blocking}
    failures += [f"{nodeid}: {test.outcome}" + (
                     f": {test.cause.splitlines()[0]}" if test.cause.strip() else "")
                 for nodeid, test in after.tests.items()
                 if test.outcome in FAILING_OUTCOMES and nodeid not in blocking
                 and not _is_load_test(nodeid, after)]
    return Gate(before, after, behaviour, regressions, failures, source, notes)


def session_gate(baselines: list[Path], acceptance: Acceptance | None,
                 tests: dict[str, str], causes: dict[str, str],
                 steps: list[StepRecord]) -> BehaviourGate:
    """A run's behaviour gate against its baselines (``--storage-baseline``): its
    checks' outcomes (``tests``: node id -> outcome, load tests left out) against
    those of the latest baseline that ran each, its load steps' error kinds and
    throttling against the latest baseline's steps."""
    before: dict[str, str] = {}
    base_steps: list[StepRecord] = []
    known = False
    for path in baselines:
        _, base_steps, document = read_results(path, "--storage-baseline")
        listed = document.get("tests")
        known = known or isinstance(listed, list)
        before.update({str(test.get("nodeid")): str(test.get("outcome", ""))
                       for test in (listed if isinstance(listed, list) else [])
                       if isinstance(test, dict) and test.get("kind") != "load"})
    changes = outcome_changes(before, tests, causes) + step_changes(base_steps, steps)
    acceptance = acceptance or Acceptance()
    return BehaviourGate(", ".join(map(str, baselines)), tuple(acceptance.judge(changes)),
                         str(acceptance.path or ""), outcomes_known=known)


def report_lines(runs: list[ComparedRun], verdict: Gate | None = None) -> list[str]:
    """The whole comparison for the terminal: the gate's verdict and what changed
    first (:meth:`Gate.lines`), then the table, the runs, each step and check whose
    verdict or outcome changed from run to run. Every text from a results file is
    printable (:func:`printable`) and without credentials."""
    verdict = verdict if verdict is not None else gate(runs)
    return [*_shown(verdict.lines()), *_shown(tape_changes(runs)), "", *detail_lines(runs)]


def tape_changes(runs: list[ComparedRun]) -> list[str]:
    """The tape path between the last two runs (:mod:`.reporting.tape`): each tape
    step served or not in each, its rates, what failed it; none without tape steps."""
    before, after = runs[-2], runs[-1]
    return tape.tape_lines(
        (before.letter, before.steps, {k: t.outcome for k, t in before.tests.items()}),
        (after.letter, after.steps, {k: t.outcome for k, t in after.tests.items()}))


def _shown(lines: list[str]) -> list[str]:
    return [printable(redact_text(line)) for line in lines]


def detail_lines(runs: list[ComparedRun]) -> list[str]:
    """Under the gate: the table, the runs, what changed from run to run."""
    rows = align(runs)
    lines = table_lines(runs, rows) if rows else ["(no load steps in these files)"]
    lines += ["", "runs:", *(f"  {compared.facts()}" for compared in runs)]
    verdicts = changed_verdicts(runs, rows)
    lines += ["", "load steps whose verdict changed:" if verdicts else
              "load steps whose verdict changed: none", *(f"  {v}" for v in verdicts)]
    if any(compared.tests for compared in runs):
        outcomes = changed_outcomes(runs)
        lines += ["", "checks whose outcome changed:" if outcomes else
                  "checks whose outcome changed: none", *(f"  {o}" for o in outcomes)]
    else:
        lines += ["", "checks whose outcome changed: not known (these results files do "
                  "not hold the tests' outcomes)"]
    return _shown(lines)


# -- the page --------------------------------------------------------------------------------

def scans_by_run(runs: list[ComparedRun]) -> dict[str, dict[str, list[StepRecord]]]:
    """Each scan's steps per run title (:func:`~.reporting.plots.scans`)."""
    grouped: dict[str, dict[str, list[StepRecord]]] = {}
    for compared in runs:
        for name, steps in plots.scans(compared.steps).items():
            grouped.setdefault(name, {})[compared.title] = steps
    return grouped


def page_html(runs: list[ComparedRun], verdict: Gate | None = None) -> str:
    """The page: the gate's verdict and what changed first, then each run's facts,
    the table, and each scan's runs overlaid (left out, saying so, without
    matplotlib)."""
    verdict = verdict if verdict is not None else gate(runs)
    title = " vs ".join(printable(compared.title) for compared in runs)
    state = "passed" if verdict.passed else "failed"
    changed = _shown(verdict.lines()) + _shown(tape_changes(runs))
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>storagescale compare {state}: {html.escape(title)}</title>"
             f"<style>{_STYLE} pre {{ font-size: 90%; white-space: pre-wrap; }}"
             f"</style></head><body>",
             f"<h1 class='verdict {state}'>gate {state.upper()}</h1>",
             f"<p>{html.escape(title)}</p>",
             "<h2>What changed</h2>",
             f"<pre class='gate'>{html.escape(chr(10).join(changed[1:]))}</pre>",
             "<table class='facts'>" + "".join(
                 f"<tr><th>{html.escape(compared.letter)}</th>"
                 f"<td>{html.escape(printable(compared.facts()))}</td></tr>"
                 for compared in runs) + "</table>",
             "<h2>Steps, run by run</h2>",
             f"<pre>{html.escape(chr(10).join(detail_lines(runs)))}</pre>"]
    grouped = scans_by_run(runs)
    forest = forest_rows(runs[-1])
    if (grouped or forest) and not plots.available():
        parts.append(f"<p class='note'>{NO_PLOTS}</p>")
        grouped, forest = {}, []
    if forest:  # under what changed: each step's ratio and interval, the verdict's colour
        after_changes = next(index for index, part in enumerate(parts)
                             if part.startswith("<pre class='gate'>")) + 1
        parts.insert(after_changes, _img(
            plots.forest_png(forest), f"the gate: {runs[-1].letter} / {runs[-2].letter} per "
                                      f"step, 95 % intervals"))
    if grouped:
        parts.append("<h2>Scans, runs overlaid</h2>")
        for name, by_run in grouped.items():
            parts += [f"<h3>{html.escape(printable(name))}</h3>",
                      _img(plots.overlay_png(name, by_run), f"scan {printable(name)}, runs "
                                                             f"overlaid")]
    parts.append("</body></html>")
    return redact_html("\n".join(parts))


def forest_rows(compared: ComparedRun) -> list[tuple[str, float, float, float, str, float]]:
    """The statistical gate's effects of ``compared``'s steps (rate and p99 of each
    step that holds a ``gate`` with an interval): label, ratio, low, high, verdict and
    the bound it was judged against (:func:`~.reporting.plots.forest_figure`)."""
    rows = []
    judged = _statistical(compared) or {}
    for step in compared.steps:
        step_gate = judged.get(step.step_id)
        if step_gate is None:
            continue
        for metric, name in (("rate_hz", "rate"), ("p99_s", "p99")):
            effect = step_gate.effects.get(metric)
            if effect is None or effect.below_floor is not None \
                    or None in (effect.ratio, effect.low, effect.high):
                continue  # (a latency below the floor is not judged: not drawn)
            values = [effect.ratio, effect.low, effect.high]
            if not all(isinstance(v, int | float) and 0 < v < 1e6 for v in values):
                continue  # nothing a log axis can draw
            ratio, low, high = (float(v or 0.0) for v in values)
            effect_size = effect.min_effect if isinstance(effect.min_effect, int | float) \
                and 0 <= effect.min_effect < 1 else 0.0
            bound = 1 - effect_size if metric == "rate_hz" else 1 + effect_size
            rows.append((f"{printable(step.title)} ({name})", ratio, low, high,
                         str(effect.verdict), bound))
    return rows


#: said on the page when matplotlib is missing
NO_PLOTS = ("Plots left out: matplotlib is not installed in this environment (install "
            "pytest-storagescale[report] for the scans' overlays); the tables above are "
            "complete.")


def write_page(directory: Path, runs: list[ComparedRun], verdict: Gate | None = None) -> Path:
    """``DIR/index.html``: the gate, the comparison and each scan's runs overlaid."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        page = directory / "index.html"
        page.write_text(page_html(runs, verdict), encoding="utf-8")
    except OSError as exc:
        raise _bad(f"--html {directory}: cannot write the page there ({exc.strerror or exc}); "
                   f"give a folder you can write.") from None
    return page


# -- a run with --storage-baseline: each step's Allure test --------------------------------

def baseline_run(baseline: Baseline) -> ComparedRun:
    return ComparedRun(baseline.path, "A", baseline.run, list(baseline.steps.values()))


def step_comparison(baseline: Baseline, run: RunInfo, record: StepRecord,
                    scan: list[StepRecord]) -> tuple[str, bytes | None]:
    """The baseline's step beside ``record`` (text lines, as the command writes them)
    and, for a scan step, the scan's rate and p99 vs clients of both runs overlaid."""
    before = baseline_run(baseline)
    now = ComparedRun(Path("this run"), "B", run, [record])
    if is_probe(record):  # its judged probe beside the baseline's (recovery_s)
        base = next((step for step in before.steps if is_probe(step) and _same_test(
            step, record) and step.verdict is not Verdict.INFO), None)
    else:
        base = baseline.find(record)
    before.steps = [base] if base is not None else []
    rows = align([before, now])
    text = "\n".join(table_lines([before, now], rows)) if rows else ""
    image = None
    if scan and not record.label:
        theirs = plots.scan_of(list(baseline.steps.values()), base) if base else []
        if theirs:
            image = plots.overlay_png(record.section, {before.title: theirs, now.title: scan})
    return text, image


def _same_test(step: StepRecord, record: StepRecord) -> bool:
    return step.test == record.test and step.door == record.door


def attach_to_allure(baseline: Baseline, run: RunInfo, record: StepRecord,
                     scan: list[StepRecord]) -> None:
    """Attach the step's comparison with its baseline step to its Allure test."""
    import allure

    text, image = step_comparison(baseline, run, record, scan)
    if text:
        allure.attach(redact_text(text), f"vs baseline {baseline.version}: {record.title}",
                      allure.attachment_type.TEXT)
    if image is not None:
        allure.attach(image, f"scan {record.section}: baseline {baseline.version} and this "
                      f"run overlaid", allure.attachment_type.PNG)


#: the JUnit XML ``<property>`` names of the run's behaviour gate
JUNIT_GATE = "storagescale_behaviour_gate"
JUNIT_GATE_LINES = "storagescale_behaviour_gate_lines"


def junit_behaviour_gate(path: str | Path | None, gate: BehaviourGate | None) -> str | None:
    """The run's behaviour gate into the JUnit XML file ``path`` (pytest's
    ``--junitxml``, written before this: its session-end hook runs before the
    plugin's), as two properties of each ``<testsuite>``: :data:`JUNIT_GATE`, the
    verdict line (``gate: 1 behaviour change not accepted (against base.json)``), and
    :data:`JUNIT_GATE_LINES`, what changed, one line each. The file is parsed and
    written again (a new file renamed over it). Returns why it could not, or None."""
    if not path or gate is None:
        return None
    import os
    import xml.etree.ElementTree as ET

    path = Path(path)
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError) as exc:
        return f"JUnit XML {path}: the behaviour gate not added ({exc})"
    root = tree.getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    lines = gate.lines()
    for suite in suites:
        properties = suite.find("properties")
        if properties is None:
            properties = ET.Element("properties")
            suite.insert(0, properties)
        for name, value in ((JUNIT_GATE, lines[0] if lines else ""),
                            (JUNIT_GATE_LINES, "\n".join(lines[1:]))):
            ET.SubElement(properties, "property", name=name, value=redact_text(value))
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tree.write(temporary, encoding="utf-8", xml_declaration=True)
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        return f"JUnit XML {path}: the behaviour gate not added ({exc})"
    return None
