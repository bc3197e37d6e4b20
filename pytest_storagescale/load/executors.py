"""Where a step's clients run: ``threads`` (all in this process), ``processes``
(spread over spawned Python processes), or ``auto`` (threads while the clients fit
in one process, else processes). Under ``auto``, the clients of a driver whose client
library may crash its process (``isolate_clients``: xrootd, gfal2) always run in
spawned processes, one while they fit: a crash there (a segfault on a garbled
answer) is :class:`ClientsCrashed`, an error of that step, not the end of pytest.

How many clients one process may hold is the driver's ``clients_per_process`` (or
the plan's): the XRootD client's timeout bookkeeping grows with the connections of
one process, so beyond a few hundred connections a process measures itself, not
the storage. The processes executor shards C clients over ceil(C / per process)
processes (at least one per core); every client keeps its own connection.

An executor takes the plan, the prepared context and an optional progress
callback, and returns the step's clock, one merged accumulator per side and what
the clients cost their host (:class:`~.stats.ClientUsage`). ``config.py`` reads the
names of :data:`EXECUTORS`, so this module imports only what the executors need.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import connection as mp_connection
from typing import Any

from ..errors import StorageError, exit_text
from .clients import INTERRUPT_DRAIN, MEASURE_TICK, LoadInterrupted, Progress, run_clients
from .plan import ClientAssignment, StepClock, StepPlan, StepProgress
from .stats import ClientUsage, CpuMeter, SideAccumulator, usable_cores

#: slack for a process to start, report and exit around its clients' deadline
_PROCESS_GRACE = 10.0
#: how long a spawned process may take to import the client library and say so (its
#: clients' logins, up to hang_timeout, come on top)
_START_TIMEOUT = 120.0
#: from the last login to the start of the threads executor's step (seconds)
_START_LEAD = 0.05
#: after Ctrl-C, how long the processes may take to send what they measured: their
#: clients get INTERRUPT_DRAIN to finish the requests in flight, and a process sees the
#: signal at its coordinator's next tick (MEASURE_TICK) when another of its threads took
#: it; 1 s lost the whole report of a step against a remote server (issue 31)
_INTERRUPT_WAIT = INTERRUPT_DRAIN + MEASURE_TICK + 1.5
#: what stops a client process's clients: Ctrl-C from the terminal, or the parent
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Accumulators = dict[str, SideAccumulator]
#: the step's clock, one accumulator per side, what the clients cost (an executor
#: of an older shape may leave the last out)
Measured = tuple[StepClock, Accumulators, ClientUsage | None]
Executor = Callable[[StepPlan, dict[str, Any], Progress | None], Measured]


#: the accumulators' counters that carry :meth:`Operation.observe`'s answers: summed
#: like the drivers' counters across clients, processes and cluster hosts
OBSERVED = "observed:"


def observe_sides(plan: StepPlan, context: dict[str, Any], accumulators: Accumulators) -> None:
    """Each side's :meth:`~.operations.Operation.observe` in this process (once, after
    its clients ran), added to that side's accumulator (:data:`OBSERVED` counters)."""
    for side, operation, _ in plan.operation.groups(plan.clients):
        accumulator = accumulators.get(side)
        if accumulator is None:  # no client of this side ran here
            continue
        seen = operation.observe(plan.side_context(context, side))
        accumulator.add_counters({f"{OBSERVED}{name}": float(value)
                                  for name, value in (seen or {}).items()})


def observed_of(accumulators: Accumulators) -> dict[str, float]:
    """What the operation observed in every process, summed over the sides."""
    observed: dict[str, float] = {}
    for accumulator in accumulators.values():
        for name, value in accumulator.counters.items():
            if name.startswith(OBSERVED):
                key = name[len(OBSERVED):]
                observed[key] = observed.get(key, 0.0) + value
    return observed


class ClientsCrashed(StorageError):
    """A client process ended mid-step without its report (killed by a signal: its
    client library crashed): the step is an error naming how it ended; the session
    and its other steps go on."""


