"""The seeds-style table: one row per step (per side for a mixed step).

    op    clients  succeeded      rate   failed  hung   p50     p99    verdict
    stat       50     55100   11020 Hz       0     0   4 ms   12 ms   pass

A step that measured nothing (it could not run) gets one row of ``-`` with its
verdict, so a table always shows every step that was planned. When the steps ran
over more than one door (``--storage-load-doors``), a ``door`` column follows ``op``.
A step with derived metrics (the seeds' key numbers: ``mix_ratio`` of a mixed step,
``recovery_s`` of a recovery probe) shows them in a ``derived`` column.

:func:`csv_rows` is the same table for a spreadsheet: the columns named as the JSON's
metrics (``rate_hz``, ``mb_s``, ``p50_s``: the unit in the name), every cell a plain
number (empty: not measured), one column per derived metric.
"""

from __future__ import annotations

import math

from ..cluster.breakdown import lost_text
from ..load.stats import SideResult
from ..records import RuleCheck, StepRecord
from ..units import format_rate, format_seconds

COLUMNS = ("op", "clients", "succeeded", "rate", "MB/s", "failed", "hung", "p50", "p99",
           "verdict")
#: the column naming a step's door, when the steps used several
DOOR_COLUMN = "door"
#: the column of a step's derived metrics (``mix_ratio 0.87``), when a step has some
DERIVED_COLUMN = "derived"
#: counts shown after ``hung`` when a step has some: operations the storage throttled
#: (429/503 with Retry-After past their deadline), redirects the clients followed (a
#: dCache door to its pools)
COUNT_COLUMNS = ("throttled", "redirects")
#: an open-loop step's offered rate (after ``clients``, its cap on requests in flight)
#: and its requests dropped at that cap (after ``failed``), when a step is open-loop;
#: its ``rate`` is the achieved rate, its p50/p99 response times
OFFERED_COLUMN, DROPPED_COLUMN = "offered", "dropped"


def format_derived(name: str, value: float) -> str:
    """A derived metric's value: seconds as the table writes them (infinite: never,
    as a ``recovery_s`` that never recovered), else 3 significant digits."""
    if math.isnan(value):
        return "-"
    if name.endswith("_s"):
        return "never" if math.isinf(value) else format_seconds(value)
    return f"{value:.3g}"


def derived_cell(step: StepRecord) -> str:
    """``mix_ratio 0.87``, ``recovery_s 12.00 s``: the step's derived metrics; a mean
    with its standard deviation as the seeds wrote them, ``mb_s 62.5 ± 0.951``."""
    derived = step.derived
    cells = []
    for name, value in derived.items():
        base = name.removesuffix("_stddev")
        if base != name and f"{base}_mean" in derived:
            continue  # beside its mean
        base = name.removesuffix("_mean")
        spread = derived.get(f"{base}_stddev") if base != name else None
        cells.append(f"{name} {format_derived(name, float(value))}" if spread is None else
                     f"{base} {format_derived(name, float(value))} ± "
                     f"{format_derived(name, float(spread))}")
    return ", ".join(cells)


def _change(step: StepRecord) -> str:
    """The ``vs base`` cell: the rate's change, then the gate's ratio with its 95 %
    interval and verdict (``-49% rate 0.51 [0.50-0.52] regressed``); empty when the run
    was not compared with a baseline."""
    if step.baseline is None:
        return ""
    change = step.baseline.change_text()
    return f"{change} {step.gate.short()}" if step.gate is not None else change


