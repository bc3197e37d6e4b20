"""The load engine on the memory driver: fast, and no assertion on speed.

Every step here is bounded (a few seconds at most); the bounds asserted on elapsed
time carry several seconds of slack for a loaded 2-core machine. Faults (failures,
hangs) come from the memory driver's options, so each test knows exactly which
request of which client fails or hangs.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time

import pytest

from pytest_storagescale.drivers import memory
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.spec import DriverSpec
from pytest_storagescale.errors import StorageError
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.executors import EXECUTORS
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan, StepProgress
from pytest_storagescale.load.stats import SideResult, StepResult, sides_from_json

#: what a loaded CI machine may add to a step's own bound (thread and process start)
SLACK = 8.0


@pytest.fixture
def spec(request):
    """A memory endpoint of this test's own; options via ``spec(**options)``."""
    store = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[-60:]

    def make(**options: str) -> DriverSpec:
        return driver_spec(f"memory://{store}/area", writable_root="/area", options=options)

    yield make
    memory.release_hangs()
    memory.clear_stores()


def plan(driver: DriverSpec, operation: str = "stat", **overrides) -> StepPlan:
    values = dict(operation=get_operation(operation), clients=4, duration=1.0, warmup=0.0,
                  hang_timeout=1.0, driver=driver, workdir="/area/step")
    values.update(overrides)
    return StepPlan(**values)


def timed(step: StepPlan, **kwargs) -> tuple[StepResult, float]:
    began = time.monotonic()
    result = run_step(step, **kwargs)
    return result, time.monotonic() - began


def test_executor_names():
    assert tuple(EXECUTORS) == ("threads", "processes", "auto")
    with pytest.raises(ValueError, match="unknown executor 'fibers'; executors: threads"):
        run_step(plan(driver_spec("memory://x/area", writable_root="/area")), executor="fibers")


def test_clients_repeat_the_operation_and_report_progress(spec):
    states: list[StepProgress] = []
    result, _ = timed(plan(spec(), duration=1.5), progress=states.append)
    step = result.total
    assert (result.operation, result.clients) == ("stat", 4)
    assert step.succeeded > 4 and step.failed == step.hung == 0
    assert sum(step.timeline["completions"]) == step.succeeded  # no warm-up
    assert states and all(isinstance(s, StepProgress) and s.operation == "stat" for s in states)
    assert max(s.succeeded for s in states) > 0
    assert result.cleanup_error is None


def test_hung_clients_are_counted_and_the_step_ends_by_end_plus_hang_timeout(spec):
    # each client answers its first 2 requests, then hangs: the hangs are found in
    # the drain, after end_at
    step = plan(spec(hang_after="2"), duration=1.0, hang_timeout=2.0)
    result, elapsed = timed(step)
    total = result.total
    assert total.hung == 4 and 0 < total.succeeded <= 8 and total.failed == 0
    assert max(total.timeline["hung"]) == 4
    assert elapsed < step.warmup + step.duration + step.hang_timeout + SLACK


def test_a_hang_inside_the_measurement_is_found_after_hang_timeout(spec):
    step = plan(spec(hang_after="0"), clients=3, duration=3.0, hang_timeout=0.5)
    result, elapsed = timed(step)
    assert result.total.hung == 3 and result.total.succeeded == 0
    # found within the measured seconds: the timeline says so before end_at
    assert max(result.total.timeline["hung"][:3]) == 3
    assert elapsed < step.duration + step.hang_timeout + SLACK


def test_hung_step_makes_the_driver_forget_its_connections(spec):
    class Counting(memory.MemoryDriver):
        forgotten = 0

        @classmethod
        def forget_connections(cls) -> None:
            cls.forgotten += 1

    base = spec()
    clean = DriverSpec(Counting, base.endpoint_url, "/area")
    run_step(plan(clean, clients=2, duration=0.3))
    assert Counting.forgotten == 0
    hanging = DriverSpec(Counting, base.endpoint_url, "/area", {"hang_after": "1"})
    run_step(plan(hanging, clients=2, duration=0.3, hang_timeout=0.3))
    assert Counting.forgotten == 1


