"""Run one load step: C clients repeat an operation back to back for a duration.

The step is closed-loop, like the seeds' batch jobs: every client starts its next
operation as soon as the last one ended. Timeline of a step (wall clock)::

    start_at ── warm-up ── measure_from ───── duration ───── end_at ── drain (<= hang_timeout)

Only operations that *complete* inside ``[measure_from, end_at]`` count: ``rate_hz =
succeeded / duration``. An operation still running ``hang_timeout`` after it started
marks its client **hung**; the client is abandoned (threads) or killed with its
process (processes), so a frozen server cannot stop a step from ending by
``end_at + hang_timeout``.
"""

from __future__ import annotations

import collections
import itertools
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import connection as mp_connection
from typing import Any

from ..drivers.base import Driver
from ..drivers.registry import driver_class
from ..endpoints.url import EndpointURL
from ..errors import StorageError, StorageNotFound
from .operations import OPERATIONS, Operation
from .stats import SideAccumulator, SideResult, StepResult

#: how often the coordinator looks for hung clients (seconds)
_HANG_CHECK_INTERVAL = 0.1
#: slack for a process to start, report and exit around its clients' deadline
_PROCESS_GRACE = 10.0
#: an operation's native timeout is this much longer than hang_timeout, so that a
#: stuck request is counted as a hang by the engine rather than as a client error
_NATIVE_TIMEOUT_MARGIN = 5.0


@dataclass(frozen=True)
class StepPlan:
    """Everything a step needs, as plain picklable data (spawned processes get a copy)."""

    op: str
    clients: int
    duration: float
    warmup: float
    hang_timeout: float
    endpoint_url: str
    driver: str
    workdir: str
    writable_root: str
    params: dict[str, Any] = field(default_factory=dict)
    #: distinguishes this step's client names (so its connections are its own)
    tag: str = "s00"
    driver_options: dict[str, Any] = field(default_factory=dict)
    #: processes for the ``processes`` executor (0: one per core, at least 2)
    processes: int = 0
    #: the step does this many operations, then ends (0: run for the duration)
    operations: int = 0


@dataclass(frozen=True)
class ClientAssignment:
    index: int
    side: str
    op_name: str  # the side's operation (a mixed step's sides are get and put)


@dataclass(frozen=True)
class _Clock:
    start_at: float
    measure_from: float
    end_at: float
    seconds: int


class _ClientSlot:
    """What the coordinator sees of one client thread.

    The client appends ``(finished, latency, bytes, error)`` to ``records``, a deque
    (thread-safe append/popleft without a lock); the coordinator drains every
    client's deque into the side's accumulator. Clients never contend on a lock,
    which at 1000 threads would convoy behind the GIL.
    """

    __slots__ = ("assignment", "busy_since", "hung", "done", "thread", "records")

    def __init__(self, assignment: ClientAssignment) -> None:
        self.assignment = assignment
        self.busy_since: float | None = None
        self.hung = False
        self.done = False
        self.thread: threading.Thread | None = None
        self.records: collections.deque = collections.deque()


def make_driver(plan: StepPlan, client_id: str, *, timeout: float | None = None) -> Driver:
    cls = driver_class(plan.driver)
    return cls(
        EndpointURL.parse(plan.endpoint_url),
        client_id=client_id,
        timeout=timeout if timeout is not None else plan.hang_timeout + _NATIVE_TIMEOUT_MARGIN,
        writable_root=plan.writable_root,
        options=plan.driver_options,
    )


def client_id(tag: str, index: int) -> str:
    """A client's login name: unique per step and client, at most 8 characters
    (the XRootD login request carries 8 bytes of user name)."""
    return f"{tag[:3]}{index:05d}"


def _side_context(plan: StepPlan, context: dict, side: str) -> dict:
    return context[side] if OPERATIONS[plan.op].sides else context


