"""The embedded XCache: XRootD's proxy file cache in front of an origin server.

An ``xrootd`` with ``ofs.osslib libXrdPss.so`` (the proxy) and ``pss.cachelib
libXrdPfc.so`` (the file cache, blocks kept under ``oss.localroot``), from the
``xrootd-server-plugins`` package. Reads are served from the cache once their blocks
are in it; stat and ls go through to the origin; writes are refused (XRootD 5.5's
file cache is read-only), so files are written to the origin and read through the
door, as RAL's worker nodes do. Seed 002 compares RAL's gateways with and without it.

- :class:`XCacheProxy`: the caching door alone, in front of any origin port (the
  Ceph gateway starts one: ``EmbeddedCephGateway.cached_url``);
- :class:`EmbeddedXCache` (``--storage-embedded xcache``): an origin embedded xrootd
  it starts itself, and the door in front of it. Its test area URL is the origin's
  (the run directory must be writable); :attr:`EmbeddedXCache.cached_url` is the
  same area through the door, which the ceph suite's ``*_xcache`` steps read.

:func:`xrootd_ops` reads a server's request counters (``query stats``), which is how
a test sees that a second read did not reach the origin.
"""

from __future__ import annotations

import ctypes.util
import os
import pwd
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import EndpointError
from .family import EmbeddedServer
from .loopback import preloaded
from .orphans import server_directory
from .processes import ServerProcess, free_port, log_tail, unprivileged_user
from .xrootd import AREA, EmbeddedXRootD, xrootd_binary
from .xrootd_releases import write_own_file

#: memory the cache keeps blocks in while they are written to its disk
CACHE_RAM = "1g"  # the least pfc accepts; a limit, not an allocation
#: the cache's block: a read fetches the blocks it touches from the origin
CACHE_BLOCK = "1M"
#: the counters of ``query stats`` (``<stats id="xrootd"><ops>``) the tests read
OPS = ("open", "rd", "rv", "wr")


def plugin_library(name: str) -> str | None:
    """The path (or soname) of an XRootD plug-in library, None when not installed."""
    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib",
                   "/usr/lib/aarch64-linux-gnu"):
        for candidate in (f"{folder}/{name}-5.so", f"{folder}/{name}.so"):
            if os.path.exists(candidate):
                return candidate
    return ctypes.util.find_library(name.removeprefix("lib") + "-5")


def plugin_path(name: str) -> str:
    """The name a directive gives (xrootd adds its version, ``-5``, and searches)."""
    return f"{name}.so"


def xrootd_ops(server: str | int, timeout: int = 10) -> dict[str, int]:
    """The request counters of the xrootd at ``server`` (``host:port``, or a port on
    127.0.0.1): reads ``rd``, vector reads ``rv``, opens, writes (``query stats``)."""
    import xml.etree.ElementTree as ElementTree

    from XRootD import client
    from XRootD.client.flags import QueryCode

    server = f"127.0.0.1:{server}" if isinstance(server, int) else server
    status, answer = client.FileSystem(f"root://ssstats@{server}").query(
        QueryCode.STATS, "a", timeout=timeout)
    if not status.ok:
        raise EndpointError(f"query stats on {server} failed: {status.message.strip()}")
    tree = ElementTree.fromstring(answer.decode().strip("\x00\n "))
    ops = tree.find("./stats[@id='xrootd']/ops")
    if ops is None:
        raise EndpointError(f"query stats on {server}: no xrootd request counters")
    return {name: int(ops.findtext(name) or 0) for name in OPS}


@dataclass(frozen=True)
class CacheAccess:
    """What the cache's own records (``.cinfo``, read with ``xrdpfc_print``) say about
    every access to its files so far: bytes served from its disk, fetched from the
    origin, passed by."""

    accesses: int
    hit_bytes: int
    miss_bytes: int
    bypass_bytes: int

    @property
    def hit_ratio(self) -> float:
        served = self.hit_bytes + self.miss_bytes + self.bypass_bytes
        return self.hit_bytes / served if served else 0.0


