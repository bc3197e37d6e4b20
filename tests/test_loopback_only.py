"""The embedded XRootD servers listen on loopback only (issue 31, item 1).

``xrd.port N`` makes xrootd and cmsd bind ``*:N`` (its root:// port, the XrdHttp
davs port, a cmsd's port): every interface of the host, so any host that reaches it
could read, write and delete in the test area with the default unix login. XRootD has
no directive for the address (5.5.3 nor 6.2.1), so the servers run with
``servers/loopback.c`` preloaded, which turns a bind to the wildcard address into one to
loopback. Each server kind's listening sockets are read from the kernel
(``/proc/net/tcp{,6}``, by the socket inodes of its processes), and a connection to the
host's own non-loopback addresses must be refused."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_storagescale.errors import EndpointError
from pytest_storagescale.servers import loopback

#: a TCP socket in the LISTEN state (/proc/net/tcp's "st" column)
LISTEN = "0A"


def _address(hex_address: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``/proc/net/tcp{,6}``'s ``0100007F:1F90`` (each 32-bit word in host order) as an
    address and a port."""
    address, port = hex_address.split(":")
    raw = bytes.fromhex(address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words), int(port, 16)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def listening(pids: list[int]) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address,
                                             int]]:
    """The TCP addresses and ports the processes ``pids`` listen on."""
    inodes = set().union(*(_socket_inodes(pid) for pid in pids))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                found.append(_address(fields[1]))
    return found


def is_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def host_addresses() -> list[str]:
    """This host's own addresses that are not loopback (nor link-local: those need an
    interface to be named), from ``ip``."""
    import json

    done = subprocess.run(["ip", "-j", "address"], capture_output=True, text=True,
                          timeout=30, check=True)
    found = []
    for interface in json.loads(done.stdout):
        for entry in interface.get("addr_info", []):
            address = ipaddress.ip_address(entry["local"])
            if not (address.is_loopback or address.is_link_local):
                found.append(str(address))
    return found


@pytest.fixture(scope="module")
def outside_addresses():
    """The host's non-loopback addresses; none: a dummy interface with a documentation
    address for the module's tests (root only), removed after."""
    found = host_addresses()
    if found:
        yield found
        return
    if os.geteuid() != 0:
        pytest.skip("this host has no address but loopback, and only root can add one")
    name, address = "ssloopbk0", "198.51.100.77"
    for command in (["ip", "link", "add", name, "type", "dummy"],
                    ["ip", "address", "add", f"{address}/32", "dev", name],
                    ["ip", "link", "set", name, "up"]):
        subprocess.run(command, check=True, capture_output=True, timeout=30)
    try:
        yield [address]
    finally:
        subprocess.run(["ip", "link", "delete", name], capture_output=True, timeout=30)


def refused_from(addresses: list[str], port: int) -> list[str]:
    """The addresses of ``addresses`` on which ``port`` took a connection (each try
    bounded: 5 s)."""
    accepted = []
    for address in addresses:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.settimeout(5)
            code = probe.connect_ex((address, port))
        if code != errno.ECONNREFUSED:
            accepted.append(f"{address}:{port} ({os.strerror(code) if code else 'accepted'})")
    return accepted


def assert_loopback_only(pids: list[int], ports: set[int], outside: list[str]) -> None:
    """Every listening socket of ``pids`` on loopback, ``ports`` among them, and none of
    ``ports`` reachable on ``outside``."""
    sockets = listening(pids)
    assert ports <= {port for _, port in sockets}, (ports, sockets)
    wide = [f"{address}:{port}" for address, port in sockets if not is_loopback(address)]
    assert not wide, f"listening beyond loopback: {wide}"
    accepted = [hit for port in sorted(ports) for hit in refused_from(outside, port)]
    assert not accepted, f"connections from outside loopback taken: {accepted}"


# -- the library itself -------------------------------------------------------------

_BINDS = textwrap.dedent("""
    import socket
    def bound(family, address, only_ipv6=None):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            if only_ipv6 is not None:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, only_ipv6)
            s.bind((address, 0))
            return s.getsockname()[0]
    print(bound(socket.AF_INET, "0.0.0.0"))
    print(bound(socket.AF_INET6, "::", 0))
    print(bound(socket.AF_INET6, "::", 1))
    print(bound(socket.AF_INET, "127.0.0.2"))
""")


