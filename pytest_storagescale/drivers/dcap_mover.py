"""libdcap's transfers in processes that listen on loopback only (issue 35).

libdcap (2.47.14, Debian's ``libdcap1``, the library of gfal2's dcap plug-in and of
``dccp``) opens a listening socket for every ``open`` of a file or directory, in
active mode as in passive: ``cache_open()`` (``src/dcap.c``) calls
``get_data_socket()`` for ``DCAP_CMD_OPEN``, ``DCAP_CMD_OPENDIR`` and ``DCAP_CMD_TRUNC``
whatever ``isActive()`` says (``DCACHE_CLIENT_ACTIVE`` only adds ``-passive`` to the
open command), and ``create_data_socket()`` binds it to ``in6addr_any`` (every
interface), ``listen(512)``, once per process, never closed. No setting moves that
address: ``DCACHE_CBPORT`` chooses the port (range), ``DCACHE_REPLY`` the host name the
door is told, nothing the address bound. So a process that moves data through libdcap
listens on ``::`` until it ends.

The gfal2 driver therefore moves dcap data (uploads, copies out, whole and partial
reads) only in a process where every wildcard ``bind()`` becomes a loopback one: the
embedded servers' preload library (``servers/loopback.c``: ``::`` ->
``::ffff:127.0.0.1`` on libdcap's dual-stack socket), named in ``LD_PRELOAD`` of a
*mover*, a child process (``python -m pytest_storagescale.drivers.dcap_mover``) that
runs the same driver class with the same endpoint, options and timeout and takes one
request at a time over a pipe. A driver in a process that already has the library
loaded (a mover) moves the data itself (:func:`contained`). A client holds its movers
for its life (one per request in flight, at most :data:`MAX_MOVERS`); a mover ends when
its client closes, or when its pipe closes (its parent gone). The namespace requests
(stat, mkdir, delete, rmdir) open no file and stay in the client's process.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from .. import errors
from ..errors import StorageError, StorageTimeout

#: the module a mover runs
ENTRY = "pytest_storagescale.drivers.dcap_mover"
#: the most movers (requests in flight) one client holds; more requests wait
MAX_MOVERS = 32
#: seconds a mover may take to start (Python, gfal2 and its plug-ins on a loaded host)
START_TIMEOUT = 120.0
#: a request's answer is awaited its client's timeout this many times, plus
#: :data:`ANSWER_GRACE` (a read of a whole file is many requests of gfal2's), then the
#: mover is killed and the request is a timeout
ANSWER_TIMEOUTS, ANSWER_GRACE = 3, 30.0
#: seconds a closed mover may take to end before it is killed
STOP_WAIT = 5.0
#: the requests a mover serves: the driver's methods of the same names
REQUESTS = ("_upload", "_get", "copy_out", "_read", "_readv")


def contained() -> bool:
    """Whether this process has the loopback-only library loaded (a mover: libdcap's
    listening socket is bound to loopback here)."""
    from ..servers.loopback import library_path

    name = library_path().name
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return any(line.rstrip().endswith("/" + name) for line in maps)
    except OSError:
        return False


class Mover:
    """One mover process and the two ends of its pipes."""

    def __init__(self, driver: Any) -> None:
        from ..servers.loopback import preloaded

        environment = preloaded(dict(os.environ))  # the library first, by its absolute path
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", ENTRY, str(to_child), str(from_child)],
                pass_fds=(to_child, from_child), env=environment,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            os.close(to_child)
            os.close(from_child)
        self._requests = Connection(from_parent, readable=False)
        self._answers = Connection(to_parent, writable=False)
        cls = type(driver)
        self._send(("setup", (cls.__module__, cls.__qualname__, driver.endpoint,
                              driver.client_id, driver.timeout, driver.writable_root,
                              dict(driver.options))))
        kind, value = self._answer(START_TIMEOUT, driver, "login", driver.endpoint.path)
        if kind != "ok" or value is not True:
            self.close()
            raise self._failure(driver, "login", driver.endpoint.path,
                                "the dcap mover did not load the loopback-only library"
                                if kind == "ok" else value)

    def _send(self, message: tuple) -> None:
        self._requests.send(message)

    def _answer(self, seconds: float, driver: Any, operation: str, path: str) -> tuple:
        if not self._answers.poll(seconds):
            self.close()
            raise StorageTimeout(
                f"the dcap mover (pid {self.process.pid}) gave no answer within "
                f"{seconds:.0f} s: killed", driver=driver.name,
                endpoint=driver.endpoint.server, operation=operation, path=path,
                error_class="timeout")
        try:
            return self._answers.recv()
        except (EOFError, OSError):
            code = self.process.poll()
            self.close()
            raise StorageError(
                f"the dcap mover (pid {self.process.pid}) ended without its answer "
                f"(exit status {code}: its client library crashed?)", driver=driver.name,
                endpoint=driver.endpoint.server, operation=operation, path=path,
                error_class="crashed") from None

    @staticmethod
    def _failure(driver: Any, operation: str, path: str, value: Any) -> StorageError:
        """The error the mover sent (its class, message and fields), as raised there."""
        if isinstance(value, str):
            return StorageError(value, driver=driver.name, endpoint=driver.endpoint.server,
                                operation=operation, path=path, error_class="mover")
        name, message, fields = value
        cls = getattr(errors, name, StorageError)
        if not (isinstance(cls, type) and issubclass(cls, StorageError)):
            cls = StorageError
        return cls(message, **fields)

    def call(self, driver: Any, request: str, path: str, *args: Any) -> Any:
        """``driver``'s method ``request`` run in the mover; its answer or its error."""
        self._send((request, (path, *args)))
        seconds = driver.timeout * ANSWER_TIMEOUTS + ANSWER_GRACE
        kind, value = self._answer(seconds, driver, request.lstrip("_"), path)
        if kind == "ok":
            return value
        raise self._failure(driver, request.lstrip("_"), path, value)

    def close(self) -> None:
        """The pipes closed (the mover's end), the process waited for, else killed."""
        for end in (self._requests, self._answers):
            try:
                end.close()
            except OSError:
                pass
        try:
            self.process.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_WAIT)


