"""Paired comparison, both sides in one session (``--storage-compare-with``).

Side A is the session's storage (the embedded server, or ``--storage-endpoint``);
side B is a second one of the same kind: another release of the embedded server
(``--storage-compare-with 6.2.1``, started beside A with the same settings) or the
URL of a second storage's test area (``--storage-compare-with
root://127.0.0.1:1095//data/test``), with its own run directory made, marked and
removed as A's is (:class:`~.session.area.RunArea`).

A closed-loop step is measured on both sides in alternating short runs, A B B A A B B A
(:data:`PAIRS` pairs; each side measures the step's duration in all, cut in
``PAIRS`` runs of ``duration / PAIRS`` s, at least :data:`MIN_RUN_S`), each a
complete engine run (:func:`~.load.engine.run_step`: its own warm-up, set-up and
clean-up, count and time bounds), so that what the machine does to one side during the
step it does to the other. Each side's runs are joined into one result
(:func:`joined`: counts added, histograms merged, windows kept in order); B's is the
step's result (its rules judge B, the candidate), A's and both sides' windows and
pairs are the step's ``paired`` record. The gate (:func:`~.gate.judge_pairs`) judges
the pairs of runs made one right after the other: the geometric mean of the pairs'
ratios B / A of rate, p50 and p99 with a bootstrap interval over the pairs, and the
four-valued verdict. A pair's two runs share the machine's load of their moment, so
its ratio is free of it; the two sides' windows pooled are not (beside ``stress-ng
--cpu 4`` the same server measured 0.66-2.27 of itself from one short run to the next:
the windows' interval straddled any minimum effect). While it is ``inconclusive``
another mirrored block of two pairs is added (B A A B, then A B B A ...), until each
side has measured :data:`BUDGET` times the step's duration; then it stays
``inconclusive``, said.

A step over a door of side A (``--storage-load-doors``) runs on side B's door of the
same name (:meth:`SideB.door`; a door side B lacks is one usage error before any load,
:func:`check_compare_with`). Not paired (measured on A alone, as without the option):
open-loop steps (one offered rate spread over two storages would not be the rate a
site asked for), steps of a cluster (``--storage-cluster``), and steps a test hands
doors or a context to (``storage_load.run(doors=..., context=...)``: they hold side
A's clients and servers, the tape's controls; :func:`alone_because`), the steps of a
recovery (timed from its overload's end: ``steps.paired_side``). The server
counters' check (the servers' count of a step's operations against its clients')
does not run on a paired step. Under xdist (``-n``) each worker that runs a load step
starts its own side B (a second embedded server per worker): run paired comparisons
without ``-n``.

**The checks on both sides.** With side B a release of the embedded server, every
test of the storage that runs no load step (the functional, conformance and behaviour
checks) runs twice: on side A under its own node id, on side B as ``[side-B...]``
(the fixtures' ``storage_side``: :class:`SideView`, with side B's doors, run
directory and the thresholds file of B's version, whose ``[known_issues]`` apply to
B). Their outcomes are the run's behaviour gate B / A (:func:`behaviour_gate`): a check
that passed on A and failed, errored or is a known issue on B fails the run until the
site's acceptance file (``--storage-accept``) lists it, by A's node id, as against a
stored baseline. Beside a URL as side B the checks run on side A only (a second
storage's doors beside its main one are not known).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from hdrh.histogram import HdrHistogram

from .errors import StorageScaleUsageError
from .gate import DEFAULT_PAIRED_BUDGET, GateSettings, StepGate, WindowSample, judge_pairs
from .load.engine import StepInterrupted, run_step
from .load.plan import StepPlan, StepProgress
from .load.stats import OpenLoopResult, SideResult, StepResult, latency_summary, new_histogram
from .records import BaselineComparison

if TYPE_CHECKING:
    from .session import StorageRun
    from .session.area import RunArea
    from .session.doors import Door
    from .session.endpoint import EndpointUnderTest

__all__ = ["BUDGET", "PAIRS", "SIDE_B_ID", "SideB", "SideView", "alone_because",
           "behaviour_gate", "check_compare_with", "checks_on_both_sides", "finish",
           "joined", "look_points", "measure_alternating", "measure_paired", "run_sample",
           "side_b", "side_run", "twins"]

#: the first round of runs per side (A B B A A B B A: ``PAIRS`` pairs, the fewest the
#: gate judges, :attr:`~.gate.GateSettings.min_samples`)
PAIRS = 4
#: an inconclusive step gets more pairs until each side measured this many times the
#: step's duration (the default of a section's ``paired_budget``,
#: :attr:`~.gate.GateSettings.paired_budget`)
BUDGET = DEFAULT_PAIRED_BUDGET
#: the shortest run of one side (a shorter step gets fewer, longer runs)
MIN_RUN_S = 0.5

_KEY = "_storagescale_side_b"
#: the id a check's side B variant carries (``test_x[side-B-root]``); side A's variant
#: keeps the check's own id
SIDE_B_ID = "side-B"


@dataclass
class SideB:
    """The second side: what ``--storage-compare-with`` named, its endpoint and this
    run's directory on it."""

    text: str
    endpoint: EndpointUnderTest
    area: RunArea
    #: door name -> why it cannot be written through (None: it can), checked once
    door_checks: dict[str, str | None] = field(default_factory=dict)
    #: system -> the thresholds file of side B's version (its known issues)
    thresholds: dict[str, Any] = field(default_factory=dict)

    @property
    def display(self) -> str:
        return self.endpoint.display

    def door(self, timeout: float, name: str | None = None) -> Door:
        """Side B's door ``name`` (its main door when None or side B's main door's
        name), guarded to this run's directory on B: a step over side A's root door is
        paired with side B's root door, not B's main one."""
        from .session.doors import open_door

        return open_door(
            self.endpoint, self.area.ensure(), self.area.run_id, name, timeout,
            self.door_checks, what=f"side B's {name} door",
            unknown=(f"--storage-compare-with {self.text}: side B has no {name} door (its "
                     f"doors: {', '.join(self.endpoint.resolved.door_urls)}), so a step "
                     f"over side A's {name} door has nothing to be paired with. Name side "
                     f"B's doors in --storage-load-doors."))


