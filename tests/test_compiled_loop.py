"""The xrootd driver's compiled client loop (drivers/native), against a real xrootd:
it makes the clients' stat and get requests, each failure is the error the driver's
own request raises, its clock is the engine's, and a step falls back to the Python
loop when it is asked to or cannot have it. Two ways: calls of a batch (``run``: get,
and count-bounded steps) and stat on its own in the background (``start``/``take``,
XrdCl's threads issuing each request), each with the engine's side scripted.

The speed it buys is measured in benchmarks/bench_engine.py, not here."""

from __future__ import annotations

import functools
import itertools
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from plans import REPO

from pytest_storagescale.drivers import native
from pytest_storagescale.drivers.base import CompiledOutcome, RequestWalk
from pytest_storagescale.drivers.grid import XROOTD_EVENT_LOOPS, XROOTD_SHARD_EVENT_LOOPS
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.xrootd import XRootDDriver, _CompiledLoop
from pytest_storagescale.errors import StorageNotFound, StorageScaleUsageError
from pytest_storagescale.load import clients
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.executors import run_threads as clients_run_threads
from pytest_storagescale.load.operations import Get, Stat, get_operation
from pytest_storagescale.load.plan import StepPlan

pytestmark = pytest.mark.integration


@pytest.fixture
def area(xrootd_area):
    """The test's directory, with a 1,024-byte file ``small``."""
    root, driver = xrootd_area
    driver.put(f"{root}/small", b"x" * 1024)
    return root, driver


def _plan(server, root, operation="stat", loop="compiled", **kw) -> StepPlan:
    values = dict(operation=get_operation(operation), clients=4, duration=1.0, warmup=0.2,
                  hang_timeout=30.0, workdir=f"{root}/step",
                  driver=driver_spec(server.url, writable_root=root,
                                     options={"client_loop": loop}))
    values.update(kw)
    return StepPlan(**values)


@pytest.fixture
def python_requests(monkeypatch):
    """How many stat and get requests the load clients made through the Python driver."""
    counts = {"stat": 0, "get": 0}
    original_stat, original_get = XRootDDriver._server_stat, XRootDDriver._get

    def in_client(kind):
        if threading.current_thread().name.startswith("storagescale-client-"):
            counts[kind] += 1

    def stat(self, path):
        in_client("stat")
        return original_stat(self, path)

    def get(self, path, local_path):
        in_client("get")
        return original_get(self, path, local_path)

    monkeypatch.setattr(XRootDDriver, "_server_stat", stat)
    monkeypatch.setattr(XRootDDriver, "_get", get)
    return counts


@pytest.mark.parametrize("operation", ["stat", "get"])
def test_the_compiled_loop_makes_the_clients_requests(area, embedded_xrootd, python_requests,
                                                      operation):
    root, _ = area
    params = {"file_size": 100_000, "files": 3} if operation == "get" else {}
    compiled = run_step(_plan(embedded_xrootd, root, operation, params=params),
                        executor="threads")
    assert python_requests[operation] == 0  # none through the bindings
    step = compiled.total
    assert step.succeeded > 0 and step.failed == 0 and step.hung == 0, step.errors
    assert compiled.client.compiled_clients == 4  # what the results say
    assert step.latency_s["p50"] > 0
    if operation == "get":
        assert step.bytes == step.succeeded * 100_000
    python = run_step(_plan(embedded_xrootd, root, operation, "python", params=params),
                      executor="threads")
    assert python.total.succeeded > 0 and python.client.compiled_clients == 0
    assert python_requests[operation] >= python.total.succeeded  # the drain's are not counted


def test_the_compiled_loop_runs_in_client_processes(area, embedded_xrootd):
    root, _ = area
    plan = _plan(embedded_xrootd, root, "get", clients=6, processes=2,
                 params={"file_size": 50_000, "files": 3})
    result = run_step(plan, executor="processes")
    step = result.total
    assert step.succeeded > 0 and step.failed == 0, step.errors
    assert step.bytes == step.succeeded * 50_000
    # every client of both processes ran the compiled loop (none fell back silently)
    assert (result.client.processes, result.client.compiled_clients) == (2, 6)


