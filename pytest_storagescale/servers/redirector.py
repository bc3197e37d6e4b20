"""The embedded redirector: a real XRootD cluster on loopback (``--storage-embedded
redirector``).

A manager (an ``xrootd`` and a ``cmsd`` with ``all.role manager``) and two data
servers (each an ``xrootd`` and a ``cmsd`` with ``all.role server`` subscribing to
the manager's ``cmsd``), Debian's ``xrootd-server``. Clients talk to the manager
only: it answers ``locate`` with the data servers that hold a path and redirects
every open, stat and namespace request to one of them. Each node has its own
private directory (``<dir>/<node>/``: configuration, ``admin/`` socket path,
``run/``, ``data/`` as its ``oss.localroot``, logs), listens on free loopback ports
and runs as the unprivileged user when the session is root.

It is ready when a refreshed ``locate`` of the test area through the manager names
every data server (probed, never slept for); :meth:`EmbeddedXRootDCluster.stop_data_server`
and :meth:`~EmbeddedXRootDCluster.start_data_server` take one data server away and
bring it back on the same ports with the same files (the tests' fault).

What makes it come up and answer in seconds (measured on XRootD 5.5.3; each setting
left at its default costs what is said):

- ``cms.delay startup 1`` (the least it takes; default 90: no client is served for
  90 s), ``lookup 1`` (default 5: a refreshed locate takes 5 s, a restarted data server
  is named again after ~15 s), ``drop 3`` (default 600: the files of a data server
  that went away are not reported missing; clients are told to wait and time out,
  "Operation expired", for 10 minutes) and ``service 1`` (default 15: how long a client
  waits in the seconds between a data server going away and its drop);
- ``cms.conwait 1`` on every xrootd (default 10: a client that comes before the
  node's cmsd serves is told to come back in 10 s, a start took 11 s);
- ``cms.space min 10m 20m`` (default 10 GB free before a data server is chosen for a
  new file); ``ofs.dirlist remote`` on the manager (the default, local, answers a
  plain dirlist from the manager's own empty disk);
- each node's cmsd is started first and its xrootd once the cmsd answers (an xrootd
  that finds no cmsd tries again 10 s later; the probe of a data server's admin socket
  leaves an "Invalid admin login sequence" line in its cmsd log).

What a client sees through this 5.5.3 manager: a new file's open waits the lookup
delay (1 s: no data server has it, and those that do not have a file do not answer);
a locate from the manager's cache is answered at once, a refreshed one (the manager
asks its servers) in ~1 s; right after a data server went away a cached locate may
still name it, or answer "Invalid response" (code 303); a refreshed one answers "No
servers have the file" (kXR_NotFound) within ~4 s, and an open or stat "No servers
are available to read the file" at once. Namespace requests go to one data server
(no ``ofs.forward``: it needs ``ofs.authorize``, and then ``1way`` answers success
before the servers act, an exclusive mkdir of an existing directory included, while
``2way`` never answered the client): mkdir makes the directory on one data server
(the others get it with their first file), rmdir removes one server's copy, and
rmdir of a directory whose files are on another server answers "eligible servers
shunned" (kXR_NotFound) or, after ~16 s of redirects, "Redirect limit has been
reached". A plain dirlist lists one data server's entries; ``xrdfs ls`` (the client's
locate flag) merges every server's.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from ..drivers.grid import Location, located  # noqa: F401 - locate is the client's request
from ..errors import EndpointError
from ..load.server_monitor import report_line
from .family import EmbeddedServer
from .loopback import preloaded
from .orphans import server_directory
from .processes import (
    ProcessGroup,
    ServerProcess,
    find_daemon,
    free_port,
    log_tail,
    unprivileged_user,
)
from .xrootd import AREA, INSTALL_HINT, xrootd_binary, xrootd_version
from .xrootd_releases import write_own_file

#: the manager's delays (``cms.delay``, seconds; the least that worked, see above):
#: ``startup`` until it serves (default 90; 1 is the least it takes), ``lookup`` how
#: long a client waits while it asks its servers about a path (default 5), ``drop``
#: when an offline server is forgotten with its files (default 600), ``service`` how
#: long a client waits while the servers of a path are offline (default 15)
CMS_DELAYS = {"startup": 1, "lookup": 1, "drop": 3, "service": 1}
#: how long an xrootd asks clients to wait while its cmsd does not serve yet (default 10)
CMS_CLIENT_WAITS = ("cms.conwait 1",)
#: the free space a data server must have to be chosen for a new file (default
#: ``min 10g 11g``: a CI disk may have less)
CMS_SPACE = "linger 0 recalc 15 min 10m 20m"
#: how long the manager may take to see a data server (re)subscribe
READY_TIMEOUT = 60.0


#: what a node's daemons write: the only folders of its directory its user owns when
#: the session is root
NODE_WRITES = ("admin", "run", "data", "log")


class ClusterNode:
    """One node of the cluster: an ``xrootd`` and a ``cmsd`` sharing a directory."""

    def __init__(self, name: str, role: str, directory: Path, manager_cms_port: int = 0,
                 delays: dict[str, int] | None = None) -> None:
        self.name = name
        #: the manager's cms.delay settings
        self.delays = CMS_DELAYS if delays is None else delays
        #: how long this node's xrootd asks clients to wait for its cmsd
        self.client_waits = CMS_CLIENT_WAITS
        self.role = role
        self.directory = directory
        self.port = 0
        #: the manager's cmsd port (its own for the manager)
        self.manager_cms_port = manager_cms_port
        self.xrootd: ProcessGroup | None = None
        self.cmsd: ProcessGroup | None = None
        #: where its xrootd sends its summary monitoring ("" none: the cluster's
        #: ``report_to``)
        self.report_to = ""
        for sub in (*NODE_WRITES, "data" + AREA):
            (directory / sub).mkdir(parents=True, exist_ok=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data(self) -> Path:
        """The node's ``oss.localroot``: a path ``/a/b`` is the file ``data/a/b``."""
        return self.directory / "data"

    def log(self, daemon: str) -> Path:
        return self.directory / "log" / f"{daemon}.log"

    def config(self) -> Path:
        d = self.directory
        lines = [
            f"all.role {self.role}",
            f"all.manager 127.0.0.1:{self.manager_cms_port}",
            f"all.export {AREA}",
            f"xrd.port {self.port} if exec xrootd",
            f"oss.localroot {self.data}",
            f"all.adminpath {d / 'admin'}",
            f"all.pidpath {d / 'run'}",
            "xrootd.chksum adler32",
            f"cms.space {CMS_SPACE}",
            "xrd.sched mint 8 maxt 1024 avlt 64 idle 60",
            # an xrootd asks clients to come back in 10 s while its cmsd does not serve yet
            *self.client_waits,
        ]
        if self.role == "manager":
            lines += [
                f"xrd.port {self.manager_cms_port} if exec cmsd",
                *(["cms.delay " + " ".join(f"{key} {value}" for key, value in
                                           self.delays.items())] if self.delays else []),
                # a plain dirlist is sent to a data server holding the directory (the
                # default, local, would list the manager's own empty disk)
                "ofs.dirlist remote",
            ]
        if self.report_to:  # the xrootd's requests (its cmsd has none of its own)
            lines += ["if exec xrootd", report_line(self.report_to), "fi"]
        # root's folder (the daemons read it as root): a link is replaced, not followed
        return write_own_file(d / "node.cfg", "\n".join([*lines, ""]))

    def launch(self, daemon: str, user: str | None, binary: str) -> None:
        """Start the node's ``daemon`` (``cmsd`` or ``xrootd``; as ``user`` when root)."""
        command = [binary, "-c", str(self.config()), "-l", str(self.log(daemon)),
                   *(["-R", user] if user else [])]
        # xrd.port binds every interface: both daemons on loopback only (loopback.c)
        group = ProcessGroup(command, cwd=self.directory / "run",
                             env=preloaded(dict(os.environ)),
                             output=self.directory / "log" / f"{daemon}.out",
                             name=f"{self.name}'s {daemon}", log=self.log(daemon))
        setattr(self, daemon, group)

    def exited(self) -> str:
        """'' while its started daemons run, else which one exited with which code."""
        for daemon in ("cmsd", "xrootd"):
            group: ProcessGroup | None = getattr(self, daemon)
            code = group.exited() if group is not None else None
            if group is not None and code is not None:
                return f"the {self.name}'s {daemon} exited with code {code}"
        return ""

    def answers(self, daemon: str) -> bool:
        """Whether ``daemon`` accepts connections: the xrootd on its port; the cmsd on the
        manager's port (the manager) or on its admin socket, where the node's xrootd
        logs in (a data server). An xrootd that finds no cmsd tries again 10 s later."""
        target: tuple[str, int] | str
        if daemon == "xrootd" or self.role == "manager":
            family, target = socket.AF_INET, (
                "127.0.0.1", self.port if daemon == "xrootd" else self.manager_cms_port)
        else:
            family, target = socket.AF_UNIX, str(self.directory / "admin" / ".olb" /
                                                  "olbd.admin")
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.settimeout(1)
                probe.connect(target)
        except OSError:
            return False
        return True

    def stop(self) -> None:
        """Stop both daemons (their files stay)."""
        for daemon in ("xrootd", "cmsd"):
            group: ProcessGroup | None = getattr(self, daemon)
            if group is not None:
                group.stop()
            setattr(self, daemon, None)

    @property
    def running(self) -> bool:
        return self.xrootd is not None and not self.exited()

    def log_tails(self, lines: int = 8) -> str:
        return "\n".join(f"--- {self.name} {daemon}:\n{log_tail(self.log(daemon), lines)}"
                         for daemon in ("xrootd", "cmsd"))


