"""The driver interface every client library implements.

A driver instance is **one client** of the storage: its own connection and login
(the load engine makes one per simulated client). Public methods guard every
mutating operation: a path outside ``writable_root`` (the run's test area) raises
:class:`~pytest_storagescale.errors.UnsafePathError` before anything is sent.
Subclasses implement the ``_``-prefixed methods and raise
:class:`~pytest_storagescale.errors.StorageError` subclasses on failure.

The class owns what is specific to its protocol: the URL schemes it speaks, the
options it takes (credentials, client settings), how its clients log in
(:meth:`Driver.client_name`, :meth:`Driver.role_name`) and whether connections
outlive a driver (:meth:`Driver.forget_connections`). Nobody builds a driver by
hand: :func:`~pytest_storagescale.drivers.registry.driver_spec` makes a
:class:`~pytest_storagescale.drivers.spec.DriverSpec`, which builds them.
"""

from __future__ import annotations

import abc
import json
import os
import threading
import time
from collections.abc import Mapping
from typing import ClassVar, NamedTuple, Protocol

from ..errors import (
    StorageError,
    StorageNotFound,
    StorageTimeout,
    StorageUnreachable,
    UnsafePathError,
)
from ..redact import register_driver_options, register_url
from .url import EndpointURL, is_inside, split_url

#: the owner file at the top of every run directory; its time on the storage is the
#: run's start, below which no clean-up deletes a file
OWNER_FILE = ".storagescale-owner.json"
#: a file this much older than the run's start is still taken as the run's own (file
#: times in whole seconds, or in 2 s steps on some file systems)
MTIME_SLACK = 2.0
_NOT_ASKED = object()
#: how :class:`CreatedPaths` knows an entry: a directory it may list and empty, a file it
#: may delete, or a leaf (a file, or a directory removed with ``rmdir`` only, never listed)
CREATED_KINDS = ("dir", "file", "leaf")


class CreatedPaths:
    """What a run made below ``root``: the only entries its clean-up removes.

    Exact paths are recorded by a driver whose :attr:`Driver.created` is set (every
    ``mkdir``, ``put``, ``write`` and ``rename`` target, with the size written); what
    many load clients write is recognised by ``generated(parts)``: the kind (one of
    :data:`CREATED_KINDS`) of the path whose parts below ``root`` are ``parts``, or None
    when no operation makes such a name. ``owner``: the owner file, removed last."""

    def __init__(self, root: str, generated=None, *, owner: str | None = None) -> None:
        self.root = root.rstrip("/")
        self.generated = generated
        self.owner = owner
        self._kinds: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, path: str, kind: str, size: int | None = None) -> None:
        """Record ``path`` as made, and the directories between :attr:`root` and it
        that are not recorded yet as directories (a ``put`` or ``mkdir -p`` makes its
        parents; the clean-up lists one only after ``rmdir`` called it not empty,
        which a link to a directory never answers)."""
        path = path.rstrip("/")
        with self._lock:
            self._kinds[path] = kind
            if size is not None:
                self.sizes[path] = size
            parent = path.rpartition("/")[0]
            while parent.startswith(self.root + "/"):
                self._kinds.setdefault(parent, "dir")
                parent = parent.rpartition("/")[0]

    def below(self, root: str) -> CreatedPaths:
        """The same records seen from ``root`` (a test's folder), without generated
        names: what removing ``root`` may remove. Later records show in both."""
        view = CreatedPaths(root)
        view._kinds, view.sizes, view._lock = self._kinds, self.sizes, self._lock
        return view

    def forget(self, path: str) -> None:
        with self._lock:
            self._kinds.pop(path.rstrip("/"), None)
            self.sizes.pop(path.rstrip("/"), None)

    def kind(self, path: str) -> str | None:
        """``dir``, ``file``, ``leaf``, or None: not made by this run."""
        path = path.rstrip("/")
        if path == self.root:
            return "dir"
        if path in self._kinds:
            return self._kinds[path]
        if not path.startswith(self.root + "/") or self.generated is None:
            return None
        return self.generated(tuple(path[len(self.root) + 1:].split("/")))


