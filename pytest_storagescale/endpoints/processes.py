"""Server processes the embedded endpoints start: each in a session of its own,
stopped with everything it forked, and never a process that merely got its pid again.

Used by the Apache WebDAV door, the GridFTP server and the XRootD cluster
(``xrootd`` + ``cmsd``); the embedded xrootd keeps its own single process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path


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
        import psutil

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
            return
        # SIGKILL takes effect as the kernel gets to it (a busy machine, a worker with many
        # threads): wait, bounded, until no member runs, so that a stopped server is gone
        deadline = time.monotonic() + _KILL_WAIT
        while _running_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.02)


#: the most a stop waits for its killed group to be gone (seconds)
_KILL_WAIT = 5.0


def _running_members(group: int) -> list[int]:
    """The processes of process group ``group`` that are not zombies."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


#: where daemons live when PATH lacks them (a user's PATH often has no /usr/sbin)
SBIN_PATH = "/usr/sbin:/sbin"


def find_daemon(name: str) -> str | None:
    """``name`` on PATH, else in :data:`SBIN_PATH`."""
    return shutil.which(name) or shutil.which(name, path=SBIN_PATH)
