"""The server's side of a step (load/server_monitor.py), against a real xrootd reporting its
own summary monitoring (``xrd.report``) to the listener a session starts:

- everything the clients sent (warm-up + window + drain, as the step's record says) is
  what the server counted, within 1 % or 50 requests, with the compiled loop;
- load from outside the plugin during the step makes the step an error that says the
  counts disagree;
- the server processes' CPU, threads and connections over the window are measured,
  rules can name them (``server_cpu``), and a saturated server is said so.

Mechanisms only: no assertion on how fast anything ran."""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from plans import one_step_plan
from server_side import stat_step, watched_step

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.server_monitor import (
    ServerWatch,
    SummaryListener,
    disagreement,
    parse_summary,
)
from pytest_storagescale.load.server_usage import ServerUsage
from pytest_storagescale.records import StepRecord, Verdict
from pytest_storagescale.reporting.html import table_csv, table_html
from pytest_storagescale.reporting.table import SERVER_SATURATED_NOTE, format_table, format_why
from pytest_storagescale.servers.orphans import server_directory
from pytest_storagescale.steps import counts_disagree, judge_step
from pytest_storagescale.thresholds import evaluate, load_thresholds, parse_rule

pytestmark = pytest.mark.integration

#: the embedded server's listener folder, as the session makes it (recorded as a server's)
MONITOR_FOLDER = functools.partial(server_directory, "monitor")


@pytest.fixture(scope="module")
def reporting_xrootd():
    """A real xrootd reporting its summary every second to a listener on loopback."""
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    listener = SummaryListener()
    server = EmbeddedXRootD(https=False)
    server.report_to = listener.address
    try:
        with server:
            yield server, listener
    finally:
        listener.close()


@pytest.fixture
def area(reporting_xrootd, request):
    server, _ = reporting_xrootd
    root = f"/storagescale/{request.node.name[:40]}"
    driver = driver_spec(server.url, writable_root=root).connect("tests", timeout=10)
    driver.mkdir(root)
    yield root
    driver.remove_tree(root)
    driver.close()


def test_the_server_counts_what_the_plugin_sent(reporting_xrootd, area):
    """Warm-up + window + drain of a compiled-loop stat step is what the server served
    (its own ``misc`` counter over its count per stat), within 1 % or 50 requests."""
    server, listener = reporting_xrootd
    record, _ = watched_step(server, listener, stat_step(server, area), area)
    total = record.total
    assert total.failed == 0 and total.hung == 0, total.errors
    assert record.result.client.compiled_clients == 4  # the compiled loop made them
    sent = record.issued_operations
    assert sent == (total.warmup_operations + total.succeeded + total.drain_operations)
    assert total.warmup_operations > 0  # the warm-up's requests are counted too
    usage = record.server
    assert usage.counted == "misc" and usage.per_operation >= 1, usage
    served = usage.operations
    assert abs(served - sent) <= max(0.01 * sent, 50), (served, sent, usage.ops)
    assert counts_disagree(record) is None
    # the set-up's put and the clean-up's requests are outside the bracket: no open
    assert usage.ops.get("open", 0) == 0 and usage.ops.get("wr", 0) == 0, usage.ops
    assert record.server_ops == usage.requests >= served


def test_an_ls_step_is_counted_too(reporting_xrootd, area):
    """An ls step's listings are ``misc`` requests as well, measured per ls."""
    server, listener = reporting_xrootd
    plan = stat_step(server, area, operation=get_operation("ls"), params={"entries": 5})
    record, _ = watched_step(server, listener, plan, area)
    assert record.total.failed == 0, record.total.errors
    usage, sent = record.server, record.issued_operations
    assert usage.counted == "misc" and usage.per_operation >= 1, usage
    assert abs(usage.operations - sent) <= max(0.01 * sent, 50), (usage, sent)
    assert counts_disagree(record) is None


