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
``::ffff:127.0.0.1`` on libdcap's dual-stack socket), named in ``LD_PRELOAD``. Such a
process is a *mover*: it runs the same driver class with the same endpoint, options
and timeout and takes one request at a time over a pipe. A driver in a process that
already has the library loaded (a mover) moves the data itself (:func:`contained`). A
client holds its movers for its life (one per request in flight, at most
:data:`MAX_MOVERS`); a mover ends when its client closes, or when its pipe closes (its
parent gone). The namespace requests (stat, mkdir, delete, rmdir) open no file and stay
in the client's process, unless the client's GSI credentials are not the first its
process presented to a dcap door (libdcap's GSI tunnel keeps those: gfal2.py
``_DCAP_FIRST_CREDENTIALS``); then its movers serve them too.

A mover is forked, not started. A new interpreter that imports gfal2, this package and
the driver costs about 0.2 s of CPU (0.17 s user here), and a client's first mover
starts at its login: at 50 clients on the 2-core host at load 14-25, 47 logins were
still starting their movers when the step's ``hang_timeout`` (60 s) was over, and the
step counted 47 hung clients while 3 made all 450 reads (suites/dcache,
``test_transaction_rate_vs_users[c50-dcap]`` on 11.2.5: hung 47 from the clock's first
second, clients in flight 49 falling to 3 as the late logins ended, none failed; no
request of the door or the pool hung). So each client process has one *factory* per
driver module while it has dcap clients (:class:`Factory`, ``python -m
pytest_storagescale.drivers.dcap_mover --factory``, the library preloaded): it imports
what the driver's module imports (not that module: its import starts Globus's threads),
stays single-threaded, and forks a mover for each one asked for, which then imports
the driver's module and makes its driver (about 0.02 s of CPU). A forked mover is the
factory's child: its client watches and kills it through a pidfd
(:class:`ForkedProcess`).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from types import ModuleType
from typing import Any, NoReturn

from .. import errors
from ..errors import StorageError, StorageTimeout

#: the module a factory runs
ENTRY = "pytest_storagescale.drivers.dcap_mover"
#: the most movers (requests in flight) one client holds; more requests wait
MAX_MOVERS = 32
#: seconds a factory may take to start (Python, gfal2 and its plug-ins on a loaded
#: host), and a mover to be forked and make its driver
START_TIMEOUT = 120.0
#: a request's answer is awaited its client's timeout this many times, plus
#: :data:`ANSWER_GRACE` (a read of a whole file is many requests of gfal2's), then the
#: mover is killed and the request is a timeout
ANSWER_TIMEOUTS, ANSWER_GRACE = 3, 30.0
#: seconds a closed mover or factory may take to end before it is killed
STOP_WAIT = 5.0
#: the requests a mover serves: the driver's methods of the same names
REQUESTS = ("_upload", "_get", "copy_out", "_read", "_readv")
#: the namespace's requests, served by a mover for a client whose GSI credentials are
#: not its process's first (gfal2.py ``_DCAP_FIRST_CREDENTIALS``)
NAMESPACE_REQUESTS = ("_stat", "_mkdir", "_mkdir_exclusive", "_delete", "_rmdir", "_rename")
#: the most bytes of one message to or from a factory (a request holds the client
#: process's environment)
FACTORY_MESSAGE = 1 << 20


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


def threads() -> int:
    """This process's threads (the kernel's count; 0 when it cannot be read)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def imports_of(module_name: str) -> list[str]:
    """The modules a driver's module imported (those of its globals), itself not: what
    a factory imports before it forks."""
    module = sys.modules[module_name]
    names = set()
    for value in vars(module).values():
        name = (value.__name__ if isinstance(value, ModuleType)
                else getattr(value, "__module__", None))
        if isinstance(name, str) and name in sys.modules and name not in (
                module_name, "__main__", "builtins"):
            names.add(name)
    return sorted(names)


class ForkedProcess:
    """A mover forked by a factory (its child, not this process's), watched and killed
    through a pidfd: no reused process id can name another process. Its exit status
    is its parent's, not known here."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self._lock = threading.Lock()

    def ended(self, timeout: float = 0.0) -> bool:
        """Whether it has ended (waiting up to ``timeout`` seconds)."""
        with self._lock:
            if self._pidfd < 0:
                return True
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout * 1000))))

    def kill(self) -> None:
        with self._lock:
            if self._pidfd >= 0:
                try:
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def release(self) -> None:
        """Its pidfd closed (once it ended)."""
        with self._lock:
            pidfd, self._pidfd = self._pidfd, -1
        if pidfd >= 0:
            os.close(pidfd)


