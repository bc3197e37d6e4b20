"""The seeds-style table: one row per step (per side for a mixed step).

    op    clients  succeeded      rate   failed  hung   p50     p99    verdict
    stat       50     55100   11020 Hz       0     0   4 ms   12 ms   pass

A step that measured nothing (it could not run) gets one row of ``-`` with its
verdict, so a table always shows every step that was planned. When the steps ran
over more than one door (``--storage-load-doors``), a ``door`` column follows ``op``.
"""

from __future__ import annotations

import math

from ..cluster.breakdown import lost_text
from ..load.stats import SideResult
from ..records import RuleCheck, StepRecord

COLUMNS = ("op", "clients", "succeeded", "rate", "MB/s", "failed", "hung", "p50", "p99",
           "verdict")
#: the column naming a step's door, when the steps used several
DOOR_COLUMN = "door"


def format_rate(hz: float) -> str:
    if hz >= 100:
        return f"{hz:.0f} Hz"
    if hz >= 10:
        return f"{hz:.1f} Hz"
    return f"{hz:.2f} Hz"


def format_seconds(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s" if seconds < 100 else f"{seconds:.0f} s"


def _change(step: StepRecord) -> str:
    """The ``vs base`` cell: empty when the run was not compared with a baseline."""
    return step.baseline.change_text() if step.baseline is not None else ""


def _side_name(step: StepRecord, side_name: str, several: bool) -> str:
    """``mixed/readers (mixed)`` for a side of a composite step, else the step's name."""
    if not several:
        return step.name
    label = f" ({step.label})" if step.label and step.label != step.side else ""
    return f"{step.section}/{side_name}{label}"


def _side_cells(side: SideResult) -> list[str]:
    """clients .. p99 of one side."""
    return [
        str(side.clients), str(side.succeeded), format_rate(side.rate_hz),
        f"{side.mb_s:.1f}" if side.bytes else "-", str(side.failed), str(side.hung),
        format_seconds(side.latency_s.get("p50")), format_seconds(side.latency_s.get("p99")),
    ]


def step_rows(step: StepRecord, *, with_baseline: bool = False,
              with_door: bool = False) -> list[list[str]]:
    """Table rows for one step: one per side, or one row of ``-`` when it measured
    nothing; ``with_door``: the step's door after its name."""
    tail = [*([_change(step)] if with_baseline else []), str(step.verdict)]
    door = [step.door or "-"] if with_door else []
    sides = step.sides
    if not sides:
        return [[step.name, *door, str(step.clients), *["-"] * 7, *tail]]
    return [[_side_name(step, name, len(sides) > 1), *door, *_side_cells(side), *tail]
            for name, side in sides.items()]


def render(rows: list[list[str]], columns: tuple[str, ...] = COLUMNS) -> list[str]:
    """Align ``rows`` under ``columns``: text left, numbers right."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(columns)]
    left = {0, len(columns) - 1, *(i for i, c in enumerate(columns) if c == DOOR_COLUMN)}

    def line(cells: list[str] | tuple[str, ...]) -> str:
        return "  ".join(
            cell.ljust(w) if i in left else cell.rjust(w) for i, (cell, w) in
            enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(columns), *(line(r) for r in rows)]


def several_doors(steps: list[StepRecord], main_door: str = "") -> bool:
    """Whether the table of ``steps`` names their doors: they ran over more than one,
    or over another than the run's ``main_door`` (the endpoint's own)."""
    doors = {step.door for step in steps}
    return len(doors) > 1 or bool(main_door and doors and doors != {main_door})


def columns_for(steps: list[StepRecord], main_door: str = "") -> tuple[bool, tuple[str, ...]]:
    """The columns of a table of ``steps``: a ``vs base`` column when compared, a
    ``door`` column when they ran over several doors (:func:`several_doors`)."""
    with_baseline = any(step.baseline is not None for step in steps)
    columns = COLUMNS if not with_baseline else (*COLUMNS[:-1], "vs base", COLUMNS[-1])
    if several_doors(steps, main_door):
        columns = (columns[0], DOOR_COLUMN, *columns[1:])
    return with_baseline, columns


def table_rows(steps: list[StepRecord], main_door: str = "", *, client_column: bool = False
               ) -> tuple[tuple[str, ...], list[list[list[str]]]]:
    """The columns, and each step's rows under them (see :func:`step_rows`); with
    ``client_column``, the step's client CPU (:func:`client_cell`) before the verdict."""
    with_baseline, columns = columns_for(steps, main_door)
    with_door = several_doors(steps, main_door)
    per_step = [step_rows(s, with_baseline=with_baseline, with_door=with_door)
                for s in steps]
    if not client_column:
        return columns, per_step
    return (*columns[:-1], CLIENT_COLUMN, columns[-1]), [
        [[*row[:-1], client_cell(step), row[-1]] for row in rows]
        for step, rows in zip(steps, per_step, strict=True)]


