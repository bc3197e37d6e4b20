"""Steps whose clients run on many hosts (issue 12): a Dask cluster of network
namespaces (tests/netns.py), each running a real ``dask worker``, against one real
embedded xrootd listening on the namespaces' bridge.

Needs root for ``ip netns`` (CI is root); skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import (
    NamespaceCluster,
    bridge_xrootd,
    delete_left_behind,
    during_step,
    netns_unavailable,
    write_and_hold,
    xrootd_logins,
)
from plans import op_section, plan, scan_suite, write_suite

from pytest_storagescale.cluster import hosts as cluster_hosts
from pytest_storagescale.cluster.address import parse_cluster_address
from pytest_storagescale.cluster.breakdown import HostResult, format_hosts, lost_text
from pytest_storagescale.cluster.coordinator import (
    REPORT_GRACE,
    ClusterExecutor,
    HostReport,
    run_cluster_step,
    split_clients,
)
from pytest_storagescale.cluster.hosts import ClusterError, ClusterHost
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import StorageScaleUsageError
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan
from pytest_storagescale.load.stats import (
    SideAccumulator,
    StepResult,
    latency_summary,
    new_histogram,
)
from pytest_storagescale.records import StepRecord
from pytest_storagescale.reporting.table import format_why

# one worker at a time: their network namespaces, bridges and private subnets (a CephFS
# monitor did not answer in 180 s while another of them ran on the other worker)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("network_namespaces")]
REPO = Path(__file__).resolve().parent.parent


# -- without a cluster: parsing, splitting, merging, records ---------------------------
@pytest.mark.parametrize("text", ["tcp://head:8786", "tls://10.0.0.1:8786", "local:4",
                                  "htcondor:20", "SLURM:3"])
def test_cluster_addresses(text):
    assert parse_cluster_address(text).text == text


@pytest.mark.parametrize("text, words", [
    ("head:8786", "unknown cluster 'head:8786'"),
    ("http://head:8786", "not a Dask scheduler address"),
    ("htcondor", "needs its number of hosts"),
    ("local:0", "needs its number of hosts"),
])
def test_bad_cluster_address_is_one_paragraph(text, words):
    with pytest.raises(StorageScaleUsageError, match=re.escape(words)) as info:
        parse_cluster_address(text)
    assert "tcp://head.example.org:8786" in str(info.value)


def _hosts(n: int) -> list[ClusterHost]:
    return [ClusterHost(f"tcp://10.9.9.{i}:1", f"h{i}", f"10.9.9.{i}", 1) for i in range(n)]


def test_clients_split_evenly_with_distinct_indices():
    plan = StepPlan(get_operation("mixed"), 10, 1, 0, 1, driver_spec("memory://x/a"), "/a/s")
    shares = split_clients(plan.assignments(), _hosts(4))
    assert [len(s.assignments) for s in shares] == [5, 5, 5, 5]  # mixed: 10 per side
    indices = [a.index for s in shares for a in s.assignments]
    assert sorted(indices) == list(range(20))
    assert all({a.side for a in s.assignments} == {"readers", "writers"} for s in shares)


def test_clients_per_host_fills_hosts_in_order_and_refuses_too_few():
    plan = StepPlan(get_operation("stat"), 7, 1, 0, 1, driver_spec("memory://x/a"), "/a/s")
    shares = split_clients(plan.assignments(), _hosts(3), clients_per_host=3)
    assert [len(s.assignments) for s in shares] == [3, 3, 1]
    with pytest.raises(ClusterError, match="need 4 hosts; the cluster has 3"):
        split_clients(plan.assignments(), _hosts(3), clients_per_host=2)


def test_merged_p99_is_the_p99_of_the_union_of_the_hosts_samples():
    """A fast host and a slow host: the step's p99 is the union's, not an average of
    the hosts' percentiles."""
    plan = StepPlan(get_operation("stat"), 2, 1.0, 0, 1, driver_spec("memory://x/a"), "/a/s")
    clock = plan.clock(1000.0)
    samples = {0: [i * 1e-5 for i in range(1, 2001)],  # 10 us .. 20 ms, 2000 ops
               1: [0.5 + i * 1e-3 for i in range(100)]}  # 0.5 .. 0.6 s, 100 ops
    union = new_histogram()
    reports, hosts = {}, _hosts(2)
    for index, values in samples.items():
        acc = SideAccumulator(clock.seconds)
        for value in values:
            acc.record(1, value, 0, None, counted=True)
            union.record_value(int(value * 1e6))
        reports[hosts[index].worker] = HostReport({"stat": acc.to_wire()}, 0, 1, 1.0,
                                                  latency_s=latency_summary(acc.histogram))
    shares = split_clients(plan.assignments(), hosts)
    merged = {"stat": SideAccumulator(clock.seconds)}
    executor = ClusterExecutor(None, hosts)
    executor._merge(plan, clock, shares, reports, {}, merged)
    p99 = latency_summary(merged["stat"].histogram)["p99"]
    assert p99 == latency_summary(union)["p99"]
    per_host = [h.p99_s for h in executor.hosts]
    assert p99 != pytest.approx(sum(per_host) / 2, rel=0.05)
    assert merged["stat"].succeeded == 2100
    assert [h.succeeded for h in executor.hosts] == [2000, 100]


