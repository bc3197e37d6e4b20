"""Open-loop steps on the memory driver: the schedule, the cap, and latency that is
honest about a stall (no coordinated omission).

Assertions are on counts and proportions with wide bounds, never on this machine's
speed: a stall of S seconds at R requests/s must show about R*S slow requests in the
open loop, and one per client in the closed loop.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from hdrh.histogram import HdrHistogram

from pytest_storagescale.drivers import memory
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.open_loop import intended_times
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan
from pytest_storagescale.load.stats import SideResult

STORE = "open-loop"


@pytest.fixture
def spec():
    def make(**options: str):
        return driver_spec(f"memory://{STORE}/area", writable_root="/area", options=options)

    yield make
    memory.resume(STORE)
    memory.release_hangs()
    memory.clear_stores()


def plan(driver, operation: str = "stat", **overrides) -> StepPlan:
    values = dict(operation=get_operation(operation), clients=50, duration=2.0, warmup=0.0,
                  hang_timeout=10.0, driver=driver, workdir="/area/step", arrival_rate=50.0)
    values.update(overrides)
    return StepPlan(**values)


def slower_than(side: SideResult, seconds: float) -> int:
    """How many succeeded requests of ``side`` had a response time above ``seconds``."""
    histogram = HdrHistogram.decode(side.histogram.encode("ascii"))
    return sum(item.count_at_value_iterated_to for item in histogram.get_recorded_iterator()
               if item.value_iterated_to > seconds * 1e6)


def stall_after(requests: int, seconds: float) -> threading.Thread:
    """Stall the store for ``seconds`` once it has received ``requests`` (a server that
    stops answering mid-window), from a thread of the test."""
    def run() -> None:
        deadline = time.monotonic() + 60
        while memory.served_requests(STORE) < requests and time.monotonic() < deadline:
            time.sleep(0.005)
        memory.stall(STORE)
        time.sleep(seconds)
        memory.resume(STORE)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_schedule_is_kept_and_everything_sent_is_counted(spec):
    step = plan(spec(latency="0.002"), warmup=0.5, duration=2.0, arrival_rate=40.0)
    result = run_step(step)
    total = result.total
    assert total.offered_hz == 40.0 and total.open_loop is not None
    assert total.open_loop.scheduled == 80  # 40/s over the 2 s window, none dropped
    assert total.dropped == 0 and total.failed == total.hung == 0
    reported = (total.warmup_operations + total.succeeded + total.failed
                + total.drain_operations)
    assert memory.served_requests(STORE) == reported == 20 + 80  # warm-up + window
    record = total.to_json()
    for key in ("offered_hz", "achieved_hz", "dropped", "late", "latency_s",
                "service_latency_s", "warmup_operations"):
        assert key in record
    assert SideResult.from_json(record).open_loop == total.open_loop


def test_a_stall_shows_as_rate_times_stall_slow_requests_in_the_open_loop_only(spec):
    """Coordinated omission corrected: the same stall of S seconds shows about R*S slow
    requests, their response times spread up to S, in the open loop; one per client in
    the closed loop (which stops sending while the storage stalls)."""
    rate, stall, clients = 40.0, 1.5, 4
    stalled = stall_after(20, stall)  # half a second into the window
    open_total = run_step(plan(spec(latency="0.002"), arrival_rate=rate, duration=3.0,
                               clients=200)).total
    stalled.join()
    memory.clear_stores()
    stalled = stall_after(20, stall)
    closed_total = run_step(plan(spec(latency="0.002"), arrival_rate=0.0, clients=clients,
                                 duration=3.0)).total
    stalled.join()

    expected = rate * stall  # 60 requests arrived while the storage did not answer
    slow_open = slower_than(open_total, 0.1)
    assert 0.5 * expected <= slow_open <= 2.5 * expected
    # spread from little to the whole stall: as many above S/2 as between 0.1 s and S/2,
    # give or take (uniform arrivals over the stall)
    late_half = slower_than(open_total, stall / 2)
    assert 0.2 * slow_open <= late_half <= 0.8 * slow_open
    assert open_total.latency_s["max"] >= 0.8 * stall
    assert open_total.dropped == 0 and open_total.hung == 0
    # the closed loop: each client's one request in flight, however long the stall
    assert 1 <= slower_than(closed_total, 0.1) <= clients
    assert slow_open > 5 * clients


def test_requests_beyond_the_cap_are_dropped_not_sent_late(spec):
    rate, stall = 40.0, 1.0
    stalled = stall_after(10, stall)
    total = run_step(plan(spec(latency="0.002"), arrival_rate=rate, clients=3,
                          duration=2.5)).total
    stalled.join()
    # the 3 clients are stuck in the stall: the rest of its arrivals are dropped
    assert 0.4 * rate * stall <= total.dropped <= 2.5 * rate * stall
    assert total.succeeded + total.failed + total.dropped + total.hung \
        <= total.open_loop.scheduled


def test_client_processes_share_one_schedule(spec):
    """Each process sends its share (request k when k % C is one of its clients): the
    processes together send the schedule once, not once each."""
    total = run_step(plan(spec(), "mkdir", arrival_rate=30.0, clients=6, duration=2.0),
                     executor="processes").total
    assert total.open_loop.scheduled == 60
    assert total.succeeded + total.failed + total.dropped == 60


def test_poisson_arrivals_have_the_rate_on_average_and_one_sequence_per_seed():
    first = list(itertools.islice(intended_times(100.0, "poisson", 0.0, 7), 5000))
    again = list(itertools.islice(intended_times(100.0, "poisson", 0.0, 7), 5000))
    assert first == again  # every process of a step draws the same schedule
    assert 45 <= first[-1] <= 55  # 5000 arrivals at 100/s: about 50 s
    gaps = [b - a for a, b in itertools.pairwise(first)]
    assert len(set(gaps)) > 4000  # not constant
    constant = list(itertools.islice(intended_times(100.0, "constant", 1.0, 7), 3))
    assert constant == [1.0, 1.01, 1.02]
