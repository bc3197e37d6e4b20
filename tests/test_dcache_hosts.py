"""The embedded dCache over several hosts (issue 36, ``--storage-embedded-hosts 4``):
the core domain with PostgreSQL and ZooKeeper, the door domain and two pool domains,
each on a network-namespace host of its own on a private bridge. One real dCache
start (the release of ``dcache_release``), in one test: files go in and out through
the doors from this machine's namespace (over IPv4 and IPv6), the pools' movers listen
on every interface of their host and are reachable from the door host on the bridge
but not from here, and the stop leaves no JVM, PostgreSQL, namespace, veth or folder.

Needs root (namespaces); skipped with the reason otherwise. Grouped with the other
namespace tests (one at a time on a 2-core machine)."""

from __future__ import annotations

import ctypes
import os
import secrets
import socket
import subprocess
import threading
import time

import psutil
import pytest

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.srm import srm_ping
from pytest_storagescale.drivers.url import EndpointURL
from pytest_storagescale.errors import StorageScaleUsageError
from pytest_storagescale.servers import dcache_hosts
from pytest_storagescale.servers.dcache import AREA, LAN_PORTS, WAN_PORTS
from pytest_storagescale.servers.dcache_hosts import (
    EmbeddedDCacheHosts,
    check_hosts,
    foreign_threads,
    in_namespace,
)
from pytest_storagescale.servers.netns import wait_unshared

pytestmark = [pytest.mark.integration, pytest.mark.slow_server,
              pytest.mark.xdist_group("network_namespaces")]