def isolates_clients(driver_class: type) -> bool:
    """Whether ``auto`` runs this driver's load clients outside pytest's process."""
    return bool(getattr(driver_class, "isolate_clients", False))


def clients_per_process(plan: StepPlan) -> int:
    """The most clients one process may run: the plan's, else the driver class's
    ``clients_per_process`` (0: no limit)."""
    return plan.clients_per_process or int(
        getattr(plan.driver.driver_class, "clients_per_process", 0) or 0)


def process_count(plan: StepPlan, clients: int) -> int:
    """Processes for ``clients`` clients: the plan's count if it sets one, else one per
    usable core (at least 2) and enough that none holds more than
    :func:`clients_per_process`."""
    if plan.processes:
        return max(1, min(plan.processes, clients))
    return _spread(clients, clients_per_process(plan))


def _spread(clients: int, limit: int) -> int:
    count = max(2, usable_cores())
    if limit:
        count = max(count, math.ceil(clients / limit))
    return max(1, min(count, clients))


def planned_processes(executor: str, clients: int, driver_class: type) -> int:
    """How many processes ``executor`` will spread ``clients`` of ``driver_class`` over
    (known before the step: the open-files check counts per process)."""
    limit = int(getattr(driver_class, "clients_per_process", 0) or 0)
    if executor == "threads" or (executor == "auto" and not (limit and clients > limit)):
        return 1
    return _spread(clients, limit)


def run_threads(plan: StepPlan, context: dict[str, Any], progress: Progress | None = None
                ) -> Measured:
    """Every client a thread of this process; the step starts once they have logged in."""
    assignments = plan.assignments()
    meter = CpuMeter(len(assignments))
    try:
        clock, accumulators = run_clients(
            plan, context, assignments, lambda: plan.clock(time.time() + _START_LEAD),
            plan.max_operations, progress, meter)
    except LoadInterrupted as interrupted:
        interrupted.usage = meter.usage
        observe_sides(plan, context, interrupted.accumulators)
        raise
    observe_sides(plan, context, accumulators)
    return clock, accumulators, meter.usage


def run_auto(plan: StepPlan, context: dict[str, Any], progress: Progress | None = None
             ) -> Measured:
    """Threads while the step's clients fit in one process (the driver's
    :func:`clients_per_process`), else processes, each within that limit; the threads
    in one spawned process for a driver that :func:`isolates_clients`."""
    limit = clients_per_process(plan)
    if limit and len(plan.assignments()) > limit:
        return run_processes(plan, context, progress)
    if isolates_clients(plan.driver.driver_class):
        return run_processes(dataclasses.replace(plan, processes=1), context, progress,
                             shard=False)
    return run_threads(plan, context, progress)


# -- processes ------------------------------------------------------------------------
@dataclass
class _Child:
    """One spawned client process, its end of the pipe and its clients."""

    process: Any  # multiprocessing.context.SpawnProcess
    connection: mp_connection.Connection
    share: list[ClientAssignment]
    latest: StepProgress | None = None
    finished: bool = False
    #: what its clients cost (its own CPU over the measured window)
    usage: ClientUsage | None = None
    #: its own error, the step's: message and error class
    failure: tuple[str, str] | None = None
    #: it was stopped (a signal to it or to its process group) and sent what it
    #: measured until then: the step was interrupted, whoever stopped it
    interrupted: bool = False


def _stop_once(signum: int, frame: Any) -> None:
    """SIGINT (the terminal's Ctrl-C) or SIGTERM (the parent's): stop the clients.
    Both may come; only the first interrupts."""
    _ignore_stops()
    raise KeyboardInterrupt


def _ignore_stops() -> None:
    # a handler that does nothing, not SIG_IGN: a signal already pending when the
    # handler becomes SIG_IGN raises OSError ("ignored due to race condition")
    for number in _STOP_SIGNALS:
        signal.signal(number, _no_stop)