def test_a_failure_is_the_drivers_own_error(area, embedded_xrootd):
    """A missing file: the compiled loop's failure is the error (class, kind, path,
    native status) the driver's own stat raises, and the loop stops at it."""
    root, driver = area
    client = driver_spec(embedded_xrootd.url, writable_root=root).client(0, timeout=10)
    missing = f"{root}/missing"
    with pytest.raises(StorageNotFound) as raised:
        client.stat(missing)
    loop = client.compiled_loop(RequestWalk("stat", (f"{root}/small", missing), step=1))
    assert loop is not None
    try:
        outcomes = loop.run(0, 10, time.perf_counter() + 5)
    finally:
        loop.close()
    assert [o.error is None for o in outcomes] == [True, False]  # stopped at the failure
    error = outcomes[1].error
    assert type(error) is StorageNotFound
    assert (error.error_class, error.path, error.operation) == (
        raised.value.error_class, missing, "stat")
    assert error.native_status == raised.value.native_status
    assert error.message == raised.value.message  # the server's own text included
    assert "No such file" in error.message or "no such file" in error.message.lower()


def test_each_client_walks_its_own_files(area, embedded_xrootd):
    """Client 1 of 2 over 3 files reads file (1 + 2 i) % 3 at request i, as
    ``Get.run`` does: with file 1 missing, requests 0 and 3 fail, 1 and 2 do not."""
    root, driver = area
    files = tuple(f"{root}/f{i}" for i in range(3))
    for path in (files[0], files[2]):
        driver.put(path, b"y" * 10)
    client = driver_spec(embedded_xrootd.url, writable_root=root).client(1, timeout=10)
    loop = client.compiled_loop(RequestWalk("get", files, first=1, step=2, size=10))
    try:
        first = loop.run(0, 10, time.perf_counter() + 5)
        rest = loop.run(1, 10, time.perf_counter() + 5)
    finally:
        loop.close()
    assert [o.error.path for o in first] == [files[1]]
    assert [o.error is None for o in rest] == [True, True, False]
    assert [o.moved for o in rest[:2]] == [10, 10]
    assert rest[2].error.path == files[1]


def test_a_halted_loop_begins_nothing(area, embedded_xrootd):
    root, _ = area
    client = driver_spec(embedded_xrootd.url, writable_root=root).client(0, timeout=10)
    loop = client.compiled_loop(RequestWalk("stat", (f"{root}/small",)))
    try:
        assert len(loop.run(0, 5, time.perf_counter() + 5)) >= 1
        loop.halt()  # Ctrl-C, from the coordinator's thread
        assert loop.run(5, 5, time.perf_counter() + 5) == []
    finally:
        loop.close()


def test_a_get_of_the_wrong_size_fails(area, embedded_xrootd):
    root, _ = area
    client = driver_spec(embedded_xrootd.url, writable_root=root).client(0, timeout=10)
    loop = client.compiled_loop(RequestWalk("get", (f"{root}/small",), size=999))
    try:
        (outcome,) = loop.run(0, 1, time.perf_counter())
    finally:
        loop.close()
    assert outcome.moved == 1024
    assert isinstance(outcome.error, ValueError)
    assert "1024 bytes, expected 999" in str(outcome.error)


def test_its_clock_is_the_engines(area, embedded_xrootd):
    """Each request's end is on time.perf_counter's clock (the step's windows are),
    and a call begins no request after ``until``."""
    root, _ = area
    client = driver_spec(embedded_xrootd.url, writable_root=root).client(0, timeout=10)
    loop = client.compiled_loop(RequestWalk("stat", (f"{root}/small",)))
    try:
        batch = clients.COMPILED_BATCH  # what the engine asks a call for
        loop.run(0, batch, time.perf_counter())  # the connection and arrays, untimed
        before = time.perf_counter()
        outcomes = loop.run(0, batch, before + 0.002)
        after = time.perf_counter()
    finally:
        loop.close()
    # local stats take tens of µs each, so 256 would take longer than 2 ms: fewer means
    # the loop stopped beginning them at `until`
    assert 1 <= len(outcomes) < batch
    assert all(before <= o.finished <= after for o in outcomes)
    assert all(o.error is None and o.latency > 0 for o in outcomes)
    assert outcomes[-1].finished - outcomes[-1].latency <= before + 0.002