def saturation_note(steps: list[StepRecord]) -> list[str]:
    """The note under a table with a saturated step (``saturated*``), else nothing."""
    return [SATURATED_NOTE] if any(step.client_saturated for step in steps) else []


#: the column that appears when a step saturated its client host
CLIENT_COLUMN = "client CPU"
#: the mark of such a step, explained under the table
SATURATED = "saturated*"
SATURATED_NOTE = ("* the client processes used more of the client host's cores than "
                  "--storage-client-cpu-limit: such a step measured the client host, not "
                  "the storage")


def client_cell(step: StepRecord) -> str:
    """``35%``, ``97% saturated*``, or ``-`` when not measured."""
    cpu = step.client_cpu
    if math.isnan(cpu):
        return "-"
    return f"{cpu:.0%} {SATURATED}" if step.client_saturated else f"{cpu:.0%}"


def format_table(steps: list[StepRecord], main_door: str = "") -> list[str]:
    """The run's table as terminal lines (header first); a ``client CPU`` column and a
    note under the table when a step saturated its client host; a ``door`` column when
    the steps ran over several doors, or another than ``main_door``."""
    note = saturation_note(steps)
    columns, per_step = table_rows(steps, main_door, client_column=bool(note))
    return [*render([row for rows in per_step for row in rows], columns), *note]


def _limit(check: RuleCheck) -> str:
    return "(no baseline)" if check.limit is None else f"{check.comparison} {check.limit:.6g}"


_RESULT = {True: "ok", False: "VIOLATED", None: "not checked"}


def format_violations(checks: list[RuleCheck], thresholds_file: str) -> list[str]:
    """The failure table of one step: metric, observed, limit, rule, file, result."""
    rows = [
        [c.metric, f"{c.observed:.6g}", _limit(c), c.rule, thresholds_file, _RESULT[c.passed]]
        for c in checks
    ]
    return render(rows, ("metric", "observed", "limit", "rule", "file", "result"))


def format_why(step: StepRecord, *, top: int = 3) -> list[str]:
    """Why a step went wrong, for a person reading a red CI job: the step's error
    (nothing measured, could not run), its most frequent failure classes with one
    example message each, and a clean-up the storage refused."""
    lines = [f"error: {step.error}"] if step.error else []
    if step.client_saturated:
        lines.append(step.saturation_text())
    total = step.total
    if total is not None and total.errors:
        ranked = sorted(total.errors.items(), key=lambda item: (-item[1], item[0]))
        for name, count in ranked[:top]:
            example = total.error_examples.get(name, "")
            lines.append(f"{count} x {name}" + (f": {example}" if example else ""))
        if len(ranked) > top:
            lines.append(f"... and {len(ranked) - top} more error classes (see the JSON)")
    if step.lost and (lost := lost_text(step.hosts)):  # a cluster step's lost hosts
        lines.append(lost)
    if step.cleanup_error:
        lines.append(f"clean-up refused: {step.cleanup_error}")
    return lines


def format_failures(steps: list[StepRecord], main_door: str = "") -> list[str]:
    """One block per step that did not pass, with :func:`format_why`'s lines (the
    step's door named when the steps ran over several)."""
    lines = []
    several = several_doors(steps, main_door)
    for step in steps:
        why = format_why(step)
        if step.verdict.value in ("fail", "error", "interrupted") or step.cleanup_error:
            if why:
                door = f" over {step.door}" if several else ""
                lines.append(f"{step.title}{door} ({step.verdict}):")
                lines.extend(f"  {line}" for line in why)
    return lines
