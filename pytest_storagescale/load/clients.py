"""The clients of a step inside one process: one thread per client, and the
coordinator that watches them.

Each client thread runs :func:`run_client`: its own driver, its login
(``Driver.connect``), then, from the step's start, the operation back to back
(closed loop). The step's clock is set once every client has logged in (or
``hang_timeout`` passed), so that C logins at once, which a server's listen queue
may not take, are not measured as the operation's rate. It appends
``(finished, latency, bytes, error)`` to its slot's deque (thread-safe
append/popleft without a lock); the coordinator (:func:`run_clients`, in the
calling thread) drains every deque into its side's
:class:`~pytest_storagescale.load.stats.SideAccumulator`, marks clients hung, and
samples the timeline once a second. Clients never contend on a lock, which at
1000 threads would convoy behind the GIL.
"""

from __future__ import annotations

import math
import random
import resource
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..drivers.base import CompiledOutcome
from ..errors import StorageError
from .open_loop import Dispatcher, record_open
from .plan import ClientAssignment, StepClock, StepPlan, StepProgress
from .slot import ClientSlot, Dispatching, StepRun, send
from .stats import ClientUsage, CpuMeter, SideAccumulator

if TYPE_CHECKING:
    from ..drivers.base import BackgroundLoop, CompiledLoop, Driver
    from .operations import Operation

#: how often the coordinator looks for hung clients and whether the clients are done
#: (seconds) in a count-bounded step; the drains after the stop and after Ctrl-C look
#: twice as often
HANG_CHECK_INTERVAL = 0.1
#: how often it ticks while a time-bounded step runs (hang checks, draining the
#: clients' records, the per-second sample): each tick looks at every client of the
#: process, and at 5,000 clients (25 processes of 200) ten ticks a second cost about a
#: fifth of a core (stat 21.5-23.5k/s at 39-44 us of client CPU each, against
#: 23.1-25.2k at 33-35 us with 0.5 s; the async C++ loop 31-32 us; split cores)
MEASURE_TICK = 0.5
#: how often the login phase looks whether every client has logged in (seconds)
LOGIN_CHECK_INTERVAL = 0.02
#: after Ctrl-C, how long requests in flight may take to finish (seconds)
INTERRUPT_DRAIN = 0.5
#: a driver's compiled loop (Driver.compiled_loop) is called for at most this many
#: requests, begun within this share of hang_timeout (and at most 50 ms): between
#: calls the client sees the stop, and a call longer than hang_timeout is a hang
COMPILED_BATCH = 256
COMPILED_SPAN = 0.05
COMPILED_SPAN_SHARE = 0.05
#: how long a background client's thread waits at a time for its loop to end, at
#: random up to twice that. The loop's end wakes it (after the stop's halt, the end of
#: the request in flight; a give-up; a refused request), so this is a safety net only:
#: with 5 s, the 5,000 threads of a 5,000-client step woke together and convoyed on
#: each process's GIL (82-95k context switches in that second, against 2k; stat
#: 16.3-20.3k/s against 21.9-22.4k without, 3 rounds each, split cores)
BACKGROUND_WAIT = 60.0
#: a background loop stopped at a request the library refused to send begins again
#: after this pause
REFUSAL_PAUSE = 1.0


class LoadInterrupted(KeyboardInterrupt):
    """Ctrl-C during the load: the clients were stopped; what they measured so far."""

    def __init__(self, accumulators: dict[str, SideAccumulator]) -> None:
        super().__init__("interrupted")
        self.accumulators = accumulators
        #: the step's clock (set where the clients ran)
        self.clock: StepClock | None = None
        #: what the clients cost their host until stopped (set by the executor)
        self.usage: ClientUsage | None = None

Progress = Callable[[StepProgress], None]
#: called once every client has logged in: the step's clock (the threads executor's
#: now, a client process's from its parent, a cluster host's from the coordinator)
Start = Callable[[], StepClock]