# -- stat on its own (BackgroundLoop): XrdCl's threads issue each request -------------
def _background(server, root, walk: RequestWalk, index: int = 0, timeout: int = 10):
    client = driver_spec(server.url, writable_root=root).client(index, timeout=timeout)
    loop = client.compiled_loop(walk)
    assert loop is not None and loop.background
    return loop


def test_a_background_loop_keeps_every_request_in_order_with_the_drivers_errors(
        area, embedded_xrootd):
    """Client 1 of 2 over 3 files, file 1 missing: request i stats (1 + 2 i) % 3, so
    requests 0, 3, 6, ... fail with the driver's own error and the loop goes on; after
    the halt, the last request ends and nothing is lost or made twice."""
    root, driver = area
    files = tuple(f"{root}/b{i}" for i in range(3))
    for path in (files[0], files[2]):
        driver.put(path, b"z")
    with pytest.raises(StorageNotFound) as raised:
        driver.stat(files[1])
    loop = _background(embedded_xrootd, root, RequestWalk("stat", files, first=1, step=2),
                       index=1)
    before = time.perf_counter()
    try:
        loop.start()
        time.sleep(0.3)
        outcomes = loop.take()  # while it runs
        loop.halt()
        assert loop.wait_idle(10)
        after = time.perf_counter()
        outcomes += loop.take()
        assert loop.take() == [] and loop.busy_since() is None  # none after the halt
    finally:
        loop.close()
    assert len(outcomes) > 6
    assert [o.error is not None for o in outcomes] == [
        i % 3 == 0 for i in range(len(outcomes))]
    errors = [o.error for o in outcomes if o.error is not None]
    assert {type(e) for e in errors} == {StorageNotFound}
    assert {(e.path, e.message, e.native_status) for e in errors} == {
        (files[1], raised.value.message, raised.value.native_status)}
    # the engine's clock, one request at a time
    assert before <= outcomes[0].finished and outcomes[-1].finished <= after
    assert all(a.finished <= b.finished - b.latency + 1e-6
               for a, b in itertools.pairwise(outcomes))


def test_a_request_given_up_as_hung_is_not_measured(area, embedded_xrootd):
    """A frozen server: the request in flight is given up (abandon) and not measured
    when its answer comes after all, and no request follows it."""
    root, _ = area
    loop = _background(embedded_xrootd, root, RequestWalk("stat", (f"{root}/small",)))
    try:
        loop.start()
        time.sleep(0.1)
        embedded_xrootd.freeze()
        try:
            time.sleep(0.3)  # the request in flight now waits for the frozen server
            before = loop.take()
            since = loop.busy_since()
            assert since is not None and since < time.perf_counter() - 0.2
            assert not loop.abandon(since - 1)  # not the request in flight
            assert loop.abandon(since)
            assert loop.wait_idle(1.0)  # given up: the loop has ended
            assert loop.busy_since() is None
        finally:
            embedded_xrootd.thaw()
        time.sleep(0.5)  # its answer arrives now
        assert loop.take() == []
    finally:
        loop.close()
    assert before and all(o.error is None for o in before)


def test_a_storm_of_fast_failures_pauses_at_the_backlog(area, embedded_xrootd):
    """A missing file answered "not found" at once, never taken: the loop keeps at most
    native.backlog() finished requests and then ends (as at a refusal: the client's
    thread begins it again after a pause), so memory stays flat; one take hands them
    all over with one error object for the repeats, and the loop begins again."""
    root, _ = area
    missing = f"{root}/missing"
    loop = _background(embedded_xrootd, root, RequestWalk("stat", (missing,)))
    try:
        assert loop.start()
        assert loop.wait_idle(60)  # ended by itself: the backlog is full
        assert loop.client.pending() == native.backlog()
        outcomes = loop.take()
        assert loop.client.pending() == 0
        assert loop.start()  # begun again, as the client's thread does after a pause
        deadline = time.monotonic() + 30
        while loop.client.pending() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert loop.client.pending() > 0
        loop.halt()
        assert loop.wait_idle(10)
    finally:
        loop.close()
    assert len(outcomes) == native.backlog()
    errors = {id(o.error): o.error for o in outcomes}
    assert len(errors) == 1
    error = next(iter(errors.values()))
    assert type(error) is StorageNotFound and error.path == missing