def test_the_drain_lets_requests_finish_without_counting_them(spec):
    # 0.3 s per request: at most 3 finish inside a 1 s measurement per client; the
    # one in flight at end_at finishes in the drain, uncounted and not hung
    step = plan(spec(latency="0.3"), clients=2, duration=1.0, hang_timeout=5.0)
    result, elapsed = timed(step)
    total = result.total
    assert total.hung == 0 and total.failed == 0
    assert 0 < total.succeeded <= 2 * 3
    assert sum(total.timeline["completions"]) == total.succeeded
    # the drain ended when the clients did, not after hang_timeout... on a machine
    # that is not stalled for seconds; the bound below holds either way
    assert elapsed < step.duration + step.hang_timeout + SLACK


def test_count_bounded_step_does_exactly_its_operations_and_ends_early(spec):
    step = plan(spec(), clients=4, duration=60.0, max_operations=50)
    result, elapsed = timed(step)
    assert result.total.succeeded == 50 and result.total.failed == 0
    assert elapsed < 30 and result.duration_s < 30  # measured until the count was reached
    assert result.total.rate_hz == pytest.approx(50 / result.duration_s)


def test_operations_finished_in_the_warmup_are_not_counted(spec):
    # a count bound reached within the warm-up: every operation ran, none counted
    result, _ = timed(plan(spec(), clients=2, warmup=3.0, max_operations=6))
    total = result.total
    assert total.succeeded == 0 and total.failed == 0
    assert sum(total.timeline["completions"]) == 6


def test_warmup_seconds_are_in_the_timeline_only(spec):
    result, _ = timed(plan(spec(), clients=2, warmup=1.0, duration=1.0))
    total = result.total
    completions = total.timeline["completions"]
    assert completions[0] > 0  # second 0 is the warm-up
    assert 0 < total.succeeded < sum(completions)


def test_failures_are_counted_by_error_class(spec):
    # one client, numbered requests: numbers 3, 7, ..., 39 fail
    result, _ = timed(plan(spec(fail_every="4"), clients=1, duration=60.0, max_operations=40))
    total = result.total
    assert (total.succeeded, total.failed) == (30, 10)
    assert total.errors == {"injected": 10}
    assert "injected failure (fail_every=4)" in total.error_examples["injected"]
    assert total.error_ratio == pytest.approx(0.25)


def test_a_client_that_cannot_start_is_a_counted_failure(spec):
    class Refusing(memory.MemoryDriver):
        def __init__(self, endpoint, **kwargs) -> None:
            super().__init__(endpoint, **kwargs)
            if self.client_id.startswith("client-"):
                raise StorageError("login refused", driver="memory", endpoint="memory://",
                                   operation="login", path="/", error_class="login")

    driver = DriverSpec(Refusing, spec().endpoint_url, "/area")
    result, _ = timed(plan(driver, clients=3, warmup=0.5, duration=0.5))
    assert result.total.failed == 3 and result.total.errors == {"login": 3}


def test_clients_log_in_before_the_clock_starts(spec):
    """Logins of different lengths all end before the step's start, and the
    measurement begins with every client connected."""
    class Logging(memory.MemoryDriver):
        logged_in: list[float] = []

        def connect(self) -> None:
            time.sleep(0.3 * int(self.client_id.split("-")[-1]))
            Logging.logged_in.append(time.time())

    driver = DriverSpec(Logging, spec().endpoint_url, "/area")
    # the login phase lasts until every client is in, at most hang_timeout: 5 s is far
    # beyond the 0.9 s the slowest login takes, however loaded the machine
    result, _ = timed(plan(driver, clients=4, duration=1.0, hang_timeout=5.0))
    assert len(Logging.logged_in) == 4
    assert max(Logging.logged_in) <= result.started
    assert result.total.timeline["completions"][0] > 0 and result.total.failed == 0


def test_client_processes_log_in_before_the_common_clock(spec):
    # 1.5 s logins in both processes: had they run inside the clock, the 1 s step
    # would have measured nothing
    step = plan(spec(login_latency="1.5"), "put", clients=4, duration=1.0, hang_timeout=5.0,
                processes=2, params={"file_size": 1000})
    result, elapsed = timed(step, executor="processes")
    total = result.total
    assert elapsed >= 1.5
    assert total.succeeded > 0 and total.failed == total.hung == 0
    assert total.timeline["completions"][0] > 0


def test_a_login_stuck_for_hang_timeout_is_a_hung_client(spec):
    class Stuck(memory.MemoryDriver):
        def connect(self) -> None:
            if self.client_id == "client-0":
                self._release.wait(30)  # until the client is closed or given up

    driver = DriverSpec(Stuck, spec().endpoint_url, "/area")
    step = plan(driver, clients=2, duration=1.0, hang_timeout=1.0)
    result, elapsed = timed(step)
    assert result.total.hung == 1 and result.total.succeeded > 0
    # the login phase waited hang_timeout, then the step ran on time
    assert elapsed < step.hang_timeout + step.duration + step.hang_timeout + SLACK


