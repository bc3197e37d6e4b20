"""A step over the cluster's hosts, as one step with one verdict.

The engine (:func:`~pytest_storagescale.load.engine.run_step`) probes, sets up and
cleans up from this process as for any step; only where the clients run differs: a
:class:`ClusterExecutor` in place of the threads executor. It

1. splits the step's clients over the hosts (strided, as the processes executor
   does; or ``clients_per_host`` each, in host order); client indices stay global, so
   every client has its own login name across all hosts;
2. sends every host the picklable plan (its :class:`~pytest_storagescale.drivers.spec.
   DriverSpec` included), the set-up's context, its share and the step's clock on the
   coordinator's time; the host moves the clock by its measured offset and runs its
   share with :func:`~pytest_storagescale.load.clients.run_clients` on its own clock;
3. merges what the hosts report: counts, bytes, errors and timelines add up, latency
   HdrHistograms merge (never averaged percentiles);
4. counts the clients of a host that did not report by ``end + hang_timeout`` (plus
   :data:`REPORT_GRACE`), or whose worker left the cluster, as ``lost``: the step ends
   on time all the same.
"""

from __future__ import annotations

import ctypes
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..drivers.registry import start_early_drivers
from ..load.clients import LoadInterrupted, run_clients
from ..load.engine import StepInterrupted, run_step
from ..load.executors import observe_sides
from ..load.plan import ClientAssignment, StepClock, StepPlan, StepProgress
from ..load.stats import (
    ClientUsage,
    CpuMeter,
    HostResult,
    SideAccumulator,
    StepResult,
    latency_summary,
    new_histogram,
)
from .hosts import ClusterConnection, ClusterError, ClusterHost, check_offsets, connect

#: how long the hosts may take to unpack their shares and say they are ready (at
#: least; their clients' logins may take hang_timeout more): a host that is not ready by then
#: is not waited for (it starts late, or is lost)
READY_TIMEOUT = 10.0
#: time for the ready hosts to learn the start time and start their client threads
#: before the clock runs (plus STARTUP_PER_CLIENT per client of the largest share)
STARTUP_LEAD = 0.3
STARTUP_PER_CLIENT = 1 / 2000
#: how long after ``end + hang_timeout`` a host may take to send its report
REPORT_GRACE = 5.0
#: how often the coordinator looks for finished hosts and workers that left
POLL_INTERVAL = 0.25
#: after Ctrl-C, how long the hosts may take to stop their clients and report
INTERRUPT_WAIT = 3.0

Accumulators = dict[str, SideAccumulator]


@dataclass(frozen=True)
class HostShare:
    """What one host runs: its clients of the step."""

    host: ClusterHost
    assignments: list[ClientAssignment]


@dataclass(frozen=True)
class HostReport:
    """What a host sends back: its sides' measurements (wire form), its measured
    window (taken on its own clock, given back on the coordinator's) and its
    worker's peak memory."""

    sides: dict[str, dict[str, Any]]
    started: float
    ended: float
    peak_rss_mb: float
    interrupted: bool = False
    #: the host's latency summary over its sides (seconds), computed where it ran
    latency_s: dict[str, float] | None = None
    #: what the clients cost the host (CPU over the measured window, memory)
    usage: ClientUsage | None = None


def split_clients(assignments: list[ClientAssignment], hosts: list[ClusterHost],
                  clients_per_host: int = 0, *, address: str = "") -> list[HostShare]:
    """The hosts' shares: strided over all hosts (a mixed step's sides spread evenly),
    or ``clients_per_host`` each, filling hosts in order."""
    if clients_per_host:
        needed = math.ceil(len(assignments) / clients_per_host)
        if needed > len(hosts):
            raise ClusterError(
                f"{len(assignments)} clients at clients_per_host = {clients_per_host} need "
                f"{needed} hosts; the cluster has {len(hosts)}: add hosts or raise "
                f"clients_per_host", address=address)
        blocks = [assignments[i * clients_per_host:(i + 1) * clients_per_host]
                  for i in range(needed)]
        return [HostShare(host, block) for host, block in zip(hosts, blocks, strict=False)]
    count = min(len(hosts), len(assignments))
    return [HostShare(hosts[i], assignments[i::count]) for i in range(count)]


