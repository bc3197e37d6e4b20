"""Server processes the embedded endpoints start: each in a session of its own,
stopped with everything it forked, and never a process that merely got its pid again.

Used by the Apache WebDAV door, the GridFTP server and the XRootD cluster
(``xrootd`` + ``cmsd``); the embedded xrootd keeps its own single process.

Every embedded server lives in a directory from :func:`server_directory`, which
records the process that made it. A pytest process that dies (SIGKILL, a crash of a
native library) cannot stop its servers; the next :func:`server_directory` on the host
stops the servers of directories whose owner is gone (:func:`stop_orphaned_servers`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

#: the kinds of embedded server, each with its directory ``storagescale-<kind>-*``
SERVER_KINDS = ("xrootd", "xcache", "ceph", "apache", "gridftp", "redirector")
#: how long a killed orphan may take to go before its directory is removed (seconds)
_ORPHAN_EXIT_WAIT = 5.0


@dataclass(frozen=True)
class OrphanedServer:
    """A server directory whose owner process died, and what was stopped in it."""

    directory: str
    owner_pid: int
    killed: tuple[int, ...]

    def describe(self) -> str:
        pids = ", ".join(map(str, self.killed)) or "no process left"
        return f"{self.directory} (owner pid {self.owner_pid} gone; killed: {pids})"


#: what this process stopped (the terminal summary names them)
STOPPED_ORPHANS: list[OrphanedServer] = []


def server_directory(kind: str) -> Path:
    """A new private directory for an embedded server of ``kind`` (its configuration,
    data, logs and working directory), recorded as this process's; servers that dead
    processes left running on this host are stopped first."""
    if kind not in SERVER_KINDS:
        raise ValueError(f"unknown embedded server kind {kind!r}: one of {SERVER_KINDS}")
    STOPPED_ORPHANS.extend(stop_orphaned_servers())
    directory = Path(tempfile.mkdtemp(prefix=f"storagescale-{kind}-"))
    registry = _registry()
    if registry is not None:
        record = {"directory": str(directory), "pid": os.getpid(),
                  "started": _started(os.getpid()), "host": socket.gethostname()}
        (registry / f"{directory.name}.json").write_text(json.dumps(record))
    return directory


def stop_orphaned_servers() -> list[OrphanedServer]:
    """Stop every process working in a recorded server directory whose owner process
    on this host is gone (SIGKILL: nobody is left to stop it gracefully), remove the
    directory (never following a link) and its record. Only directories this user
    recorded, in the user's private registry, are looked at; a process is ours only if
    its working directory or command line is inside such a directory."""
    registry = _registry()
    if registry is None:
        return []
    stopped = []
    for path in registry.glob("storagescale-*.json"):
        try:
            record = json.loads(path.read_text())
            directory, pid = Path(record["directory"]), int(record["pid"])
            started, host = float(record["started"]), str(record["host"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _is_server_directory(directory):
            path.unlink(missing_ok=True)  # stopped and removed normally: forget it
            continue
        now = _started(pid)
        if host != socket.gethostname() or (now is not None and abs(now - started) < 0.01):
            continue  # its owner runs (or runs elsewhere): not ours to stop
        killed = _kill_inside(directory)
        shutil.rmtree(directory, ignore_errors=True)  # never follows links
        path.unlink(missing_ok=True)
        stopped.append(OrphanedServer(str(directory), pid, killed))
    return stopped


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


def _is_server_directory(directory: Path) -> bool:
    try:
        info = directory.lstat()
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and directory.parent == Path(tempfile.gettempdir())
            and any(directory.name.startswith(f"storagescale-{kind}-")
                    for kind in SERVER_KINDS))


def _started(pid: int) -> float | None:
    """When process ``pid`` started (None: no such process); a pid handed out again
    has another start time."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _kill_inside(directory: Path) -> tuple[int, ...]:
    """SIGKILL every process working in ``directory`` or naming it on its command
    line; wait (bounded) until they are gone."""
    inside, prefix = str(directory), f"{directory}/"
    victims = []
    for process in psutil.process_iter(["cwd", "cmdline"]):
        cwd, cmdline = process.info["cwd"] or "", process.info["cmdline"] or []
        if process.pid == os.getpid():
            continue
        if (cwd == inside or cwd.startswith(prefix)
                or any(arg == inside or prefix in arg for arg in cmdline)):
            victims.append(process)
    for process in victims:
        try:
            process.kill()
        except psutil.Error:
            pass
    deadline = time.monotonic() + _ORPHAN_EXIT_WAIT
    while any(_running(process) for process in victims) and time.monotonic() < deadline:
        time.sleep(0.05)
    return tuple(sorted(process.pid for process in victims))


def _running(process: psutil.Process) -> bool:
    """Not yet gone (a zombie is gone: only its parent's wait is left, and an orphan's
    parent is whatever reaps orphans here)."""
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            process.wait(0)  # reaped if it is ours
            return False
        return True
    except (psutil.Error, ChildProcessError):
        return False


class ProcessGroup:
    """A server process started in a session of its own: stopped with every process it
    forked (SIGTERM to the leader, then SIGKILL to the group)."""

    def __init__(self, command: list[str], *, cwd: Path, env: dict[str, str],
                 output: Path) -> None:
        with open(output, "ab") as stream:
            self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=stream,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self, wait: float = 0.0) -> int | None:
        """The exit code once the leader is gone (waiting up to ``wait`` s), else None."""
        try:
            return self.process.wait(timeout=wait) if wait > 0 else self.process.poll()
        except subprocess.TimeoutExpired:
            return None

    def rss_bytes(self) -> int:
        """Resident memory of the leader and every process it forked (0 when gone)."""
        try:
            leader = psutil.Process(self.pid)
            processes = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for process in processes:
            try:
                total += process.memory_info().rss
            except psutil.Error:
                continue
        return total

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the leader (a graceful stop of its workers), then SIGKILL the whole
        group: nothing it forked outlives it (idempotent)."""
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            self.exited(grace)
        self._kill_left_behind()
        if self.process.poll() is None:
            self.process.kill()
        self.exited(grace)

    def _kill_left_behind(self) -> None:
        """SIGKILL the workers the leader left behind: its process group, whose id is
        the leader's pid. Once the leader is reaped and no member is left, Linux hands
        that number out again (pid_max is often 32,768 and a load step makes thousands
        of threads); a process that now has it belongs to someone else (another test's
        server, started in a session of its own, is a group of that id too) and is
        never signalled. While a member lives, the number is not handed out."""
        if self.process.poll() is not None and Path(f"/proc/{self.pid}").exists():
            return  # the pid was recycled: the group is gone, whatever has it is not ours
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


#: where daemons live when PATH lacks them (a user's PATH often has no /usr/sbin)
SBIN_PATH = "/usr/sbin:/sbin"


def find_daemon(name: str) -> str | None:
    """``name`` on PATH, else in :data:`SBIN_PATH`."""
    return shutil.which(name) or shutil.which(name, path=SBIN_PATH)
