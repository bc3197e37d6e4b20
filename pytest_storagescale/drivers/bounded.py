"""One run of a command-line client as a bounded process (:mod:`.commands`).

The seeds' batch jobs ran ``dccp`` and ``globus-url-copy`` once per file; a driver that
does the same runs one process per request, and each must end, whatever the tool does:

- **a deadline**: past it the process's whole group is killed (SIGKILL) and the run is
  :class:`CommandKilled` (``deadline``);
- **its own process group** (a session of its own, so no terminal either: a tool that
  would prompt for a pass phrase reads ``/dev/null`` and fails): when its leader ends,
  or at the deadline, what it forked is killed with it; the leader is reaped only after
  that kill, so the group's number cannot have been given to another process meanwhile;
- **it dies with its parent**: started through ``setpriv --pdeathsig KILL``
  (util-linux), so a load client process ended by Ctrl-C or SIGTERM
  (``load/executors.py``: it ends with ``os._exit``) takes its tools with it at once;
- **its output bounded**: stdout and stderr are read as they come, each up to its limit;
  a stream longer than that kills the group and the run is :class:`CommandKilled`
  (``output``): a listing cut short is no answer, and a tool that writes without end
  must not grow this process;
- **its environment given whole** by the caller: nothing of this process's is
  inherited (a bearer token another driver put into ``os.environ`` stays here).

The process's end is seen through a pidfd (Linux 5.3), so no request is measured late
by a polling interval; without one, the end is looked for every :data:`POLL_S`.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: what makes a tool die with its parent (util-linux, Essential on Debian)
SETPRIV = ("setpriv", "--pdeathsig", "KILL", "--")
#: the most of a tool's stdout kept by default (a listing of a large directory)
STDOUT_LIMIT = 16 * 1024 * 1024
#: the most of its stderr kept (its messages)
STDERR_LIMIT = 64 * 1024
#: the end looked for this often where no pidfd can be had
POLL_S = 0.02
_READ = 64 * 1024


class CommandKilled(Exception):
    """The tool was killed: ``reason`` ``deadline`` or ``output`` (a stream past its
    limit); what it wrote until then, bounded."""

    def __init__(self, reason: str, seconds: float, stdout: bytes, stderr: bytes,
                 detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.seconds = seconds
        self.stdout = stdout
        self.stderr = stderr
        self.detail = detail


@dataclass(frozen=True)
class Finished:
    """A tool that ended by itself: its exit status (negative: the signal that ended it)
    and what it wrote."""

    returncode: int
    stdout: bytes
    stderr: bytes
    seconds: float


def missing_launcher() -> str | None:
    """Why no tool can be run bounded here (None: it can)."""
    if shutil.which(SETPRIV[0]) is None:
        return "setpriv is not installed (Debian's util-linux has it)"
    return None


def run_bounded(argv: Sequence[str], *, environment: Mapping[str, str], deadline_s: float,
                stdout_limit: int = STDOUT_LIMIT, stderr_limit: int = STDERR_LIMIT,
                cwd: str | None = None) -> Finished:
    """Run ``argv`` (its first element a path or a name found in the environment's
    ``PATH``) as described in the module's doc; :class:`Finished`, or
    :class:`CommandKilled`. ``OSError`` when it cannot be started."""
    began = time.monotonic()
    process = subprocess.Popen(
        [*SETPRIV, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=dict(environment), cwd=cwd, start_new_session=True,
        close_fds=True)
    run = _Run(process, began, deadline_s, {process.stdout: stdout_limit,
                                            process.stderr: stderr_limit})
    try:
        killed = run.wait()
    finally:
        run.end()
    seconds = time.monotonic() - began
    stdout, stderr = bytes(run.kept[process.stdout]), bytes(run.kept[process.stderr])
    if killed is not None:
        raise CommandKilled(killed[0], seconds, stdout, stderr, killed[1])
    return Finished(process.returncode, stdout, stderr, seconds)


class _Run:
    """One started tool: its pipes read into bounded buffers until it ends or is
    killed."""

    def __init__(self, process: subprocess.Popen, began: float, deadline_s: float,
                 limits: dict) -> None:
        self.process = process
        self.deadline_s = deadline_s
        self.deadline = began + deadline_s
        self.limits = limits
        self.kept: dict = {stream: bytearray() for stream in limits}
        self.selector = selectors.DefaultSelector()
        for stream in limits:
            os.set_blocking(stream.fileno(), False)
            self.selector.register(stream, selectors.EVENT_READ)
        self.pidfd: int | None = None
        try:
            self.pidfd = os.pidfd_open(process.pid)
            self.selector.register(self.pidfd, selectors.EVENT_READ)
        except (AttributeError, OSError):  # an old kernel, or a sandbox forbidding it
            self.pidfd = None
        self.exited = False

    def wait(self) -> tuple[str, str] | None:
        """Until the leader ended (its group then killed), or ``(reason, detail)`` when
        it was killed: the deadline passed, or a stream went past its limit."""
        while not self.exited:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.kill()
                return ("deadline", f"still running at its deadline "
                                    f"({self.deadline_s:g} s): its process group killed")
            timeout = left if self.pidfd is not None else min(left, POLL_S)
            for key, _ in self.selector.select(timeout):
                if key.fileobj == self.pidfd:
                    self.exited = True
                elif (over := self._read(key.fileobj)) is not None:
                    self.kill()
                    return ("output", over)
            if self.pidfd is None and not self.exited:
                self.exited = self._leader_exited()
        for stream in self.limits:  # what it wrote before its end
            if (over := self._read(stream)) is not None:
                self.kill()
                return ("output", over)
        self.kill()  # what it forked and left behind
        return None

    def _leader_exited(self) -> bool:
        try:
            found = os.waitid(os.P_PID, self.process.pid,
                              os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return found is not None and found.si_pid == self.process.pid

    def _read(self, stream) -> str | None:
        """What ``stream`` has now, kept; a message when it went past its limit."""
        buffer, limit = self.kept[stream], self.limits[stream]
        while True:
            try:
                chunk = os.read(stream.fileno(), _READ)
            except BlockingIOError:
                return None
            except OSError:
                chunk = b""
            if not chunk:
                if self._registered(stream):
                    self.selector.unregister(stream)
                return None
            room = limit - len(buffer)
            buffer.extend(chunk[:max(room, 0)])
            if len(chunk) > room:
                name = "stdout" if stream is self.process.stdout else "stderr"
                return (f"wrote more than {limit:,} bytes to its {name}: its process group "
                        f"killed (a tool's answer is bounded)")

    def _registered(self, stream) -> bool:
        try:
            self.selector.get_key(stream)
        except KeyError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL to the whole group; its leader is not reaped yet, so the group's
        number is still its own."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def end(self) -> None:
        """Reap the leader (killed first when anything went wrong), close the pipes."""
        if self.process.returncode is None:
            if not self.exited:
                self.kill()
            self.process.wait()
        self.selector.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        for stream in self.limits:
            stream.close()
