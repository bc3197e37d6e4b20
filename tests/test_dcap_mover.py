"""libdcap's listening socket stays on loopback (issue 35), without a dCache.

libdcap 2.47.14 binds a socket to ``in6addr_any`` and listens on it at the first
``open`` of a process, in active mode too (``DCACHE_CLIENT_ACTIVE=1``: ``cache_open``
and ``create_data_socket`` in its ``src/dcap.c``), and keeps it until the process ends.
A fake door here answers libdcap's hello, takes its ``open`` and, while the client
waits for the door's answer (its socket is listening then), reads the listening
sockets of the client's processes from the kernel and tries to connect to them from
this host's other addresses; then it refuses the open. Through the gfal2 driver as
built (its data moves in a mover process with the loopback-only preload library) every
socket is on loopback and refused from outside; in the driver's own process (the
movers switched off: the driver before the fix) libdcap listens on ``::``."""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import pytest
from test_loopback_only import (  # noqa: F401 - outside_addresses is a fixture
    is_loopback,
    listening,
    outside_addresses,
    refused_from,
)

gfal2_driver = pytest.importorskip("pytest_storagescale.drivers.gfal2")


def _door_socket() -> socket.socket:
    """A listening socket on 127.0.0.1 below port 32768: libdcap 2.47.14 reads a URL's
    port into a signed short ('Failed to connect to 127.0.0.1:-7539' for 57997)."""
    for _ in range(200):
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            server.bind(("127.0.0.1", random.randint(20000, 32767)))
        except OSError:
            server.close()
            continue
        server.listen(1)
        server.settimeout(60)
        return server
    raise AssertionError("no free port in 20000-32767 after 200 tries")


class FakeDoor(threading.Thread):
    """Answers one client's hello, reads its open, looks at the sockets the processes
    ``pids()`` listen on while the client waits, and refuses the open."""

    def __init__(self, pids, outside: list[str]) -> None:
        super().__init__(daemon=True)
        self.server = _door_socket()
        self.port = self.server.getsockname()[1]
        self.pids, self.outside = pids, outside
        self.lines: list[bytes] = []
        self.sockets: list = []
        self.accepted_outside: list[str] = []

    def run(self) -> None:
        connection, _ = self.server.accept()
        with connection, connection.makefile("rwb") as stream:
            self.lines.append(stream.readline(4096))  # 0 0 client hello ...
            stream.write(b"0 0 server welcome 2 47\n")
            stream.flush()
            line = stream.readline(4096)  # 1 0 client open "dcap://..." r HOST PORT ...
            self.lines.append(line)
            self.sockets = listening(self.pids())
            ports = {port for _, port in self.sockets if port != self.port}
            self.accepted_outside = [hit for port in sorted(ports)
                                     for hit in refused_from(self.outside, port)]
            session, command = line.split()[:2]
            stream.write(session + b" " + command + b' server failed 2 "refused by the test"\n')
            stream.flush()
        self.server.close()


def _open_through(outside: list[str], *, movers: bool):
    """A dcap read of a file through the gfal2 driver (its movers switched off when not
    ``movers``: the driver before the fix) from a fake door; the door and the driver's
    processes (this one, its movers)."""
    door = FakeDoor(lambda: [os.getpid(), *(driver._movers.pids() if driver._movers else []),
                             *([driver._movers.factory_pid()] if driver._movers else [])],
                    outside)
    driver = gfal2_driver.Gfal2Driver(
        gfal2_driver.Gfal2Driver.parse_endpoint(f"dcap://127.0.0.1:{door.port}/area"),
        writable_root="/area", timeout=30)
    try:
        assert driver._movers is not None  # this process has no preload library
        if not movers:
            driver._movers.close()
            driver._movers = None
        door.start()
        with pytest.raises(gfal2_driver.StorageError, match="refused by the test"):
            driver.get("/area/file", None)
        door.join(60)
        assert not door.is_alive()
        assert len(door.lines) == 2 and b" client open " in door.lines[1], door.lines
        return door
    finally:
        driver.close()