def test_load_from_outside_the_plugin_makes_the_step_an_error(reporting_xrootd, area,
                                                               thresholds_dir):
    """Stats sent by another client during the step: the server counts them, the
    plugin does not; the verdict says the step did not measure what it claims."""
    server, listener = reporting_xrootd
    section = load_thresholds(thresholds_dir(one_step_plan("stat"))).section("stat")
    stranger = driver_spec(server.url, writable_root=area).connect("stranger", timeout=10)

    def extra_load() -> None:
        for _ in range(3000):
            stranger.stat(area)

    plan = stat_step(server, area, clients=1, duration=1.0, warmup=0.0)
    record, _ = watched_step(server, listener, plan, area, during=extra_load)
    stranger.close()
    assert record.server.operations > record.issued_operations + 2000
    why = counts_disagree(record)
    assert why is not None and "load from outside the plugin" in why, why
    assert f"where its clients made {record.issued_operations}" in why
    # the verdict, before any rule (failed == 0 would pass)
    judge_step(SimpleNamespace(baseline=None), record, section, judge=True, derive=None)
    assert (record.verdict, record.error, record.checks) == (Verdict.ERROR, why, [])
    assert any("did not measure what it claims" in line for line in format_why(record))


def test_server_cpu_is_measured_and_rules_name_it(reporting_xrootd, area):
    """The server process's CPU over the window (per core), its threads and
    connections; ``server_cpu`` and ``server_connections`` in rules; the JSON keeps
    them; a limit below what it used says the server was saturated."""
    server, listener = reporting_xrootd
    record, _ = watched_step(server, listener, stat_step(server, area), area)
    usage = record.server
    assert usage.cpu_s is not None and usage.cpu_s > 0, usage
    assert 0 < record.server_cpu <= 1.0 and usage.cores >= 1
    assert record.server_threads >= 1
    assert record.server_connections >= 4  # one per client, at least
    checks = evaluate([parse_rule("server_cpu <= 1.0"), parse_rule("server_connections >= 4"),
                       parse_rule("server_cpu > 1.0")], record.metric)
    assert [c.passed for c in checks] == [True, True, False]
    assert not record.server_saturated
    record.client_cpu_limit = record.server_cpu / 2
    assert record.server_saturated
    assert any(line.startswith("server saturated:") for line in format_why(record))
    table = "\n".join(format_table([record]))
    assert "server" in table and "saturated*" in table
    assert SERVER_SATURATED_NOTE in table
    [header, row] = csv.reader(io.StringIO(table_csv([record])))
    cells = dict(zip(header, row, strict=True))
    assert (cells["server_ops"], cells["server_saturated"]) == (str(usage.requests), "1")
    assert float(cells["server_cpu"]) == pytest.approx(record.server_cpu, rel=1e-5)
    assert "<th>server</th>" in table_html([record]) and "saturated*" in table_html([record])
    again = StepRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again.server == record.server and again.metric("server_cpu") == record.server_cpu
    assert json.loads(json.dumps(record.to_json()))["server_ops"] == usage.requests


# -- without a server ----------------------------------------------------------------
SUMMARY = (b'<statistics tod="1" ver="v5.5.3" src="vm:1094" tos="100" pgm="xrootd" ins="anon" '
           b'pid="7" site=""><stats id="link"><num>3</num></stats><stats id="proc"><usr><s>1'
           b'</s><u>500000</u></usr><sys><s>0</s><u>250000</u></sys></stats><stats id="xrootd">'
           b'<num>2</num><ops><open>4</open><rd>9</rd><rs>30</rs><misc>20</misc></ops></stats>'
           b'<stats id="sched"><threads>12</threads></stats></statistics>')


