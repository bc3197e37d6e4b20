"""Embedded servers that a dead pytest process left running, stopped by the next server
start on the host.

Every embedded server lives in a directory from :func:`server_directory`, which
records it in the user's private registry (``$TMPDIR/storagescale-servers-<uid>/``)
with the directory's device and inode and the identity of the process that made it:
its pid, the kernel's boot id and its start time in clock ticks (exact, unlike a wall
clock time), and its pid namespace. A pytest process that dies (SIGKILL, a crash in a
native library) cannot stop its servers; :func:`stop_orphaned_servers`, called before
every new server directory, finds the records whose owner is gone and stops what
runs there.

What it may touch, and nothing else:

- only records in the registry folder, which must be a real folder of this user;
- only directories that are still the recorded ones (same device and inode), directly
  in the temporary folder, named ``storagescale-<kind>-*``;
- only processes whose working directory or a command-line argument is inside such a
  directory (path boundaries, symlinks resolved), whose real uid is this user's or
  owns the directory or one of its entries (the server's unprivileged user), whose
  session leader is such a process too or gone (servers start in a session of their
  own, so a command started from a shell elsewhere, an editor or a ``less`` of a log
  there, is left alone), and which are neither this process, its ancestors nor in its
  session;
- never a process with a controlling terminal (a person's shell that ``cd``-ed into the
  directory, and what it runs: servers start in a session of their own, without one),
  nor one descending from a live owner of a record (a live run's server is its
  owner's child until that owner dies, whatever paths it names);
- a record is claimed by renaming it first, so two cleaners never act on one orphan;
  a directory is removed (never following links) only once its processes are gone.

A live owner's record is never claimed: its owner is named by pid, boot id and start
ticks, so neither a reused pid nor a stepped clock makes a running pytest look gone.
Every stop is logged in the registry's ``stopped.log``; :func:`stopped_by` finds the
line of a directory, so that a server that lost its daemons says who stopped them.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: a run that starts no server never loads it
    import psutil

#: the name of a server's directory, ``storagescale-<kind>-<mkdtemp's suffix>``, the kind
#: being a registered server's (:data:`~.family.KIND_PATTERN`); never the registry's own
#: folder ``storagescale-servers-<uid>``
SERVER_DIRECTORY = re.compile(r"storagescale-(?!servers-)[a-z][a-z0-9_]*-[A-Za-z0-9_]+")
#: how long killed orphans may take to go before their directories are removed (s)
_EXIT_WAIT = 5.0


@dataclass(frozen=True)
class OrphanedServer:
    """A server directory whose owner process died, and the processes stopped in it."""

    directory: str
    owner_pid: int
    killed: tuple[int, ...]

    def describe(self) -> str:
        what = (f"killed {', '.join(map(str, self.killed))}" if self.killed
                else "no process was left in it")
        return f"{self.directory} (its owner, pid {self.owner_pid}, is gone; {what})"


#: what this process stopped (the terminal summary of a session names them)
STOPPED_ORPHANS: list[OrphanedServer] = []


@dataclass(frozen=True)
class _Claim:
    directory: Path
    owner_pid: int
    record: Path  # where the record was
    claimed: Path  # where it is while this process acts on it


def server_directory(kind: str) -> Path:
    """A new private directory for an embedded server of ``kind`` (configuration, data,
    logs, working directory), recorded as this process's; servers that dead processes
    left running on this host are stopped first."""
    if not SERVER_DIRECTORY.fullmatch(f"storagescale-{kind}-x"):
        raise ValueError(f"embedded server kind {kind!r}: not a kind's name (lower-case "
                         f"letters, digits, _; not 'servers')")
    STOPPED_ORPHANS.extend(stop_orphaned_servers())
    directory = Path(tempfile.mkdtemp(prefix=f"storagescale-{kind}-"))
    _record(directory)
    return directory


def stop_orphaned_servers() -> list[OrphanedServer]:
    """Stop the servers of recorded directories whose owner is gone (SIGKILL: nobody
    is left to stop them gracefully), remove those directories and their records;
    return what was stopped. Never raises: a record it cannot read is left alone."""
    registry = _registry()
    if registry is None:
        return []
    _release_abandoned_claims(registry)
    claims: list[_Claim] = []
    live_owners: set[int] = set()
    for path in registry.glob("storagescale-*.json"):
        try:
            claim = _claim(path, live_owners)
        except Exception:  # noqa: BLE001, S112 - a bad record is not acted on
            continue
        if claim is not None:
            claims.append(claim)
    if not claims:
        return []
    try:
        victims = _processes_inside([claim.directory for claim in claims], live_owners)
    except Exception:  # noqa: BLE001 - cannot tell what runs there: act on nothing
        for claim in claims:
            _give_back(claim)
        return []
    _kill_and_wait([process for found in victims.values() for process in found])
    stopped = []
    for claim in claims:
        found = victims[claim.directory]
        if any(_running(process) for process in found):
            _give_back(claim)  # a process survived: keep its directory, try again later
            continue
        _detach_mounts(claim.directory)  # a killed FUSE client's mount stays behind
        shutil.rmtree(claim.directory, ignore_errors=True)  # never follows links
        claim.claimed.unlink(missing_ok=True)
        stopped.append(OrphanedServer(str(claim.directory), claim.owner_pid,
                                      tuple(sorted(process.pid for process in found))))
    _log_stopped(registry, stopped)
    return stopped


def _log_stopped(registry: Path, stopped: list[OrphanedServer]) -> None:
    """Append what was stopped, and by whom, to the registry's ``stopped.log``: an
    xdist worker's summary is not printed, and a kill should always be traceable."""
    if not stopped:
        return
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        with open(registry / "stopped.log", "a") as log:
            for orphan in stopped:
                log.write(f"{when} pid {os.getpid()} stopped {orphan.describe()}\n")
    except OSError:
        pass