def test_lost_host_counts_its_clients():
    plan = StepPlan(get_operation("stat"), 6, 1.0, 0, 1, driver_spec("memory://x/a"), "/a/s")
    clock, hosts = plan.clock(1000.0), _hosts(3)
    shares = split_clients(plan.assignments(), hosts)
    report = HostReport({"stat": SideAccumulator(clock.seconds).to_wire()}, 0, 1, 1.0)
    executor = ClusterExecutor(None, hosts)
    executor._merge(plan, clock, shares, {hosts[0].worker: report, hosts[2].worker: report},
                    {hosts[1].worker: "its worker left the cluster"},
                    {"stat": SideAccumulator(clock.seconds)})
    assert executor.lost == 2
    assert lost_text(executor.hosts) == ("host h1 (10.9.9.1) lost: 2 clients (its worker "
                                         "left the cluster)")
    result = StepResult("stat", 6, 0.0, 1.0, 1.0, 0.0, hosts=executor.hosts, lost=2)
    record = StepRecord("main-001", "t", "stat", "stat", 6, result=result)
    assert lost_text(executor.hosts) in format_why(record)  # the failure's "why:" names it
    assert record.metric("lost") == 2  # what a rule "lost == 0" reads
    assert math.isnan(StepRecord("main-001", "t", "stat", "stat", 6).metric("lost"))


def test_host_breakdown_round_trips_through_the_results_file():
    host = HostResult("ns1", "10.1.1.3", "tcp://10.1.1.3:40000", 25, 0.001, 0.002, 1, 97,
                      10.0, 12.0, 2.0, 5000, 1, 0, 0, 10**6, 0.001, 0.004, 80.5)
    result = StepResult("stat", 100, 10.0, 12.0, 2.0, 0.0, hosts=[host], lost=25)
    record = StepRecord("main-001", "t", "stat", "stat", 100, result=result)
    data = json.loads(json.dumps(record.to_json()))
    assert data["hosts"][0]["rate_hz"] == 2500 and data["lost"] == 25
    again = StepRecord.from_json(data)
    assert again.hosts == [host] and again.lost == 25
    old = {k: v for k, v in data.items() if k not in ("hosts", "lost")}
    assert StepRecord.from_json(old).hosts == [] and StepRecord.from_json(old).lost == 0
    assert "host ns1" in format_hosts([host])[0] and "2500 Hz" in format_hosts([host])[0]


# -- on namespace hosts -------------------------------------------------------------------
@pytest.fixture(scope="module")
def netns():
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)


