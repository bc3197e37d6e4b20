"""The conformance checks through the seeds' own clients (issue 35, seed 004): ``dccp``
over the dcap door and ``globus-url-copy`` over the GridFTP door, the tools BNL's batch
jobs ran, one run per file.

They run over the load doors ``DOOR+CLIENT`` the session names, as the load steps
through these tools do::

    pytest suites/dcache --storage-embedded dcache \\
        --storage-load-doors dcap+dccp,gsiftp+globus-url-copy -k seed_clients

Each check runs the real tool (``drivers/commands.py``: one bounded process, the CA
folder and proxy by path, the loopback-only library) on files in its own directory of
the run directory. Its set-up (the directory) and its clean-up go through the door's
service connection (gfal2 over the same door; for dcap its movers, listing through
another door), removing only what the check made. What the tool cannot ask is asked
through another door of the same namespace (a checksum through one that has a checksum
request, a size through the service connection's stat), and says so.

What the tools do, checked (each test's doc says what it asserts):

- a file copied in and copied out arrives whole (size and bytes), an empty one and a
  large one too (``STORAGESCALE_LARGE_MB``, 64 by default);
- **overwrite**: ``dccp`` refuses to copy over a file dCache has ("File is readOnly",
  as its manual says: "If the final destination file exists in dCache, it won't be
  overwritten"), the old bytes kept; ``globus-url-copy`` replaces it whole;
- **checksums**: ``dccp`` computes the adler32 of what it writes and sends it with its
  close (``-c`` turns that off); ``globus-url-copy -verify-checksum -checksum-alg
  adler32`` asks the door (``CKSM``) for both ends of a copy between two GridFTP URLs;
  against a local file it cannot (its library digests a local file with OpenSSL, which
  has no adler32), and with its default, MD5, the door must answer the bytes' MD5
  (10.2.25 does; 11.2.5 answers 500: a known issue);
- a missing file is "not found"; a copy into a missing directory; ``-list``; a
  partial copy (``globus-url-copy -off/-len``, ERET; across the file's end refused by
  both releases: a known issue).

What neither tool does (delete, rename, stat, rmdir, vector reads) is skipped, saying
which tool lacks it. On a load door that is not a seed tool's (``davs``, ``dcap``
through gfal2...) the suite's conftest deselects these checks, and with no seed tool's
load door the header says so: ``--storage-load-doors all`` names each door through its
own driver only, so it runs none of them. A check named ``CHECK[DOOR+CLIENT]`` in the
thresholds file's ``[known_issues]`` runs as a strict expected failure.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from pytest_storagescale import Door, StorageError, StorageNotFound
from pytest_storagescale.conformance import folder_name

from ..conformance.checks import (
    Place,
    adler32_hex,
    call,
    check_adler32,
    expect_missing,
    fail,
    open_place,
    payload,
    release,
)
from . import seed_clients

pytestmark = pytest.mark.storagescale_system("dcache")

MiB = 1024 * 1024
#: the large-file check's size: STORAGESCALE_LARGE_MB, as the conformance checks'
LARGE_FILE_SIZE = int(os.environ.get("STORAGESCALE_LARGE_MB", "64")) * MiB

@pytest.fixture(autouse=True)
def _seed_tool(request: pytest.FixtureRequest, storage_load_door: str | None) -> None:
    """Skip, saying why, on a load door that is not a seed tool's, and a check the
    door's tool does not make."""
    tool = seed_clients.seed_tool(storage_load_door)
    if tool is None:  # the suite's conftest deselects these; a copy of the module may not
        pytest.skip(seed_clients.NO_SEED_DOOR.removeprefix("storagescale: "))
    check = request.node.originalname.removeprefix("test_")
    callspec = getattr(request.node, "callspec", None)
    check = callspec.params.get("check", check) if callspec else check
    reason = seed_clients.not_through(check, tool)
    if reason:
        pytest.skip(f"{storage_load_door} door: not applicable: {reason}")


@pytest.fixture(autouse=True)
def _known_issue(request: pytest.FixtureRequest, storage_load_door: str | None,
                 storage_known_issues: list) -> None:
    """A check named in the thresholds file's ``[known_issues]`` for its load door
    (``"md5_of_a_local_copy[gsiftp+globus-url-copy]"``) runs as a strict expected
    failure, as the conformance checks' (the suite's conftest applies a bare name)."""
    check = request.node.originalname.removeprefix("test_")
    for thresholds in storage_known_issues:
        key = f"{check}[{storage_load_door}]"
        reason = thresholds.known_issues.get(key)
        if reason is not None:
            request.applymarker(pytest.mark.xfail(strict=True, reason=(
                f"known issue of {thresholds.system} {', '.join(thresholds.versions)} "
                f"({thresholds.path} [known_issues] {key!r}): {reason}")))
            return


