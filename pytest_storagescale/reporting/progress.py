"""Live progress: one updating terminal line while a step runs (they may last 20-80
minutes). Quiet when the output is not a terminal, under ``-q``, and on xdist
workers (their output is not a terminal); the xdist controller prints one line per
finished step instead (:func:`finished_step_line`).

Pytest's own line (file name and dots, or the test id under ``-v``) is left as it
is: the progress line lives on the row below it and the cursor always goes back to
where pytest left it, so pytest goes on writing its dots on its own line (no file
name printed again, no dot on a line of its own). That takes four VT100 escapes
every terminal pytest colours has: save and restore the cursor (``ESC 7``, ``ESC 8``)
and move one row down or up keeping the column (``ESC D``, ``ESC M``; at the bottom
of the screen ``ESC D`` scrolls, so the row below is made once before the cursor is
saved). The escapes go straight to the terminal (``sys.stdout``, inside the capture
manager's ``global_and_fixture_disabled()``, after the terminal reporter's
``flush()``), not through the terminal reporter, whose count of its line's width
places the ``[ 50%]`` column. :meth:`LiveProgress.clear` erases the row below.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from typing import TYPE_CHECKING

import pytest

from ..roles import Role, role_of
from ..units import format_rate

if TYPE_CHECKING:
    from ..load.plan import StepProgress
    from ..records import StepRecord


#: save the cursor; go one row down / up keeping the column; restore it; erase to the
#: end of the row (VT100, ECMA-48)
SAVE, DOWN, UP, RESTORE, ERASE = "\x1b7", "\x1bD", "\x1bM", "\x1b8", "\x1b[K"


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
        #: a progress line is on the screen, on the row below pytest's line
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

    def _write(self, text: str) -> None:
        """``text`` on the row below pytest's line; the cursor back where pytest left it."""
        with self._uncaptured():
            if self._terminal is not None:  # enabled: it is
                self._terminal.flush()  # pytest's own output first
            if not self._shown:  # make the row below once (scrolls at the bottom)
                sys.stdout.write(DOWN + UP)
                self._shown = True
            sys.stdout.write(f"{SAVE}{DOWN}\r{text}{ERASE}{RESTORE}")
            sys.stdout.flush()

    def __call__(self, progress: StepProgress) -> None:
        if not self.enabled:
            return
        # longer than the terminal, it would wrap onto pytest's next rows; pytest's own
        # writer measures the terminal the same way
        width = shutil.get_terminal_size().columns - 1
        self._write(self.format(progress)[:width])

    def clear(self) -> None:
        """Erase the progress line; pytest's line and cursor are as before."""
        if not (self.enabled and self._shown):
            return
        self._write("")
        self._shown = False


def finished_step_line(step: StepRecord) -> str:
    """The xdist controller's line for a step a worker finished: ``storagescale:
    test_stat[c50] stat at 50 clients over root: 11020 Hz, failed 0, hung 0: pass``."""
    door = f" over {step.door}" if step.door else ""
    test = step.test.rpartition("::")[2] or step.test
    total = step.total
    measured = (f"{format_rate(total.rate_hz)}, failed {total.failed}, hung {total.hung}"
                if total is not None else "nothing measured")
    return f"storagescale: {test} {step.title}{door}: {measured}: {step.verdict}"


class StepLines:
    """On the xdist controller (its workers' output is no terminal, so they show no
    live progress), one line per finished step as its test's report arrives
    (:func:`finished_step_line`); nothing under ``-q`` or without ``-n``. Without
    ``-v`` the line goes under pytest's dots, which go on on the next line."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.enabled = role_of(config) is Role.CONTROLLER and config.get_verbosity() >= 0
        #: pytest wrote a letter (a dot) since the last line: its line is open
        self._dots = False

    def report(self, report: pytest.TestReport, steps: list[StepRecord]) -> None:
        """A test report, before the terminal reporter writes its letter, with the
        steps it logged."""
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        if not self.enabled or terminal is None:
            return
        if steps and self._dots and self.config.get_verbosity() <= 0:
            terminal.write("\n")  # under -v pytest's own line ends with ensure_newline
        for step in steps:
            terminal.write_line(finished_step_line(step))
        self._dots = not steps and self._dots
        _, letter, _ = self.config.hook.pytest_report_teststatus(report=report,
                                                                 config=self.config)
        self._dots = self._dots or bool(letter)