def _client_loop(
    slot: _ClientSlot, plan: StepPlan, context: dict, start_at: float, end_perf: float,
    stop: threading.Event, driver_factory: Callable[[int], Driver],
    tickets: Callable[[], int] | None, max_ops: int,
) -> None:
    assignment = slot.assignment
    operation = OPERATIONS[assignment.op_name]
    has_setup = type(operation).before is not Operation.before
    side_context = _side_context(plan, context, assignment.side)
    record = slot.records.append
    perf_counter = time.perf_counter
    index = assignment.index
    driver = None
    try:
        driver = driver_factory(index)
        delay = start_at - time.time()
        if delay > 0:
            stop.wait(delay)
        iteration = 0
        while not stop.is_set():
            if tickets is not None and tickets() >= max_ops:
                return  # a count-bounded step: every operation has been handed out
            # busy_since covers the untimed set-up too: a hang there is still a hang
            slot.busy_since = began = perf_counter()
            error: Exception | None = None
            moved = 0
            try:
                if has_setup:
                    operation.before(driver, index, iteration, side_context)
                    began = perf_counter()
                moved = operation.run(driver, index, iteration, side_context)
            except Exception as exc:  # noqa: BLE001 - every failure is a measurement
                error = exc
            finished = perf_counter()
            slot.busy_since = None
            if slot.hung or finished > end_perf:
                return  # hung (counted as such) or finished in the drain: not measured
            record((finished, finished - began, moved, error))
            iteration += 1
    except Exception as exc:  # noqa: BLE001 - a client that cannot even start failed
        record((perf_counter(), 0.0, 0, exc))
    finally:
        slot.done = True
        if driver is not None and not slot.hung:
            driver.close()


def run_clients(
    plan: StepPlan, context: dict, assignments: list[ClientAssignment], clock: _Clock,
    max_ops: int = 0, progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, SideAccumulator]:
    """Run ``assignments`` as threads in this process until the step's end; return
    one accumulator per side. Used directly (threads executor) and inside each
    spawned process (processes executor)."""
    sides = {a.side for a in assignments}
    accumulators = {side: SideAccumulator(clock.seconds) for side in sides}
    stop = threading.Event()
    slots = [_ClientSlot(a) for a in assignments]
    # the clients time with perf_counter; the step's clock is wall time
    perf_offset = time.time() - time.perf_counter()
    start_perf = clock.start_at - perf_offset
    measure_perf = clock.measure_from - perf_offset
    end_perf = clock.end_at - perf_offset

    def factory(index: int) -> Driver:
        return make_driver(plan, client_id(plan.tag, index))

    # a count bound hands out numbered operations; next() on a count is atomic
    tickets = itertools.count().__next__ if max_ops else None
    for slot in slots:
        slot.thread = threading.Thread(
            target=_client_loop,
            args=(slot, plan, context, clock.start_at, end_perf, stop, factory, tickets,
                  max_ops),
            name=f"storagescale-client-{slot.assignment.index}",
            daemon=True,  # a hung client must never keep the session alive
        )
        slot.thread.start()

    def collect() -> None:
        """Move every client's finished operations into its side's accumulator."""
        for slot in slots:
            records = slot.records
            if not records:
                continue
            accumulator = accumulators[slot.assignment.side]
            while records:
                finished, latency, moved, error = records.popleft()
                accumulator.record(int(finished - start_perf), latency, moved, error,
                                   counted=finished >= measure_perf)

    def check_hangs() -> None:
        now = time.perf_counter()
        for slot in slots:
            since = slot.busy_since
            if not slot.hung and since is not None and now - since > plan.hang_timeout:
                slot.hung = True
                accumulators[slot.assignment.side].hung += 1

    def sample(second: int) -> None:
        if not 0 <= second < clock.seconds:
            return
        for side, acc in accumulators.items():
            mine = [s for s in slots if s.assignment.side == side]
            acc.in_flight[second] = sum(1 for s in mine if s.busy_since is not None)
            acc.hung_series[second] = sum(1 for s in mine if s.hung)

    def tick(last_sample: int) -> int:
        check_hangs()
        collect()
        second = int(time.time() - clock.start_at)
        if second != last_sample and second >= 0:
            sample(second)
            if progress is not None:
                report_progress(second)
        return second

    def report_progress(second: int) -> None:
        last = second - 1 if second > 0 else 0
        progress({
            "op": plan.op, "clients": plan.clients, "elapsed_s": time.time() - clock.start_at,
            "total_s": clock.end_at - clock.start_at,
            "rate_hz": sum(a.completions[last] for a in accumulators.values()
                           if last < clock.seconds),
            "succeeded": sum(a.succeeded for a in accumulators.values()),
            "failed": sum(a.failed for a in accumulators.values()),
            "hung": sum(a.hung for a in accumulators.values()),
        })

    def enough() -> bool:
        return bool(max_ops) and all(slot.done for slot in slots)

    waiter = threading.Event()  # never set: its wait() is an interruptible pause
    last_sample = -1
    while time.time() < clock.end_at and not enough():
        last_sample = tick(last_sample)
        waiter.wait(min(_HANG_CHECK_INTERVAL, max(0.0, clock.end_at - time.time())))
    stop.set()
    stopped_at = min(time.time(), clock.end_at)
    for accumulator in accumulators.values():
        accumulator.measured_s = max(0.0, stopped_at - clock.measure_from)
    drain_until = stopped_at + plan.hang_timeout
    while time.time() < drain_until and not all(slot.done or slot.hung for slot in slots):
        last_sample = tick(last_sample)
        waiter.wait(_HANG_CHECK_INTERVAL / 2)
    check_hangs()
    collect()
    sample(min(int(time.time() - clock.start_at), clock.seconds - 1))
    for slot in slots:
        if not slot.done and not slot.hung:
            # still busy when the drain ended: it has been running for hang_timeout
            slot.hung = True
            accumulators[slot.assignment.side].hung += 1
    return accumulators


