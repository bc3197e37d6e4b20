"""The shared functional checks, as abstract test classes (fsspec's
``fsspec/tests/abstract`` pattern): a suite subclasses them and pytest collects the
checks under the suite's name, with the suite's markers and thresholds::

    from ..conformance import ConformanceChecks

    class TestXRootDConformance(ConformanceChecks):
        pass

Each check is one test, parametrized by door (``test_rename[davs]``), working in
its own directory of the run directory (parallel-safe under xdist). A failure says
which door, which operation on which path, what the storage did and what was
expected. A check listed in the thresholds file's ``[known_issues]`` for the
storage's version runs as a strict expected failure (see :class:`KnownIssues`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import pytest

from pytest_storagescale import (
    CreatedPaths,
    Driver,
    StorageCheckFailure,
    StorageError,
    StorageNotFound,
    StorageTimeout,
    ThresholdSet,
    storage_view,
)
from pytest_storagescale.conformance import checksum_hint, folder_name, remove_folder

from .doors import Door
from .vector import vector_read

MiB = 1024 * 1024
#: how long a killed upload may take to disappear (a POSC file, a staged upload)
POSC_WAIT_S = 10.0
#: rewrites tried until one falls in the same second as the file's first write
OVERWRITE_TRIES = 10


def payload(size: int, seed: int = 0) -> bytes:
    """``size`` bytes that differ at every offset of a chunk (a shifted read shows)."""
    block = bytes((i * 7 + seed) % 251 for i in range(251 * 4))
    return (block * (size // len(block) + 1))[:size]


def fail(door: Door, operation: str, path: str, did: str, expected: str) -> NoReturn:
    """Fail the check: door, operation, path, what the storage did, what was expected
    (a :class:`StorageCheckFailure`: Allure files it with the storage errors)."""
    raise StorageCheckFailure(f"{door.name} door ({door.display}): {operation} {path}: the "
                              f"storage {did}; expected {expected}.")


def call(door: Door, operation: str, path: str, function: Callable[..., Any], *args) -> Any:
    """``function(*args)``; a storage error fails the check naming what was asked."""
    try:
        return function(*args)
    except StorageTimeout as exc:
        did = f"gave no answer within the deadline: {exc}"
    except StorageError as exc:
        hint = checksum_hint(exc)  # a missing xrootd.chksum, most often
        did = f"answered an error: {exc}" + (f" (hint: {hint})" if hint else "")
    fail(door, operation, path, did, "success")


def expect_missing(door: Door, client: Driver, path: str, why: str) -> None:
    """``path`` is not there: ``stat`` answers *not found*."""
    try:
        info = client.stat(path)
    except StorageNotFound:
        return
    except StorageError as exc:
        did = f"answered {exc.error_class}: {exc}"
    else:
        did = f"still shows it (size {info.size}, {'directory' if info.is_dir else 'file'})"
    fail(door, "stat", path, did, f"'not found' ({why})")


def adler32_hex(data: bytes) -> str:
    return f"{zlib.adler32(data):08x}"


def _check_access(door: Door, path: str, info) -> None:
    """The permissions a door's stat reports for a file this run wrote (None: not
    reported by the protocol)."""
    refused = [what for what, allowed in (("read", info.readable), ("write", info.writable))
               if allowed is False]
    if refused:
        fail(door, "stat", path, f"says this login may not {' or '.join(refused)} the file "
             f"it has just written", "readable and writable")


def check_adler32(door: Door, client: Driver, path: str, data: bytes) -> None:
    """The server's adler32 is the bytes' adler32, as 8 hex digits in network order.
    A door whose protocol has no checksum request (dcap) is not asked: its checks
    compare the bytes read back, and the cross-door check asks the other doors for the
    adler32 of what it wrote."""
    if not door.has_checksum:
        return
    expected = adler32_hex(data)
    answer = call(door, "checksum adler32", path, client.checksum, path, "adler32")
    if answer == expected:
        return
    swapped = zlib.adler32(data).to_bytes(4, "big")[::-1].hex()
    if answer.zfill(8) == swapped:
        fail(door, "checksum adler32", path, f"answered {answer}, which is the adler32 "
             f"with its bytes reversed (little-endian)", f"{expected} (big-endian hex)")
    if answer.zfill(8) == expected:
        fail(door, "checksum adler32", path, f"answered {answer!r}, not zero-padded to 8 "
             f"hex digits", f"{expected!r}")
    fail(door, "checksum adler32", path, f"answered {answer!r}", f"{expected}, the adler32 "
         f"of the {len(data)} bytes written")


@dataclass
class Place:
    """Where one check works: a door, a client of it and the check's own directory."""

    door: Door
    client: Driver
    #: the check's directory relative to the run directory (the same on every door)
    relative: str

    @property
    def folder(self) -> str:
        return self.door.path(self.relative)

    def path(self, name: str) -> str:
        return f"{self.folder}/{name}"

    def on(self, other: Door, name: str) -> str:
        """``name`` in this check's directory as ``other`` names it."""
        return other.path(self.relative, name)

    def put(self, name: str, data: bytes) -> str:
        """Upload ``data``; the size the storage then reports must be its length (XrdHttp
        5.5.3 on a nearly full disk answered 200 to a PUT and kept part of it)."""
        path = self.path(name)
        written = call(self.door, "put", path, self.client.put, path, data)
        if written != len(data):
            fail(self.door, "put", path, f"took {written} bytes", f"{len(data)}")
        kept = call(self.door, "stat", path, self.client.stat, path).size
        if kept != len(data):
            fail(self.door, "put", path, f"accepted the upload but keeps {kept} bytes "
                 f"(stat after the put)", f"{len(data)}")
        return path

    def made(self, path: str, size: int | None = None) -> None:
        """Record ``path`` as this run's, written by another process or by the storage
        (a third-party copy), so that :func:`release` removes it."""
        if self.client.created is not None:
            self.client.created.add(path, "file", size)

    def read_all(self, client: Driver, door: Door, path: str) -> bytes:
        """The whole file, fetched with ``get`` (a plain read of the whole object)."""
        with tempfile.TemporaryDirectory(prefix="storagescale-conformance-") as local:
            target = os.path.join(local, "copy")
            call(door, "get", path, client.get, path, target)
            with open(target, "rb") as copy:
                return copy.read()