@pytest.fixture(scope="module")
def server(netns):
    """One embedded xrootd on an address the namespace hosts reach (netns.bridge_xrootd)."""
    with bridge_xrootd(https=False) as xrootd:
        yield xrootd


@contextlib.contextmanager
def _cluster(tmp_path_factory, count: int, **kw):
    """A namespace cluster, removed afterwards even when the test failed."""
    directory = tmp_path_factory.mktemp("cluster")
    cluster = NamespaceCluster(count, directory)
    try:
        cluster.start(**kw)
        yield cluster
    finally:
        cluster_hosts.disconnect()
        cluster.stop()
        assert cluster.leftovers() == []


@pytest.fixture(scope="module")
def four_hosts(netns, tmp_path_factory):
    with _cluster(tmp_path_factory, 4) as cluster:
        yield cluster


@pytest.fixture
def run_root(server, request):
    """A run directory on the server, and the URL the namespace hosts reach it by."""
    def make(cluster: NamespaceCluster) -> tuple[str, str]:
        url = f"root://{server.host}:{server.port}//storagescale"
        root = f"/storagescale/{request.node.name[:30]}-{time.time_ns()}"
        driver_spec(url, writable_root=root).connect("functional-tests", timeout=10).mkdir(root)
        return url, root
    return make


def _plan(url: str, root: str, operation: str = "stat", **kw) -> StepPlan:
    # a generous hang timeout: hung == 0 is asserted, and one request of a loaded
    # machine may take seconds (tests of hangs set their own)
    values = dict(operation=get_operation(operation), clients=8, duration=2.0, warmup=0.5,
                  hang_timeout=30.0, driver=driver_spec(url, writable_root=root),
                  workdir=f"{root}/step")
    values.update(kw)
    return StepPlan(**values)


def test_four_namespace_hosts_each_client_its_own_login(server, four_hosts, run_root):
    """4 hosts x 25 stat clients: one step, the server counts 100 distinct logins, 25 from
    each host's own address; the per-host breakdown adds up to the step."""
    url, root = run_root(four_hosts)
    since = len(server.log_path.read_bytes())
    result = record = run_cluster_step(four_hosts.address, _plan(url, root, clients=100))
    logins = xrootd_logins(server.log_path.read_text(errors="replace")[since:])
    addresses = {h.address for h in four_hosts.hosts}
    assert {a: len(u) for a, u in logins.items() if a in addresses} == \
        {a: 25 for a in addresses}
    names = {u.split(".")[0] for a in addresses for u in logins[a]}
    assert len(names) == 100  # distinct login names across hosts
    total = result.total
    assert total.failed == 0 and total.hung == 0 and total.succeeded > 0
    assert sorted(h.address for h in record.hosts) == sorted(addresses)
    assert [h.clients for h in record.hosts] == [25] * 4
    assert sum(h.succeeded for h in record.hosts) == total.succeeded
    assert record.lost == 0 and all(h.peak_rss_mb and h.peak_rss_mb > 10 for h in record.hosts)
    assert all(abs(h.clock_offset_s) < 0.5 for h in record.hosts)
    # each host's client CPU; the step's client_cpu is the busiest host's
    cpus = [h.client_cpu for h in record.hosts]
    assert all(c is not None and c > 0 for c in cpus), cpus
    assert result.client is not None and result.client.cpu == max(cpus)
    # every host built (or found) the xrootd driver's compiled loop, and it served all 100
    assert result.client.compiled_clients == 100


def test_an_open_loop_step_is_one_schedule_shared_by_the_hosts(server, four_hosts, run_root):
    """An open-loop step on 4 hosts: each sends its share of the one schedule (request
    k on the host holding client k mod C) from the common start time, so together they
    offer the rate once, not once each."""
    url, root = run_root(four_hosts)
    result = run_cluster_step(four_hosts.address,
                              _plan(url, root, clients=8, arrival_rate=40.0, duration=2.0))
    total = result.total
    assert total.open_loop is not None and total.open_loop.scheduled == 80
    assert total.failed == total.hung == 0
    # 40/s over 2 s, give or take the edges; a request whose host had both its clients
    # busy at its time (a loaded machine) is dropped, counted, never sent twice
    assert abs(total.succeeded + total.dropped - 80) <= 8, (total.succeeded, total.dropped)
    assert [h.clients for h in result.hosts] == [2] * 4
    assert all(h.succeeded > 0 for h in result.hosts)  # every host sent its share


