"""Live progress: one updating terminal line while a step runs (they may last 20-80
minutes). Quiet when the output is not a terminal, under ``-q``, and on xdist
workers (their output is not a terminal).

Only pytest's public API is used: the terminal reporter's ``ensure_newline``,
``rewrite`` and ``flush``, inside the capture manager's
``global_and_fixture_disabled()`` (a step runs in a test's call phase, whose output
pytest captures). Pytest's own line (file name and dots, or the test id under
``-v``) is never overwritten: the first update ends that line with
``ensure_newline()`` and the progress line lives on the line below, rewritten in
place with ``rewrite(..., erase=True)`` and cut to the terminal's width (a wrapped
line could not be rewritten). :meth:`LiveProgress.clear` erases it and leaves the
cursor at its start. The public API cannot move the cursor back up to the end of
pytest's line (that column is private), so pytest goes on from there, as after
live logging: by default the test's dot starts the erased line and the next test
opens a new line with its file name; under ``-v`` the erased line stays blank and
pytest writes the test id again with its outcome.
"""

from __future__ import annotations

import contextlib
import shutil
from typing import TYPE_CHECKING

import pytest

from ..roles import Role, role_of
from .table import format_rate

if TYPE_CHECKING:
    from ..load.plan import StepProgress


class LiveProgress:
    """Called by the engine about once a second with the step's state."""

    def __init__(self, config: pytest.Config) -> None:
        self._terminal = config.pluginmanager.get_plugin("terminalreporter")
        self._capture = config.pluginmanager.get_plugin("capturemanager")
        self.enabled = bool(
            self._terminal is not None
            and getattr(self._terminal, "isatty", False)
            and config.get_verbosity() >= 0
            and role_of(config) is not Role.WORKER
        )
        #: a progress line is on the screen (pytest's line was ended under it)
        self._shown = False

    @staticmethod
    def format(progress: StepProgress) -> str:
        """``storagescale: ls 50 clients 61/1200 s (1139 s left)  rate 5.00 Hz  failed 2
        hung 1``."""
        elapsed, total = progress.elapsed_s, progress.total_s
        return (f"storagescale: {progress.operation} {progress.clients} clients "
                f"{elapsed:.0f}/{total:.0f} s ({max(total - elapsed, 0):.0f} s left)"
                f"  rate {format_rate(progress.rate_hz)}  failed {progress.failed}"
                f"  hung {progress.hung}")

    def _uncaptured(self) -> contextlib.AbstractContextManager[None]:
        if self._capture is None:
            return contextlib.nullcontext()
        return self._capture.global_and_fixture_disabled()

    def __call__(self, progress: StepProgress) -> None:
        if not self.enabled:
            return
        # longer than the terminal, it would wrap and '\r' would rewrite only the
        # last row; pytest's own writer measures the terminal the same way
        width = shutil.get_terminal_size().columns - 1
        with self._uncaptured():
            if not self._shown:
                self._terminal.ensure_newline()
                self._shown = True
            self._terminal.rewrite(self.format(progress)[:width], erase=True)
            self._terminal.flush()

    def clear(self) -> None:
        """Erase the progress line; the cursor stays at its start."""
        if not (self.enabled and self._shown):
            return
        with self._uncaptured():
            self._terminal.rewrite("", erase=True)
            self._terminal.rewrite("")
            self._terminal.flush()
        self._shown = False