def open_place(door: Door, client_name: str, relative: str) -> Place:
    """A new client of ``door`` that records what it makes (``Driver.created``), for a
    check working in ``relative`` (not made here)."""
    client = door.client(client_name)
    client.created = CreatedPaths(door.path(relative))
    return Place(door, client, relative)


def release(place: Place) -> None:
    """Remove what the check made in its directory, then the directory, and close its
    client. What is left (not made by the check, or changed since) or a failed removal
    is not the check's subject: its verdict stands, a warning names it, and the run
    directory's removal at the end of the run names what is still there."""
    try:
        if place.client.created is None:
            place.client.created = CreatedPaths(place.folder)
        remove_folder(place.client, place.folder, who=f"{place.door.name} door")
    finally:
        place.client.close()


class KnownIssues:
    """A check named in the thresholds file's ``[known_issues]`` (``"readv_repeated_chunk"``
    or, for one door, ``"readv_repeated_chunk[root]"``) runs as a *strict* expected failure:
    it still runs and reports XFAIL with the file's reason; when the storage passes it
    (an upgrade fixed it) the test fails as ``[XPASS(strict)]`` saying it now passes, so
    the entry is removed before it can hide a later regression."""

    @pytest.fixture(autouse=True)
    def _known_issue(self, request: pytest.FixtureRequest,
                     storage_known_issues: list[ThresholdSet]) -> None:
        check = request.function.__name__.removeprefix("test_")
        callspec = getattr(request.node, "callspec", None)
        door = callspec.params.get("door_name") if callspec else None
        for thresholds in storage_known_issues:
            reason = thresholds.known_issue(check, door)
            if reason is None:
                continue
            key = f"{check}[{door}]" if f"{check}[{door}]" in thresholds.known_issues else check
            request.applymarker(pytest.mark.xfail(strict=True, reason=(
                f"known issue of {thresholds.system} {', '.join(thresholds.versions)} "
                f"({thresholds.path} [known_issues] {key!r}): {reason}")))
            return