class _EndlessClient:
    """A background loop's C side that always has more: 300 waiting when asked, and
    every take finds a full batch (requests finish faster than they are taken)."""

    def __init__(self) -> None:
        self.takes = 0

    def pending(self) -> int:
        return 300

    def take(self, count: int) -> native.Taken:
        self.takes += 1
        assert self.takes < 100, "the take chased the new requests and never returned"
        return native.Taken([1.0] * count, [1e-4] * count, list(range(count)), [0] * count,
                            [], [], "")


def test_a_take_hands_over_what_was_waiting_and_returns():
    loop = object.__new__(_CompiledLoop)  # its C client scripted: no server needed
    loop.walk, loop.client = RequestWalk("stat", ("/a",)), _EndlessClient()
    assert len(loop.take()) == 300 and loop.client.takes == 2  # 256, then the 44 left


def test_a_step_whose_target_vanishes_ends_on_time(area, embedded_xrootd):
    """The stat target removed server-side mid-step: "not found" at once, thousands a
    second. The clients end by the step's end plus hang_timeout (on the step's own
    clock), every failure counted, the memory flat (the take does not hold the
    coordinator, the backlog is bounded)."""
    root, _ = area
    plan = _plan(embedded_xrootd, root, clients=3, duration=3.0, warmup=0.5,
                 hang_timeout=3.0)
    target = embedded_xrootd.directory / "data" / plan.workdir.strip("/") / "stat-target"
    process = psutil.Process()
    rss: list[int] = []

    def progress(seen) -> None:  # the step's own progress, once a second
        rss.append(process.memory_info().rss)
        if seen.elapsed_s >= 1 and target.exists():
            target.unlink()

    late: list[float] = []  # how long after the step's end its clients returned

    def threads(*args):
        clock, *rest = clients_run_threads(*args)
        late.append(time.time() - clock.end_at)
        return clock, *rest

    result = run_step(plan, executor=threads, progress=progress)
    step = result.total
    assert not target.exists() and step.errors.get("not_found", 0) > 0
    assert step.succeeded > 0 and step.failed == step.errors["not_found"]
    # the drain ends by hang_timeout; its last take is one of at most a backlog each
    assert late[0] <= plan.hang_timeout + clients.MEASURE_TICK
    assert max(rss) - rss[0] < 200 * 2**20  # before: 68 -> 826 MB in a minute


def test_client_loop_option_is_checked():
    with pytest.raises(StorageScaleUsageError, match=r"client_loop='fast'.*client_loop=python"):
        driver_spec("root://127.0.0.1:1//data", writable_root="/data",
                    options={"client_loop": "fast"})


def test_only_an_operation_that_says_all_it_does_gets_the_compiled_loop():
    class MyStat(Stat):
        def run(self, driver, client, iteration, context):  # something of its own
            return super().run(driver, client, iteration, context)

    class Before(Get):
        def before(self, driver, client, iteration, context):
            pass

    assert clients._walk_is_whole(Stat()) and clients._walk_is_whole(Get())
    assert not clients._walk_is_whole(MyStat()) and not clients._walk_is_whole(Before())
    assert get_operation("ls").walk(0, {"target": "/x"}) is None
    assert Get().walk(0, {"local_dir": "/tmp/x", "workdir": "/w", "files": 1,
                          "clients": 1, "file_size": 1}) is None


def test_a_step_without_the_library_runs_the_python_loop(area, embedded_xrootd,
                                                         python_requests, monkeypatch):
    """No g++ or headers: the step still measures, through the bindings."""
    root, _ = area
    monkeypatch.setattr(native, "_library", None)
    monkeypatch.setattr(native, "_unavailable", "the compiled client loop needs g++")
    result = run_step(_plan(embedded_xrootd, root), executor="threads")
    assert result.total.succeeded > 0
    assert python_requests["stat"] >= result.total.succeeded


def test_a_missing_compiler_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    with pytest.raises(native.Unavailable, match="needs g\\+\\+: apt-get install g\\+\\+"):
        native.build()