def run_client(slot: ClientSlot, run: StepRun) -> None:
    """One client thread: its own driver, its login, the start, the operation back to
    back."""
    driver = loop = None
    try:
        # not timed for hangs: making a thousand drivers at once takes a while
        driver = run.plan.driver.client(slot.assignment.index, timeout=run.plan.client_timeout)
        driver.halted = run.stop  # a throttled request is not sent again once it stopped
        # the compiled loop makes the closed loop only: open-loop requests are Python calls
        loop = slot.loop = None if run.dispatcher else _compiled_loop(slot, driver, run)
        _log_in(slot, driver)
        run.wait_for_start()
        if slot.hung:  # a login that came back after hang_timeout: given up already
            pass
        elif run.dispatcher is not None:
            run.dispatcher.serve(slot, driver)
        elif loop is not None and not run.bounded and getattr(loop, "background", False):
            _run_background(slot, cast("BackgroundLoop", loop), run)
        elif loop is not None:
            _repeat_compiled(slot, loop, run)
        else:
            _repeat(slot, driver, run)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a client that cannot even start failed
        slot.ready = True
        run.wait_for_start()
        # counted even before the measurement began: the client never measured anything
        slot.records.append((max(time.perf_counter(), run.measure_perf), 0.0, 0, exc))
    finally:
        if driver is not None and not slot.hung:  # before done: collected with it
            slot.counters = driver.counters()
        slot.done = True
        if loop is not None and (slot.background or not slot.hung):
            loop.close()  # a background request given up is halted, freed when it ends
        if driver is not None and not slot.hung:
            driver.close()


def _log_in(slot: ClientSlot, driver: Driver) -> None:
    """Connect before the clock, timed for hangs (a login stuck for hang_timeout makes
    the client hung). A refused or failed login is not measured here: the client's
    first request connects again, and its outcome is measured."""
    slot.busy_since = time.perf_counter()
    try:
        driver.connect()
    except Exception:  # noqa: BLE001, S110 - measured by the first request instead
        pass
    finally:
        slot.busy_since = None
        slot.ready = True


def _repeat(slot: ClientSlot, driver: Driver, run: StepRun) -> None:
    """The closed loop: the next request starts as soon as the last one ended."""
    assignment = slot.assignment
    operation, index = assignment.operation, assignment.index
    context = run.plan.side_context(run.context, assignment.side)
    record = slot.records.append
    perf_counter = time.perf_counter
    stop, take, end_perf = run.stop, run.take, run.end_perf
    iteration = 0
    # no request begins after the window's end: the storage carries no load the step
    # does not count (the coordinator's stop comes up to a tick later)
    while not stop.is_set() and perf_counter() < end_perf and take():
        began, finished, moved, error = send(slot, driver, operation, index, iteration,
                                             context)
        if slot.hung:
            return  # counted as such
        record((finished, finished - began, moved, error))  # in the drain: counted as such
        iteration += 1


def _compiled_loop(slot: ClientSlot, driver: Driver, run: StepRun) -> CompiledLoop | None:
    """The driver's compiled loop for this client's requests, when the operation says
    what they are (:meth:`~.operations.Operation.walk`) and nothing of its own runs
    around them (``run`` and ``before`` are those of the class that says it)."""
    operation = slot.assignment.operation
    if not _walk_is_whole(operation):
        return None
    context = run.plan.side_context(run.context, slot.assignment.side)
    walk = operation.walk(slot.assignment.index, context)
    return driver.compiled_loop(walk) if walk is not None else None


def _walk_is_whole(operation: Operation) -> bool:
    from .operations import Operation

    def owner(name: str) -> type:
        return next(k for k in type(operation).__mro__ if name in vars(k))

    walk = owner("walk")
    return owner("run") is walk and owner("before") in (walk, Operation)


def _repeat_compiled(slot: ClientSlot, loop: CompiledLoop, run: StepRun) -> None:
    """The closed loop, made by the driver's compiled loop: calls of at most
    :data:`COMPILED_BATCH` requests, each timed for hangs as one request is."""
    extend = slot.records.extend
    perf_counter = time.perf_counter
    stop, take, end_perf = run.stop, run.take, run.end_perf
    count = 1 if run.bounded else COMPILED_BATCH  # a count bound: one at a time
    span = min(COMPILED_SPAN, run.plan.hang_timeout * COMPILED_SPAN_SHARE)
    iteration = 0
    while not stop.is_set() and take():
        slot.busy_since = began = perf_counter()
        if began >= end_perf:  # no request begins after the window's end
            slot.busy_since = None
            return
        try:
            outcomes = loop.run(iteration, count, min(began + span, end_perf))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure is a measurement
            finished = perf_counter()
            outcomes = [CompiledOutcome(finished, finished - began, 0, exc)]
        slot.busy_since = None
        if slot.hung:  # the last request was in flight when the call became a hang
            outcomes = outcomes[:-1]
        extend(outcomes)  # one call: the deque takes them at once (the drain's: counted so)
        if not outcomes or outcomes[-1][0] > end_perf:
            return  # the last finished in the drain
        if slot.hung:
            return  # counted as such
        iteration += len(outcomes)