class ConformanceChecks(KnownIssues):
    """Base: parametrizes ``door_name`` by the storage's doors; fixtures ``door``,
    ``place`` (a client and a fresh directory of its own, removed after the check)."""

    #: the large-file check's size (a suite may lower it)
    large_file_size = 64 * MiB

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "door_name" in metafunc.fixturenames:
            names = storage_view(metafunc.config).door_names
            metafunc.parametrize("door_name", names, ids=names)

    @pytest.fixture
    def door(self, door_name: str, storage_doors: dict[str, Door]) -> Door:
        return storage_doors[door_name]

    @pytest.fixture
    def place(self, door: Door, request: pytest.FixtureRequest):
        place = open_place(door, f"conformance-{door.name}",
                           f"conformance/{folder_name(request.node.name)}")
        call(door, "mkdir", place.folder, place.client.mkdir, place.folder)
        yield place
        release(place)


class NamespaceChecks(ConformanceChecks):
    """stat, ls, mkdir/rmdir, rename, delete and the errors for a missing file and a
    directory that is not empty."""

    def test_stat_fields(self, place: Place, storage_doors: dict[str, Door]) -> None:
        """Size, type and modification time of a file and a directory, through every
        door, agree with what was written and with each other; a door whose stat says
        what the login may do (root://: readable, writable) says the writer may read
        and write the file it just wrote."""
        data = payload(12_345)
        started = time.time()
        place.put("file", data)
        seen = {}
        for other in storage_doors.values():
            client = other.client(f"conformance-{other.name}")
            try:
                path, folder = place.on(other, "file"), other.path(place.relative)
                info = call(other, "stat", path, client.stat, path)
                if info.size != len(data) or info.is_dir:
                    fail(other, "stat", path, f"answered size {info.size}, "
                         f"{'directory' if info.is_dir else 'file'}",
                         f"a file of {len(data)} bytes")
                if not call(other, "stat", folder, client.stat, folder).is_dir:
                    fail(other, "stat", folder, "called it a file", "a directory")
                _check_access(other, path, info)
                seen[other.name] = info.modified
            finally:
                client.close()
        _check_mtimes(place, seen, started)

    def test_ls(self, place: Place, storage_doors: dict[str, Door]) -> None:
        """A listing names exactly the entries made, through every door that lists (not
        dcap: :attr:`Door.has_listing`)."""
        for name in ("a.dat", "b.dat", "c d.dat"):
            place.put(name, name.encode())
        call(place.door, "mkdir", place.path("sub"), place.client.mkdir, place.path("sub"))
        expected = ["a.dat", "b.dat", "c d.dat", "sub"]
        for other in (door for door in storage_doors.values() if door.has_listing):
            client = other.client(f"conformance-{other.name}")
            try:
                folder = other.path(place.relative)
                names = sorted(call(other, "ls", folder, client.ls, folder))
            finally:
                client.close()
            if names != expected:
                fail(other, "ls", folder, f"listed {names}", f"{expected}")

    def test_mkdir_rmdir(self, place: Place) -> None:
        """mkdir makes missing parents; rmdir removes an empty directory."""
        inner = place.path("a/b")
        call(place.door, "mkdir", inner, place.client.mkdir, inner)
        for path in (place.path("a"), inner):
            if not call(place.door, "stat", path, place.client.stat, path).is_dir:
                fail(place.door, "stat", path, "called it a file", "a directory made by mkdir")
        call(place.door, "rmdir", inner, place.client.rmdir, inner)
        expect_missing(place.door, place.client, inner, "rmdir removed it")
        call(place.door, "rmdir", place.path("a"), place.client.rmdir, place.path("a"))
        expect_missing(place.door, place.client, place.path("a"), "rmdir removed it")

    def test_rename(self, place: Place) -> None:
        """A renamed file has its bytes at the new name and is gone from the old one."""
        data = payload(70_001, seed=3)
        old = place.put("old.dat", data)
        new = place.path("new.dat")
        call(place.door, "rename", f"{old} -> {new}", place.client.rename, old, new)
        expect_missing(place.door, place.client, old, "it was renamed")
        got = place.read_all(place.client, place.door, new)
        if got != data:
            fail(place.door, "read", new, f"gave {len(got)} bytes that differ from the "
                 f"renamed file's", f"the {len(data)} bytes written before the rename")

    def test_delete(self, place: Place) -> None:
        """A deleted file is gone from stat and from the listing."""
        path = place.put("gone.dat", b"x" * 100)
        call(place.door, "delete", path, place.client.delete, path)
        expect_missing(place.door, place.client, path, "it was deleted")
        if not place.door.has_listing:  # dcap: stat alone
            return
        names = call(place.door, "ls", place.folder, place.client.ls, place.folder)
        if "gone.dat" in names:
            fail(place.door, "ls", place.folder, f"still lists the deleted file: {names}",
                 "no gone.dat")

    def test_missing_file_error(self, place: Place) -> None:
        """stat, read and delete of a missing file answer 'not found', nothing else."""
        path = place.path("never-written.dat")
        for operation, function, args in (
            ("stat", place.client.stat, (path,)),
            ("read", place.client.read, (path, 0, 10)),
            ("delete", place.client.delete, (path,)),
        ):
            try:
                answer = function(*args)
            except StorageNotFound:
                continue
            except StorageError as exc:
                did = f"answered {exc.error_class}: {exc}"
            else:
                did = f"succeeded ({answer!r:.60})"
            fail(place.door, operation, path, did,
                 "a 'not found' error (ENOENT, kXR_NotFound, HTTP 404) for a file that was "
                 "never written")

    def test_rmdir_not_empty_error(self, place: Place) -> None:
        """rmdir of a directory with a file in it is refused as 'not empty' and keeps
        both."""
        folder = place.path("full")
        call(place.door, "mkdir", folder, place.client.mkdir, folder)
        place.put("full/inside.dat", b"keep me")
        try:
            place.client.rmdir(folder)
        except StorageError as exc:
            did = "" if Driver._not_empty(exc) else f"refused it with {exc.error_class}: {exc}"
        else:
            did = "removed a directory holding a file"
        if did:
            fail(place.door, "rmdir", folder, did,
                 "a 'directory not empty' error (ENOTEMPTY, kXR_NotEmpty 3005, HTTP 409)")
        inside = place.path("full/inside.dat")
        if call(place.door, "stat", inside, place.client.stat, inside).size != 7:
            fail(place.door, "stat", inside, "lost the file's bytes after the refused rmdir",
                 "the file kept")