class Factory:
    """A client process's factory of movers for one driver module: a process started
    with the loopback-only library preloaded that imports the module's imports and
    forks a mover for each :meth:`spawn`."""

    def __init__(self, driver: Any) -> None:
        from ..servers.loopback import preloaded

        self.module = type(driver).__module__
        self.imports = imports_of(self.module)
        #: the clients' movers that use it (:func:`_factory_for`, :func:`_release`)
        self.users = 0
        self.broken: str | None = None
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", ENTRY, "--factory", str(theirs.fileno()),
                 *self.imports],
                pass_fds=(theirs.fileno(),), env=preloaded(dict(os.environ)),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._socket = ours
        ours.settimeout(START_TIMEOUT)
        try:
            ready = self._receive(driver, "login", driver.endpoint.path)[0]
        except StorageError:
            self.close()
            raise
        why = None
        if "error" in ready:
            why = ready["error"]
        elif not ready.get("loaded"):
            why = "the dcap mover factory did not load the loopback-only library"
        elif ready.get("threads") != 1:
            why = (f"the dcap mover factory (pid {self.process.pid}) runs "
                   f"{ready.get('threads')} threads after importing {', '.join(self.imports)}: "
                   f"a process forked from it would lack them (not forked)")
        if why is not None:
            self.close()
            raise StorageError(why, driver=driver.name, endpoint=driver.endpoint.server,
                               operation="login", path=driver.endpoint.path,
                               error_class="mover")

    def _receive(self, driver: Any, operation: str, path: str) -> tuple[dict, list[int]]:
        """The factory's next message and the descriptors it sent (an error when it
        gave none in time or ended: the factory is then broken)."""
        try:
            message, fds, _, _ = socket.recv_fds(self._socket, FACTORY_MESSAGE, 1)
        except TimeoutError:
            self.broken = f"gave no answer within {START_TIMEOUT:.0f} s"
            raise StorageTimeout(
                f"the dcap mover factory (pid {self.process.pid}) {self.broken}",
                driver=driver.name, endpoint=driver.endpoint.server, operation=operation,
                path=path, error_class="timeout") from None
        except OSError as exc:
            message, fds = b"", []
            self.broken = f"failed: {exc}"
        if not message:
            for fd in fds:
                os.close(fd)
            self.broken = self.broken or (f"ended (exit status {self.process.poll()})")
            raise StorageError(f"the dcap mover factory (pid {self.process.pid}) "
                               f"{self.broken}", driver=driver.name,
                               endpoint=driver.endpoint.server, operation=operation,
                               path=path, error_class="crashed")
        return json.loads(message), fds

    def spawn(self, driver: Any) -> tuple[ForkedProcess, Connection, Connection]:
        """A new mover: its process, and the ends of its pipes (requests, answers)."""
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        try:
            folder = os.getcwd()
        except OSError:  # removed: the mover's paths are absolute
            folder = "/"
        request = json.dumps({"environment": dict(os.environ), "cwd": folder})
        path = driver.endpoint.path
        try:
            with self._lock:
                if self.broken:
                    raise StorageError(f"the dcap mover factory (pid {self.process.pid}) "
                                       f"{self.broken}", driver=driver.name,
                                       endpoint=driver.endpoint.server, operation="login",
                                       path=path, error_class="crashed")
                try:
                    socket.send_fds(self._socket, [request.encode()], [to_child, from_child])
                except OSError as exc:
                    self.broken = f"could not be asked for a mover: {exc}"
                    raise StorageError(f"the dcap mover factory (pid {self.process.pid}) "
                                       f"{self.broken}", driver=driver.name,
                                       endpoint=driver.endpoint.server, operation="login",
                                       path=path, error_class="crashed") from None
                answer, fds = self._receive(driver, "login", path)
        except BaseException:
            os.close(from_parent)
            os.close(to_parent)
            raise
        finally:
            os.close(to_child)
            os.close(from_child)
        if "pid" not in answer or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            os.close(from_parent)
            os.close(to_parent)
            raise StorageError(f"the dcap mover factory (pid {self.process.pid}) forked "
                               f"no mover: {answer.get('error', answer)}", driver=driver.name,
                               endpoint=driver.endpoint.server, operation="login", path=path,
                               error_class="mover")
        os.set_inheritable(fds[0], False)  # received as inheritable (SCM_RIGHTS)
        return (ForkedProcess(int(answer["pid"]), fds[0]),
                Connection(from_parent, readable=False), Connection(to_parent, writable=False))

    def close(self) -> None:
        """Its socket closed (the factory ends), the process waited for, else killed.
        Its movers go on until their clients close them."""
        self.broken = self.broken or "closed"
        try:
            self._socket.close()
        except OSError:
            pass
        try:
            self.process.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_WAIT)