def shifted(clock: StepClock, offset: float) -> StepClock:
    """``clock`` on a host whose clock reads ``offset`` seconds ahead."""
    return replace(clock, start_at=clock.start_at + offset,
                   measure_from=clock.measure_from + offset, end_at=clock.end_at + offset)


def run_share(plan: StepPlan, context: dict[str, Any], assignments: list[ClientAssignment],
              offset: float, max_operations: int, step: str) -> HostReport:
    """On a client host (a Dask task): run this host's clients from the common start.

    Its clients log in; then the host says it is ready (Dask queue ``<step>-ready``)
    and waits for the start
    time (Dask variable ``<step>-start``, on the coordinator's clock; None: the step
    was called off). ``offset`` is the host's measured offset (its reported clock minus
    the coordinator's); the clients run on the host's own clock. When the Dask event
    ``<step>-stop`` is set (Ctrl-C on the coordinator), the clients stop as they do on
    Ctrl-C, and the host reports what they measured. After hung clients the host's
    driver forgets its connections, as the engine does after a step."""
    from distributed import Queue, Variable, get_client

    from .hosts import clock_skew, peak_rss_mb

    client = get_client()
    # the offset was measured from the reported clock; the engine reads time.time()
    shift = offset - clock_skew()
    clocks: list[StepClock] = []  # the common clock, once given

    def start() -> StepClock:  # this host's clients have logged in
        Queue(f"{step}-ready", client=client).put(get_worker_address())
        start_at = Variable(f"{step}-start", client=client).get(
            timeout=READY_TIMEOUT + plan.hang_timeout + 60)
        if start_at is None:
            raise _CalledOff
        clocks.append(plan.clock(start_at))
        return shifted(clocks[0], shift)

    interrupted = False
    watcher = StopWatcher(f"{step}-stop", time.time() + READY_TIMEOUT + 3 * plan.hang_timeout
                          + 120 + plan.warmup + plan.duration)
    meter = CpuMeter(len(assignments))
    try:
        local, accumulators = run_clients(plan, context, assignments, start, max_operations,
                                          meter=meter)
    except _CalledOff:
        return HostReport({}, 0.0, 0.0, peak_rss_mb(), interrupted=True)
    except LoadInterrupted as stopped:
        accumulators, interrupted = stopped.accumulators, True
        local = stopped.clock
    finally:
        watcher.finish()
    observe_sides(plan, context, accumulators)  # what the operation saw on this host
    clock = clocks[0] if clocks else shifted(local, -shift)
    ended = min(time.time(), local.end_at) - shift  # back on the coordinator's clock
    if any(a.hung for a in accumulators.values()):
        plan.driver.driver_class.forget_connections()
    histogram = new_histogram()
    for accumulator in accumulators.values():
        histogram.add(accumulator.histogram)
    return HostReport({side: a.to_wire() for side, a in accumulators.items()},
                      clock.measure_from, ended, peak_rss_mb(), interrupted,
                      latency_summary(histogram), meter.usage)


class _CalledOff(Exception):
    """The coordinator called the step off before it started (Ctrl-C)."""


def _before_load(spec) -> None:
    """On a cluster host: the drivers that start early, and the driver's preparation
    for load (``Driver.before_load``)."""
    start_early_drivers()  # a host's worker runs every step's clients
    spec.driver_class.before_load(spec.options)


def get_worker_address() -> str:
    from distributed import get_worker

    return get_worker().address


