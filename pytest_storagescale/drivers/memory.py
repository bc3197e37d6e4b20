"""A storage in memory (``memory://store/path``), like fsspec's MemoryFileSystem,
whose latency, failures and hangs you control.

Try the plugin without any server (add ``--storage-driver-option fail_every=100``
to see steps fail, ``hang_after=1000`` to see clients hang)::

    pytest suites/xrootd --storage-endpoint memory://demo/storagescale \\
        --storage-version 5.5.3 --storage-driver-option latency=0.002

The store lives in the process (one per URL host, ``demo`` above) and has the
URL's path (the test area) from its first client on, so every client
thread sees the same files; spawned client processes (``--storage-executor
processes``) each have their own, empty store, so only operations that create what
they use (``put``, ``mkdir``) work there.

Driver options (strings, so that they reach spawned client processes too):

- ``latency``: seconds added to every request of a load client (``0.002``);
- ``login_latency``: seconds a load client's login (``connect``, before the step's
  clock) takes;
- ``fail_every``: every N-th request of a load client fails with a
  :class:`~pytest_storagescale.errors.StorageError` of class ``injected``;
- ``hang_after``: a load client's requests are numbered from 0; number N and later
  block until the client is closed, :func:`release_hangs` is called, or the
  driver's timeout passes (then they fail with class ``timeout``);
- ``fault_operations``: the requests ``fail_every`` and ``hang_after`` count and act
  on (``stat,get``; default all of them);
- ``version``: what :meth:`~pytest_storagescale.drivers.base.Driver.version` answers
  (default ``memory``).

The same options in the URL's query (``memory://slow/storagescale?latency=0.004``)
apply to that URL's clients only, over the driver options: two stores of one session
can differ (the sides of a paired comparison, ``--storage-compare-with``).

Failures and hangs apply to load clients only, never to the session's service
connections, so a step can always be prepared and cleaned up. A test can also make a
store stall (:func:`stall`, :func:`resume`: every load request waits meanwhile) and
read its own count of the load requests it received (:func:`served_requests`).
"""

from __future__ import annotations

import posixpath
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import parse_qsl, urlsplit

from ..errors import (
    EndpointError,
    StorageError,
    StorageNotFound,
    StorageScaleUsageError,
    StorageTimeout,
)
from .base import Driver, StatInfo
from .url import EndpointURL

#: the requests a fault can be attached to
REQUESTS = ("stat", "ls", "mkdir", "put", "get", "read", "readv", "delete", "rmdir",
            "rename", "checksum", "version")
_CLIENT_PREFIX = "client-"
_N = TypeVar("_N", int, float)
_E = TypeVar("_E", bound=StorageError)


@dataclass
class _Store:
    """Files and directories of one ``memory://<store>``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    files: dict[str, bytes] = field(default_factory=dict)
    #: directory -> names of its entries
    dirs: dict[str, set[str]] = field(default_factory=lambda: {"/": set()})
    #: the load clients' requests it received (its "server counter": served_requests)
    served: int = 0
    served_lock: threading.Lock = field(default_factory=threading.Lock)
    #: cleared while the store stalls (stall/resume): load requests wait for it
    running: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.running.set()


_STORES: dict[str, _Store] = {}
_STORES_LOCK = threading.Lock()
#: release events of the requests hanging now (see release_hangs)
_HANGING: set[threading.Event] = set()
_HANGING_LOCK = threading.Lock()


def _store(name: str) -> _Store:
    with _STORES_LOCK:
        return _STORES.setdefault(name, _Store())


def clear_stores() -> None:
    """Forget every store of this process."""
    with _STORES_LOCK:
        _STORES.clear()


def served_requests(name: str) -> int:
    """How many requests of load clients the store ``name`` received (as a server's own
    counter would say), the stalled ones too."""
    return _store(name).served


def stall(name: str) -> None:
    """From now on the load clients' requests to store ``name`` wait (a server that
    stops answering) until :func:`resume`, or their driver's timeout."""
    _store(name).running.clear()


def resume(name: str) -> None:
    """End the stall of store ``name``: every waiting request goes on."""
    _store(name).running.set()


def release_hangs() -> int:
    """End every hanging request now (they fail with class ``timeout``); return how many."""
    with _HANGING_LOCK:
        hanging = list(_HANGING)
        _HANGING.clear()
    for event in hanging:
        event.set()
    return len(hanging)