#: this process's factories, by (process id, driver module): a forked client process
#: starts its own
_FACTORIES: dict[tuple[int, str], Factory] = {}
#: a factory that did not start, by the same key: when, and why (not tried again for
#: :data:`START_TIMEOUT`: 50 clients logging in would otherwise wait for 50 starts)
_FAILED: dict[tuple[int, str], tuple[float, StorageError]] = {}
_FACTORIES_LOCK = threading.Lock()


def _factory_for(driver: Any) -> Factory:
    """This process's factory for ``driver``'s module, started when there is none (or
    it broke), one more user counted."""
    key = (os.getpid(), type(driver).__module__)
    with _FACTORIES_LOCK:  # a start waited for by the other clients' logins
        factory = _FACTORIES.get(key)
        if factory is None or factory.broken:
            failed = _FAILED.get(key)
            if failed is not None and time.monotonic() - failed[0] < START_TIMEOUT:
                ago = time.monotonic() - failed[0]
                raise StorageError(f"{failed[1].message} (at a start {ago:.0f} s ago: not "
                                   f"tried again for {START_TIMEOUT:.0f} s)",
                                   driver=driver.name, endpoint=driver.endpoint.server,
                                   operation="login", path=driver.endpoint.path,
                                   error_class=failed[1].error_class)
            try:
                factory = Factory(driver)
            except StorageError as exc:
                _FAILED[key] = (time.monotonic(), exc)
                raise
            _FAILED.pop(key, None)
            _FACTORIES[key] = factory
        factory.users += 1
        return factory


def _release(factory: Factory) -> None:
    """One user fewer; the factory closed with its last."""
    with _FACTORIES_LOCK:
        factory.users -= 1
        if factory.users > 0:
            return
        key = (os.getpid(), factory.module)
        if _FACTORIES.get(key) is factory:
            del _FACTORIES[key]
    factory.close()