@dataclass
class Seed:
    """One check's place on a load door through a seed tool: the tool's client
    (``place.client``: a service connection whose ``copy_in``/``copy_out`` run the
    tool), its directory, a local folder, and a door that answers a checksum."""

    place: Place
    tool: str
    local: Path
    #: a door of the same namespace with a checksum request (the GridFTP door for
    #: globus-url-copy; for dcap, which has none, xrootd's or another)
    checksum_door: Door

    @property
    def door(self) -> Door:
        return self.place.door

    @property
    def client(self):
        return self.place.client

    def path(self, name: str) -> str:
        return self.place.path(name)

    def staged(self, name: str, data: bytes) -> str:
        """A local file holding ``data``."""
        local = self.local / name.replace("/", "_")
        local.write_bytes(data)
        return str(local)

    def copy_in(self, name: str, data: bytes, *options: str):
        """``data`` copied in as ``name`` by the tool; what it said."""
        path = self.path(name)
        return call(self.door, f"{self.tool} copy in", path, self.client.copy_in,
                    self.staged(f"in-{name}", data), path, *options)

    def copy_out(self, name: str, *options: str) -> bytes:
        """``name`` copied out by the tool to a fresh local file: its bytes."""
        path, local = self.path(name), self.local / f"out-{name.replace('/', '_')}"
        local.unlink(missing_ok=True)
        call(self.door, f"{self.tool} copy out", path, self.client.copy_out, path,
             str(local), *options)
        if not local.exists():
            fail(self.door, f"{self.tool} copy out", path, "let the tool end with status 0 "
                 "and no local file", "the file copied out")
        return local.read_bytes()

    def size(self, name: str) -> int:
        """The size the door's service connection (gfal2 over the same door) stats."""
        path = self.path(name)
        return call(self.door, "stat (service connection)", path, self.client.stat, path).size

    def check_adler32(self, name: str, data: bytes) -> None:
        """The door's adler32 of ``name``, asked through :attr:`checksum_door`."""
        other = self.checksum_door
        client = other.client(f"seed-checksum-{other.name}")
        try:
            check_adler32(other, client, self.place.on(other, name), data)
        finally:
            client.close()


@pytest.fixture
def seed(storage_load, storage_load_door: str, storage_doors: dict[str, Door],
         request: pytest.FixtureRequest) -> Iterator[Seed]:
    """This check's place on the load door (``storage_load.door``: the tool's driver,
    guarded to the run's directory), made and removed through its service connection."""
    door = storage_load.door
    place = open_place(door, f"seed-{storage_load_door}",
                       f"seed-clients/{folder_name(request.node.name)}")
    call(door, "mkdir", place.folder, place.client.mkdir, place.folder)
    checksum_door = _checksum_door(storage_doors, door.scheme)
    try:
        with tempfile.TemporaryDirectory(prefix="storagescale-seed-") as local:
            yield Seed(place, seed_clients.seed_tool(storage_load_door) or "", Path(local),
                       checksum_door)
    finally:
        release(place)


def _checksum_door(doors: dict[str, Door], scheme: str) -> Door:
    """The door a checksum is asked through: the load door's own (through its own
    driver) when its protocol has a checksum request, else xrootd's, else any."""
    own = [door for door in doors.values() if door.scheme == scheme and door.has_checksum]
    rest = sorted((door for door in doors.values() if door.has_checksum),
                  key=lambda door: not door.is_xrootd)
    if not own and not rest:
        pytest.skip("no door of this storage has a checksum request")
    return (own or rest)[0]


# -- what both tools make -------------------------------------------------------------
def test_copy_in_copy_out(seed: Seed) -> None:
    """A file copied in by the tool has its size on the door, and copied out by the
    tool gives its bytes; the door's adler32 is theirs."""
    data = payload(3 * MiB + 17, seed=1)
    seed.copy_in("file.dat", data)
    if (size := seed.size("file.dat")) != len(data):
        fail(seed.door, f"{seed.tool} copy in", seed.path("file.dat"), f"keeps {size} bytes",
             f"{len(data)}")
    got = seed.copy_out("file.dat")
    if got != data:
        fail(seed.door, f"{seed.tool} copy out", seed.path("file.dat"),
             f"delivered {len(got)} bytes with adler32 {adler32_hex(got)}",
             f"{len(data)} bytes with adler32 {adler32_hex(data)}, as copied in")
    seed.check_adler32("file.dat", data)