def _printed(script: str, **environment: str) -> list[str]:
    """The words ``script`` prints, run by Python with ``environment`` added."""
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True,
                          env={**os.environ, **environment}).stdout.split()


def test_the_library_turns_wildcard_binds_into_loopback_ones():
    """0.0.0.0 -> 127.0.0.1, :: -> ::ffff:127.0.0.1 (dual-stack) or ::1 (IPv6 only); a
    given address is left as it is. Without the library the kernel keeps the wildcard."""
    plain, shimmed = _printed(_BINDS), _printed(_BINDS, LD_PRELOAD=str(loopback.build()))
    assert plain == ["0.0.0.0", "::", "::", "127.0.0.2"]
    assert shimmed == ["127.0.0.1", "::ffff:127.0.0.1", "::1", "127.0.0.2"]


def test_a_bind_address_replaces_loopback_for_a_wildcard_bind():
    """STORAGESCALE_BIND_ADDRESS (a server its tests' namespaces reach: netns.bridge_xrootd)
    takes loopback's place: an IPv4 one for AF_INET and a dual-stack socket, an IPv6 one
    for both AF_INET6 sockets; a socket it does not fit keeps loopback; garbage is
    loopback."""
    library = str(loopback.build())

    def binds(address: str) -> list[str]:
        return _printed(_BINDS, LD_PRELOAD=library, STORAGESCALE_BIND_ADDRESS=address)

    assert binds("127.0.0.3") == ["127.0.0.3", "::ffff:127.0.0.3", "::1", "127.0.0.2"]
    assert binds("::1") == ["127.0.0.1", "::1", "::1", "127.0.0.2"]
    assert binds("0.0.0.0; rm") == ["127.0.0.1", "::ffff:127.0.0.1", "::1", "127.0.0.2"]


_SENDS = textwrap.dedent("""
    import socket
    for family, target in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"),
                           (socket.AF_INET6, "::ffff:127.0.0.1")):
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.sendto(b"report", (target, 9))
            print(s.getsockname()[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("127.0.0.1", 9))
        print(s.getsockname()[0])
""")


def test_a_udp_socket_sending_to_loopback_is_bound_to_loopback():
    """xrootd's summary reports (``xrd.report`` to the session's collector) went out of a
    UDP socket the kernel bound to ``0.0.0.0`` at its first send: it took datagrams from
    every interface (seen with ``ss -lunp`` while the CI ran: ``udp 0.0.0.0:36218
    xrootd``). With the library it is bound to loopback before its first sendto or
    connect to a loopback address."""
    plain, shimmed = _printed(_SENDS), _printed(_SENDS, LD_PRELOAD=str(loopback.build()))
    # a connected one has the route's source address either way (the kernel's)
    assert plain == ["0.0.0.0", "::", "::", "127.0.0.1"]
    assert shimmed == ["127.0.0.1", "::1", "::ffff:127.0.0.1", "127.0.0.1"]


def test_the_library_is_in_a_folder_only_its_owner_may_write():
    library = loopback.build()
    assert library.is_absolute() and library.suffix == ".so"
    for path in (library, *library.parents):
        info = path.stat()
        assert info.st_uid in (0, os.geteuid()), path
        assert not info.st_mode & 0o002 or path == Path("/tmp"), path
    assert library.stat().st_mode & 0o777 == 0o644
    if os.geteuid() == 0:  # outside /root, readable by the user xrootd switches to
        assert library.parent == loopback.ROOT_FOLDER
        assert library.parent.stat().st_mode & 0o777 == 0o755
    assert loopback.preloaded({"LD_PRELOAD": "/usr/lib/other.so"})["LD_PRELOAD"] == (
        f"{library} /usr/lib/other.so")


def test_a_library_folder_others_may_write_is_refused(monkeypatch, tmp_path):
    """A folder any user may write (not sticky) is never loaded from nor built into."""
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    monkeypatch.setattr(loopback, "folder", lambda: open_folder)
    with pytest.raises(EndpointError) as caught:
        loopback.build()
    assert f"{open_folder} is writable by every user" in str(caught.value)
    assert not list(open_folder.iterdir())  # nothing built there


# -- the servers ----------------------------------------------------------------------

def test_the_embedded_xrootd_listens_on_loopback_only(embedded_xrootd, outside_addresses):
    """Its root:// and davs:// doors: on loopback, refused from the host's address."""
    server = embedded_xrootd
    assert server.http_port
    assert_loopback_only(server.server_pids(), {server.port, server.http_port},
                         outside_addresses)


