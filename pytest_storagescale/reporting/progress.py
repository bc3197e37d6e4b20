"""Live progress: one updating terminal line while a step runs (they may last 20-80
minutes). Quiet when the output is not a terminal, under ``-q``, and on xdist
workers (their output is not a terminal)."""

from __future__ import annotations

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
        if self._capture is not None:
            with self._capture.global_and_fixture_disabled():
                self._terminal.write(text, flush=True)
        else:
            self._terminal.write(text, flush=True)

    def __call__(self, state: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = self.format(state)
        self._width = max(self._width, len(line))
        self._write("\r" + line.ljust(self._width))

    def clear(self) -> None:
        if self.enabled and self._width:
            self._write("\r" + " " * self._width + "\r")
            self._width = 0