def _check_mtimes(place: Place, seen: dict[str, float | None], started: float) -> None:
    """Every door tells the same modification time, close to when the file was written
    (on the storage's clock: a clock off by more than an hour is reported too)."""
    known = {name: when for name, when in seen.items() if when is not None}
    if not known:
        return
    if max(known.values()) - min(known.values()) > 1.0:
        fail(place.door, "stat (modification time)", place.path("file"),
             f"told different times through its doors: {known}",
             "the same time (within 1 s) through every door")
    when = next(iter(known.values()))
    if abs(when - started) > 3600:
        fail(place.door, "stat (modification time)", place.path("file"),
             f"answered {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(when))} UTC for a file "
             f"written at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(started))} UTC",
             "the time of the write (within an hour: check the storage's clock)")


class DataChecks(ConformanceChecks):
    """put/get with adler32 at both ends, zero-byte, large and overwritten files,
    partial reads."""

    def test_put_get_checksum(self, place: Place, tmp_path) -> None:
        """The bytes read back and the server's adler32 equal the writer's adler32
        (in network byte order, as 8 hex digits)."""
        data = payload(3 * MiB + 17, seed=1)
        path = place.put("file.dat", data)
        check_adler32(place.door, place.client, path, data)
        local = tmp_path / "copy.dat"
        got = call(place.door, "get", path, place.client.get, path, str(local))
        received = local.read_bytes()
        if got != len(data) or adler32_hex(received) != adler32_hex(data):
            fail(place.door, "get", path, f"delivered {len(received)} bytes with adler32 "
                 f"{adler32_hex(received)}", f"{len(data)} bytes with adler32 "
                 f"{adler32_hex(data)}, as written")

    def test_zero_byte_file(self, place: Place, storage_doors: dict[str, Door]) -> None:
        """An empty file exists with size 0, reads as nothing, and has adler32 00000001."""
        path = place.put("empty.dat", b"")
        info = call(place.door, "stat", path, place.client.stat, path)
        if info.size != 0 or info.is_dir:
            fail(place.door, "stat", path, f"answered size {info.size}", "an empty file")
        got = place.read_all(place.client, place.door, path)
        if got:
            fail(place.door, "read", path, f"gave {len(got)} bytes", "none")
        check_adler32(place.door, place.client, path, b"")

    def test_large_file(self, place: Place, tmp_path) -> None:
        """A large file (64 MiB by default) arrives whole: size and adler32 at both ends."""
        data = payload(self.large_file_size, seed=2)
        path = place.put("large.dat", data)
        info = call(place.door, "stat", path, place.client.stat, path)
        if info.size != len(data):
            fail(place.door, "stat", path, f"answered size {info.size}", f"{len(data)}")
        check_adler32(place.door, place.client, path, data)
        local = tmp_path / "large.dat"
        call(place.door, "get", path, place.client.get, path, str(local))
        received = local.read_bytes()
        if adler32_hex(received) != adler32_hex(data):
            fail(place.door, "get", path, f"delivered {len(received)} bytes with adler32 "
                 f"{adler32_hex(received)}", f"{len(data)} bytes with adler32 "
                 f"{adler32_hex(data)}")

    def test_overwrite(self, place: Place) -> None:
        """Writing a shorter file over a longer one whose adler32 was asked for leaves
        exactly the new bytes, and the server's adler32 is the new bytes' one, also
        when the rewrite falls in the same second as the first write (the resolution
        of the modification time many servers key cached checksums to)."""
        for attempt in range(OVERWRITE_TRIES):  # until a rewrite lands in the same second
            old, new = payload(200_000, seed=4 + attempt), payload(1_000, seed=5 + attempt)
            path = place.put("file.dat", old)
            check_adler32(place.door, place.client, path, old)
            first = call(place.door, "stat", path, place.client.stat, path).modified
            place.put("file.dat", new)
            info = call(place.door, "stat", path, place.client.stat, path)
            got = place.read_all(place.client, place.door, path)
            if info.size != len(new) or got != new:
                fail(place.door, "put over an existing file", path,
                     f"kept size {info.size} and {len(got)} bytes" + (
                         " starting with the new ones" if got.startswith(new) else ""),
                     f"exactly the {len(new)} new bytes")
            check_adler32(place.door, place.client, path, new)
            if info.modified == first or first is None:
                return
        pytest.skip(f"{place.door.name} door: no rewrite of {place.path('file.dat')} fell in "
                    f"the second of its first write in {OVERWRITE_TRIES} tries (a slow "
                    f"storage or client): the same-second case was not exercised")

    def test_partial_read(self, place: Place) -> None:
        """Reads at offsets give those bytes; a read across the end is short; at the
        end, empty."""
        data = payload(MiB + 7, seed=6)
        path = place.put("file.dat", data)
        for offset, size in ((0, 100), (500_001, 4096), (len(data) - 10, 10),
                             (len(data) - 10, 100), (len(data), 10)):
            got = call(place.door, f"read {size} bytes at {offset}", path,
                       place.client.read, path, offset, size)
            want = data[offset:offset + size]
            if got != want:
                fail(place.door, f"read {size} bytes at {offset}", path,
                     f"gave {len(got)} bytes" + (" that differ" if len(got) == len(want)
                                                 else ""),
                     f"the file's {len(want)} bytes there")


