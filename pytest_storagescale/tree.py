"""Write before, verify after: a seeded tree of files of known content
(``storagescale tree write`` / ``storagescale tree verify``).

A site writes the tree before an upgrade and keeps the manifest; after the upgrade
``verify`` asks the storage, through every door given, whether every file is still
there and still the same. The tree (:func:`build_tree`) is a function of its seed
(``random.Random(seed)``), its size and its number of doors: the same seed makes the
same tree, byte for byte. It holds nested directories, an empty directory, 0-byte
files, small files, larger ones (``--size``, 4 MiB by default), names with spaces and
UTF-8, a one-byte file and a searched-for one whose adler32 has two leading zero hex
digits (``00......``), and one file written through each door.

Where it writes: only into a tree folder it makes itself, exclusively, in the test
area the URL names (which must exist, as for a pytest run: :mod:`.session.area`). The
folder, ``storagescale-tree-<UTC time>-<seed>-<6 random hex digits>``, carries a marker file
(:data:`MARKER`) with the tree's id and this user's HMAC proof
(:mod:`.session.owner`), and its name never starts with the run directories' prefix,
so no pytest run's stale clean-up touches it. An existing folder is never adopted.

The manifest (JSON, :data:`FORMAT`) holds the seed, the tree (every directory with its
entries, every file with its size and its adler32 and md5 computed here) and, per
door's scheme, the checksums as the storage reported them at write time.

``verify`` gives each file and directory one outcome: ``ok``; ``missing`` (not
found); ``unreadable`` (the storage answered an error other than not found, or no
answer within the deadline); ``changed`` (its size differs, the storage's checksum
differs from the one it reported at write time, a checksum type it offered is no
longer offered, or the directory's listing lacks or adds entries); ``corrupted`` (the
size is the same but the content read back differs from the manifest's checksums:
silent corruption, never folded into another outcome). A truncated or extended file is
``changed`` (its size is compared first). Every request has the driver's deadline
(``--timeout``) and each file's work a watchdog (:func:`.drivers.watch.run_bounded`);
content is read in chunks of at most :data:`READ_CHUNK` bytes and never beyond the
manifest's size plus one byte.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import getpass
import hashlib
import json
import os
import random
import socket
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StorageError, StorageNotFound, StorageScaleUsageError
from .redact import redact_url

#: the manifest's format name; a manifest without it is not one of ours
FORMAT = "storagescale-tree/1"
#: the marker file at the top of every tree folder
MARKER = ".storagescale-tree.json"
#: every tree folder's name starts so (never the run directories' prefix)
TREE_PREFIX = "storagescale-tree-"
#: the checksum types asked of the storage and computed here
ALGORITHMS = ("adler32", "md5")
#: the larger files' total by default
DEFAULT_SIZE = 4 * 2**20
#: the most ``--size`` takes: the tree is a check, not a load (and is built in memory)
MAX_SIZE = 256 * 2**20
#: the largest read of one request
READ_CHUNK = 2**20
#: the largest marker file read
MARKER_MAX_BYTES = 64 * 1024
#: the largest manifest read
MANIFEST_MAX_BYTES = 64 * 2**20
#: the per-request deadline by default (seconds)
DEFAULT_TIMEOUT = 60.0
#: how many candidates the search for an adler32 with leading zeros tries at most
LEADING_ZERO_TRIES = 100_000
#: outcomes, worst first (a file's outcome is the worst one any door gave)
OUTCOMES = ("missing", "unreadable", "corrupted", "changed", "ok")
EXIT_OK, EXIT_BAD, EXIT_USAGE = 0, 1, 4

_DIRECTORIES = ("nested", "nested/deeper", "nested/deeper/deepest", "with space",
                "ünïcödé 目录", "ünïcödé 目录/wörter mit Leerzeichen", "empty directory",
                "large", "doors")


#: the non-ASCII parts of the tree's names and their stand-ins under ``--ascii-names``
#: (doors that take no other name: dCache 10.2.25 and 11.2.5's xrootd and GridFTP doors
#: answer each non-ASCII character as '?', docs/upgrade.md)
_ASCII_NAMES = (("ünïcödé 目录", "unicode dir"), ("wörter", "woerter"),
                ("файл ünïcode", "fajl unicode"))


def _ascii(path: str) -> str:
    for utf8, ascii_name in _ASCII_NAMES:
        path = path.replace(utf8, ascii_name)
    return path


# -- the tree -------------------------------------------------------------------
@dataclass(frozen=True)
class TreeFile:
    path: str
    data: bytes
    #: the index of the door that writes it (0: the first URL)
    door: int = 0

    @property
    def checksums(self) -> dict[str, str]:
        return local_checksums(self.data)


@dataclass
class Tree:
    seed: int
    size: int
    directories: list[str]
    files: list[TreeFile]
    #: the names' character set: "utf-8" (the default) or "ascii" (``--ascii-names``)
    names: str = "utf-8"

    def listings(self) -> dict[str, list[str]]:
        """Directory (``""``: the tree folder) -> the names in it, sorted."""
        entries: dict[str, set[str]] = {path: set() for path in ["", *self.directories]}
        for path in [*self.directories, *(f.path for f in self.files)]:
            parent, _, name = path.rpartition("/")
            entries[parent].add(name)
        entries[""].add(MARKER)
        return {path: sorted(names) for path, names in sorted(entries.items())}

    def description(self) -> dict[str, Any]:
        """What the manifest's ``tree`` holds: a function of seed, size and doors only."""
        return {"seed": self.seed, "size": self.size,
                **({"names": self.names} if self.names != "utf-8" else {}),
                "directories": self.listings(),
                "files": [{"path": f.path, "size": len(f.data), "door": f.door,
                           **f.checksums} for f in self.files]}


