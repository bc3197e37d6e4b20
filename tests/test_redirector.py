"""The embedded redirector (a cmsd manager and two data servers on loopback) and the
redirection checks: a file written through the manager is found on the data server
whose disk holds it and read back through the manager; a data server that goes away
is reported within a deadline, and its files are found again when it comes back;
suites/xrootd/test_redirection.py passes on the cluster and skips, saying why, on a
server that is not a redirector."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path

import psutil
import pytest
from server_side import stat_step, watched_step

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.server_monitor import SummaryListener
from pytest_storagescale.servers.family import check_embedded_choice, embedded_class
from pytest_storagescale.servers.redirector import EmbeddedXRootDCluster, located
from pytest_storagescale.servers.xrootd import AREA
from suites.conformance.doors import Door
from suites.conformance.redirection import expect_located, redirector_of, same_server

pytestmark = [pytest.mark.integration, pytest.mark.slow_server]
REPO = Path(__file__).resolve().parent.parent
#: how long a check may take to tell a data server is gone (the manager's cms.delay
#: drop is 3 s; generous for a busy machine, and far below the client's 60 s default)
NOTICE_DEADLINE = 30.0


@pytest.fixture(scope="module")
def summaries():
    """The listener the cluster's xrootds report their summary monitoring to."""
    listener = SummaryListener()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def cluster(summaries):
    server = EmbeddedXRootDCluster()
    server.report_to = summaries.address
    with server:
        yield server


def _door(cluster: EmbeddedXRootDCluster, run_dir: str, timeout: float = 10.0) -> Door:
    spec = driver_spec(cluster.url, driver="xrootd", writable_root=run_dir)
    return Door("root", spec, run_dir, timeout)


@pytest.fixture
def area(cluster, request):
    """A fresh directory of the test area (through the manager), and a client of it."""
    run_dir = f"{AREA}/{request.node.name}"
    door = _door(cluster, run_dir)
    client = door.client("redirtest")
    client.mkdir(run_dir)
    yield door, client
    client.close()


def test_the_cluster_is_a_manager_and_two_data_servers(cluster):
    """Registered as --storage-embedded redirector (root:// only); the manager names
    both data servers; every daemon runs unprivileged from the cluster's directory."""
    assert embedded_class("redirector") is EmbeddedXRootDCluster
    assert check_embedded_choice("redirector", None, "unix") == "root"
    ports = {entry.port for entry in located(cluster.server, AREA)}
    assert ports == {node.port for node in cluster.data_servers}
    assert cluster.url.startswith(f"root://127.0.0.1:{cluster.manager.port}/")
    assert cluster.manager.port not in ports
    for node in [cluster.manager, *cluster.data_servers]:
        for daemon in (node.xrootd, node.cmsd):
            process = psutil.Process(daemon.pid)
            assert str(node.directory) in " ".join(process.cmdline())
            if os.geteuid() == 0:  # xrootd -R: the effective user, who owns the data
                owner = os.stat(node.data).st_uid
                assert process.uids().effective == owner != 0
                assert pwd.getpwuid(owner).pw_name in ("xrootd", "nobody")
                # the folder and the configuration read as root stay root's
                assert os.stat(node.directory).st_uid == 0
                assert os.stat(node.directory / "node.cfg").st_uid == 0


def test_a_file_written_through_the_manager_is_located_and_read(cluster, area):
    """locate through the manager names the data server whose disk holds the file; the
    bytes read through the manager are the bytes written."""
    door, client = area
    path = door.path("one.dat")
    data = os.urandom(300_000)
    client.put(path, data)
    holders = cluster.holders(path)
    assert len(holders) == 1, holders
    answer = located(cluster.server, path)
    assert [cluster.server_index(entry.address) for entry in answer] == holders
    assert all(entry.is_server and not entry.pending for entry in answer)
    assert client.read(path, 0, len(data) + 10) == data


