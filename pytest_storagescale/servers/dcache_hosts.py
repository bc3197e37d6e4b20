"""The embedded dCache over several hosts (``--storage-embedded-hosts N``, N >= 4): the
domains of :mod:`.dcache`'s one-domain layout split as a site lays them out (FNAL's
admin, chimera, door and pool nodes, issue 36), each domain's JVM on a host of its own.

A host is a network namespace, held by one ``unshare --net sleep infinity`` process
started in the server's directory (not named: the kernel removes the namespace with
its last process, its veths and the bridge with it, also after a SIGKILL of pytest;
the orphan reaper kills the holders like any server process there; the plumbing:
:mod:`.netns`). The hosts:

- ``core``: PostgreSQL (chimera, pinmanager, srm; on the host's own loopback),
  ZooKeeper (on the host's bridge address, SASL required as in one domain) and the
  core domain (``dcache.broker.scheme=core``: PnfsManager, PoolManager, gPlazma,
  billing, PinManager, SrmManager, the transfer managers, the cleaner);
- ``door``: the door domain (WebDAV, xrootd, SRM, and dcap/GridFTP when asked),
  a satellite of the core;
- ``pool1`` ... ``pool<N-2>``: one pool domain each, one pool each.

They share a private bridge (``.128/25`` of a free 10.x.y.0/24, in a namespace of its
own). The door host alone has a second link, a veth pair to this machine's namespace
(``.0/25``, and a unique local IPv6 /64): the client side. This machine's namespace has
no route to the bridge, so the doors answer the clients and the pools' movers (which
listen on every interface: no dCache setting binds them) answer only on the bridge.
The doors therefore proxy the data (``webdav.redirect.on-read/on-write=false``,
``xrootd.net.proxy-transfers=true``), as a site's doors do in front of pools on a
private network. No loopback preload here (:mod:`.loopback`): each host's every
interface is on the private network.

The door host is offered to the client hosts of ``--storage-cluster embedded-slurm:N``
of the same process (:func:`.slurm_hosts.offer_door`): a veth from their bridge into the
door host, and their route to the door's IPv4 address through it; the pools' bridge
stays theirs alone (no namespace forwards). Nothing happens when no such cluster runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..errors import EndpointError, StorageScaleUsageError
from .dcache import DOMAIN, LAYOUT, EmbeddedDCache, _end
from .netns import (
    NetnsError,
    free_subnet,
    free_subnet6,
    hold,
    ip,
    join_bridge,
    make_bridge,
    rss_by_namespace,
)
from .processes import ServerProcess, log_tail

if TYPE_CHECKING:
    from .slurm_hosts import ServerDoor

#: the fewest hosts of the layout: core, door and two pools
MIN_HOSTS = 4
#: at most (pools .132 to .254 of the bridge's /25)
MAX_HOSTS = 100
#: the services of the one-domain layout that run in the core domain (the rest: doors)
CORE_SERVICES = frozenset({
    "pnfsmanager", "cleaner-disk", "cleaner-hsm", "poolmanager", "billing", "gplazma",
    "pinmanager", "srmmanager", "transfermanagers", "spacemanager", "nearline-storage",
    "topo", "history", "bulk", "qos-engine", "qos-verifier",
    "qos-adjuster", "qos-scanner", "zookeeper"})
#: the JVMs' heaps (the core's services, the doors, a pool): 4 JVMs of the default 768m
#: would be 3 GB of heap on a 2-core test machine
HEAPS = {"core": "512m", "door": "512m", "pool": "256m"}
#: the xrootd door's proxy ports on the door host (above Linux's ephemeral 32768-60999)
PROXY_PORTS = (61000, 65499)
_CLONE_NEWNET = 0x40000000
_T = TypeVar("_T")


def in_namespace(netns: str, function: Callable[[], _T]) -> _T:
    """``function()`` in a thread of its own that first enters the network namespace
    ``netns`` (``/proc/<pid>/ns/net``): what it connects to, binds and starts
    (subprocesses inherit the thread's namespace) is that host's."""
    libc = ctypes.CDLL(None, use_errno=True)
    outcome: dict[str, object] = {}

    def enter_and_run() -> None:
        try:
            descriptor = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(descriptor, _CLONE_NEWNET) != 0:
                    error = ctypes.get_errno()
                    raise OSError(error, f"setns({netns}): {os.strerror(error)}")
            finally:
                os.close(descriptor)
            outcome["value"] = function()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    elsewhere = set(foreign_threads())
    with xrootd_fork_handlers_off():
        thread = threading.Thread(target=enter_and_run, name=f"netns {netns}", daemon=True)
        thread.start()
        thread.join()
    rehome_xrootd_client(elsewhere)
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def _xrootd_client_loaded() -> bool:
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        return "libXrdCl" in maps.read()


@contextlib.contextmanager
def xrootd_fork_handlers_off() -> Iterator[None]:
    """XrdCl's fork handlers off in the block (its ``RunForkHandler``, read at each
    fork), on again (as they were) after it. XrdCl stops its event loop and worker
    threads before a ``fork()`` and starts them again in the parent from the thread
    that forked: a fork in a thread of :func:`in_namespace` would start them in its
    host (see :func:`rehome_xrootd_client`). The forks there start programs at once,
    which is what the handlers are not needed for. Nothing done without the client's
    Python bindings or when the library is not loaded."""
    client = sys.modules.get("XRootD.client")
    if client is None and _xrootd_client_loaded():
        try:
            from XRootD import client  # type: ignore[no-redef]
        except ImportError:
            client = None
    if client is None:
        yield
        return
    before = client.EnvGetInt("RunForkHandler")
    client.EnvPutInt("RunForkHandler", 0)
    try:
        yield
    finally:
        client.EnvPutInt("RunForkHandler", before)


def foreign_threads() -> dict[int, int]:
    """The threads of this process in another network namespace than the calling
    thread's: {thread id: namespace inode}."""
    here = os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino
    found = {}
    for task in os.listdir("/proc/self/task"):
        try:
            space = os.stat(f"/proc/self/task/{task}/ns/net").st_ino
        except OSError:  # the thread ended meanwhile
            continue
        if space != here:
            found[int(task)] = space
    return found