class VectorReadChecks(ConformanceChecks):
    """Vector reads (XRootD ``kXR_readv``, an HTTP multi-range GET): each chunk's bytes
    checked against the file."""

    def _check(self, place: Place, chunks: list[tuple[int, int]], size: int = MiB) -> None:
        data = payload(size, seed=7)
        path = place.put("file.dat", data)
        what = f"vector read of {chunks}"
        try:
            got = vector_read(place.door, path, chunks)
        except StorageError as exc:
            got, error = [], f"answered an error: {exc.message} [{exc.native_status}]"
        else:
            error = ""
        if error:
            fail(place.door, what, path, error, "every chunk's bytes")
        if len(got) != len(chunks):
            fail(place.door, what, path, f"answered {len(got)} chunks", f"{len(chunks)}")
        for (offset, length), answer in zip(chunks, got, strict=True):
            if answer != data[offset:offset + length]:
                fail(place.door, what, path, f"gave {len(answer)} bytes for the chunk at "
                     f"{offset} that are not the file's", f"{length} bytes of the file")

    def test_readv_distinct(self, place: Place) -> None:
        """Separate chunks, first, middle and last, in one request."""
        self._check(place, [(0, 100), (4096, 1000), (300_000, 65_536), (MiB - 50, 50)])

    def test_readv_overlapping(self, place: Place) -> None:
        """Chunks that overlap in part."""
        self._check(place, [(0, 1000), (500, 1000), (1200, 10)])

    def test_readv_repeated_chunk(self, place: Place) -> None:
        """The same chunk named twice in one request."""
        self._check(place, [(0, 100), (0, 100)])


