"""What one client thread of a step and its coordinator share, below both loops: the
client's slot (:class:`ClientSlot`), the step's shared state in this process
(:class:`StepRun`) and one request sent and timed (:func:`send`).

The closed loop (:mod:`.clients`) and the open loop (:mod:`.open_loop`) both build on
this module; :class:`StepRun` knows the open loop's dispatcher only as
:class:`Dispatching`, so that neither loop imports the other's caller (the layers
contract of ``load/`` in pyproject.toml forbids it).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .plan import ClientAssignment, StepClock, StepPlan

if TYPE_CHECKING:
    from ..drivers.base import CompiledLoop, Driver
    from .operations import Operation
    from .stats import SideAccumulator


class Dispatching(Protocol):
    """An open-loop step's dispatcher in this process
    (:class:`~.open_loop.Dispatcher`), as the clients and their coordinator use it."""

    def start(self) -> None:
        """Begin handing out this process's share of the schedule."""

    def serve(self, slot: ClientSlot, driver: Driver) -> None:
        """One client: each request handed to it, sent at once, until the end."""

    def collect(self, accumulator: SideAccumulator) -> None:
        """The drops so far and the scheduled count into ``accumulator``."""

class ClientSlot:
    """What the coordinator sees of one client thread."""

    __slots__ = ("assignment", "busy_since", "hung", "done", "ready", "records", "loop",
                 "background", "started", "counters")

    def __init__(self, assignment: ClientAssignment) -> None:
        self.assignment = assignment
        #: perf_counter() when the current request began; None between requests
        self.busy_since: float | None = None
        self.hung = False
        self.done = False
        #: logged in (or failed to), waiting for the start
        self.ready = False
        self.records: collections.deque = collections.deque()
        #: the driver's compiled loop making its requests (None: the Python loop)
        self.loop: CompiledLoop | None = None
        #: the loop runs on its own (BackgroundLoop): the coordinator drains and
        #: watches it, not this slot's records and busy_since
        self.background = False
        #: its thread was started
        self.started = False
        #: the driver's own counts when the client ended (Driver.counters: redirects...),
        #: until the coordinator adds them to its side
        self.counters: dict[str, float] | None = None

    def in_flight_since(self) -> float | None:
        """When the client's request in flight began (perf_counter), None between."""
        return self.loop.busy_since() if self.background else self.busy_since  # type: ignore[union-attr]


class StepRun:
    """What every client thread of the process shares: plan, context, the step's
    clock in ``perf_counter`` time (once set), the stop signal and the count bound."""

    def __init__(self, plan: StepPlan, context: dict[str, Any], max_operations: int) -> None:
        self.plan = plan
        self.context = context
        self.clock: StepClock = plan.clock(0.0)  # a placeholder until set_clock
        self.start_perf = self.measure_perf = self.end_perf = 0.0
        #: set with the clock: the clients may go on to the start
        self.clock_set = threading.Event()
        self.stop = threading.Event()
        #: an open-loop step's dispatcher in this process (None: the closed loop)
        self.dispatcher: Dispatching | None = None
        #: a count bound: a compiled loop is asked for one request at a time
        self.bounded = bool(max_operations)
        if max_operations:
            # numbered operations handed out; next() on an itertools.count is atomic
            tickets = itertools.count().__next__
            self.take: Callable[[], bool] = lambda: tickets() < max_operations
        else:
            self.take = lambda: True

    def set_clock(self, clock: StepClock) -> None:
        self.clock = clock
        # clients time with perf_counter (cheap, monotonic); the step's clock is wall time
        offset = time.time() - time.perf_counter()
        self.start_perf = clock.start_at - offset
        self.measure_perf = clock.measure_from - offset
        self.end_perf = clock.end_at - offset
        self.clock_set.set()

    def wait_for_start(self) -> None:
        self.clock_set.wait()  # every way out of the login phase sets the clock
        # a wait may wake a hair early by the wall clock, which the step's clock is in
        while (delay := self.clock.start_at - time.time()) > 0 and not self.stop.is_set():
            self.stop.wait(delay)


def send(slot: ClientSlot, driver: Driver, operation: Operation, index: int, number: int,
         context: dict[str, Any]) -> tuple[float, float, int, BaseException | None]:
    """One request of client ``index``: the operation's untimed ``before``, then its
    timed ``run``; when it was sent and ended (``perf_counter``), bytes moved and its
    error. ``slot.busy_since`` covers both (a hang in the set-up is still a hang)."""
    perf_counter = time.perf_counter
    slot.busy_since = began = perf_counter()
    error: BaseException | None = None
    moved = 0
    try:
        operation.before(driver, index, number, context)
        began = perf_counter()
        moved = operation.run(driver, index, number, context)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure is a measurement
        # (SystemExit or pytest.fail from an operation too: never a lost step)
        error = exc
    finished = perf_counter()
    slot.busy_since = None
    return began, finished, moved, error