def test_a_summary_report_is_read_and_anything_else_ignored():
    summary = parse_summary(SUMMARY, received=5.0)
    assert summary is not None
    assert (summary.source, summary.started, summary.links, summary.threads) == (
        "vm:1094", 100, 3, 12)
    assert summary.ops == {"open": 4, "rd": 9, "rs": 30, "misc": 20}
    assert math.isclose(summary.cpu_s, 1.75)
    assert parse_summary(b"not xml") is None
    assert parse_summary(b"<other/>") is None
    hostile = b'<!DOCTYPE s [<!ENTITY a "aaaa">]><statistics src="x">&a;</statistics>'
    assert parse_summary(hostile) is None


def test_counts_within_two_percent_agree():
    usage = ServerUsage(ops={"misc": 2000}, counted="misc", per_operation=2.0)
    assert usage.operations == 1000 and usage.requests == 2000
    assert disagreement(1000, 0, usage) is None
    assert disagreement(985, 0, usage) is None  # 1.5 %
    assert "load from outside the plugin" in disagreement(900, 0, usage)
    assert "never reached the server" in disagreement(1100, 0, usage)
    assert disagreement(900, 100, usage) is None  # the hung ones may have been served
    assert disagreement(900, 0, usage, clients=100) is None  # so may the logins
    per_ls = ServerUsage(ops={"misc": 120}, counted="misc", per_operation=1.0)
    assert disagreement(100, 0, per_ls, clients=10) is None  # 2 requests per login
    assert disagreement(100, 0, per_ls, clients=5) is not None
    assert disagreement(1000, 0, ServerUsage(ops={"misc": 1})) is None  # not comparable


def _stat_suite(pytester, *options: str) -> dict:
    """Run a 2-client stat step whose rules name the server's metrics; its JSON step
    (the run passed)."""
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "t.toml").write_text(
        '[storage]\nsystem = "xrootd"\nversions = ["*"]\n[defaults]\nduration = "1s"\n'
        'warmup = "0.5s"\nhang_timeout = "20s"\n[ops.stat]\nclients = [2]\n'
        '[[ops.stat.expect]]\nrules = ["failed == 0", "server_ops > 0"]\n')
    pytester.makepyfile(test_suite="""
        import pytest

        @pytest.mark.storagescale_op("stat")
        def test_stat(storage_load, storage_clients):
            storage_load.run()
    """)
    results = pytester.path / "results.json"
    result = pytester.runpytest_subprocess(
        "test_suite.py", "--storage-thresholds=thr", f"--storage-results={results}",
        "-p", "no:cacheprovider", *options)
    assert result.ret == 0, result.stdout.str()
    [header] = [line for line in result.stdout.lines if line.lstrip().startswith("op ")]
    assert "server" in header.split()  # the table's column beside the client's figures
    [step] = json.loads(results.read_text())["steps"]
    server = step["server"]
    assert server["counted"] == "misc" and server["operations"] is not None, server
    sent = (step["warmup_operations"] + step["succeeded"] + step["failed"]
            + step["drain_operations"])
    assert abs(server["operations"] - sent) <= max(0.01 * sent, 50), (server, sent)
    assert step["verdict"] == "pass" and step["server_ops"] == server["requests"]
    checked = {check["metric"]: check["passed"] for check in step["checks"]}
    assert checked["server_ops"] is True, step["checks"]
    return step


def test_a_session_shows_the_embedded_servers_side(pytester):
    """Through the plugin: the session's listener, the embedded xrootd reporting to
    it and its process sampled; the table's ``server`` column, the JSON's ``server``."""
    step = _stat_suite(pytester)
    assert step["server"]["cpu"] is not None and step["server"]["connections"] >= 2
    assert step["server"]["source"].startswith("embedded xrootd (pid ")


def test_a_remote_storages_stream_is_read_where_the_option_says(pytester):
    """A remote xrootd reporting to ``--storage-server-monitor``'s address: the
    requests it served beside the clients' (its processes are not this host's to
    sample)."""
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    server = EmbeddedXRootD(https=False)
    server.report_to = address
    with server:
        step = _stat_suite(pytester, f"--storage-endpoint={server.url}",
                           f"--storage-server-monitor={address}")
    assert step["server"]["source"] == f"xrd.report to {address}"
    assert step["server"]["cpu"] is None and step["server_cpu"] is None


