"""The load engine: C concurrent clients repeat an operation for a duration."""

from .engine import run_step
from .stats import SideResult, StepResult

__all__ = ["run_step", "SideResult", "StepResult"]