def cache_access(cinfo_files: list[Path]) -> CacheAccess:
    """Sum the access records of ``cinfo_files`` (``xrdpfc_print -v``: one row per
    open of the file, B_hit/B_miss/B_bypass in kB)."""
    accesses = hit = miss = bypass = 0
    for cinfo in cinfo_files:
        done = subprocess.run(["xrdpfc_print", "-v", str(cinfo)], capture_output=True,
                              text=True, timeout=30)
        rows = done.stdout.split("Access records", 1)[-1].splitlines()[2:]
        for row in rows:
            fields = row.split()
            if len(fields) >= 9 and fields[0].isdigit():
                accesses += 1
                hit, miss, bypass = (hit + int(fields[-3]), miss + int(fields[-2]),
                                     bypass + int(fields[-1]))
    return CacheAccess(accesses, hit * 1024, miss * 1024, bypass * 1024)


#: what the caching door writes: the only folders its user owns when the session is root
SERVER_WRITES = ("admin", "run", "cache", "log")


class XCacheProxy:
    """One caching door (``pss`` + ``pfc``) on a free port in ``directory``, in front
    of the xrootd on ``127.0.0.1:origin_port``."""

    def __init__(self, *, origin_port: int, directory: Path, startup_timeout: float = 60.0
                 ) -> None:
        self.origin_port = origin_port
        self.directory = directory
        self.startup_timeout = startup_timeout
        self.port = 0
        self.process: subprocess.Popen | None = None
        #: the door's process, watched for a death mid-run
        self.watched: ServerProcess | None = None

    @property
    def url(self) -> str:
        """The test area through the cache (the origin's namespace, unchanged)."""
        return f"root://127.0.0.1:{self.port}/{AREA}"

    @property
    def cache_root(self) -> Path:
        """Where the cache keeps its blocks (``<path>`` data, ``<path>.cinfo`` state)."""
        return self.directory / "cache"

    @property
    def log_path(self) -> Path:
        return self.directory / "log" / "xcache.log"

    def cached_bytes(self) -> int:
        """Bytes of file data on the cache's disk now (without its ``.cinfo`` files)."""
        total = 0
        for path in self.cache_root.rglob("*"):
            if path.is_file() and not path.name.endswith(".cinfo"):
                total += path.stat().st_blocks * 512
        return total

    def cached_files(self) -> list[str]:
        """The origin paths the cache holds blocks of."""
        return sorted("/" + str(path.relative_to(self.cache_root)).removesuffix(".cinfo")
                      for path in self.cache_root.rglob("*.cinfo"))

    def access(self) -> CacheAccess:
        """Hits and misses of every access so far (recorded when a file is closed)."""
        return cache_access(sorted(self.cache_root.rglob("*.cinfo")))

    def ops(self) -> dict[str, int]:
        """This door's request counters (see :func:`xrootd_ops`)."""
        return xrootd_ops(self.port)

    def rss_bytes(self) -> dict[str, int]:
        if self.process is None or self.process.poll() is not None:
            return {}
        try:
            pages = int(Path(f"/proc/{self.process.pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            return {}
        return {"xcache": pages * os.sysconf("SC_PAGE_SIZE")}

    def _config(self) -> Path:
        d = self.directory
        config = d / "xcache.cfg"  # root's folder: a link there is replaced, not followed
        write_own_file(config, "\n".join([
            # read-only: XRootD 5.5's pfc refuses writes (write-through came in 5.8)
            "all.export /",
            f"xrd.port {self.port}",
            f"all.adminpath {d / 'admin'}",
            f"all.pidpath {d / 'run'}",
            f"ofs.osslib {plugin_path('libXrdPss')}",
            f"pss.cachelib {plugin_path('libXrdPfc')}",
            f"pss.origin 127.0.0.1:{self.origin_port}",
            f"oss.localroot {self.cache_root}",
            f"pfc.ram {CACHE_RAM}",
            f"pfc.blocksize {CACHE_BLOCK}",
            "pfc.prefetch 0",  # only the blocks read are fetched: what a test can count
            "pfc.diskusage 0.90 0.95",
            "xrd.sched mint 16 maxt 1024 avlt 64 idle 60",
            "",
        ]))
        return config

    def start(self) -> XCacheProxy:
        # xrootd starts as root and reads its configuration before it drops: the folder
        # and the configuration stay root's, its user owns only what it writes
        for sub in SERVER_WRITES:
            (self.directory / sub).mkdir(parents=True, exist_ok=True)
        user = unprivileged_user()
        if user:
            entry = pwd.getpwnam(user)
            os.chown(self.directory, -1, entry.pw_gid)
            self.directory.chmod(0o750)
            for sub in SERVER_WRITES:
                for path in [self.directory / sub, *(self.directory / sub).rglob("*")]:
                    os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
        last = ""
        for _ in range(3):  # a port picked free can be taken before xrootd binds it
            self.port = free_port()
            command = [xrootd_binary(), "-c", str(self._config()), "-l", str(self.log_path),
                       *(["-R", user] if user else [])]
            self.process = subprocess.Popen(
                command, cwd=self.directory / "run", stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT, start_new_session=True,
                env=preloaded(dict(os.environ)))  # on loopback only (loopback.c)
            self.watched = ServerProcess("xcache", self.process, (self.log_path,))
            last = self._wait_ready()
            if not last:
                return self
            self._terminate()
        raise EndpointError(f"the embedded XCache did not start: {last}. Log tail:\n"
                            f"{log_tail(self.log_path)}")

    def _wait_ready(self) -> str:
        """'' once the door answers a stat of the test area (asked of the origin)."""
        from ..drivers.registry import driver_spec

        assert self.process is not None
        spec = driver_spec(self.url, driver="xrootd")
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:  # the pause between probes, noticing an early exit
                code = self.process.wait(timeout=0.1)
                return f"xrootd exited with code {code}"
            except subprocess.TimeoutExpired:
                pass
            probe = spec.connect("probe", timeout=5)
            try:
                probe.version()
                return ""
            except Exception as exc:  # noqa: BLE001 - probe until the deadline
                last = str(exc)
            finally:
                probe.close()
        return last

    def _terminate(self) -> None:
        if self.watched is not None:
            self.watched.stopping()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """Stop the door (its directory is the caller's)."""
        self._terminate()
        self.process = None
        self.watched = None


class EmbeddedXCache(EmbeddedServer):
    """An XCache door in front of an origin embedded xrootd (root:// only).

    :attr:`url` is the test area on the origin (writable); :attr:`cached_url` the same
    area read through the door."""

    kind = "xcache"
    summary = "an XRootD proxy cache in front of xrootd"
    schemes = ("root",)
    packages = ("xrootd-server", "xrootd-server-plugins")
    binaries = ("xrootd",)

    def __init__(self, *, login: str = "unix", startup_timeout: float = 60.0) -> None:
        super().__init__(login=login)
        self.startup_timeout = startup_timeout
        self.directory: Path | None = None
        self.origin: EmbeddedXRootD | None = None
        self.proxy: XCacheProxy | None = None

    @classmethod
    def check_installed(cls) -> None:
        super().check_installed()
        missing = [name for name in ("libXrdPss", "libXrdPfc") if plugin_library(name) is None]
        if missing:
            raise EndpointError(
                f"the embedded xcache endpoint needs the XRootD plug-in libraries "
                f"{', '.join(missing)}, not installed. Install them: 'sudo apt-get install "
                f"{' '.join(cls.packages)}' (or run 'make setup' in the pytest-storagescale "
                f"checkout); or point the suite at a running XCache with --storage-endpoint.")

    @property
    def url(self) -> str:
        """The test area on the origin."""
        assert self.origin is not None, "url of an XCache that is not running"
        return self.origin.url

    @property
    def cached_url(self) -> str:
        """The test area read through the cache."""
        assert self.proxy is not None, "cached_url of an XCache that is not running"
        return self.proxy.url

    def url_for(self, scheme: str) -> str:
        return self.url

    def describe(self) -> str:
        return f"embedded XCache (pss + pfc) in front of an embedded xrootd ({self.login} login)"

    def server_processes(self) -> list[ServerProcess]:
        """The caching door (the origin xrootd says its own note)."""
        return [self.proxy.watched] if self.proxy and self.proxy.watched else []

    def exit_note(self) -> str:
        """The door's death and the origin's, each said as its own server says it."""
        origin = self.origin.exit_note() if self.origin is not None else ""
        return "\n".join(note for note in (super().exit_note(), origin) if note)

    def start(self) -> EmbeddedXCache:
        self.directory = server_directory(self.kind)
        try:
            self.origin = EmbeddedXRootD(https=False,
                                         startup_timeout=self.startup_timeout).start()
            self.version = self.origin.version
            self.proxy = XCacheProxy(origin_port=self.origin.port, directory=self.directory,
                                     startup_timeout=self.startup_timeout).start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        if self.origin is not None:
            self.origin.stop()
            self.origin = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
