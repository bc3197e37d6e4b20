"""Run one load step: C clients repeat an operation back to back for a duration.

The step is closed-loop, like the seeds' batch jobs: every client starts its next
operation as soon as the last one ended. Timeline of a step (wall clock)::

    logins ── start_at ── warm-up ── measure_from ── duration ── end_at ── drain (<= hang_timeout)

Every client connects and logs in first (``Driver.connect``; at most ``hang_timeout``,
a login stuck longer is a hung client); the clock starts when all have, so C logins
at once (which a server's listen queue may drop) are not measured as the operation.

Only operations that *complete* inside ``[measure_from, end_at]`` count: ``rate_hz =
succeeded / duration``. An operation still running ``hang_timeout`` after it started
marks its client **hung**; the client is abandoned (threads) or killed with its
process (processes), so a frozen server cannot stop a step from ending by
``end_at + hang_timeout``. A count-bounded step (``max_operations``) ends as soon as
its operations are done, and is measured over the time they took.

Every other call to the storage has a deadline too (:mod:`.watch`): a probe before
the set-up (``hang_timeout``: after a step whose clients hung, a frozen storage makes
the next step an error within seconds instead of a wait), the set-up and the
clean-up (each request ``hang_timeout`` + the native-timeout margin, enforced even
when the client library ignores its timeout). Ctrl-C stops the clients within about
a second, cleans up, and raises :class:`StepInterrupted` with what was measured.

The pieces: :mod:`.plan` (the step as data), :mod:`.clients` (client threads and the
coordinator that watches them), :mod:`.executors` (threads, or spawned processes),
:mod:`.stats` (what is measured and how it merges), :mod:`.watch` (deadlines on the
engine's own requests). Here: probe, prepare, run, clean up.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable

from ..drivers.base import Driver
from ..drivers.registry import start_early_drivers
from ..errors import StorageError, StorageNotFound
from .clients import LoadInterrupted
from .executors import EXECUTORS, Accumulators, Executor
from .plan import StepClock, StepPlan, StepProgress
from .stats import ClientUsage, SideAccumulator, SideResult, StepResult
from .watch import DeadlineExceeded, RequestWatch, parallel_map, run_bounded

#: the watchdog waits this much longer than the native timeout, so that a library
#: that keeps its timeouts reports its own error first
WATCHDOG_MARGIN = 2.0
#: the failure classes after which the next step's clients log in afresh
LOST_CONNECTION_CLASSES = frozenset({"unreachable"})


class StepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a step: its clients were stopped and the step cleaned up;
    ``result`` holds what was measured until then."""

    def __init__(self, result: StepResult) -> None:
        super().__init__("step interrupted")
        self.result = result


def run_step(
    plan: StepPlan, *, executor: str | Executor = "threads", keep_workdir: bool = False,
    progress: Callable[[StepProgress], None] | None = None,
) -> StepResult:
    """Probe, prepare, run and clean up one step; return what it measured.

    After a step that left hung clients, lost its connections (``unreachable``
    failures: the storage restarted) or could not run, the driver forgets its
    connections, so that the next clients log in afresh, as a new client would."""
    if executor in ("threads", "auto") and getattr(plan.operation, "own_processes", False):
        executor = "processes"  # the operation changes process-wide client settings
    try:
        execute = executor if callable(executor) else EXECUTORS[executor]  # cluster
    except KeyError:
        raise ValueError(f"unknown executor {executor!r}; executors: "
                         f"{', '.join(EXECUTORS)}") from None
    try:
        result = _run(plan, execute, keep_workdir, progress)
    except BaseException:
        plan.driver.driver_class.forget_connections()
        raise
    if result.total.hung or LOST_CONNECTION_CLASSES & set(result.total.errors):
        plan.driver.driver_class.forget_connections()
    return result


def service_deadline(plan: StepPlan) -> float:
    """How long one set-up or clean-up request may take before it is abandoned."""
    return plan.client_timeout + WATCHDOG_MARGIN