class StopWatcher:
    """On a host: waits for the coordinator's stop event and then raises
    KeyboardInterrupt in the task's thread, which the engine's clients take as Ctrl-C
    (they stop within about a second and keep what they measured)."""

    def __init__(self, name: str, until: float) -> None:
        from distributed import get_client

        self.client = get_client()  # in the task's thread: the worker's client
        self.target = threading.get_ident()
        self.name = name
        self.until = until
        self.lock = threading.Lock()
        self.running = True
        threading.Thread(target=self._watch, name="storagescale-stop", daemon=True).start()

    def _watch(self) -> None:
        from distributed import Event

        event = Event(self.name, client=self.client)
        while self.running and time.time() < self.until:
            try:
                stopped = event.wait(timeout=0.5)
            except Exception:  # noqa: BLE001 - the scheduler went away: nothing to stop
                return
            with self.lock:
                if stopped and self.running:
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(self.target), ctypes.py_object(KeyboardInterrupt))
                    return

    def finish(self) -> None:
        with self.lock:
            self.running = False


class ClusterExecutor:
    """An engine executor that runs the step's clients on the cluster's hosts; after
    the step, :attr:`hosts` holds the per-host breakdown and :attr:`lost` the clients
    of hosts that were lost."""

    def __init__(self, connection: ClusterConnection, hosts: list[ClusterHost],
                 clients_per_host: int = 0) -> None:
        self.connection = connection
        self.cluster_hosts = hosts
        self.clients_per_host = clients_per_host
        self.hosts: list[HostResult] = []
        self.lost = 0
        #: the busiest host's client usage: the step's ``client_cpu`` (a saturated
        #: client host measured itself, not the storage)
        self.usage: ClientUsage | None = None
        self._pause = threading.Event()  # never set: an interruptible sleep
        #: seconds from the start request until every host was ready and had the start
        #: time, and merging the hosts' reports (the coordinator's overhead)
        self.dispatch_s = 0.0
        self.merge_s = 0.0

    def __call__(self, plan: StepPlan, context: dict[str, Any],
                 progress: Callable[[StepProgress], None] | None = None
                 ) -> tuple[StepClock, Accumulators, ClientUsage | None]:
        asked = time.time()
        shares = split_clients(plan.assignments(), self.cluster_hosts, self.clients_per_host,
                               address=str(self.connection.address))
        largest = max(len(share.assignments) for share in shares)
        step = f"storagescale-{time.time_ns()}"
        # what the driver needs on each host (the xrootd driver's compiled loop, built
        # there once) before the hosts' clients start, not inside their ready timeout
        self.connection.client.run(_before_load, plan.driver,
                                   workers=[share.host.worker for share in shares])
        futures = self._submit(plan, context, shares, step)
        clock: StepClock | None = None
        accumulators: Accumulators = {}
        try:
            # a host is ready once its clients have logged in (up to hang_timeout)
            self._until_ready(futures, step, READY_TIMEOUT + plan.hang_timeout)
            clock = plan.clock(time.time() + STARTUP_LEAD + largest * STARTUP_PER_CLIENT)
            self._variable(f"{step}-start").set(clock.start_at)
            self.dispatch_s = time.time() - asked
            accumulators.update(
                (a.side, SideAccumulator(clock.seconds)) for a in plan.assignments())
            reports, lost = self._wait(plan, clock, futures)
        except KeyboardInterrupt:
            raise self._interrupt(plan, clock, shares, futures, step, accumulators) from None
        finally:
            self._forget(step)
        merging = time.time()
        self._merge(plan, clock, shares, reports, lost, accumulators)
        self.merge_s = time.time() - merging
        return clock, accumulators, self.usage

    def _forget(self, step: str) -> None:
        """Drop the step's start variable from the scheduler (its hosts have read it, or
        are lost)."""
        try:
            self._variable(f"{step}-start").delete()
        except Exception:  # noqa: BLE001 - the scheduler is gone: nothing to drop
            pass

    def _variable(self, name: str) -> Any:
        from distributed import Variable

        return Variable(name, client=self.connection.client)

    def _until_ready(self, futures: dict[str, Any], step: str, timeout: float) -> None:
        """Wait until every host says it is ready (its share unpacked, its clients
        logged in), or failed, or left, or ``timeout`` passed: a host
        busy with something else must not start late and measure a shorter window."""
        from distributed import Queue

        queue = Queue(f"{step}-ready", client=self.connection.client)
        waiting = set(futures)
        deadline = time.time() + timeout
        while waiting and time.time() < deadline:
            # what is there, without waiting: a get that times out is an ERROR with a
            # traceback in the scheduler's log (in this process's stderr for a recipe's)
            waiting.difference_update(queue.get(batch=True))
            if not waiting:
                break
            waiting -= {w for w in waiting if futures[w].status in ("error", "cancelled")}
            waiting &= self.connection.worker_addresses()
            self._pause.wait(POLL_INTERVAL)

    def _interrupt(self, plan: StepPlan, clock: StepClock | None, shares: list[HostShare],
                   futures: dict[str, Any], step: str, accumulators: Accumulators
                   ) -> LoadInterrupted:
        """Ctrl-C: tell the hosts to stop their clients (or not to start), merge the
        reports that arrive within :data:`INTERRUPT_WAIT`, give up the rest (abandoned,
        not lost: the user ended the step)."""
        from distributed import Event

        if clock is None:  # before the start: call the step off
            clock = plan.clock(time.time())
            accumulators.update(
                (a.side, SideAccumulator(clock.seconds)) for a in plan.assignments())
        try:
            self._variable(f"{step}-start").set(None)  # a host still waiting: not to start
            Event(f"{step}-stop", client=self.connection.client).set()
            reports = self._reports_until(futures, time.time() + INTERRUPT_WAIT)
        except KeyboardInterrupt:
            reports = {}  # a second Ctrl-C: give up waiting
        self.connection.client.cancel([f for w, f in futures.items() if w not in reports],
                                      force=True)
        self._merge(plan, clock, shares, reports, {}, accumulators)
        interrupted = LoadInterrupted(accumulators)
        interrupted.clock = clock
        interrupted.usage = self.usage
        return interrupted

    def _reports_until(self, futures: dict[str, Any], deadline: float
                       ) -> dict[str, HostReport]:
        reports: dict[str, HostReport] = {}
        while time.time() < deadline and len(reports) < len(futures):
            for worker, future in futures.items():
                if worker not in reports and future.status == "finished":
                    reports[worker] = future.result()
            self._pause.wait(POLL_INTERVAL / 2)
        return reports

    def _submit(self, plan: StepPlan, context: dict[str, Any], shares: list[HostShare],
                step: str) -> dict[str, Any]:
        client = self.connection.client
        futures = {}
        total = len(plan.assignments())
        for share in shares:
            bound = math.ceil(plan.max_operations * len(share.assignments) / total)
            futures[share.host.worker] = client.submit(
                run_share, plan, context, share.assignments, share.host.clock_offset_s, bound,
                step, workers=[share.host.worker],
                allow_other_workers=False, pure=False, retries=0,
                key=f"storagescale-{plan.operation.name}-{share.host.name}-{time.time_ns()}")
        return futures

    def _wait(self, plan: StepPlan, clock: StepClock, futures: dict[str, Any]
              ) -> tuple[dict[str, HostReport], dict[str, str]]:
        """The hosts' reports, and why the others were lost, by the deadline."""
        deadline = clock.end_at + plan.hang_timeout + REPORT_GRACE
        reports: dict[str, HostReport] = {}
        lost: dict[str, str] = {}
        pending = dict(futures)
        while pending and time.time() < deadline:
            self._pause.wait(POLL_INTERVAL)  # future states arrive from the scheduler
            for worker, future in list(pending.items()):
                if future.status == "finished":
                    reports[worker] = future.result()
                elif future.status in ("error", "cancelled"):
                    lost[worker] = f"its task failed: {future.exception()!r}"
                else:
                    continue
                del pending[worker]
            if pending and time.time() > clock.start_at:
                present = self.connection.worker_addresses()
                for worker in [w for w in pending if w not in present]:
                    lost[worker] = (f"its worker left the cluster "
                                    f"{time.time() - clock.start_at:.1f} s into the step")
                    del pending[worker]
        for worker in pending:
            lost[worker] = (f"no report by the step's end + hang_timeout + "
                            f"{REPORT_GRACE:g} s (worker stuck or network cut)")
        self.connection.client.cancel([futures[w] for w in lost], force=True)
        return reports, lost

    def _merge(self, plan: StepPlan, clock: StepClock, shares: list[HostShare],
               reports: dict[str, HostReport], lost: dict[str, str],
               accumulators: Accumulators) -> None:
        self.hosts, self.lost = [], 0
        usages = [r.usage for r in reports.values() if r.usage is not None]
        busiest = max(usages, key=lambda u: u.cpu if u.cpu == u.cpu else -1.0, default=None)
        # ... with every host's clients that a compiled loop served
        self.usage = busiest and replace(
            busiest, compiled_clients=sum(u.compiled_clients for u in usages))
        for share in shares:
            host, clients = share.host, share.assignments
            report = reports.get(host.worker)
            base = HostResult(
                name=host.name, address=host.address, worker=host.worker,
                clients=len(clients), clock_offset_s=host.clock_offset_s,
                clock_uncertainty_s=host.clock_uncertainty_s,
                first_client=clients[0].index, last_client=clients[-1].index)
            if report is None and host.worker in lost:
                self.lost += len(clients)
                self.hosts.append(replace(base, lost=len(clients),
                                          lost_reason=lost[host.worker]))
                continue
            if report is None:  # Ctrl-C before it reported: abandoned, not lost
                self.hosts.append(replace(base, lost_reason="stopped (Ctrl-C) before it "
                                                            "reported"))
                continue
            for side, wire in report.sides.items():
                accumulators[side].merge_wire(wire)
            self.hosts.append(_host_result(base, report, plan))


