"""The embedded Ceph gateway: a single-node Ceph cluster behind an XRootD ``libXrdCeph``
gateway, with an XCache door in front of it (seed 002: RAL's Echo).

Everything lives in one private directory and listens on free loopback ports:

- Ceph 16: one monitor and ``osds`` OSDs with ``osd objectstore = memstore`` (objects
  in RAM, no disks), no manager (I/O does not need it); cephx keys per daemon; a pool
  and a ``client.xrootd`` key allowed on it only.
- the gateway: ``xrootd`` with ``ofs.osslib libXrdCeph.so`` (radosstriper objects),
  run as the ``xrootd`` user when the session is root (Ceph's daemons as ``ceph``);
- the XCache door: :class:`~pytest_storagescale.servers.xcache.XCacheProxy` (``pss`` +
  ``pfc``) in front of the gateway: :attr:`EmbeddedCephGateway.cached_url` names the
  same test area read through it.

Ceph's object namespace has no directories: the gateway answers ``mkdir`` and
``rmdir`` with success and stores nothing, and ``stat`` of a "directory" is *not
found*. The test area is therefore the pool's root, ``root://127.0.0.1:<port>//``:
the run directory and every step's folder are name prefixes of objects
(``/storagescale-run-.../read-c1-.../read-target``), and the clean-up finds them by
listing the pool (the gateway lists the pool's objects at ``/`` only), which the
XRootD driver does for such an endpoint (see ``drivers/xrootd.py``, flat namespace).

Readiness is probed (``ceph health`` answering, the OSDs up, one object written and
read through the gateway), never slept for.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import ClassVar

from ..errors import EndpointError
from .family import EmbeddedServer
from .loopback import preloaded
from .orphans import server_directory
from .processes import ServerProcess, free_port, log_tail, unprivileged_user
from .xcache import XCacheProxy, plugin_library, plugin_path
from .xrootd import xrootd_binary, xrootd_version
from .xrootd_releases import write_own_file

#: the pool the gateway stores into (``xrootd@<pool>``)
POOL = "storagescale"
#: the test area: a name prefix in the pool, "made" by the marker object in it
AREA = "/storagescale"
AREA_MARKER = ".storagescale-area"
#: the Ceph user the gateway logs in as
GATEWAY_USER = "xrootd"
#: memory each memstore OSD may hold (objects live in the OSD's RAM)
MEMSTORE_BYTES = 1 << 30
#: each request to the monitor (``ceph ...``) gives up after this many seconds
CEPH_COMMAND_TIMEOUT = 60
#: what a throwaway cluster on a busy machine does not do to itself (0: never)
STARVATION_SETTINGS = (
    "osd op thread suicide timeout = 0",
    "osd command thread suicide timeout = 0",
    "osd recovery thread suicide timeout = 0",
    "mon data avail crit = 0",
)


class Daemon(ServerProcess):
    """One process this server started (``log``: its console output; the note quotes
    the daemon's own log beside it), watched for its end."""

    def __init__(self, name: str, process: subprocess.Popen, log: Path) -> None:
        super().__init__(name, process, (log.with_suffix(".log"), log))
        self.log = log

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_bytes(self) -> int:
        """Resident memory now (0 when gone)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/statm").read_text().split()
            return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            return 0

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (a frozen process is thawed first)."""
        self.stopping()
        if not self.alive():
            return
        try:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout)
        except ProcessLookupError:
            pass


def daemon_state(daemon: ServerProcess) -> str:
    """What a daemon is doing, from ``/proc``: its pid and state, where it sleeps in the
    kernel, its threads and the CPU time it used (0 s: it never ran), or how it ended."""
    status = daemon.exit_status()
    if status is not None:
        return f"pid {daemon.pid} exited with code {status}"
    proc = Path(f"/proc/{daemon.pid}")
    try:
        fields = dict(line.split(":", 1) for line in
                      (proc / "status").read_text().splitlines() if ":" in line)
        stat = (proc / "stat").read_text().rpartition(")")[2].split()
        cpu_s = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        wchan = (proc / "wchan").read_text().strip() or "-"
    except (OSError, ValueError, IndexError):
        return f"pid {daemon.pid}, no /proc entry"
    return (f"pid {daemon.pid} {fields.get('State', '?').strip()}, in {wchan}, "
            f"{fields.get('Threads', '?').strip()} threads, {cpu_s:.1f} s of CPU")