def _run_background(slot: ClientSlot, loop: BackgroundLoop, run: StepRun) -> None:
    """The closed loop, made by the driver's loop on its own (the library's threads
    issue each request when the last one ended): this thread starts it and, after the
    stop, waits for its last request; the coordinator drains and watches it."""
    slot.background = True
    wait = BACKGROUND_WAIT * random.uniform(1.0, 2.0)  # never all threads at once
    # the loop begins no request after the window's end
    while not run.stop.is_set() and time.perf_counter() < run.end_perf \
            and loop.start(run.end_perf):
        # until it ends: halted at the stop and its last request done, given up as hung,
        # or stopped at a request the library refused to send (then begun again after
        # a pause: never a busy loop); no thread wakes per request
        while not loop.wait_idle(wait) and not slot.hung:
            pass
        if slot.hung or run.stop.wait(REFUSAL_PAUSE):
            break
    slot.records.extend(loop.take())  # what the coordinator has not taken


class ClientGroup:
    """The client slots of a step in this process, and one accumulator per side."""

    def __init__(self, assignments: list[ClientAssignment], run: StepRun) -> None:
        self.run = run
        self.slots = [ClientSlot(assignment) for assignment in assignments]
        self.accumulators = {
            a.side: SideAccumulator.for_clock(run.clock) for a in assignments
        }
        if run.plan.open_loop:  # this process's share of the schedule: its clients'
            run.dispatcher = Dispatcher(run, [a.index for a in assignments],
                                        len(run.plan.assignments()))

    def start(self) -> None:
        if self.run.dispatcher is not None:
            self.run.dispatcher.start()
        for slot in self.slots:
            threading.Thread(
                target=run_client, args=(slot, self.run),
                name=f"storagescale-client-{slot.assignment.index}",
                daemon=True,  # a hung client must never keep the session alive
            ).start()
            slot.started = True

    def _collect_counters(self) -> None:
        """Add the driver counts of the clients that ended to their sides'."""
        for slot in self.slots:
            if slot.done and slot.counters:
                self.accumulators[slot.assignment.side].add_counters(slot.counters)
                slot.counters = None

    def collect(self) -> None:
        """Move every client's finished operations into its side's accumulator."""
        self._collect_counters()
        if self.run.dispatcher is not None:
            return self._collect_open(self.run.dispatcher)
        for slot in self.slots:
            if slot.background:
                self._record(self.accumulators[slot.assignment.side],
                             slot.loop.take())  # type: ignore[union-attr,attr-defined]
            records = slot.records
            if not records:
                continue
            # those there now: a client appending faster never holds the coordinator
            self._record(self.accumulators[slot.assignment.side],
                         [records.popleft() for _ in range(len(records))])

    def _collect_open(self, dispatcher: Dispatching) -> None:
        run = self.run
        for slot in self.slots:
            records, accumulator = slot.records, self.accumulators[slot.assignment.side]
            record_open(accumulator, [records.popleft() for _ in range(len(records))],
                        run.start_perf, run.measure_perf, run.end_perf)
        for accumulator in self.accumulators.values():  # one side
            dispatcher.collect(accumulator)

    def _record(self, accumulator: SideAccumulator, outcomes) -> None:
        """Finished operations into ``accumulator``: those of the drain (finished after
        the window's end) only counted as such."""
        start_perf, measure_perf = self.run.start_perf, self.run.measure_perf
        end_perf = self.run.end_perf
        for finished, latency, moved, error in outcomes:
            if finished > end_perf:
                accumulator.drain_operations += 1
                continue
            accumulator.record(finished - start_perf, latency, moved, error,
                               counted=finished >= measure_perf)

    def check_hangs(self) -> None:
        """A client busy for longer than hang_timeout is hung (once)."""
        limit = time.perf_counter() - self.run.plan.hang_timeout
        for slot in self.slots:
            if slot.hung:
                continue
            since = slot.in_flight_since()
            if since is not None and since < limit and (
                    not slot.background or slot.loop.abandon(since)):  # type: ignore[attr-defined]
                self._mark_hung(slot)

    def _mark_hung(self, slot: ClientSlot) -> None:
        slot.hung = True
        self.accumulators[slot.assignment.side].hung += 1

    def sample(self, second: int) -> None:
        """Operations in flight and hung clients, per side, at ``second``."""
        if not 0 <= second < self.run.clock.seconds:
            return
        for side, accumulator in self.accumulators.items():
            mine = [slot for slot in self.slots if slot.assignment.side == side]
            accumulator.in_flight[second] = sum(slot.in_flight_since() is not None
                                                for slot in mine)
            accumulator.hung_series[second] = sum(slot.hung for slot in mine)

    def progress(self, second: int) -> StepProgress:
        clock, accumulators = self.run.clock, self.accumulators.values()
        last = max(second - 1, 0)
        return StepProgress(
            operation=self.run.plan.operation.name, clients=self.run.plan.clients,
            elapsed_s=time.time() - clock.start_at, total_s=clock.end_at - clock.start_at,
            rate_hz=sum(a.completions[last] for a in accumulators if last < clock.seconds),
            succeeded=sum(a.succeeded for a in accumulators),
            failed=sum(a.failed for a in accumulators),
            hung=sum(a.hung for a in accumulators),
        )

    def all_ready(self) -> bool:
        """Every client logged in (or failed to, or ended)."""
        return all(slot.ready or slot.done for slot in self.slots)

    def all_done(self) -> bool:
        return all(slot.done for slot in self.slots)

    def all_settled(self) -> bool:
        """Every client ended or was given up as hung."""
        return all(slot.done or slot.hung for slot in self.slots)

    def halt(self) -> None:
        """The stop, to compiled loops too: they begin no further request (the Python
        loop looks at ``run.stop`` before each)."""
        for slot in self.slots:
            if slot.loop is not None:
                slot.loop.halt()

    def give_up(self) -> None:
        """After the drain: a client still busy has been running for hang_timeout."""
        for slot in self.slots:
            if not slot.done and not slot.hung:
                since = slot.in_flight_since() if slot.background else None
                if since is not None:  # given up: its thread wakes, its answer is not measured
                    slot.loop.abandon(since)  # type: ignore[attr-defined]
                self._mark_hung(slot)

    def set_measured(self, seconds: float) -> None:
        for accumulator in self.accumulators.values():
            accumulator.measured_s = max(0.0, seconds)