def _no_stop(signum: int, frame: Any) -> None:
    pass


def _process_main(plan: StepPlan, context: dict[str, Any], share: list[ClientAssignment],
                  max_operations: int, connection: mp_connection.Connection,
                  shard: bool = True) -> None:
    """Entry point of a spawned client process (the driver class was imported while
    its arguments were unpickled, before the clock runs). Stopped early, it sends
    what its clients measured so far as ``interrupted``."""
    for number in _STOP_SIGNALS:  # even when started with SIGINT ignored
        signal.signal(number, _stop_once)
    # and not blocked: a process inherits the mask of the thread that spawned it (a
    # client library may have blocked them there)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    def start() -> StepClock:  # its clients have logged in: the parent's common clock
        connection.send("ready")
        return connection.recv()

    try:
        kind, meter = "result", CpuMeter(len(share))
        if shard:  # not the one process of a step kept out of pytest's (run_auto)
            plan.driver.driver_class.in_shard_process()
        try:
            _, accumulators = run_clients(plan, context, share, start, max_operations,
                                          lambda state: connection.send(("progress", state)),
                                          meter)
        except LoadInterrupted as interrupted:
            kind, accumulators = "interrupted", interrupted.accumulators
        observe_sides(plan, context, accumulators)  # what this process's clients saw
        _ignore_stops()  # the answer is complete: a late stop must not cut it
        usage = meter.usage.to_json() if meter.usage is not None else None
        connection.send((kind, {side: a.to_wire() for side, a in accumulators.items()}, usage))
    except KeyboardInterrupt:  # stopped before its clients ran: nothing measured
        connection.send(("interrupted", {}, None))
    except StorageError as exc:  # e.g. no thread for a client: the step's error
        connection.send(("failed", exc.message, exc.error_class))
    except Exception:  # noqa: BLE001 - a bug: the parent raises it with this traceback
        connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()
        os._exit(0)  # hung client threads must not keep the process alive


def _spawn(plan: StepPlan, context: dict[str, Any], children: list[_Child],
           shard: bool = True) -> None:
    """One process per share of the clients (:func:`process_count`), added to
    ``children`` as started; a count bound is split by the shares."""
    assignments = plan.assignments()
    count = process_count(plan, len(assignments))
    spawn = multiprocessing.get_context("spawn")  # the XRootD client breaks after fork
    for share in (assignments[i::count] for i in range(count)):
        parent_end, child_end = spawn.Pipe()
        bound = math.ceil(plan.max_operations * len(share) / len(assignments))
        process = spawn.Process(target=_process_main, name="storagescale-clients",
                                args=(plan, context, share, bound, child_end, shard),
                                daemon=True)
        try:
            process.start()
        except OSError as exc:  # EAGAIN: the user's process limit (ulimit -u)
            raise _failed(plan, f"could not start client process {len(children) + 1} of "
                                f"{count} ({exc}): the user's process and thread limit "
                                f"(ulimit -u) or the memory is exhausted; raise 'ulimit -u' "
                                f"before pytest, or lower the clients",
                          "client_threads") from None
        finally:
            child_end.close()
        children.append(_Child(process, parent_end, share))


def _failed(plan: StepPlan, message: str, error_class: str) -> StorageError:
    return StorageError(message, driver=plan.driver.name,
                        endpoint=plan.driver.endpoint.server, operation=plan.operation.name,
                        path=plan.workdir, error_class=error_class)


def _says_ready(plan: StepPlan, child: _Child, timeout: float) -> bool:
    """Whether ``child`` said it is ready; its own error (:class:`StorageError`)
    when it could not get there."""
    try:
        said = child.connection.recv() if child.connection.poll(timeout) else None
    except (EOFError, OSError):  # it died while starting
        return False
    if isinstance(said, tuple) and said[0] == "failed":
        child.finished = True
        raise _failed(plan, *said[1:])
    return said == "ready"