def test_a_data_server_that_goes_away_is_reported_and_found_again(cluster, area):
    """The check that locates a file again fails, naming the data server that held it,
    within a deadline (no hang); once the server is back, the file is found again."""
    door, client = area
    path = door.path("fault.dat")
    client.put(path, b"held by one data server")
    redirector = redirector_of(door, door.run_dir, embedded_redirector=True)
    before = expect_located(redirector, path, ())
    (holder,) = cluster.holders(path)
    gone = cluster.data_servers[holder].address
    assert [entry.address for entry in before] == [gone] or same_server(
        before[0].address, "127.0.0.1", cluster.data_servers[holder].port)
    cluster.stop_data_server(holder)
    try:
        started = time.monotonic()
        with pytest.raises(pytest.fail.Exception) as failed:
            expect_located(redirector, path, before)
        noticed = time.monotonic() - started
        message = str(failed.value)
        assert f"data server {before[0].address}, which held the file, is no longer named" \
            in message, message
        assert "locate through the redirector" in message and path in message
        assert noticed < NOTICE_DEADLINE, noticed
    finally:
        cluster.start_data_server(holder)
    after = expect_located(redirector, path, before)
    assert cluster.server_index(after[0].address) == holder
    assert client.read(path, 0, 100) == b"held by one data server"


def test_the_redirection_suite_passes_on_the_cluster(pytester):
    """suites/xrootd/test_redirection.py with --storage-embedded redirector: every check
    runs (none skipped) and passes."""
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "xrootd" / "test_redirection.py"),
        "--storage-embedded=redirector", "-p", "no:cacheprovider", "-rs", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_locate_names_data_server?root? PASSED*",
                                 "*test_ls_through_redirector?root? PASSED*"])


def test_the_checks_say_why_they_skip_on_a_standalone_server(pytester, embedded_xrootd):
    """On an xrootd that is not a redirector each check is skipped with its locate answer;
    on its davs door, because redirection is XRootD's."""
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "xrootd" / "test_redirection.py"),
        f"--storage-endpoint={embedded_xrootd.url}",
        f"--storage-door=davs={embedded_xrootd.https_url}",
        f"--storage-driver-option=ca_dir={embedded_xrootd.ca_dir}",
        "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=6)
    result.stdout.fnmatch_lines([
        "SKIPPED*root door*locate of*named *: the door serves its files itself, there "
        "is no data server to redirect to*",
        # one line, with the count, for the three checks the davs door cannot run
        "SKIPPED [[]3]*: not an XRootD door: redirection is XRootD's (kXR_locate, "
        "kXR_redirect)",
    ])


def test_a_steps_server_side_counts_every_xrootd_of_the_cluster(cluster, summaries, area):
    """The manager and both data servers report to the session's listener: a stat step
    through the manager is counted by the manager and by the data server it redirects
    to (the count per stat measured so), and the sum agrees with what the clients sent."""
    door, _ = area
    root = door.spec.writable_root
    record, watch = watched_step(cluster, summaries,
                                 stat_step(cluster, root, clients=2, duration=1.0), root)
    assert len(watch.before) == len(watch.after) == 3  # three xrootds, no cmsd
    usage = record.server
    assert usage.counted == "misc" and usage.per_operation > 2, usage  # two servers' each
    sent = record.issued_operations
    assert abs(usage.operations - sent) <= max(0.01 * sent, 50), (usage, sent)
    assert usage.threads > 0 and usage.cpu_s is not None  # six daemons sampled


@pytest.mark.parametrize(("operation", "loop"), [("stat", "compiled"), ("get", "compiled"),
                                                 ("get", "python")])
def test_each_request_through_the_manager_counts_its_redirect(cluster, area, embedded_xrootd,
                                                              operation, loop):
    """The manager redirects every open and stat to a data server: a step through it
    counts at least one redirect per request it made (XrdCl's host list: the compiled
    loop's stat and get, the Python bindings' open), with no door time (XrdCl does not
    tell it); the same step on a standalone xrootd counts none."""
    door, _ = area
    params = {"file_size": 10_000, "files": 2} if operation == "get" else {}
    redirected = stat_step(cluster, door.spec.writable_root, operation=get_operation(
        operation), clients=2, duration=1.0, warmup=0.2, params=params,
        driver=driver_spec(cluster.url, writable_root=door.spec.writable_root,
                           options={"client_loop": loop}))
    side = run_step(redirected, executor="threads").total
    assert side.succeeded > 0 and side.failed == side.hung == 0, side.errors
    made = side.warmup_operations + side.succeeded + side.drain_operations
    assert side.redirects >= made, (side.redirects, made)
    assert side.door_latency_s != side.door_latency_s  # NaN: not timed over root://
    root = f"{AREA}/redirects-{operation}-{loop}"
    direct = run_step(stat_step(embedded_xrootd, root, operation=get_operation(operation),
                                clients=2, duration=1.0, warmup=0.2, params=params,
                                driver=driver_spec(embedded_xrootd.url, writable_root=root,
                                                   options={"client_loop": loop})),
                      executor="threads").total
    assert direct.succeeded > 0 and direct.redirects == 0, direct