class StatInfo(NamedTuple):
    """What ``stat`` answers (a tuple: cheap to make in the load loop)."""

    size: int
    is_dir: bool
    #: last modification, seconds since the epoch on the storage's clock (None: the
    #: driver cannot tell)
    modified: float | None = None
    #: whether the storage says this login may read / write it (None: the protocol does
    #: not say, e.g. a WebDAV PROPFIND)
    readable: bool | None = None
    writable: bool | None = None


class RequestWalk(NamedTuple):
    """What a load client repeats, for a driver that can repeat it itself
    (:meth:`Driver.compiled_loop`): request ``i`` is ``kind`` (``stat``, ``get``) of
    ``paths[(first + i * step) % len(paths)]``; a ``get`` must move ``size`` bytes."""

    kind: str
    paths: tuple[str, ...]
    first: int = 0
    step: int = 0
    size: int | None = None


class CompiledOutcome(NamedTuple):
    """One request a driver's compiled loop made: its end (``time.perf_counter``
    seconds), latency, bytes, and its error (None: it succeeded)."""

    finished: float
    latency: float
    moved: int
    error: BaseException | None


class CompiledLoop(Protocol):
    """A client's requests made back to back outside Python (:meth:`Driver.compiled_loop`)."""

    def run(self, iteration: int, count: int, until: float) -> list[CompiledOutcome]:
        """Requests ``iteration`` ... at most ``iteration + count - 1``; none begun
        after ``until`` (``perf_counter``) but the first, none after a failure."""

    def halt(self) -> None:
        """From any thread: begin no further request (Ctrl-C)."""

    def close(self) -> None:
        """Free the client (its connection closes with the process's idle ones)."""


class BackgroundLoop(CompiledLoop, Protocol):
    """A compiled loop that can also run on its own (``background`` True): after
    :meth:`start`, the library's threads issue each request when the last one ended,
    so no thread waits per client; the engine drains the finished requests and
    watches the one in flight for hangs."""

    background: bool

    def start(self, until: float = 0.0) -> bool:
        """Begin: request 0, 1, ... of the walk, back to back, until :meth:`halt` or
        ``until`` (``perf_counter``, the step's end: none begun after it; 0: no end); or
        begin again after the loop ended at a request the library refused to send.
        False: not begun (running, halted, or given up)."""

    def take(self) -> list[CompiledOutcome]:
        """The requests finished since the last take, oldest first."""

    def busy_since(self) -> float | None:
        """When the request in flight began (``perf_counter``), None between requests."""

    def abandon(self, since: float) -> bool:
        """Give up the request in flight begun at ``since`` (a hang): not measured, and
        none after it. False if it has ended meanwhile."""

    def wait_idle(self, seconds: float) -> bool:
        """At most ``seconds`` until no request is in flight (or it was given up)."""


#: the command that makes a test area, by protocol (:meth:`Driver.create_command`)
_CREATE_COMMANDS = {"xrootd": "xrdfs {server} mkdir -p {path}",
                    "http": "gfal-mkdir -p {display}", "file": "mkdir -p {path}"}


