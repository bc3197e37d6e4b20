"""Run one load step: C clients repeat an operation back to back for a duration.

The step is closed-loop, like the seeds' batch jobs: every client starts its next
operation as soon as the last one ended. Timeline of a step (wall clock)::

    start_at ── warm-up ── measure_from ───── duration ───── end_at ── drain (<= hang_timeout)

Only operations that *complete* inside ``[measure_from, end_at]`` count: ``rate_hz =
succeeded / duration``. An operation still running ``hang_timeout`` after it started
marks its client **hung**; the client is abandoned (threads) or killed with its
process (processes), so a frozen server cannot stop a step from ending by
``end_at + hang_timeout``. A count-bounded step (``max_operations``) ends as soon as
its operations are done, and is measured over the time they took.

The pieces: :mod:`.plan` (the step as data), :mod:`.clients` (client threads and the
coordinator that watches them), :mod:`.executors` (threads, or spawned processes),
:mod:`.stats` (what is measured and how it merges). Here: prepare, run, clean up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..drivers.base import Driver
from ..errors import StorageError, StorageNotFound
from .executors import EXECUTORS, Accumulators
from .plan import StepClock, StepPlan, StepProgress
from .stats import SideAccumulator, SideResult, StepResult

#: the coordinator's driver (prepare and clean-up) waits at least this long
_COORDINATOR_TIMEOUT = 30.0


def run_step(
    plan: StepPlan, *, executor: str = "threads", keep_workdir: bool = False,
    progress: Callable[[StepProgress], None] | None = None,
) -> StepResult:
    """Prepare, run and clean up one step; return what it measured.

    After a step that left hung clients (or could not run), the driver forgets its
    connections, so that no later client reuses one a stuck request holds."""
    try:
        execute = EXECUTORS[executor]
    except KeyError:
        raise ValueError(f"unknown executor {executor!r}; executors: "
                         f"{', '.join(EXECUTORS)}") from None
    try:
        result = _run(plan, execute, keep_workdir, progress)
    except BaseException:
        plan.driver.driver_class.forget_connections()
        raise
    if result.total.hung:
        plan.driver.driver_class.forget_connections()
    return result


def _run(plan: StepPlan, execute, keep_workdir: bool,
         progress: Callable[[StepProgress], None] | None) -> StepResult:
    operation = plan.operation
    coordinator = plan.driver.connect(
        "coordinator", timeout=max(plan.hang_timeout, _COORDINATOR_TIMEOUT))
    cleanup_error = None
    try:
        params = {**operation.defaults, **plan.params}
        context = operation.prepare(coordinator, plan.workdir, params, plan.clients)
        try:
            clock, accumulators = execute(plan, context, progress)
        finally:
            operation.cleanup(context)
            if not keep_workdir:
                cleanup_error = cleanup_tree(coordinator, plan.workdir)
    finally:
        coordinator.close()
    return _result(plan, clock, accumulators, cleanup_error)


def _result(plan: StepPlan, clock: StepClock, accumulators: Accumulators,
            cleanup_error: str | None) -> StepResult:
    duration = plan.duration
    if plan.max_operations:  # a count-bounded step measured until its count was reached
        duration = max(max(a.measured_s for a in accumulators.values()), 1e-6)
    sides = {
        side: SideResult.from_accumulator(
            accumulators.get(side) or SideAccumulator(clock.seconds), count, duration)
        for side, _, count in plan.operation.groups(plan.clients)
    }
    return StepResult(
        operation=plan.operation.name, clients=plan.clients, started=clock.start_at,
        ended=time.time(), duration_s=duration, warmup_s=plan.warmup, sides=sides,
        cleanup_error=cleanup_error,
    )


def cleanup_tree(driver: Driver, path: str, *, parallel: int = 16) -> str | None:
    """Remove a step's directory; the driver's guard keeps this inside the test area.

    The entries are removed by ``parallel`` requests in flight (a put scan leaves
    tens of thousands of files). Returns the error text when the storage refused,
    reported with the step."""
    try:
        entries = [f"{path.rstrip('/')}/{name}" for name in driver.ls(path)]
        with ThreadPoolExecutor(parallel, thread_name_prefix="storagescale-cleanup") as pool:
            list(pool.map(driver.remove_tree, entries))
        driver.remove_tree(path)
    except StorageNotFound:
        return None
    except StorageError as exc:
        return str(exc)
    return None