def gate_note(steps: list[StepRecord]) -> list[str]:
    """Under a table compared with a baseline: each step whose gate did not find it
    unchanged or improved, with the gate's reason (a regression, or why the comparison
    is inconclusive: never a silent pass)."""
    lines = [f"gate: {step.title}: {step.gate.verdict}"
             f"{f' ({step.gate.retest})' if step.gate.retest else ''}: {step.gate.reason}"
             + (f"; {step.gate.stall}" if step.gate.stall else "")
             for step in steps if step.gate is not None
             and step.gate.verdict.value in ("regressed", "inconclusive")]
    return lines


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
              with_door: bool = False, with_derived: bool = False,
              counts: tuple[str, ...] = ()) -> list[list[str]]:
    """Table rows for one step: one per side, or one row of ``-`` when it measured
    nothing; ``with_door``: the step's door after its name; ``with_derived``: the
    step's derived metrics (on its first row) after p99; ``counts``: those of
    :data:`COUNT_COLUMNS` after hung."""
    tail = [*([_change(step)] if with_baseline else []), str(step.verdict)]
    door = [step.door or "-"] if with_door else []
    derived = [derived_cell(step)] if with_derived else []
    sides = step.sides
    if not sides:
        return [[step.name, *door, str(step.clients), *["-"] * (7 + len(counts)),
                 *derived, *tail]]
    at = COLUMNS.index("hung")  # in the side's cells, which begin at clients
    return [[_side_name(step, name, len(sides) > 1), *door,
             *_with_counts(_side_cells(side), at, side, counts),
             *(derived if index == 0 else [""] * len(derived)), *tail]
            for index, (name, side) in enumerate(sides.items())]


def _with_counts(cells: list[str], at: int, side: SideResult,
                 counts: tuple[str, ...]) -> list[str]:
    """``cells`` with the side's ``counts`` inserted at ``at``."""
    return [*cells[:at], *(str(getattr(side, name)) for name in counts), *cells[at:]]


def shown_counts(steps: list[StepRecord]) -> tuple[str, ...]:
    """The :data:`COUNT_COLUMNS` a side of ``steps`` has some of (shown then)."""
    return tuple(name for name in COUNT_COLUMNS if any(
        getattr(side, name) for step in steps for side in step.sides.values()))


def render(rows: list[list[str]], columns: tuple[str, ...] = COLUMNS,
           text: tuple[str, ...] = ()) -> list[str]:
    """Align ``rows`` under ``columns``: text left (the first and last columns, a door
    or derived column, the columns named in ``text``), numbers right."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(columns)]
    left = {0, len(columns) - 1, *(i for i, c in enumerate(columns)
                                   if c in (DOOR_COLUMN, DERIVED_COLUMN, *text))}

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
    columns: tuple[str, ...] = (
        COLUMNS if not with_baseline else (*COLUMNS[:-1], "vs base", COLUMNS[-1]))
    if any(step.derived for step in steps):  # after p99
        at = COLUMNS.index("p99") + 1
        columns = (*columns[:at], DERIVED_COLUMN, *columns[at:])
    if counts := shown_counts(steps):  # after hung
        at = COLUMNS.index("hung") + 1
        columns = (*columns[:at], *counts, *columns[at:])
    if several_doors(steps, main_door):
        columns = (columns[0], DOOR_COLUMN, *columns[1:])
    return with_baseline, columns


def table_rows(steps: list[StepRecord], main_door: str = "", *, client_column: bool = False
               ) -> tuple[tuple[str, ...], list[list[list[str]]]]:
    """The columns, and each step's rows under them (see :func:`step_rows`); with
    ``client_column``, the step's client CPU (:func:`client_cell`) before the verdict."""
    with_baseline, columns = columns_for(steps, main_door)
    with_door = several_doors(steps, main_door)
    per_step = [step_rows(s, with_baseline=with_baseline, with_door=with_door,
                          with_derived=DERIVED_COLUMN in columns,
                          counts=tuple(c for c in COUNT_COLUMNS if c in columns))
                for s in steps]
    if any(step.arrival_rate for step in steps):
        columns, per_step = _with_open_loop(steps, columns, per_step)
    if client_column:
        columns, per_step = (*columns[:-1], CLIENT_COLUMN, columns[-1]), [
            [[*row[:-1], client_cell(step), row[-1]] for row in rows]
            for step, rows in zip(steps, per_step, strict=True)]
    if any(step.server is not None for step in steps):  # beside the client's figures
        columns, per_step = (*columns[:-1], SERVER_COLUMN, columns[-1]), [
            [[*row[:-1], server_cell(step) if index == 0 else "", row[-1]]
             for index, row in enumerate(rows)]
            for step, rows in zip(steps, per_step, strict=True)]
    return columns, per_step


