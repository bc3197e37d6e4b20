"""The xrootd driver's compiled client loop (``xrdloop.cc``), built once per machine and
called through :mod:`ctypes`.

A request made through the XRootD Python bindings costs more client CPU than the
request itself (docs/benchmarks.md): the call, the answer's Python objects and a GIL
hand-over per answer. On a small client host that CPU is taken from the server, and
with thousands of clients the threads convoy on the GIL. The compiled loop makes a
client's requests back to back in C++ with the GIL released (ctypes releases it
for the call) and gives back, per request, its end, latency, bytes and status; the
engine records them as it records a request made from Python (``load/clients.py``).

The library is compiled with ``g++`` against Debian's ``libxrootd-client-dev`` the
first time a step asks for it (``make setup`` does it beforehand), into
``$XDG_CACHE_HOME/pytest-storagescale/`` (default ``~/.cache``), named by a hash of
the source, the flags and the installed ``libXrdCl``, so that an upgrade of either
builds it again. It links the same ``libXrdCl`` as the Python bindings, so the
client's settings (timeouts, retries) and credentials are the same.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

SOURCE = Path(__file__).with_name("xrdloop.cc")
HEADER = Path("/usr/include/xrootd/XrdCl/XrdClFileSystem.hh")
FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-I/usr/include/xrootd")
LIBRARIES = ("-lXrdCl",)
#: the XRootD client library the loop links (its version names the build)
XRDCL = "libXrdCl.so.3"
#: the most one build may take (a loaded 2-core machine: a few seconds)
BUILD_TIMEOUT = 300.0
#: request kinds the loop knows
KINDS = {"stat": 0, "get": 1}
_MESSAGE_SIZE = 1024

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_unavailable: str | None = None


class Unavailable(RuntimeError):
    """The compiled loop cannot be built or loaded here (the reason says why)."""


class Outcome(NamedTuple):
    """One request of the compiled loop: its end (``time.perf_counter`` seconds),
    latency, bytes, and the XRootD status (``code`` 0: success)."""

    finished: float
    latency: float
    moved: int
    code: int
    errno: int
    #: XRootDStatus.status: 1 error, 3 fatal
    level: int


class Taken(NamedTuple):
    """Finished requests of a background loop: ends, latencies, request numbers,
    codes (0: success), and for the failures their errno, level and their one text
    (the failures of one take share it)."""

    finished: list[float]
    latency: list[float]
    index: list[int]  # type: ignore[assignment]  # shadows tuple.index, never called
    code: list[int]
    errno: list[int]
    level: list[int]
    message: str


_NOTHING = Taken([], [], [], [], [], [], "")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-storagescale"


def _xrdcl_path() -> str:
    for folder in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                   "/usr/lib", "/lib"):
        candidate = os.path.join(folder, XRDCL)
        if os.path.exists(candidate):
            return os.path.realpath(candidate)
    return XRDCL


def library_path() -> Path:
    """Where this source, these flags and this ``libXrdCl`` are (or will be) built."""
    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update(" ".join(FLAGS + LIBRARIES).encode())
    digest.update(_xrdcl_path().encode())
    return cache_dir() / f"xrdloop-{digest.hexdigest()[:16]}.so"


def missing() -> str | None:
    """Why the loop cannot be built here (None: it is built, or can be)."""
    if _unavailable is not None:
        return _unavailable
    if library_path().exists():
        return None
    lacking = _lacking()
    return f"no {lacking}" if lacking else None


def _lacking() -> str | None:
    """What the build needs and this machine has not (None: nothing)."""
    if shutil.which("g++") is None:
        return "g++"
    return None if HEADER.exists() else f"the XrdCl headers ({HEADER})"


def build() -> Path:
    """The built library, compiled now if it is not there yet
    (:class:`Unavailable` naming what is missing)."""
    target = library_path()
    if target.exists():
        return target
    if lacking := _lacking():
        raise Unavailable(
            f"the compiled client loop needs {lacking}: apt-get install g++ "
            f"libxrootd-client-dev (make setup installs both)")
    target.parent.mkdir(parents=True, exist_ok=True)
    # compiled beside the target and renamed: a concurrent build never loads half a file
    fd, partial = tempfile.mkstemp(prefix=".xrdloop-", suffix=".so", dir=target.parent)
    os.close(fd)
    os.chmod(partial, 0o755)  # mkstemp's 0600: the linker may keep it
    try:
        done = subprocess.run(["g++", *FLAGS, str(SOURCE), "-o", partial, *LIBRARIES],
                              capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        if done.returncode != 0:
            raise Unavailable(f"the compiled client loop did not build: "
                              f"{done.stderr.strip()[-600:]}")
        os.replace(partial, target)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"the compiled client loop took over {BUILD_TIMEOUT:.0f} s to "
                          f"build") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def load(*, build_it: bool = True) -> ctypes.CDLL:
    """The loaded library (built first when ``build_it`` and not there yet), once per
    process; :class:`Unavailable` when it cannot be (remembered)."""
    global _library, _unavailable
    with _lock:
        if _library is not None:
            return _library
        if _unavailable is not None:
            raise Unavailable(_unavailable)
        try:
            path = build() if build_it else library_path()
        except (Unavailable, OSError) as exc:
            _unavailable = str(exc)  # a build that failed: not tried again in this process
            raise Unavailable(_unavailable) from None
        if not path.exists():  # not built yet: a later load may build it
            raise Unavailable("the compiled client loop is not built (make setup)")
        try:
            _library = _declare(ctypes.CDLL(str(path)))
        except (Unavailable, OSError) as exc:
            _unavailable = str(exc)
            raise Unavailable(_unavailable) from None
        return _library


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    double_p, int_p = ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int)
    lib.ss_client_new.argtypes, lib.ss_client_new.restype = [ctypes.c_char_p], ctypes.c_void_p
    lib.ss_client_free.argtypes, lib.ss_client_free.restype = [ctypes.c_void_p], None
    lib.ss_client_add_path.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ss_client_add_path.restype = None
    lib.ss_run.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_int,
        ctypes.c_double, ctypes.c_uint16, int_p, double_p, double_p,
        ctypes.POINTER(ctypes.c_longlong), int_p, int_p, int_p, ctypes.c_char_p, ctypes.c_int]
    lib.ss_run.restype = ctypes.c_int
    lib.ss_start.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong,
                             ctypes.c_uint16, ctypes.c_double]
    lib.ss_start.restype = ctypes.c_int
    lib.ss_take.argtypes = [ctypes.c_void_p, ctypes.c_int, double_p, double_p,
                            ctypes.POINTER(ctypes.c_longlong), int_p, int_p, int_p,
                            ctypes.c_char_p, ctypes.c_int]
    lib.ss_take.restype = ctypes.c_int
    lib.ss_halt.argtypes, lib.ss_halt.restype = [ctypes.c_void_p], None
    lib.ss_backlog.argtypes, lib.ss_backlog.restype = [], ctypes.c_int
    lib.ss_redirects.argtypes = [ctypes.c_void_p]
    lib.ss_redirects.restype = ctypes.c_longlong
    for name in ("ss_since_address", "ss_pending_address"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
        getattr(lib, name).restype = ctypes.c_void_p
    lib.ss_abandon.argtypes = [ctypes.c_void_p, ctypes.c_double]
    lib.ss_abandon.restype = ctypes.c_int
    lib.ss_wait_idle.argtypes = [ctypes.c_void_p, ctypes.c_double]
    lib.ss_wait_idle.restype = ctypes.c_int
    return lib


def backlog() -> int:
    """The most finished requests a background loop keeps until they are taken: a
    loop that has this many pauses (as at a refused request), so that answers faster
    than the engine drains them never grow the memory."""
    return load(build_it=False).ss_backlog()


class CompiledClient:
    """One client of the compiled loop: its own ``XrdCl::FileSystem`` for ``server``
    (``root://<login>@host:port``, so its own connection), walking ``paths``."""

    def __init__(self, server: str, kind: str, paths: Sequence[str]) -> None:
        self._lib = load(build_it=False)
        self._kind = KINDS[kind]
        self._handle = self._lib.ss_client_new(server.encode())
        for path in paths:
            self._lib.ss_client_add_path(self._handle, path.encode())
        self._size = 0  # of the per-request arrays below, grown to the count asked
        self._redirects = 0  # what the freed client had followed
        #: set from any thread (:meth:`halt`): the loop begins no further request
        self._stop = ctypes.c_int(0)
        self._message = ctypes.create_string_buffer(_MESSAGE_SIZE)
        self._guard = threading.Lock()
        # the background loop's request in flight and finished count, read in place
        # (the coordinator looks at every client ten times a second: no call for that)
        self._since = ctypes.c_double.from_address(self._lib.ss_since_address(self._handle))
        self._pending = ctypes.c_int.from_address(self._lib.ss_pending_address(self._handle))

    def _hold(self, count: int) -> None:
        if count > self._size:
            self._size = count
            self._finished = (ctypes.c_double * count)()
            self._latency = (ctypes.c_double * count)()
            self._moved = (ctypes.c_longlong * count)()
            self._code = (ctypes.c_int * count)()
            self._errno = (ctypes.c_int * count)()
            self._level = (ctypes.c_int * count)()
            self._index = (ctypes.c_longlong * count)()

    def run(self, first: int, step: int, count: int, until: float, timeout: int
            ) -> tuple[int, str]:
        """Up to ``count`` requests, request i on path ``first + i * step``; none begun
        after ``until`` (perf_counter) but the first, none after a failure. How many
        were made (their outcomes: :meth:`columns`, :meth:`outcome`), and the failure's
        text."""
        self._hold(count)
        done = self._lib.ss_run(
            self._handle, self._kind, first, step, count, until, timeout,
            ctypes.byref(self._stop), self._finished, self._latency, self._moved, self._code,
            self._errno, self._level, self._message, _MESSAGE_SIZE)
        return done, self._message.value.decode(errors="replace") if done else ""

    def columns(self, done: int) -> tuple[list[float], list[float], list[int], list[int]]:
        """The last call's ``done`` ends, latencies, bytes and codes, as lists (one C
        slice each: the load loop makes no Python object per request it need not)."""
        return (self._finished[:done], self._latency[:done], self._moved[:done],
                self._code[:done])

    def outcome(self, index: int) -> Outcome:
        """Request ``index`` of the last call."""
        return Outcome(self._finished[index], self._latency[index], self._moved[index],
                       self._code[index], self._errno[index], self._level[index])

    # -- the background loop (stat): XrdCl's threads issue each request when the last
    # one ended; the engine drains them (take), watches the one in flight for hangs
    # (busy_since, abandon) and waits for it after the stop (wait_idle). The handle is
    # freed by close() in another thread than the coordinator's: hence the lock.
    def start(self, first: int, step: int, timeout: int, until: float = 0.0) -> bool:
        """Begin the background loop: request i on path ``first + i * step``, none begun
        after ``until`` (perf_counter; 0: no end) (called, like :meth:`wait_idle` and
        :meth:`close`, by the client's own thread). False when it runs already, or was
        halted or given up."""
        done = (self._lib.ss_start(self._handle, first, step, timeout, until)
                if self._handle else 1)
        if done < 0:
            raise Unavailable("the compiled client loop has no paths to make requests of")
        return done == 0

    def take(self, count: int) -> Taken:
        """Up to ``count`` finished requests of the background loop, their failures
        of one text (a failure of another text waits for the next take); copied under
        the lock (the coordinator and the client's thread may both take)."""
        with self._guard:
            if not self._handle or not self._pending.value:
                return _NOTHING
            self._hold(count)
            done = self._lib.ss_take(self._handle, count, self._finished, self._latency,
                                     self._index, self._code, self._errno, self._level,
                                     self._message, _MESSAGE_SIZE)
            if not done:
                return _NOTHING
            codes = self._code[:done]
            if not any(codes):
                return Taken(self._finished[:done], self._latency[:done], self._index[:done],
                             codes, [], [], "")
            return Taken(self._finished[:done], self._latency[:done], self._index[:done],
                         codes, self._errno[:done], self._level[:done],
                         self._message.value.decode(errors="replace"))

    def pending(self) -> int:
        """How many finished requests of the background loop wait to be taken."""
        with self._guard:
            return self._pending.value if self._handle else 0

    def busy_since(self) -> float | None:
        """When the background request in flight began (perf_counter), or None."""
        with self._guard:
            since = self._since.value if self._handle else 0.0
        return since or None

    def abandon(self, since: float) -> bool:
        """Give up the request that began at ``since`` (a hang): not measured, none
        after it. False if it has ended meanwhile."""
        with self._guard:
            return bool(self._handle) and bool(self._lib.ss_abandon(self._handle, since))

    def wait_idle(self, seconds: float) -> bool:
        """At most ``seconds`` until the background loop has ended (halted and its
        last request finished, or given up); the GIL is released meanwhile."""
        handle = self._handle  # close() happens in this same thread, afterwards
        return not handle or bool(self._lib.ss_wait_idle(handle, seconds))

    def redirects(self) -> int:
        """The redirects this client's requests have followed so far (the hosts each
        request went through past the first: XrdCl's host list)."""
        with self._guard:
            if self._handle:
                self._redirects = self._lib.ss_redirects(self._handle)
            return self._redirects

    def halt(self) -> None:
        """Begin no further request, from now on (a call running ends after the request
        in flight)."""
        self._stop.value = 1
        with self._guard:
            if self._handle:
                self._lib.ss_halt(self._handle)

    def close(self) -> None:
        """Free the client (one with a request still in flight is left to XrdCl)."""
        with self._guard:
            if self._handle:
                self._redirects = self._lib.ss_redirects(self._handle)
                self._lib.ss_client_free(self._handle)
                self._handle = None