class Coordinator:
    """Ticks while the clients run: hang checks, draining, the per-second sample and
    progress report."""

    def __init__(self, group: ClientGroup, progress: Progress | None,
                 meter: CpuMeter | None = None) -> None:
        self.group = group
        self.progress = progress
        self.meter = meter
        self.last_second = -1
        # never set: its wait() is an interruptible pause
        self._pause = threading.Event()

    def tick(self) -> None:
        if self.meter is not None:
            self.meter.mark()
        group = self.group
        group.check_hangs()
        group.collect()
        second = math.floor(time.time() - group.run.clock.start_at)
        if second != self.last_second and second >= 0:
            self.last_second = second
            group.sample(second)
            if self.progress is not None:
                self.progress(group.progress(second))

    def run_until(self, deadline: float, finished: Callable[[], bool],
                  interval: float) -> None:
        """Tick every ``interval`` until ``deadline`` (wall time) or ``finished()``."""
        while time.time() < deadline and not finished():
            self.tick()
            self._pause.wait(min(interval, max(0.0, deadline - time.time())))


def run_clients(
    plan: StepPlan, context: dict[str, Any], assignments: list[ClientAssignment],
    start: Start, max_operations: int = 0, progress: Progress | None = None,
    meter: CpuMeter | None = None,
) -> tuple[StepClock, dict[str, SideAccumulator]]:
    """Run ``assignments`` as threads in this process until the step's end; return
    the step's clock and one accumulator per side. Used directly (threads executor),
    inside each spawned process (processes executor) and on each cluster host.
    ``start`` gives the clock once every client has logged in (at most ``hang_timeout``
    later). ``meter`` measures this process's CPU over the measured
    window."""
    plan.driver.driver_class.before_load(plan.driver.options)
    run = StepRun(plan, context, max_operations)
    group = ClientGroup(assignments, run)
    meter = meter or CpuMeter(len(assignments))
    coordinator = Coordinator(group, progress, meter)
    try:
        group.start()
    except RuntimeError as exc:  # "can't start new thread": ulimit -u, or memory
        run.stop.set()  # the clients started so far end at once
        group.halt()
        run.set_clock(plan.clock(time.time()))
        started = sum(slot.started for slot in group.slots)
        raise _no_threads(plan, started, len(group.slots), exc) from None
    try:
        _wait_for_logins(run, group)
        try:
            run.set_clock(start())
        except BaseException:  # no start (called off, or a bug): release the clients
            run.stop.set()
            group.halt()
            run.set_clock(plan.clock(time.time()))
            raise
        _measure_and_drain(run, group, coordinator, bool(max_operations), meter)
    except KeyboardInterrupt:
        meter.stop()
        _stop_interrupted(run, group, coordinator)
    finally:  # the meter's usage, measured or interrupted, says which loop served them
        meter.count_compiled(sum(slot.loop is not None for slot in group.slots))
    group.check_hangs()
    group.collect()
    group.sample(min(int(time.time() - run.clock.start_at), run.clock.seconds - 1))
    group.give_up()
    return run.clock, group.accumulators


