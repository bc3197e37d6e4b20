"""Faults that land inside a step's measurement, whatever its set-up took."""

from __future__ import annotations

import threading
from collections.abc import Callable


class OnceMeasuring:
    """A progress callback (``run_step(progress=...)``) that runs ``action`` once, in a
    thread of its own, when the step first reports a success: the fault lands inside
    the step's measurement, however long its set-up and logins took on a loaded
    machine (a timer started before the step does not)."""

    def __init__(self, action: Callable[[], object]) -> None:
        self.action = action
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def __call__(self, state) -> None:
        if state.succeeded > 0 and self.thread is None:
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def _run(self) -> None:
        try:
            self.action()
        except BaseException as error:  # noqa: BLE001 - raised again by join()
            self.error = error

    def join(self) -> None:
        """Wait for the action; raise its own error (an assertion when it never ran)."""
        assert self.thread is not None, "the step never reported a success"
        self.thread.join()
        if self.error is not None:
            raise self.error


_PROGRESS_CONFTEST = """
{imports}
import pytest_storagescale.fixtures as fixtures
from pytest_storagescale.reporting.progress import LiveProgress


class FromProgress(LiveProgress):
    def __init__(self, config):
        super().__init__(config)
        self.enabled = True

    def __call__(self, state):
{body}

    def clear(self):
        pass


fixtures.LiveProgress = FromProgress
"""


def progress_conftest(body: str, imports: str = "") -> str:
    """A conftest for a pytest run of its own whose steps' live progress (quiet without
    a terminal) is replaced by ``body``: Python lines run at each progress report of a
    step, ``state`` its :class:`~pytest_storagescale.load.plan.StepProgress`. A fault
    from the step's own progress, in a run a test starts."""
    indented = "\n".join(f"        {line}" if line else "" for line in body.splitlines())
    return _PROGRESS_CONFTEST.format(imports=imports, body=indented)


class DutyCycle:
    """A real slower server: the process ``pid`` stopped (SIGSTOP) for ``stopped`` s
    out of every ``stopped + running`` s, in a thread, until the block ends (then
    continued, SIGCONT, whatever happened). A 5.5.3 that runs a twentieth of the time
    stands in for a slower version of the same server."""

    def __init__(self, pid: int, *, stopped: float = 0.095, running: float = 0.005) -> None:
        self.pid, self.stopped, self.running = pid, stopped, running
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._cycle, daemon=True)

    def _cycle(self) -> None:
        import os
        import signal

        while not self._done.is_set():
            os.kill(self.pid, signal.SIGSTOP)
            self._done.wait(self.stopped)
            os.kill(self.pid, signal.SIGCONT)
            self._done.wait(self.running)

    def __enter__(self) -> DutyCycle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        import os
        import signal

        self._done.set()
        self._thread.join()
        os.kill(self.pid, signal.SIGCONT)