def _handshake(plan: StepPlan, children: list[_Child]) -> StepClock:
    """Wait until every process is ready (its clients logged in), then give them all
    the same clock."""
    deadline = time.time() + _START_TIMEOUT + plan.hang_timeout
    for child in children:
        if not _says_ready(plan, child, max(0.0, deadline - time.time())):
            child.process.join(0.5)
            code = child.process.exitcode
            what = (f"did not start within {_START_TIMEOUT + plan.hang_timeout:.0f} s"
                    if code is None else
                    f"exited while starting ({exit_text(code)}; its error, if any, is "
                    f"above in stderr)")
            raise StorageError(
                f"client process {child.process.pid} {what} (the processes executor "
                f"spawns {len(children)} Python processes; try --storage-executor threads)",
                driver=plan.driver.name, endpoint=plan.driver.endpoint.server,
                operation=plan.operation.name, path=plan.workdir, error_class="executor",
            )
    clock = plan.clock(time.time() + 0.5)
    for child in children:
        child.connection.send(clock)
    return clock


def _receive(child: _Child, accumulators: Accumulators) -> None:
    """Take one message of ``child``: progress, its result (whole, or ``interrupted``:
    what it measured until stopped), or the traceback of a bug."""
    try:
        kind, payload, *usage = child.connection.recv()
    except (EOFError, OSError):
        child.finished = True  # died without its report: ClientsCrashed
        child.process.join(1.0)  # its exit status
        return
    if kind == "progress":
        child.latest = payload
        return
    child.finished = True
    if kind == "error":
        raise RuntimeError(f"client process {child.process.pid} failed:\n{payload}")
    if kind == "failed":  # its error is the step's (run_processes raises it)
        child.failure = (payload, *usage)
        child.share = []
        return
    child.interrupted = kind == "interrupted"
    for side, wire in payload.items():
        accumulators[side].merge_wire(wire)
    if usage and usage[0] is not None:
        child.usage = ClientUsage.from_json(usage[0])
    child.share = []  # its clients are accounted for


def _summed(plan: StepPlan, clock: StepClock, children: list[_Child]) -> StepProgress | None:
    states = [child.latest for child in children if child.latest is not None]
    if not states:
        return None
    return StepProgress(
        operation=plan.operation.name, clients=plan.clients,
        elapsed_s=time.time() - clock.start_at, total_s=clock.end_at - clock.start_at,
        rate_hz=sum(s.rate_hz for s in states), succeeded=sum(s.succeeded for s in states),
        failed=sum(s.failed for s in states), hung=sum(s.hung for s in states),
    )


def _collect(plan: StepPlan, clock: StepClock, children: list[_Child],
             progress: Progress | None, accumulators: Accumulators) -> Accumulators:
    """Stream progress and merge the results into ``accumulators`` until the
    deadline; the clients of a process that did not answer by then are hung."""
    deadline = clock.end_at + plan.hang_timeout + _PROCESS_GRACE
    by_connection: dict[Any, _Child] = {child.connection: child for child in children}
    while time.time() < deadline:
        waiting = [child.connection for child in children if not child.finished]
        if not waiting:
            break
        for connection in mp_connection.wait(waiting, timeout=min(1.0, deadline - time.time())):
            _receive(by_connection[connection], accumulators)
        if any(child.interrupted for child in children):
            return accumulators  # the step ends now (run_processes stops the others)
        state = _summed(plan, clock, [c for c in children if not c.finished])
        if progress is not None and state is not None:
            progress(state)
    for child in children:
        for assignment in child.share:  # stuck or died: every client in it is hung
            accumulators[assignment.side].hung += 1
    return accumulators