class Driver(abc.ABC):
    """One client connection to an endpoint."""

    #: short name used in errors and results
    name: ClassVar[str] = "driver"
    #: URL schemes this driver speaks
    schemes: ClassVar[tuple[str, ...]] = ()
    #: the driver options it takes (``--storage-driver-option KEY=VALUE``)
    option_names: ClassVar[tuple[str, ...]] = ("ca_dir",)
    #: options whose values are never shown (repr, errors, results)
    secret_options: ClassVar[tuple[str, ...]] = ()
    #: open files (connections, sockets) one client holds: checked against ulimit -n
    files_per_client: ClassVar[int] = 2
    #: its requests go through a compiled client library, which a malformed answer may
    #: crash with its process: the session's first contact with an endpoint then runs
    #: in a short-lived child process (drivers/version.first_contact)
    native_library: ClassVar[bool] = True
    #: the ``auto`` executor runs its load clients in spawned processes, never in
    #: pytest's own (load/executors.isolates_clients): a crash of its library mid-step
    #: costs that step, not the session (xrootd, gfal2)
    isolate_clients: ClassVar[bool] = False
    #: the most load clients one process should run (0: no limit); above it the
    #: ``auto`` and ``processes`` executors shard the clients over more processes
    clients_per_process: ClassVar[int] = 0
    #: options the client library reads from the environment: option -> variable
    option_environment: ClassVar[Mapping[str, str]] = {"ca_dir": "X509_CERT_DIR"}
    #: the protocol its schemes speak: ``xrootd``, ``http``, ``file``, or "" (its own);
    #: a driver speaking several, one per scheme (gfal2), overrides :meth:`protocol_of`
    protocol_family: ClassVar[str] = ""

    def __init__(
        self,
        endpoint: EndpointURL,
        *,
        client_id: str = "storagescale",
        timeout: float = 60.0,
        writable_root: str | None = None,
        options: Mapping[str, str] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.client_id = client_id
        self.timeout = timeout
        #: mutating operations are refused outside this path (None: refuse all)
        self.writable_root = writable_root
        self.options: Mapping[str, str] = options or {}
        # in every process and on every host that builds a driver: its errors and
        # step records never quote these credentials
        register_url(endpoint.url)
        register_driver_options(self.options, self.secret_options)
        self._run_started: object = _NOT_ASKED
        self._run_started_lock = threading.Lock()
        #: the load step's stop (set by the engine for a load client: the window's end,
        #: Ctrl-C): a request waiting to be sent again (throttled) is not sent once set
        self.halted: threading.Event | None = None
        #: where the paths this client makes are recorded (None: nowhere)
        self.created: CreatedPaths | None = None
        for option, variable in self.option_environment.items():
            if self.options.get(option):
                # the client libraries read credentials and CA paths from the
                # environment when they connect; one identity per process
                os.environ[variable] = self.options[option]

    # -- what the class owns ----------------------------------------------------
    # The protocol rules (which scheme is XRootD or HTTP, XRootD's ``//path``, how a
    # test area is made) are capabilities of the driver class: the plugin and the
    # suites ask a door's driver class (``door.spec.driver_class``), never a scheme list.
    @classmethod
    def protocol_of(cls, scheme: str) -> str:
        """The protocol ``scheme`` speaks through this driver (:attr:`protocol_family`)."""
        return cls.protocol_family

    @classmethod
    def is_xrootd(cls, scheme: str) -> bool:
        """``scheme`` speaks the XRootD protocol through this driver."""
        return cls.protocol_of(scheme) == "xrootd"

    @classmethod
    def is_http(cls, scheme: str) -> bool:
        """``scheme`` speaks HTTP (WebDAV) through this driver."""
        return cls.protocol_of(scheme) == "http"

    @classmethod
    def has_checksum(cls, scheme: str) -> bool:
        """``scheme``'s protocol has a checksum request (dcap has none)."""
        return True

    @classmethod
    def has_listing(cls, scheme: str) -> bool:
        """This driver lists a directory over ``scheme`` (not over dcap: gfal2's)."""
        return True

    @classmethod
    def listing_door_option(cls, scheme: str) -> str | None:
        """The driver option naming another door of the same namespace through which
        this driver's service connections (set-up, clean-up, never a load client) list
        a directory, when it lists none over ``scheme`` itself (gfal2 over dcap:
        ``listing_door``; the session sets it, session/endpoint.py); None: no such."""
        return None

    @classmethod
    def url_of(cls, endpoint: EndpointURL, path: str) -> str:
        """The URL of the absolute ``path`` on ``endpoint``'s server, without
        credentials: XRootD writes the path after a second slash (``root://host//a/f``)."""
        separator = "/" if cls.is_xrootd(endpoint.scheme) else ""
        return f"{endpoint.server}{separator}{path}"

    @classmethod
    def create_command(cls, endpoint: EndpointURL) -> str:
        """The command that makes ``endpoint``'s test area, in the storage's own client
        (the hint when the area is missing: the plugin never makes it)."""
        command = _CREATE_COMMANDS.get(cls.protocol_of(endpoint.scheme))
        if command is None:
            return f"create {endpoint.path} with the storage's own tools"
        return command.format(server=endpoint.server, path=endpoint.path,
                              display=endpoint.display)

    @classmethod
    def parse_endpoint(cls, url: str) -> EndpointURL:
        """The endpoint of ``url`` (:class:`~pytest_storagescale.errors.EndpointError`
        when it cannot be used)."""
        return EndpointURL.parse(url, xrootd=cls.is_xrootd(split_url(url).scheme.lower()))

    @classmethod  # noqa: B027 - an optional hook
    def check_options(cls, options: Mapping[str, str]) -> None:
        """Reject option values this driver cannot use (a usage error naming the value);
        the keys are already checked against :attr:`option_names`."""

    @classmethod
    def client_name(cls, index: int) -> str:
        """The login name of load client ``index``."""
        return f"client{index}"

    @classmethod
    def role_name(cls, role: str) -> str:
        """The login name of a service connection (``admin``, ``coordinator``...)."""
        return role

    @classmethod
    def request_line(cls, options: Mapping[str, str]) -> str | None:
        """The run header's word on how this driver makes the load's requests (None:
        nothing to say beyond its name)."""
        return None

    @classmethod  # noqa: B027 - an optional hook
    def before_load(cls, options: Mapping[str, str]) -> None:
        """Called once before a step's clients start, untimed, in the process that runs
        the step (e.g. the xrootd driver builds its compiled loop here)."""

    @classmethod  # noqa: B027 - an optional hook
    def in_shard_process(cls) -> None:
        """Called first in each spawned process of a sharded step (processes executor),
        before its clients connect (e.g. the xrootd driver's event loops per process)."""

    @classmethod  # noqa: B027 - an optional hook
    def forget_connections(cls) -> None:
        """Called after a step with hung clients: later clients must not reuse a
        connection a hung request may still hold."""

    # -- the guard ------------------------------------------------------------
    def _guard(self, operation: str, path: str) -> None:
        if self.writable_root is None or not is_inside(path, self.writable_root):
            raise UnsafePathError(
                f"refusing {operation} of {path!r}: outside this run's test area "
                f"{self.writable_root!r} on {self.endpoint.display}"
            )

    # -- read-only operations -------------------------------------------------
    def stat(self, path: str) -> StatInfo:
        return self._stat(path)

    def ls(self, path: str) -> list[str]:
        return self._ls(path)

    def get(self, path: str, local_path: str | None = None) -> int:
        """Copy ``path`` whole to ``local_path`` (or read and discard); return bytes."""
        return self._get(path, local_path)

    def read(self, path: str, offset: int, size: int) -> bytes:
        return self._read(path, offset, size)

    def readv(self, path: str, chunks: list[tuple[int, int]]) -> int:
        """Vector read of ``(offset, size)`` chunks in one request; return bytes."""
        return self._readv(path, chunks)

    def checksum(self, path: str, algorithm: str = "adler32") -> str:
        return self._checksum(path, algorithm).lower()

    def version(self) -> str:
        return self._version()

    def connect(self) -> None:  # noqa: B027 - optional hook, most drivers connect lazily
        """Open the connection and log in now: a load client does this before the
        step's clock starts, so that C logins at once are not part of the measured
        window. A failure here is not measured; the first request connects again."""

    def close(self) -> None:  # noqa: B027 - optional hook, most drivers keep nothing
        """Release the connection (best effort)."""

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` before sending a request again; True when the step stopped
        meanwhile (:attr:`halted`, which ends the wait at once): send nothing more."""
        if self.halted is None:
            time.sleep(seconds)
            return False
        return self.halted.wait(seconds)

    def counters(self) -> dict[str, float]:
        """What this client counted of its requests beyond their outcomes, summed over
        a step's clients into its results (``redirects`` and ``door_seconds``: a door's
        redirects to its data servers); none by default."""
        return {}

    def compiled_loop(self, walk: RequestWalk) -> CompiledLoop | None:
        """A loop that makes this client's requests of ``walk`` back to back outside
        Python, with its own connection as this client's; None (the default): the
        engine makes them through this driver's methods."""
        return None

    # -- mutating operations: guarded ----------------------------------------
    def mkdir(self, path: str, *, parents: bool = True) -> None:
        """Make ``path``; with ``parents`` its missing parents too, and an existing
        directory is fine (``mkdir -p``, what steps use inside the run directory).
        Without: the parent must exist and ``path`` must not (the run directory)."""
        self._guard("mkdir", path)
        if parents:
            self._mkdir(path)
        else:
            self._mkdir_exclusive(path)
        self._made(path, "dir")

    def _made(self, path: str, kind: str, size: int | None = None) -> None:
        if self.created is not None:
            self.created.add(path, kind, size)

    def put(self, path: str, data: bytes) -> int:
        """Write ``data`` as the whole content of ``path`` (create or overwrite)."""
        self._guard("put", path)
        written = self._put(path, data)
        self._made(path, "file", len(data))
        return written

    def write_sequential(self, path: str, data: bytes, block_size: int, sync: str) -> int:
        """Write ``data`` in ``block_size`` blocks with ``sync`` (``none``, ``dsync``,
        ``direct``); only POSIX drivers offer the last two."""
        self._guard("put", path)
        if sync != "none":
            raise StorageError(
                f"{sync} writes need a POSIX mount: point the suite at file:///mount/path",
                driver=self.name, endpoint=self.endpoint.server, operation="write", path=path,
                error_class="unsupported",
            )
        written = self._put(path, data)
        self._made(path, "file", len(data))
        return written

    def delete(self, path: str) -> None:
        self._guard("delete", path)
        self._delete(path)

    def rmdir(self, path: str) -> None:
        self._guard("rmdir", path)
        self._rmdir(path)

    def rename(self, source: str, target: str) -> None:
        self._guard("rename", source)
        self._guard("rename", target)
        self._rename(source, target)
        if self.created is not None:
            kind, size = self.created.kind(source), self.created.sizes.get(source)
            self.created.forget(source)
            if kind is not None:
                self.created.add(target, kind, size)

    def remove_tree(self, path: str, *, not_before: float | None = None) -> int:
        """Delete ``path`` and everything below it; return entries removed.

        Not used by the plugin nor the suites: what they made is removed with
        :func:`~pytest_storagescale.load.engine.remove_created` (only what a
        :attr:`created` recorder saw made). This walk removes what it finds, anyone's:
        kept for emptying a throwaway server's area (the plugin's own tests). Even so,
        never through a link: servers follow links on ``stat`` (a link to a directory
        outside the run looks like a directory), but not on ``rmdir``. So a directory
        is first removed as it is: that succeeds when it is empty, and is refused as
        *not empty* only for a real directory; only then are its entries listed and
        removed. Any other refusal (a link answers *not a directory*) stops the walk
        there, with an error naming the path.

        A link to a *file* looks like the file, and a server may delete its target
        with it (xrootd does). So no file older than ``not_before`` (seconds since
        the epoch on the storage's clock; by default :meth:`run_started`) is deleted:
        it cannot be one this run wrote, and is reported with its path instead."""
        self._guard("delete", path)
        if not_before is None:
            not_before = self.run_started()
        return self._remove_entry(path, not_before)

    def run_started(self) -> float | None:
        """When this run began on the storage's clock: the owner file's time as the
        storage reported it when the file was first written (``storage_started`` in
        it; the heartbeat rewrites the file), else the file's time (None: there is
        none, or the driver cannot tell times). Asked once per driver, before its
        first delete."""
        with self._run_started_lock:
            if self._run_started is _NOT_ASKED:
                self._run_started = self._owner_started() if self.writable_root else None
            return self._run_started  # type: ignore[return-value]

    def _owner_started(self) -> float | None:
        owner = f"{(self.writable_root or '').rstrip('/')}/{OWNER_FILE}"
        try:
            record = json.loads(self._read(owner, 0, 64 * 1024))
            if isinstance(record, dict) and isinstance(record.get("storage_started"),
                                                       (int, float)):
                return float(record["storage_started"])
        except (StorageError, ValueError):
            pass
        try:
            return self._stat(owner).modified
        except StorageNotFound:
            return None

    def _remove_entry(self, path: str, not_before: float | None) -> int:
        self._guard("delete", path)
        try:
            info = self._stat(path)
        except StorageNotFound:  # already gone
            return 0
        if info.is_dir:
            return self._remove_directory(path, not_before)
        if not_before is not None and info.modified is not None and (
                info.modified < not_before - MTIME_SLACK):
            raise StorageError(
                f"refusing to delete it: older than this run (modified {_when(info.modified)}, "
                f"the run started {_when(not_before)}, on the storage's clock), possibly a "
                f"link to a file outside the test area, which the server would delete "
                f"through the link. Check it and remove it by hand",
                driver=self.name, endpoint=self.endpoint.server, operation="delete",
                path=path, error_class="not_removed")
        self._delete(path)
        return 1

    def _remove_directory(self, path: str, not_before: float | None) -> int:
        try:
            self._rmdir(path)
            return 1
        except StorageNotFound:
            return 0
        except StorageError as exc:
            if not self.may_be_a_link(exc):
                raise
            if not self._not_empty(exc):
                raise StorageError(
                    f"not removed: it looks like a directory but is not removable as one "
                    f"({exc.message}); it may be a link to a directory outside this run, and "
                    f"the plugin never deletes through a link. Remove it by hand",
                    driver=self.name, endpoint=self.endpoint.server, operation="delete",
                    path=path, native_status=exc.native_status, error_class="not_removed",
                ) from None
        removed = 0
        for name in self._ls(path):
            removed += self._remove_entry(f"{path.rstrip('/')}/{name}", not_before)
        self._rmdir(path)
        return removed + 1

    @staticmethod
    def may_be_a_link(exc: StorageError) -> bool:
        """Whether ``rmdir``'s refusal may be a link's answer: not when it timed out,
        found no server, was refused (login, permission) or bounced between redirectors
        (a cmsd manager's rmdir reaches one data server)."""
        return not (isinstance(exc, (StorageTimeout, StorageUnreachable))
                    or exc.error_class in ("permission", "auth")
                    or "redirect limit" in exc.message.lower())

    @staticmethod
    def _not_empty(exc: StorageError) -> bool:
        """Whether ``rmdir``'s refusal says the directory has entries."""
        text = f"{exc.error_class} {exc.message}".lower().replace("_", " ")
        return "not empty" in text or "notempty" in text or "errno 39" in text

    def _mkdir_exclusive(self, path: str) -> None:
        """Make one directory whose parent exists; fail when ``path`` exists.

        Checked with ``stat`` here; a driver whose client can make a directory
        exclusively in one request overrides this."""
        parent = path.rstrip("/").rpartition("/")[0] or "/"
        if not self._stat(parent).is_dir:
            raise StorageError("the parent is not a directory", driver=self.name,
                               endpoint=self.endpoint.server, operation="mkdir", path=path,
                               error_class="not_a_directory")
        try:
            self._stat(path)
        except StorageNotFound:
            self._mkdir(path)
            return
        raise StorageError("file exists", driver=self.name, endpoint=self.endpoint.server,
                           operation="mkdir", path=path, error_class="exists")

    # -- what a driver implements --------------------------------------------
    @abc.abstractmethod
    def _stat(self, path: str) -> StatInfo: ...

    @abc.abstractmethod
    def _ls(self, path: str) -> list[str]: ...

    @abc.abstractmethod
    def _mkdir(self, path: str) -> None: ...

    @abc.abstractmethod
    def _put(self, path: str, data: bytes) -> int: ...

    @abc.abstractmethod
    def _get(self, path: str, local_path: str | None) -> int: ...

    @abc.abstractmethod
    def _read(self, path: str, offset: int, size: int) -> bytes: ...

    @abc.abstractmethod
    def _readv(self, path: str, chunks: list[tuple[int, int]]) -> int: ...

    @abc.abstractmethod
    def _delete(self, path: str) -> None: ...

    @abc.abstractmethod
    def _rmdir(self, path: str) -> None: ...

    @abc.abstractmethod
    def _rename(self, source: str, target: str) -> None: ...

    @abc.abstractmethod
    def _checksum(self, path: str, algorithm: str) -> str: ...

    @abc.abstractmethod
    def _version(self) -> str: ...


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