def test_the_build_is_named_by_source_and_library(monkeypatch, tmp_path):
    """Built once into the user's cache, under a name that changes with the source."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = native.build()
    assert built.parent == tmp_path / "pytest-storagescale" and built.exists()
    assert native.build() == built  # not again
    source = tmp_path / "xrdloop.cc"
    source.write_text(native.SOURCE.read_text() + "\n// changed\n")
    monkeypatch.setattr(native, "SOURCE", source)
    assert native.library_path() != built


def test_the_header_says_which_loop_and_a_bad_value_starts_no_server(pytester, monkeypatch):
    """The run header names the loop; ``client_loop=quick`` is one usage error (exit 4)
    naming the value, and leaves no embedded server running (it used to start
    one per look at the endpoint and stop only the last)."""
    private = Path(tempfile.mkdtemp(prefix="ss-loop-test-"))
    private.chmod(0o755)  # an xrootd run as its unprivileged user (under root) passes
    monkeypatch.setenv("TMPDIR", str(private))  # the servers' folders: this test's own
    request_cleanup = functools.partial(shutil.rmtree, private, ignore_errors=True)
    pytester.makepyfile(test_s="""
        import pytest
        @pytest.mark.storagescale_op("stat")
        def test_stat(storage_load, storage_clients):
            storage_load.run()
    """)
    thresholds = f"--storage-thresholds={REPO / 'thresholds'}"
    result = pytester.runpytest_subprocess(thresholds, "--storage-driver-option",
                                           "client_loop=quick", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # once, before any test
    result.stderr.fnmatch_lines(["ERROR: *client_loop='quick' is not a client loop of the "
                                 "xrootd driver. Write client_loop=compiled*"])
    assert (result.stdout.str() + result.stderr.str()).count("is not a client loop") == 1
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if str(private) in " ".join(p.info["cmdline"] or [])]
    assert left == [], f"embedded servers left running: {left}"
    request_cleanup()
    monkeypatch.delenv("XRD_PARALLELEVTLOOP", raising=False)  # the header's own count
    python = pytester.runpytest_subprocess(thresholds, "--storage-driver-option",
                                           "client_loop=python", "--co", "-v")
    python.stdout.fnmatch_lines(["*requests: through the XRootD Python bindings "
                                 "(client_loop=python); XrdCl reads the connections with "
                                 f"{XROOTD_EVENT_LOOPS} event loop(s) in a process that runs "
                                 f"a step alone, {XROOTD_SHARD_EVENT_LOOPS} in each process "
                                 "of a sharded step*"])
    compiled = pytester.runpytest_subprocess(thresholds, "--co", "-v")  # -v: how clients run
    compiled.stdout.fnmatch_lines(["*requests: stat and get by the xrootd driver's compiled "
                                   "client loop*"])


# -- the engine's side of a compiled loop (load/clients._repeat_compiled), with a loop
# -- that gives what each test needs: no server, no timing
class _ScriptedLoop:
    """A CompiledLoop whose answers come from ``script(iteration, count, until)``."""

    def __init__(self, script) -> None:
        self.script, self.calls = script, []

    def run(self, iteration, count, until):
        self.calls.append((iteration, count))
        return self.script(iteration, count, until)

    def halt(self) -> None:
        pass

    def close(self) -> None:
        pass


def _started(max_operations: int = 0) -> tuple[clients.StepRun, clients.ClientSlot]:
    spec = driver_spec("memory://compiled-engine/area", writable_root="/area")
    plan = StepPlan(operation=get_operation("stat"), clients=1, duration=60.0, warmup=0.0,
                    hang_timeout=2.0, driver=spec, workdir="/area/step",
                    max_operations=max_operations)
    run = clients.StepRun(plan, {}, max_operations)
    run.set_clock(plan.clock(time.time()))
    return run, clients.ClientSlot(plan.assignments()[0])


def _ok(finished: float):
    return CompiledOutcome(finished, 0.001, 0, None)


def test_requests_ending_after_the_step_are_not_measured():
    run, slot = _started()
    loop = _ScriptedLoop(lambda i, n, until: [_ok(run.end_perf - 0.5), _ok(run.end_perf + 0.1),
                                              _ok(run.end_perf + 0.2)])
    clients._repeat_compiled(slot, loop, run)
    assert len(loop.calls) == 1  # and the client stops
    group = clients.ClientGroup([slot.assignment], run)
    group.slots[0].records.extend(slot.records)
    group.collect()  # those of the drain are counted as such, not in the rate
    accumulator = group.accumulators[slot.assignment.side]
    assert (accumulator.succeeded, accumulator.drain_operations) == (1, 2)


def test_no_compiled_call_begins_after_the_windows_end():
    run, slot = _started()
    run.set_clock(run.plan.clock(time.time() - 61.0))  # the window has ended
    loop = _ScriptedLoop(lambda i, n, until: [_ok(time.perf_counter())])
    clients._repeat_compiled(slot, loop, run)
    assert loop.calls == [] and not slot.records


def test_a_call_that_became_a_hang_keeps_what_ended_before_it():
    run, slot = _started()

    def script(iteration, count, until):
        slot.hung = True  # the coordinator marked the call hung while it ran
        now = time.perf_counter()
        return [_ok(now - 3), _ok(now - 2.9), _ok(now)]  # the last was in flight

    loop = _ScriptedLoop(script)
    clients._repeat_compiled(slot, loop, run)
    assert len(slot.records) == 2 and len(loop.calls) == 1
    assert slot.busy_since is None


def test_a_count_bound_asks_for_one_request_at_a_time():
    run, slot = _started(max_operations=3)
    loop = _ScriptedLoop(lambda i, n, until: [_ok(time.perf_counter())])
    clients._repeat_compiled(slot, loop, run)
    assert loop.calls == [(0, 1), (1, 1), (2, 1)]
    assert len(slot.records) == 3


def test_calls_go_on_with_the_next_request_until_the_stop():
    run, slot = _started()

    def script(iteration, count, until):
        assert count == clients.COMPILED_BATCH
        assert until <= time.perf_counter() + 2.0 * clients.COMPILED_SPAN_SHARE  # 5 % of 2 s
        if iteration >= 6:
            run.stop.set()
        return [_ok(time.perf_counter()) for _ in range(3)]

    loop = _ScriptedLoop(script)
    clients._repeat_compiled(slot, loop, run)
    assert [i for i, _ in loop.calls] == [0, 3, 6]
    assert len(slot.records) == 9


class _ScriptedBackground(_ScriptedLoop):
    """A BackgroundLoop: ``finished`` what take() gives, ``since`` the request in
    flight, ``on_start`` run at start()."""

    background = True

    def __init__(self, finished=(), since=None, on_start=None) -> None:
        super().__init__(lambda i, n, until: [])
        self.finished, self.since, self.on_start = list(finished), since, on_start
        self.abandoned: list[float] = []

    def start(self, until: float = 0.0) -> bool:
        if self.on_start:
            return self.on_start() is not False
        return True

    def take(self):
        taken, self.finished = self.finished, []
        return taken

    def busy_since(self):
        return self.since

    def abandon(self, since) -> bool:
        self.abandoned.append(since)
        return since == self.since

    def wait_idle(self, seconds) -> bool:
        return True


def test_a_background_client_hands_over_what_is_left_before_it_ends():
    """After the stop, the requests the coordinator has not taken yet are the slot's,
    those that ended in the drain too (counted as the drain's, not in the rate)."""
    run, slot = _started()
    loop = _ScriptedBackground([_ok(run.end_perf - 0.5), _ok(run.end_perf + 0.1)],
                               on_start=run.stop.set)
    clients._run_background(slot, loop, run)
    assert slot.background and [r[0] for r in slot.records] == [run.end_perf - 0.5,
                                                                run.end_perf + 0.1]
    group = clients.ClientGroup([slot.assignment], run)
    group.slots[0].records.extend(slot.records)
    group.collect()
    accumulator = group.accumulators[slot.assignment.side]
    assert (accumulator.succeeded, accumulator.drain_operations) == (1, 1)


def test_a_background_loop_is_given_the_windows_end():
    """The loop is told the step's end, so that it begins no request after it."""
    run, slot = _started()
    untils: list[float] = []

    class Told(_ScriptedBackground):
        def start(self, until: float = 0.0) -> bool:
            untils.append(until)
            run.stop.set()
            return True

    clients._run_background(slot, Told(), run)
    assert untils == [run.end_perf]


def test_a_background_loop_stopped_by_a_refusal_begins_again_after_a_pause(monkeypatch):
    monkeypatch.setattr(clients, "REFUSAL_PAUSE", 0.05)
    run, slot = _started()
    starts: list[float] = []

    def on_start():  # each loop ends at once (wait_idle): a refused request
        starts.append(time.perf_counter())
        if len(starts) == 3:
            run.stop.set()

    clients._run_background(slot, _ScriptedBackground(on_start=on_start), run)
    assert len(starts) == 3
    assert all(b - a >= 0.05 for a, b in itertools.pairwise(starts))  # never a busy loop


def test_a_background_loop_given_up_is_not_begun_again():
    run, slot = _started()
    starts: list[bool] = []

    def on_start():
        starts.append(True)
        slot.hung = len(starts) == 1 or slot.hung  # given up during the first run
        return len(starts) == 1  # and the loop refuses to begin again

    clients._run_background(slot, _ScriptedBackground(on_start=on_start), run)
    assert starts == [True] and not run.stop.is_set()


def _background_group() -> tuple[clients.StepRun, clients.ClientGroup, clients.ClientSlot]:
    """A step's client group of one background client (its loop: the caller's)."""
    run, slot = _started()
    group = clients.ClientGroup([slot.assignment], run)
    (slot,) = group.slots
    slot.background = True
    return run, group, slot


def test_the_coordinator_drains_and_gives_up_background_clients():
    run, group, slot = _background_group()
    slot.loop = loop = _ScriptedBackground(
        [_ok(run.start_perf + 0.5), _ok(run.end_perf + 0.1)],
        since=time.perf_counter() - 1.0)  # in flight for 1 s of hang_timeout's 2
    group.check_hangs()
    group.collect()
    accumulator = group.accumulators[slot.assignment.side]
    assert (accumulator.succeeded, accumulator.hung, slot.hung) == (1, 0, False)
    assert loop.abandoned == []
    loop.since -= 1.5  # now 2.5 s
    group.check_hangs()
    assert loop.abandoned == [loop.since] and slot.hung and accumulator.hung == 1
    group.check_hangs()
    assert accumulator.hung == 1  # once


def test_a_background_client_still_busy_at_the_end_is_given_up_and_woken():
    """After the drain, a background request still in flight is abandoned (its thread,
    waiting for the loop's end, wakes at once: test_a_request_given_up_as_hung_is_not_
    measured; its answer is not measured) and the client counted hung; one with no
    request in flight is counted hung all the same."""
    _, group, slot = _background_group()
    slot.loop = loop = _ScriptedBackground(since=time.perf_counter() - 1.0)
    group.give_up()
    assert loop.abandoned == [loop.since] and slot.hung
    assert group.accumulators[slot.assignment.side].hung == 1
    _, group, idle = _background_group()
    idle.loop = quiet = _ScriptedBackground(since=None)
    group.give_up()
    assert quiet.abandoned == [] and idle.hung


def test_background_threads_wait_long_and_not_all_alike():
    """The safety-net wait of a background client's thread (the loop's end wakes it:
    test_a_request_given_up_as_hung_is_not_measured): long, and not the same for every
    client, so that thousands of threads never wake together."""
    waits = []

    class Waiting(_ScriptedBackground):
        def wait_idle(self, seconds) -> bool:
            waits.append(seconds)
            return True

    for _ in range(3):
        run, slot = _started()
        clients._run_background(slot, Waiting(on_start=run.stop.set), run)
    assert min(waits) >= 30 and len(set(waits)) == 3, waits


def test_a_background_request_that_ended_meanwhile_is_not_a_hang():
    _, group, slot = _background_group()
    slot.loop = loop = _ScriptedBackground(since=time.perf_counter() - 5.0)
    loop.abandon = lambda since: False  # its answer came between the look and the abandon
    group.check_hangs()
    assert not slot.hung and group.accumulators[slot.assignment.side].hung == 0


def test_a_loop_that_raises_is_one_failed_request():
    run, slot = _started()

    def script(iteration, count, until):
        run.stop.set()
        raise OSError("the library went away")

    clients._repeat_compiled(slot, _ScriptedLoop(script), run)
    (record,) = slot.records
    assert isinstance(record[3], OSError) and record[2] == 0
