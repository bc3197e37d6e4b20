"""The open loop: requests sent at their scheduled times, whatever the others do.

A closed loop (:mod:`.clients`) sends a client's next request when its last one
returned: when the storage stalls, it stops sending, and the requests that would have
arrived meanwhile are never measured (coordinated omission). An open-loop step
(``StepPlan.arrival_rate``) sends request ``k`` at its intended time ``start + k / rate``
(``constant``) or at the ``k``-th arrival of a Poisson process of that rate
(``poisson``; one seeded sequence, the same in every process of the step), from the
step's start until its window's end, whatever the storage does:

- a :class:`Dispatcher` thread per process waits for each request's intended time
  and hands it to a free client of the process (``StepPlan.clients`` is the cap on
  requests in flight, ``max_in_flight``); with no free client at that time the request
  is **dropped** (counted, never sent late: the policy of this engine);
- the client sends it and records its **response time**, from the intended start
  (the side's ``latency_s``), and its **service time**, from the actual send
  (``service_latency_s``); a request sent more than
  :data:`~.stats.LATE_AFTER_S` after its intended time is **late** (the client host
  could not keep the schedule), its lateness in its response time.

Each process (and each cluster host) sends the requests ``k`` whose ``k % C`` is the
number of one of its clients (``C`` the step's clients): its share of the one schedule,
on the step's common start time. The driver's compiled loop (XRootD's) runs the closed
loop only: open-loop requests go through the driver's Python calls.
"""

from __future__ import annotations

import collections
import queue
import random
import threading
import time
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .plan import ARRIVALS
from .slot import send
from .stats import OpenLoopAccumulator, SideAccumulator

if TYPE_CHECKING:
    from ..drivers.base import Driver
    from .slot import ClientSlot, StepRun

def intended_times(rate: float, arrivals: str, start: float, seed: int) -> Iterator[float]:
    """The intended send times of requests 0, 1, ... from ``start`` (any clock)."""
    assert arrivals in ARRIVALS, arrivals
    if arrivals == "poisson":
        rng = random.Random(seed)
        moment = start
        while True:
            moment += rng.expovariate(rate)
            yield moment
    number = 0
    while True:
        yield start + number / rate
        number += 1


class Dispatcher:
    """This process's share of an open-loop step's schedule, handed to its free
    clients at the intended times (see the module docstring). Its thread is the
    only writer of ``drops`` and ``scheduled``; the clients return themselves with
    :meth:`release`."""

    def __init__(self, run: StepRun, owned: list[int], total: int) -> None:
        self.run = run
        self.workers = len(owned)
        #: the numbers ``k % total`` of this process's requests (None: every request)
        self.owned = None if len(owned) >= total else frozenset(owned)
        self.total = total
        self.idle = len(owned)
        self.lock = threading.Lock()
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        #: intended times (perf_counter) of the requests dropped, until collected
        self.drops: collections.deque[float] = collections.deque()
        #: requests of this process's share intended inside the measured window
        self.scheduled = 0
        self.seed = zlib.crc32(run.plan.workdir.encode())

    def start(self) -> None:
        threading.Thread(target=self._dispatch, name="storagescale-dispatcher",
                         daemon=True).start()

    def _mine(self) -> Iterator[tuple[int, float]]:
        plan, run = self.run.plan, self.run
        times = intended_times(plan.arrival_rate, plan.arrivals, run.start_perf, self.seed)
        owned, total = self.owned, self.total
        for number, intended in enumerate(times):
            if owned is None or number % total in owned:
                yield number, intended

    def _dispatch(self) -> None:
        run = self.run
        perf_counter = time.perf_counter
        try:
            run.wait_for_start()
            for number, intended in self._mine():
                # none intended after the window's end: no load the step does not count
                if intended >= run.end_perf or run.stop.is_set() or not run.take():
                    break
                delay = intended - perf_counter()
                if delay > 0 and run.stop.wait(delay):
                    break
                if intended >= run.measure_perf:
                    self.scheduled += 1
                with self.lock:
                    free = self.idle > 0
                    if free:
                        self.idle -= 1
                if free:
                    self.queue.put((number, intended))
                else:  # every client of the process is busy: the cap is reached
                    self.drops.append(intended)
        finally:
            for _ in range(self.workers):
                self.queue.put(None)

    def release(self) -> None:
        with self.lock:
            self.idle += 1

    def serve(self, slot: ClientSlot, driver: Driver) -> None:
        """One client of an open-loop step: each request this dispatcher hands it, sent
        at once; its outcome recorded with its response and service times."""
        run, assignment = self.run, slot.assignment
        operation, index = assignment.operation, assignment.index
        context = run.plan.side_context(run.context, assignment.side)
        record, get = slot.records.append, self.queue.get
        while (item := get()) is not None:
            number, intended = item
            began, finished, moved, error = send(slot, driver, operation, index, number,
                                                 context)
            if slot.hung:
                return  # counted as such; its place in the cap stays taken
            record((finished, finished - intended, moved, error, finished - began))
            self.release()

    def collect(self, accumulator: SideAccumulator) -> None:
        """The drops so far and the window's scheduled count into ``accumulator``
        (the coordinator's thread)."""
        open_loop = accumulator.open = accumulator.open or OpenLoopAccumulator()
        drops, measure_perf = self.drops, self.run.measure_perf
        for _ in range(len(drops)):
            if drops.popleft() >= measure_perf:
                open_loop.dropped += 1
        open_loop.scheduled = self.scheduled


def record_open(accumulator: SideAccumulator, outcomes, start_perf: float,
                measure_perf: float, end_perf: float) -> None:
    """Open-loop outcomes ``(finished, response, bytes, error, service)`` into
    ``accumulator``: those of the drain only counted as such."""
    open_loop = accumulator.open = accumulator.open or OpenLoopAccumulator()
    for finished, response, moved, error, service in outcomes:
        if finished > end_perf:
            accumulator.drain_operations += 1
            continue
        counted = finished >= measure_perf
        accumulator.record(finished - start_perf, response, moved, error, counted)
        if counted:
            open_loop.record(response, service, error is None)