@pytest.mark.parametrize("value", ["9931", "host:", ":9931", "host:99999", "host:port"])
def test_a_bad_monitor_address_is_a_usage_error(pytester, value):
    result = pytester.runpytest_subprocess(
        "--storage-endpoint=memory://monitor/area", f"--storage-server-monitor={value}",
        "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*--storage-server-monitor {value!r}: give the address*"])
    assert "Traceback" not in result.stderr.str()


def test_a_monitor_address_taken_is_a_usage_error(pytester):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = pytester.runpytest_subprocess(
            "--storage-endpoint=memory://monitor/area", f"--storage-server-monitor={address}",
            "-p", "no:cacheprovider")
    assert result.ret == 4, result.stdout.str()
    result.stderr.fnmatch_lines([f"*--storage-server-monitor {address}: cannot listen there*"])


def test_good_monitor_addresses_are_taken():
    from pytest_storagescale.load.server_monitor import parse_listen_address

    assert parse_listen_address("0.0.0.0:9931") == "0.0.0.0:9931"
    assert parse_listen_address("[::1]:9931") == "[::1]:9931"


def test_a_servers_processes_are_sampled_with_what_they_forked():
    """A daemon's workers (Apache's, GridFTP's) count: CPU and threads of the process
    tree, the window's CPU read between the samples around it."""
    import subprocess
    import sys

    import psutil

    from pytest_storagescale.load.server_monitor import ProcessSampler, sample_processes

    busy = "import time\nend = time.time() + 2\nwhile time.time() < end: pass\n"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys\n"
        f"subprocess.run([sys.executable, '-c', {busy!r}])\n")])
    try:
        sampler = ProcessSampler([parent.pid])
        sampler.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(  # the worker has run a while
                sum(child.cpu_times()[:2]) for child in psutil.Process(parent.pid).children()):
            time.sleep(0.02)
        tree, threads, connections = sample_processes([parent.pid], with_connections=True)
        alone = sum(psutil.Process(parent.pid).cpu_times()[:2])
        assert tree > alone and threads >= 2 and connections == 0  # the child's count
        parent.wait(timeout=60)
        sampler.stop()
    finally:
        parent.kill()
        parent.wait()
    first, last = sampler.samples[0][0], sampler.samples[-1][0]
    cpu, most_threads, _ = sampler.over(first, last)
    assert cpu is not None and cpu > 0 and most_threads >= 2
    assert sampler.over(last, first) == (None, None, None)  # no window: nothing known


def test_a_calibration_that_does_not_end_is_given_up(monkeypatch):
    """The stats that measure the server's count per operation have a deadline: a
    server that does not answer them costs the step its comparison, not its time."""
    from pytest_storagescale.load import server_monitor as monitor

    monkeypatch.setattr(monitor, "CALIBRATION_DEADLINE", 0.5)
    listener = SummaryListener()
    host, port = listener.address.split(":")
    stop, never = threading.Event(), threading.Event()

    def report() -> None:  # a server reporting ten times a second
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            while not stop.wait(0.1):
                sender.sendto(SUMMARY, (host, int(port)))

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        # returns while the requests still hang (they end only when the test ends)
        assert listener.per_operation("stat", "root", "misc", lambda n: never.wait()) == 0
        assert set(listener.latest()) == {"vm:1094"}  # the reports came meanwhile
    finally:
        stop.set()
        never.set()
        reporter.join()
        listener.close()


