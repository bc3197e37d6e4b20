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

    def on_drive(self, what: str, volume: str, pnfsid: str, copy) -> None:
        """Take a drive, mount ``volume`` if it is not there, position, copy, log."""
        asked = time.time()
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
            size = copy()
            ended = time.time()
            with open(state_path + ".new", "w") as stream:
                json.dump({"volume": volume, "used": ended}, stream)
            os.replace(state_path + ".new", state_path)
            line = json.dumps({"op": what, "pnfsid": pnfsid, "volume": volume,
                               "drive": number, "mounted": mounted, "bytes": size,
                               "asked": asked, "started": started, "ended": ended})
            with open(os.path.join(self.base, "tape.log"), "a") as log:
                fcntl.flock(log, fcntl.LOCK_EX)
                log.write(line + "\n")
        finally:
            os.close(descriptor)

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
        if not os.path.isfile(source):
            raise FileNotFoundError(f"{bfid} is not on the tape {self.base}")
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
    except (OSError, ValueError, TimeoutError) as exc:
        print(f"tape {command}: {exc}", file=sys.stderr)
        return 5
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