def local_checksums(data: bytes) -> dict[str, str]:
    """adler32 (8 hex digits, leading zeros kept) and md5 of ``data``, computed here."""
    return {"adler32": f"{zlib.adler32(data):08x}", "md5": hashlib.md5(data).hexdigest()}


def _leading_zero_adler32(rng: random.Random) -> bytes:
    """The first candidate (2-8 KiB of ``rng``'s bytes) whose adler32 starts ``00``."""
    for _ in range(LEADING_ZERO_TRIES):
        data = rng.randbytes(rng.randint(2048, 8192))
        if zlib.adler32(data) < 0x01000000:
            return data
    raise RuntimeError("no adler32 with leading zeros found")  # pragma: no cover - p~0


def build_tree(seed: int, size: int = DEFAULT_SIZE, doors: int = 1,
               ascii_names: bool = False) -> Tree:
    """The tree of ``seed``: the same arguments, the same tree, byte for byte (with
    ``ascii_names`` the same files under names of ASCII only)."""
    rng = random.Random(seed)
    files = [TreeFile("empty.dat", b""),
             TreeFile("nested/deeper/deepest/empty too.dat", b""),
             TreeFile("one byte.bin", rng.randbytes(1))]
    homes = ["", "nested", "nested/deeper", "nested/deeper/deepest", "with space",
             "ünïcödé 目录"]
    for index in range(10):
        home = rng.choice(homes)
        name = f"small-{index:02d}.bin"
        files.append(TreeFile(f"{home}/{name}".lstrip("/"), rng.randbytes(rng.randint(1, 4096))))
    words = ["alpha", "beta", "gamma", "delta", "Grüße", "naïve", "日本", "space d"]
    text = " ".join(rng.choice(words) for _ in range(400)).encode()
    files += [TreeFile("with space/a file with spaces.txt", text),
              TreeFile("ünïcödé 目录/файл ünïcode.bin", rng.randbytes(1000)),
              TreeFile("ünïcödé 目录/wörter mit Leerzeichen/noch eine Datei.txt", text[:777]),
              TreeFile("nested/adler32 leading zeros.bin", _leading_zero_adler32(rng))]
    if size:
        # one file across the read chunk's border (odd), the rest in the other
        first = min(size, READ_CHUNK + 1) if size > READ_CHUNK else size
        files.append(TreeFile("large/large-1.bin", rng.randbytes(first)))
        if size - first:
            files.append(TreeFile("large/large-2.bin", rng.randbytes(size - first)))
    for door in range(doors):
        door_rng = random.Random(f"{seed}-door-{door}")
        files.append(TreeFile(f"doors/door-{door}.bin", door_rng.randbytes(3000), door))
    if ascii_names:
        return Tree(seed, size, [_ascii(path) for path in _DIRECTORIES],
                    [TreeFile(_ascii(f.path), f.data, f.door) for f in files], "ascii")
    return Tree(seed, size, list(_DIRECTORIES), files)