def stopped_by(directory: str | os.PathLike[str] | None) -> str:
    """The ``stopped.log`` line of the cleaner that stopped what ran in ``directory``
    (a server that lost its daemons asks), as a sentence; '' when none did."""
    registry = _registry()
    if directory is None or registry is None:
        return ""
    try:
        lines = (registry / "stopped.log").read_text(errors="replace").splitlines()
    except OSError:
        return ""
    mark = f" stopped {os.fspath(directory)} ("
    found = [line for line in lines if mark in line]
    if not found:
        return ""
    return (f"An orphan cleaner stopped its directory, judging its owner gone "
            f"(stopped.log in {registry}): {found[-1]}.")


# -- the registry ------------------------------------------------------------------
def _registry() -> Path | None:
    """This user's private folder of server records (None: it is not safely ours)."""
    folder = Path(tempfile.gettempdir()) / f"storagescale-servers-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return None  # a link or someone else's: never trust what it records
    return folder


def _record(directory: Path) -> None:
    """Record ``directory`` as this process's (best effort: an unrecorded server is
    only not stopped should this process die)."""
    registry, me = _registry(), _identity(os.getpid())
    if registry is None or me is None:
        return
    try:
        info = directory.lstat()
        record = {"directory": str(directory), "device": info.st_dev, "inode": info.st_ino,
                  "pid": os.getpid(), "identity": me, "namespace": _pid_namespace(),
                  "host": socket.gethostname()}
        partial = registry / f".{directory.name}.{os.getpid()}.partial"
        partial.write_text(json.dumps(record))
        os.replace(partial, registry / f"{directory.name}.json")
    except OSError:
        pass


def _claim(path: Path, live_owners: set[int]) -> _Claim | None:
    """The record at ``path`` if its owner is gone, renamed so that no other cleaner
    acts on it; None if its owner runs (its pid is added to ``live_owners``), it is
    not ours to judge, or another took it. A record whose directory is gone or
    replaced is forgotten."""
    record = json.loads(path.read_text())
    directory, pid, identity = record["directory"], record["pid"], record["identity"]
    device, inode = record["device"], record["inode"]
    if not (isinstance(directory, str) and "\0" not in directory and isinstance(pid, int)
            and pid > 0 and isinstance(identity, str) and isinstance(device, int)
            and isinstance(inode, int)):
        return None
    if not _is_recorded_directory(Path(directory), device, inode):
        path.unlink(missing_ok=True)  # stopped and removed normally (or replaced)
        return None
    if record.get("host") != socket.gethostname() or record.get("namespace") != _pid_namespace():
        return None  # another host or pid namespace: its owner cannot be seen from here
    if _identity(pid) == identity:
        live_owners.add(pid)
        return None  # the owner runs
    claimed = path.with_name(f"{path.name}.claimed-{os.getpid()}")
    try:
        os.rename(path, claimed)
    except FileNotFoundError:
        return None  # another cleaner took it
    return _Claim(Path(directory), pid, path, claimed)


def _release_abandoned_claims(registry: Path) -> None:
    """Records claimed by a cleaner that died before it finished: back to be read."""
    import psutil

    for path in registry.glob("storagescale-*.json.claimed-*"):
        record, _, claimer = path.name.rpartition(".claimed-")
        if claimer.isdigit() and not psutil.pid_exists(int(claimer)):
            try:
                os.rename(path, path.with_name(record))
            except OSError:
                continue


def _give_back(claim: _Claim) -> None:
    try:
        os.rename(claim.claimed, claim.record)
    except OSError:
        pass


def _is_recorded_directory(directory: Path, device: int, inode: int) -> bool:
    try:
        info = directory.lstat()
    except (OSError, ValueError):
        return False
    return (stat.S_ISDIR(info.st_mode) and (info.st_dev, info.st_ino) == (device, inode)
            and directory.parent == Path(tempfile.gettempdir())
            and SERVER_DIRECTORY.fullmatch(directory.name) is not None)


