"""Live progress: one updating terminal line while a step runs (they may last 20-80
minutes). Quiet when the output is not a terminal, under ``-q``, and on xdist
workers (their output is not a terminal)."""

from __future__ import annotations

import sys
from typing import Any

import pytest


class LiveProgress:
    """Called by the engine about once a second with the step's state."""

    def __init__(self, config: pytest.Config) -> None:
        self._terminal = config.pluginmanager.get_plugin("terminalreporter")
        self._capture = config.pluginmanager.get_plugin("capturemanager")
        self.enabled = bool(
            self._terminal is not None
            and getattr(self._terminal, "isatty", False)
            and config.get_verbosity() >= 0
            and not hasattr(config, "workerinput")
        )
        self._width = 0

    @staticmethod
    def format(state: dict[str, Any]) -> str:
        elapsed, total = state["elapsed_s"], state["total_s"]
        line = (f"storagescale: {state['op']} {state['clients']} clients "
                f"{elapsed:.0f}/{total:.0f} s ({max(total - elapsed, 0):.0f} s left)")
        if "rate_hz" in state:
            line += (f"  rate {state['rate_hz']} Hz  failed {state['failed']}"
                     f"  hung {state['hung']}")
        return line

    def _write(self, text: str) -> None:
        # straight to the terminal, not through pytest's writer, whose idea of the
        # current line (file name, dots, [ 50%]) must stay what it was
        if self._capture is not None:
            with self._capture.global_and_fixture_disabled():
                self._out.write(text)
                self._out.flush()
        else:
            self._out.write(text)
            self._out.flush()

    @property
    def _out(self):
        return sys.stdout

    def __call__(self, state: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = self.format(state)
        # the first update opens a line below pytest's; later ones rewrite it
        self._write(("\r" if self._width else "\n") + line.ljust(self._width))
        self._width = max(self._width, len(line))

    def clear(self) -> None:
        """Erase the progress line and put the cursor back at the end of pytest's."""
        if self.enabled and self._width:
            writer = getattr(self._terminal, "_tw", None)
            column = getattr(writer, "width_of_current_line", 0)
            self._write("\r\x1b[2K\x1b[1A" + (f"\x1b[{column}C" if column else ""))
            self._width = 0
