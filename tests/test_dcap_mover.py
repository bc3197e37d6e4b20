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
    door = FakeDoor(lambda: [os.getpid(), *(driver._movers.pids() if driver._movers else [])],
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