class EmbeddedXRootDCluster(EmbeddedServer):
    """A manager and two data servers on loopback; the test area is served through the
    manager, ``root://127.0.0.1:<manager port>//storagescale``."""

    kind = "redirector"
    reports_summary = True
    summary = "an XRootD cluster: a cmsd manager and two data servers"
    schemes = ("root",)
    packages = ("xrootd-server",)
    binaries = ("xrootd", "cmsd")

    def __init__(self, *, login: str = "unix", data_servers: int = 2,
                 startup_timeout: float = READY_TIMEOUT, delays: dict[str, int] | None = None
                 ) -> None:
        super().__init__(login=login)
        #: the manager's ``cms.delay`` (default :data:`CMS_DELAYS`)
        self.delays = CMS_DELAYS if delays is None else delays
        self.data_server_count = data_servers
        self.startup_timeout = startup_timeout
        self.directory: Path | None = None
        self.manager: ClusterNode | None = None
        self.data_servers: list[ClusterNode] = []
        self._user: str | None = None
        self._binaries: dict[str, str] = {}
        #: seconds from start() to the manager seeing every data server
        self.start_seconds = 0.0

    @classmethod
    def check_installed(cls) -> None:
        if find_daemon("cmsd") is None or shutil.which("xrootd") is None:
            raise EndpointError(
                f"the embedded redirector needs the xrootd and cmsd daemons, not found on "
                f"PATH: {INSTALL_HINT}")

    # -- where -----------------------------------------------------------------------
    @property
    def server(self) -> str:
        """The manager, ``root://127.0.0.1:<port>``."""
        assert self.manager is not None, "a cluster that is not running has no manager"
        return f"root://{self.manager.address}"

    @property
    def url(self) -> str:
        """The test area through the manager."""
        return f"{self.server}/{AREA}"

    def url_for(self, scheme: str) -> str:
        return self.url

    def describe(self) -> str:
        return (f"embedded xrootd {self.version} cluster: a cmsd manager and "
                f"{self.data_server_count} data servers ({self.login} login)")

    def data_server_url(self, index: int) -> str:
        """The test area on one data server, directly (not through the manager)."""
        return f"root://{self.data_servers[index].address}/{AREA}"

    def holders(self, path: str) -> list[int]:
        """The data servers whose disk holds ``path`` (what the manager should find)."""
        relative = path.lstrip("/")
        return [index for index, node in enumerate(self.data_servers)
                if (node.data / relative).exists()]

    def server_index(self, address: str) -> int | None:
        """Which data server ``host:port`` (a locate answer's) is, by its port."""
        port = address.rsplit(":", 1)[-1]
        for index, node in enumerate(self.data_servers):
            if str(node.port) == port:
                return index
        return None

    # -- life ------------------------------------------------------------------------
    def start(self) -> EmbeddedXRootDCluster:
        started = time.monotonic()
        self._binaries = {"xrootd": xrootd_binary(), "cmsd": find_daemon("cmsd") or "cmsd"}
        self.version = xrootd_version(self._binaries["xrootd"])
        self.directory = server_directory(self.kind)
        self._user = unprivileged_user()
        try:
            self.manager = ClusterNode("manager", "manager", self.directory / "manager",
                                       delays=self.delays)
            self.data_servers = [
                ClusterNode(f"data server {index + 1}", "server",
                            self.directory / f"server{index + 1}")
                for index in range(self.data_server_count)]
            for node in self._nodes():
                node.report_to = self.report_to
            self._hand_to_user()
            self._start_node(self.manager)
            for node in self.data_servers:
                node.manager_cms_port = self.manager.manager_cms_port
                self._start_node(node)
            self.wait_for_data_servers(range(self.data_server_count))
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _hand_to_user(self) -> None:
        if not self._user:
            return
        assert self.directory is not None
        entry = pwd.getpwnam(self._user)
        # the daemons start as root and read their configuration before they drop: the
        # folders and configurations stay root's, the user owns only what it writes
        for node in self._nodes():
            for folder in (self.directory, node.directory):
                os.chown(folder, -1, entry.pw_gid)
                folder.chmod(0o750)
            for sub in NODE_WRITES:
                for path in [node.directory / sub, *(node.directory / sub).rglob("*")]:
                    os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)

    def _start_node(self, node: ClusterNode, *, same_ports: bool = False) -> None:
        """Start ``node``'s cmsd, then (once it answers) its xrootd, on free ports (or its
        own again) until both answer."""
        why = ""
        for _ in range(1 if same_ports else 3):  # a port picked free can be taken
            if not same_ports:
                node.port = free_port()
                if node.role == "manager":
                    node.manager_cms_port = free_port()
            for daemon in ("cmsd", "xrootd"):
                node.launch(daemon, self._user, self._binaries[daemon])
                why = self._wait_answering(node, daemon)
                if why:
                    break
            if not why:
                return
            node.stop()
        raise EndpointError(f"the embedded redirector's {node.name} did not start: {why}. "
                            f"Log tails:\n{node.log_tails()}")

    def _wait_answering(self, node: ClusterNode, daemon: str) -> str:
        """'' once ``daemon`` of ``node`` answers, else why not (probed, never slept for)."""
        deadline = time.monotonic() + self.startup_timeout
        group: ProcessGroup | None = getattr(node, daemon)
        assert group is not None
        while time.monotonic() < deadline:
            if group.exited(wait=0.05) is not None:  # the pause between probes
                return node.exited()
            if node.answers(daemon):
                return ""
        return f"its {daemon} did not answer within {self.startup_timeout:.0f} s"

    def wait_for_data_servers(self, indexes: Iterable[int], *,
                              timeout: float | None = None) -> float:
        """Probe until a refreshed locate of the test area through the manager names the
        data servers ``indexes`` (and only running ones); the seconds it took."""
        wanted = {self.data_servers[index].port for index in indexes}
        started = time.monotonic()
        deadline = started + (timeout or self.startup_timeout)
        seen, last = set(), "no answer"
        while time.monotonic() < deadline:
            broken = [node.exited() for node in self._nodes() if node.xrootd and node.exited()]
            if broken:
                raise EndpointError(f"the embedded redirector broke: {broken[0]}. Log "
                                    f"tails:\n{self._log_tails()}")
            try:
                # the manager may ask a client to come back later (kXR_wait): the probe
                # waits as long as the deadline allows
                remaining = max(1.0, deadline - time.monotonic())
                seen = {entry.port for entry in located(self.server, AREA, timeout=remaining)}
            except Exception as exc:  # noqa: BLE001 - probe until the deadline
                last = str(exc)
            if wanted <= seen:
                return time.monotonic() - started
            assert self.manager is not None and self.manager.xrootd is not None
            self.manager.xrootd.exited(wait=0.1)  # the pause between probes
        manager = self.manager.address if self.manager is not None else "(none)"
        raise EndpointError(
            f"the embedded redirector's manager {manager} did not see the data "
            f"servers on ports {sorted(wanted)} within {timeout or self.startup_timeout:.0f} s "
            f"(its locate of {AREA} named ports {sorted(seen)}; last error: {last}). Log "
            f"tails:\n{self._log_tails()}")

    def stop_data_server(self, index: int) -> None:
        """Take data server ``index`` away (its xrootd and cmsd); its files stay."""
        self.data_servers[index].stop()

    def start_data_server(self, index: int) -> float:
        """Bring data server ``index`` back on its ports with its files; the seconds until
        the manager names it again."""
        node = self.data_servers[index]
        if node.running:
            return 0.0
        self._start_node(node, same_ports=True)
        running = [i for i, other in enumerate(self.data_servers) if other.running]
        return self.wait_for_data_servers(running)

    def server_processes(self) -> list[ServerProcess]:
        """Every running node's cmsd and xrootd (a data server taken away on purpose
        is not listed)."""
        groups = [getattr(node, daemon) for node in self._nodes()
                  for daemon in ("cmsd", "xrootd")]
        return [group.watched for group in groups if group is not None]

    def _nodes(self) -> list[ClusterNode]:
        return [node for node in (self.manager, *self.data_servers) if node is not None]

    def _log_tails(self) -> str:
        return "\n".join(node.log_tails() for node in self._nodes())

    def stop(self) -> None:
        """Stop every daemon and remove the directory (idempotent)."""
        for node in reversed(self._nodes()):
            node.stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