def tree_digest(description: dict[str, Any]) -> str:
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


# -- the doors --------------------------------------------------------------------
@dataclass
class Door:
    """One URL of the storage: a driver bound to the tree folder."""

    url: str
    scheme: str
    area: str
    driver: Any
    display: str

    def path(self, folder: str, relative: str = "") -> str:
        base = f"{self.area.rstrip('/')}/{folder}"
        return f"{base}/{relative}" if relative else base


def _options(pairs: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise StorageScaleUsageError(
                f"storagescale tree: --driver-option {key or pair!r} is not KEY=VALUE. Write "
                f"e.g. --driver-option ca_dir=/etc/grid-security/certificates.")
        options[key.strip()] = value
    return options


def _open_doors(urls: list[str], options: dict[str, str], timeout: float,
                folder: str | None) -> list[Door]:
    """A driver per URL (a bad URL or option: one usage paragraph, before any request);
    writable only below the tree folder (None: nowhere)."""
    from .drivers.grid import configure_xrootd_client
    from .drivers.registry import driver_spec

    configure_xrootd_client()
    doors = []
    for url in urls:
        spec = driver_spec(url, options={k: v for k, v in options.items()
                                         if k in _option_names(url)})
        area = spec.endpoint.path
        writable = f"{area.rstrip('/')}/{folder}" if folder else None
        spec = driver_spec(url, options=dict(spec.options), writable_root=writable)
        doors.append(Door(url, spec.endpoint.scheme, area,
                          spec.connect("tree", timeout=timeout), redact_url(url)))
    return doors


def _option_names(url: str) -> tuple[str, ...]:
    """The option names the driver of ``url`` takes: one option list serves every door
    (``ca_dir`` for davs:// only)."""
    from .drivers.registry import scheme_driver
    from .drivers.url import split_url

    return scheme_driver(split_url(url).scheme.lower()).option_names


def _close(doors: list[Door]) -> None:
    for door in doors:
        try:
            door.driver.close()
        except Exception:  # noqa: BLE001 - best effort
            pass


def _require_area(door: Door) -> None:
    """The test area must exist and be a directory: one paragraph otherwise."""
    try:
        info = door.driver.stat(door.area)
        what = None if info.is_dir else "is not a directory"
    except StorageNotFound:
        what = "does not exist"
    except StorageError as exc:
        raise StorageScaleUsageError(
            f"storagescale tree: {door.display}: the test area {door.area} could not be "
            f"read ({exc}). Check that the storage runs and the URL and credentials are "
            f"right, then run the command again.") from None
    if what:
        raise StorageScaleUsageError(
            f"storagescale tree: {door.display}: the test area {door.area} {what}. The "
            f"tree is written only into a tree folder made inside an existing test area; "
            f"create it first: {type(door.driver).create_command(door.driver.endpoint)}")


# -- write ----------------------------------------------------------------------
def write_tree(urls: list[str], manifest: Path, seed: int, size: int,
               options: dict[str, str], timeout: float,
               out=None, ascii_names: bool = False) -> int:
    out = out or sys.stdout
    started = time.monotonic()
    if manifest.exists() or manifest.is_symlink():
        raise StorageScaleUsageError(
            f"storagescale tree write: the manifest {manifest} exists already. A manifest "
            f"is never overwritten (it may be the one a site keeps for its upgrade): give "
            f"another --manifest path, or remove that file.")
    if not manifest.parent.is_dir():
        raise StorageScaleUsageError(
            f"storagescale tree write: --manifest {manifest}: its folder "
            f"{manifest.parent} does not exist. Create it or give another path.")
    tree = build_tree(seed, size, len(urls), ascii_names)
    stamp = datetime.datetime.now(datetime.UTC)
    folder = f"{TREE_PREFIX}{stamp:%Y%m%d-%H%M%S}-{seed}-{uuid.uuid4().hex[:6]}"
    description = tree.description()
    doors = _open_doors(urls, options, timeout, folder)
    try:
        return _write_doors(doors, tree, folder, description, manifest, seed, stamp, started,
                            out)
    finally:
        _close(doors)


def _write_doors(doors: list[Door], tree: Tree, folder: str, description: dict[str, Any],
                 manifest: Path, seed: int, stamp: datetime.datetime, started: float,
                 out) -> int:
    tree_id = uuid.uuid4().hex
    first = doors[0]
    _require_area(first)
    top = first.path(folder)
    try:
        first.driver.stat(top)
        raise StorageScaleUsageError(
            f"storagescale tree write: {first.display}: {top} exists already. The "
            f"tree is written only into a folder this command makes itself, never "
            f"into an existing one: wait a second and run it again (the name carries "
            f"the time), or remove it by hand if it is yours.")
    except StorageNotFound:
        pass
    try:
        first.driver.mkdir(top, parents=False)  # exclusive: an existing path fails
    except StorageError as exc:
        raise StorageScaleUsageError(
            f"storagescale tree write: {first.display}: the tree folder {top} could not be "
            f"made ({exc}). Grant write access in the test area or give another URL.") from None
    try:
        marker = _marker_record(folder, tree_id, description)
        first.driver.put(f"{top}/{MARKER}", json.dumps(marker).encode())
        for directory in tree.directories:
            first.driver.mkdir(first.path(folder, directory))
        for item in tree.files:
            doors[item.door].driver.put(doors[item.door].path(folder, item.path), item.data)
        written = time.monotonic() - started
        reported, problems = _reported_checksums(doors, folder, tree)
    except StorageError as exc:
        print(f"ERROR: writing the tree into {first.display.rstrip('/')}/{folder} failed: "
              f"{exc}. The folder is left as it is, without a manifest: remove it by hand "
              f"and write the tree again.", file=out)
        return EXIT_BAD
    record = {"format": FORMAT, "tree_digest": tree_digest(description),
              "tree": description,
              "written": {"folder": folder, "tree_id": tree_id, "at": stamp.isoformat(),
                          "doors": [{"url": d.display, "scheme": d.scheme} for d in doors],
                          "seconds": round(written, 3)},
              "reported": reported}
    _write_exclusive(manifest, json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    elapsed = time.monotonic() - started
    offered = "; ".join(
        f"{scheme}: {', '.join(a for a in ALGORITHMS if _offered(reported[scheme], a)) or 'none'}"
        for scheme in reported)
    print(f"wrote {len(tree.files)} files ({sum(len(f.data) for f in tree.files)} bytes), "
          f"{len(tree.directories)} directories, seed {seed}, into {first.display.rstrip('/')}"
          f"/{folder} in {written:.2f} s; checksums the storage reports: {offered}; "
          f"manifest {manifest} ({elapsed:.2f} s in all)", file=out)
    for path, text in problems:
        print(f"changed  {path}: {text}", file=out)
    return EXIT_BAD if problems else EXIT_OK


def _marker_record(folder: str, tree_id: str, description: dict[str, Any]) -> dict:
    from .session.owner import signed

    return signed({"plugin": "pytest-storagescale", "tree": folder, "tree_id": tree_id,
                   "seed": description["seed"], "tree_digest": tree_digest(description),
                   "host": socket.gethostname(), "user": getpass.getuser(),
                   "written": time.time()})


def _offered(by_file: dict[str, dict[str, str | None]], algorithm: str) -> bool:
    return any(values.get(algorithm) is not None for values in by_file.values())


def _reported_checksums(doors: list[Door], folder: str, tree: Tree
                        ) -> tuple[dict[str, dict[str, dict[str, str | None]]],
                                   list[tuple[str, str]]]:
    """scheme -> file -> algorithm -> the checksum the storage reports (None: the type
    is not offered there); and the files whose reported checksum differs from the one
    computed here (a finding at write time)."""
    reported: dict[str, dict[str, dict[str, str | None]]] = {}
    problems = []
    for door in doors:
        by_file = reported.setdefault(door.scheme, {})
        for item in tree.files:
            values: dict[str, str | None] = {}
            for algorithm in ALGORITHMS:
                try:
                    values[algorithm] = door.driver.checksum(door.path(folder, item.path),
                                                             algorithm)
                except StorageError as exc:
                    if exc.error_class != "checksum_type":
                        problems.append((item.path, f"{door.display}: {algorithm}: {exc}"))
                    values[algorithm] = None
                    continue
                if values[algorithm] != item.checksums[algorithm]:
                    problems.append((item.path, f"{door.display} reports {algorithm} "
                                                f"{values[algorithm]}, the content's is "
                                                f"{item.checksums[algorithm]}"))
            by_file[item.path] = values
    return reported, problems


def _write_exclusive(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)


# -- the manifest -----------------------------------------------------------------
def load_manifest(path: Path) -> dict[str, Any]:
    """The manifest ``tree write`` wrote, checked: its tree must be the tree of its own
    seed (a manifest edited by hand, or cut short, is refused); one paragraph else."""
    def refuse(why: str) -> StorageScaleUsageError:
        return StorageScaleUsageError(
            f"storagescale tree verify: --manifest {path}: {why}. Give the manifest "
            f"'storagescale tree write' wrote for this tree (JSON, format {FORMAT}), "
            f"unchanged.")

    try:
        with open(path, "rb") as handle:
            data = handle.read(MANIFEST_MAX_BYTES + 1)
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > MANIFEST_MAX_BYTES:
        raise refuse(f"is longer than {MANIFEST_MAX_BYTES} bytes, no manifest is")
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise refuse(f"is not JSON ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise refuse(f"is not a tree manifest (no \"format\": \"{FORMAT}\")")
    try:
        tree = record["tree"]
        written = record["written"]
        seed, size = tree["seed"], tree["size"]
        doors = len(written["doors"])
        folder, tree_id = written["folder"], written["tree_id"]
        reported = record["reported"]
        if not (isinstance(seed, int) and isinstance(size, int) and 0 <= size <= MAX_SIZE
                and isinstance(folder, str) and folder.startswith(TREE_PREFIX)
                and "/" not in folder and isinstance(tree_id, str)
                and isinstance(reported, dict) and doors > 0):
            raise TypeError
    except (KeyError, TypeError):
        raise refuse("its fields are missing or of the wrong type") from None
    expected = build_tree(seed, size, doors, tree.get("names") == "ascii").description()
    if tree != expected or record.get("tree_digest") != tree_digest(expected):
        raise refuse(f"its tree is not the tree of its seed {seed} (edited or cut short)")
    return record


# -- verify -----------------------------------------------------------------------
@dataclass
class Finding:
    path: str
    outcome: str = "ok"
    notes: list[str] = field(default_factory=list)

    def worse(self, outcome: str, note: str) -> None:
        if OUTCOMES.index(outcome) < OUTCOMES.index(self.outcome):
            self.outcome = outcome
        self.notes.append(note)


def verify_tree(urls: list[str], manifest_path: Path, options: dict[str, str],
                timeout: float, verbose: bool = False, out=None) -> int:
    out = out or sys.stdout
    started = time.monotonic()
    manifest = load_manifest(manifest_path)
    tree, written = manifest["tree"], manifest["written"]
    folder = written["folder"]
    doors = _open_doors(urls, options, timeout, None)
    findings: dict[str, Finding] = {}
    try:
        for door in doors:
            _require_area(door)
        _check_marker(doors[0], folder, written["tree_id"], manifest_path)
        for door in doors:
            _verify_door(door, folder, tree, manifest["reported"], findings, timeout)
    finally:
        _close(doors)
    elapsed = time.monotonic() - started
    bad = [f for f in findings.values() if f.outcome != "ok"]
    counts = {o: sum(1 for f in findings.values() if f.outcome == o) for o in OUTCOMES}
    summary = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    print(f"verified {len(tree['files'])} files and {len(tree['directories']) - 1} directories "
          f"of {folder} (seed {tree['seed']}) through {len(doors)} door(s) "
          f"({', '.join(d.display for d in doors)}) in {elapsed:.2f} s: {summary}", file=out)
    for finding in sorted(findings.values(), key=lambda f: (OUTCOMES.index(f.outcome), f.path)):
        if finding.outcome != "ok" or verbose:
            notes = "; ".join(finding.notes)
            print(f"{finding.outcome:<10} {finding.path or '(tree folder)'}"
                  f"{': ' + notes if notes else ''}", file=out)
    return EXIT_BAD if bad else EXIT_OK


def _check_marker(door: Door, folder: str, tree_id: str, manifest: Path) -> None:
    """The tree folder's marker must name the manifest's tree: another tree's folder
    (a manifest of another tree) is bad input; a folder or marker that is gone is not
    (the files are then reported missing)."""
    try:
        data = door.driver.read(f"{door.path(folder)}/{MARKER}", 0, MARKER_MAX_BYTES)
    except StorageError:
        return  # reported below with the listing and the files
    try:
        marker = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        marker = None
    if not isinstance(marker, dict) or marker.get("tree_id") != tree_id:
        raise StorageScaleUsageError(
            f"storagescale tree verify: --manifest {manifest} is the manifest of another "
            f"tree: {door.display.rstrip('/')}/{folder}/{MARKER} names tree "
            f"{marker.get('tree_id') if isinstance(marker, dict) else 'none (not JSON)'}, "
            f"the manifest names {tree_id}. Give the manifest written with this tree.")


def _verify_door(door: Door, folder: str, tree: dict[str, Any],
                 reported: dict[str, Any], findings: dict[str, Finding],
                 timeout: float) -> None:
    from .drivers.watch import RequestWatch, run_bounded

    watch = RequestWatch(door.driver)
    at_write = reported.get(door.scheme) or {}
    # a door the tree was not written through is asked only the types the storage
    # offered through some door at write time (dCache's GridFTP door answers an md5,
    # which it never stores, with '500 ... internal error: null', not 'not offered')
    offered = {algorithm for by_file in reported.values() for values in by_file.values()
               for algorithm, value in (values or {}).items() if value is not None}
    deadline = timeout + 5.0
    for directory, names in tree["directories"].items():
        finding = findings.setdefault(directory + "/" if directory else "", Finding(
            directory + "/" if directory else ""))
        try:
            listed: list[str] = run_bounded(
                functools.partial(door.driver.ls, door.path(folder, directory)),
                watch, deadline, "tree listing")
        except StorageNotFound:
            finding.worse("missing", f"{door.scheme}: not found")
            continue
        except StorageError as exc:
            finding.worse("unreadable", f"{door.scheme}: {exc}")
            continue
        lacking = sorted(set(names) - set(listed))
        extra = sorted(set(listed) - set(names))
        if lacking or extra:
            finding.worse("changed", f"{door.scheme}: listing "
                          + ", ".join([*(f"lacks {n!r}" for n in lacking),
                                       *(f"adds {n!r}" for n in extra)]))
    for entry in tree["files"]:
        path = entry["path"]
        finding = findings.setdefault(path, Finding(path))
        try:
            run_bounded(functools.partial(
                _verify_file, door, door.path(folder, path), entry,
                at_write.get(path) or {}, finding,
                ALGORITHMS if at_write else tuple(a for a in ALGORITHMS if a in offered)),
                watch, deadline, "tree verify")
        except StorageError as exc:  # the watchdog: a request without an answer
            finding.worse("unreadable", f"{door.scheme}: {exc}")


def _verify_file(door: Door, path: str, entry: dict[str, Any],
                 at_write: dict[str, str | None], finding: Finding,
                 asked: tuple[str, ...] = ALGORITHMS) -> None:
    scheme = door.scheme
    try:
        info = door.driver.stat(path)
    except StorageNotFound:
        finding.worse("missing", f"{scheme}: not found")
        return
    except StorageError as exc:
        finding.worse("unreadable", f"{scheme}: stat: {exc}")
        return
    if info.is_dir:
        finding.worse("changed", f"{scheme}: is a directory now")
        return
    if info.size != entry["size"]:
        finding.worse("changed", f"{scheme}: size {info.size}, was {entry['size']}")
        return
    try:
        length, local = _read_back(door, path, entry["size"])
    except StorageError as exc:
        finding.worse("unreadable", f"{scheme}: read: {exc}")
        return
    if length != entry["size"] or any(local[a] != entry[a] for a in ALGORITHMS):
        finding.worse("corrupted", f"{scheme}: content read back ({length} bytes, "
                                   f"adler32 {local['adler32']}) differs from the tree's "
                                   f"(adler32 {entry['adler32']})")
    for algorithm in asked:
        _compare_checksum(door, path, algorithm, entry[algorithm], at_write, finding)


def _compare_checksum(door: Door, path: str, algorithm: str, content: str,
                      at_write: dict[str, str | None], finding: Finding) -> None:
    """The checksum the storage reports now against the one it reported at write time
    (a door the tree was not written through: against the content's)."""
    scheme = door.scheme
    before = at_write.get(algorithm)
    try:
        now: str | None = door.driver.checksum(path, algorithm)
    except StorageError as exc:
        if exc.error_class != "checksum_type":
            finding.worse("unreadable", f"{scheme}: {algorithm}: {exc}")
            return
        now = None
    if now == before:
        return
    if before is None and at_write:
        return  # a type offered now that was not at write time: nothing was lost
    if before is None:  # a door the tree was not written through
        if now is not None and now != content:
            finding.worse("changed", f"{scheme}: {algorithm} {now}, the content's is {content}")
    elif now is None:
        finding.worse("changed", f"{scheme}: {algorithm} no longer offered (was {before})")
    else:
        finding.worse("changed", f"{scheme}: {algorithm} {now}, was {before}")


def _read_back(door: Door, path: str, size: int) -> tuple[int, dict[str, str]]:
    """The length and checksums of the content read back, in reads of at most
    :data:`READ_CHUNK` bytes, never beyond ``size`` + 1 bytes (one more than expected
    shows a file that grew between the stat and the read)."""
    adler, md5, offset = 1, hashlib.md5(), 0
    while offset <= size:
        want = min(READ_CHUNK, size + 1 - offset)
        chunk = door.driver.read(path, offset, want)[:want]
        if not chunk:
            break
        adler, offset = zlib.adler32(chunk, adler), offset + len(chunk)
        md5.update(chunk)
        if len(chunk) < want:
            break
    return offset, {"adler32": f"{adler:08x}", "md5": md5.hexdigest()}


# -- the command line -------------------------------------------------------------
def add_parser(commands: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """``storagescale tree write|verify`` under the ``storagescale`` command."""
    tree = commands.add_parser(
        "tree", help="write a seeded tree of files before an upgrade, verify it after",
        description="Write a seeded tree of files of known content (write), keep its "
                    "manifest, and check after an upgrade that every file is still there "
                    "and the same through every door (verify: exit 0 when all is ok, 1 "
                    "naming each missing, changed, corrupted or unreadable file, 4 on bad "
                    "input).")
    actions = tree.add_subparsers(dest="tree_command", required=True,
                                  parser_class=parser_class)
    write = actions.add_parser(
        "write", help="write the tree into a new folder of the test area URL",
        description="Write the tree of SEED into a new folder storagescale-tree-<time>-"
                    "<seed> of the test area URL (which must exist), the first URL writing "
                    "the tree and each URL one file of its own; write the manifest FILE "
                    "(never overwritten).")
    verify = actions.add_parser(
        "verify", help="check the tree against its manifest through every URL given",
        description="Check every file and directory of the manifest's tree through each "
                    "URL (door) given: exists, size, the checksums the storage reports "
                    "against those it reported at write time, the content read back, the "
                    "directory listings.")
    for sub in (write, verify):
        sub.add_argument("urls", nargs="+", metavar="URL",
                         help="the test area, e.g. root://host:1094//data/test (several: "
                              "the doors of one storage, e.g. root:// and davs://)")
        sub.add_argument("--manifest", required=True, type=Path, metavar="FILE",
                         help="the manifest (JSON) written by write, read by verify")
        sub.add_argument("--driver-option", "-o", action="append", default=[],
                         metavar="KEY=VALUE", help="a driver option for every door that "
                         "takes it (e.g. ca_dir=DIR, x509_proxy=FILE)")
        sub.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                         help=f"deadline of every request (default {DEFAULT_TIMEOUT:g})")
    write.add_argument("--seed", type=int, default=1, help="the tree's seed (default 1)")
    write.add_argument("--size", default=str(DEFAULT_SIZE), metavar="BYTES",
                       help="the larger files' total, e.g. 4MiB (the default), 100MB")
    write.add_argument("--ascii-names", action="store_true",
                       help="the same files under names of ASCII only (for doors that take "
                            "no other: dCache's xrootd and GridFTP doors)")
    verify.add_argument("--verbose", "-v", action="store_true",
                        help="also list the files and directories found ok")
    tree.set_defaults(handler=tree_command)


def tree_command(arguments: argparse.Namespace) -> int:
    try:
        return _tree_command(arguments)
    except KeyboardInterrupt:
        print("storagescale tree: interrupted (Ctrl-C): nothing more was asked of the "
              "storage; a tree being written is left as it is, without a manifest, and a "
              "verify gave no verdict.", file=sys.stderr)
        return 130


def _tree_command(arguments: argparse.Namespace) -> int:
    from .units import parse_byte_size

    if not 0 < arguments.timeout <= 3600:
        raise StorageScaleUsageError(
            f"storagescale tree: --timeout {arguments.timeout:g} must be above 0 and at most "
            f"3600 seconds, e.g. --timeout 60.")
    options = _options(arguments.driver_option)
    if arguments.tree_command == "write":
        size = parse_byte_size(arguments.size, what="storagescale tree write --size")
        if size > MAX_SIZE:
            raise StorageScaleUsageError(
                f"storagescale tree write --size {arguments.size}: at most {MAX_SIZE} bytes "
                f"(256 MiB; the tree is built in memory): the tree is a check, not a load. "
                f"Write e.g. --size 100MB.")
        if not 0 <= arguments.seed < 2**63:
            raise StorageScaleUsageError(
                f"storagescale tree write --seed {arguments.seed}: give a number from 0 to "
                f"2**63-1, e.g. --seed 1.")
        return write_tree(arguments.urls, arguments.manifest, arguments.seed, size,
                          options, arguments.timeout, ascii_names=arguments.ascii_names)
    return verify_tree(arguments.urls, arguments.manifest, options, arguments.timeout,
                       arguments.verbose)