@dataclass(frozen=True)
class Faults:
    """The driver options, parsed."""

    latency: float = 0.0
    login_latency: float = 0.0
    fail_every: int = 0
    hang_after: int | None = None
    requests: frozenset[str] = frozenset(REQUESTS)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Faults:
        return cls(
            latency=_number(options, "latency", float),
            login_latency=_number(options, "login_latency", float),
            fail_every=_number(options, "fail_every", int),
            hang_after=_number(options, "hang_after", int) if "hang_after" in options else None,
            requests=_requests(options.get("fault_operations")),
        )


def _number(options: Mapping[str, str], key: str, kind: type[_N]) -> _N:
    text = options.get(key, "0")
    try:
        value = kind(text)
    except ValueError:
        value = kind(-1)
    if value < 0:
        what = "a number of seconds" if kind is float else "a whole number"
        raise StorageScaleUsageError(
            f"memory driver option {key}={text!r}: must be {what}, 0 or more."
        )
    return value


def _requests(text: str | None) -> frozenset[str]:
    if text is None:
        return frozenset(REQUESTS)
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - set(REQUESTS))
    if unknown:
        raise StorageScaleUsageError(
            f"memory driver option fault_operations: unknown request "
            f"{', '.join(unknown)}. Valid: {', '.join(REQUESTS)}."
        )
    return frozenset(names)