def rehome_xrootd_client(known: set[int] | frozenset[int] = frozenset()) -> None:
    """The XRootD client's threads back in the calling thread's network namespace.

    XrdCl stops its event loop and worker threads before a ``fork()`` and starts them
    again in the parent from the thread that forked (its ``pthread_atfork`` handlers;
    its log: "Running the parent fork handler ... Creating and starting the built-in
    poller"). A thread of :func:`in_namespace` that forks (PostgreSQL's commands run as
    another user: ``Popen(user=...)`` forks where other starts vfork, which runs no
    handler) thus moves them into its host's namespace, and every connection the
    client opens from them (a redirect's, as the dCache door's to its proxy) fails
    there: ``network is unreachable``, the client asks the door again, the door
    redirects again, until "[FATAL] Redirect limit has been reached" (fresh-clone
    make test, where earlier tests of the worker had started the client). One
    ``fork()`` here, whose child exits at once, starts them again in this thread's
    namespace. :func:`in_namespace` turns the handlers off while it runs
    (:func:`xrootd_fork_handlers_off`); this is for a process whose client has no
    Python bindings to do so (gfal2's). Nothing to do when the client library is not
    loaded or no thread of this process but the ``known`` ones is elsewhere. (Threads
    that stay there are the ones started there for good, as the process watchers of
    PostgreSQL and ZooKeeper, which only wait for their process.)"""
    if not set(foreign_threads()) - set(known) or not _xrootd_client_loaded():
        return
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only exits
        os._exit(0)
    os.waitpid(pid, 0)


@dataclass
class ServerHost:
    """One host of the dCache: a namespace held by ``holder``, its bridge address."""

    name: str
    address: str
    holder: subprocess.Popen | None = None
    #: its domain's JVM, once started
    jvm: subprocess.Popen | None = None
    watched: ServerProcess | None = None

    @property
    def netns(self) -> str:
        """Its handle for ``nsenter --net=`` and :func:`in_namespace`."""
        assert self.holder is not None
        return f"/proc/{self.holder.pid}/ns/net"

    @property
    def domain(self) -> str:
        return f"{self.name}Domain"


