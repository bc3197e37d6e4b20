"""XRootD driver (pyxrootd, the ``XRootD.client`` bindings).

Each driver instance logs in as its own user name (``<client_id>@host:port``): the
XRootD client multiplexes every request for the same user@host:port over one
connection, so distinct user names are what make C clients look like C clients to
the server. The names follow :meth:`XRootDDriver.client_name`: at most 8
characters, reused from step to step until a step leaves hung clients.

Credentials and client settings are driver options, passed to the client library
through its environment: ``x509_proxy`` (X509_USER_PROXY, GSI), ``token``
(BEARER_TOKEN, read by the ``ztn`` security plugin), ``krb5ccname`` (KRB5CCNAME),
``ca_dir`` (X509_CERT_DIR, for ``roots://`` and ``ztn``'s TLS) and
``security_protocol`` (XrdSecPROTOCOL, e.g. ``krb5,unix``).

Timeouts: every request passes ``timeout=`` (whole seconds), and the client's
``TimeoutResolution`` is set to 1 s (default 15 s) so that a timeout fires when
it should; a broken connection is tried again after 1 s (``StreamErrorWindow``,
default 30 minutes), so the clients come back after a storage restart.

Third-party copy (:meth:`XRootDDriver.pull`): XRootD's TPC is destination-driven --
the client opens the destination with the source's URL and a rendezvous key, and the
destination server fetches the file from the source (``ofs.tpc``, which both servers
need). So there is one call, made of the destination's client; the copy's deadline
is the driver's timeout for setting it up and again (at least 10 s: XrdCl looks for
the end of a copy every 2.5 s) for the copy itself.

Redirects (a dCache door's open to a pool's mover, a redirector's open or stat to a
data server) are followed inside XrdCl, which tells the hosts a request went through
only to an asynchronous call's handler. The compiled loop's stats and gets are
asynchronous: each hop past the first is counted. The Python driver's opens (get,
put, read, readv) stay synchronous (a callback cost 26 % more client CPU per open
and close through the bindings: docs/benchmarks.md) and count one redirect when the
file's data server (XrdCl's ``DataServer`` property, 0.1 us) is not the server
asked; its stat is not counted. All go to :attr:`XRootDDriver.redirects` (``Driver.counters``); the
time at the door is not told by XrdCl (``door_latency_s`` stays NaN).
"""

from __future__ import annotations

import contextlib
import itertools
import threading

from XRootD import client
from XRootD.client.flags import (
    MkDirFlags,
    OpenFlags,
    QueryCode,
    StatInfoFlags,
)

from ..errors import (
    BadAnswer,
    StorageError,
    StorageNotFound,
    StoragePermissionDenied,
    StorageScaleUsageError,
    StorageTimeout,
    StorageUnreachable,
)
from . import flat, native
from .base import CompiledOutcome, Driver, RequestWalk, StatInfo
from .grid import (
    CREDENTIAL_ENVIRONMENT,
    SECRET_OPTIONS,
    XROOTD_SCHEMES,
    XROOTD_SHARD_EVENT_LOOPS,
    XROOTD_USER_EVENT_LOOPS,
    XRootDLogins,
    configure_xrootd_client,
    configure_xrootd_shard,
    login_refusal,
)
from .version import version_from_config_answer

configure_xrootd_client()  # the client's settings (see .grid)

_CHUNK = 8 * 1024 * 1024
#: while clients log in again and again (new_login), idle connections of the process
#: close after this many seconds (the client's DataServerTTL, default 300 s, checked
#: every TimeoutResolution, 1 s): every login leaves a connection behind, and
#: thousands would pile up. Open connections stay at about 2-3 s worth of logins.
#: Not 0: with TTL 0 the XRootD 5.5.3 client crashed the process (SIGSEGV in a stat of
#: a new login) once in a full test run, a connection torn down as it was used
_RELOGIN_TTL = 1