def test_the_built_release_listens_on_loopback_only(outside_addresses):
    """XRootD 6.2.1 from the cache, as --storage-embedded-version 6.2.1 starts it."""
    from pytest_storagescale.servers.family import start_embedded
    from pytest_storagescale.servers.xrootd_releases import BUILT_VERSION, built_prefix

    if built_prefix() is None:
        pytest.skip("XRootD 6.2.1 is not built on this machine (scripts/build-xrootd6.sh)")
    server = start_embedded("xrootd", "unix", BUILT_VERSION)
    try:
        assert server.version == BUILT_VERSION
        assert_loopback_only(server.server_pids(), {server.port, server.http_port},
                             outside_addresses)
    finally:
        server.stop()


@pytest.mark.integration
def test_the_redirector_cluster_listens_on_loopback_only(outside_addresses):
    """Every xrootd and cmsd of the cluster (manager and data servers) on loopback, and a
    file written through the manager still goes to a data server and back (the
    redirect names an address the data server listens on)."""
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.servers.redirector import AREA, EmbeddedXRootDCluster

    with EmbeddedXRootDCluster() as cluster:
        assert cluster.manager is not None and len(cluster.data_servers) == 2
        nodes = [cluster.manager, *cluster.data_servers]
        ports = {node.port for node in nodes} | {cluster.manager.manager_cms_port}
        pids = cluster.server_pids()
        assert len(pids) == 6  # an xrootd and a cmsd per node
        assert_loopback_only(pids, ports, outside_addresses)
        client = driver_spec(cluster.url, driver="xrootd", writable_root=AREA).connect(
            "loopback", timeout=20)
        try:
            client.put(f"{AREA}/loopback-only", b"redirected")
            assert client.read(f"{AREA}/loopback-only", 0, 10) == b"redirected"
        finally:
            client.close()


@pytest.mark.integration
def test_the_xcache_listens_on_loopback_only(outside_addresses):
    """The caching proxy and its origin."""
    from pytest_storagescale.servers.xcache import EmbeddedXCache

    with EmbeddedXCache() as server:
        assert server.proxy is not None and server.origin is not None
        assert_loopback_only([*server.server_pids(), *server.origin.server_pids()],
                             {server.proxy.port, server.origin.port}, outside_addresses)


@pytest.mark.slow_server
def test_the_ceph_gateway_listens_on_loopback_only(outside_addresses):
    """The XrdCeph gateway's xrootd (and its XCache); Ceph's own daemons are given
    127.0.0.1 in ceph.conf."""
    from pytest_storagescale.servers.ceph import EmbeddedCephGateway

    EmbeddedCephGateway.check_installed()
    server = EmbeddedCephGateway().start()
    try:
        assert server.xcache is not None
        assert_loopback_only(server.server_pids(), {server.port, server.xcache.port},
                             outside_addresses)
    finally:
        server.stop()


def test_the_embedded_dcache_listens_on_loopback_only(embedded_dcache, outside_addresses):
    """dCache's doors, ZooKeeper and PostgreSQL are told 127.0.0.1; its pools' movers
    bind the wildcard (no dCache setting binds them: docs/servers.md), so its JVMs run
    with the library too. After a file went through a pool's mover (a PUT and a GET over
    WebDAV, each redirected to the pool), every listening socket of its processes is on
    loopback, the movers' among them, and none takes a connection from outside."""
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.servers.dcache import AREA, LAN_PORTS, WAN_PORTS

    server = embedded_dcache
    davs = driver_spec(server.url_for("davs"), driver="http", options={"ca_dir": server.ca_dir},
                       writable_root=AREA).connect("loopback", timeout=30)
    davs.put(f"{AREA}/loopback-only", b"through a mover\n")
    assert davs.read(f"{AREA}/loopback-only", 0, 16) == b"through a mover\n"
    pids = server.server_pids()
    movers = range(server.ports["wan"], server.ports["wan"] + WAN_PORTS + LAN_PORTS)
    mover_ports = {port for _, port in listening(pids) if port in movers}
    assert mover_ports, f"no mover listens in {movers} after a transfer"
    assert_loopback_only(pids, {server.ports["webdav"], server.ports["xrootd"], *mover_ports},
                         outside_addresses)