# -- processes -------------------------------------------------------------------
def _identity(pid: int) -> str | None:
    """``<boot id>:<start time in clock ticks>`` of a running process (None: no such
    process, or a zombie: dead, waiting to be reaped). A pid handed out again has
    another start time; a reboot another boot id. Read from /proc: exact, where a
    start time in wall-clock seconds moves when the clock is stepped."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            fields = stat_file.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return f"{_boot_id()}:{fields[19]}"


@functools.cache
def _boot_id() -> str:
    """This boot's id (read once: it changes only with a reboot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot_file:
            return boot_file.read().strip()
    except OSError:
        return "unknown-boot"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _processes_inside(directories: list[Path],
                      live_owners: set[int] | frozenset[int] = frozenset()
                      ) -> dict[Path, list[psutil.Process]]:
    """The processes working in each directory or naming a path inside it, that are
    not ours to spare (see the module's doc)."""
    import psutil

    forms = {}
    for directory in directories:
        forms[str(directory)] = directory
        forms[os.path.realpath(directory)] = directory
    uids = {os.getuid()}
    for directory in directories:
        for entry in (directory, *_entries(directory)):
            try:
                uids.add(entry.lstat().st_uid)
            except OSError:
                continue
    me = psutil.Process()
    spared = {me.pid, *(parent.pid for parent in me.parents())}
    my_session = os.getsid(0)
    candidates: dict[int, tuple[psutil.Process, Path]] = {}
    for process in psutil.process_iter(["cwd", "cmdline", "uids"]):
        info = process.info
        if (process.pid in spared or info["uids"] is None or info["uids"].real not in uids
                or _has_terminal(process.pid)):
            continue  # ours, someone else's, or a person's (a controlling terminal)
        inside = _inside(info["cwd"], info["cmdline"] or [], forms)
        if inside is not None and not _descends_from(process, live_owners):
            candidates[process.pid] = (process, inside)
    found: dict[Path, list[psutil.Process]] = {directory: [] for directory in directories}
    for pid, (process, directory) in candidates.items():
        try:
            session = os.getsid(pid)
        except OSError:
            continue  # gone already
        if session == my_session:
            continue
        if session in candidates or session == pid or _identity(session) is None:
            found[directory].append(process)
    return found


def mounts_inside(directory: Path) -> list[str]:
    """The mount points at or below ``directory`` (``/proc/self/mountinfo``), deepest
    first."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    top = os.fspath(directory)
    points = []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:  # octal escapes: \040 is a space
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point == top or point.startswith(f"{top}/"):
                points.append(point)
    return sorted(set(points), key=len, reverse=True)


def _detach_mounts(directory: Path) -> None:
    """Detach (lazily: nobody serves them any more) the mounts an orphan left inside
    ``directory``, the embedded CephFS's ``ceph-fuse`` mounts: the directory cannot be
    removed through them. Only mount points inside the claimed directory."""
    import subprocess

    for point in mounts_inside(directory):
        try:
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue


def _has_terminal(pid: int) -> bool:
    """Whether ``pid`` has a controlling terminal (``tty_nr`` of /proc: psutil's
    ``terminal()`` maps it through a table made once per process, blind to a later
    terminal). Gone or unreadable: no."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return int(stat_file.read().rsplit(")", 1)[1].split()[4]) != 0
    except (OSError, IndexError, ValueError):
        return False


def _descends_from(process: psutil.Process, owners: set[int] | frozenset[int]) -> bool:
    """Whether a live owner of a record started ``process`` (or its parent...): a live
    run's server, whatever directory it works in. An orphan's parent is whatever
    reaps orphans here, never its dead owner."""
    import psutil

    try:
        return any(parent.pid in owners for parent in process.parents())
    except psutil.Error:
        return False


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


def _inside(cwd: str | None, cmdline: list[str], forms: dict[str, Path]) -> Path | None:
    """The directory of ``forms`` that ``cwd`` or an argument is in (on path
    boundaries; an argument may be ``--option=path``)."""
    paths = [cwd or "", *cmdline, *(arg.split("=", 1)[1] for arg in cmdline if "=" in arg)]
    for path in paths:
        for form, directory in forms.items():
            if path == form or path.startswith(f"{form}/"):
                return directory
    return None


def _kill_and_wait(processes: list[psutil.Process]) -> None:
    import psutil

    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    deadline = time.monotonic() + _EXIT_WAIT
    while any(_running(process) for process in processes) and time.monotonic() < deadline:
        time.sleep(0.05)


def _running(process: psutil.Process) -> bool:
    """Not gone yet (a zombie is gone: only its parent's wait is left, and an orphan's
    parent is whatever reaps orphans here). A zombie is never reaped here: when it is
    this process's own daemon, its server's watch reads its exit status first (a reap
    here would leave the watch and ``Popen`` an "exit code 0")."""
    import psutil

    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return process.is_running()
    except (psutil.Error, ChildProcessError):
        return False