class MemoryDriver(Driver):
    """One client of an in-process store (see the module docstring for the options)."""

    name = "memory"
    files_per_client = 0
    native_library = False  # and its store lives in this process
    schemes = ("memory",)
    option_names = ("ca_dir", "latency", "login_latency", "fail_every", "hang_after",
                    "fault_operations", "version")

    def __init__(self, endpoint, **kwargs) -> None:
        super().__init__(endpoint, **kwargs)
        self._store = _store(endpoint.host)
        with self._store.lock:  # the store's test area exists, as a real storage's does
            self._make_dirs(endpoint.path, "mkdir")
        # the URL's query (memory://slow/area?latency=0.004) adds options of its own
        # store: two stores of one session can differ (a paired comparison's sides)
        self._faults = Faults.parse({**self.options,
                                     **dict(parse_qsl(urlsplit(endpoint.url).query))})
        #: only load clients get failures and hangs
        self._load_client = self.client_id.startswith(_CLIENT_PREFIX)
        self._requests = 0
        self._release = threading.Event()

    @classmethod
    def parse_endpoint(cls, url: str) -> EndpointURL:
        parts = urlsplit(url)
        path = posixpath.normpath(parts.path or "/")
        if path == "/":
            raise EndpointError(
                f"--storage-endpoint: {url!r} has no test-area path. Write e.g. "
                f"memory://store/storagescale."
            )
        return EndpointURL(url=url, scheme="memory", host=parts.hostname or "", port=None,
                           path=path)

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        Faults.parse(options)

    @classmethod
    def client_name(cls, index: int) -> str:
        return f"{_CLIENT_PREFIX}{index}"

    def connect(self) -> None:
        if self._load_client and self._faults.login_latency:
            time.sleep(self._faults.login_latency)

    def close(self) -> None:
        self._release.set()

    # -- latency, failures, hangs ----------------------------------------------
    def _enter(self, request: str, path: str) -> None:
        faults = self._faults
        if not self._load_client:
            return  # the session's set-up and clean-up are not what a fault slows
        store = self._store
        with store.served_lock:
            store.served += 1
        if not store.running.is_set():
            store.running.wait(self.timeout)  # stalled (see stall)
        if faults.latency:
            time.sleep(faults.latency)
        if request not in faults.requests:
            return
        number = self._requests
        self._requests += 1
        if faults.hang_after is not None and number >= faults.hang_after:
            self._hang(request, path)
        if faults.fail_every and (number + 1) % faults.fail_every == 0:
            raise self._error(StorageError, f"injected failure (fail_every="
                              f"{faults.fail_every})", request, path, "injected")

    def _hang(self, request: str, path: str) -> None:
        with _HANGING_LOCK:
            _HANGING.add(self._release)
        released = self._release.wait(self.timeout)
        with _HANGING_LOCK:
            _HANGING.discard(self._release)
        why = "released" if released else f"no answer within {self.timeout:g} s"
        raise self._error(StorageTimeout, f"injected hang ({why})", request, path, "timeout")

    def _error(self, kind: type[_E], message: str, request: str, path: str,
               error_class: str) -> _E:
        return kind(message, driver=self.name, endpoint=self.endpoint.server,
                    operation=request, path=path, error_class=error_class)

    def _missing(self, request: str, path: str) -> StorageNotFound:
        return self._error(StorageNotFound, "no such file or directory", request, path,
                           "not_found")

    # -- namespace --------------------------------------------------------------
    def _stat(self, path: str) -> StatInfo:
        self._enter("stat", path)
        path = posixpath.normpath(path)
        store = self._store
        with store.lock:
            if path in store.files:
                return StatInfo(len(store.files[path]), False)
            if path in store.dirs:
                return StatInfo(0, True)
        raise self._missing("stat", path)

    def _ls(self, path: str) -> list[str]:
        self._enter("ls", path)
        with self._store.lock:
            entries = self._store.dirs.get(posixpath.normpath(path))
            if entries is not None:
                return sorted(entries)
        raise self._missing("ls", path)

    def _mkdir(self, path: str) -> None:
        self._enter("mkdir", path)
        with self._store.lock:
            self._make_dirs(posixpath.normpath(path), "mkdir")

    def _mkdir_exclusive(self, path: str) -> None:
        self._enter("mkdir", path)
        path = posixpath.normpath(path)
        store = self._store
        with store.lock:
            parent, name = posixpath.split(path)
            if parent not in store.dirs:
                raise self._missing("mkdir", parent)
            if path in store.dirs or path in store.files:
                raise self._error(StorageError, "file exists", "mkdir", path, "exists")
            store.dirs[parent].add(name)
            store.dirs[path] = set()

    def _make_dirs(self, path: str, request: str) -> None:
        """``mkdir -p`` (the store's lock held)."""
        store = self._store
        if path in store.files:
            raise self._error(StorageError, "a file is in the way", request, path, "exists")
        if path in store.dirs:
            return
        parent, name = posixpath.split(path)
        self._make_dirs(parent, request)
        store.dirs[parent].add(name)
        store.dirs[path] = set()

    def _delete(self, path: str) -> None:
        self._enter("delete", path)
        path = posixpath.normpath(path)
        store = self._store
        with store.lock:
            if store.files.pop(path, None) is not None:
                parent, name = posixpath.split(path)
                store.dirs[parent].discard(name)
                return
        raise self._missing("delete", path)

    def _rmdir(self, path: str) -> None:
        self._enter("rmdir", path)
        path = posixpath.normpath(path)
        store = self._store
        with store.lock:
            entries = store.dirs.get(path)
            if entries:
                raise self._error(StorageError, "directory not empty", "rmdir", path,
                                  "not_empty")
            if entries is not None and path != "/":
                del store.dirs[path]
                parent, name = posixpath.split(path)
                store.dirs[parent].discard(name)
                return
        raise self._missing("rmdir", path)

    def _rename(self, source: str, target: str) -> None:
        self._enter("rename", source)
        source, target = posixpath.normpath(source), posixpath.normpath(target)
        store = self._store
        with store.lock:
            if source not in store.files:  # files only: a step renames files
                raise self._missing("rename", source)
            data = store.files.pop(source)
            parent, name = posixpath.split(source)
            store.dirs[parent].discard(name)
            self._write(target, data, "rename")

    def _checksum(self, path: str, algorithm: str) -> str:
        if algorithm.lower() != "adler32":
            raise self._error(StorageError, f"checksum {algorithm} not supported (adler32 is)",
                              "checksum", path, "checksum_type")
        return f"{zlib.adler32(self._data('checksum', path)):08x}"

    def _version(self) -> str:
        self._enter("version", "/")
        return self.options.get("version", "memory")

    # -- data ---------------------------------------------------------------------
    def _write(self, path: str, data: bytes, request: str) -> None:
        """Create or overwrite a file, making its parents (the store's lock held)."""
        store = self._store
        if path in store.dirs:
            raise self._error(StorageError, "is a directory", request, path, "is_dir")
        parent, name = posixpath.split(path)
        self._make_dirs(parent, request)
        store.files[path] = data
        store.dirs[parent].add(name)

    def _put(self, path: str, data: bytes) -> int:
        self._enter("put", path)
        with self._store.lock:
            self._write(posixpath.normpath(path), bytes(data), "put")
        return len(data)

    def _data(self, request: str, path: str) -> bytes:
        self._enter(request, path)
        data = self._store.files.get(posixpath.normpath(path))  # one dict read: atomic
        if data is None:
            raise self._missing(request, path)
        return data

    def _get(self, path: str, local_path: str | None) -> int:
        data = self._data("get", path)
        if local_path:
            with open(local_path, "wb") as sink:
                sink.write(data)
        return len(data)

    def _read(self, path: str, offset: int, size: int) -> bytes:
        return self._data("read", path)[offset:offset + size]

    def _readv(self, path: str, chunks: list[tuple[int, int]]) -> int:
        data = self._data("readv", path)
        return sum(len(data[offset:offset + size]) for offset, size in chunks)
