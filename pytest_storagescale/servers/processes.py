"""Server processes the embedded endpoints start: each in a session of its own,
stopped with everything it forked, and never a process that merely got its pid again;
each watched for its end, so that a server that dies mid-run says when and how.

:class:`ProcessGroup` is used by the Apache WebDAV door, the GridFTP server and the
XRootD cluster (``xrootd`` + ``cmsd``); :class:`ServerProcess` by every daemon of the
family but the embedded xrootd, which keeps its own single process and note.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from ..errors import EndpointError, exit_text

#: the lines of each log a death note quotes
NOTE_LINES = 12


class ServerProcess:
    """One daemon of an embedded server (a child of this process), watched for its end:
    a thread waits for it to exit without reaping it (``waitid`` with ``WNOWAIT``: the
    owner's own ``wait``/``poll`` still collects its status) and records the time.

    :meth:`death` says when and how it ended, unless its server stopped it
    (:meth:`stopping`): that is not a death."""

    def __init__(self, name: str, process: subprocess.Popen, logs: tuple[Path, ...]) -> None:
        self.name = name
        self.process = process
        #: its log files, quoted by the note (the daemon's own log, its console output)
        self.logs = logs
        self.started_at = time.time()
        self.ended_at: float | None = None
        #: set once it exited (it may not be reaped yet: its pid stays reserved till then)
        self.ended = threading.Event()
        #: its exit status as ``Popen.returncode`` gives it (a signal: negative), read by
        #: the watch: whoever reaps it (a cleaner's ``wait`` in this process) cannot lose it
        self.status: int | None = None
        self.stopped = False
        threading.Thread(target=self._watch, name=f"storagescale-watch-{process.pid}",
                         daemon=True).start()

    def _watch(self) -> None:
        try:
            ended = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            ended = None  # reaped already by its owner's poll(): it ended just now
        if ended is not None:
            exited = ended.si_code == os.CLD_EXITED
            self.status = ended.si_status if exited else -ended.si_status
        self.ended_at = time.time()
        self.ended.set()

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_status(self) -> int | None:
        """Its exit status once it ended, None while it runs; it is not reaped here."""
        if self.process.returncode is not None:
            return self.process.returncode
        if not self.ended.is_set():
            return None
        return self.status if self.status is not None else self.process.poll()

    def stopping(self) -> None:
        """Its server stops it now: its end is not a death."""
        self.stopped = True

    def death(self) -> str:
        """'' while it runs or once its server stopped it; else one sentence: pid, exit
        status or signal, when (UTC) and how long after its start."""
        code = self.exit_status()
        if self.stopped or code is None:
            return ""
        ended = self.ended_at or time.time()
        when = time.strftime("%H:%M:%S", time.gmtime(ended))
        return (f"{self.name} (pid {self.pid}) ended at {when} UTC, "
                f"{ended - self.started_at:.0f} s after it started: {exit_text(code)}")

    def log_tails(self, lines: int = NOTE_LINES) -> str:
        """The last lines of each of its logs that has any."""
        parts = [f"--- {self.name}: {log.name}\n{log_tail(log, lines)}"
                 for log in self.logs if log.is_file() and log.stat().st_size]
        return "\n".join(parts) or f"--- {self.name}: no log left (its directory is gone)"


class ProcessGroup:
    """A server process started in a session of its own: stopped with every process it
    forked (SIGTERM to the leader, then SIGKILL to the group)."""

    def __init__(self, command: list[str], *, cwd: Path, env: dict[str, str],
                 output: Path, name: str = "", log: Path | None = None) -> None:
        # the output's folder may be the server's user's: a link there is not followed
        descriptor = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644)
        with os.fdopen(descriptor, "ab") as stream:
            self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=stream,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        #: the leader, watched for a death mid-run (``log``: the daemon's own log)
        self.watched = ServerProcess(name or Path(command[0]).name, self.process,
                                     (*([log] if log else []), output))

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self, wait: float = 0.0) -> int | None:
        """The exit code once the leader is gone (waiting up to ``wait`` s), else None.
        The leader is not reaped here: until :meth:`stop` reaps it, its pid, and so its
        group's number, cannot be handed to another process."""
        if wait > 0:
            self.watched.ended.wait(wait)
        return self.watched.exit_status()

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
        group: nothing it forked outlives it (idempotent). The group is killed while
        the leader is not reaped yet (alive, or a zombie: its pid, the group's number,
        is still ours), and reaped after: no other process can have that number then."""
        self.watched.stopping()
        # reaped by another wait already (Popen's, or a psutil wait: no status left)
        reaped = self.process.returncode is not None or (
            self.watched.ended.is_set() and self.watched.status is None)
        if not reaped:
            if not self.watched.ended.is_set():
                os.kill(self.pid, signal.SIGTERM)  # not reaped: this pid is the leader's
                # a frozen (SIGSTOPped) server acts on SIGTERM only once continued: else
                # the whole grace is waited for (issue 31: Ctrl-C took 14-24 s)
                os.kill(self.pid, signal.SIGCONT)
                self.watched.ended.wait(grace)
            self._kill_group()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            return
        self._kill_left_behind()

    def _kill_group(self) -> None:
        """SIGKILL the group while its leader is not reaped, and wait (bounded) until no
        member runs: SIGKILL takes effect as the kernel gets to it (a busy machine, a
        worker with many threads), and a stopped server must be gone."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + _KILL_WAIT
        while _running_members(self.pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _kill_left_behind(self) -> None:
        """The leader was reaped before stop() (by another wait on it): SIGKILL the
        workers it left behind, its process group, whose id is the leader's pid. Once
        the leader is reaped and no member is left, Linux hands that number out again
        (pid_max is often 32,768 and a load step makes thousands of threads); a process
        that now has it belongs to someone else (another test's server, started in a
        session of its own, is a group of that id too) and is never signalled. While a
        member lives, the number is not handed out."""
        if Path(f"/proc/{self.pid}").exists():
            return  # the pid was recycled: the group is gone, whatever has it is not ours
        self._kill_group()


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


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def log_tail(path, lines: int = 15) -> str:
    """The last ``lines`` lines of a server's log ("(no log)" when there is none), for
    the error that says it did not start; without credentials (a server may log the
    requests it refused)."""
    from ..redact import redact_text

    try:
        text = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
    return redact_text(text) or "(empty)"


def unprivileged_user() -> str | None:
    """The user to run xrootd as when we are root: ``xrootd`` if it exists, else ``nobody``."""
    if os.geteuid() != 0:
        return None
    for name in ("xrootd", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise EndpointError(
        "running as root, and neither an 'xrootd' nor a 'nobody' user exists to run the "
        "embedded xrootd as (it refuses to run as root). Create one: 'useradd -r xrootd'."
    )


class OneGroupServer:
    """What a server of one :class:`ProcessGroup` (Apache, GridFTP) tells of its daemon:
    the group's leader, watched for its end, and the group's resident memory."""

    group: ProcessGroup | None

    def server_processes(self) -> list[ServerProcess]:
        """The group's leader (the processes it forks come and go with the load)."""
        return [self.group.watched] if self.group is not None else []

    def rss_bytes(self) -> int:
        """Resident memory of the leader and every process it forked."""
        return self.group.rss_bytes() if self.group is not None else 0