def ceph_version() -> str:
    """The cluster software's version from ``ceph --version`` (e.g. ``16.2.15``)."""
    done = subprocess.run(["ceph", "--version"], capture_output=True, text=True, timeout=30)
    words = done.stdout.split()
    return words[2] if len(words) > 2 and words[0] == "ceph" else "unknown"


class EmbeddedCephGateway(EmbeddedServer):
    """Ceph (mon + memstore OSDs) behind an XRootD gateway, with an XCache door.

    ``osds`` OSD processes share the pool (``pg_num`` placement groups); ``xcache``
    starts the caching door (:attr:`cached_url`)."""

    kind = "ceph"
    summary = "Ceph with the XRootD gateway"
    schemes = ("root",)
    packages = ("ceph-mon", "ceph-osd", "ceph-common", "xrootd-ceph-plugins",
                "xrootd-server", "xrootd-server-plugins")
    binaries: ClassVar[tuple[str, ...]] = ("ceph-mon", "ceph-osd", "ceph", "ceph-authtool",
                                           "monmaptool", "xrootd")
    #: the plug-in libraries (xrootd-ceph-plugins, xrootd-server-plugins)
    libraries: ClassVar[tuple[str, ...]] = ("libXrdCeph", "libXrdPss", "libXrdPfc")
    #: what its errors call it
    title = "Ceph gateway"

    def __init__(self, *, login: str = "unix", osds: int = 1, pg_num: int = 8,
                 xcache: bool = True, startup_timeout: float = 180.0) -> None:
        super().__init__(login=login)
        if osds < 1:
            raise EndpointError(f"EmbeddedCephGateway(osds={osds}): at least one OSD.")
        self.osds = osds
        self.pg_num = pg_num
        self.with_xcache = xcache
        self.startup_timeout = startup_timeout
        #: the address the daemons listen on (a subclass with client hosts in network
        #: namespaces moves it onto their network)
        self.address = "127.0.0.1"
        self.directory: Path | None = None
        self.daemons: list[Daemon] = []
        self.mon_port = 0
        self.port = 0
        self.xcache: XCacheProxy | None = None  # once started
        self.version = ""
        self.ceph_version = ""
        self.xrootd_version = ""
        #: seconds from start() to each milestone (for the report)
        self.timings: dict[str, float] = {}
        #: why the last readiness probe failed (quoted if the start gives up)
        self._probe_error = ""

    # -- what the family asks -----------------------------------------------------------
    @classmethod
    def check_installed(cls) -> None:
        super().check_installed()
        missing = [name for name in cls.libraries if plugin_library(name) is None]
        if missing:
            raise EndpointError(
                f"the embedded {cls.kind} endpoint needs the XRootD plug-in libraries "
                f"{', '.join(missing)}, not installed. Install them: 'sudo apt-get install "
                f"{' '.join(cls.packages)}' (or run 'make setup' in the pytest-storagescale "
                f"checkout); or point the suite at a running gateway with --storage-endpoint "
                f"root://gateway:1094//."
            )

    @property
    def url(self) -> str:
        """The test area: the pool's root on the gateway (no directories in Ceph)."""
        return f"root://127.0.0.1:{self.port}/{AREA}"

    def url_for(self, scheme: str) -> str:
        return self.url

    @property
    def cached_url(self) -> str | None:
        """The same test area read through the XCache door (None: started without)."""
        return self.xcache.url if self.xcache is not None else None

    def driver_options(self) -> dict[str, str]:
        """Directories are name prefixes on this gateway (see ``drivers/flat.py``)."""
        return {**super().driver_options(), "flat_namespace": "true"}

    def describe(self) -> str:
        cache = ", XCache door" if self.with_xcache else ""
        return (f"embedded Ceph {self.ceph_version or '16'} ({self.osds} memstore OSD"
                f"{'s' if self.osds > 1 else ''}) behind an XRootD libXrdCeph gateway{cache}")

    def server_processes(self) -> list[ServerProcess]:
        """The monitor, the OSDs, the gateway and the XCache door."""
        door: list[ServerProcess] = (
            [self.xcache.watched] if self.xcache and self.xcache.watched else [])
        return [*self.daemons, *door]

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each process now (name -> bytes)."""
        sizes = {daemon.name: daemon.rss_bytes() for daemon in self.daemons}
        if self.xcache is not None:
            sizes.update(self.xcache.rss_bytes())
        return sizes

    # -- start ---------------------------------------------------------------------
    def start(self) -> EmbeddedCephGateway:
        began = time.monotonic()
        self.ceph_version = ceph_version()
        self.xrootd_version = xrootd_version()
        # the gateway's xrootd version (what a remote gateway answers) plus Ceph's:
        # "5.5.3+ceph16.2.15" picks thresholds/ceph/embedded.toml ("*+ceph16.*"), a
        # remote gateway's bare "5.5.3" the seed's default.toml
        self.version = f"{self.xrootd_version}+ceph{self.ceph_version}"
        self.directory = server_directory(self.kind)
        try:
            self._start_cluster()
            self.timings["cluster"] = time.monotonic() - began
            self._start_gateway()
            self.timings["gateway"] = time.monotonic() - began
            if self.with_xcache:
                self.xcache = XCacheProxy(origin_port=self.port,
                                          directory=self.directory / "xcache").start()
                self.timings["xcache"] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        return self

    def _fail(self, what: str, daemon: Daemon | None = None, log: Path | None = None
              ) -> EndpointError:
        """Why the start failed, with the daemon's state and both of its logs (its own
        ``<name>.log`` and its console output ``<name>.out``, which holds what it wrote
        before its log was open, e.g. a refused address or keyring): a daemon whose
        console output is empty has more to say in its own log."""
        logs = [log] if log is not None else list(daemon.logs) if daemon is not None else []
        parts = [f"the embedded {self.title} did not start: {what}."]
        if daemon is not None:
            parts.append(f" {daemon.name}: {daemon_state(daemon)}.")
        for path in logs:
            if path.exists():
                parts.append(f"\nLog tail ({path.name}):\n{log_tail(path)}")
            else:
                parts.append(f"\n{path.name}: not written")
        return EndpointError("".join(parts))

    # the cluster ------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        assert self.directory is not None
        return self.directory / "ceph.conf"

    def _ceph_user(self) -> str | None:
        """Ceph's daemons drop root to ``ceph`` when it exists (as its packages do)."""
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam("ceph")
            return "ceph"
        except KeyError:
            return None

    def _write_ceph_conf(self, fsid: str) -> None:
        d = self.directory
        assert d is not None
        self.conf.write_text("\n".join([
            "[global]",
            f"fsid = {fsid}",
            f"mon host = v2:{self.address}:{self.mon_port}/0",
            f"public network = {self.address}/32",
            "auth cluster required = cephx",
            "auth service required = cephx",
            "auth client required = cephx",
            f"keyring = {d}/ceph.client.admin.keyring",
            f"run dir = {d}/run",
            f"admin socket = {d}/run/$name.asok",
            f"log file = {d}/log/$name.log",
            f"pid file = {d}/run/$name.pid",
            f"mon cluster log file = {d}/log/cluster.log",
            "osd pool default size = 1",
            "osd pool default min size = 1",
            f"osd pool default pg num = {self.pg_num}",
            "osd pool default pg autoscale mode = off",
            "mon allow pool size one = true",
            "mon allow pool delete = true",
            "mon warn on pool no redundancy = false",
            "osd crush chooseleaf type = 0",
            "ms bind ipv4 = true",
            "ms bind ipv6 = false",
            # a starved CI box (the tests beside stress-ng) must not make the throwaway
            # cluster abort itself: an OSD whose op thread waits for a CPU longer than
            # 150 s kills itself by default, a monitor whose /tmp fills shuts down
            *STARVATION_SETTINGS,
            "[mon]",
            f"mon data = {d}/mon/$name",
            f"keyring = {d}/mon/keyring",
            "[osd]",
            "osd objectstore = memstore",
            f"memstore device bytes = {MEMSTORE_BYTES}",
            f"osd data = {d}/osd/$id",
            f"keyring = {d}/osd/$id/keyring",
            # a 2-core machine: few threads per OSD
            "osd op num shards = 1",
            "osd op num threads per shard = 2",
            f"[client.{GATEWAY_USER}]",
            f"keyring = {d}/gateway/ceph.client.{GATEWAY_USER}.keyring",
            *self._more_conf(),
            "",
        ]))

    def _more_conf(self) -> list[str]:
        """Further ceph.conf lines of a subclass's daemons (none here)."""
        return []

    def _command(self, args: tuple[str, ...]) -> list[str]:
        """How :meth:`_run` runs a tool (a subclass runs it elsewhere)."""
        return list(args)

    def _run(self, *args: str, input_text: str | None = None) -> str:
        """A Ceph command line tool; its output, or :class:`EndpointError`."""
        try:
            done = subprocess.run(self._command(args), capture_output=True, text=True,
                                  input=input_text, timeout=CEPH_COMMAND_TIMEOUT,
                                  cwd=self.directory)
        except subprocess.TimeoutExpired:
            raise self._fail(f"'{' '.join(args[:4])}' did not answer within "
                             f"{CEPH_COMMAND_TIMEOUT} s") from None
        if done.returncode != 0:
            raise self._fail(f"'{' '.join(args[:6])}' failed: "
                             f"{(done.stderr or done.stdout).strip()[-400:]}")
        return done.stdout

    def ceph(self, *args: str, input_text: str | None = None) -> str:
        """``ceph -c <conf> <args>`` as client.admin."""
        return self._run("ceph", "-c", str(self.conf), "--connect-timeout", "30", *args,
                         input_text=input_text)

    def _start_cluster(self) -> None:
        """The monitor and OSDs, the gateway's pool and its key."""
        d = self.directory
        assert d is not None
        self._start_mon_and_osds()
        self.ceph("osd", "pool", "create", POOL, str(self.pg_num), str(self.pg_num))
        self.ceph("osd", "pool", "application", "enable", POOL, "xrootd")
        keyring = d / "gateway" / f"ceph.client.{GATEWAY_USER}.keyring"
        key = self.ceph("auth", "get-or-create", f"client.{GATEWAY_USER}",
                        "mon", "allow r", "osd", f"allow rwx pool={POOL}")
        # 0600 from its creation (the folder above is made 0755 for the gateway's user,
        # who is given the file): any local user read the key with the umask's 0644
        descriptor = os.open(keyring, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o600)
        with os.fdopen(descriptor, "w") as stream:
            stream.write(key)

    def _start_mon_and_osds(self) -> None:
        """The monitor and the OSDs on :attr:`address`, up and answering."""
        d = self.directory
        assert d is not None
        for sub in ("run", "log", "mon", "osd", "gateway"):
            (d / sub).mkdir(exist_ok=True)
        fsid = str(uuid.uuid4())
        self.mon_port = free_port()
        self._write_ceph_conf(fsid)
        admin = d / "ceph.client.admin.keyring"
        mon_keyring = d / "mon" / "keyring"
        self._run("ceph-authtool", "--create-keyring", str(mon_keyring), "--gen-key",
                  "-n", "mon.", "--cap", "mon", "allow *")
        self._run("ceph-authtool", "--create-keyring", str(admin), "--gen-key",
                  "-n", "client.admin", "--cap", "mon", "allow *", "--cap", "osd", "allow *",
                  "--cap", "mgr", "allow *")
        self._run("ceph-authtool", str(mon_keyring), "--import-keyring", str(admin))
        monmap = d / "monmap"
        self._run("monmaptool", "--create", "--fsid", fsid, "--addv", "a",
                  f"[v2:{self.address}:{self.mon_port}]", str(monmap))
        user = self._ceph_user()
        self._chown(user)
        self._run(*self._as(user), "ceph-mon", "-c", str(self.conf), "--mkfs", "-i", "a",
                  "--monmap", str(monmap), "--keyring", str(mon_keyring))
        self._spawn("mon.a", ["ceph-mon", "-c", str(self.conf), "-i", "a", "-f",
                              *self._setuser(user)])
        self._wait_for(self._mon_answers, "the monitor did not answer", "mon.a")
        for osd in range(self.osds):
            self._add_osd(osd, user)
        self._wait_for(self._osds_up, f"the {self.osds} OSD(s) did not come up",
                       f"osd.{self.osds - 1}")

    def _add_osd(self, osd: int, user: str | None) -> None:
        d = self.directory
        assert d is not None
        data = d / "osd" / str(osd)
        data.mkdir()
        osd_uuid = str(uuid.uuid4())
        secret = self._run("ceph-authtool", "--gen-print-key").strip()
        secret_file = d / "osd" / f"{osd}.json"
        secret_file.write_text(json.dumps({"cephx_secret": secret}))
        self.ceph("osd", "new", osd_uuid, str(osd), "-i", str(secret_file))
        secret_file.unlink()
        self._run("ceph-authtool", "--create-keyring", str(data / "keyring"), "--name",
                  f"osd.{osd}", "--add-key", secret)
        self._chown(user)
        self._run(*self._as(user), "ceph-osd", "-c", str(self.conf), "-i", str(osd), "--mkfs",
                  "--osd-uuid", osd_uuid)
        self._spawn(f"osd.{osd}", ["ceph-osd", "-c", str(self.conf), "-i", str(osd), "-f",
                                   *self._setuser(user)])

    def _mon_answers(self) -> bool:
        try:
            self.ceph("mon", "stat")
        except EndpointError as exc:  # said by the failure if it never answers
            self._probe_error = (str(exc).partition("did not start: ")[2] or str(exc)
                                 ).rstrip(".")
            return False
        return True

    def _osds_up(self) -> bool:
        stat = json.loads(self.ceph("osd", "stat", "--format", "json"))
        stat = stat.get("osdmap", stat)  # older releases nest it
        return int(stat.get("num_up_osds", 0)) >= self.osds

    @staticmethod
    def _setuser(user: str | None) -> list[str]:
        return ["--setuser", user, "--setgroup", user] if user else []

    @staticmethod
    def _as(user: str | None) -> list[str]:
        """Run a one-shot tool as ``user`` (``--mkfs`` writes files the daemon owns)."""
        return ["runuser", "-u", user, "--"] if user else []

    def _chown(self, user: str | None) -> None:
        if not user or self.directory is None:
            return
        entry = pwd.getpwnam(user)
        for path in [self.directory, *self.directory.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _spawn(self, name: str, command: list[str], env: dict[str, str] | None = None) -> Daemon:
        assert self.directory is not None
        log = self.directory / "log" / f"{name}.out"
        try:  # the log folder is writable by the gateway's user: never through a link
            descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                                 0o644)
        except OSError as exc:
            raise EndpointError(f"the embedded Ceph's log {log}: {exc.strerror} (a link "
                                f"put there by someone else is never written through)"
                                ) from None
        with open(descriptor, "ab") as sink:
            process = subprocess.Popen(command, cwd=self.directory, stdout=sink,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       env=env)
        daemon = Daemon(name, process, log)
        self.daemons.append(daemon)
        return daemon

    def _daemon(self, name: str) -> Daemon | None:
        return next((d for d in self.daemons if d.name == name), None)

    def _wait_for(self, ready, what: str, name: str) -> None:
        """Probe ``ready()`` until true; the probes' own duration paces them."""
        deadline = time.monotonic() + self.startup_timeout
        self._probe_error = ""
        probes = 0
        while time.monotonic() < deadline:
            for daemon in self.daemons:
                if not daemon.alive():
                    raise self._fail(f"{daemon.name} exited with code "
                                     f"{daemon.process.returncode}", daemon)
            probes += 1
            if ready():
                return
            daemon = self._daemon(name)
            if daemon is not None:
                try:  # the pause between probes, noticing an early exit
                    daemon.process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
        last = f"; the last of {probes} probes: {self._probe_error}" if self._probe_error else ""
        raise self._fail(f"{what} within {self.startup_timeout:.0f} s{last}",
                         self._daemon(name))

    # the gateway ------------------------------------------------------------------
    def _gateway_config(self) -> Path:
        d = self.directory
        assert d is not None
        config = d / "gateway" / "xrootd.cfg"
        # the gateway's user owns its folder: a link there is replaced, never followed
        write_own_file(config, "\n".join([
            "all.export /",
            "all.export *",  # the pool:name form
            f"xrd.port {self.port}",
            f"all.adminpath {d / 'gateway' / 'admin'}",
            f"all.pidpath {d / 'gateway' / 'run'}",
            f"ofs.osslib {plugin_path('libXrdCeph')} {GATEWAY_USER}@{POOL},1,4194304,4194304",
            f"ofs.xattrlib {plugin_path('libXrdCephXattr')}",
            "xrootd.async off nosf",
            "xrootd.chksum adler32",
            "ceph.nbconnections 1",
            "xrd.sched mint 16 maxt 1024 avlt 64 idle 60",
            "",
        ]))
        return config

    def _start_gateway(self) -> None:
        d = self.directory
        assert d is not None
        for sub in ("admin", "run"):
            (d / "gateway" / sub).mkdir(exist_ok=True)
        user = unprivileged_user()
        if user:  # the gateway reads the conf and its keyring as that user
            entry = pwd.getpwnam(user)
            for path in [d / "gateway", *(d / "gateway").rglob("*")]:
                os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(d, 0o755)
            self.conf.chmod(0o644)
            (d / "log").chmod(0o1777)  # librados' client log (sticky: no one removes
            # or replaces another's file, the daemons' logs written by this process)
        # xrd.port binds every interface: the gateway on loopback only (loopback.c)
        env = preloaded({**os.environ, "CEPH_CONF": str(self.conf)})
        last = ""
        for _ in range(3):  # a port picked free can be taken before xrootd binds it
            self.port = free_port()
            command = [xrootd_binary(), "-c", str(self._gateway_config()),
                       "-l", str(d / "log" / "gateway.log"), *(["-R", user] if user else [])]
            gateway = self._spawn("gateway", command, env)
            last = self._probe_gateway(gateway)
            if not last:
                return
            gateway.stop()
            self.daemons.remove(gateway)
        raise self._fail(f"the XRootD gateway did not answer: {last}", gateway,
                         log=d / "log" / "gateway.log")

    def _probe_gateway(self, gateway: Daemon) -> str:
        """'' once one object was written, stat-ed and read back through the gateway."""
        from ..drivers.registry import driver_spec

        spec = driver_spec(self.url, driver="xrootd", writable_root=AREA)
        path = f"{AREA}/{AREA_MARKER}"
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                gateway.process.wait(timeout=0.2)
                return f"xrootd exited with code {gateway.process.returncode}"
            except subprocess.TimeoutExpired:
                pass
            client = spec.connect("probe", timeout=10)
            try:
                client.put(path, b"ready")
                if client.read(path, 0, 5) == b"ready" and client.stat(path).size == 5:
                    return ""
            except Exception as exc:  # noqa: BLE001 - probe until the deadline
                last = str(exc)
            finally:
                client.close()
        return last

    # -- stop ----------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the door, the gateway, the OSDs and the monitor; remove the directory."""
        if self.xcache is not None:
            self.xcache.stop()
            self.xcache = None
        for daemon in reversed(self.daemons):
            daemon.stop()
        self.daemons = []
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