def probe(watch: RequestWatch, plan: StepPlan, why: str) -> None:
    """One ``stat`` of the step's parent directory, answered within ``hang_timeout``
    (any answer, a refusal too); else :class:`DeadlineExceeded` saying ``why`` the
    probe was sent."""
    parent = posixpath.dirname(plan.workdir.rstrip("/")) or "/"

    def stat() -> None:
        try:
            watch.driver.stat(parent)
        except StorageError:
            pass  # an answer: the set-up reports a refusal with its own words

    try:
        run_bounded(stat, watch, plan.hang_timeout, "probe")
    except DeadlineExceeded as exc:
        exc.message = (f"the storage did not answer a probe (stat) within "
                       f"{plan.hang_timeout:g} s {why}; the step was not run")
        exc.args = (str(exc),)
        raise


def _run(plan: StepPlan, execute, keep_workdir: bool,
         progress: Callable[[StepProgress], None] | None) -> StepResult:
    operation = plan.operation
    # before this process holds a threads executor's thousands of descriptors (a
    # client process of the processes executor runs one step: it needs none of this)
    start_early_drivers()
    coordinator = plan.driver.connect("coordinator", timeout=plan.client_timeout)
    watch = RequestWatch(coordinator)
    try:
        probe(watch, plan, "before the step's set-up")
        params = {**operation.defaults, **plan.params}
        context = run_bounded(
            lambda: operation.prepare(coordinator, plan.workdir, params, plan.clients),
            watch, service_deadline(plan), "set-up")
        plan.driver.driver_class.before_load(plan.driver.options)  # e.g. a build, untimed
        interrupted: LoadInterrupted | None = None
        usage: ClientUsage | None = None
        try:
            clock, accumulators, *measured = execute(plan, context, progress)
            usage = measured[0] if measured else None
        except LoadInterrupted as exc:
            interrupted = exc
            clock, accumulators, usage = exc.clock, exc.accumulators, exc.usage
        finally:
            operation.cleanup(context)
        hung = interrupted is None and any(a.hung for a in accumulators.values())
        cleanup_error = None if keep_workdir else _clean(watch, plan, hung)
    finally:
        coordinator.close()
    result = _result(plan, clock, accumulators, cleanup_error, interrupted is not None)
    result.client = usage
    if interrupted is not None:
        raise StepInterrupted(result) from None
    return result


def _clean(watch: RequestWatch, plan: StepPlan, hung: bool) -> str | None:
    """Remove the step's directory, every request bounded; after a step whose clients
    hung, only when the storage answers a probe (else the session's clean-up at the
    end removes it)."""
    try:
        if hung:
            probe(watch, plan, "after the step's clients hung")
        return run_bounded(lambda: cleanup_tree(watch.driver, plan.workdir), watch,
                           service_deadline(plan), "clean-up")
    except DeadlineExceeded as exc:
        return f"{exc} (the run directory is removed at the end of the session)"


def _result(plan: StepPlan, clock: StepClock, accumulators: Accumulators,
            cleanup_error: str | None, interrupted: bool = False) -> StepResult:
    duration = plan.duration
    if plan.max_operations or interrupted:  # measured until the count, or until Ctrl-C
        duration = max(max((a.measured_s for a in accumulators.values()), default=0), 1e-6)
    sides = {
        side: SideResult.from_accumulator(
            accumulators.get(side) or SideAccumulator(clock.seconds), count, duration)
        for side, _, count in plan.operation.groups(plan.clients)
    }
    return StepResult(
        operation=plan.operation.name, clients=plan.clients, started=clock.start_at,
        ended=time.time(), duration_s=duration, warmup_s=plan.warmup, sides=sides,
        cleanup_error=cleanup_error, interrupted=interrupted,
    )


def cleanup_tree(driver: Driver, path: str, *, parallel: int = 16,
                 not_before: float | None = None) -> str | None:
    """Remove a step's directory; the driver's guard keeps this inside the test area.

    The entries are removed by ``parallel`` requests in flight (a put scan leaves
    tens of thousands of files), in daemon threads: a request the library never
    ends cannot hold up the exit. Returns the error text when the storage refused,
    reported with the step. No file older than ``not_before`` (by default the run's
    start, :meth:`~pytest_storagescale.drivers.base.Driver.run_started`) is deleted."""
    try:
        if not_before is None:  # asked before the walk deletes the owner file
            not_before = driver.run_started()
        entries = [f"{path.rstrip('/')}/{name}" for name in driver.ls(path)]
        parallel_map(lambda entry: driver.remove_tree(entry, not_before=not_before),
                     entries, parallel, "cleanup")
        driver.remove_tree(path, not_before=not_before)
    except StorageNotFound:
        return None
    except StorageError as exc:
        return str(exc)
    return None