class _ShortTTL:
    """The process's DataServerTTL while clients log in again and again, and for a few
    seconds after the last one closed (so its last connections close too); then the
    TTL it had."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.saved = 0
        self.timer: threading.Timer | None = None

    def hold(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            elif self.holders == 0:
                self.saved = client.EnvGetInt("DataServerTTL")
                client.EnvPutInt("DataServerTTL", _RELOGIN_TTL)
            self.holders += 1

    def release(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0:
                self.timer = threading.Timer(_RELOGIN_TTL + 2, self._restore)
                self.timer.daemon = True
                self.timer.start()

    def _restore(self) -> None:
        with self.lock:
            if self.holders == 0 and self.timer is threading.current_thread():
                client.EnvPutInt("DataServerTTL", self.saved)
                self.timer = None


_short_ttl = _ShortTTL()
#: ``--storage-driver-option client_loop=``, the default first
CLIENT_LOOPS = ("compiled", "python")


def _client_loop(options) -> str:
    return options.get("client_loop", CLIENT_LOOPS[0])
# XrdClStatus.hh codes
_TIMEOUT_CODES = {103, 206}  # errSocketTimeout, errOperationExpired
_UNREACHABLE_CODES = {101, 102, 104, 107, 108, 110}  # address, socket, disconnect, conn., TLS
_AUTH_CODES = {202, 203, 204}  # handshake, login, auth failed
_KXR_NOT_AUTHORIZED, _KXR_NOT_FOUND = 3010, 3011
_NOT_SUPPORTED = 13  # errNotSupported: a server without TPC, in XrdCl's TPC job
#: the least deadline of a TPC's copy: XrdCl looks whether the destination finished
#: every 2.5 s (XrdClThirdPartyCopyJob), so even a small copy takes that long
_TPC_MIN_TIMEOUT = 10
_KXR_UNSUPPORTED = 3013  # a destination without ofs.tpc: "Unable to open ...; tpc not supported"


class XRootDDriver(XRootDLogins, Driver):
    """One XRootD client (``root://``) with its own connection."""

    name = "xrootd"
    files_per_client = 1
    #: the most clients (connections) one process runs before the client library's
    #: per-process timeout bookkeeping, not the storage, sets the rate (measured:
    #: docs/benchmarks.md, "Clients per process"); the executors shard above it
    clients_per_process = 200
    isolate_clients = True  # XrdCl has crashed on garbled answers: a step's, not pytest's
    schemes = XROOTD_SCHEMES
    protocol_family = "xrootd"
    #: flat: a Ceph gateway (flat.py); client_loop: compiled (default) or python
    option_names = (*CREDENTIAL_ENVIRONMENT, flat.OPTION, "client_loop")
    secret_options = SECRET_OPTIONS
    option_environment = CREDENTIAL_ENVIRONMENT
    #: whether this client logs in again (new_login) and so holds the short TTL
    _relogging = False

    def __init__(self, endpoint, **kwargs) -> None:
        super().__init__(endpoint, **kwargs)
        #: redirects this client's requests followed (see the module's text), its
        #: compiled loops' not included (:meth:`counters` adds them)
        self.redirects = 0
        self._loops: list[_CompiledLoop] = []
        port = f":{endpoint.port}" if endpoint.port else ""
        self._server = f"{endpoint.scheme}://{self.client_id}@{endpoint.netloc_host}{port}"
        self._fs = client.FileSystem(self._server)
        #: the server asked, as XrdCl names it (an open elsewhere was redirected)
        self._host_id = client.URL(self._server).hostid
        self.flat_namespace = flat.enabled(self.options)
        #: per-request timeout in whole seconds, as the client library takes it
        self._timeout = max(1, min(65535, int(round(self.timeout))))

    def _url(self, path: str) -> str:
        return f"{self._server}/{path}"

    # -- the compiled loop (native/xrdloop.cc) ----------------------------------------
    @classmethod
    def check_options(cls, options) -> None:
        loop = _client_loop(options)
        if loop not in CLIENT_LOOPS:
            raise StorageScaleUsageError(
                f"--storage-driver-option client_loop={loop!r} is not a client loop of the "
                f"xrootd driver. Write client_loop=compiled (the default: stat and get "
                f"made back to back in C++, the physical limit of the client host) or "
                f"client_loop=python (every request through the XRootD Python bindings).")
        super().check_options(options)

    @classmethod
    def request_line(cls, options) -> str | None:
        loop = _client_loop(options)
        if loop == "python":
            line = "requests: through the XRootD Python bindings (client_loop=python)"
        elif loop != "compiled":  # refused by check_options
            return None
        elif (why := native.missing()) is not None:
            line = (f"requests: through the XRootD Python bindings; the compiled client loop "
                    f"cannot be built ({why}: make setup installs it)")
        else:
            line = ("requests: stat and get by the xrootd driver's compiled client loop "
                    "(C++, GIL released, stat without a thread per client; "
                    "client_loop=python for the bindings), the rest, and every request of "
                    "an open-loop step, through the XRootD Python bindings")
        where = ("per process (XRD_PARALLELEVTLOOP)" if XROOTD_USER_EVENT_LOOPS else
                 f"in a process that runs a step alone, {XROOTD_SHARD_EVENT_LOOPS} in each "
                 f"process of a sharded step (XRD_PARALLELEVTLOOP=8: faster load from "
                 f"one process)")
        return (f"{line}; XrdCl reads the connections with "
                f"{client.EnvGetInt('ParallelEvtLoop')} event loop(s) {where}")

    @classmethod
    def in_shard_process(cls) -> None:
        """A shard process reads its share of the connections with
        :data:`XROOTD_SHARD_EVENT_LOOPS` event loops, unless the user chose a count."""
        configure_xrootd_shard()

    @classmethod
    def before_load(cls, options) -> None:
        """Build the compiled loop before the clients start (once per machine); when it
        cannot be built, the step runs the Python loop (:meth:`request_line` says why)."""
        if _client_loop(options) == "compiled":
            with contextlib.suppress(native.Unavailable):
                native.load()

    def compiled_loop(self, walk: RequestWalk) -> _CompiledLoop | None:
        """The compiled loop for ``walk`` (stat, get), logged in as this client; None
        when ``client_loop=python``, on a Ceph gateway (stat goes through flat.py),
        for a client that logs in again per request, or when it is not built."""
        if (_client_loop(self.options) != "compiled" or self.flat_namespace
                or self._relogging or walk.kind not in native.KINDS):
            return None
        try:
            loop = _CompiledLoop(self, walk)
        except native.Unavailable:
            return None
        self._loops.append(loop)
        return loop

    def counters(self) -> dict[str, float]:
        """``redirects``: those of this client's requests, its compiled loops' too (no
        ``door_seconds``: XrdCl does not tell the time at the door)."""
        return {"redirects": self.redirects + sum(
            loop.client.redirects() for loop in self._loops)}

    def _check(self, status, operation: str, path: str) -> None:
        if status.ok:
            return
        native = f"status={status.status} code={status.code} errno={status.errno}"
        message = status.message.strip()
        kwargs = dict(
            driver=self.name, endpoint=self.endpoint.server, operation=operation,
            path=path, native_status=native,
        )
        if status.code in _TIMEOUT_CODES:
            raise StorageTimeout(message, error_class="timeout", **kwargs)
        if status.code in _UNREACHABLE_CODES:
            raise StorageUnreachable(message, error_class="unreachable", **kwargs)
        if status.code in _AUTH_CODES:
            raise StoragePermissionDenied(login_refusal(message, self.options),
                                          error_class="auth", **kwargs)
        if status.errno == _KXR_NOT_AUTHORIZED:
            raise StoragePermissionDenied(message, error_class="permission", **kwargs)
        if status.errno == _KXR_NOT_FOUND or status.code == 304:
            raise StorageNotFound(message, error_class="not_found", **kwargs)
        if status.errno in (3009, 3021):  # kXR_NoSpace, kXR_overQuota: a full disk or quota
            raise StorageError(message if "no space left" in message.lower() else
                               f"no space left: {message}", error_class="no_space", **kwargs)
        error_class = f"xrootd_errno_{status.errno}" if status.errno else f"xrootd_{status.code}"
        raise StorageError(message, error_class=error_class, **kwargs)

    # -- namespace -----------------------------------------------------------
    def _stat(self, path: str) -> StatInfo:
        return flat.stat(self, path) if self.flat_namespace else self._server_stat(path)

    def _server_stat(self, path: str) -> StatInfo:
        status, info = self._fs.stat(path, timeout=self._timeout)
        self._check(status, "stat", path)
        flags = info.flags
        return StatInfo(size=info.size, is_dir=bool(flags & StatInfoFlags.IS_DIR),
                        modified=float(info.modtime),
                        readable=bool(flags & StatInfoFlags.IS_READABLE),
                        writable=bool(flags & StatInfoFlags.IS_WRITABLE))

    def _ls(self, path: str) -> list[str]:
        return flat.listing(self, path) if self.flat_namespace else self._server_ls(path)

    def _server_ls(self, path: str) -> list[str]:
        try:
            status, listing = self._fs.dirlist(path, timeout=self._timeout)
        except (UnicodeDecodeError, SystemError) as exc:
            # pyxrootd decodes names as UTF-8, failing (a SystemError) on any other
            cause = exc if isinstance(exc, UnicodeDecodeError) else exc.__cause__
            if not isinstance(cause, UnicodeDecodeError):
                raise
            raise self._bad_answer(f"a name in the listing is not UTF-8: "
                                   f"{cause.object[:80]!r}", "ls", path) from None
        self._check(status, "ls", path)
        return [entry.name for entry in listing]

    def _text(self, answer: bytes, operation: str, path: str) -> str:
        """A query's answer as text; not UTF-8 is a bad answer."""
        try:
            return answer.decode().strip("\x00\n ")
        except UnicodeDecodeError:
            raise self._bad_answer(f"the answer {answer[:80]!r} is not UTF-8 text",
                                   operation, path) from None

    def _bad_answer(self, message: str, operation: str, path: str) -> BadAnswer:
        return BadAnswer(message, driver=self.name, endpoint=self.endpoint.server,
                         operation=operation, path=path, error_class="bad_answer")

    def _mkdir(self, path: str) -> None:
        status, _ = self._fs.mkdir(path, MkDirFlags.MAKEPATH, timeout=self._timeout)
        self._check(status, "mkdir", path)

    def _mkdir_exclusive(self, path: str) -> None:
        # without MAKEPATH the server refuses an existing path and a missing parent
        if self.flat_namespace:  # ... but a Ceph gateway makes nothing and refuses nothing
            flat.refuse_if_taken(self, path, name=self.name, server=self.endpoint.server)
        status, _ = self._fs.mkdir(path, MkDirFlags.NONE, timeout=self._timeout)
        self._check(status, "mkdir", path)

    def _delete(self, path: str) -> None:
        status, _ = self._fs.rm(path, timeout=self._timeout)
        self._check(status, "delete", path)

    def _rmdir(self, path: str) -> None:
        if self.flat_namespace:  # a Ceph gateway answers success and removes nothing
            flat.refuse_if_not_empty(self, path, name=self.name, server=self.endpoint.server)
        status, _ = self._fs.rmdir(path, timeout=self._timeout)
        self._check(status, "rmdir", path)

    def _rename(self, source: str, target: str) -> None:
        status, _ = self._fs.mv(source, target, timeout=self._timeout)
        self._check(status, "rename", source)

    def _checksum(self, path: str, algorithm: str) -> str:
        status, answer = self._fs.query(QueryCode.CHECKSUM, path, timeout=self._timeout)
        self._check(status, "checksum", path)
        name, _, value = self._text(answer, "checksum", path).partition(" ")
        if name.lower() != algorithm.lower():
            raise StorageError(
                f"server answered a {name} checksum, {algorithm} was asked for",
                driver=self.name, endpoint=self.endpoint.server, operation="checksum",
                path=path, error_class="checksum_type",
            )
        return value.strip()

    def _version(self) -> str:
        status, answer = self._fs.query(QueryCode.CONFIG, "version", timeout=self._timeout)
        self._check(status, "version", "/")
        text = self._text(answer, "version", "/")
        # dCache's xrootd door answers "dCache 11.2.5"; xrootd "v5.5.3"
        return version_from_config_answer(text) or text.strip().lstrip("v")

    # -- data ----------------------------------------------------------------
    def _open(self, path: str, flags: int, operation: str, mode: int = 0) -> client.File:
        handle = client.File()
        status, _ = handle.open(self._url(path), flags, mode, timeout=self._timeout)
        self._check(status, operation, path)
        if handle.get_property("DataServer") != self._host_id:
            self.redirects += 1  # at least one: hops past it are not told here
        return handle

    def _close(self, handle: client.File, operation: str, path: str) -> None:
        status, _ = handle.close(timeout=self._timeout)
        self._check(status, operation, path)

    def _put(self, path: str, data: bytes) -> int:
        handle = self._open(path, OpenFlags.DELETE | OpenFlags.MAKEPATH, "put", 0o644)
        try:
            for offset in range(0, len(data), _CHUNK):
                chunk = data[offset:offset + _CHUNK]
                status, _ = handle.write(chunk, offset, len(chunk), timeout=self._timeout)
                self._check(status, "put", path)
        finally:
            self._close(handle, "put", path)
        return len(data)

    def _get(self, path: str, local_path: str | None) -> int:
        handle = self._open(path, OpenFlags.READ, "get")
        # the size the open answered (kept by the client: no request), so that a 1 MB
        # file is read with a 1 MB buffer, not an 8 MiB one (measurably slower)
        status, info = handle.stat()
        size = info.size if status.ok and info is not None else None
        total = 0
        sink = open(local_path, "wb") if local_path else None
        try:
            while (want := _CHUNK if size is None else min(_CHUNK, size - total)) > 0:
                status, data = handle.read(total, want, timeout=self._timeout)
                self._check(status, "get", path)
                if not data:
                    break
                if sink:
                    sink.write(data)
                total += len(data)
                if len(data) < want:
                    break
        finally:
            if sink:
                sink.close()
            self._close(handle, "get", path)
        return total

    def _read(self, path: str, offset: int, size: int) -> bytes:
        handle = self._open(path, OpenFlags.READ, "read")
        try:
            status, data = handle.read(offset, size, timeout=self._timeout)
            self._check(status, "read", path)
        finally:
            self._close(handle, "read", path)
        return data

    def _readv(self, path: str, chunks: list[tuple[int, int]]) -> int:
        handle = self._open(path, OpenFlags.READ, "readv")
        try:
            status, info = handle.vector_read(chunks, timeout=self._timeout)
            self._check(status, "readv", path)
        finally:
            self._close(handle, "readv", path)
        return info.size

    # -- third-party copy -----------------------------------------------------------
    def pull(self, path: str, source: XRootDDriver, source_path: str) -> None:
        """Third-party copy of ``source_path`` on ``source``'s server to ``path`` on this
        client's server, which fetches it (``xrdcp --tpc only``: never through this
        process). Guarded like every write: ``path`` must be in this client's
        ``writable_root``; the source is only read. A server that offers no TPC (either
        side) is an error of class ``tpc_not_supported``."""
        self._guard("third-party copy", path)
        self._made(path, "file")  # the run's, whole or partial (size unknown here)
        # the source with this client's login name: the source lets the destination's
        # copy program in only when the rendezvous key came from the same client identity
        # (user.pid@host) as the copy asked of the destination; with another login name
        # the destination waits for a source that refuses it until the deadline
        login = self._server.partition("://")[2].partition("@")[0]
        port = f":{source.endpoint.port}" if source.endpoint.port else ""
        origin = (f"{source.endpoint.scheme}://{login}@{source.endpoint.netloc_host}{port}/"
                  f"{source_path}")
        process = client.CopyProcess()
        process.add_job(origin, self._url(path), force=True, mkdir=True,
                        thirdparty="only", inittimeout=self._timeout,
                        tpctimeout=max(self._timeout, _TPC_MIN_TIMEOUT))
        status = process.prepare()
        if status.ok:
            status, results = process.run()
            if status.ok and results and results[0].get("status") is not None:
                status = results[0]["status"]
        if not status.ok and (status.code == _NOT_SUPPORTED or (
                status.errno == _KXR_UNSUPPORTED and "tpc not supported" in status.message)):
            raise StorageError(
                status.message.strip(), driver=self.name, endpoint=self.endpoint.server,
                operation="third-party copy", path=path, error_class="tpc_not_supported",
                native_status=f"status={status.status} code={status.code} "
                              f"errno={status.errno}")
        self._check(status, "third-party copy", path)

    def new_login(self, name: str) -> None:
        """Log in again as ``name``: the next request opens a new connection and
        authenticates (the ``auth`` operation). While such clients exist (and 2 s
        after), idle connections close at the client's next timeout check
        (:data:`_RELOGIN_TTL`), so logins do not pile up."""
        if not self._relogging:
            _short_ttl.hold()
            self._relogging = True
        endpoint = self.endpoint
        port = f":{endpoint.port}" if endpoint.port else ""
        self._server = f"{endpoint.scheme}://{name}@{endpoint.netloc_host}{port}"
        self._fs = client.FileSystem(self._server)
        self._host_id = client.URL(self._server).hostid

    def connect(self) -> None:
        """Connect and log in (a ``kXR_ping`` after the login)."""
        status, _ = self._fs.ping(timeout=self._timeout)
        self._check(status, "login", "/")

    def close(self) -> None:
        if self._relogging:
            self._relogging = False
            _short_ttl.release()
        self._fs = None


#: finished background requests taken from C at a time
_TAKE = 256


class _CompiledLoop:
    """A client's stat or get of :class:`RequestWalk` made back to back by
    ``native/xrdloop.cc``, logged in as the driver's client; each failure becomes the
    error the driver's own request would raise."""

    def __init__(self, driver: XRootDDriver, walk: RequestWalk) -> None:
        self.driver, self.walk = driver, walk
        self.client = native.CompiledClient(driver._server, walk.kind, walk.paths)

    def run(self, iteration: int, count: int, until: float) -> list[CompiledOutcome]:
        walk, client = self.walk, self.client
        done, message = client.run(walk.first + iteration * walk.step, walk.step, count,
                                   until, self.driver._timeout)
        finished, latency, moved, codes = client.columns(done)
        size = walk.size
        if not any(codes) and (size is None or moved.count(size) == done):
            return list(map(CompiledOutcome, finished, latency, moved,
                            itertools.repeat(None, done)))
        return [self._outcome(iteration + i, client.outcome(i), message)
                for i in range(done)]

    # -- on its own (BackgroundLoop): stat, issued by XrdCl's threads
    @property
    def background(self) -> bool:
        return self.walk.kind == "stat"

    def start(self, until: float = 0.0) -> bool:
        return self.client.start(self.walk.first, self.walk.step, self.driver._timeout, until)

    def take(self) -> list[CompiledOutcome]:
        """The finished requests waiting when called (those that finish meanwhile wait
        for the next take: a loop answered faster than it is drained never holds its
        caller); one error per failure's path and status, shared by its repeats."""
        outcomes: list[CompiledOutcome] = []
        errors: dict[tuple[int, ...], BaseException | None] = {}
        budget = max(self.client.pending(), _TAKE)
        while len(outcomes) < budget:
            taken = self.client.take(min(_TAKE, budget - len(outcomes)))
            done = len(taken.finished)
            if not done:
                break
            if not any(taken.code):
                outcomes.extend(map(CompiledOutcome, taken.finished, taken.latency,
                                    itertools.repeat(0, done), itertools.repeat(None, done)))
                continue
            for i in range(done):
                if not taken.code[i]:
                    outcomes.append(CompiledOutcome(taken.finished[i], taken.latency[i], 0,
                                                    None))
                    continue
                outcome = native.Outcome(taken.finished[i], taken.latency[i], 0,
                                         taken.code[i], taken.errno[i], taken.level[i])
                key = (self._path_number(taken.index[i]), *outcome[3:])
                if key not in errors:
                    errors[key] = self._outcome(taken.index[i], outcome, taken.message).error
                outcomes.append(CompiledOutcome(outcome.finished, outcome.latency, 0,
                                                errors[key]))
        return outcomes

    def _path_number(self, iteration: int) -> int:
        walk = self.walk
        return (walk.first + iteration * walk.step) % len(walk.paths)

    def busy_since(self) -> float | None:
        return self.client.busy_since()

    def abandon(self, since: float) -> bool:
        return self.client.abandon(since)

    def wait_idle(self, seconds: float) -> bool:
        return self.client.wait_idle(seconds)

    def _outcome(self, iteration: int, outcome: native.Outcome, message: str
                 ) -> CompiledOutcome:
        walk = self.walk
        error: Exception | None = None
        path = walk.paths[self._path_number(iteration)]
        if outcome.code:
            try:
                self.driver._check(_Status(outcome, message), walk.kind, path)
            except StorageError as exc:
                error = exc
        elif walk.size is not None and outcome.moved != walk.size:
            error = ValueError(f"{walk.kind} {path}: {outcome.moved} bytes, expected "
                               f"{walk.size}")
        return CompiledOutcome(outcome.finished, outcome.latency, outcome.moved, error)

    def halt(self) -> None:
        self.client.halt()

    def close(self) -> None:
        self.client.close()


class _Status:
    """A failed XRootDStatus of the compiled loop, as the Python bindings show one."""

    ok = False

    def __init__(self, outcome: native.Outcome, message: str) -> None:
        self.code, self.errno, self.status = outcome.code, outcome.errno, outcome.level
        self.message = message
