"""The embedded shared file system: CephFS mounted with ``ceph-fuse`` on N client hosts
(seed 001, BNL's GPFS seen from several nodes).

The embedded Ceph of :mod:`.ceph` (one monitor, memstore OSDs) gains a metadata server
(``ceph-mds``) and a file system; each client host is a network namespace with its own
address, joined to the daemons by a veth pair and a bridge, and runs its own
``ceph-fuse`` (its own CephFS client session, capabilities and cache, as a GPFS node
holds its own tokens). The daemons (mon, OSDs, MDS) run in a network namespace of their
own, the one that holds the bridge, on an address (``.129`` of the run's private /24)
that the client hosts reach over their veths and this machine's own namespace has no
route to: nothing of theirs listens in the host's namespace (:func:`netns_layout`).
Every mount is visible from this process at ``<directory>/hosts/ns<i>``: host i's
``file://`` door of the same file system (:attr:`EmbeddedCephFS.hosts`); the
endpoint's URL is host 0's.

Nothing outlives the run, even a pytest killed with SIGKILL: the namespaces are not
named (``ip netns add`` would leave ``/run/netns`` entries) but held by one
``unshare --net sleep`` process each, started in the server's directory: the kernel
removes a namespace with its last process, and its veth ends and the bridge with it
(the plumbing shared with the other namespace hosts: :mod:`.netns`).
The orphan reaper (:mod:`.orphans`) kills those holders, the daemons and the
``ceph-fuse`` clients like any orphan's, and detaches the mounts left inside the
directory before removing it.

Needs root (namespaces, a FUSE mount that other users may read): the CI runs as root.
"""

from __future__ import annotations

import ipaddress
import os
import random
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EndpointError
from .ceph import CEPH_COMMAND_TIMEOUT, Daemon, EmbeddedCephGateway, ceph_version, daemon_state
from .family import EmbeddedServer
from .netns import (
    HOLDER,
    NetnsError,
    free_subnet,
    ip,
    join_bridge,
    link_to_bridge,
    make_bridge,
    wait_unshared,
)
from .orphans import mounts_inside, server_directory

#: the file system's name, its pools, the client key the mounts use
FS_NAME = "storagescale"
DATA_POOL = "cephfs_data"
METADATA_POOL = "cephfs_metadata"
CLIENT = "storagescale"
#: the test area on the file system (each host's mount + AREA)
AREA = "storagescale"
#: client hosts by default (``EmbeddedCephFS(hosts=N)``)
DEFAULT_HOSTS = 2
#: the Dask scheduler's and workers' TLS material (the run's own certificate), 0600 in
#: a 0700 folder of the server's directory, read by root's processes only
DASK_TLS = "dask-tls"
#: the client hosts at most (their addresses are .2 to .(1 + hosts) of the run's /24,
#: inside the .0/25 this machine's namespace routes to; the daemons are at .129)
MAX_HOSTS = 100
#: settings of the MDS and the clients that keep a 2-core machine's throwaway file
#: system responsive: a client that stopped answering loses its session (and its
#: capabilities) after this many seconds rather than the default 60
SESSION_TIMEOUT_S = 30


@dataclass
class ClientHost:
    """One client host: a network namespace (held by ``holder``), its address, its
    ``ceph-fuse`` mount."""

    index: int
    address: str
    mountpoint: Path
    holder: Daemon | None = None
    fuse: Daemon | None = None

    @property
    def name(self) -> str:
        return f"ns{self.index}"

    @property
    def area(self) -> Path:
        """The test area as this host sees it."""
        return self.mountpoint / AREA

    @property
    def url(self) -> str:
        return f"file://{self.area}"

    @property
    def netns(self) -> str:
        """The namespace's handle for ``nsenter --net=``."""
        assert self.holder is not None
        return f"/proc/{self.holder.process.pid}/ns/net"

    def path(self, run_path: str, area: Path) -> str:
        """``run_path`` (a path under host 0's ``area``) as this host sees it."""
        relative = os.path.relpath(run_path, area)
        if relative == ".." or relative.startswith("../"):
            raise EndpointError(f"{run_path} is not inside the CephFS test area {area}.")
        return str(self.area / relative) if relative != "." else str(self.area)


