"""Open-loop steps on the memory driver: the schedule, the cap, and latency that is
honest about a stall (no coordinated omission).

Assertions are on counts and proportions with wide bounds, never on this machine's
speed: a stall of S seconds at R requests/s must show about R*S slow requests in the
open loop, and one per client in the closed loop.
"""

from __future__ import annotations

import itertools
import json
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
    # the closed loop: each client's one request in flight took the stall, however long
    # it was; a client host's own pauses (CI, another worker busy) may make a few more
    # slower than 0.1 s (8 of 2,299 in the fresh-clone CI of 29977dd), never the stall's
    # share: far fewer than the open loop's
    assert 1 <= slower_than(closed_total, stall / 2) <= clients
    assert slower_than(closed_total, 0.1) < 0.5 * expected <= slow_open
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


# -- the thresholds file and the plugin ------------------------------------------------
ISSUE_EXAMPLE = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "1s"
warmup = "0s"
hang_timeout = "5s"

[ops.stat]
arrival_rate = ["20/s", "40/s"]
max_in_flight = 20

[[ops.stat.expect]]          # no clients/arrival_rate key: every step of the section
rules = ["failed == 0"]

[[ops.stat.expect]]
arrival_rate = "<=20/s"
rules = ["achieved_hz >= 0.5 * offered_hz", "dropped == 0", "late <= 20"]

[ops.ls]
clients = [2]
"""

OPEN_SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat_open(storage_load, storage_arrival_rate):
    storage_load.run()

@pytest.mark.storagescale_op("stat")
def test_stat_closed(storage_load, storage_clients):
    storage_load.run()

@pytest.mark.storagescale_op("ls")
def test_ls_open(storage_load, storage_arrival_rate):
    storage_load.run()
"""


def test_the_issues_example_loads_and_selects_rules_by_rate(tmp_path):
    from pytest_storagescale.thresholds import load_thresholds

    path = tmp_path / "t.toml"
    path.write_text(ISSUE_EXAMPLE)
    section = load_thresholds(path).sections["stat"]
    assert section.arrival_rates == (20.0, 40.0) and section.max_in_flight == 20
    assert section.arrivals == "constant" and section.clients == ()
    low = [rule.text for rule in section.rules_for(20, rate=20.0)]
    high = [rule.text for rule in section.rules_for(20, rate=40.0)]
    assert "failed == 0" in low and "failed == 0" in high  # no selector: every step
    assert "dropped == 0" in low and "dropped == 0" not in high
    rule = next(r for r in section.rules_for(20, rate=20.0) if r.reference)
    assert (rule.metric, rule.limit, rule.reference) == ("achieved_hz", 0.5, "offered_hz")


@pytest.mark.parametrize(("change", "message"), [
    (("max_in_flight = 20", "max_in_flight = 20\nclients = [1]"), "not both"),
    (('["20/s", "40/s"]', '["fast"]'), "cannot read arrival rate 'fast'"),
    (('max_in_flight = 20', 'max_in_flight = 20\narrivals = "bursty"'), "'bursty' is not a "
                                                                         "schedule"),
    (('arrival_rate = "<=20/s"', 'clients = 3'), "unknown key 'clients'"),
    (("clients = [2]", "clients = [2]\nmax_in_flight = 3"), "belong to an open-loop"),
])
def test_bad_open_loop_sections_name_the_key_and_the_fix(tmp_path, change, message):
    from pytest_storagescale.errors import ThresholdsError
    from pytest_storagescale.thresholds import load_thresholds

    path = tmp_path / "t.toml"
    path.write_text(ISSUE_EXAMPLE.replace(*change))
    with pytest.raises(ThresholdsError, match=message):
        load_thresholds(path)