def _host_result(base: HostResult, report: HostReport, plan: StepPlan) -> HostResult:
    """A reporting host's row: its counts from its sides' wire forms, its latency as
    the host summarized it (decoding its histograms again would double the merge)."""
    counts: dict[str, Any] = {"succeeded": 0, "failed": 0, "hung": 0, "bytes": 0}
    measured = 0.0
    for wire in report.sides.values():
        for key in counts:
            counts[key] += wire[key]
        measured = max(measured, wire["measured_s"])
    latency = report.latency_s or {"p50": float("nan"), "p99": float("nan")}
    duration = measured if (plan.max_operations or report.interrupted) else plan.duration
    return replace(
        base, started=report.started, ended=report.ended,
        duration_s=max(float(duration), 1e-6), p50_s=latency["p50"], p99_s=latency["p99"],
        peak_rss_mb=report.peak_rss_mb,
        client_cpu=report.usage.cpu if report.usage is not None else None, **counts)


def run_cluster_step(address: str, plan: StepPlan,
                     progress: Callable[[StepProgress], None] | None = None,
                     *, clients_per_host: int = 0, observe=None) -> StepResult:
    """Measure ``plan`` with its clients on the cluster at ``address`` (``observe``: the
    servers' side, as :func:`~pytest_storagescale.load.engine.run_step` takes it); the result holds
    the per-host breakdown (``hosts``) and the ``lost`` clients (an interrupted step's
    too, in :class:`StepInterrupted`'s ``result``).

    The hosts' clocks are checked first (a host off by more than the bound is a
    :class:`ClusterError` before any set-up)."""
    connection = connect(address)
    hosts = connection.hosts()
    check_offsets(hosts, address)
    executor = ClusterExecutor(connection, hosts, clients_per_host)
    try:
        result = run_step(plan, executor=executor, progress=progress, observe=observe)
    except StepInterrupted as interrupted:
        stopped = interrupted.result
        stopped.hosts, stopped.lost = list(executor.hosts), executor.lost
        raise
    result.hosts, result.lost = list(executor.hosts), executor.lost
    return result