@dataclass
class ServerNetwork:
    """The bridge, the hosts on it, and the door's link to this machine."""

    directory: Path
    pools: int
    tag: str = field(default_factory=lambda: f"{os.getpid() % 1000:03d}"
                     f"{random.randint(0, 0xfff):03x}")
    subnet: ipaddress.IPv4Network | None = None
    subnet6: ipaddress.IPv6Network | None = None
    switch: subprocess.Popen | None = None
    hosts: list[ServerHost] = field(default_factory=list)

    def address(self, last: int) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + last)

    @property
    def front(self) -> str:
        """The door's address on its link to this machine (the doors' URLs)."""
        return self.address(2)

    @property
    def head(self) -> str:
        """This machine's end of the door's link."""
        return self.address(1)

    @property
    def front6(self) -> str:
        assert self.subnet6 is not None
        return str(self.subnet6.network_address + 2)

    @property
    def head6(self) -> str:
        assert self.subnet6 is not None
        return str(self.subnet6.network_address + 1)

    def host(self, name: str) -> ServerHost:
        return next(host for host in self.hosts if host.name == name)

    def _hold(self, name: str) -> subprocess.Popen:
        return hold(self.directory, name, timeout=30.0,
                    log=self.directory / "log" / f"netns-{name}.out")

    def start(self) -> ServerNetwork:
        try:
            return self._start()
        except NetnsError as exc:
            raise EndpointError(f"the embedded dCache's network: {exc}") from None

    def _start(self) -> ServerNetwork:
        (self.directory / "log").mkdir(exist_ok=True)
        self.subnet = free_subnet()
        self.subnet6 = free_subnet6()
        self.switch = self._hold("switch")
        make_bridge(self.switch.pid)
        names = ["core", "door", *(f"pool{i}" for i in range(1, self.pools + 1))]
        for index, name in enumerate(names):
            holder = self._hold(name)
            host = ServerHost(name, self.address(130 + index), holder=holder)
            join_bridge(self.switch.pid, holder.pid, f"ssd{self.tag}p{index}",
                        f"ssd{self.tag}c{index}", f"{host.address}/25")
            self.hosts.append(host)
        # the client side: a veth pair from this machine to the door host only
        door = self.host("door")
        outside, inside = f"ssd{self.tag}f", f"ssd{self.tag}g"
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", str(door.holder.pid))  # type: ignore[union-attr]
        ip("addr", "add", f"{self.head}/25", "dev", outside)
        # nodad: usable at once (duplicate address detection would hold it ~2 s)
        ip("-6", "addr", "add", f"{self.head6}/64", "dev", outside, "nodad")
        ip("link", "set", outside, "up")
        ip("addr", "add", f"{self.front}/25", "dev", inside, netns=door.netns)
        ip("-6", "addr", "add", f"{self.front6}/64", "dev", inside, "nodad", netns=door.netns)
        ip("link", "set", inside, "up", netns=door.netns)
        return self

    def stop(self) -> None:
        """End the holders: the namespaces go, their veths and the bridge with them."""
        for holder in [*(host.holder for host in self.hosts), self.switch]:
            if holder is not None and holder.poll() is None:
                holder.kill()
                try:
                    holder.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        # the kernel removes a dead namespace's veths in its own time (a moment later):
        # this machine's end of the door's link goes now
        subprocess.run(["ip", "link", "del", f"ssd{self.tag}f"], capture_output=True,
                       timeout=30)
        self.hosts = []
        self.switch = None


def check_hosts(hosts: int) -> int:
    """``--storage-embedded-hosts`` for the dCache: 1, or 4 to 100."""
    if hosts == 1 or MIN_HOSTS <= hosts <= MAX_HOSTS:
        return hosts
    raise StorageScaleUsageError(
        f"--storage-embedded-hosts {hosts}: the embedded dCache runs on 1 host (one domain) "
        f"or on {MIN_HOSTS} to {MAX_HOSTS} (a core host with PostgreSQL and ZooKeeper, a "
        f"door host, and one pool host each for the rest). Give 1, or 4 or more.")


