"""The load engine: C concurrent clients repeat an operation for a duration.

The names below are imported on first use (PEP 562): ``config.py`` imports
:mod:`.executors` for its names, which must not pull in the whole engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import run_step
    from .plan import StepPlan, StepProgress
    from .stats import SideResult, StepResult

_EXPORTS = {
    "run_step": "engine", "StepPlan": "plan", "StepProgress": "plan",
    "SideResult": "stats", "StepResult": "stats",
}
__all__ = ["run_step", "StepPlan", "StepProgress", "SideResult", "StepResult"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