def test_a_failed_login_is_measured_by_the_first_request(spec):
    class Flaky(memory.MemoryDriver):
        def connect(self) -> None:
            raise StorageError("login dropped", driver="memory", endpoint="memory://",
                               operation="login", path="/", error_class="unreachable")

    driver = DriverSpec(Flaky, spec().endpoint_url, "/area")
    result, _ = timed(plan(driver, clients=2, duration=0.5))
    assert result.total.failed == 0 and result.total.succeeded > 0  # the requests connect


def test_a_mixed_step_merges_its_sides(spec):
    step = plan(spec(), "mixed", clients=2, duration=1.0,
                params={"file_size": 1000, "files": 2})
    result, _ = timed(step)
    readers, writers = result.sides["readers"], result.sides["writers"]
    total = result.total
    assert readers.clients == writers.clients == 2 and total.clients == 4
    assert readers.succeeded > 0 and writers.succeeded > 0
    assert total.succeeded == readers.succeeded + writers.succeeded
    assert total.bytes == readers.bytes + writers.bytes == 1000 * total.succeeded
    assert total.failed == total.hung == 0
    # the merged histogram holds every side's latencies
    assert total.latency_s["max"] == pytest.approx(
        max(readers.latency_s["max"], writers.latency_s["max"]), rel=0.01)


def test_processes_executor_merges_all_clients(spec):
    states: list[StepProgress] = []
    step = plan(spec(), "put", clients=4, duration=1.5, processes=2,
                params={"file_size": 1000})
    result, elapsed = timed(step, executor="processes", progress=states.append)
    total = result.total
    assert total.succeeded > 4 and total.failed == total.hung == 0
    assert total.bytes == 1000 * total.succeeded
    assert sum(result.sides["put"].timeline["completions"]) == total.succeeded
    assert states and all(s.operation == "put" and s.clients == 4 for s in states)
    assert elapsed < step.duration + SLACK + 10  # spawning Python processes


class DiesInClientProcesses(memory.MemoryDriver):
    """Logs in fine here; a spawned client process dies at its first login."""

    def connect(self) -> None:
        if multiprocessing.parent_process() is not None:
            os._exit(3)
        super().connect()


def test_a_client_process_that_dies_while_starting_is_named_with_its_exit(spec):
    base = spec()
    dying = DriverSpec(DiesInClientProcesses, base.endpoint_url, "/area")
    began = time.monotonic()
    with pytest.raises(StorageError, match=r"client process \d+ exited while starting "
                                           r"\(exit code 3;.*try --storage-executor threads"):
        run_step(plan(dying, "stat", clients=2, processes=2), executor="processes")
    # known at once, not after the start timeout
    assert time.monotonic() - began < 60


def test_processes_executor_counts_hung_clients_and_ends_on_time(spec):
    step = plan(spec(hang_after="1", fault_operations="put"), "put", clients=4, duration=1.0,
                hang_timeout=1.0, processes=2, params={"file_size": 100})
    result, elapsed = timed(step, executor="processes")
    assert result.total.hung == 4 and result.total.succeeded == 4
    assert elapsed < step.duration + step.hang_timeout + SLACK + 10


def test_processes_executor_splits_a_count_bound(spec):
    step = plan(spec(), "put", clients=4, duration=60.0, processes=2, max_operations=21,
                params={"file_size": 100})
    result, elapsed = timed(step, executor="processes")
    # each process does its share, rounded up: at least the bound
    assert 21 <= result.total.succeeded <= 22
    assert elapsed < 40


def test_side_results_read_back_from_json(spec):
    result, _ = timed(plan(spec(), "mixed", clients=1, duration=0.5,
                           params={"file_size": 100, "files": 1}))
    for side in result.sides.values():
        again = SideResult.from_json(side.to_json())
        assert again.to_json() == side.to_json()
    # the previous release's records: sides under "sides", or one side at the top level
    mixed = {"operation": "mixed", "sides": {k: v.to_json() for k, v in result.sides.items()}}
    assert set(sides_from_json(mixed)) == {"readers", "writers"}
    plain = {"op": "ls", "operation": "ls", "clients": 3, "duration_s": 2.0, "succeeded": 10,
             "failed": 1, "hung": 0, "bytes": 0, "rate_hz": 5.0,
             "latency_s": {"mean": 0.1, "p50": None}, "errors": {"timeout": 1}}
    side = sides_from_json(plain)["ls"]
    assert side.rate_hz == 5.0 and side.errors == {"timeout": 1}
    assert side.latency_s["mean"] == 0.1 and side.latency_s["p50"] != side.latency_s["p50"]


