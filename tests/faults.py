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