def test_a_slow_host_shows_up_as_itself(server, four_hosts, run_root):
    """A tbf cap on one host's link: in a get step, that host's MB/s is the capped one."""
    url, root = run_root(four_hosts)
    four_hosts.cap(2, "20mbit")  # 2.5 MB/s
    try:
        record = run_cluster_step(four_hosts.address, _plan(
            url, root, "get", clients=8, duration=4.0, params={"file_size": 1_000_000,
                                                               "files": 4}))
    finally:
        four_hosts.uncap(2)
    print(*format_hosts(record.hosts), sep="\n")
    by_name = {h.name: h for h in record.hosts}
    slow = by_name["ns2"]
    assert slow.bytes > 0 and slow.mb_s < 2.5 * 1.3
    assert min(record.hosts, key=lambda h: h.mb_s) is slow
    others = [h.mb_s for h in record.hosts if h is not slow]
    assert min(others) > 2 * slow.mb_s


def test_hosts_lost_mid_step_are_counted_and_the_step_ends_on_time(
        server, netns, tmp_path_factory, run_root, monkeypatch):
    """Mid-step, one host's worker is SIGKILLed and another host's link is cut: their
    clients are lost (each host named with why), the third host's are measured, and
    the step ends by its end + hang_timeout + the report grace."""
    with _cluster(tmp_path_factory, 3) as cluster:
        url, root = run_root(cluster)
        plan = _plan(url, root, clients=9, duration=5.0, warmup=0.5, hang_timeout=3.0)
        fired = during_step(monkeypatch, 1.5, lambda: (cluster.kill(1), cluster.cut(2)))
        began = time.monotonic()
        result = record = run_cluster_step(cluster.address, plan)
        assert fired == [True], "the faults were never injected"
        took = time.monotonic() - began
        # offsets, lead, warm-up + duration, hang_timeout, the report grace, and slack
        assert took < 1 + 1 + 0.5 + 5 + 3 + REPORT_GRACE + 15, took
        assert record.lost == 6
        lost = {h.name: h.lost_reason for h in record.hosts if h.lost}
        assert sorted(lost) == ["ns1", "ns2"]
        assert "left the cluster" in lost["ns1"]
        assert "no report by the step's end + hang_timeout" in lost["ns2"]
        kept = [h for h in record.hosts if not h.lost]
        assert [h.name for h in kept] == ["ns0"] and kept[0].succeeded > 0
        # the lost hosts' clients are lost, never hung; a request of the kept host that
        # ran past the 3 s hang_timeout (beside stress-ng, once) is its own hung client
        assert result.total.succeeded == kept[0].succeeded
        assert result.total.hung == kept[0].hung and all(h.hung == 0 for h in record.hosts
                                                          if h.lost)


def test_a_host_whose_clock_is_off_is_refused_before_the_load(
        server, netns, tmp_path_factory, run_root):
    with _cluster(tmp_path_factory, 2, skew={1: 5.0}) as cluster:
        url, root = run_root(cluster)
        plan = _plan(url, root)
        with pytest.raises(ClusterError) as info:
            run_cluster_step(cluster.address, plan)
        text = str(info.value)
        offset = re.search(r"ns1 \([\d.]+\) \+([\d.]+) s", text)
        assert offset is not None and abs(float(offset.group(1)) - 5.0) < 0.5, text
        assert "more than 0.5 s" in text and "the step was not run" in text, text
        assert "ns0" not in text, text
        lister = driver_spec(url, writable_root=root).connect("functional-tests", timeout=10)
        assert lister.ls(root) == []  # no set-up happened