def _settings_b(run: StorageRun):
    settings = run.settings
    text = settings.compare_with
    assert text
    source = settings.source("storage_compare_with")
    settings = settings.with_value("version", None, "default")  # side A's, not B's
    if "://" in text:
        return settings.with_value("endpoint", text, source)
    if settings.endpoint:
        raise StorageScaleUsageError(
            f"--storage-compare-with {text}: a release names a second embedded server, but "
            f"side A is --storage-endpoint {run.endpoint.display}. Give side B as the URL "
            f"of the second storage's test area (e.g. root://host:1095//data/test), or run "
            f"side A on the embedded server (no --storage-endpoint).")
    return settings.with_value("embedded_version", text, source)


def check_compare_with(run: StorageRun) -> None:
    """A bad ``--storage-compare-with`` is one usage error before any load: a release
    the embedded server does not offer, a release beside a remote endpoint, a URL no
    driver takes or of another kind than side A."""
    settings = run.settings
    if not settings.compare_with:
        return
    text = settings.compare_with
    from .session.endpoint import EndpointUnderTest

    if "://" in text:
        a_scheme = (run.endpoint.protocol if run.endpoint.is_embedded
                    else urlsplit(settings.endpoint or "").scheme)
        b_scheme = urlsplit(text).scheme
        if a_scheme != b_scheme:
            raise StorageScaleUsageError(
                f"--storage-compare-with {text}: side B speaks {b_scheme}://, side A "
                f"{a_scheme}://. A paired comparison measures the same operations over the "
                f"same kind of door: give side B's {a_scheme}:// URL.")
    b = EndpointUnderTest(_settings_b(run))
    try:
        b.check()
    except StorageScaleUsageError as exc:
        raise StorageScaleUsageError(f"--storage-compare-with {text}: {exc}") from None
    from .session.endpoint import endpoint_door_names, split_client

    doors_b = endpoint_door_names(b)  # a load door DOOR+CLIENT needs B's door DOOR
    missing = [door for door in run.load_doors if split_client(door)[0] not in doors_b]
    if missing:
        raise StorageScaleUsageError(
            f"--storage-compare-with {text}: the load steps run over side A's "
            f"{', '.join(missing)} door{'s' * (len(missing) > 1)} (--storage-load-doors), "
            f"which side B lacks (its doors: {', '.join(doors_b)}). A paired step runs over "
            f"the same door on both sides: leave {', '.join(missing)} out of "
            f"--storage-load-doors.")
    if getattr(settings, "cluster", None):
        raise StorageScaleUsageError(
            f"--storage-compare-with {text} with --storage-cluster: the paired comparison "
            f"runs its clients here. Leave one of the two options out.")


