"""Hosts as network namespaces on a bridge: the plumbing that the servers over several
hosts (:mod:`.cephfs`, :mod:`.dcache_hosts`) and the embedded SLURM's client hosts
(:mod:`.slurm_hosts`) share.

A namespace is not named (``ip netns add`` would leave a ``/run/netns`` entry behind a
SIGKILL) but held by one ``unshare --net sleep infinity`` process (:data:`HOLDER`): the
kernel removes the namespace with its last process, and its veth ends and a bridge in
it with it. Its handle for ``nsenter --net=`` is ``/proc/<holder's pid>/ns/net``
(:func:`handle`). A holder is used only once it has unshared (:func:`wait_unshared`):
right after its spawn ``/proc/<pid>/ns/net`` still names this machine's namespace,
and a command sent "into" it acts here.

One namespace of a run (the switch) holds the bridge ``ssbr`` (:func:`make_bridge`);
each host joins it by a veth pair (:func:`join_bridge`); this machine's namespace
joins it by one more (:func:`link_to_bridge`). The addresses are the caller's, on a
/24 of 10.0.0.0/8 that nothing of this machine uses (:func:`free_subnet`).

A failed ``ip`` command, a holder that made no namespace, no free subnet: a
:class:`NetnsError` (a ``RuntimeError``) saying which; the server names itself around
it. Needs root (the callers check).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import subprocess
import time
from pathlib import Path

#: the process that holds a new network namespace: ``unshare`` makes it, then execs
#: ``sleep``
HOLDER = ("unshare", "--net", "sleep", "infinity")
#: the bridge's name, in the switch's namespace (one per namespace: no clash)
BRIDGE = "ssbr"
#: seconds for one ``ip`` command
IP_TIMEOUT = 30


class NetnsError(RuntimeError):
    """A namespace, veth, bridge or address could not be made (the message says which)."""


def handle(pid: int) -> str:
    """The network namespace of process ``pid``, for ``nsenter --net=``."""
    return f"/proc/{pid}/ns/net"


def ip(*args: str, netns: str | None = None) -> str:
    """``ip ARGS`` here, or in the namespace ``netns`` (a :func:`handle`); its output."""
    command = ["ip", *args] if netns is None else ["nsenter", f"--net={netns}", "ip", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=IP_TIMEOUT)
    if done.returncode != 0:
        raise NetnsError(f"'{' '.join(command)}' failed: {done.stderr.strip()}")
    return done.stdout


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.0.0.0/8 that no address or route of this machine touches."""
    used = ip("-4", "route", "show", "table", "all") + ip("-4", "addr")
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{random.randint(64, 250)}.{random.randint(0, 255)}.0/24")
        if ".".join(str(net.network_address).split(".")[:3]) + "." not in used:
            return net
    raise NetnsError("no free 10.x.y.0/24 (200 drawn from 10.64-250.x.0/24, each one used "
                     "by an address or a route here)")


def free_subnet6() -> ipaddress.IPv6Network:
    """A random /64 of the unique local addresses (fd00::/8) that no address or route
    of this machine overlaps."""
    used = ip("-6", "route", "show", "table", "all") + ip("-6", "addr")
    for _ in range(100):
        net = ipaddress.IPv6Network((0xFD << 120 | random.getrandbits(56) << 64, 64))
        if str(net.network_address).rstrip(":") not in used:
            return net
    raise NetnsError("no free /64 of fd00::/8 (100 drawn, each one used here)")