def _no_threads(plan: StepPlan, started: int, clients: int, exc: BaseException
                ) -> StorageError:
    """The step's error when this process could not start a client's thread."""
    return StorageError(
        f"could not start the thread of client {started + 1} of this process's "
        f"{clients} ({exc}): the user's thread limit (ulimit -u, which counts every "
        f"thread of the user; soft {_nproc()}) or the memory is exhausted. The step "
        f"was not run; raise 'ulimit -u' before pytest (or nproc in "
        f"/etc/security/limits.conf), or lower the clients",
        driver=plan.driver.name, endpoint=plan.driver.endpoint.server,
        operation=plan.operation.name, path=plan.workdir, error_class="client_threads")


def _nproc() -> str:
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


def _wait_for_logins(run: StepRun, group: ClientGroup) -> None:
    """Until every client has logged in, or for hang_timeout: a client still logging
    in then is counted hung once the clock runs."""
    deadline = time.time() + run.plan.hang_timeout
    while not group.all_ready() and time.time() < deadline:
        run.stop.wait(LOGIN_CHECK_INTERVAL)  # never set here: an interruptible pause


def _measure_and_drain(run: StepRun, group: ClientGroup, coordinator: Coordinator,
                       bounded: bool, meter: CpuMeter) -> None:
    clock = run.clock

    def finished() -> bool:  # a count-bounded step handed out its count
        return bounded and group.all_done()

    # the warm-up, then the measurement (this process's CPU metered) until the end
    tick = HANG_CHECK_INTERVAL if bounded else MEASURE_TICK
    coordinator.run_until(clock.measure_from, finished, tick)
    meter.start()
    coordinator.run_until(clock.end_at, finished, tick)
    meter.stop()
    run.stop.set()
    group.halt()
    stopped_at = min(time.time(), clock.end_at)
    group.set_measured(stopped_at - clock.measure_from)
    # the drain: requests in flight may finish (unmeasured) or hang, for hang_timeout
    coordinator.run_until(stopped_at + run.plan.hang_timeout, group.all_settled,
                          HANG_CHECK_INTERVAL / 2)


def _stop_interrupted(run: StepRun, group: ClientGroup, coordinator: Coordinator) -> None:
    """Ctrl-C: stop the clients now, keep what they measured, raise
    :class:`LoadInterrupted`. Clients still busy after a short drain are abandoned
    (daemon threads), not counted hung: the user ended the step, not the storage."""
    run.stop.set()
    group.halt()
    if not run.clock_set.is_set():  # stopped while logging in: nothing measured
        run.set_clock(run.plan.clock(time.time()))
    stopped_at = min(time.time(), run.clock.end_at)
    group.set_measured(stopped_at - run.clock.measure_from)
    try:
        coordinator.run_until(time.time() + INTERRUPT_DRAIN, group.all_settled,
                              HANG_CHECK_INTERVAL / 2)
    except KeyboardInterrupt:
        pass  # a second Ctrl-C: keep what is measured all the same
    group.collect()
    interrupted = LoadInterrupted(group.accumulators)
    interrupted.clock = run.clock
    raise interrupted