class Movers:
    """A client's movers: one per request in flight, kept for the next request."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self._idle: list[Mover] = []
        self._all: list[Mover] = []
        self._slots = threading.BoundedSemaphore(MAX_MOVERS)
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        """One mover started now (a load client's, before its step's clock)."""
        with self._lock:
            if self._all:
                return
        mover = Mover(self._driver)
        with self._lock:
            self._all.append(mover)
            self._idle.append(mover)

    def call(self, request: str, path: str, *args: Any) -> Any:
        """``request`` run by an idle mover (a new one when none is idle)."""
        if not self._slots.acquire(timeout=self._driver.timeout * ANSWER_TIMEOUTS
                                   + ANSWER_GRACE):
            raise StorageTimeout(f"no dcap mover free within the deadline ({MAX_MOVERS} "
                                 f"requests in flight through one client)",
                                 driver=self._driver.name,
                                 endpoint=self._driver.endpoint.server,
                                 operation=request.lstrip("_"), path=path,
                                 error_class="timeout")
        try:
            with self._lock:
                mover = self._idle.pop() if self._idle else None
            if mover is None:
                mover = Mover(self._driver)
                with self._lock:
                    self._all.append(mover)
            try:
                answer = mover.call(self._driver, request, path, *args)
            except StorageError as exc:
                if exc.error_class in ("timeout", "crashed") and mover.process.poll() is not None:
                    with self._lock:  # killed or crashed: not used again
                        self._all.remove(mover)
                    raise
                self._release(mover)
                raise
            self._release(mover)
            return answer
        finally:
            self._slots.release()

    def _release(self, mover: Mover) -> None:
        with self._lock:
            if self._closed:
                closing = True
            else:
                closing = False
                self._idle.append(mover)
        if closing:
            mover.close()

    def pids(self) -> list[int]:
        """The movers' process ids (tests watch their sockets)."""
        with self._lock:
            return [mover.process.pid for mover in self._all]

    def close(self) -> None:
        """Every mover stopped."""
        with self._lock:
            self._closed = True
            movers, self._all, self._idle = self._all, [], []
        for mover in movers:
            mover.close()


def _serve(requests: Connection, answers: Connection) -> None:
    """A mover's loop: the driver it is told to build, then one request at a time,
    until its parent closes the pipe."""
    kind, (module, qualname, endpoint, client_id, timeout, root, options) = requests.recv()
    cls = getattr(importlib.import_module(module), qualname)
    driver = cls(endpoint, client_id=client_id, timeout=timeout, writable_root=root,
                 options=options)
    loaded = contained()
    answers.send(("ok", loaded))
    if not loaded:
        return
    while True:
        try:
            request, args = requests.recv()
        except (EOFError, OSError):
            break
        if request not in REQUESTS:
            answers.send(("error", f"not a dcap mover's request: {request!r}"))
            continue
        try:
            answers.send(("ok", getattr(driver, request)(*args)))
        except StorageError as exc:
            fields = dict(driver=exc.driver, endpoint=exc.endpoint, operation=exc.operation,
                          path=exc.path, native_status=exc.native_status,
                          error_class=exc.error_class)
            answers.send(("error", (type(exc).__name__, exc.message, fields)))
        except Exception as exc:  # noqa: BLE001 - said to the client, which raises it
            answers.send(("error", f"the dcap mover failed: {type(exc).__name__}: {exc}"))
    driver.close()


def main(argv: list[str]) -> int:
    """``python -m pytest_storagescale.drivers.dcap_mover FD_IN FD_OUT``."""
    # the parent decides: Ctrl-C at the terminal reaches the whole process group
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    requests = Connection(int(argv[1]), writable=False)
    answers = Connection(int(argv[2]), readable=False)
    began = time.monotonic()
    try:
        _serve(requests, answers)
    except (EOFError, OSError):
        pass
    except Exception as exc:  # noqa: BLE001 - the parent raises it with its request
        try:
            answers.send(("error", f"the dcap mover did not start after "
                                   f"{time.monotonic() - began:.1f} s: "
                                   f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