def test_zero_byte_file(seed: Seed) -> None:
    """An empty file copied in is there with size 0, copies out as nothing, and its
    adler32 is 00000001."""
    seed.copy_in("empty.dat", b"")
    if (size := seed.size("empty.dat")) != 0:
        fail(seed.door, f"{seed.tool} copy in", seed.path("empty.dat"),
             f"keeps {size} bytes", "an empty file")
    if got := seed.copy_out("empty.dat"):
        fail(seed.door, f"{seed.tool} copy out", seed.path("empty.dat"),
             f"delivered {len(got)} bytes", "none")
    seed.check_adler32("empty.dat", b"")


def test_large_file(seed: Seed) -> None:
    """A large file (STORAGESCALE_LARGE_MB, 64 MiB by default) arrives whole both ways."""
    data = payload(LARGE_FILE_SIZE, seed=2)
    seed.copy_in("large.dat", data)
    if (size := seed.size("large.dat")) != len(data):
        fail(seed.door, f"{seed.tool} copy in", seed.path("large.dat"), f"keeps {size} bytes",
             f"{len(data)}")
    seed.check_adler32("large.dat", data)
    got = seed.copy_out("large.dat")
    if adler32_hex(got) != adler32_hex(data) or len(got) != len(data):
        fail(seed.door, f"{seed.tool} copy out", seed.path("large.dat"),
             f"delivered {len(got)} bytes with adler32 {adler32_hex(got)}",
             f"{len(data)} bytes with adler32 {adler32_hex(data)}")


def test_overwrite(seed: Seed) -> None:
    """A copy in over a file the door has. ``dccp``: refused, the old bytes kept (its
    manual: "If the final destination file exists in dCache, it won't be overwritten
    and an error code will be returned"; dCache says "File is readOnly"). ``globus-url-
    copy``: replaced, exactly the new bytes, and the door's adler32 is theirs. Both
    measured on dCache 10.2.25 and 11.2.5 (docs/drivers.md)."""
    old, new = payload(200_000, seed=4), payload(1_000, seed=5)
    seed.copy_in("file.dat", old)
    seed.check_adler32("file.dat", old)  # asked first: a cached checksum must not stay
    path = seed.path("file.dat")
    done = call(seed.door, f"{seed.tool} copy in over the file", path,
                partial(seed.client.copy_in, check=False), seed.staged("new", new), path)
    said = " ".join((done.stderr + done.stdout).decode(errors="replace").split())[-300:]
    size, got = seed.size("file.dat"), seed.copy_out("file.dat")
    if seed.tool == "dccp":
        if done.returncode == 0:
            fail(seed.door, "dccp copy in over the file", path, f"let dccp end with "
                 f"status 0 (size now {size})", "a refusal: dccp overwrites no file in dCache")
        if size != len(old) or got != old:
            fail(seed.door, "dccp copy in over the file", path, f"refused it ({said}) but "
                 f"keeps {size} bytes", f"the {len(old)} old bytes kept")
        if "readOnly" not in said:
            fail(seed.door, "dccp copy in over the file", path, f"refused it saying {said!r}",
                 "dCache's words 'File is readOnly', as measured on 10.2.25 and 11.2.5")
        return
    if done.returncode != 0:
        fail(seed.door, "globus-url-copy copy in over the file", path,
             f"refused it (status {done.returncode}: {said})", "the file replaced")
    if size != len(new) or got != new:
        fail(seed.door, "globus-url-copy copy in over the file", path,
             f"kept size {size} and {len(got)} bytes" + (
                 " starting with the new ones" if got.startswith(new) else ""),
             f"exactly the {len(new)} new bytes")
    seed.check_adler32("file.dat", new)