def _stop(plan: StepPlan, clock: StepClock | None, children: list[_Child],
          accumulators: Accumulators) -> LoadInterrupted:
    """Ctrl-C: stop every process's clients, merge what arrives within
    :data:`_INTERRUPT_WAIT`, kill the rest. Their clients are abandoned, not counted
    hung: the user ended the step, not the storage."""
    if clock is not None:  # else no client ran: nothing to wait for
        for child in children:
            if not child.finished:
                child.process.terminate()  # SIGTERM: the child stops its clients
        try:
            _take_partial(children, accumulators, time.time() + _INTERRUPT_WAIT)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: keep what arrived all the same
    for child in children:
        if not child.finished:
            child.process.kill()
    interrupted = LoadInterrupted(accumulators)
    interrupted.clock = clock or plan.clock(time.time())
    interrupted.usage = _usage(children)
    return interrupted


def _take_partial(children: list[_Child], accumulators: Accumulators,
                  deadline: float) -> None:
    by_connection: dict[Any, _Child] = {child.connection: child for child in children}
    while (waiting := [c.connection for c in children if not c.finished]):
        left = deadline - time.time()
        if left <= 0:
            return
        for connection in mp_connection.wait(waiting, timeout=left):
            try:
                _receive(by_connection[connection], accumulators)
            except Exception:  # noqa: BLE001 - a bug or a garbled message: give it up
                by_connection[connection].finished = True


def _crashed(plan: StepPlan, children: list[_Child]) -> ClientsCrashed | None:
    """The error of a step whose client process ended without its report, or None."""
    lost = [c for c in children if c.finished and c.share and c.process.exitcode is not None]
    if not lost:
        return None
    how = "; ".join(f"client process {c.process.pid} ({len(c.share)} of the "
                    f"step's {plan.clients} clients) {exit_text(c.process.exitcode)}" for c in lost)
    return ClientsCrashed(
        f"{how} mid-step, without its report: its client library ({plan.driver.name}) "
        f"crashed. The step is an error and not judged; the session and its other "
        f"steps go on (the load clients run in child processes)",
        driver=plan.driver.name, endpoint=plan.driver.endpoint.server,
        operation=plan.operation.name, path=plan.workdir, error_class="client_crash")


def _usage(children: list[_Child]) -> ClientUsage | None:
    """The client processes' CPU and memory together."""
    return ClientUsage.merged([child.usage for child in children if child.usage is not None])


def _reap(children: list[_Child]) -> None:
    for child in children:
        child.process.join(timeout=1)
        if child.process.is_alive():
            child.process.kill()
            child.process.join(timeout=5)
        child.connection.close()


def run_processes(plan: StepPlan, context: dict[str, Any], progress: Progress | None = None,
                  *, shard: bool = True) -> Measured:
    """The clients spread over spawned processes (:func:`process_count`), each running
    its share as threads; their accumulators are merged here, and a process that
    hangs is killed. Ctrl-C stops them and raises :class:`LoadInterrupted` with what
    they measured. ``shard`` False: one process that runs the step alone (its client
    library set up as for the threads executor, not :meth:`Driver.in_shard_process`)."""
    children: list[_Child] = []
    clock: StepClock | None = None
    accumulators: Accumulators = {}
    try:
        _spawn(plan, context, children, shard)
        clock = _handshake(plan, children)
        accumulators.update(
            (a.side, SideAccumulator(clock.seconds)) for a in plan.assignments())
        _collect(plan, clock, children, progress, accumulators)
        if any(child.interrupted for child in children):
            # stopped by a signal this process did not take (SIGTERM to the client
            # process, or Ctrl-C to a process group whose pytest ignores SIGINT): the
            # step ends as interrupted with what was measured, never as a whole step
            raise KeyboardInterrupt
        if (crash := _crashed(plan, children)) is not None:
            raise crash
        for child in children:
            if child.failure is not None:
                raise _failed(plan, *child.failure)
        return clock, accumulators, _usage(children)
    except KeyboardInterrupt:
        raise _stop(plan, clock, children, accumulators) from None
    finally:
        _reap(children)


#: executor name -> function (``--storage-executor``)
EXECUTORS: dict[str, Executor] = {
    "threads": run_threads, "processes": run_processes, "auto": run_auto}