def _assignments(plan: StepPlan) -> list[ClientAssignment]:
    assignments = []
    index = 0
    for side, operation, count in OPERATIONS[plan.op].groups(plan.clients):
        for _ in range(count):
            assignments.append(ClientAssignment(index, side, operation.name))
            index += 1
    return assignments


def _clock(plan: StepPlan, start_at: float) -> _Clock:
    measure_from = start_at + plan.warmup
    end_at = measure_from + plan.duration
    seconds = math.ceil(plan.warmup + plan.duration + plan.hang_timeout) + 2
    return _Clock(start_at, measure_from, end_at, seconds)


def _run_threads(plan: StepPlan, context: dict, progress=None
                 ) -> tuple[_Clock, dict[str, SideAccumulator]]:
    assignments = _assignments(plan)
    # time to start the threads before the clock runs (about 0.1 ms each)
    clock = _clock(plan, time.time() + 0.2 + len(assignments) / 2000)
    return clock, run_clients(plan, context, assignments, clock, plan.operations, progress)


def _process_main(plan, context, assignments, max_ops, connection) -> None:
    """Entry point of a spawned client process."""
    try:
        driver_class(plan.driver)  # import the client library before the clock runs
        connection.send("ready")
        clock = connection.recv()
        accumulators = run_clients(plan, context, assignments, clock, max_ops,
                                   lambda state: connection.send(("progress", state)))
        connection.send(("result", {side: acc.to_wire() for side, acc in accumulators.items()}))
        connection.close()
    finally:
        os._exit(0)  # hung client threads must not keep the process alive