def wait_unshared(holder: subprocess.Popen, name: str, timeout: float) -> None:
    """Until ``holder`` (:data:`HOLDER`) is in a network namespace of its own.

    The spawn returns once ``unshare`` is exec-ed, before it has unshared: until then
    ``/proc/PID/ns/net`` is this machine's own namespace, and an ``nsenter`` into it
    acts here. On a starved CPU that gap was long enough for the first command, ``ip
    link set lo up`` in the CephFS daemons' namespace, to run in this one: their
    loopback stayed down and no ``ceph`` command reached the monitor. Measured: 1 in
    50 ``nsenter`` right after such a spawn on a 2-core machine under load
    (tests/test_cephfs_start.py). A holder that ended, or made none within
    ``timeout`` seconds, is a :class:`NetnsError` naming ``name`` (the caller ends
    it)."""
    own = os.stat("/proc/self/ns/net").st_ino
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):  # it ended: said below
            if os.stat(handle(holder.pid)).st_ino != own:
                return
        if holder.poll() is not None:
            raise NetnsError(f"the holder of the network namespace {name} exited with code "
                             f"{holder.returncode} before making it")
        if time.monotonic() > deadline:
            raise NetnsError(f"the holder of the network namespace {name} did not make it "
                             f"within {timeout:.0f} s")
        with contextlib.suppress(subprocess.TimeoutExpired):
            holder.wait(timeout=0.02)


def hold(directory: Path, name: str, *, timeout: float, log: Path | None = None
         ) -> subprocess.Popen:
    """A new network namespace, held by :data:`HOLDER` started in ``directory`` (the
    orphan cleaner finds it there) in a session of its own, its output to ``log``
    (else none); returned once it has unshared, killed when it made none."""
    with open(log, "ab") if log is not None else open(os.devnull, "wb") as sink:
        holder = subprocess.Popen(HOLDER, cwd=directory, stdin=subprocess.DEVNULL,
                                  stdout=sink, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        wait_unshared(holder, name, timeout)
    except BaseException:
        if holder.poll() is None:
            holder.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            holder.wait(timeout=10)
        raise
    return holder


def make_bridge(switch: int, address: str | None = None) -> None:
    """In the namespace that process ``switch`` holds: its loopback up, the bridge
    :data:`BRIDGE`, and on it ``address`` (``a.b.c.d/prefix``) when given."""
    netns = handle(switch)
    ip("link", "set", "lo", "up", netns=netns)
    ip("link", "add", BRIDGE, "type", "bridge", netns=netns)
    if address is not None:
        ip("addr", "add", address, "dev", BRIDGE, netns=netns)
    ip("link", "set", BRIDGE, "up", netns=netns)


def link_to_bridge(switch: int, outside: str, inside: str, address: str) -> None:
    """This machine's namespace on the bridge: a veth pair, ``outside`` here with
    ``address`` (``a.b.c.d/prefix``), ``inside`` a port of the bridge."""
    ip("link", "add", outside, "type", "veth", "peer", "name", inside)
    ip("link", "set", inside, "netns", str(switch))
    ip("link", "set", inside, "master", BRIDGE, "up", netns=handle(switch))
    ip("addr", "add", address, "dev", outside)
    ip("link", "set", outside, "up")


def join_bridge(switch: int, host: int, port: str, peer: str, address: str, *,
                loopback: bool = True) -> None:
    """The namespace that process ``host`` holds on the bridge: a veth pair made here,
    ``port`` moved to the switch and made a port of the bridge, ``peer`` moved to the
    host with ``address`` (``a.b.c.d/prefix``); the host's loopback up unless
    ``loopback`` is false (it is up already)."""
    ip("link", "add", port, "type", "veth", "peer", "name", peer)
    ip("link", "set", port, "netns", str(switch))
    ip("link", "set", port, "master", BRIDGE, "up", netns=handle(switch))
    ip("link", "set", peer, "netns", str(host))
    ip("addr", "add", address, "dev", peer, netns=handle(host))
    ip("link", "set", peer, "up", netns=handle(host))
    if loopback:
        ip("link", "set", "lo", "up", netns=handle(host))


def rss_by_namespace(namespaces: dict[str, str]) -> dict[str, int]:
    """Resident bytes of every process in each namespace (name -> :func:`handle`); a
    namespace that is gone has 0."""
    inodes: dict[int, str] = {}
    for name, netns in namespaces.items():
        with contextlib.suppress(OSError):
            inodes[os.stat(netns).st_ino] = name
    page = os.sysconf("SC_PAGE_SIZE")
    total = dict.fromkeys(namespaces, 0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            inode = os.stat(f"/proc/{entry}/ns/net").st_ino
            if inode in inodes:
                total[inodes[inode]] += int(
                    Path(f"/proc/{entry}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total