def side_b(run: StorageRun) -> SideB | None:
    """The second side, made at its first use (its embedded server started, its run
    directory made); None without ``--storage-compare-with``."""
    if not run.settings.compare_with:
        return None
    side = run.__dict__.get(_KEY)
    if side is None:
        from .session.area import RunArea
        from .session.endpoint import EndpointUnderTest

        endpoint = EndpointUnderTest(_settings_b(run))
        area = RunArea(endpoint, run.run_id, run.shared_dir / "compare-with" / "run-dir-used",
                       run.ledger.lock, owner_pid=run.area.owner_pid, started=run.started)
        side = SideB(run.settings.compare_with, endpoint, area)
        run.__dict__[_KEY] = side  # finish() stops what was started, whatever happens
    try:  # once each (an unusable side B stays so: the same paragraph again)
        side.endpoint.first_contact()
        side.area.ensure()
    except StorageScaleUsageError as exc:  # EndpointError too: one paragraph, exit 4
        raise type(exc)(f"--storage-compare-with {side.text} (side B): {exc}") from None
    return side


def finish(run: StorageRun) -> None:
    """Remove side B's run directory and stop its embedded server (idempotent); what
    its storage refused to remove is added to the run's ``cleanup_error``."""
    side = run.__dict__.pop(_KEY, None)
    if side is None:
        return
    try:
        note = side.area.remove()
        if note:
            run.cleanup_error = "; ".join(filter(None, [run.cleanup_error,
                                                        f"side B: {note}"]))
    finally:
        side.endpoint.stop()


def look_points(first: int, budget: int) -> list[int]:
    """The counts of pairs after which the gate looks: ``first``, then every mirrored
    block of two more pairs up to ``budget`` (the last block may be one pair)."""
    points = [first]
    while points[-1] < budget:
        points.append(min(budget, points[-1] + 2))
    return points


def pairs_order(count: int) -> list[str]:
    """A B B A A B B A ...: ``count`` runs per side, each pair mirrored from the last."""
    order: list[str] = []
    for index in range(count):
        order.extend("AB" if index % 2 == 0 else "BA")
    return order


def _joined_side(parts: list[SideResult]) -> SideResult:
    histogram = new_histogram()
    for part in parts:
        if part.histogram:
            histogram.add(HdrHistogram.decode(part.histogram.encode("ascii")))
    windows: list[WindowSample] = []
    offset = 0.0
    for part in parts:
        windows.extend(replace(w, start_s=w.start_s + offset) for w in part.windows)
        offset += part.duration_s
    timeline: dict[str, list[int]] = {}
    for part in parts:
        for key, values in part.timeline.items():
            timeline.setdefault(key, []).extend(values)
    open_parts = [p.open_loop for p in parts if p.open_loop]
    return SideResult(
        clients=max(p.clients for p in parts),
        duration_s=sum(p.duration_s for p in parts),
        succeeded=sum(p.succeeded for p in parts), failed=sum(p.failed for p in parts),
        hung=sum(p.hung for p in parts), bytes=sum(p.bytes for p in parts),
        latency_s=latency_summary(histogram),
        errors=dict(sum((Counter(p.errors) for p in parts), Counter())),
        error_examples={k: v for p in parts for k, v in p.error_examples.items()},
        timeline=timeline, histogram=histogram.encode().decode("ascii"),
        throttled=sum(p.throttled for p in parts),
        redirects=sum(p.redirects for p in parts),
        door_seconds=sum(p.door_seconds for p in parts),
        warmup_operations=sum(p.warmup_operations for p in parts),
        drain_operations=sum(p.drain_operations for p in parts),
        open_loop=OpenLoopResult.merged(open_parts) if open_parts else None,
        windows=windows)


