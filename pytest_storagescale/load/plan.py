"""A step as data: what to run (:class:`StepPlan`) with what the test gives its
operation (:class:`StepContext`), when (:class:`StepClock`), which client runs which
side (:class:`ClientAssignment`), and how far it got (:class:`StepProgress`). All
picklable: spawned client processes get copies (an operation that is
:attr:`~.operations.Operation.in_process` may be given more, and never leaves the
process).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .operations import StepContext

if TYPE_CHECKING:  # the engine is imported by config.py: keep this module light
    from ..drivers.spec import DriverSpec
    from .operations import Operation

__all__ = ["ARRIVALS", "ClientAssignment", "StepClock", "StepContext", "StepPlan",
           "StepProgress"]

#: the schedules an open-loop step may follow (``StepPlan.arrivals``)
ARRIVALS = ("constant", "poisson")
#: a client's native request timeout is this much longer than hang_timeout, so that
#: a stuck request is counted as a hang by the engine rather than as a client error
NATIVE_TIMEOUT_MARGIN = 5.0


@dataclass(frozen=True)
class StepPlan:
    """Everything a step needs."""

    operation: Operation
    clients: int
    duration: float
    warmup: float
    hang_timeout: float
    #: the endpoint's driver; its writable root is the run's directory
    driver: DriverSpec
    #: the step's own directory on the storage (removed afterwards)
    workdir: str
    params: dict[str, Any] = field(default_factory=dict)
    #: the step does this many operations, then ends (0: run for the duration)
    max_operations: int = 0
    #: processes for the ``processes`` executor (0: one per core, at least 2, and
    #: enough for ``clients_per_process``)
    processes: int = 0
    #: the most clients one process runs (0: the driver class's ``clients_per_process``)
    clients_per_process: int = 0
    #: an open-loop step: requests per second sent at their scheduled times whatever the
    #: others do (0: the closed loop); ``clients`` is then the cap on requests in flight
    #: (``max_in_flight``)
    arrival_rate: float = 0.0
    #: the open loop's schedule: ``constant`` (every 1/rate s) or ``poisson`` (random
    #: gaps of mean 1/rate s, the same sequence in every process of the step)
    arrivals: str = "constant"
    #: what the test gives the operation (doors by name, extra data)
    step: StepContext = field(default_factory=StepContext)

    @property
    def open_loop(self) -> bool:
        return self.arrival_rate > 0

    @property
    def client_timeout(self) -> float:
        """The timeout a load client's driver gets."""
        return self.hang_timeout + NATIVE_TIMEOUT_MARGIN

    def assignments(self) -> list[ClientAssignment]:
        """Client 0..C-1 of every side, numbered across the sides."""
        assignments: list[ClientAssignment] = []
        for side, operation, count in self.operation.groups(self.clients):
            for _ in range(count):
                assignments.append(ClientAssignment(len(assignments), side, operation))
        return assignments

    def side_context(self, context: dict[str, Any], side: str) -> dict[str, Any]:
        """What ``prepare`` returned for ``side`` (a composite keeps one per side)."""
        return context[side] if self.operation.sides else context

    def clock(self, start_at: float) -> StepClock:
        measure_from = start_at + self.warmup
        end_at = measure_from + self.duration
        seconds = math.ceil(self.warmup + self.duration + self.hang_timeout) + 2
        return StepClock(start_at, measure_from, end_at, seconds)


@dataclass(frozen=True)
class ClientAssignment:
    """Client ``index`` runs ``operation`` for ``side`` (a mixed step's sides are get
    and put)."""

    index: int
    side: str
    operation: Operation


@dataclass(frozen=True)
class StepClock:
    """The step's timeline in wall-clock seconds (see the engine's docstring)."""

    start_at: float
    measure_from: float
    end_at: float
    #: length of the per-second timeline: warm-up, duration, drain and slack
    seconds: int


@dataclass(frozen=True)
class StepProgress:
    """A running step, reported about once a second."""

    operation: str
    clients: int
    elapsed_s: float
    total_s: float
    #: completions in the last whole second
    rate_hz: float
    succeeded: int
    failed: int
    hung: int