class CrossDoorChecks(ConformanceChecks):
    """Written through one door, identical through every other."""

    def test_cross_door_read(self, place: Place, storage_doors: dict[str, Door]) -> None:
        """Size, bytes and adler32 of a file written through this door are the same
        through every door."""
        data = payload(2 * MiB + 3, seed=8)
        place.put("shared.dat", data)
        for other in storage_doors.values():
            client = other.client(f"conformance-{other.name}")
            path = place.on(other, "shared.dat")
            try:
                size = call(other, "stat", path, client.stat, path).size
                got = place.read_all(client, other, path)
                if size != len(data) or got != data:
                    fail(other, "read", path, f"gave {len(got)} bytes (stat: {size}) that "
                         f"differ from what the {place.door.name} door wrote",
                         f"the same {len(data)} bytes")
                check_adler32(other, client, path, data)
            finally:
                client.close()


_POSC_WRITER = r"""
import sys
from XRootD import client
from XRootD.client.flags import OpenFlags
handle = client.File()
status, _ = handle.open(sys.argv[1], OpenFlags.NEW | OpenFlags.POSC, 0o644, timeout=30)
if not status.ok:
    print("open failed:", status.message, flush=True)
    sys.exit(1)
for block in range(int(sys.argv[2])):
    status, _ = handle.write(b"p" * 1048576, block * 1048576, timeout=30)
    if not status.ok:
        print("write failed:", status.message, flush=True)
        sys.exit(1)
handle.sync(timeout=30)
print("written", flush=True)
sys.stdin.read()  # killed here, before close
"""