def test_suite_on_the_cluster_under_xdist(pytester, server, four_hosts, monkeypatch):
    """--storage-cluster with pytest -n 2: the header names the hosts and their clock
    offsets, every step's clients ran on the 4 hosts (per-host breakdown in the JSON and,
    with -v, under the table), and the load steps never overlapped. The scheduler is
    a tls:// one, reached with the Dask config's TLS settings (as a site's is)."""
    for name, value in four_hosts.dask_env().items():
        monkeypatch.setenv(name, value)
    write_suite(pytester.path, scan_suite("stat", "ls"),
                plan(op_section("stat", 8),
                     op_section("ls", 4, ("failed == 0", "lost == 0"), clients_per_host=2)))
    result = pytester.runpytest_subprocess(
        f"--storage-endpoint=root://{server.host}:{server.port}//storagescale",
        "--storage-version=5.5", "--storage-thresholds=thr", "-p", "no:cacheprovider",
        f"--storage-cluster={four_hosts.address}", "--storage-results=out.json", "-v",
        "-n", "2", timeout=300)
    print(*result.stdout.lines, sep="\n")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        f"storagescale: cluster {four_hosts.address} (scheduler *): 4 client hosts*",
        "  host ns0 10.* (clock *ms +- * ms)",
        "*stat at 8 clients: 4 client hosts",
        "  host ns0 * clients     2  succeeded *lost 0*",
    ])
    steps = json.loads((pytester.path / "out.json").read_text())["steps"]
    assert sorted(s["op"] for s in steps) == ["ls", "stat"]
    for step in steps:
        assert step["executor"] == "cluster" and step["lost"] == 0
        hosts = step["hosts"]
        # ls: clients_per_host = 2 fills two hosts; stat spreads over all four
        names = ["ns0", "ns1"] if step["op"] == "ls" else ["ns0", "ns1", "ns2", "ns3"]
        assert sorted(h["name"] for h in hosts) == names
        assert all(h["clients"] == 2 for h in hosts)
        assert sum(h["succeeded"] for h in hosts) == step["succeeded"] > 0
    assert len({s["worker"] for s in steps}) == 2
    intervals = sorted((s["lock_acquired"], s["ended"]) for s in steps)
    assert intervals[0][1] <= intervals[1][0], f"steps overlap: {intervals}"


def test_per_host_rate_plot_marks_the_lost_host(tmp_path):
    from pytest_storagescale.reporting.plots import hosts_png

    fast = HostResult("ns0", "10.1.1.2", "tcp://10.1.1.2:1", 25, 0.0, duration_s=2.0,
                      succeeded=5000)
    lost = HostResult("ns1", "10.1.1.3", "tcp://10.1.1.3:1", 25, 0.0, lost=25,
                      lost_reason="its worker left the cluster")
    result = StepResult("stat", 50, 0.0, 2.0, 2.0, 0.0, hosts=[fast, lost], lost=25)
    record = StepRecord("main-001", "t", "stat", "stat", 50, result=result)
    png = hosts_png(record)
    assert png.startswith(b"\x89PNG") and len(png) > 2000
    (tmp_path / "hosts.png").write_bytes(png)