def test_an_open_loop_scan_runs_through_the_plugin_with_verdicts(pytester, tmp_path):
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_suite=OPEN_SUITE)
    folder = pytester.path / "thr" / "xrootd"
    folder.mkdir(parents=True)
    (folder / "any.toml").write_text(ISSUE_EXAMPLE)
    result = pytester.runpytest(
        f"--storage-endpoint=file://{area}", "--storage-version=1.0",
        "--storage-thresholds=thr", "-p", "no:cacheprovider", "-rs", "-v",
        "--storage-results=out/results.json", "--storage-benchmark-json=out/bench.json")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines([
        "*test_stat_open[[]r20hz[]] PASSED*", "*test_stat_open[[]r40hz[]] PASSED*",
        "op*clients*offered*succeeded*rate*failed*dropped*hung*p50*p99*verdict",
        "stat*20*20.0 Hz*20*20.0 Hz*",
        "*scans arrival rates (an open loop)*storage_arrival_rate fixture*",
        "*scans clients (a closed loop)*give the section arrival_rate*",
    ])
    steps = json.loads((pytester.path / "out" / "results.json").read_text())["steps"]
    assert [(s["arrival_rate"], s["max_in_flight"]) for s in steps] == [(20.0, 20),
                                                                         (40.0, 20)]
    for step in steps:
        # a step whose requests left late (a busy client host: CI beside other work)
        # is not judged, and says why; else it passes
        assert step["offered_hz"] == step["arrival_rate"]
        assert step["verdict"] in ("pass", "info"), step
        if step["verdict"] == "info":
            assert step["late"] > 0 and "could not keep the schedule" in result.stdout.str()
        for key in ("achieved_hz", "dropped", "late", "latency_s", "service_latency_s",
                    "warmup_operations"):
            assert key in step
    assert {c["rule"] for c in steps[0]["checks"]} >= {
        "failed == 0", "achieved_hz >= 0.5 * offered_hz", "dropped == 0"}
    assert "dropped == 0" not in {c["rule"] for c in steps[1]["checks"]}
    # each rate its own benchmark (the clients, the cap, are the same)
    bench = json.loads((pytester.path / "out" / "bench.json").read_text())["benchmarks"]
    assert [b["name"] for b in bench] == ["stat[r20hz]", "stat[r40hz]"]


def test_a_step_whose_host_could_not_keep_the_schedule_says_so(spec, monkeypatch):
    """Requests sent late (here: any lateness counts, as on a host too busy to send
    them on time) make the step say its client host could not offer the rate: in the
    record, the table's note, the why lines and the CSV."""
    from pytest_storagescale.load import stats
    from pytest_storagescale.records import StepRecord
    from pytest_storagescale.reporting.table import csv_rows, format_table, format_why

    monkeypatch.setattr(stats, "LATE_AFTER_S", -1.0)  # every request is "late"
    result = run_step(plan(spec(), arrival_rate=40.0, duration=1.0, clients=10))
    assert result.total.late == result.total.succeeded > 0
    record = StepRecord(step_id="1", test="t", section="stat_open", operation="stat",
                        clients=10, result=result, arrival_rate=40.0, arrivals="constant")
    assert record.schedule_missed and record.to_json()["schedule_missed"] is True
    assert any("could not keep the schedule" in line and "stat_open at 40/s" in line
               for line in format_table([record]))
    assert any(line.startswith("schedule not kept:") for line in format_why(record))
    header, row = csv_rows([record])
    assert row[header.index("offered_hz")] == "40"
    assert row[header.index("dropped")] == "0" and int(row[header.index("late")]) > 0
    again = StepRecord.from_json(record.to_json())
    assert (again.arrival_rate, again.scan_point, again.schedule_missed) == (40.0, "40/s", True)


def test_an_open_loop_scan_is_plotted_over_its_offered_rates(spec):
    pytest.importorskip("matplotlib")
    from pytest_storagescale.records import StepRecord
    from pytest_storagescale.reporting.plots import scan_figure

    steps = [StepRecord(step_id=str(rate), test="t", section="stat_open", operation="stat",
                        clients=10, arrival_rate=rate, arrivals="constant",
                        result=run_step(plan(spec(), arrival_rate=rate, duration=1.0,
                                             clients=10)))
             for rate in (40.0, 20.0)]
    rate_axes, error_axes = scan_figure(steps).axes[:2]
    achieved, offered = rate_axes.lines[:2]
    assert list(achieved.get_xdata()) == [20.0, 40.0] == list(offered.get_ydata())
    assert "dropped" in [line.get_label() for line in error_axes.lines]
    assert error_axes.get_xlabel() == "offered rate (requests/s)"


