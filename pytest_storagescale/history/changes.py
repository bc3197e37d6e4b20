"""Where a step's figures moved over its history: change points and slow drift.

A series is one step's rate (or p99) in run order. Change points: ruptures' PELT
(:class:`ruptures.Pelt`, cost ``l2``) on the logarithm of the series (a 2x slowdown is
the same shift at 100 Hz as at 10 kHz), with the penalty ``max(2 s^2 ln n, 4 d^2)``:
``s`` the series' noise (the median absolute difference of consecutive runs, robust to
the shifts themselves), ``d`` the gate's minimum effect in log units
(:data:`~.gate.DEFAULT_MIN_EFFECT_RATE`: 15 % lower rate; p99 25 % higher). A change
point PELT finds is reported when the median of the (up to three) runs after it differs
from that of the (up to three) runs before it by more than the minimum effect: it names
the first run of the new level and its version.

Drift: over the runs since the last reported change point (at least
:data:`DRIFT_MIN_RUNS`), the Theil-Sen slope of the log series
(:func:`scipy.stats.theilslopes`, 95 % interval); a drift is reported when the whole
interval is on the worse side and the fitted change across those runs exceeds the
minimum effect, though no single change point did.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..gate import DEFAULT_MIN_EFFECT_P99, DEFAULT_MIN_EFFECT_RATE

#: fewer runs than this since the last change point: no drift is judged
DRIFT_MIN_RUNS = 5
#: runs each side of a change point whose medians measure its size
SIDE_RUNS = 3


@dataclass(frozen=True)
class Metric:
    """A figure of a step and which way is worse."""

    name: str
    #: +1: higher is worse (latency); -1: lower is worse (rate)
    worse: int
    min_effect: float

    def shift(self, before: float, after: float) -> float:
        """How far ``after`` is from ``before``, in log units (always >= 0)."""
        return abs(math.log(after / before))

    def limit(self) -> float:
        """The minimum effect in log units: a rate 15 % lower, a p99 25 % higher."""
        return -math.log(1 - self.min_effect) if self.worse < 0 else math.log(
            1 + self.min_effect)


def metrics(min_effect_rate: float = DEFAULT_MIN_EFFECT_RATE,
            min_effect_p99: float = DEFAULT_MIN_EFFECT_P99) -> tuple[Metric, Metric]:
    return Metric("rate_hz", -1, min_effect_rate), Metric("p99_s", +1, min_effect_p99)


@dataclass(frozen=True)
class Change:
    """A change point: the series moved at run ``index`` (the first of the new level)."""

    metric: str
    index: int
    before: float
    after: float
    worse: bool

    @property
    def ratio(self) -> float:
        return self.after / self.before


@dataclass(frozen=True)
class Drift:
    """A slow drift over runs ``first``..``last`` (inclusive) with no change point."""

    metric: str
    first: int
    last: int
    #: the fitted ratio last / first (0.7: 30 % lower)
    ratio: float
    #: the fitted ratio per run, and its 95 % interval
    per_run: float
    low: float
    high: float


def _usable(values: Sequence[float | None]) -> list[tuple[int, float]]:
    return [(index, float(value)) for index, value in enumerate(values)
            if value is not None and math.isfinite(value) and value > 0]


def _noise(logs: Sequence[float]) -> float:
    """The series' noise: MAD of consecutive differences, scaled to a normal's s.d."""
    if len(logs) < 3:
        return 0.0
    steps = [b - a for a, b in zip(logs, logs[1:], strict=False)]
    centre = statistics.median(steps)
    return 1.4826 * statistics.median(abs(s - centre) for s in steps) / math.sqrt(2)


def change_points(values: Sequence[float | None], metric: Metric) -> list[Change]:
    """The change points of ``values`` (a step's figure per run; None: not measured)
    beyond the minimum effect, by the index in ``values`` of the first run after each."""
    import numpy as np
    import ruptures

    points = _usable(values)
    if len(points) < 2:
        return []
    logs = [math.log(value) for _, value in points]
    limit = metric.limit()
    penalty = max(2 * _noise(logs) ** 2 * math.log(len(logs)), 4 * limit ** 2)
    signal = np.asarray(logs).reshape(-1, 1)
    breaks = ruptures.Pelt(model="l2", min_size=1, jump=1).fit(signal).predict(pen=penalty)
    bounds = [0, *breaks]
    found = []
    for number, start in enumerate(bounds[1:-1], start=1):
        before = logs[max(bounds[number - 1], start - SIDE_RUNS):start]
        after = logs[start:min(bounds[number + 1], start + SIDE_RUNS)]
        level_before = math.exp(statistics.median(before))
        level_after = math.exp(statistics.median(after))
        if metric.shift(level_before, level_after) > limit:
            worse = (level_after - level_before) * metric.worse > 0
            found.append(Change(metric.name, points[start][0], level_before, level_after,
                                worse))
    return found


def drift(values: Sequence[float | None], metric: Metric,
          since: int = 0) -> Drift | None:
    """A slow drift to the worse of ``values`` from index ``since`` on (the runs after
    the last change point), or None."""
    from scipy.stats import theilslopes

    points = [(index, value) for index, value in _usable(values) if index >= since]
    if len(points) < DRIFT_MIN_RUNS:
        return None
    order = [float(number) for number in range(len(points))]
    fit = theilslopes([math.log(value) for _, value in points], order, alpha=0.95)
    slope, low, high = float(fit.slope), float(fit.low_slope), float(fit.high_slope)
    total = slope * (len(points) - 1)
    worse_side = (low > 0) if metric.worse > 0 else (high < 0)
    if not worse_side or abs(total) <= metric.limit():
        return None
    return Drift(metric.name, points[0][0], points[-1][0], math.exp(total),
                 math.exp(slope), math.exp(low), math.exp(high))