def _listeners(netns: str) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket in the namespace ``netns``."""
    done = subprocess.run(["nsenter", f"--net={netns}", "ss", "-ltnH"], capture_output=True,
                          text=True, timeout=30, check=True)
    found = []
    for line in done.stdout.splitlines():
        local = line.split()[3]
        address, _, port = local.rpartition(":")
        found.append((address, int(port)))
    return found


def _connects(address: str, port: int, timeout: float = 3.0) -> bool:
    try:
        socket.create_connection((address, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                          timeout=30).stdout


def test_the_hosts_option_takes_one_or_four_and_more():
    assert check_hosts(1) == 1 and check_hosts(4) == 4 and check_hosts(9) == 9
    for wrong in (0, 2, 3, 101):
        with pytest.raises(StorageScaleUsageError, match="Give 1, or 4 or more"):
            check_hosts(wrong)


@pytest.mark.parametrize(("arguments", "said"), [
    (["--storage-embedded-hosts", "2", "--storage-embedded", "dcache"],
     "--storage-embedded-hosts 2: the embedded dCache runs on 1 host"),
    (["--storage-embedded-hosts", "4", "--storage-embedded", "xrootd"],
     "--storage-embedded-hosts 4: only the embedded dcache runs on several hosts"),
    (["--storage-embedded-hosts", "none"], "--storage-embedded-hosts: 'none' is not a number"),
])
def test_a_wrong_hosts_option_is_one_paragraph_and_exit_4(pytester, arguments, said):
    """Refused before any server starts (exit 4, no traceback)."""
    pytester.makepyfile(test_it="def test_it(storage_endpoint):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *arguments)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output[-2000:]
    assert said in output and "Traceback" not in output


def test_a_fork_in_a_host_leaves_the_xrootd_client_here():
    """XrdCl starts its event loop and worker threads again, after a fork, in the thread
    that forked: a fork in a thread that entered a host's namespace (``Popen(user=...)``
    forks, as PostgreSQL's commands do on the core host) moves them into that host, and
    the client's redirected connections (the dCache door's to its proxy) leave from
    there: 'network is unreachable', then 'Redirect limit has been reached' (make test).
    ``in_namespace`` turns the handlers off while it runs (none moves);
    ``rehome_xrootd_client`` brings back threads that moved anyway."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    xrootd_client = pytest.importorskip("XRootD.client")
    # the client's threads running (a request starts them; nothing listens on port 1)
    xrootd_client.FileSystem("root://127.0.0.1:1").stat("/", timeout=5)
    holder = subprocess.Popen(["unshare", "--net", "sleep", "infinity"],
                              stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_unshared(holder, "the test's host", timeout=30)
        netns = f"/proc/{holder.pid}/ns/net"
        space = os.stat(netns).st_ino

        def fork_there() -> None:
            subprocess.run(["true"], user=65534, check=True, timeout=30)

        # the mechanism: a fork from a thread in the host moves the client's threads
        # there (setns as in_namespace does, without its care) ...
        def enter_and_fork() -> None:
            descriptor = os.open(netns, os.O_RDONLY)
            try:
                assert ctypes.CDLL(None, use_errno=True).setns(descriptor, 0x40000000) == 0
            finally:
                os.close(descriptor)
            fork_there()

        thread = threading.Thread(target=enter_and_fork)
        thread.start()
        thread.join()
        moved = [tid for tid, where in foreign_threads().items() if where == space]
        assert moved
        # ... and rehome_xrootd_client brings them back
        dcache_hosts.rehome_xrootd_client()
        assert space not in foreign_threads().values()

        # through in_namespace none moves, and the handlers are on again after it
        in_namespace(netns, fork_there)
        assert space not in foreign_threads().values()
        assert xrootd_client.EnvGetInt("RunForkHandler") == 1
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_dcache_over_four_hosts(dcache_release, capsys):
    if os.geteuid() != 0:
        pytest.skip("the dCache over several hosts makes network namespaces: needs root")
    # the XRootD client's threads running before the start, as in a make test worker
    # whose earlier tests used it: the start's forks in the core host must leave them
    # here (else the door's redirects to its proxy fail: 'Redirect limit has been
    # reached', test_a_fork_in_a_host_leaves_the_xrootd_client_here)
    from XRootD import client as xrootd_client

    xrootd_client.FileSystem("root://127.0.0.1:1").stat("/", timeout=5)
    server = EmbeddedDCacheHosts(hosts=4)
    server.requested_version = dcache_release
    server.start()
    tag = ""
    try:
        assert server.network is not None
        tag = server.network.tag
        hosts = {host.name: host for host in server.hosts}
        assert list(hosts) == ["core", "door", "pool1", "pool2"]
        # each domain's JVM on its own host; PostgreSQL and ZooKeeper on the core's
        here = _netns_inode(os.getpid())
        spaces = {name: _netns_inode(host.holder.pid) for name, host in hosts.items()}
        assert len(set(spaces.values())) == 4 and here not in spaces.values()
        for name, host in hosts.items():
            assert _netns_inode(host.jvm.pid) == spaces[name], name
        assert server.zookeeper is not None and server.database is not None
        assert _netns_inode(server.zookeeper.pid) == spaces["core"]
        assert _netns_inode(server.database.process.pid) == spaces["core"]
        layout = (server.home / "etc" / "layouts" / "storagescale.conf").read_text()
        for domain in ("coreDomain", "doorDomain", "pool1Domain", "pool2Domain"):
            assert f"[{domain}]" in layout

        # through the doors from this machine's namespace, over IPv4 and IPv6 (the
        # data goes door <-> pool on the bridge): WebDAV in and out, xrootd stat and
        # (IPv4) read, SRM's ping (the SRM driver's own SOAP) and a stat through gfal2
        data = secrets.token_bytes(3 << 20)
        options = server.driver_options()
        names = {}
        for family in (4, 6):
            url = server.url_for_family("davs", family)
            assert (f"[{server.network.front6}]" in url) == (family == 6)
            name = names[family] = f"{AREA}/hosts-v{family}-{time.time_ns()}"
            webdav = driver_spec(url, driver="http", options={
                k: v for k, v in options.items() if k != "security_protocol"},
                writable_root=AREA).connect("functional-tests", timeout=60)
            try:
                webdav.put(name, data)
                assert webdav.read(name, 0, len(data)) == data
                assert webdav.stat(names[4]).size == len(data)
            finally:
                webdav.close()
            client = driver_spec(server.url_for_family("root", family), driver="xrootd",
                                 options=options, writable_root=AREA
                                 ).connect("functional-tests", timeout=60)
            try:
                assert client.stat(name).size == len(data)
                if family == 4:  # over IPv6 the door's proxy redirect has no brackets
                    assert client.read(name, 0, len(data)) == data
            finally:
                client.close()
            answer = srm_ping(EndpointURL.parse(server.url_for_family("srm", family)),
                              ca_dir=server.ca_dir, x509_proxy=str(server.proxy), timeout=60)
            assert answer.info.get("backend_type") == "dCache", answer
        srm = driver_spec(server.url_for_family("srm", 4), driver="gfal2", options=options,
                          writable_root=AREA).connect("functional-tests", timeout=60)
        try:
            assert srm.stat(names[6]).size == len(data)
        finally:
            srm.close()
        name = names[4]

        # a mover: the xrootd door proxies an open file from the pool that holds it
        handle = xrootd_client.File()
        status, _ = handle.open(f"root://{server.network.front}:{server.ports['xrootd']}/"
                                f"{name}", timeout=60)
        assert status.ok, status.message
        try:
            status, chunk = handle.read(0, 1024, timeout=60)
            assert status.ok and chunk == data[:1024]
            movers = range(server.ports["wan"], server.ports["wan"] + WAN_PORTS)
            lan = range(server.ports["lan"], server.ports["lan"] + LAN_PORTS)
            found = [(pool, address, port) for pool in ("pool1", "pool2")
                     for address, port in _listeners(hosts[pool].netns)
                     if port in movers or port in lan]
            assert found, {p: _listeners(hosts[p].netns) for p in ("pool1", "pool2")}
            for pool, address, port in found:
                # every interface of its host (no dCache setting binds it) ...
                assert address in ("*", "0.0.0.0", "[::]", "[::ffff:0.0.0.0]"), (pool, address)
                target = hosts[pool].address
                # ... which is the bridge: the door host reaches it; a client on the
                # client side does not, even one routing the pools' address through
                # the door host (which forwards nothing). (This machine's own default
                # route is no test: a sandbox's gateway may accept any connection.)
                assert in_namespace(hosts["door"].netns, lambda t=target, p=port:
                                    _connects(t, p)), (pool, port)
                front = f"ssd{tag}f"
                subprocess.run(["ip", "route", "replace", f"{target}/32", "via",
                                server.network.front, "dev", front], check=True, timeout=30)
                try:
                    assert not _connects(target, port), (pool, target, port)
                finally:
                    subprocess.run(["ip", "route", "del", f"{target}/32"], timeout=30)
        finally:
            handle.close(timeout=30)
        # the door host forwards nothing between its two links
        forward = subprocess.run(["nsenter", f"--net={hosts['door'].netns}", "cat",
                                  "/proc/sys/net/ipv4/ip_forward"], capture_output=True,
                                 text=True, timeout=30, check=True).stdout.strip()
        assert forward == "0"
        memory = {host: rss >> 20 for host, rss in server.host_rss_bytes().items()}
        with capsys.disabled():
            ready = {door: round(s, 1) for door, s in server.door_seconds.items()}
            print(f"\ndCache {server.version} over 4 hosts: set-up {server.setup_seconds:.1f} s,"
                  f" doors ready {ready} s after the JVMs started, all ready "
                  f"{server.start_seconds:.1f} s after start(); RSS per host (MiB): {memory}")
        assert all(memory[name] > 50 for name in hosts), memory
        pids = [host.jvm.pid for host in hosts.values()] + [
            server.zookeeper.pid, server.database.process.pid,
            *(host.holder.pid for host in hosts.values())]
        directory = server.directory
    finally:
        began = time.monotonic()
        server.stop()
        with capsys.disabled():
            print(f"stopped in {time.monotonic() - began:.1f} s")
    assert [pid for pid in pids if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE] == []
    assert directory is not None and not directory.exists()
    assert f"ssd{tag}" not in _links()
    # no process is left in any of the hosts' namespaces (they went with their holders)
    assert not {_inode_or_none(pid) for pid in psutil.pids()} & set(spaces.values())


def _inode_or_none(pid: int) -> int | None:
    try:
        return _netns_inode(pid)
    except OSError:
        return None