@pytest.mark.parametrize("asked", ["threads", "auto"])
def test_an_operation_that_changes_the_whole_process_runs_in_client_processes(
        spec, monkeypatch, asked):
    """``auth`` shortens the XRootD client's idle-connection TTL for its process (with
    which the 5.5.3 client can deadlock it): its clients never run in pytest's process,
    whatever executor was asked for."""
    from pytest_storagescale.load import engine
    from pytest_storagescale.load.operations import Stat

    class ProcessWide(Stat):
        own_processes = True

    used = []

    def recorder(name):
        def execute(*args):  # recorded, then run in threads (ProcessWide is not picklable)
            used.append(name)
            return EXECUTORS["threads"](*args)
        return execute

    monkeypatch.setattr(engine, "EXECUTORS", {name: recorder(name) for name in EXECUTORS})
    assert get_operation("auth").own_processes and not get_operation("stat").own_processes
    plain = plan(spec(), clients=1, duration=0.3)
    run_step(plain, executor=asked)
    run_step(dataclasses.replace(plain, operation=ProcessWide()), executor=asked)
    assert used == [asked, "processes"]


def test_a_time_bounded_step_ticks_at_the_measure_tick(spec, monkeypatch):
    """While a time-bounded step runs, the coordinator looks at its clients every
    MEASURE_TICK (each tick visits every client: at 5,000 clients ten a second cost a
    fifth of a core); a count-bounded step looks every HANG_CHECK_INTERVAL whether its
    count is done, and the drains twice as often."""
    from pytest_storagescale.load import clients

    intervals: list[list[float]] = []
    real = clients.Coordinator.run_until

    def recording(self, deadline, finished, interval) -> None:
        intervals[-1].append(interval)
        real(self, deadline, finished, interval)

    monkeypatch.setattr(clients.Coordinator, "run_until", recording)
    for bound in ({}, {"max_operations": 20}):
        intervals.append([])
        run_step(plan(spec(), clients=2, duration=1.0, **bound))
    timed, counted = intervals
    assert timed == [0.5, 0.5, 0.05], timed  # warm-up, measurement, drain
    assert counted == [0.1, 0.1, 0.05], counted


@pytest.mark.parametrize("raised", ["SystemExit", "Failed"])
def test_an_operation_raising_a_base_exception_is_a_counted_failure(spec, raised):
    """A SystemExit (a library's exit()) or pytest.fail from an operation is no
    Exception: it ended its client's thread unrecorded, and the step measured nothing.
    Every exception but Ctrl-C is a counted failure of its class."""
    class Exiting(memory.MemoryDriver):
        calls = 0

        def _stat(self, path):
            if self._load_client:
                self.calls += 1
                if self.calls % 2 == 0 and raised == "SystemExit":
                    raise SystemExit("a client library called exit()")
                if self.calls % 2 == 0:
                    pytest.fail("an operation called pytest.fail")
            return super()._stat(path)

    driver = DriverSpec(Exiting, spec().endpoint_url, "/area")
    result, _ = timed(plan(driver, clients=1, duration=60.0, max_operations=10))
    assert (result.total.succeeded, result.total.failed) == (5, 5)
    assert result.total.errors == {raised: 5}


@pytest.mark.parametrize("latency", ["0", "0.02"])
def test_everything_the_storage_served_is_counted(spec, latency):
    """No unmeasured load: the clients stop issuing at the window's end, so the store's
    own count of requests is warm-up + window + drain as the step reports them (before,
    they went on until the coordinator's next tick, uncounted)."""
    endpoint = spec(latency=latency)
    store = endpoint.endpoint_url.split("/")[2]
    result, _ = timed(plan(endpoint, clients=4, warmup=0.5, duration=1.0))
    total = result.total
    reported = (total.warmup_operations + total.succeeded + total.failed
                + total.drain_operations)
    assert total.warmup_operations > 0 and total.succeeded > 0
    assert memory.served_requests(store) == reported
    # and none began after the end: the drain holds at most the one in flight per client
    assert total.drain_operations <= 4
    assert total.to_json()["warmup_operations"] == total.warmup_operations