#: the column of the server's side of a step (load/server_monitor.py), when a step has one
SERVER_COLUMN = "server"


def server_cell(step: StepRecord) -> str:
    """``106127 stat (254236 req, 2/stat), CPU 45%``: the step's operations as the
    server counted them (its counter over what it counts per operation: XRootD 5 counts
    a stat twice), beside the requests of every kind it counted over the load (logins,
    warm-up and drain too), and its processes' CPU over the window (``saturated*``
    above the limit); ``254236 req`` when its counters have none of the step's kind;
    ``-``: unknown. dCache's billing adds the step's files it saw go to tape and come
    back (``12 to tape``, ``8 from tape``); its exporter (:func:`exporter_part`) the
    namespace's count."""
    server = step.server
    if server is None:
        return "-"
    parts = []
    if server.requests is not None:
        operations, name = server.operations, step.operation
        parts.append(f"{server.requests} req" if operations is None else
                     f"{operations:.0f} {name} ({server.requests} req, "
                     f"{server.per_operation:g}/{name})")
    for key, words in (("stored", "to tape"), ("restored", "from tape")):
        if server.ops.get(key):
            parts.append(f"{server.ops[key]} {words}")
    if not math.isnan(server.cpu):
        parts.append(f"CPU {server.cpu:.0%}" + (f" {SATURATED}" if step.server_saturated
                                                 else ""))
    if (exporter := exporter_part(step)):
        parts.append(exporter)
    return ", ".join(parts) or "-"


def exporter_part(step: StepRecord) -> str:
    """dCache's Prometheus exporter in the server cell: ``exporter 20 put (143 pnfs
    req)`` (its count of the step's operations, and PnfsManager's requests of every
    kind; ``exporter 72 put, 2 retried (...)``: 2 of them retries inside the clients'
    operations), ``exporter 143 pnfs req`` when no counter is the step's, ``no exporter``
    when the release ships none (10.2), ``exporter not read`` when a scrape failed
    (the JSON says why); "" when the server has no exporter to ask (not a dCache)."""
    figures = step.server.exporter if step.server is not None else None
    if figures is None:
        return ""
    if figures.note:
        return "no exporter" if "ships no" in figures.note else "exporter not read"
    requests = f"{figures.namespace_requests} pnfs req"
    if figures.operations is None:
        return f"exporter {requests}"
    retried = f", {figures.retried} retried" if figures.retried else ""
    return f"exporter {figures.operations:.0f} {step.operation}{retried} ({requests})"


def _with_open_loop(steps: list[StepRecord], columns: tuple[str, ...],
                    per_step: list[list[list[str]]]
                    ) -> tuple[tuple[str, ...], list[list[list[str]]]]:
    """``columns`` and rows with :data:`OFFERED_COLUMN` and :data:`DROPPED_COLUMN`
    (``-`` for a closed-loop step)."""
    offered_at = columns.index("clients") + 1
    dropped_at = columns.index("failed") + 2  # after the offered column
    widened = (*columns[:offered_at], OFFERED_COLUMN, *columns[offered_at:])
    widened = (*widened[:dropped_at], DROPPED_COLUMN, *widened[dropped_at:])
    rows = []
    for step, step_rows_ in zip(steps, per_step, strict=True):
        sides = list(step.sides.values()) or [None] * len(step_rows_)
        offered = format_rate(step.arrival_rate) if step.arrival_rate else "-"
        out = []
        for row, side in zip(step_rows_, sides, strict=True):
            dropped = str(side.dropped) if step.arrival_rate and side is not None else "-"
            row = [*row[:offered_at], offered, *row[offered_at:]]
            out.append([*row[:dropped_at], dropped, *row[dropped_at:]])
        rows.append(out)
    return widened, rows