def test_checksum(seed: Seed) -> None:
    """The adler32 the tool asks for or sends agrees with the bytes and the door's.
    ``dccp`` computes the adler32 of what it writes and sends it with its close (its
    ``-d 2`` says "File checksum is: N"); with ``-c`` it sends none, and the door's
    adler32 is still the bytes' (the pool's own). ``globus-url-copy -verify-checksum
    -checksum-alg adler32`` between two URLs of the door asks the door (``CKSM
    adler32``) for both ends: both answers the bytes' adler32, and the copy whole."""
    data = payload(MiB + 3, seed=8)
    expected = adler32_hex(data)
    if seed.tool == "dccp":
        for name, options, sends in (("sent.dat", ("-d", "2"), expected),
                                     ("unsent.dat", ("-c", "-d", "2"), None)):
            done = seed.copy_in(name, data, *options)
            sent = type(seed.client).sent_checksum(done)
            if sent != sends:
                fail(seed.door, f"dccp {' '.join(options)} copy in", seed.path(name),
                     f"let dccp send the adler32 {sent}", f"{sends} (the bytes' adler32 "
                     f"with its close; none with -c)")
            seed.check_adler32(name, data)
        return
    seed.copy_in("source.dat", data)
    source, target = seed.path("source.dat"), seed.path("target.dat")
    done = call(seed.door, "globus-url-copy -verify-checksum -checksum-alg adler32",
                f"{source} -> {target}", seed.client.copy_within, source, target, "-dbg",
                "-verify-checksum", "-checksum-alg", "adler32")
    asked = type(seed.client).door_checksums(done)
    answers = sorted((path.rpartition("/")[2], answer.split()[-1]) for _, path, answer in asked)
    if answers != [("source.dat", expected), ("target.dat", expected)]:
        fail(seed.door, "CKSM adler32 (globus-url-copy -verify-checksum)", source,
             f"answered {asked}", f"213 {expected} for source.dat and target.dat")
    if seed.copy_out("target.dat") != data:
        fail(seed.door, "globus-url-copy copy out", target, "delivered other bytes",
             "the bytes copied in")


def test_missing_file_error(seed: Seed) -> None:
    """Copying out a file that was never written is 'not found' (the tool's words mapped
    as for every driver: dccp "No such file or directory", the GridFTP door's "550 File
    not found")."""
    path = seed.path("never-written.dat")
    try:
        seed.client.copy_out(path, str(seed.local / "never"))
    except StorageNotFound:
        return
    except StorageError as exc:
        did = f"answered {exc.error_class}: {exc}"
    else:
        did = "let the tool end with status 0"
    fail(seed.door, f"{seed.tool} copy out", path, did, "a 'not found' error")


def test_copy_into_a_missing_directory(seed: Seed) -> None:
    """``dccp`` into a directory that does not exist: refused, nothing made (it makes
    no directory). ``globus-url-copy``: refused too without ``-cd``; with ``-cd``
    (create destination) the missing parents are made and the file is whole."""
    data = payload(10_000, seed=9)
    staged = seed.staged("nested", data)
    plain = seed.path("missing/file.dat")
    done = call(seed.door, f"{seed.tool} copy in", plain,
                partial(seed.client.copy_in, check=False), staged, plain)
    if done.returncode == 0:
        fail(seed.door, f"{seed.tool} copy in", plain, "made the file in a missing directory "
             "without being asked to", "a refusal (the tool's manual)")
    expect_missing(seed.door, seed.client, seed.path("missing"), "the refused copy made it")
    if seed.tool == "dccp":
        return
    nested = seed.path("made/by/cd/file.dat")
    call(seed.door, "globus-url-copy -cd copy in", nested, seed.client.copy_in, staged,
         nested, "-cd")
    for folder in ("made", "made/by", "made/by/cd"):
        if not call(seed.door, "stat", seed.path(folder), seed.client.stat,
                    seed.path(folder)).is_dir:
            fail(seed.door, "stat", seed.path(folder), "called it a file",
                 "a directory made by -cd")
    if seed.copy_out("made/by/cd/file.dat") != data:
        fail(seed.door, "globus-url-copy copy out", nested, "delivered other bytes",
             "the bytes copied in")


# -- globus-url-copy only ------------------------------------------------------------
def test_ls(seed: Seed) -> None:
    """``globus-url-copy -list`` names exactly the entries made (files copied in, a
    directory made by ``-cd``)."""
    for name in ("a.dat", "b.dat", "c d.dat"):
        seed.copy_in(name, name.encode())
    seed.copy_in("sub/inside.dat", b"x", "-cd")
    names = call(seed.door, "globus-url-copy -list", seed.place.folder, seed.client.listing,
                 seed.place.folder)
    if sorted(names) != ["a.dat", "b.dat", "c d.dat", "sub"]:
        fail(seed.door, "globus-url-copy -list", seed.place.folder, f"listed {names}",
             "['a.dat', 'b.dat', 'c d.dat', 'sub']")


def test_partial_read(seed: Seed) -> None:
    """``globus-url-copy -off OFFSET -len LENGTH`` (the door's ERET) writes the file's
    bytes there into the local file, at their offset: ranges inside the file."""
    data = payload(MiB + 7, seed=6)
    seed.copy_in("file.dat", data)
    for offset, size in ((0, 100), (500_001, 4096), (len(data) - 10, 10)):
        _check_range(seed, data, offset, size)