def test_a_server_gone_at_the_loads_end_leaves_the_counts_uncompared():
    """Two servers reported at the load's start, one at its end (a data server stopped
    mid-step): its part is unknown, so the counts are kept but not compared."""
    from pytest_storagescale.load.server_monitor import Summary

    def report(source: str, misc: int, started: int = 100) -> Summary:
        return Summary(source=source, received=1.0, started=started, ops={"misc": misc})

    watch = ServerWatch(source="test", operation="stat", listener=SummaryListener())
    try:
        watch.entered = True
        watch.before = {"a:1": report("a:1", 10), "b:2": report("b:2", 10)}
        watch.after = {"a:1": report("a:1", 210)}
        usage = watch.usage(0.0, 1.0)
        assert usage.ops == {"misc": 200} and usage.counted == "" and usage.operations is None
        assert "no report at the load's end from b:2" in usage.counters_note
        watch.after = {"a:1": report("a:1", 210), "b:2": report("b:2", 5, started=200)}
        assert "b:2 (stopped or restarted" in watch.usage(0.0, 1.0).counters_note
        watch.after = {"a:1": report("a:1", 210), "b:2": report("b:2", 30)}
        assert watch.usage(0.0, 1.0).operations == 220  # both: compared
    finally:
        watch.listener.close()


def test_a_window_shorter_than_the_connections_sampling_still_has_connections():
    """Connections are sampled once a second: a window holding no such sample takes
    the nearest one's; CPU counts only what was used inside the window."""
    from pytest_storagescale.load.server_monitor import ProcessSampler

    sampler = ProcessSampler([])
    sampler.samples = [(0.0, 1.0, 5, 7), (0.25, 2.0, 6, None), (0.5, 2.0, 9, None),
                       (1.0, 4.0, 5, 3)]
    assert sampler.over(0.2, 0.6) == (pytest.approx(0.6), 9, 7)
    assert sampler.over(0.7, 0.9) == (pytest.approx(0.8), 5, 3)  # the nearest samples


def _wait_for(condition, limit: float = 10.0) -> bool:
    """Poll ``condition`` until it holds (a ceiling, not a wait)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _as_another_user(code: str) -> subprocess.CompletedProcess:
    """Run Python ``code`` as an unprivileged other user when this is root (the
    co-tenant of issue 31), else as this user; its output."""
    import shutil
    import sys

    command = [sys.executable, "-c", code]
    if os.geteuid() == 0 and shutil.which("setpriv"):
        command = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


#: a co-tenant's forger: sends ``PACKET`` to ``ADDRESS`` (a Unix socket's path or
#: host:port) from a socket bound, with SO_REUSEADDR, to each of ``PORTS`` (the
#: server's own report ports) and from a fresh one; prints what it could send
FORGER = """
import socket
packet, address, ports = PACKET, ADDRESS, PORTS
sent = []
if address.startswith("/"):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.sendto(packet, address); sent.append("unix")
    except OSError as exc:
        print("refused:", exc)
else:
    host, port = address.rsplit(":", 1)
    for bind in [None, *ports]:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            if bind is not None:
                s.bind(("127.0.0.1", bind))
            s.sendto(packet, (host, int(port))); sent.append(bind)
        except OSError as exc:
            print("refused:", bind, exc)