def test_a_dcap_read_listens_on_loopback_only_in_its_mover(outside_addresses):  # noqa: F811
    """The driver as built: the open is made by a mover, whose libdcap socket (the port
    the open names) listens on loopback only and is refused from the host's other
    addresses; this process listens on nothing but the fake door."""
    door = _open_through(outside_addresses, movers=True)
    callback = int(door.lines[1].split()[7])  # the port libdcap tells the door
    assert callback in {port for _, port in door.sockets}, (callback, door.sockets)
    wide = [f"{address}:{port}" for address, port in door.sockets if not is_loopback(address)]
    assert not wide, f"listening beyond loopback: {wide}"
    assert not door.accepted_outside, door.accepted_outside
    assert listening([os.getpid()]) == [], "this process listens: libdcap ran here"


def test_in_its_own_process_libdcap_listens_on_every_interface():
    """Why the movers: the same open made by libdcap in the driver's own process (the
    driver before the fix) listens on ``::``, in active mode. Run, door and client, in
    a child process in a network namespace of its own (root: ``unshare --net``, its
    loopback up), so that the wildcard socket is reachable from nowhere. (Not connected
    to from outside: libdcap takes a connection there for the pool's and waits for its
    hello: the mover without the preload library gave no answer within 120 s.)"""
    import shutil
    import subprocess
    import sys
    import textwrap

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs root, unshare and ip: libdcap's '::' socket is opened in a "
                    "network namespace of its own")
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_dcap_mover import _open_through
        door = _open_through([], movers=False)
        print(os.environ.get("DCACHE_CLIENT_ACTIVE"), door.lines[1].split()[7].decode(),
              [f"{{a}}|{{p}}" for a, p in door.sockets])
    """)
    done = subprocess.run(["unshare", "--net", "sh", "-c",
                           'ip link set lo up && exec "$0" -c "$1"', sys.executable, script],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    active, callback, sockets = done.stdout.strip().splitlines()[-1].split(" ", 2)
    assert active == "1"
    assert f"'::|{callback}'" in sockets, done.stdout


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        return dict(line.rstrip("\n").split(":\t", 1) for line in status if ":\t" in line)


def _cpu_ticks(pid: int) -> int:
    """User and system CPU of ``pid`` so far, in clock ticks (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _closed_port() -> int:
    """A loopback port below 32768 where nothing listens (libdcap: a signed short)."""
    server = _door_socket()
    port = server.getsockname()[1]
    server.close()
    return port


def _dcap_driver(port: int, **kwargs):
    return gfal2_driver.Gfal2Driver(
        gfal2_driver.Gfal2Driver.parse_endpoint(f"dcap://127.0.0.1:{port}/area"),
        writable_root="/area", timeout=30, **kwargs)


def test_movers_are_forked_from_one_factory_of_the_client_process():
    """Why 47 of 50 dcap clients hung at their logins (suites/dcache,
    test_transaction_rate_vs_users[c50-dcap], 11.2.5, load 14-25: each login started
    its mover, a new interpreter importing gfal2 and the package, 50 at once on 2
    cores, and 47 were still starting after the step's hang_timeout of 60 s): the
    movers of every client of a process are forked from one factory, a child of this
    process that imported the driver's imports once, preloaded the loopback-only
    library and runs one thread. A mover, its child, pays neither the interpreter nor
    those imports: its CPU until it answered its client is under half the factory's
    (CPU time of two processes of this host, not a speed). Closing the clients ends
    their movers, and the last one the factory."""
    from pytest_storagescale.servers.loopback import library_path

    port = _closed_port()
    clients = [_dcap_driver(port, client_id=index) for index in range(3)]
    try:
        for client in clients:
            client._movers.start()
        movers = [pid for client in clients for pid in client._movers.pids()]
        assert len(set(movers)) == 3, movers
        parents = {int(_status(mover)["PPid"]) for mover in movers}
        assert len(parents) == 1 and os.getpid() not in parents, (parents, os.getpid())
        factory = parents.pop()
        assert int(_status(factory)["PPid"]) == os.getpid()
        assert {client._movers.factory_pid() for client in clients} == {factory}
        assert _status(factory)["Threads"] == "1"
        library = library_path().name
        for pid in (factory, *movers):
            with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
                assert library in maps.read()
        spent = {mover: _cpu_ticks(mover) for mover in movers}
        assert max(spent.values()) * 2 < _cpu_ticks(factory), (spent, _cpu_ticks(factory))
    finally:
        for client in clients[:2]:
            client.close()
    assert not any(_alive(pid) for pid in movers[:2])
    assert _alive(factory), "closed with its last client, not before"
    clients[2].close()
    assert not _alive(movers[2]) and not _alive(factory)


def test_a_mover_that_ended_is_a_crashed_request_and_the_next_one_forks_another():
    """A mover killed from outside (SIGKILL): the client's next request through it is
    a storage error of class 'crashed' naming the mover, not an OSError of the pipe;
    the request after it is made by a new mover forked from the same factory (here:
    refused by the closed port, as libdcap says it)."""
    import signal

    driver = _dcap_driver(_closed_port())
    try:
        driver._movers.start()
        first, = driver._movers.pids()
        factory = int(_status(first)["PPid"])
        os.kill(first, signal.SIGKILL)
        for _ in range(600):  # at most 60 s: its end of the pipe is closed
            if not _alive(first):
                break
            time.sleep(0.1)
        with pytest.raises(gfal2_driver.StorageError) as crashed:
            driver.get("/area/file", None)
        assert crashed.value.error_class == "crashed", crashed.value
        assert f"the dcap mover (pid {first}) ended" in str(crashed.value)
        with pytest.raises(gfal2_driver.StorageError) as refused:
            driver.get("/area/file", None)
        assert refused.value.error_class != "crashed", refused.value
        second, = driver._movers.pids()
        assert second != first and int(_status(second)["PPid"]) == factory
        assert factory != os.getpid()
    finally:
        driver.close()
    assert not _alive(factory)


def test_a_factory_with_threads_forks_no_mover(monkeypatch):
    """A fork copies only the forking thread: a factory that runs more than one after
    its imports (here made to import the gfal2 driver's module itself, whose import
    activates Globus and its threads) forks nothing, and the client's login fails
    with the reason."""
    from pytest_storagescale.drivers import dcap_mover

    monkeypatch.setattr(dcap_mover, "imports_of", lambda name: [name])
    monkeypatch.setattr(dcap_mover, "_FAILED", {})
    driver = _dcap_driver(_closed_port())
    try:
        with pytest.raises(gfal2_driver.StorageError,
                           match=r"runs \d+ threads after importing "
                                 r"pytest_storagescale\.drivers\.gfal2: a process forked "
                                 r"from it would lack them \(not forked\)"):
            driver._movers.start()
        with pytest.raises(gfal2_driver.StorageError, match="not tried again"):
            driver._movers.start()  # the failed start is not repeated by every client
    finally:
        driver.close()


def test_a_dcap_clients_credentials_are_the_first_or_not(monkeypatch, tmp_path):
    """The credentials libdcap's GSI tunnel keeps are a process's first dcap client's
    (drivers/gfal2.py ``_DCAP_FIRST_CREDENTIALS``): the same CA folder and proxy again are
    the first; another folder, another proxy path, or the same proxy file rewritten
    (its size or time) are not (that client's requests then go through its movers)."""
    import os

    from pytest_storagescale.drivers import gfal2

    monkeypatch.setattr(gfal2, "_DCAP_FIRST_CREDENTIALS", [])
    (tmp_path / "ca").mkdir()
    (tmp_path / "ca2").mkdir()
    proxy = tmp_path / "x509up"
    proxy.write_text("proxy one")
    first = {"ca_dir": str(tmp_path / "ca"), "x509_proxy": str(proxy)}
    assert gfal2._first_dcap_credentials(first)
    assert gfal2._first_dcap_credentials(dict(first))
    assert not gfal2._first_dcap_credentials({**first, "ca_dir": str(tmp_path / "ca2")})
    other = tmp_path / "x509up-2"
    other.write_text("proxy one")
    assert not gfal2._first_dcap_credentials({**first, "x509_proxy": str(other)})
    proxy.write_text("proxy two, longer")
    os.utime(proxy, ns=(1, 1))
    assert not gfal2._first_dcap_credentials(first)