def test_partial_read_across_the_end(seed: Seed) -> None:
    """A range across the file's end gives the bytes up to the end (as a partial read
    through every other door does). dCache 10.2.25 and 11.2.5 refuse it (thresholds'
    ``[known_issues]``; gfal2's partial reads through the same door clamp the range
    themselves)."""
    data = payload(MiB + 7, seed=6)
    seed.copy_in("file.dat", data)
    _check_range(seed, data, len(data) - 10, 100)


def _check_range(seed: Seed, data: bytes, offset: int, size: int) -> None:
    """``-off offset -len size`` gives the file's bytes there."""
    path, local = seed.path("file.dat"), seed.local / "range"
    local.unlink(missing_ok=True)
    what = f"globus-url-copy -off {offset} -len {size}"
    call(seed.door, what, path, seed.client.copy_out, path, str(local), "-off", str(offset),
         "-len", str(size))
    got = local.read_bytes()[offset:] if local.exists() else b""
    want = data[offset:offset + size]
    if got != want:
        fail(seed.door, what, path, f"gave {len(got)} bytes at the offset" + (
            " that differ" if len(got) == len(want) else ""),
            f"the file's {len(want)} bytes there")


def test_checksum_of_a_local_copy(seed: Seed) -> None:
    """``globus-url-copy -verify-checksum -checksum-alg adler32`` of a copy from a local
    file: the tool refuses before it sends anything ("Unable to use checksum algorithm
    adler32": libglobus_gass_copy digests a local file with OpenSSL's
    ``EVP_get_digestbyname``, which has no adler32), and nothing is made. Its adler32
    comparison works between two GridFTP URLs only (test_checksum)."""
    path = seed.path("adler32.dat")
    done = call(seed.door, "globus-url-copy -verify-checksum -checksum-alg adler32", path,
                partial(seed.client.copy_in, check=False),
                seed.staged("local", payload(300_001, seed=10)), path,
                "-verify-checksum", "-checksum-alg", "adler32")
    said = " ".join((done.stderr + done.stdout).decode(errors="replace").split())
    if done.returncode == 0 or "Unable to use checksum algorithm adler32" not in said:
        fail(seed.door, "globus-url-copy -verify-checksum -checksum-alg adler32", path,
             f"let the tool end with status {done.returncode} saying {said[-300:]!r}",
             "the tool's refusal 'Unable to use checksum algorithm adler32' (OpenSSL has "
             "no adler32 for the local file)")
    expect_missing(seed.door, seed.client, path, "the tool refused before sending anything")


def test_md5_of_a_local_copy(seed: Seed) -> None:
    """``globus-url-copy -verify-checksum`` with its default algorithm, MD5, of a copy
    from a local file: the door is asked ``CKSM MD5`` after the transfer and must answer
    the bytes' MD5, and the tool end with status 0. dCache 10.2.25 does; 11.2.5 answers
    "500 Operation failed due to internal error: null" (thresholds' ``[known_issues]``):
    the tool then fails every such copy, the file whole on the door (checked too)."""
    data = payload(300_001, seed=11)
    path, expected = seed.path("md5.dat"), hashlib.md5(data).hexdigest()
    done = call(seed.door, "globus-url-copy -verify-checksum", path,
                partial(seed.client.copy_in, check=False), seed.staged("local", data), path,
                "-dbg", "-verify-checksum")
    asked = type(seed.client).door_checksums(done)
    if [algorithm.upper() for algorithm, _, _ in asked] != ["MD5"]:
        fail(seed.door, "globus-url-copy -verify-checksum", path, f"was asked {asked}",
             "one CKSM MD5 (the tool's default algorithm)")
    if seed.size("md5.dat") != len(data) or seed.copy_out("md5.dat") != data:
        fail(seed.door, "globus-url-copy -verify-checksum", path, "kept other bytes",
             "the file whole (the CKSM comes after the transfer)")
    answer = asked[0][2]
    if answer.split()[-1].lower() != expected or not answer.startswith("213 "):
        fail(seed.door, "CKSM MD5", path, f"answered {answer!r} (globus-url-copy's status "
             f"{done.returncode})", f"213 {expected}, the bytes' MD5")
    if done.returncode:
        fail(seed.door, "globus-url-copy -verify-checksum", path, f"let the tool end with "
             f"status {done.returncode} after the right MD5", "status 0")


@pytest.mark.parametrize("check", seed_clients.NEITHER)
def test_not_through_the_tool(check: str) -> None:
    """A conformance check neither seed tool makes (the ``_seed_tool`` fixture skips it
    saying which tool lacks what); reached only if a tool gained it in this table."""
    pytest.fail(f"the check {check!r} is listed in NEITHER but NOT_THROUGH gives no reason "
                f"for this tool")