def joined(parts: list[StepResult]) -> StepResult:
    """Runs of one side one after the other as one result: counts added over the
    measured windows (the rate is the succeeded operations over the summed windows),
    latency histograms merged, per-window samples kept in order (their ``start_s``
    counted over the joined windows); the first run's start, the last one's end."""
    assert parts, "joined() takes at least one run"
    names = list(parts[0].sides)
    first, last = parts[0], parts[-1]
    cleanup = [p.cleanup_error for p in parts if p.cleanup_error]
    return StepResult(
        operation=first.operation, clients=first.clients, started=first.started,
        ended=last.ended, duration_s=sum(p.duration_s for p in parts),
        warmup_s=first.warmup_s,
        sides={name: _joined_side([p.sides[name] for p in parts if name in p.sides])
               for name in names},
        cleanup_error="; ".join(cleanup) or None,
        interrupted=any(p.interrupted for p in parts),
        lost=sum(p.lost for p in parts),
        # what the operation observed, added over the runs (a streaming step's bytes
        # and seconds per client: without them its client spread was NaN when paired)
        observed=dict(sum((Counter(p.observed) for p in parts), Counter())))


@dataclass
class PairedResult:
    """Both sides of a paired step: each side's joined result, the order the runs
    were made in, the gate B / A."""

    side_b: str
    a: StepResult
    b: StepResult
    order: list[str]
    gate: StepGate | None = None
    #: the runs of A and B made one right after the other, each run as one sample
    pairs: list[tuple[WindowSample, WindowSample]] = field(default_factory=list)

    def comparison(self, version_a: str) -> BaselineComparison:
        """Side A as the step's baseline (the table's ``vs base``: B's rate change
        against A's, then the gate's ratio B / A with its interval and verdict)."""
        a, b = self.a.total, self.b.total
        return BaselineComparison(
            file="side A (paired)", version=version_a, matched=True, rate_hz=a.rate_hz,
            rate_change=(b.rate_hz / a.rate_hz - 1) if a.rate_hz > 0 else None,
            p99_s=_finite(a.latency_s.get("p99")), failed=a.failed, hung=a.hung)

    def to_json(self) -> dict[str, Any]:
        def side(result: StepResult) -> dict[str, Any]:
            total = result.total
            return {"rate_hz": total.rate_hz, "succeeded": total.succeeded,
                    "failed": total.failed, "hung": total.hung,
                    "throttled": sum(s.throttled for s in result.sides.values()),
                    "errors": dict(sum((Counter(s.errors) for s in result.sides.values()),
                                       Counter())),
                    "error_examples": {k: v for s in result.sides.values()
                                       for k, v in s.error_examples.items()},
                    "duration_s": result.duration_s,
                    "p50_s": _finite(total.latency_s.get("p50")),
                    "p99_s": _finite(total.latency_s.get("p99")),
                    "windows": [w.to_json() for w in total.windows]}
        return {"side_b": self.side_b, "order": "".join(self.order),
                "a": side(self.a), "b": side(self.b),
                "pairs": [{"a": a.to_json(), "b": b.to_json()} for a, b in self.pairs]}


def _finite(value: float | None) -> float | None:
    return None if value is None or value != value else float(value)


def alone_because(plan: StepPlan) -> str | None:
    """Why a step is measured on side A alone (None: it is paired): its test handed it
    doors or a context (``storage_load.run(doors=..., context=...)``), which hold side
    A's clients and servers (the tape's controls of side A's dCache): side B's runs
    would measure side A through them."""
    if plan.step.doors or plan.step.extra:
        given = ", ".join([*(f"door {name}" for name in plan.step.doors), *plan.step.extra])
        return (f"not paired: the test hands the step side A's {given}, which side B's "
                f"runs would use too; measured on side A alone")
    return None


def measure_paired(run: StorageRun, plan: StepPlan, side: SideB, *, settings: GateSettings,
                   progress: Callable[[StepProgress], None] | None,
                   executor: str, door_timeout: float,
                   door: str | None = None) -> PairedResult:
    """Measure ``plan`` on side A (as planned, over its door ``door``) and on side B
    (the same plan over B's door of that name, in this run's directory there) in
    alternating runs, then judge B / A (see the module's docstring).
    :class:`~.load.engine.StepInterrupted` (Ctrl-C) carries the side being measured's
    partial result; the clients are stopped as ever."""
    door_b = side.door(door_timeout, door)
    step_name = plan.workdir.rstrip("/").rsplit("/", 1)[-1]

    def plan_b(sub: StepPlan, index: int) -> StepPlan:
        return replace(sub, driver=door_b.spec, workdir=door_b.path(f"{step_name}-b{index}"))

    return measure_alternating(plan, plan_b, door_b.display, settings=settings,
                               progress=progress, executor=executor)