def _number(value: float | int | None) -> str:
    """A CSV cell: the number as written (6 significant digits), empty when unknown."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def _side_numbers(side: SideResult, counts: tuple[str, ...] = ()) -> list[str]:
    """clients .. p99_s of one side as plain numbers, ``counts`` (:func:`csv_counts`)
    after hung."""
    return [_number(side.clients), _number(side.succeeded), _number(side.rate_hz),
            _number(side.mb_s) if side.bytes else "", _number(side.failed),
            _number(side.hung), *(_number(getattr(side, name)) for name in counts),
            _number(side.latency_s.get("p50")), _number(side.latency_s.get("p99"))]


def csv_counts(steps: list[StepRecord]) -> tuple[str, ...]:
    """The CSV's columns after hung: the table's :data:`COUNT_COLUMNS` a side of
    ``steps`` has some of, and ``door_latency_s`` (empty where not measured) beside
    ``redirects``."""
    shown = shown_counts(steps)
    return (*shown, "door_latency_s") if "redirects" in shown else shown


def _saturated(step: StepRecord) -> str:
    """1: the step measured its client host (the table's ``saturated*``), 0: not, empty:
    the client CPU was not measured."""
    return "" if math.isnan(step.client_cpu) else str(int(step.client_saturated))


def csv_rows(steps: list[StepRecord], main_door: str = "") -> list[list[str]]:
    """The table for a spreadsheet, header first: the columns named as the results'
    metrics (the unit in the name: ``rate_hz``, ``mb_s``, ``p50_s``; ``client_cpu``
    and ``rate_change`` as fractions; ``client_saturated`` 1 for the table's
    ``saturated*``), plain numbers (empty: not measured), one column per derived
    metric; a ``door`` column when the steps used several doors."""
    with_door = several_doors(steps, main_door)
    with_baseline = any(step.baseline is not None for step in steps)
    derived = list(dict.fromkeys(name for step in steps for name in step.derived))
    with_server = any(step.server is not None for step in steps)
    with_open = any(step.arrival_rate for step in steps)
    counts = csv_counts(steps)
    header = ["op", *([DOOR_COLUMN] if with_door else []), "clients", "succeeded", "rate_hz",
              "mb_s", "failed", "hung", *counts, "p50_s", "p99_s",
              *(OPEN_LOOP_CSV if with_open else []), *derived,
              *(["rate_change", *GATE_CSV] if with_baseline else []), "client_cpu",
              "client_saturated",
              *(SERVER_CSV if with_server else []), "verdict"]
    rows = [header]
    for step in steps:
        door = [step.door or ""] if with_door else []
        change = ([_number(step.baseline.rate_change if step.baseline is not None
                           and step.baseline.matched else None), *_gate_numbers(step)]
                  if with_baseline else [])
        sides = step.sides or {"": None}
        for index, (name, side) in enumerate(sides.items()):
            numbers = (_side_numbers(side, counts) if side is not None
                       else [_number(step.clients), *[""] * (7 + len(counts))])
            values = [_number(step.derived.get(metric)) if index == 0 else ""
                      for metric in derived]
            numbers += _open_numbers(step, side) if with_open else []
            rows.append([_side_name(step, name, len(sides) > 1), *door, *numbers, *values,
                         *change, _number(step.client_cpu), _saturated(step),
                         *(_server_numbers(step, index) if with_server else []),
                         str(step.verdict)])
    return rows


#: the CSV's columns of the gate against the baseline (gate.py), when compared: the
#: deciding metric, its ratio this run / baseline, the 95 % interval and the verdict
GATE_CSV = ("gate_metric", "gate_ratio", "gate_low", "gate_high", "gate_verdict")


def _gate_numbers(step: StepRecord) -> list[str]:
    gate = step.gate
    if gate is None:
        return [""] * len(GATE_CSV)
    return [gate.metric or "", _number(gate.ratio), _number(gate.low), _number(gate.high),
            gate.verdict.value]


#: the CSV's columns of the server's side, when a step has one
SERVER_CSV = ("server_ops", "server_cpu", "server_saturated")
#: the CSV's columns of an open-loop step (empty for a closed one), when a step is one
OPEN_LOOP_CSV = ("offered_hz", "dropped", "late")


def _open_numbers(step: StepRecord, side: SideResult | None) -> list[str]:
    """The :data:`OPEN_LOOP_CSV` cells of one side of ``step``."""
    if not step.arrival_rate or side is None:
        return [""] * len(OPEN_LOOP_CSV)
    return [_number(step.arrival_rate), _number(side.dropped), _number(side.late)]


def _server_numbers(step: StepRecord, index: int) -> list[str]:
    """The step's :data:`SERVER_CSV` cells (its first row only)."""
    if index or step.server is None:
        return [""] * len(SERVER_CSV)
    return [_number(step.server.requests), _number(step.server_cpu),
            "" if math.isnan(step.server_cpu) else str(int(step.server_saturated))]


def saturation_note(steps: list[StepRecord]) -> list[str]:
    """The note under a table with a saturated step (``saturated*``), else nothing."""
    missed = [step.title for step in steps if step.schedule_missed]
    return ([SATURATED_NOTE] if any(step.client_saturated for step in steps) else []) + (
        [SERVER_SATURATED_NOTE] if any(step.server_saturated for step in steps) else []) + (
        [f"{SCHEDULE_NOTE}: {'; '.join(missed)}"] if missed else [])


#: the column that appears when a step saturated its client host
CLIENT_COLUMN = "client CPU"
#: the mark of such a step, explained under the table
SATURATED = "saturated*"
SATURATED_NOTE = ("* the client processes used more of the client host's cores than "
                  "--storage-client-cpu-limit: such a step measured the client host, not "
                  "the storage")
SERVER_SATURATED_NOTE = ("* (server) the server processes used more of their cores than "
                         "the same limit: such a step measured the server at its CPU limit")


#: the note naming open-loop steps that did not keep their schedule
SCHEDULE_NOTE = ("open-loop steps whose client host could not keep the schedule (requests "
                 "sent late; their lateness is in the response times)")


def client_cell(step: StepRecord) -> str:
    """``35%``, ``97% saturated*``, or ``-`` when not measured."""
    cpu = step.client_cpu
    if math.isnan(cpu):
        return "-"
    return f"{cpu:.0%} {SATURATED}" if step.client_saturated else f"{cpu:.0%}"


def table_order(steps: list[StepRecord]) -> list[StepRecord]:
    """``steps`` by test, then concurrency: a test function's steps together (the
    functions in the order their first steps ran), its tests (``test_stat[c5]``,
    ``[c50]``...) by the concurrency of their first step, then the order they began
    (doors in the order they ran), each test's steps in the order they ran (a
    recovery's overload stays between its probes). Under
    ``-n`` the steps run in whatever order the workers take the tests."""
    ran = sorted(steps, key=lambda step: step.started)
    functions: dict[str, int] = {}
    first: dict[str, StepRecord] = {}
    for step in ran:
        functions.setdefault(step.test.partition("[")[0], len(functions))
        first.setdefault(step.test, step)

    def key(step: StepRecord) -> tuple:
        test = first[step.test]
        return (functions[step.test.partition("[")[0]], test.clients, test.started,
                step.started)

    return sorted(ran, key=key)


def format_table(steps: list[StepRecord], main_door: str = "") -> list[str]:
    """The run's table as terminal lines (header first), in :func:`table_order`; a
    ``client CPU`` column and a note under the table when a step saturated its client
    host; a ``door`` column when the steps ran over several doors, or another than
    ``main_door``."""
    steps = table_order(steps)
    note = saturation_note(steps)
    columns, per_step = table_rows(steps, main_door, client_column=bool(note))
    return [*render([row for rows in per_step for row in rows], columns), *note,
            *gate_note(steps)]


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
    if step.schedule_missed:
        lines.append(step.schedule_text())
    if step.server_saturated:
        lines.append(step.server_saturation_text())
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
    step's door named when the steps ran over several), in :func:`table_order`."""
    lines = []
    several = several_doors(steps, main_door)
    for step in table_order(steps):
        why = format_why(step)
        if step.verdict.value in ("fail", "error", "interrupted") or step.cleanup_error:
            if why:
                door = f" over {step.door}" if several else ""
                lines.append(f"{step.title}{door} ({step.verdict}):")
                lines.extend(f"  {line}" for line in why)
    return lines