class Mover:
    """One mover process and the two ends of its pipes."""

    def __init__(self, driver: Any, factory: Factory) -> None:
        self.process, self._requests, self._answers = factory.spawn(driver)
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
            self.close()
            raise StorageError(
                f"the dcap mover (pid {self.process.pid}) ended without its answer "
                f"(its client library crashed?)", driver=driver.name,
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
        try:
            self._send((request, (path, *args)))
        except OSError:  # its end of the pipe closed: it ended
            self.close()
            raise StorageError(
                f"the dcap mover (pid {self.process.pid}) ended before the request "
                f"(its client library crashed?)", driver=driver.name,
                endpoint=driver.endpoint.server, operation=request.lstrip("_"), path=path,
                error_class="crashed") from None
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
        if not self.process.ended(STOP_WAIT):
            self.process.kill()
            self.process.ended(STOP_WAIT)
        self.process.release()


class Movers:
    """A client's movers: one per request in flight, kept for the next request."""

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self._idle: list[Mover] = []
        self._all: list[Mover] = []
        self._slots = threading.BoundedSemaphore(MAX_MOVERS)
        self._lock = threading.Lock()
        self._closed = False
        #: this process's factory, once a mover was asked for (released at close)
        self._factory: Factory | None = None

    def _new(self) -> Mover:
        """A mover from this process's factory (a new factory when it broke)."""
        with self._lock:
            factory, broken = self._factory, None
            if factory is not None and factory.broken:
                broken, factory = factory, None
            if factory is None:
                factory = self._factory = _factory_for(self._driver)
        if broken is not None:
            _release(broken)
        return Mover(self._driver, factory)

    def start(self) -> None:
        """One mover started now (a load client's, before its step's clock)."""
        with self._lock:
            if self._all:
                return
        mover = self._new()
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
                mover = self._new()
                with self._lock:
                    self._all.append(mover)
            try:
                answer = mover.call(self._driver, request, path, *args)
            except StorageError as exc:
                if exc.error_class in ("timeout", "crashed") and mover.process.ended():
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

    def factory_pid(self) -> int | None:
        """The process id of the factory its movers came from (tests watch it)."""
        with self._lock:
            return self._factory.process.pid if self._factory is not None else None

    def close(self) -> None:
        """Every mover stopped, and the factory released (closed with its last user)."""
        with self._lock:
            self._closed = True
            movers, self._all, self._idle = self._all, [], []
            factory, self._factory = self._factory, None
        for mover in movers:
            mover.close()
        if factory is not None:
            _release(factory)


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
        if request not in REQUESTS + NAMESPACE_REQUESTS:
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


def _move(requests: Connection, answers: Connection) -> None:
    """A forked mover's life: its driver and requests, until its client closes."""
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


def _reap(signum: int, frame: Any) -> None:
    """SIGCHLD in a factory: its ended movers reaped."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _become_mover(factory: socket.socket, fds: list[int], request: dict,
                  mask: set) -> NoReturn:
    """In a forked child of a factory: the client process's environment and folder
    (the library kept preloaded), then the mover's life; never returns."""
    code = 0
    try:
        factory.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        preload = os.environ.get("LD_PRELOAD")
        os.environ.clear()
        os.environ.update(request["environment"])
        if preload is not None:
            os.environ["LD_PRELOAD"] = preload
        try:
            os.chdir(request["cwd"])
        except OSError:
            pass
        _move(Connection(fds[0], writable=False), Connection(fds[1], readable=False))
    except BaseException:  # noqa: BLE001 - a child of a fork ends here, whatever happens
        code = 1
    finally:
        os._exit(code)


def _make_movers(factory: socket.socket, imports: list[str]) -> None:
    """A factory's life: the driver module's imports, then a mover forked per request
    (two pipe ends sent with it), its pid and a pidfd sent back, until the client
    process closes the socket."""
    for name in imports:
        importlib.import_module(name)
    count = threads()
    loaded = contained()
    factory.send(json.dumps({"threads": count, "loaded": loaded}).encode())
    if count != 1 or not loaded:
        return
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        message, fds, _, _ = socket.recv_fds(factory, FACTORY_MESSAGE, 2)
        if not message or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            if not message:
                return  # the client process closed it, or ended
            factory.send(json.dumps({"error": f"{len(fds)} descriptors, not 2"}).encode())
            continue
        request = json.loads(message)
        # no reaping between the fork and the pidfd: the pidfd names this child
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
            if pid == 0:
                _become_mover(factory, fds, request, mask)
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            factory.send(json.dumps({"error": f"fork: {exc}"}).encode())
            continue
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for fd in fds:
                os.close(fd)
        try:
            socket.send_fds(factory, [json.dumps({"pid": pid}).encode()], [pidfd])
        finally:
            os.close(pidfd)


def main(argv: list[str]) -> int:
    """``python -m pytest_storagescale.drivers.dcap_mover --factory FD MODULE...``."""
    # the parent decides: Ctrl-C at the terminal reaches the whole process group
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if len(argv) < 3 or argv[1] != "--factory":
        print(f"usage: python -m {ENTRY} --factory FD MODULE... (a dcap client process "
              f"starts it)", file=sys.stderr)
        return 4
    factory = socket.socket(fileno=int(argv[2]))
    try:
        _make_movers(factory, argv[3:])
    except OSError:
        pass  # the client process is gone
    except Exception as exc:  # noqa: BLE001 - the client process raises it
        try:
            factory.send(json.dumps({"error": f"the dcap mover factory failed: "
                                              f"{type(exc).__name__}: {exc}"}).encode())
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