def _run_processes(plan: StepPlan, context: dict, progress=None
                   ) -> tuple[_Clock, dict[str, SideAccumulator]]:
    assignments = _assignments(plan)
    count = plan.processes or max(2, os.cpu_count() or 2)
    count = min(count, len(assignments))
    shares = [assignments[i::count] for i in range(count)]
    spawn = multiprocessing.get_context("spawn")  # the XRootD client breaks after fork
    children = []
    for share in shares:
        parent_end, child_end = spawn.Pipe()
        process = spawn.Process(
            # a count bound is split by the processes' shares of the clients
            target=_process_main,
            args=(plan, context, share,
                  math.ceil(plan.operations * len(share) / len(assignments)), child_end),
            daemon=True,
            name="storagescale-clients",
        )
        process.start()
        child_end.close()
        children.append((process, parent_end, share))
    try:
        for process, connection, _ in children:
            if not connection.poll(120) or connection.recv() != "ready":
                raise StorageError(
                    f"client process {process.pid} did not start within 120 s (the "
                    f"processes executor spawns {count} Python processes; try --storage-"
                    f"executor threads)", driver=plan.driver, endpoint=plan.endpoint_url,
                    operation=plan.op, path=plan.workdir, error_class="executor",
                )
        clock = _clock(plan, time.time() + 0.5)
        for _, connection, _ in children:
            connection.send(clock)
        sides = {a.side for a in assignments}
        accumulators = {side: SideAccumulator(clock.seconds) for side in sides}
        deadline = clock.end_at + plan.hang_timeout + _PROCESS_GRACE
        waiting = {connection: share for _, connection, share in children}
        latest: dict[Any, dict[str, Any]] = {}
        while waiting and time.time() < deadline:
            ready = mp_connection.wait(list(waiting), timeout=min(1.0, deadline - time.time()))
            for connection in ready:
                try:
                    kind, payload = connection.recv()
                except (EOFError, OSError):
                    continue  # died: its clients are counted hung below
                if kind == "result":
                    for side, part in payload.items():
                        accumulators[side].merge_wire(part)
                    del waiting[connection]
                    latest.pop(connection, None)
                else:
                    latest[connection] = payload
            if progress is not None and latest:
                progress({
                    "op": plan.op, "clients": plan.clients,
                    "elapsed_s": time.time() - clock.start_at,
                    "total_s": clock.end_at - clock.start_at,
                    **{key: sum(state[key] for state in latest.values())
                       for key in ("rate_hz", "succeeded", "failed", "hung")},
                })
        for share in waiting.values():
            # the whole process is stuck or died: every client in it is hung
            for assignment in share:
                accumulators[assignment.side].hung += 1
        return clock, accumulators
    finally:
        for process, connection, _ in children:
            process.join(timeout=1)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
            connection.close()


EXECUTORS = {"threads": _run_threads, "processes": _run_processes}


def run_step(
    plan: StepPlan, *, executor: str = "threads", keep_workdir: bool = False,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> StepResult:
    """Prepare, run and clean up one step; return what it measured."""
    operation = OPERATIONS[plan.op]
    coordinator = make_driver(plan, "sscoord", timeout=max(plan.hang_timeout, 30.0))
    try:
        params = {**operation.defaults, **plan.params}
        context = operation.prepare(coordinator, plan.workdir, params, plan.clients)
        try:
            clock, accumulators = EXECUTORS[executor](plan, context, progress)
        finally:
            operation.cleanup(context)
            if not keep_workdir:
                cleanup_error = cleanup_tree(coordinator, plan.workdir)
    finally:
        coordinator.close()
    duration = plan.duration
    if plan.operations:  # a count-bounded step measured until its count was reached
        duration = max(max(a.measured_s for a in accumulators.values()), 1e-6)
    sides = {
        side: SideResult.from_accumulator(accumulators[side], count, duration)
        for side, _, count in operation.groups(plan.clients)
    }
    return StepResult(
        op=plan.op, clients=plan.clients, started=clock.start_at, ended=time.time(),
        duration_s=duration, warmup_s=plan.warmup, sides=sides,
        cleanup_error=None if keep_workdir else cleanup_error,
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
