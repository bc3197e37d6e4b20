"""``--storage-cluster embedded-slurm:N`` (issue 36): the plugin starts a SLURM cluster
for the run (munged, slurmctld, one slurmd per network-namespace host:
:mod:`pytest_storagescale.servers.slurm_hosts`), dask-jobqueue submits the Dask
workers as SLURM jobs, a suite's scan runs on them against a real xrootd, and nothing
of it is left afterwards, also when pytest is killed with SIGKILL.

Needs root and Debian's slurmctld, slurmd, slurm-client and munge (scripts/bootstrap.sh
servers); skipped with the reason otherwise. The refusals (SLURM missing, a loopback
or embedded endpoint) need neither.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import bridge_xrootd, netns_unavailable
from plans import op_section, plan, scan_suite, write_suite

from pytest_storagescale.servers import netns as server_netns
from pytest_storagescale.servers import slurm_hosts
from pytest_storagescale.servers.orphans import stop_orphaned_servers

# one worker at a time with the other namespace tests (their bridges and subnets)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("network_namespaces")]

HOSTS = 2

#: a test that waits (for the SIGKILL test: pytest is killed while it runs)
WAITING = """
import time

def test_waits(storage_endpoint):
    time.sleep(120)
"""

HEADER = re.compile(r"storagescale: embedded SLURM for this run: controller (\S+), "
                    r"(\d+) client hosts \(network namespaces\), up in ([\d.]+) s, \d+ worker "
                    r"jobs joined ([\d.]+) s later; folder (\S+)")
NODE = re.compile(r"^  slurm node (ns\d+) (\S+): job (\d+) (\w+), Dask worker (\S+), "
                  r"memory (\d+) MB", re.M)


def _needs_slurm() -> None:
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    missing = slurm_hosts.missing_commands()
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)}): scripts/bootstrap.sh "
                    f"servers installs slurmctld slurmd slurm-client munge")


def _ours() -> dict[str, list[str]]:
    """What of an embedded SLURM exists now: folders, processes working in or naming
    one, veths of its naming, its daemons' listening sockets."""
    tmp = Path(tempfile.gettempdir())
    folders = sorted(str(p) for p in tmp.glob("storagescale-slurm-*"))
    processes = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if b"storagescale-slurm-" in command or "storagescale-slurm-" in cwd \
                or re.match(rb"(slurmctld|slurmd|slurmstepd|munged)\b", command.split(b"/")[-1]):
            processes.append(f"{entry} {command.decode(errors='replace')[:160]}")
    links = re.findall(r"\d+: (sl[0-9a-f]{6}[hpc]\d*)\S*:", subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout)
    sockets = [line for line in subprocess.run(
        ["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout.splitlines()
        if re.search(r'"(slurm\w*|munged)"', line)]
    return {"folders": folders, "processes": processes, "links": links, "sockets": sockets}


def _nothing_left(before: dict[str, list[str]], timeout: float = 30) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        now = _ours()
        new = {k: sorted(set(v) - set(before[k])) for k, v in now.items()}
        if not any(new.values()) or time.monotonic() > deadline:
            return new
        time.sleep(0.5)


@pytest.fixture(scope="module")
def server():
    """One xrootd on the address of an interface made for it (netns.bridge_xrootd): the
    embedded SLURM's hosts reach it through their default route."""
    _needs_slurm()
    with bridge_xrootd(https=False) as xrootd:
        yield xrootd


def _suite(pytester, body: str = "") -> None:
    """``body`` (the stat scan when empty) with a plan of 4 clients that loses none."""
    write_suite(pytester.path, body or scan_suite("stat"), plan(op_section("stat", 4)))


def _command(address: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
            f"--storage-endpoint=root://{address}:{port}//storagescale",
            "--storage-version=5.5", "--storage-thresholds=thr",
            f"--storage-cluster=embedded-slurm:{HOSTS}", *extra]


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_a_suite_runs_its_clients_as_jobs_of_a_slurm_cluster_of_its_own(server, pytester):
    """pytest --storage-cluster embedded-slurm:2: the header names the run's SLURM, up,
    with one RUNNING job on each namespace host; the stat scan's 4 clients ran 2 on
    each of those hosts (the per-host rows, the JSON), the xrootd saw logins from both
    hosts' addresses; afterwards no folder, process, veth or socket of it is left."""
    address = server.host
    before = _ours()
    _suite(pytester)
    since = len(server.log_path.read_bytes())
    began = time.monotonic()
    done = subprocess.run(
        _command(address, server.port, "--storage-results=out.json", "-v", "test_suite.py"),
        cwd=pytester.path, capture_output=True, text=True, timeout=400, env=_environment())
    took = time.monotonic() - began
    output = done.stdout + done.stderr
    print(output)
    print(f"the whole pytest run took {took:.1f} s")
    assert done.returncode == 0, output[-3000:]
    header = HEADER.search(output)
    assert header is not None, output[-3000:]
    controller, hosts, up_in, joined_in, folder = header.groups()
    assert int(hosts) == HOSTS and float(up_in) > 0 and float(joined_in) > 0
    nodes = NODE.findall(output)
    # SLURM's own view (squeue): one running job on each host
    assert sorted(n[0] for n in nodes) == [f"ns{i}" for i in range(HOSTS)], output[-3000:]
    assert {n[3] for n in nodes} == {"RUNNING"} and len({n[2] for n in nodes}) == HOSTS
    assert all(int(n[5]) > 0 for n in nodes), nodes
    print("memory per client host (MB):", {n[0]: int(n[5]) for n in nodes})
    job_addresses = sorted(n[1] for n in nodes)
    # the per-host rows are those hosts' addresses and Dask workers, 2 clients each
    rows = re.findall(r"^  host (\S+)\s+([\d.]+)\s+clients\s+(\d+)\s+succeeded\s+(\d+)",
                      output, re.M)
    assert sorted(r[1] for r in rows) == job_addresses and {r[2] for r in rows} == {"2"}, rows
    assert sorted((r[1], r[0]) for r in rows) == sorted((n[1], n[4]) for n in nodes), \
        (rows, nodes)
    [step] = json.loads((pytester.path / "out.json").read_text())["steps"]
    assert step["executor"] == "cluster" and step["lost"] == 0 and step["failed"] == 0
    assert sorted(h["address"] for h in step["hosts"]) == job_addresses
    assert sum(h["succeeded"] for h in step["hosts"]) == step["succeeded"] > 0
    # the server's own log: the load clients logged in from the job hosts' addresses
    log = server.log_path.read_text(errors="replace")[since:]
    seen = set(re.findall(r"XrootdXeq: \S+@\[?(?:::ffff:)?([\d.]+)\]? \S+ \S+ login", log))
    assert set(job_addresses) <= seen, seen
    assert controller not in seen
    # nothing of it is left: its folder, processes, veths, sockets
    assert _nothing_left(before) == {"folders": [], "processes": [], "links": [],
                                     "sockets": []}
    assert not Path(folder).exists()


def test_a_killed_pytest_leaves_its_slurm_to_the_orphan_cleaner(server, pytester):
    """pytest SIGKILLed once its SLURM cluster runs (jobs and all): the next server
    start's orphan cleaner stops its daemons, namespace holders and jobs and removes
    its folder; the namespaces and veths go with their processes."""
    before = _ours()
    with _waiting_pytest(server, pytester) as (process, lines):
        running = _ours()
        assert running["folders"] and running["processes"], running
        _no_door(Path(HEADER.search("".join(lines)).group(5)), process.pid)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    killed = time.monotonic()
    stopped = stop_orphaned_servers()
    print(f"the orphan cleaner took {time.monotonic() - killed:.1f} s: {stopped}")
    assert any("storagescale-slurm-" in s.directory and s.killed for s in stopped), stopped
    assert _nothing_left(before, timeout=60) == {"folders": [], "processes": [],
                                                 "links": [], "sockets": []}
    print(f"nothing left {time.monotonic() - killed:.1f} s after the SIGKILL")


def test_sigterm_stops_its_slurm_and_leaves_nothing(server, pytester):
    """pytest given SIGTERM (a CI runner's cancel) while its jobs run: the session ends
    as after Ctrl-C, and its own clean-up cancels the jobs, stops the daemons and
    removes the namespaces and the folder (no orphan cleaner needed)."""
    before = _ours()
    with _waiting_pytest(server, pytester) as (process, lines):
        assert _ours()["processes"], lines
        os.kill(process.pid, signal.SIGTERM)
        began = time.monotonic()
        rest, _ = process.communicate(timeout=120)
        print(f"pytest ended {time.monotonic() - began:.1f} s after SIGTERM")
    assert process.returncode not in (0, -signal.SIGTERM), "".join(lines) + rest
    assert _nothing_left(before) == {"folders": [], "processes": [], "links": [],
                                     "sockets": []}, rest[-3000:]


@contextlib.contextmanager
def _waiting_pytest(server, pytester) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """A pytest of a test that waits, on ``embedded-slurm:2`` against ``server``: given
    once its header is out and its jobs run (with its output so far), killed at the end
    if it still runs."""
    _suite(pytester, WAITING)
    process = subprocess.Popen(_command(server.host, server.port, "test_suite.py"),
                               cwd=pytester.path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=_environment(),
                               start_new_session=True)
    began = time.monotonic()
    try:
        lines = _until_jobs_run(process)
        print(f"pytest's SLURM up and its jobs running after {time.monotonic() - began:.1f} s")
        yield process, lines
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def _until_jobs_run(process: subprocess.Popen) -> list[str]:
    """pytest's output up to its header's SLURM nodes (its jobs run then)."""
    lines: list[str] = []
    stream = process.stdout
    assert stream is not None

    def read() -> None:  # a reader thread: the wait below stays bounded
        for line in iter(stream.readline, ""):
            lines.append(line)
            if len(NODE.findall("".join(lines))) == HOSTS:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=300)
    assert any(HEADER.search(line) for line in lines), "".join(lines)[-3000:]
    return list(lines)


def _no_door(folder: Path, pytest_pid: int) -> None:
    """While it runs: the folder 0700, the munge key 0400 and slurm.conf 0600 in 0700
    folders; nothing of SLURM's or munge's listens in this machine's namespace, and the
    pytest process (the Dask scheduler) listens on loopback and the run's bridge only."""
    assert folder.stat().st_mode & 0o777 == 0o700
    key, conf = folder / "run" / "munge" / "munge.key", folder / "run" / "slurm" / "slurm.conf"
    assert key.stat().st_mode & 0o777 == 0o400 and conf.stat().st_mode & 0o777 == 0o600
    for path in (key, conf):
        parent = path.parent
        while parent != folder.parent:
            assert parent.stat().st_mode & 0o077 == 0, parent
            parent = parent.parent
    assert _ours()["sockets"] == []
    listening = [line.split()[3] for line in subprocess.run(
        ["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout.splitlines()
        if f"pid={pytest_pid}," in line]
    head = HEADER_HEAD.search(conf.read_text())
    assert head is not None
    bridge = head.group(1).rsplit(".", 1)[0] + ".1"
    assert listening and all(a.rsplit(":", 1)[0] in ("127.0.0.1", bridge)
                             for a in listening), (listening, bridge)


HEADER_HEAD = re.compile(r"SlurmctldHost=\S+\((\S+)\)")


def test_a_start_past_its_deadline_is_one_paragraph_and_leaves_nothing(monkeypatch):
    """SLURM's nodes not idle within the deadline (0 s here): one paragraph naming the
    deadline, the nodes' states and slurmctld's log; every daemon, namespace and file
    of the start gone."""
    _needs_slurm()
    from pytest_storagescale.cluster.address import parse_cluster_address
    from pytest_storagescale.errors import StorageScaleUsageError

    before = _ours()
    monkeypatch.setattr(slurm_hosts, "START_TIMEOUT", 0.0)
    with pytest.raises(StorageScaleUsageError) as raised:
        slurm_hosts.start_cluster(parse_cluster_address("embedded-slurm:2"))
    text = str(raised.value)
    assert text.startswith("--storage-cluster embedded-slurm:2: the run's SLURM cluster did "
                           "not start: the SLURM nodes were not idle within 0 s"), text
    assert "slurmctld:" in text and "\n" not in text
    assert _nothing_left(before) == {"folders": [], "processes": [], "links": [],
                                     "sockets": []}


def test_a_network_that_fails_half_made_leaves_no_veth(monkeypatch):
    """The second host's veth pair made, moving it into the bridge's namespace failing
    (both ends still in this machine's namespace): one paragraph, and no veth, holder
    or folder left."""
    _needs_slurm()
    from pytest_storagescale.cluster.address import parse_cluster_address
    from pytest_storagescale.errors import StorageScaleUsageError

    before = _ours()
    real = server_netns.ip

    def failing(*args: str, netns: str | None = None) -> str:
        if args[:2] == ("link", "set") and args[2].endswith("p1") and "netns" in args:
            raise server_netns.NetnsError(f"'ip {' '.join(args)}' failed: made to fail by "
                                          f"the test")
        return real(*args, netns=netns)

    monkeypatch.setattr(server_netns, "ip", failing)
    with pytest.raises(StorageScaleUsageError, match=r"the run's SLURM cluster did not "
                       r"start: 'ip link set sl[0-9a-f]{6}p1 netns \d+' failed: made to fail"):
        slurm_hosts.start_cluster(parse_cluster_address("embedded-slurm:2"))
    assert _nothing_left(before, timeout=15) == {"folders": [], "processes": [],
                                                 "links": [], "sockets": []}


def test_jobs_that_do_not_join_in_time_are_cancelled_and_nothing_is_left(monkeypatch):
    """The worker jobs not joined within the recipe's deadline (1 s here): one paragraph
    saying how many joined, and the jobs, daemons, namespaces and folder gone with it
    (the connection that was never made closed its cluster)."""
    _needs_slurm()
    from pytest_storagescale.cluster import hosts as cluster_hosts
    from pytest_storagescale.errors import StorageScaleUsageError

    before = _ours()
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # a recipe, not under -n
    monkeypatch.setitem(cluster_hosts.RECIPE_START_TIMEOUT, "embedded-slurm", 1.0)
    cluster_hosts.register_recipe(slurm_hosts.RECIPE, slurm_hosts.start_cluster)
    with pytest.raises(StorageScaleUsageError, match=r"--storage-cluster embedded-slurm:2: "
                       r"only [01] of 2 hosts joined within 1 s"):
        cluster_hosts.connect("embedded-slurm:2")
    assert "embedded-slurm:2" not in cluster_hosts._OPEN
    assert _nothing_left(before) == {"folders": [], "processes": [], "links": [],
                                     "sockets": []}


def test_without_slurm_it_is_one_paragraph_before_any_load(pytester, tmp_path):
    """SLURM's commands not on PATH: exit 4, one paragraph naming them and the packages
    that install them, before any test runs."""
    _suite(pytester)
    empty = tmp_path / "bin"
    empty.mkdir()
    done = subprocess.run(_command("192.0.2.200", 1094, "test_suite.py"),
                          cwd=pytester.path, capture_output=True, text=True, timeout=120,
                          env={**_environment(), "PATH": str(empty)})
    output = done.stdout + done.stderr
    assert done.returncode == 4, output[-3000:]
    assert output.count("ERROR:") == 1 and "Traceback" not in output, output[-3000:]
    assert re.search(r"ERROR: --storage-cluster embedded-slurm:2 starts a SLURM cluster for "
                     r"the run, and munged, slurmctld, .* are not on PATH\. Install Debian's "
                     r"slurmctld slurmd slurm-client munge", output), output[-3000:]
    assert "passed" not in output and "test_stat_scan" not in output.split("ERROR:")[0]


def test_under_xdist_it_is_one_paragraph_before_the_workers_start(pytester):
    """pytest -n 2 --storage-cluster embedded-slurm:2: the controller says once, exit 4,
    that every worker would start its own cluster (each worker's header raised it with a
    traceback, and xdist replaced the crashed workers 8 times); no SLURM started."""
    _suite(pytester)
    before = _ours()
    command = _command("192.0.2.200", 1094, "test_suite.py")
    at = command.index("no:xdist")
    del command[at - 1:at + 1]  # -p no:xdist
    done = subprocess.run([*command, "-n", "2"], cwd=pytester.path, capture_output=True,
                          text=True, timeout=300, env=_environment())
    output = done.stdout + done.stderr
    assert done.returncode == 4, output[-3000:]
    assert output.count("ERROR:") == 1 and "Traceback" not in output, output[-3000:]
    assert "ERROR: --storage-cluster embedded-slurm:2: under pytest -n every worker would " \
           "start its own cluster." in output, output[-3000:]
    assert _ours()["folders"] == before["folders"]


@pytest.mark.parametrize("endpoint", ["root://127.0.0.1:1094//storagescale",
                                      "root://localhost:1094//storagescale"])
def test_a_loopback_endpoint_is_refused_before_any_load(pytester, endpoint):
    """The namespace hosts' loopback is their own: an endpoint on 127.0.0.1 or
    localhost is one paragraph, exit 4 (no SLURM started)."""
    if slurm_hosts.missing_commands() or os.geteuid() != 0:
        pytest.skip("the endpoint is checked after SLURM's commands and root")
    _suite(pytester)
    before = _ours()
    command = [c if not c.startswith("--storage-endpoint=") else
               f"--storage-endpoint={endpoint}" for c in _command("x", 1, "test_suite.py")]
    done = subprocess.run(command, cwd=pytester.path, capture_output=True, text=True,
                          timeout=120, env=_environment())
    output = done.stdout + done.stderr
    assert done.returncode == 4, output[-3000:]
    assert output.count("ERROR:") == 1 and "Traceback" not in output, output[-3000:]
    assert "whose loopback is their own: they cannot reach the endpoint at" in output
    assert _ours()["folders"] == before["folders"]


def test_embedded_slurm_is_parsed_and_bounded():
    from pytest_storagescale.cluster.address import parse_cluster_address
    from pytest_storagescale.errors import StorageScaleUsageError

    address = parse_cluster_address("embedded-slurm:3")
    assert (address.recipe, address.hosts) == ("embedded-slurm", 3)
    with pytest.raises(StorageScaleUsageError, match="needs its number of hosts"):
        parse_cluster_address("embedded-slurm")
    with pytest.raises(StorageScaleUsageError, match="unknown cluster"):
        parse_cluster_address("embedded-condor:2")
    with pytest.raises(StorageScaleUsageError, match="at most 64 client hosts"):
        slurm_hosts.check_usable("embedded-slurm:65", embedded_endpoint=False,
                                 endpoint_host="192.0.2.2")


def test_an_embedded_endpoint_is_refused_unless_its_door_host_is_linked():
    """An embedded server on this machine's loopback cannot be reached from the client
    hosts: one paragraph. The dCache over several hosts (its door host linked to the
    client hosts, slurm_hosts.offer_door) is let through."""
    from pytest_storagescale.errors import StorageScaleUsageError

    if slurm_hosts.missing_commands() or os.geteuid() != 0:
        pytest.skip("the endpoint is checked after SLURM's commands and root")
    with pytest.raises(StorageScaleUsageError, match="listen on this machine's loopback only"
                       ".*--storage-embedded-hosts 4"):
        slurm_hosts.check_usable("embedded-slurm:4", embedded_endpoint=True,
                                 endpoint_host=None)
    slurm_hosts.check_usable("embedded-slurm:4", embedded_endpoint=True, endpoint_host=None,
                             embedded_on_hosts=True)


def _listener(netns: str):
    import socket

    from pytest_storagescale.servers.dcache_hosts import in_namespace

    return in_namespace(netns, lambda: socket.create_server(("0.0.0.0", 0)))


def _connects(netns: str, address: str, port: int) -> str:
    """'' when a TCP connection from ``netns`` to ``address:port`` is made, else why not."""
    import socket

    from pytest_storagescale.servers.dcache_hosts import in_namespace

    def attempt() -> str:
        try:
            socket.create_connection((address, port), timeout=3).close()
            return ""
        except OSError as exc:
            return str(exc) or type(exc).__name__
    return in_namespace(netns, attempt)


def test_a_server_door_host_is_linked_to_the_client_hosts_and_its_pools_are_not(tmp_path):
    """The wiring of the dCache over several hosts with embedded-slurm, without a
    dCache or SLURM: the server's hosts (ServerNetwork: core, door, 2 pools on their
    bridge) and the client hosts' namespaces and bridge. A door offered before and one
    offered after the client hosts started are both reached from every client host at
    the door's client-side address; a listener on a pool host is not, even from a
    client host that routes the pools' network to the door (no namespace forwards);
    withdrawn, the routes go."""
    unavailable = netns_unavailable()
    if unavailable:
        pytest.skip(unavailable)
    from pytest_storagescale.servers.dcache_hosts import ServerNetwork

    first = ServerNetwork(tmp_path / "a", pools=2)
    second = ServerNetwork(tmp_path / "b", pools=2)
    clients = slurm_hosts.EmbeddedSlurmHosts(2)
    doors = []
    try:
        for network in (first, second):
            network.directory.mkdir()
        first.start()
        door = slurm_hosts.ServerDoor(first.host("door").holder.pid, (first.front,))
        slurm_hosts.offer_door(door)  # before the client hosts
        doors.append(door)
        ended = subprocess.Popen(["true"])
        ended.wait()
        gone = slurm_hosts.ServerDoor(ended.pid, ("192.0.2.9",))  # a server that died
        slurm_hosts.offer_door(gone)
        doors.append(gone)
        clients.start_network()
        assert gone not in clients.doors and door in clients.doors
        slurm_hosts.withdraw_door(doors.pop())
        second.start()
        later = slurm_hosts.ServerDoor(second.host("door").holder.pid, (second.front,))
        slurm_hosts.offer_door(later)  # after them
        doors.append(later)
        for network in (first, second):
            served = _listener(network.host("door").netns)
            pool = network.host("pool1")
            mover = _listener(pool.netns)
            for node in clients.nodes:
                assert _connects(node.netns, network.front, served.getsockname()[1]) == ""
                assert _connects(node.netns, pool.address, mover.getsockname()[1]) != ""
            # a client host that routes the pools' bridge through the door host: still no
            node = clients.nodes[0]
            via = clients.doors[doors[0] if network is first else doors[1]]
            server_netns.ip("route", "add", f"{pool.address}/32", "via", via,
                            netns=node.netns)
            assert _connects(node.netns, pool.address, mover.getsockname()[1]) != ""
            # and the pool host is up: reached from its own bridge (the door host)
            assert _connects(network.host("door").netns, pool.address,
                             mover.getsockname()[1]) == ""
            served.close()
            mover.close()
        slurm_hosts.withdraw_door(doors.pop())
        routes = server_netns.ip("route", netns=clients.nodes[1].netns)
        assert first.front in routes and second.front not in routes, routes
    finally:
        for door in doors:
            slurm_hosts.withdraw_door(door)
        clients.stop()
        first.stop()
        second.stop()
    assert not slurm_hosts._RUNNING and not slurm_hosts._DOORS