# -- numbers out of range (issue 31, item 14) -----------------------------------------
@pytest.mark.parametrize(("rates", "message"), [
    ('["1e308/s"]', "arrival rate '1e308/s' is above what an open loop offers"),
    ("[1e308]", r"arrival rate 1e\+308 is above"),
    ("[inf]", "arrival rate inf is above"),
    ('["2000000/s"]', "arrival rate '2000000/s' is above"),
    ('["0.00001/s"]', "arrival rate '0.00001/s' is below"),
    ("[nan]", "cannot read arrival rate nan"),
    ('["1e400/s"]', "arrival rate '1e400/s' is above"),
])
def test_an_arrival_rate_out_of_range_names_the_value_and_the_range(tmp_path, rates, message):
    """``arrival_rate = ["1e308/s"]`` was accepted and the table printed a 309-digit
    rate: a rate is from one an hour to a million a second, else one paragraph."""
    from pytest_storagescale.errors import ThresholdsError
    from pytest_storagescale.thresholds import load_thresholds

    path = tmp_path / "t.toml"
    path.write_text(ISSUE_EXAMPLE.replace('["20/s", "40/s"]', rates))
    with pytest.raises(ThresholdsError, match=message) as raised:
        load_thresholds(path)
    assert "[ops.stat].arrival_rate" in str(raised.value)
    assert "1000000 a second" in str(raised.value) or "cannot read" in str(raised.value)


def test_the_bounds_themselves_are_taken(tmp_path):
    from pytest_storagescale.thresholds import load_thresholds

    path = tmp_path / "t.toml"
    path.write_text(ISSUE_EXAMPLE.replace('["20/s", "40/s"]', '["1000000/s", "0.0167/min"]'))
    assert load_thresholds(path).sections["stat"].arrival_rates == (1_000_000.0, 0.0167 / 60)


@pytest.mark.parametrize(("change", "message"), [
    (('"failed == 0"', '"failed <= 1e400"'), "the number 1e400 in rule 'failed <= 1e400' "
                                             "is beyond what a float holds"),
    (('"failed == 0"', '"rate_hz >= 1e999 * baseline"'), "beyond what a float holds"),
    (('duration = "1s"', "duration = nan"), "nan must be longer than zero"),
    (('duration = "1s"', "duration = inf"), "longer than 7 days"),
    (("[ops.ls]\nclients = [2]", "[ops.ls]\nclients = [2]\nentries = 1000000000000"),
     "1000000000000 is more than 1000000"),
    (("[ops.ls]\nclients = [2]", "[ops.ls]\nclients = [2]\ntries = 1000000"),
     "tries: 1000000 is more than 1000"),
    (("[ops.ls]\nclients = [2]", "[ops.ls]\nclients = [2]\noperations = 10000000000000"),
     "operations: 10000000000000 is more than 1000000000"),
    (("[ops.ls]\nclients = [2]", '[ops.get]\nclients = [2]\nfile_size = "' + "9" * 400 + 'G"'),
     "is more than 1 TiB"),
    (("[ops.ls]\nclients = [2]", '[ops.get]\nclients = [2]\nfile_size = "2048GiB"'),
     "'2048GiB' is more than 1 TiB"),
])
def test_other_plan_numbers_out_of_range_are_one_paragraph(tmp_path, change, message):
    """The sweep of a plan's numbers: a rule's limit beyond a float (a check that cannot
    fail), a NaN or infinite duration, counts and sizes no step is meant to have (an
    overflow was an OverflowError traceback) are each one paragraph naming the key."""
    from pytest_storagescale.errors import StorageScaleUsageError
    from pytest_storagescale.thresholds import load_thresholds

    path = tmp_path / "t.toml"
    path.write_text(ISSUE_EXAMPLE.replace(*change))
    with pytest.raises(StorageScaleUsageError, match=message):
        load_thresholds(path)


def test_a_rate_out_of_range_stops_the_run_once_before_any_load(pytester, monkeypatch):
    """Through the plugin: one paragraph, exit 4, no test ran; under xdist the same (the
    controller says the workers' usage error once, see test_plugin.py's
    test_bad_thresholds_under_xdist_is_one_paragraph_and_exit_4). CI=true keeps pytest
    from shortening its summary lines, as a CI runner does."""
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_suite=OPEN_SUITE)
    folder = pytester.path / "thr" / "xrootd"
    folder.mkdir(parents=True)
    (folder / "any.toml").write_text(ISSUE_EXAMPLE.replace('["20/s", "40/s"]', '["1e308/s"]'))
    for extra in ([], ["-n", "2"]):
        result = pytester.runpytest_subprocess(
            "--storage-endpoint=memory://rates/area", "--storage-version=1.0",
            "--storage-thresholds=thr", "-p", "no:cacheprovider", *extra)
        said = result.stdout.str() + result.stderr.str()
        assert result.ret == 4, said
        paragraph = "arrival rate '1e308/s' is above what an open loop offers"
        assert said.count(paragraph) == 1, said
        assert result.stderr.str().count(paragraph) == 1, said
        assert "Traceback" not in said and "1000000000000000000000" not in said
        assert " passed" not in said