def test_ctrl_c_stops_the_clients_on_every_host(server, four_hosts, run_root, monkeypatch):
    """Ctrl-C on the coordinator: every host stops its clients (a Dask event) and
    reports what they measured; the step ends long before its planned end.

    SIGINT is handled as in a pytest run in a terminal: a process started in the
    background by a non-interactive shell (``make test &``) inherits it ignored, and
    then the simulated Ctrl-C does nothing (seen in three such runs)."""
    import _thread

    from pytest_storagescale.load.engine import StepInterrupted

    url, root = run_root(four_hosts)
    plan = _plan(url, root, clients=8, duration=30.0, warmup=0.5)
    began = time.monotonic()
    fired = during_step(monkeypatch, 2.0, _thread.interrupt_main)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ended = run_cluster_step(four_hosts.address, plan)
    except StepInterrupted as stopped:
        result = record = stopped.result  # with its hosts
    else:  # what the step saw instead
        pytest.fail(f"the step ended without the Ctrl-C after "
                    f"{time.monotonic() - began:.1f} s (fired: {fired}): "
                    f"{ended.total.succeeded} succeeded, {ended.total.failed} failed "
                    f"{dict(ended.total.errors)}, hosts: {format_hosts(ended.hosts)}, "
                    f"{[h.lost_reason for h in ended.hosts]}")
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert fired == [True]
    took = time.monotonic() - began
    assert took < 25, f"the step took {took:.1f} s of its 30 s, Ctrl-C 2 s after it began"
    assert result.interrupted and 0 < result.duration_s < 20
    assert record.lost == 0 and len(record.hosts) == 4
    print(*format_hosts(record.hosts), *[h.lost_reason for h in record.hosts], took, sep="\n")
    assert all(h.succeeded > 0 and h.lost_reason is None for h in record.hosts)
    assert sum(h.succeeded for h in record.hosts) == result.total.succeeded


#: a step of 30 s on a local cluster's two hosts
LOCAL_PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[ops.stat]
clients = [4]
duration = "30s"
hang_timeout = "5s"

[[ops.stat.expect]]
rules = ["failed == 0"]
"""

LOCAL_SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()

def test_after():
    pass
"""

#: a file appears 1 s into the step's measurement, on the step's own clock (a cluster
#: step has no live progress: the coordinator's wait is wrapped)
LOCAL_CONFTEST = """
import threading
import time
from pathlib import Path

from pytest_storagescale.cluster.coordinator import ClusterExecutor

_wait = ClusterExecutor._wait


def wait(self, plan, clock, futures):
    marker = Path.cwd() / "measuring"
    timer = threading.Timer(max(0.0, clock.measure_from + 1 - time.time()), marker.touch)
    timer.start()
    try:
        return _wait(self, plan, clock, futures)
    finally:
        timer.cancel()


ClusterExecutor._wait = wait
"""