print("sent:", sent)
"""


def _forge(address: str, packet: bytes, ports: list[int]) -> str:
    code = (FORGER.replace("PACKET", repr(packet)).replace("ADDRESS", repr(address))
            .replace("PORTS", repr(ports)))
    done = _as_another_user(code)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _udp_ports(pid: int) -> list[int]:
    import psutil

    process = psutil.Process(pid)
    listing = getattr(process, "net_connections", None) or process.connections
    return [c.laddr[1] for c in listing(kind="udp") if c.laddr]


def test_another_user_cannot_forge_the_embedded_servers_reports():
    """Issue 31: the listener trusted a sender by its port, and xrootd binds its report
    socket with SO_REUSEADDR, so another user bound the same port and its forged report
    made a passing step an error. Now the embedded server reports to a Unix socket in
    a private folder that only its user may write to, and only packets whose sender
    pid (SO_PASSCRED: the kernel's word) is the server's count: the other user's
    packets, from the server's own ports or anywhere, never reach the counters."""
    from pytest_storagescale.servers.processes import unprivileged_user
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    server = EmbeddedXRootD(https=False)
    listener = SummaryListener(senders=server.server_pids, user=unprivileged_user(),
                               folder=MONITOR_FOLDER)
    server.report_to = listener.address
    try:
        with server:
            assert _wait_for(lambda: len(listener.latest()) == 1, 30)
            [genuine] = listener.latest()
            ports = _udp_ports(server.pid)  # none now: it reports over the Unix socket
            forged = SUMMARY.replace(b'src="vm:1094"', b'src="forged:1"')
            said = _forge(listener.address, forged, ports)
            last = listener.latest()[genuine].received  # a report after the forgery
            assert _wait_for(lambda: listener.latest()[genuine].received > last, 10)
            assert set(listener.latest()) == {genuine}, (said, listener.latest())
            # this process (root, or the server's user) is not the server either
            own = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            own.sendto(forged, listener.address)
            own.close()
            assert _wait_for(lambda: listener.refusals()["sender"] >= 1, 10)
            assert set(listener.latest()) == {genuine}
            # as root, the other user cannot even reach the socket (its mode is 0600)
            assert "sent: []" in said or os.geteuid() != 0, said
    finally:
        listener.close()
    assert not os.path.exists(listener.address)  # its folder goes with it


def test_a_report_forged_by_another_process_of_this_host_is_dropped():
    """The embedded server's listener counts only its daemons' reports: a co-tenant
    sending a summary with the server's ``src`` (to make a passing step an error, or
    hide a disagreement) is ignored; the server's own process is heard."""
    import sys

    server = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, sys\n"
         "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
         "print('ready', flush=True)\n"
         "path = sys.stdin.buffer.readline().strip().decode()\n"
         "s.sendto(sys.stdin.buffer.read(), path)\n"
         "sys.stdin.close(); import time; time.sleep(30)\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    listener = SummaryListener(senders=lambda: [server.pid], folder=MONITOR_FOLDER)
    try:
        server.stdout.readline()
        forged = SUMMARY.replace(b"<misc>20</misc>", b"<misc>99999</misc>")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as co_tenant:
            co_tenant.sendto(forged, listener.address)
        server.stdin.write(f"{listener.address}\n".encode() + SUMMARY)
        server.stdin.close()
        assert _wait_for(lambda: "vm:1094" in listener.latest())
        assert listener.latest()["vm:1094"].ops["misc"] == 20
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as co_tenant:
            co_tenant.sendto(forged, listener.address)
            co_tenant.sendto(forged.replace(b'src="vm:1094"', b'src="fake:1"'),
                             listener.address)
        assert _wait_for(lambda: listener.refusals()["sender"] >= 3)
        assert set(listener.latest()) == {"vm:1094"}
        assert listener.latest()["vm:1094"].ops["misc"] == 20
    finally:
        listener.close()
        server.kill()
        server.wait()


def test_a_flood_of_forged_sources_keeps_a_bounded_number(monkeypatch):
    """A remote storage's listener takes every sender, but keeps at most MAX_SOURCES
    servers: a flood of distinct ``src`` names does not grow the session's memory."""
    from pytest_storagescale.load import server_monitor as monitor

    monkeypatch.setattr(monitor, "MAX_SOURCES", 5)
    listener = SummaryListener()
    try:
        host, port = listener.address.rsplit(":", 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flood:
            for index in range(20):
                flood.sendto(SUMMARY.replace(b'src="vm:1094"', f'src="h{index}:1"'.encode()),
                             (host, int(port)))
                time.sleep(0.01)
        assert _wait_for(lambda: len(listener.latest()) >= 5)
        time.sleep(0.5)
        assert len(listener.latest()) == 5
    finally:
        listener.close()


def test_a_flood_from_other_processes_is_looked_at_once_a_second(monkeypatch):
    """Whether a sender is the server's is read from the process table, which costs:
    a flood of forged packets is not looked up per packet."""
    from pytest_storagescale.load import server_monitor as monitor

    looks = []
    real = monitor._tree_pids
    monkeypatch.setattr(monitor, "_tree_pids", lambda pids: looks.append(1) or real(pids))
    server = subprocess.Popen(["sleep", "60"])  # the "server": it sends nothing
    listener = SummaryListener(senders=lambda: [server.pid], folder=MONITOR_FOLDER)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as forger:
            for _ in range(50):
                forger.sendto(SUMMARY, listener.address)
        assert _wait_for(lambda: sum(listener.refusals().values()) >= 50)
        assert 1 <= len(looks) < 10, len(looks)
        assert listener.latest() == {}
    finally:
        listener.close()
        server.kill()
        server.wait()


def test_the_embedded_listeners_folder_is_made_by_the_caller_and_private(tmp_path):
    """load/server_monitor.py imports no server code: the folder of an embedded
    server's socket is made by the caller (the session: a recorded server folder); a
    listener of an embedded server given none, or one other users may open, starts
    nothing."""
    with pytest.raises(TypeError, match="folder="):
        SummaryListener(senders=lambda: [])
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(ValueError, match="open to other users"):
        SummaryListener(senders=lambda: [], folder=lambda: folder)
    assert list(folder.iterdir()) == []


#: a UTF-16 summary whose counter is an entity (a byte search for ``<!`` misses it)
UTF16_ENTITY = ('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE statistics '
                '[<!ENTITY n "777777">]><statistics src="vm:1094" tos="100">'
                '<stats id="xrootd"><ops><misc>&n;</misc></ops></stats></statistics>'
                ).encode("utf-16")


def test_a_utf16_packet_declaring_an_entity_is_refused():
    """Issue 31: the DOCTYPE guard was a byte search, and a UTF-16 packet expanded an
    entity into the counter. The packet is now read as drivers/xmlsafe.py reads a
    server's XML: a document type is refused in any encoding; the listener drops it."""
    assert b"<!" not in UTF16_ENTITY  # what the byte search looked for
    assert parse_summary(UTF16_ENTITY) is None
    plain = UTF16_ENTITY.decode("utf-16").replace('encoding="UTF-16"', "").encode()
    assert parse_summary(plain) is None
    listener = SummaryListener()
    try:
        host, port = listener.address.rsplit(":", 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hostile:
            hostile.sendto(UTF16_ENTITY, (host, int(port)))
        assert _wait_for(lambda: listener.refusals()["packet"] == 1)
        assert listener.latest() == {}
    finally:
        listener.close()


@pytest.mark.parametrize("packet", [
    SUMMARY.replace(b'tos="100"', b'tos="soon"'),  # a bad number ended the thread
    SUMMARY.replace(b"<misc>20</misc>", b"<misc>" + b"9" * 5000 + b"</misc>"),
    SUMMARY.replace(b"<misc>20</misc>", b"<misc>-5</misc>"),
    b"<statistics>" + b"<x>" * 100 + b"</x>" * 100 + b"</statistics>" + b" " * 20000,
])
def test_hostile_numbers_and_sizes_leave_the_listener_working(packet):
    """A number no counter holds is left out, a packet longer than PACKET_BYTES is
    refused unread; the listener goes on taking reports."""
    listener = SummaryListener()
    try:
        host, port = listener.address.rsplit(":", 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(packet, (host, int(port)))
            time.sleep(0.2)
            sender.sendto(SUMMARY.replace(b'src="vm:1094"', b'src="after:1"'),
                          (host, int(port)))
        assert _wait_for(lambda: "after:1" in listener.latest())
        kept = listener.latest().get("vm:1094")
        assert kept is None or (kept.started >= 0 and all(
            0 <= value < 2**63 for value in kept.ops.values())), kept
    finally:
        listener.close()


FLOODER = """
import socket, time
host, port = ADDRESS.rsplit(":", 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end, sent = time.monotonic() + SECONDS, 0
while time.monotonic() < end:
    try:
        s.sendto(b"<junk/>", (host, int(port))); sent += 1
    except OSError:
        pass
print(sent)
"""


def test_a_flood_is_read_at_a_bounded_rate_and_the_step_says_not_measured(monkeypatch):
    """Issue 31: a flood of the listener (here another user's, for 3 s) silently
    switched the counters' check off. Now at most MAX_PACKETS_PER_S packets a second
    are parsed, the rest is left to the kernel to drop, and a step whose reports did
    not come says why, flood named, as ``counts_unmeasured``: the verdict's "not
    measured" (see the session test below)."""
    from pytest_storagescale.load import server_monitor as monitor

    parsed = []
    real = monitor.parse_summary
    monkeypatch.setattr(monitor, "parse_summary", lambda data: parsed.append(1) or real(data))
    monkeypatch.setattr(monitor, "FRESH_WAIT", 1.0)
    listener = SummaryListener()
    watch = ServerWatch(source="test", operation="stat", listener=listener)
    try:
        started = time.monotonic()
        flooder = threading.Thread(target=lambda: _as_another_user(
            FLOODER.replace("ADDRESS", repr(listener.address)).replace("SECONDS", "3")))
        flooder.start()
        time.sleep(0.5)  # the flood runs
        with watch.bracket():
            flooder.join()
        elapsed = time.monotonic() - started
        assert listener.refusals()["rate"] >= 1, listener.refusals()
        assert len(parsed) <= monitor.MAX_PACKETS_PER_S * (elapsed + 1), (len(parsed), elapsed)
        usage = watch.usage(0.0, 1.0)
        assert usage.compare_with == "misc" and usage.counted == ""
        why = usage.counts_unmeasured
        assert "no summary report from the server" in why, why
        assert f"more than {monitor.MAX_PACKETS_PER_S} packets a second" in why, why
        again = ServerUsage.from_json(json.loads(json.dumps(usage.to_json())))
        assert again.counts_unmeasured == why
    finally:
        listener.close()


def test_a_step_whose_server_counters_could_not_be_taken_says_not_measured(pytester):
    """A remote xrootd whose summary monitoring never reaches --storage-server-monitor
    (not configured, or drowned by a flood): the step's counts are not compared, and
    the verdict says so where it is read: a line under the table, a warning in the
    test's report (pytest's summary counts it), the JSON."""
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "t.toml").write_text(
        '[storage]\nsystem = "xrootd"\nversions = ["*"]\n[defaults]\nduration = "1s"\n'
        'warmup = "0.5s"\nhang_timeout = "20s"\n[ops.stat]\nclients = [2]\n'
        '[[ops.stat.expect]]\nrules = ["failed == 0"]\n')
    pytester.makepyfile(test_suite="""
        import pytest

        @pytest.mark.storagescale_op("stat")
        def test_stat(storage_load, storage_clients):
            storage_load.run()
    """)
    results = pytester.path / "results.json"
    with EmbeddedXRootD(https=False) as server:  # it reports nowhere
        result = pytester.runpytest_subprocess(
            "test_suite.py", "--storage-thresholds=thr", f"--storage-results={results}",
            f"--storage-endpoint={server.url}", f"--storage-server-monitor={address}",
            "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*stat at 2 clients (pass): not measured: the server's count of its operations*"
        "no summary report from the server within*",
        "*1 passed, 1 warning*",
    ])
    [step] = json.loads(results.read_text())["steps"]
    assert step["verdict"] == "pass"
    assert "no summary report" in step["server"]["counts_unmeasured"], step["server"]