def measure_alternating(plan: StepPlan, plan_b: Callable[[StepPlan, int], StepPlan],
                        side_b_name: str, *, settings: GateSettings,
                        progress: Callable[[StepProgress], None] | None = None,
                        executor: str = "auto") -> PairedResult:
    """``plan`` on side A and ``plan_b(plan's run, index)`` on side B in alternating
    runs (:func:`pairs_order`), judged B / A by :func:`~.gate.judge_pairs` after the
    first :data:`PAIRS` pairs and after each further mirrored block of two pairs while
    ``inconclusive``, until each side measured :data:`BUDGET` times the step's
    duration (the paired mode's measurement, apart from its doors: the calibration's
    harness calls it with two servers of its own)."""
    count = max(1, min(PAIRS, int(plan.duration // MIN_RUN_S)))
    run_s = plan.duration / count
    runs: dict[str, list[StepResult]] = {"A": [], "B": []}
    order: list[str] = []

    def one(which: str) -> None:
        index = len(runs[which])
        sub = replace(plan, duration=run_s, workdir=f"{plan.workdir}-a{index}")
        if which == "B":
            sub = plan_b(sub, index)
        try:
            runs[which].append(run_step(sub, executor=executor, progress=progress))
        except StepInterrupted as interrupted:
            runs[which].append(interrupted.result)
            raise StepInterrupted(joined(runs["B"] or runs["A"])) from None
        order.append(which)

    def judged() -> PairedResult:
        result = PairedResult(side_b_name, joined(runs["A"]), joined(runs["B"]), list(order),
                              pairs=list(zip(map(run_sample, runs["A"]),
                                             map(run_sample, runs["B"]), strict=False)))
        result.gate = _judge(result, settings)
        return result

    budget = settings.paired_budget
    budget_runs = max(count, int(budget * plan.duration / run_s + 1e-9))
    looks = look_points(count, budget_runs)
    for which in pairs_order(count):
        one(which)
    result = judged()
    began = time.monotonic()
    for target in looks[1:]:
        if (result.gate is None or result.gate.verdict.value != "inconclusive"
                or time.monotonic() - began >= budget * plan.duration * 4 + 60):
            break
        block = "BAAB" if (len(order) // 2) % 2 == 1 else "ABBA"
        for which in block[:2 * (target - len(runs["A"]))]:
            one(which)
        result = judged()
    if result.gate is not None and result.gate.verdict.value == "inconclusive":
        result.gate = replace(result.gate, reason=(
            f"{result.gate.reason} (after {len(runs['A'])} runs per side, "
            f"{result.a.duration_s:.3g} s of B and of A: the budget of {budget:g}x the "
            f"step's duration)"))
    return result


def run_sample(result: StepResult) -> WindowSample:
    """One run of one side as one sample: its succeeded operations over its measured
    window, its p50 and p99 (None without a succeeded operation)."""
    total = result.total
    return WindowSample(start_s=0.0, width_s=result.duration_s, operations=total.succeeded,
                        p50_s=_finite(total.latency_s.get("p50")) if total.succeeded else None,
                        p99_s=_finite(total.latency_s.get("p99")) if total.succeeded else None)


def _judge(result: PairedResult, settings: GateSettings) -> StepGate:
    gate = judge_pairs(result.pairs, settings=settings)
    return replace(gate, reason=f"B/A paired ({''.join(result.order)}): {gate.reason}")


# -- the checks on both sides ------------------------------------------------------------

def checks_on_both_sides(settings: Any) -> bool:
    """The checks run on side B too: side B is a release of the embedded server (the
    same kind, so the same doors), not a URL."""
    text = getattr(settings, "compare_with", None)
    return bool(text) and "://" not in str(text)


class SideView:
    """Side B as the checks' fixtures read the session's run: B's endpoint, run
    directory and thresholds file (of B's version: its ``[known_issues]`` are B's),
    the rest (settings, run id, ledger) the session's."""

    def __init__(self, run: StorageRun, side: SideB) -> None:
        self._run = run
        self.side = side
        self.endpoint = side.endpoint
        self.area = side.area

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    def thresholds(self, system: str):
        """The thresholds file for ``system`` at side B's version, at the plan scale."""
        from .thresholds import select_thresholds

        found = self.side.thresholds.get(system)
        if found is None:
            settings = self._run.settings
            found = select_thresholds(settings.thresholds_path(), system,
                                      self.endpoint.version).scaled(settings.scale)
            self.side.thresholds[system] = found
        return found


def side_run(run: StorageRun, side: str) -> Any:
    """The run as side ``side``'s checks see it: the run itself for ``A``, a
    :class:`SideView` of side B (started at its first use) for ``B``."""
    if side != "B":
        return run
    found = side_b(run)
    if found is None:  # parametrized only with --storage-compare-with
        raise StorageScaleUsageError("a check's side B without --storage-compare-with")
    return SideView(run, found)


def twins(items: list[Any], fixture: str = "storage_side") -> dict[str, str]:
    """Side B's node id -> its twin's on side A: the same test with the same
    parameters but the side."""
    by_test: dict[tuple[str, str, str], dict[str, str]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or fixture not in callspec.params:
            continue
        params = sorted((key, repr(value)) for key, value in callspec.params.items()
                        if key != fixture)
        parent = getattr(getattr(item, "parent", None), "nodeid", "")
        key = (parent, str(getattr(item, "originalname", item.name)), repr(params))
        by_test.setdefault(key, {})[
            "B" if callspec.params[fixture] == "B" else "A"] = item.nodeid
    return {sides["B"]: sides["A"] for sides in by_test.values()
            if "A" in sides and "B" in sides}


def step_changes(steps: list[Any]) -> list[Any]:
    """Paired steps whose side B met an error kind, or throttling (HTTP 429/503), its
    side A did not (each side's runs joined: :meth:`PairedResult.to_json`)."""
    from .reporting.behaviour import ERROR_PREFIX, NONE, THROTTLED, Change

    changes = []
    for step in steps:
        paired = getattr(step, "paired", None)
        if not isinstance(paired, dict) or "errors" not in paired.get("b", {}):
            continue
        a, b = paired.get("a", {}), paired["b"]
        examples = b.get("error_examples") or {}
        for kind in sorted(set(b["errors"]) - set(a.get("errors") or {}) - {THROTTLED}):
            changes.append(Change(step.test, NONE, f"{ERROR_PREFIX}{kind}", fails=True,
                                  cause=f"side B: {examples.get(kind, '')}".rstrip(": "),
                                  step=step.title))
        if b.get("throttled") and not a.get("throttled"):
            changes.append(Change(step.test, NONE, THROTTLED, fails=True,
                                  cause=f"side B: {b['throttled']} operations throttled, "
                                        f"side A none", step=step.title))
    return changes


def behaviour_gate(run: StorageRun, tests: dict[str, str], causes: dict[str, str],
                   pairs: dict[str, str], steps: list[Any] | None = None):
    """The checks' outcomes on side B against their twins' on side A (``pairs``: B's
    node id -> A's, :func:`twins`) and the paired steps' new error kinds and throttling
    on side B (:func:`step_changes`), judged by the site's acceptance file as against a
    stored baseline (:mod:`.reporting.behaviour`): each change is named by side A's
    node id, so an acceptance file written for a stored baseline serves. None when no
    check ran on both sides and no step was paired."""
    from .reporting.behaviour import Acceptance, BehaviourGate, outcome_changes

    both = {b: a for b, a in pairs.items() if a in tests and b in tests}
    paired_steps = [step for step in steps or [] if getattr(step, "paired", None)]
    if not both and not paired_steps:
        return None
    before = {a: tests[a] for a in both.values()}
    after = {a: tests[b] for b, a in both.items()}
    changes = outcome_changes(before, after, {a: causes.get(b, "") for b, a in both.items()})
    changes += step_changes(paired_steps)
    acceptance = run.settings.accept or Acceptance()
    side = run.__dict__.get(_KEY)
    version_b = side.endpoint.version if side is not None else run.settings.compare_with
    name = (f"side A, {run.endpoint.display} (version {run.endpoint.version}), paired with "
            f"side B (version {version_b})")
    return BehaviourGate(name, tuple(acceptance.judge(changes)), str(acceptance.path or ""))
