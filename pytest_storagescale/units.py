"""Parsers of the quantities users write: durations (``10s``, ``5m``) and byte sizes
(``1MB``, ``64KiB``). Each raises a usage error naming the value and how to write it.
And the way every report writes a rate and a duration back (``11020 Hz``, ``12 ms``)."""

from __future__ import annotations

import math
import re

from .errors import StorageScaleUsageError
from .limits import check_duration

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
#: the largest byte size a plan may give (1 TiB): a bigger one is a typo or overflow
MAX_BYTES = 2**40


def parse_duration(value: str | float | int, *, what: str = "duration") -> float:
    """Parse ``500ms``, ``10s``, ``5m``, ``1h`` or a bare number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION_RE.match(str(value))
        if not match:
            raise StorageScaleUsageError(
                f"{what}: {value!r} is not a duration. Write a number with a unit: "
                f"500ms, 10s, 5m or 1h (a bare number means seconds)."
            )
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not seconds > 0:  # NaN (TOML's nan) too
        raise StorageScaleUsageError(f"{what}: {value!r} must be longer than zero, e.g. 10s.")
    check_duration(seconds, what=what, value=value)
    return seconds


def parse_byte_size(value: str | int, *, what: str = "size") -> int:
    """Parse ``1MB``, ``10 MiB``, ``4k`` or a bare number of bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]i?[bB]?|[bB])?\s*$", str(value))
        if not match:
            raise StorageScaleUsageError(
                f"{what}: {value!r} is not a size. Write e.g. 1MB, 10MiB, 512k or 0."
            )
        unit = (match.group(2) or "b").lower().rstrip("b") or "b"
        factor = {
            "b": 1, "k": 10**3, "m": 10**6, "g": 10**9,
            "ki": 2**10, "mi": 2**20, "gi": 2**30,
        }[unit]
        number = float(match.group(1)) * factor
        size = int(number) if math.isfinite(number) else MAX_BYTES + 1
    if size < 0:
        raise StorageScaleUsageError(f"{what}: {value!r} must not be negative.")
    if size > MAX_BYTES:
        raise StorageScaleUsageError(
            f"{what}: {value!r} is more than 1 TiB ({MAX_BYTES} bytes), which no operation "
            f"of a load step is meant to move at once. Write e.g. 1MB, 10MiB or 4GiB.")
    return size


def format_rate(hz: float) -> str:
    if hz >= 100:
        return f"{hz:.0f} Hz"
    if hz >= 10:
        return f"{hz:.1f} Hz"
    return f"{hz:.2f} Hz"


def format_seconds(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s" if seconds < 100 else f"{seconds:.0f} s"


def format_change(change: float | None) -> str:
    """A relative change as the tables write it: ``-12%``, ``+3%``; ``0%`` for a change
    that rounds to none (never ``-0%``); ``-`` when unknown."""
    if change is None or not math.isfinite(change):
        return "-"
    percent = round(change * 100)
    return "0%" if percent == 0 else f"{percent:+d}%"
