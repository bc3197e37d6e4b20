"""SIGTERM ends a session as Ctrl-C does.

``timeout``, CI runners cancelling a job and ``kill`` send SIGTERM, whose default
action ends Python at once: no summary, the step in progress missing from the
results, the embedded servers left running. :class:`TermAsInterrupt` (installed for
the session in pytest's main thread, the previous handler restored at its end) turns
it into :class:`KeyboardInterrupt` in that thread, so that the load stops and keeps
what it measured, pytest writes its summary with exit status 2, the results hold the
interrupted step and the embedded servers are stopped.

On an xdist controller the handler sends SIGTERM on to the workers first: they are
its children, running the steps, and a SIGTERM sent to the controller alone (``kill
PID``, as ``timeout --foreground`` does) would otherwise leave them to xdist's own
shutdown, which waits for the test in progress. A terminal's Ctrl-C is not passed
on: it reaches the workers' client processes (one process group), whose interrupted
report ends each worker's step with what it measured; passed on as well, the
worker's stop raced the client's report and lost it. Only the first SIGTERM acts; a
second one (``timeout`` signals the process group, and the controller passes it on)
is ignored. A handler the user (or another plugin) installed before pytest's
configuration is kept as it is.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

#: what the KeyboardInterrupt says (pytest prints it in its summary line)
SIGTERM_TEXT = "SIGTERM: the session is stopped as after Ctrl-C"


#: the stop signals this process took as Ctrl-C (a fact of the process: what stopped
#: a step is said with it)
RECEIVED: set[str] = set()


def stop_cause() -> str:
    """How the session was stopped, for an interrupted step's text."""
    return "SIGTERM" if "SIGTERM" in RECEIVED else "Ctrl-C"


class TermAsInterrupt:
    """SIGTERM as Ctrl-C for one session; ``workers`` gives the pids to pass it to."""

    def __init__(self, workers: Callable[[], list[int]] | None = None) -> None:
        self._workers = workers
        self._previous: Any = None
        self.installed = False
        #: the first SIGTERM came: the stop is under way
        self.stopping = False

    def install(self) -> None:
        """Take SIGTERM, unless a handler other than the default is set or this is not
        the main thread (signal handlers can only be set there)."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous not in (signal.SIG_DFL, None):
            return  # the user's, or another plugin's: theirs to decide
        self._previous = previous
        RECEIVED.clear()  # a new session (pytester runs many in one process)
        signal.signal(signal.SIGTERM, self._handle)

        # a client library may have left it blocked in this thread (issue 31)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        self.installed = True

    def restore(self) -> None:
        if self.installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous)
            self.installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.stopping:
            # the stop is under way (bounded): a second SIGTERM, e.g. ``timeout``'s to
            # the process group on top of the controller's, must not cut the wait for
            # what the clients measured
            return
        self.stopping = True
        RECEIVED.add("SIGTERM")
        self._stop_workers()
        raise KeyboardInterrupt(SIGTERM_TEXT)

    def _stop_workers(self) -> None:
        for pid in self._workers() if self._workers is not None else []:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:  # ended already
                pass


def xdist_worker_pids(nodes: list[Any]) -> list[int]:
    """The pids of the xdist workers behind ``nodes`` (their execnet popen gateways'
    processes), those still known."""
    pids = []
    for node in nodes:
        io = getattr(getattr(node, "gateway", None), "_io", None)
        pid = getattr(getattr(io, "popen", None), "pid", None)
        if isinstance(pid, int):
            pids.append(pid)
    return pids
