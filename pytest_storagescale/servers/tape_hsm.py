#!/usr/bin/env python3
"""A tape library as a folder: the HSM script of the embedded dCache's pools.

dCache's ``script`` nearline-storage provider runs this for every flush, stage and
removal (``hsm create osm osm script -command=... -c:puts=N -c:gets=N``, in each
pool's ``setup`` file), as a site's pools run the script of its tape system
(dCache's own ``share/lib/hsmcp.rb`` is the model; read at the 10.2.25 and 11.2.5
tags, ``ScriptNearlineStorage``):

    put    <pnfsid> <replica file> -si=<storage info> <options>   prints the URI
    get    <pnfsid> <replica file> -si=<storage info> -uri=<uri> <options>
    remove -uri=<uri> <options>

The options are the ``hsm create`` line's own (``-hsmBase=DIR -hsmType=osm
-hsmInstance=osm -drives=N -mount=S -perFile=S -dismount=S``). What it emulates of a
tape library: ``drives`` drives shared by every pool (a drive is a lock file of
``DIR/drives``: a request waits for a free one), a volume per storage class (a drive
that holds another volume, or sat idle longer than ``dismount`` seconds, mounts first:
``mount`` seconds), ``perFile`` seconds of positioning per file, then the copy into
(or out of) ``DIR/data``. Each request is a line of ``DIR/tape.log`` (JSON: what,
which file, which drive, whether it mounted, when it started and ended): what the
tests and the suite read back.

Faults (a site's tape fails in these ways; the tests and the suite check that a tape
step reports them as failures of the storage, never a pass): ``DIR/faults.json``, read
at every request, written by :meth:`~.dcache_tape.TapeControl.inject` (absent: none):
``{"put": FAULT, "get": FAULT}``, a FAULT ``{"mode": "fail" | "lost" | "hang",
"rc": N, "seconds": S, "pnfsids": [...]}``: ``fail`` the drive fails the request (exit
``rc``, 1 unless given: dCache's pool retries a flush, reports a failed stage to
PoolManager), ``lost`` (stages only) the file's tape copy cannot be read (exit ``rc``,
:data:`LOST_RC` unless given; the copy is kept: clearing the fault makes it readable
again), ``hang`` the drive
holds the request ``seconds`` (at most :data:`MAX_HANG_S`) and then fails it (a drive
stuck past dCache's or the client's deadline; dCache may kill the script before).
``pnfsids`` limits the fault to those files (absent: every file). A failed request is
a line of the log as well, with ``"error"``.

Python's standard library only (the pool's JVM runs it through the wrapper
``hsm-tape`` the embedded dCache writes beside the folder).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import time
from urllib.parse import parse_qs, urlsplit

#: the longest a request waits for a free drive (s): dCache's own deadline is longer
DRIVE_WAIT_S = 3600.0
#: the pause between looks for a free drive (s)
DRIVE_POLL_S = 0.05
#: the longest an injected hang holds a drive (s)
MAX_HANG_S = 3600.0
#: the injectable faults' modes, and the requests each applies to
FAULT_MODES = {"fail": ("put", "get"), "lost": ("get",), "hang": ("put", "get")}
#: the exit code of a request failed by an injected fault (dCache: "other" codes are
#: retried by the pool for a flush, reported to PoolManager for a stage)
FAULT_RC = 1
#: the exit code of a stage whose tape copy is gone or unreadable (``lost``, or no copy
#: in the library at all): dCache's ``CacheException.BROKEN_ON_TAPE`` ("File is broken
#: on a tape, can't be staged"), the code dCache's own nearline providers (``tar``,
#: ``filesystem``) fail such a stage with; the script provider passes an exit code on
#: as the stage's error code (``HsmRunSystem``: ``CacheException(rc, ...)``). Not 41-43:
#: for a stage those mean the pool's own disk failed (no space, read or write I/O
#: error) and the pool disables itself (``PoolV4.ReplyToPoolFetch``, 10.2.25 and 11.2.5;
#: the Book's "Summary of return codes"). No exit code ends a Tape REST request: dCache's
#: PinManager asks again every 30 s whatever the code (docs/dcache-upgrade.md)
LOST_RC = 243


class InjectedFault(Exception):
    """A request the library fails (an injected fault, or a file it does not hold):
    the exit code and the reason."""

    def __init__(self, rc: int, reason: str) -> None:
        super().__init__(reason)
        self.rc = rc


def check_fault(what: str, fault: object) -> dict:
    """A fault of ``what`` requests (``put``, ``get``) as the fault file holds it,
    checked (ValueError naming what is wrong)."""
    if not isinstance(fault, dict):
        raise ValueError(f"the {what} fault {fault!r} is no object")
    mode = fault.get("mode")
    if mode not in FAULT_MODES or what not in FAULT_MODES[mode]:
        allowed = [name for name, ops in FAULT_MODES.items() if what in ops]
        raise ValueError(f"the {what} fault's mode {mode!r}: give one of {allowed}")
    rc = fault.get("rc", LOST_RC if mode == "lost" else FAULT_RC)
    if not isinstance(rc, int) or not 1 <= rc <= 255:
        raise ValueError(f"the {what} fault's rc {rc!r}: give 1 to 255")
    seconds = fault.get("seconds", 0)
    if not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_HANG_S:
        raise ValueError(f"the {what} fault's seconds {seconds!r}: give 0 to {MAX_HANG_S:g}")
    if mode == "hang" and not seconds:
        raise ValueError(f"the {what} hang fault needs seconds (1 to {MAX_HANG_S:g})")
    pnfsids = fault.get("pnfsids")
    if pnfsids is not None and (not isinstance(pnfsids, list)
                                or not all(isinstance(one, str) for one in pnfsids)):
        raise ValueError(f"the {what} fault's pnfsids {pnfsids!r}: give a list of pnfsids")
    return {"mode": mode, "rc": rc, "seconds": float(seconds),
            **({"pnfsids": pnfsids} if pnfsids is not None else {})}


def _options(arguments: list[str]) -> tuple[list[str], dict[str, str]]:
    """Positional arguments and ``-key=value`` options (``-key`` alone: '')."""
    positional: list[str] = []
    options: dict[str, str] = {}
    for argument in arguments:
        if argument.startswith("-") and len(argument) > 1:
            key, _, value = argument[1:].partition("=")
            options.setdefault(key, value)
        else:
            positional.append(argument)
    return positional, options


def _storage_class(storage_info: str) -> str:
    """``store:group`` from the ``-si=`` storage info (``...;sClass=store:group;...``)."""
    for part in storage_info.split(";"):
        key, _, value = part.partition("=")
        if key == "sClass" and value:
            return value
    return ""


class Library:
    """The folder, its drives and its log."""

    def __init__(self, options: dict[str, str]) -> None:
        self.base = options["hsmBase"]
        self.type = options.get("hsmType", "osm")
        self.instance = options.get("hsmInstance", "osm")
        self.drives = max(1, int(options.get("drives", "1")))
        self.mount_s = float(options.get("mount", "0"))
        self.per_file_s = float(options.get("perFile", "0"))
        self.dismount_s = float(options.get("dismount", "60"))
        self.data = os.path.join(self.base, "data")
        self.faults_path = os.path.join(self.base, "faults.json")
        for folder in (self.data, os.path.join(self.base, "drives")):
            os.makedirs(folder, exist_ok=True)

    def _drive(self) -> tuple[int, int]:
        """A free drive: its number and the locked descriptor (waits for one)."""
        deadline = time.monotonic() + DRIVE_WAIT_S
        while True:
            for number in range(self.drives):
                path = os.path.join(self.base, "drives", f"{number}.lock")
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(descriptor)
                    continue
                return number, descriptor
            if time.monotonic() > deadline:
                raise TimeoutError(f"no free drive of {self.drives} within {DRIVE_WAIT_S:.0f} s")
            time.sleep(DRIVE_POLL_S)

    def fault(self, what: str, pnfsid: str) -> dict | None:
        """The injected fault of this request (None: none). A fault file that cannot
        be read or holds no valid fault fails the request: a test's fault is never
        silently ignored."""
        try:
            with open(self.faults_path) as stream:
                faults = json.load(stream)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise InjectedFault(FAULT_RC, f"the fault file {self.faults_path} is unreadable: "
                                          f"{exc}") from None
        if not isinstance(faults, dict) or faults.get(what) is None:
            return None
        try:
            fault = check_fault(what, faults[what])
        except ValueError as exc:
            raise InjectedFault(FAULT_RC, f"the fault file {self.faults_path}: {exc}") from None
        if "pnfsids" in fault and pnfsid not in fault["pnfsids"]:
            return None
        return fault

    def on_drive(self, what: str, volume: str, pnfsid: str, copy) -> None:
        """Take a drive, mount ``volume`` if it is not there, position, copy, log
        (an injected fault: the request fails on the drive, logged with its error)."""
        asked = time.time()
        fault = self.fault(what, pnfsid)
        number, descriptor = self._drive()
        try:
            state_path = os.path.join(self.base, "drives", f"{number}.json")
            try:
                with open(state_path) as stream:
                    state = json.load(stream)
            except (OSError, ValueError):
                state = {}
            started = time.time()
            mounted = (state.get("volume") != volume
                       or started - float(state.get("used", 0)) > self.dismount_s)
            if mounted:
                time.sleep(self.mount_s)
            time.sleep(self.per_file_s)
            if fault is not None:
                self._fail(what, volume, pnfsid, number, mounted, asked, started, fault)
            size = copy()
            ended = time.time()
            with open(state_path + ".new", "w") as stream:
                json.dump({"volume": volume, "used": ended}, stream)
            os.replace(state_path + ".new", state_path)
            self.log({"op": what, "pnfsid": pnfsid, "volume": volume, "drive": number,
                      "mounted": mounted, "bytes": size, "asked": asked, "started": started,
                      "ended": ended})
        finally:
            os.close(descriptor)

    def _fail(self, what: str, volume: str, pnfsid: str, drive: int, mounted: bool,
              asked: float, started: float, fault: dict) -> None:
        """Fail the request as ``fault`` says (after its hang), logged."""
        if fault["mode"] == "hang":
            time.sleep(fault["seconds"])
            reason = f"the drive hung {fault['seconds']:g} s (injected)"
        elif fault["mode"] == "lost":
            reason = f"{pnfsid}: the tape copy cannot be read (injected: lost on tape)"
        else:
            reason = f"the drive failed the {what} (injected)"
        self.log({"op": what, "pnfsid": pnfsid, "volume": volume, "drive": drive,
                  "mounted": mounted, "bytes": 0, "asked": asked, "started": started,
                  "ended": time.time(), "error": reason, "fault": fault["mode"]})
        raise InjectedFault(fault["rc"], reason)

    def log(self, record: dict) -> None:
        with open(os.path.join(self.base, "tape.log"), "a") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            log.write(json.dumps(record) + "\n")

    def put(self, pnfsid: str, replica: str, storage_info: str) -> str:
        volume = _storage_class(storage_info) or "default"
        target = os.path.join(self.data, pnfsid)

        def copy() -> int:
            shutil.copyfile(replica, target + ".part")
            os.replace(target + ".part", target)
            return os.path.getsize(target)

        self.on_drive("put", volume, pnfsid, copy)
        store, _, group = volume.partition(":")
        return f"{self.type}://{self.instance}/?store={store}&group={group}&bfid={pnfsid}"

    def _bfid(self, uri: str) -> str:
        found = parse_qs(urlsplit(uri).query).get("bfid", [""])[0]
        if not found or "/" in found or found.startswith("."):
            raise ValueError(f"no usable bfid in the URI {uri!r}")
        return found

    def get(self, pnfsid: str, replica: str, uris: list[str]) -> None:
        mine = [uri for uri in uris if uri.startswith(f"{self.type}://{self.instance}/")]
        bfid = self._bfid(mine[0]) if mine else pnfsid
        source = os.path.join(self.data, bfid)
        if not os.path.isfile(source):  # gone from the library: broken on tape
            raise InjectedFault(LOST_RC, f"{bfid} is not on the tape {self.base}")
        query = parse_qs(urlsplit(mine[0]).query) if mine else {}
        volume = ":".join((query.get("store", [""])[0], query.get("group", [""])[0]))

        def copy() -> int:
            shutil.copyfile(source, replica)
            return os.path.getsize(replica)

        self.on_drive("get", volume.strip(":") or "default", pnfsid, copy)

    def remove(self, uri: str) -> None:
        try:
            os.unlink(os.path.join(self.data, self._bfid(uri)))
        except FileNotFoundError:  # not an error: removed already (hsmcp.rb's rule)
            pass


def main(arguments: list[str]) -> int:
    positional, options = _options(arguments)
    if not positional or "hsmBase" not in options:
        print("usage: put|get <pnfsid> <file> -si=... -hsmBase=DIR [...] | remove -uri=URI "
              "-hsmBase=DIR", file=sys.stderr)
        return 4
    library = Library(options)
    command = positional[0]
    try:
        if command == "put" and len(positional) == 3:
            print(library.put(positional[1], positional[2], options.get("si", "")))
        elif command == "get" and len(positional) == 3:
            uris = [argument[len("-uri="):] for argument in arguments
                    if argument.startswith("-uri=")]
            library.get(positional[1], positional[2], uris)
        elif command == "remove" and "uri" in options:
            library.remove(options["uri"])
        else:
            print(f"unknown request {' '.join(positional)!r}", file=sys.stderr)
            return 4
    except InjectedFault as exc:
        print(f"tape {command}: {exc}", file=sys.stderr)
        return exc.rc
    except (OSError, ValueError, TimeoutError) as exc:
        print(f"tape {command}: {exc}", file=sys.stderr)
        return 5
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