@dataclass(frozen=True)
class NetnsLayout:
    """The run's private /24 and who is where on it.

    - ``head`` (``.1/25``): this machine's end of a veth to the bridge, where the Dask
      scheduler listens; the /25 gives this namespace a route to the client hosts only;
    - ``servers`` (``.129/24``, on the bridge in the servers' namespace): mon, OSDs,
      MDS; no route leads there from this machine's namespace;
    - the client hosts ``.2`` ... (``/24``): they reach both."""

    subnet: ipaddress.IPv4Network

    @property
    def head(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def servers(self) -> str:
        return str(self.subnet.network_address + 129)

    def host(self, index: int) -> str:
        return str(self.subnet.network_address + 2 + index)


def netns_layout(subnet: ipaddress.IPv4Network) -> NetnsLayout:
    return NetnsLayout(subnet)


class EmbeddedCephFS(EmbeddedCephGateway):
    """CephFS (mon, memstore OSDs, one MDS) mounted by ``ceph-fuse`` on ``hosts`` client
    hosts (network namespaces); each mount is a ``file://`` door of the same file
    system (:attr:`hosts`)."""

    kind = "cephfs"
    summary = "CephFS mounted with ceph-fuse on 2 client hosts (network namespaces)"
    schemes = ("file",)
    packages = ("ceph-mon", "ceph-osd", "ceph-mds", "ceph-fuse", "ceph-common", "iproute2")
    binaries = ("ceph-mon", "ceph-osd", "ceph-mds", "ceph-fuse", "ceph", "ceph-authtool",
                "monmaptool", "ip", "nsenter", "unshare", "umount")
    libraries = ()
    title = "CephFS"

    def __init__(self, *, login: str = "unix", hosts: int = DEFAULT_HOSTS, osds: int = 1,
                 startup_timeout: float = 180.0) -> None:
        super().__init__(login=login, osds=osds, xcache=False,
                         startup_timeout=startup_timeout)
        if not 1 <= hosts <= MAX_HOSTS:
            raise EndpointError(f"EmbeddedCephFS(hosts={hosts}): 1 to {MAX_HOSTS} client "
                                f"hosts.")
        self.host_count = hosts
        self.hosts: list[ClientHost] = []
        self.switch: Daemon | None = None
        self.tag = f"{os.getpid() % 1000:03d}{random.randint(0, 0xfff):03x}"
        self._scheduler: Daemon | None = None
        self._scheduler_address = ""
        #: the Dask security of the scheduler and workers (once started)
        self.cluster_security: Any = None
        #: the daemons' namespace (holds the bridge), once made
        self.layout: NetnsLayout | None = None

    # -- what the family asks -----------------------------------------------------------
    @classmethod
    def check_installed(cls) -> None:
        super(EmbeddedCephGateway, cls).check_installed()  # binaries; no plug-ins
        if os.geteuid() != 0:
            raise EndpointError(
                "the embedded cephfs endpoint makes its client hosts as network namespaces "
                "and mounts CephFS with ceph-fuse for every user, which needs root. Run the "
                "tests as root (as the CI does), or point the suite at a mounted shared "
                "file system with --storage-endpoint file:///gpfs/scratch/storagescale.")
        if not Path("/dev/fuse").exists():
            raise EndpointError(
                "the embedded cephfs endpoint mounts CephFS with ceph-fuse, and /dev/fuse "
                "does not exist here. Load the fuse module ('modprobe fuse'; in a container "
                "pass --device /dev/fuse), or point the suite at a mounted file system "
                "with --storage-endpoint file:///path/on/every/host.")

    @classmethod
    def installed_version(cls) -> str:
        try:
            return f"{ceph_version()}+cephfs"
        except (OSError, subprocess.SubprocessError):
            return ""

    @property
    def url(self) -> str:
        """The test area on host 0's mount."""
        return self.hosts[0].url if self.hosts else ""

    def url_for(self, scheme: str) -> str:
        return self.url

    def driver_options(self) -> dict[str, str]:
        return EmbeddedServer.driver_options(self)

    def describe(self) -> str:
        return (f"embedded CephFS {self.ceph_version or '16'} ({self.osds} memstore OSD"
                f"{'s' if self.osds > 1 else ''}, 1 MDS) mounted with ceph-fuse on "
                f"{len(self.hosts)} client hosts: "
                + ", ".join(f"{h.name} {h.address}" for h in self.hosts))

    def host_path(self, index: int, run_path: str) -> str:
        """``run_path`` (a path on the endpoint's URL, host 0) on host ``index``."""
        return self.hosts[index].path(run_path, self.hosts[0].area)

    # -- start ---------------------------------------------------------------------
    def start(self) -> EmbeddedCephFS:
        began = time.monotonic()
        self.ceph_version = ceph_version()
        self.version = f"{self.ceph_version}+cephfs"
        self.directory = server_directory(self.kind)
        try:
            try:
                self._start_network()
            except EndpointError as exc:
                raise self._holders_gone(exc) from None
            self.timings["network"] = time.monotonic() - began
            self._start_mon_and_osds()
            self.timings["cluster"] = time.monotonic() - began
            self._start_file_system()
            self.timings["mds"] = time.monotonic() - began
            for host in self.hosts:
                self._mount(host)
            self.timings["mounts"] = time.monotonic() - began
            self.hosts[0].area.mkdir(exist_ok=True)
            self._wait_for(self._shared, "a file written on one host did not show on the "
                           "others", self.hosts[-1].fuse.name if self.hosts[-1].fuse else "")
        except BaseException:
            self.stop()
            raise
        return self

    #: the process that holds a new network namespace (a test gives one that is slow to)
    HOLDER = HOLDER

    def _hold(self, name: str) -> Daemon:
        """A process holding a new network namespace (gone with it), returned once its
        namespace is made (:func:`.netns.wait_unshared`: before, an ``nsenter`` into it
        acts in this machine's namespace; tests/test_cephfs_start.py)."""
        holder = self._spawn(name, list(self.HOLDER))
        try:
            wait_unshared(holder.process, name, self.startup_timeout)
        except NetnsError as exc:
            raise self._fail(str(exc), holder) from None
        return holder

    def _holders_gone(self, error: EndpointError) -> EndpointError:
        """``error`` of the network's set-up, with how the namespaces' holders that are
        gone ended (``ip link set ... netns PID`` answers only "No such process")."""
        gone = [daemon for daemon in self.daemons if daemon.name.startswith(("switch", "host."))
                and not daemon.alive()]
        if not gone:
            return error
        return EndpointError(f"{error} The holder of a namespace is gone: " + "; ".join(
            f"{daemon.name} {daemon_state(daemon)}" for daemon in gone) + ".")

    def _start_network(self) -> None:
        d = self.directory
        assert d is not None
        (d / "log").mkdir()
        try:
            layout = self.layout = netns_layout(free_subnet())
            # the servers' namespace: the bridge, and on it the daemons' address
            self.switch = self._hold("switch")
            switch = self.switch.process.pid
            make_bridge(switch, f"{layout.servers}/24")
            self.address = layout.servers  # ceph.conf's mon host and public network
            # this host's end (the Dask scheduler's address): a /25 that routes to the
            # client hosts and not to the daemons
            link_to_bridge(switch, f"ss{self.tag}h", f"ss{self.tag}s", f"{layout.head}/25")
            (d / "hosts").mkdir()
            for index in range(self.host_count):
                host = ClientHost(index, layout.host(index), d / "hosts" / f"ns{index}")
                host.mountpoint.mkdir()
                host.holder = self._hold(f"host.{host.name}")
                join_bridge(switch, host.holder.process.pid, f"ss{self.tag}p{index}",
                            f"ss{self.tag}c{index}", f"{host.address}/24")
                self.hosts.append(host)
        except NetnsError as exc:
            raise EndpointError(f"the embedded CephFS's network: {exc}") from None

    def _fail(self, what: str, daemon: Daemon | None = None, log: Path | None = None
              ) -> EndpointError:
        """The base failure; a daemon's with the daemons' namespace's interfaces and
        addresses (a loopback that is DOWN there keeps every client from the monitor)."""
        error = super()._fail(what, daemon, log)
        if daemon is None or self.switch is None or not self.switch.alive():
            return error
        try:
            links = ip("-br", "addr", netns=self.servers_netns).strip()
        except (NetnsError, OSError, subprocess.SubprocessError):
            return error
        return EndpointError(f"{error}\nThe daemons' namespace (ip -br addr):\n{links}")

    @property
    def servers_netns(self) -> str:
        """The daemons' namespace's handle for ``nsenter --net=``."""
        assert self.switch is not None
        return f"/proc/{self.switch.process.pid}/ns/net"

    #: the daemons that run in the servers' namespace, by the name they are spawned as
    _SERVERS = ("mon.", "osd.", "mds.")

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Daemon:
        """A daemon of the file system (mon, OSD, MDS) runs in the servers' namespace
        (``nsenter`` execs it: the process is the daemon's own)."""
        if name.startswith(self._SERVERS) and self.switch is not None:
            command = ["nsenter", f"--net={self.servers_netns}", *command]
        return super()._spawn(name, command, env)

    def _command(self, args: tuple[str, ...]) -> list[str]:
        """A Ceph tool runs in the servers' namespace: ``ceph`` talks to the monitor (no
        route leads there from here), ``ceph-mon --mkfs`` looks for the public
        network's address among the namespace's interfaces."""
        if self.switch is None:
            return list(args)
        return ["nsenter", f"--net={self.servers_netns}", *args]

    def _more_conf(self) -> list[str]:
        d = self.directory
        assert d is not None
        return [
            "[mds]",
            f"mds data = {d}/mds/$id",
            f"keyring = {d}/mds/$id/keyring",
            f"mds session timeout = {SESSION_TIMEOUT_S}",
            f"[client.{CLIENT}]",
            f"keyring = {d}/client/keyring",
            f"log file = {d}/log/client.$pid.log",
            f"admin socket = {d}/run/client.$pid.asok",
            "client mount timeout = 60",
        ]

    def _start_file_system(self) -> None:
        d = self.directory
        assert d is not None
        data = d / "mds" / "a"
        data.mkdir(parents=True)
        (d / "client").mkdir()
        (data / "keyring").write_text(self.ceph(
            "auth", "get-or-create", "mds.a", "mon", "allow profile mds", "osd", "allow rwx",
            "mds", "allow"))
        user = self._ceph_user()
        self._chown(user)
        self._spawn("mds.a", ["ceph-mds", "-c", str(self.conf), "-i", "a", "-f",
                              *self._setuser(user)])
        for pool in (METADATA_POOL, DATA_POOL):
            self.ceph("osd", "pool", "create", pool, str(self.pg_num), str(self.pg_num))
        self.ceph("fs", "new", FS_NAME, METADATA_POOL, DATA_POOL)
        self._wait_for(self._mds_active, "the MDS did not become active", "mds.a")
        (d / "client" / "keyring").write_text(
            self.ceph("fs", "authorize", FS_NAME, f"client.{CLIENT}", "/", "rw"))
        (d / "client" / "keyring").chmod(0o600)

    def _mds_active(self) -> bool:
        import json

        dump = json.loads(self.ceph("fs", "dump", "--format", "json"))
        return any(info.get("state") == "up:active"
                   for fs in dump.get("filesystems", [])
                   for info in fs.get("mdsmap", {}).get("info", {}).values())

    def _mount(self, host: ClientHost) -> None:
        """Host ``host``'s own ``ceph-fuse`` (in its namespace), mounted once a stat of
        the mount point answers from the file system."""
        d = self.directory
        assert d is not None and host.holder is not None
        host.fuse = self._spawn(f"ceph-fuse.{host.name}", [
            "nsenter", f"--net={host.netns}", "ceph-fuse", "-f", "-c", str(self.conf),
            "--id", CLIENT, "--client_mountpoint=/", str(host.mountpoint)])
        self._wait_for(lambda: os.path.ismount(host.mountpoint),
                       f"ceph-fuse on {host.name} did not mount", host.fuse.name)

    def _shared(self) -> bool:
        marker = self.hosts[0].area / ".storagescale-shared"
        marker.write_bytes(b"ready")
        try:
            return all((host.area / marker.name).read_bytes() == b"ready"
                       for host in self.hosts)
        except OSError:
            return False
        finally:
            marker.unlink(missing_ok=True)

    # -- one Dask worker per client host (the cluster executor) ---------------------------
    def cluster_address(self) -> str:
        """A Dask scheduler on the head address and one worker per client host, started
        on first call: each worker runs in its host's namespace and a private mount
        namespace where host 0's mount point is its own host's mount (``mount --bind``),
        so that the endpoint's one ``file://`` path is the same on every host, as
        ``/gpfs/scratch`` is on every GPFS node, served by that host's own client.

        A Dask scheduler or worker runs any function a client sends it, as root here:
        they speak mutual TLS only (``tls://``), with a certificate made for this run
        (:func:`~pytest_storagescale.cluster.hosts.run_security`) that is also the only
        CA they trust; :attr:`cluster_security` is what a client presents (registered
        for the address: ``--storage-cluster`` finds it). No dashboard, and their HTTP
        servers without pages."""
        if self._scheduler is None:
            try:
                self._start_dask()
            except BaseException:
                self._stop_dask()
                raise
        return self._scheduler_address

    def _dask_tls(self) -> list[str]:
        """The run's certificate and key as files for the ``dask`` command lines (0600,
        in a 0700 folder, created so: never readable by another user in between)."""
        from ..cluster.hosts import run_security

        d = self.directory
        assert d is not None
        folder = d / DASK_TLS
        if self.cluster_security is None:
            self.cluster_security = run_security()
            folder.mkdir(mode=0o700)
            folder.chmod(0o700)  # whatever the umask
            material = self.cluster_security.get_tls_config_for_role("worker")
            for name, text in (("cert.pem", material["cert"]), ("key.pem", material["key"])):
                handle = os.open(folder / name,
                                 os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with open(handle, "w") as sink:
                    sink.write(text)
        cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
        # the certificate is its own CA: the only one they trust
        return ["--tls-ca-file", cert, "--tls-cert", cert, "--tls-key", key]

    def _start_dask(self) -> None:
        import socket
        import sys

        from ..cluster.hosts import LOOPBACK, NO_HTTP_ROUTES_ENV, register_security

        d = self.directory
        assert d is not None and self.hosts and self.layout is not None
        (d / "dask").mkdir(exist_ok=True)
        tls = self._dask_tls()
        head = self.layout.head
        with socket.socket() as probe:
            probe.bind((head, 0))
            port = probe.getsockname()[1]
        self._scheduler_address = f"tls://{head}:{port}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
               **NO_HTTP_ROUTES_ENV, "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}
        self._scheduler = self._spawn("dask-scheduler", [
            sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", head,
            "--port", str(port), "--protocol", "tls", "--no-dashboard",
            # its HTTP server (no pages) would take *:8787
            "--dashboard-address", f"{LOOPBACK}:0", *tls], env)
        self._wait_for(lambda: self._listening(head, port), "the Dask scheduler did not "
                       "listen", "dask-scheduler")
        register_security(self._scheduler_address, self.cluster_security)
        here = self.hosts[0].mountpoint
        for host in self.hosts:
            local = d / "dask" / host.name
            local.mkdir(exist_ok=True)
            worker = (f"exec {sys.executable} -m distributed.cli.dask_worker "
                      f"{self._scheduler_address} --host {host.address} --nthreads 1 "
                      f"--no-nanny --name {host.name} --no-dashboard --local-directory {local} "
                      f"--dashboard-address {LOOPBACK}:0 "
                      + " ".join(tls))
            bind = "" if host.index == 0 else f"mount --bind {host.mountpoint} {here} && "
            self._spawn(f"dask-worker.{host.name}", [
                "nsenter", f"--net={host.netns}", "unshare", "--mount", "--propagation",
                "private", "sh", "-c", bind + worker], env)
        from distributed import Client

        with Client(self._scheduler_address, timeout=30, set_as_default=False,
                    security=self.cluster_security) as client:
            try:
                client.wait_for_workers(len(self.hosts), timeout=self.startup_timeout)
            except TimeoutError:
                raise self._fail(f"the {len(self.hosts)} Dask workers did not join within "
                                 f"{self.startup_timeout:.0f} s",
                                 self._daemon(f"dask-worker.{self.hosts[-1].name}")) from None

    @staticmethod
    def _listening(address: str, port: int) -> bool:
        import socket

        try:
            socket.create_connection((address, port), timeout=1).close()
        except OSError:
            return False
        return True

    def _stop_dask(self) -> None:
        if self._scheduler_address:  # this process's client of it first (else its exit
            from ..cluster.hosts import disconnect, forget_security  # tries to reconnect)

            disconnect(self._scheduler_address)
            forget_security(self._scheduler_address)
        names = {"dask-scheduler", *(f"dask-worker.{host.name}" for host in self.hosts)}
        for daemon in [d for d in self.daemons if d.name in names]:
            daemon.stop()
            self.daemons.remove(daemon)
        self._scheduler = None

    # -- a client host lost -----------------------------------------------------------
    def kill_client(self, index: int) -> None:
        """SIGKILL host ``index``'s ``ceph-fuse`` (the client host lost: its session
        and capabilities stay with the MDS until it times them out); its mount answers
        "not connected" until :meth:`remount`."""
        host = self.hosts[index]
        if host.fuse is not None and host.fuse.alive():
            host.fuse.stopping()  # on purpose: not a death of the server
            host.fuse.process.kill()
            host.fuse.process.wait(timeout=30)

    def remount(self, index: int) -> None:
        """A new ``ceph-fuse`` for host ``index`` after :meth:`kill_client` (the Dask
        workers, which kept the old mount in their namespaces, are started again on
        the next :meth:`cluster_address`)."""
        host = self.hosts[index]
        self._stop_dask()
        self.unmount(host)
        if host.fuse is not None and host.fuse in self.daemons:
            self.daemons.remove(host.fuse)
        self._mount(host)

    # -- stop ----------------------------------------------------------------------
    def unmount(self, host: ClientHost) -> None:
        """Unmount ``host`` (lazily when busy): its ``ceph-fuse`` exits by itself."""
        for command in (["umount", str(host.mountpoint)],
                        ["umount", "-l", str(host.mountpoint)]):
            if not mounts_inside(host.mountpoint):  # a dead FUSE mount is no ismount()
                break
            subprocess.run(command, capture_output=True, timeout=CEPH_COMMAND_TIMEOUT)
        if host.fuse is not None:
            try:
                host.fuse.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def stop(self) -> None:
        """Unmount every host, stop the daemons, the namespaces go with their holders."""
        self._stop_dask()
        for host in self.hosts:
            self.unmount(host)
        self.hosts = []
        self.switch = None
        super().stop()