class PersistOnCloseChecks(ConformanceChecks):
    """Persist-on-successful-close: an upload killed half-way leaves no file."""

    #: MiB written before the writer is killed
    posc_written_mib = 4
    #: how long the file may take to disappear (s)
    posc_wait_s = POSC_WAIT_S
    #: how long the file must then stay gone (s)
    posc_settle_s = 3.0
    #: why the storage may keep it, said when it does
    posc_keeps = ("XRootD keeps a POSC file for 'ofs.persist hold' seconds, default 600, "
                  "for the writer to come back")

    def test_persist_on_close(self, place: Place) -> None:
        """A writer that opened with POSC (``kXR_posc``, what ``xrdcp --posc`` asks for)
        and is killed before closing leaves no file behind."""
        if not place.door.is_xrootd:
            # one reason for every door it skips (the test id names the door): one line
            pytest.skip("not an XRootD door: persist-on-close is asked for with the XRootD "
                        "open flag kXR_posc")
        path = place.path("killed-upload.dat")
        place.made(path)  # if the storage keeps it, the run's to remove
        place.door.client("conformance-env").close()  # the door's credentials
        url = place.door.url(path)
        writer = subprocess.Popen(
            [sys.executable, "-c", _POSC_WRITER, url, str(self.posc_written_mib)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            said = _read_line(writer, timeout=place.door.timeout)
        finally:
            writer.kill()
            writer.wait(timeout=30)
        if said != "written":
            fail(place.door, "open with POSC and write", path, f"stopped the writer: {said!r}",
                 "the writes of a POSC upload accepted")
        self._wait_for_no_file(place, path, time.monotonic())

    def _wait_for_no_file(self, place: Place, path: str, killed: float) -> None:
        """The file must be gone within ``posc_wait_s`` and stay gone for
        ``posc_settle_s``: a stat that finds nothing may come before the storage put
        the upload in place (dCache moves a POSC upload to its path after the writer
        is gone: not found at once, the whole file 0.3 s later)."""
        deadline, gone = killed + self.posc_wait_s, None
        while True:
            try:
                info = place.client.stat(path)
            except StorageNotFound:
                gone = gone if gone is not None else time.monotonic()
                if time.monotonic() - gone >= self.posc_settle_s:
                    print(f"{place.door.name} door: no file {gone - killed:.1f} s after its "
                          f"writer was killed, nor {self.posc_settle_s:.0f} s later")
                    return
            else:
                if gone is not None:
                    fail(place.door, "stat after the writer was killed", path,
                         f"found nothing {gone - killed:.1f} s after the writer was killed, "
                         f"then the file ({info.size} bytes) "
                         f"{time.monotonic() - killed:.1f} s after: it kept the upload "
                         f"({self.posc_keeps})", "no file: an upload that was not closed is "
                         "not persisted")
                if time.monotonic() > deadline:
                    break
            threading.Event().wait(0.2)
        fail(place.door, "stat after the writer was killed", path,
             f"still shows the half-written file ({info.size} bytes) {self.posc_wait_s:.0f} s "
             f"after its writer died ({self.posc_keeps})", "no file: an upload that was not closed "
             "is not persisted")


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    """The first line ``process`` prints, or what it said before ``timeout``."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()),
                              daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0].strip() if lines else f"nothing within {timeout:.0f} s"


class AllChecks(NamespaceChecks, DataChecks, VectorReadChecks, CrossDoorChecks,
                PersistOnCloseChecks):
    """Every check that needs only the storage under test."""


__all__ = [
    "AllChecks", "ConformanceChecks", "CrossDoorChecks", "DataChecks", "KnownIssues",
    "NamespaceChecks", "PersistOnCloseChecks", "VectorReadChecks",
]