def test_ctrl_c_in_a_terminal_keeps_what_the_local_hosts_measured(tmp_path):
    """--storage-cluster local:2 and Ctrl-C from a terminal: the SIGINT reaches the
    whole process group, the LocalCluster's worker processes too. They must not die of
    it (they were started with SIGINT ignored): they stop by the coordinator's event and
    report, so the step is interrupted with what both hosts measured (before: 0
    operations, and pytest ended 4-10 s later)."""
    (tmp_path / "thr" / "xrootd").mkdir(parents=True)
    (tmp_path / "thr" / "xrootd" / "t.toml").write_text(LOCAL_PLAN)
    (tmp_path / "test_suite.py").write_text(LOCAL_SUITE)
    (tmp_path / "conftest.py").write_text(LOCAL_CONFTEST)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
         "test_suite.py", "--storage-thresholds=thr", "--storage-results=r.json",
         "--storage-cluster=local:2"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group, as a terminal's job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 240
        while (not (tmp_path / "measuring").exists() and child.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.1)
        assert (tmp_path / "measuring").exists(), "the step never measured"
        os.killpg(child.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole group
        output, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 2, output[-3000:]  # pytest's "interrupted"
    [step] = json.loads((tmp_path / "r.json").read_text())["steps"]
    assert step["verdict"] == "interrupted", step
    assert step["succeeded"] > 0 and 0 < step["duration_s"] < 30, step
    assert len(step["hosts"]) == 2, step
    assert all(host["succeeded"] > 0 for host in step["hosts"]), step["hosts"]


# -- seed 001's cross-node check -----------------------------------------------------------
def test_a_killed_writers_file_is_deleted_from_another_host(
        server, netns, tmp_path_factory, run_root):
    """Seed 001: a writer on one client host is killed with SIGKILL while it holds a
    half-written file open; a client on another host deletes what it left."""
    from distributed import Client

    from pytest_storagescale.errors import StorageNotFound
    with _cluster(tmp_path_factory, 2) as cluster:
        url, root = run_root(cluster)
        path = f"{root}/left-behind.dat"
        with Client(cluster.address, timeout=30, security=cluster.security) as client:
            workers = {info["name"]: address for address, info in
                       client.scheduler_info(n_workers=-1)["workers"].items()}
            refused = client.submit(write_and_hold, url, root, path, workers=[workers["ns0"]],
                                    pure=False).result(timeout=60)
            assert "outside this run's test area" in refused
            spec = driver_spec(url, writable_root=root)
            assert spec.connect("functional-tests", timeout=10).stat(path).size > 0
            cluster.kill(0)
            outcome = client.submit(delete_left_behind, url, root, path, workers=[workers["ns1"]],
                                    pure=False).result(timeout=60)
        assert outcome == "deleted"
        with pytest.raises(StorageNotFound):
            spec.connect("functional-tests", timeout=10).stat(path)


def test_local_recipe_runs_a_step_on_worker_processes(server, monkeypatch):
    """--storage-cluster local:2: a LocalCluster of two worker processes on this
    machine (the quick way to try a cluster); refused under pytest -n."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # make test runs with -n 2
    root = f"/storagescale/local-{time.time_ns()}"
    driver_spec(server.url, writable_root=root).connect("functional-tests", timeout=10).mkdir(root)
    try:
        result = record = run_cluster_step("local:2", _plan(server.url, root, clients=6,
                                                            duration=1.0))
    finally:
        cluster_hosts.disconnect("local:2")
    assert len(record.hosts) == 2 and len({h.name for h in record.hosts}) == 2
    assert [h.clients for h in record.hosts] == [3, 3]
    assert result.total.succeeded == sum(h.succeeded for h in record.hosts) > 0
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    with pytest.raises(StorageScaleUsageError, match="under pytest -n every worker"):
        cluster_hosts.connect("local:3")


def test_documented_jobqueue_config_makes_htcondor_and_slurm_jobs():
    """docs/cluster.md's jobqueue.yaml: dask-jobqueue turns it into one-worker jobs for
    HTCondor and SLURM (job scripts only: no batch system here)."""
    import dask
    import dask_jobqueue
    import yaml

    text = (REPO / "docs" / "cluster.md").read_text()
    config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    scripts = {}
    for kind in ("htcondor", "slurm"):
        config["jobqueue"][kind].pop("scheduler-options")  # not this machine's addresses
    dotted = {f"jobqueue.{kind}.{key}": value for kind, section in config["jobqueue"].items()
              for key, value in section.items()}  # keeps the other defaults (interface...)
    with dask.config.set(dotted):
        for kind, cluster_class in (("htcondor", dask_jobqueue.HTCondorCluster),
                                    ("slurm", dask_jobqueue.SLURMCluster)):
            with cluster_class(scheduler_options={"host": "127.0.0.1",
                                                  "dashboard_address": None}) as cluster:
                scripts[kind] = cluster.job_script()
    assert '+JobFlavour = "espresso"' in scripts["htcondor"]
    assert "/cvmfs/sw.example.org/storagescale/venv/bin/python -m distributed.cli.dask_worker" \
        in scripts["htcondor"]
    assert "#SBATCH --exclusive" in scripts["slurm"] and "#SBATCH -A storage-tests" in \
        scripts["slurm"]


def test_recipe_without_jobqueue_settings_is_one_paragraph(monkeypatch):
    import dask

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # make test runs with -n 2

    with dask.config.set({"jobqueue.slurm.cores": None, "jobqueue.slurm.memory": None}):
        with pytest.raises(StorageScaleUsageError, match=r"dask-jobqueue could not set up "
                           r"slurm jobs: .*Configure the jobqueue.slurm section"):
            cluster_hosts.connect("slurm:2")