class EmbeddedDCacheHosts(EmbeddedDCache):
    """The embedded dCache with its domains on ``hosts`` network-namespace hosts (see
    the module's doc). Needs root (namespaces)."""

    summary = "a real dCache release over several hosts (network namespaces)"
    binaries = ("java", "ip", "nsenter", "unshare")  # type: ignore[assignment]

    def __init__(self, *, hosts: int = MIN_HOSTS, **options) -> None:
        super().__init__(**options)
        if check_hosts(hosts) < MIN_HOSTS:
            raise StorageScaleUsageError(
                f"EmbeddedDCacheHosts(hosts={hosts}): {MIN_HOSTS} hosts or more (one host is "
                f"EmbeddedDCache).")
        self.host_count = hosts
        self.network: ServerNetwork | None = None
        #: the door host as offered to the embedded SLURM's client hosts
        self.offered_door: ServerDoor | None = None
        # no tape behind the pools over several hosts (its frontend and admin door are
        # reached on localhost): the one-domain layout's tape, where there is one
        if getattr(self, "tape", None) is not None:
            self.tape = None

    @classmethod
    def check_installed(cls) -> None:
        super().check_installed()
        if os.geteuid() != 0:
            raise EndpointError(
                "the embedded dcache over several hosts (--storage-embedded-hosts 4 or more) "
                "makes its hosts as network namespaces, which needs root. Run the tests as "
                "root (as the CI does), or with --storage-embedded-hosts 1.")
        missing = [name for name in ("ip", "nsenter", "unshare") if not shutil.which(name)]
        if missing:
            raise EndpointError(f"the embedded dcache over several hosts needs "
                                f"{', '.join(missing)}: 'sudo apt-get install iproute2 "
                                f"util-linux'.")

    # -- where -----------------------------------------------------------------------
    @property
    def prometheus_url(self) -> str:
        """None reachable: each domain's exporter listens on 127.0.0.1 inside its own
        host's network namespace, which the session's clients do not enter (a step
        says so, :attr:`exporter_note`; its billing is still compared)."""
        return ""

    @property
    def exporter_note(self) -> str:
        return (f"the dCache over {len(self.hosts) or 'several'} hosts: each domain's "
                f"Prometheus exporter listens in its own host's network namespace, "
                f"which this session does not reach: no exporter counters")

    @property
    def hosts(self) -> list[ServerHost]:
        return self.network.hosts if self.network is not None else []

    def url_for_family(self, scheme: str, family: int) -> str:
        """A door's URL by its IPv4 (4) or IPv6 (6) address on the client side."""
        assert self.network is not None
        kept = self.door_host
        self.door_host = self.network.front if family == 4 else f"[{self.network.front6}]"
        try:
            return self.url_for(scheme)
        finally:
            self.door_host = kept

    def describe(self) -> str:
        text = super().describe()
        return (f"{text[:-1]}; {len(self.hosts)} hosts: "
                + ", ".join(f"{h.name} {h.address}" for h in self.hosts) + ")")

    def server_processes(self) -> list[ServerProcess]:
        watched = super().server_processes()
        return watched + [host.watched for host in self.hosts
                          if host.watched is not None and host.watched is not self.watched]

    def host_rss_bytes(self) -> dict[str, int]:
        """Per host, the resident memory of every process in its namespace."""
        return rss_by_namespace({host.name: host.netns for host in self.hosts})

    def _environment(self) -> dict[str, str]:
        """The JVMs' environment without the loopback preload: on a host of its own a
        wildcard bind is the private network's, and the door reaches the pools."""
        assert self.home is not None
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("X509_", "DCACHE_")) and key != "LD_PRELOAD"}
        return {**environment, "DCACHE_HOME": str(self.home), "LC_ALL": "C.UTF-8"}

    # -- start -------------------------------------------------------------------------
    def _prepare(self) -> None:
        """The network, then the one-domain set-up on the core host (PostgreSQL on its
        loopback, ``database update`` and ``chimera`` there), the layout split."""
        assert self.directory is not None
        self.network = ServerNetwork(self.directory, self.host_count - 2).start()
        self.door_host = self.network.front
        self._offer_door()
        self.zookeeper_listen = self.network.host("core").address
        in_namespace(self.network.host("core").netns, super()._prepare)

    def _offer_door(self) -> None:
        """The door host linked to the client hosts of an embedded SLURM cluster of
        this process, now or once one starts (:mod:`.slurm_hosts`)."""
        from .slurm_hosts import ServerDoor, offer_door

        assert self.network is not None
        door = self.network.host("door")
        assert door.holder is not None
        self.offered_door = ServerDoor(door.holder.pid, (self.network.front,))
        try:
            offer_door(self.offered_door)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise EndpointError(f"the embedded dCache's door host could not be linked to "
                                f"the embedded SLURM's client hosts: {exc}") from None

    def _make_credentials(self) -> None:
        """The host certificate names the door's addresses (the clients verify it): its
        CN the door's IPv4 address, which Globus (SRM, GridFTP) compares with the host
        it connected to (``host@<address>``; the CN ``localhost`` was refused)."""
        super()._make_credentials()
        assert self.authority is not None and self.directory is not None
        assert self.network is not None
        grid = self.directory / "grid-security"
        self.host_certificate = self.authority.issue_host(
            grid / "hostcert.pem", grid / "hostkey.pem", hostname=self.network.front,
            ips=("127.0.0.1", self.network.front, self.network.front6,
                 *(host.address for host in self.network.hosts)))

    def _write_configuration(self) -> None:
        super()._write_configuration()
        assert self.home is not None and self.network is not None
        self._write_hosts_configuration()

    def _write_hosts_configuration(self) -> None:
        """The one domain's layout split over the hosts' domains; dcache.conf without
        the single-host network settings."""
        assert self.home is not None and self.network is not None and self.directory
        network = self.network
        conf = self.home / "etc" / "dcache.conf"
        lines = [line for line in conf.read_text().splitlines()
                 if not line.startswith(("dcache.broker.scheme=", "dcache.net.listen="))]
        conf.write_text("\n".join([*lines, "dcache.broker.scheme=satellite", ""]))
        layout_file = self.home / "etc" / "layouts" / f"{LAYOUT}.conf"
        sections: dict[str, list[str]] = {host.domain: [] for host in network.hosts}
        target: list[str] | None = None
        pools = [host for host in network.hosts if host.name.startswith("pool")]
        pool_index = 0
        for line in layout_file.read_text().splitlines():
            if line == f"[{DOMAIN}]":
                target = None
                continue
            if line.startswith(f"[{DOMAIN}/") and line.endswith("]"):
                service = line[len(DOMAIN) + 2:-1]
                if service == "pool":
                    domain = pools[pool_index % len(pools)].domain
                    pool_index += 1
                elif service in CORE_SERVICES:
                    domain = "coreDomain"
                else:
                    domain = "doorDomain"
                target = sections[domain]
                target.append(f"[{domain}/{service}]")
                continue
            if target is None:
                continue
            if line in ("srmmanager.net.host=localhost", "srm.loginbroker.address=localhost"):
                line = line.replace("localhost", network.front)
            target.append(line)
        for extra in range(pool_index, len(pools)):  # the pools past the layout's own
            pool = self.directory / "pools" / f"pool{extra + 1}"
            (pool / "data").mkdir(parents=True, exist_ok=self.state_kept)
            sections[pools[extra].domain] += [
                f"[{pools[extra].domain}/pool]", f"pool.name=pool{extra + 1}",
                f"pool.path={pool}", "pool.wait-for-files=${pool.path}/data"]
        core, door = network.host("core"), network.host("door")
        headers = {
            core.domain: ["dcache.broker.scheme=core", f"dcache.net.listen={core.address}",
                          f"dcache.java.memory.heap={HEAPS['core']}"],
            # the doors on every interface of the door host: the client side and the bridge
            door.domain: ["dcache.net.listen=", f"dcache.java.memory.heap={HEAPS['door']}",
                          "dcache.java.memory.direct=256m",
                          "webdav.redirect.on-read=false", "webdav.redirect.on-write=false",
                          # the pools listen for the door's proxied transfers on the bridge
                          f"webdav.net.internal={door.address}",
                          "xrootd.net.proxy-transfers=true",
                          f"xrootd.net.internal={door.address}",
                          # a proxy listens on a port of its own per transfer, until
                          # the client closes its connection to it (XrdCl keeps it for
                          # its DataServerTTL): the WAN range's 100 ports ran out at 20
                          # clients ("[3007] No free port within range"). The door host's
                          # namespace is its own: the ports above its ephemeral range
                          f"xrootd.net.proxy.port.min={PROXY_PORTS[0]}",
                          f"xrootd.net.proxy.port.max={PROXY_PORTS[1]}"],
            **{pool.domain: ["dcache.net.listen=", f"dcache.java.memory.heap={HEAPS['pool']}",
                             "dcache.java.memory.direct=256m"] for pool in pools},
        }
        text = []
        for host in network.hosts:
            text += [f"[{host.domain}]", *headers[host.domain], *sections[host.domain], ""]
        layout_file.write_text("\n".join(text))

    def _launch(self) -> None:
        """ZooKeeper on the core host, then every domain's JVM on its host."""
        assert self.directory is not None and self.home is not None
        assert self.network is not None
        in_namespace(self.network.host("core").netns, self._start_zookeeper)
        logs = self.home / "var" / "log"
        logs.mkdir(parents=True, exist_ok=True)
        for host in self.network.hosts:
            log = logs / f"{host.domain}.log"
            with open(log, "ab") as stream:
                host.jvm = subprocess.Popen(
                    ["nsenter", f"--net={host.netns}", "/bin/sh",
                     str(self.directory / "run-domain.sh"), str(self.home), host.domain],
                    cwd=self.home, stdout=stream, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                    env=self._environment(), umask=0o077)
            host.watched = ServerProcess(f"dCache {host.domain} JVM ({host.name} host)",
                                         host.jvm, (log,))
        core = self.network.host("core")
        self.process, self.watched = core.jvm, core.watched

    @property
    def log_path(self) -> Path:
        assert self.home is not None
        return self.home / "var" / "log" / "doorDomain.log"

    def _wait_ready(self) -> str:
        error = super()._wait_ready()
        if not error:
            return ""
        assert self.home is not None
        gone = [f"{host.domain} exited with code {host.jvm.poll()}" for host in self.hosts
                if host.jvm is not None and host.jvm.poll() is not None]
        logs = self.home / "var" / "log"
        tails = "\n".join(f"-- {host.domain}.log:\n{log_tail(logs / f'{host.domain}.log', 8)}"
                          for host in self.hosts if host.name != "door")
        return "; ".join([error, *gone]) + f"\n{tails}\n-- doorDomain.log"

    # -- stop --------------------------------------------------------------------------
    def stop(self) -> None:
        """The satellites' JVMs, then the core's, ZooKeeper, PostgreSQL and the folder
        (:meth:`EmbeddedDCache.stop`), then the hosts (idempotent)."""
        satellites = [host for host in self.hosts
                      if host.jvm is not None and host.jvm is not self.process]
        for host in self.hosts:
            if host.watched is not None:
                host.watched.stopping()
        for host in satellites:  # all at once: dCache's shutdown takes seconds each
            if host.jvm is not None and host.jvm.poll() is None:
                host.jvm.terminate()
        for host in satellites:
            if host.jvm is not None:
                _end(host.jvm)  # waits, then SIGKILL to its group
                host.jvm = None
        began = time.monotonic()
        if self.offered_door is not None:
            from .slurm_hosts import withdraw_door

            withdraw_door(self.offered_door)
            self.offered_door = None
        try:
            super().stop()
        finally:
            if self.network is not None:
                self.network.stop()
                self.network = None
        self.stop_seconds = time.monotonic() - began
