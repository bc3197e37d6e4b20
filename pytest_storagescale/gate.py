"""The gate: is a step slower than the same step of its baseline, by how much, and how
sure is that.

One 5-second number per step and a fixed ratio (``rate_hz >= 0.25 * baseline``) cannot
tell a slower storage from a busier client host. The gate compares the per-window
samples of a step (its measured window cut in :data:`~.load.stats.WINDOWS` equal
sub-windows: operations and latency percentiles of each, :class:`WindowSample`) with
the samples of the same step in one or several baseline runs (pooled: their spread is
the site's noise), and gives the ratio this run / baseline of the rate, p50 and p99 with
a bootstrap confidence interval (:func:`scipy.stats.bootstrap`, ratio of the means of
the window samples, 95 %, a fixed seed: the same samples give the same interval).

The verdict (:class:`GateVerdict`) per metric, with ``m`` the section's minimum effect
(``min_effect_rate``, default 15 % lower rate; ``min_effect_p99``, default 25 % higher
p99), on the ratio's interval ``[low, high]``:

* ``regressed``: wholly beyond the minimum effect (rate: ``high < 1 - m``; p99:
  ``low > 1 + m``);
* ``improved``: wholly beyond it the other way (rate: ``low > 1 / (1 - m)``; p99:
  ``high < 1 / (1 + m)``);
* ``unchanged``: wholly within those bounds;
* ``inconclusive``: straddles a bound, too few samples, or a reason outside the
  storage (the client host markedly slower than in the baseline's runs, by its probe
  :func:`probe_client_host`; an open-loop step whose schedule was not kept or whose
  door achieved far less than offered).

A latency (p50, p99) whose mean is below the section's ``latency_floor`` (default
:data:`DEFAULT_LATENCY_FLOOR_S`, 1 ms) on both sides is not judged: its effect is
``unchanged`` with ``below_floor`` set, and the step's reason says so (a file driver's
p99 of 7 us read 105 us on a busy machine: a ratio of 15 between two numbers no storage
admin would call slow). One side at or above the floor is judged as any other.

A step is ``regressed`` when its rate or p99 is (p50 is shown, not judged); else
``inconclusive`` when one of them is; else ``improved`` when one is; else
``unchanged``. A ``regressed`` step fails its test (a threshold failure naming the
ratio and its interval) after being measured once more (``retest``: ``confirmed``, or
``not reproduced``, then it is ``inconclusive`` and does not fail). ``inconclusive``
never fails nor passes silently: it is the step's ``vs base`` in the table and JSON.

Contract with the other readers (compare, HTML, Allure), in the results JSON:

* each side of a step (and a one-sided step's top level) has ``windows``: a list of
  ``{"start_s", "width_s", "operations", "p50_s", "p99_s"}`` (latencies null for a
  window without a succeeded operation); absent in results of earlier releases (a
  gate against them is ``inconclusive``, reason ``baseline has no per-window
  samples``);
* a step has ``client_probe``: ``{"before_mb_s", "after_mb_s"}`` (the client host's
  speed by :func:`probe_client_host` around the step);
* a step judged against a baseline has ``gate``: :meth:`StepGate.to_json`, i.e.
  ``{"verdict", "reason", "metric", "ratio", "low", "high", "effects": {metric:
  {"ratio", "low", "high", "verdict", "min_effect", "below_floor"}}, "samples",
  "baseline_samples",
  "baseline_runs", "host_slowdown", "stall", "retest"}``; ``metric``, ``ratio``,
  ``low``, ``high`` are the deciding metric's (the rate's when none decides).
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "DEFAULT_LATENCY_FLOOR_S", "DEFAULT_MIN_EFFECT_P99", "DEFAULT_MIN_EFFECT_RATE",
    "DEFAULT_PAIRED_BUDGET", "Effect",
    "GateSettings",
    "GateVerdict", "HostProbe", "StepGate", "WindowSample", "effect", "host_pvalue",
    "host_shown_slowdown",
    "judge_pairs", "judge_samples", "paired_effect", "pairs_needed", "pairs_needed_note",
    "probe_client_host", "reproduced",
]

#: a step this much slower in rate than its baseline (at 95 % confidence) regressed
DEFAULT_MIN_EFFECT_RATE = 0.15
#: a step whose p99 is this much higher than its baseline's regressed
DEFAULT_MIN_EFFECT_P99 = 0.25
#: a latency (p50, p99) below this on both sides is not judged: 1 ms, less than a disk
#: seek or a WAN round trip; a change among microseconds is the client host's scheduling
#: (a busy machine made a file driver's p99 of 7 us read 105 us), not a storage to fix
DEFAULT_LATENCY_FLOOR_S = 0.001
#: a paired step measured while ``inconclusive`` until each side measured this many
#: times its duration (a section's ``paired_budget``)
DEFAULT_PAIRED_BUDGET = 3.0
#: the bootstrap's seed: the same samples give the same interval, run after run
SEED = 32
#: the share of the pairs' log ratios cut at each end by the ``trimmed`` statistic
TRIM = 0.2
#: the paired gate's statistics (:attr:`GateSettings.paired_statistic`)
PAIRED_STATISTICS = ("mean", "trimmed", "t")
#: the client host probe this much slower than in the baseline's runs: a regression
#: is the host's, not (provably) the storage's
HOST_SLOWER = 0.25
#: ... and shown slower: the step's probes (before, after) below the baseline runs'
#: by a one-sided Mann-Whitney U test (:func:`host_pvalue`) at this level. Two probes
#: against one baseline run's two cannot reach it (the exact p is at least 1/6):
#: the host is excused only against three baseline runs or more, its two probes below
#: all six of theirs (p = 1/28). Beside ``stress-ng --cpu 4`` one xrootd's probe
#: ranged 2.3x faster to 79 % slower than its baseline runs' with the server alike
#: or capped to a quarter of its rate (Spearman 0.1 with the step's rate over 92
#: steps): the slowdown alone made 6 of 13 capped runs ``inconclusive``
HOST_ALPHA = 0.05
#: an open-loop step that achieved less than this share of its offered rate measured
#: its door's refusal or its client host, not a rate to compare
ACHIEVED_SHARE = 0.5


class GateVerdict(StrEnum):
    REGRESSED = "regressed"
    UNCHANGED = "unchanged"
    IMPROVED = "improved"
    INCONCLUSIVE = "inconclusive"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class WindowSample:
    """One sub-window of a step's measured window: its start (seconds after the window
    began), width, succeeded operations and latency percentiles (None: no operation
    succeeded in it)."""

    start_s: float
    width_s: float
    operations: int
    p50_s: float | None = None
    p99_s: float | None = None

    @property
    def rate_hz(self) -> float:
        return self.operations / self.width_s if self.width_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"start_s": round(self.start_s, 6), "width_s": round(self.width_s, 6),
                "operations": self.operations, "p50_s": self.p50_s, "p99_s": self.p99_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WindowSample:
        def seconds(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)
        return cls(start_s=float(data.get("start_s") or 0.0),
                   width_s=float(data.get("width_s") or 0.0),
                   operations=int(data.get("operations") or 0),
                   p50_s=seconds("p50_s"), p99_s=seconds("p99_s"))


def combine(sides: Sequence[Sequence[WindowSample]]) -> list[WindowSample]:
    """The windows of a step of several sides: operations added per window; the
    latencies only when one side has them (the sides' histograms are not kept per
    window, so a mixed step's p50/p99 per window is not known: its gate judges the
    rate)."""
    sides = [side for side in sides if side]
    if len(sides) == 1:
        return list(sides[0])
    if not sides:
        return []
    count = min(len(side) for side in sides)
    return [WindowSample(start_s=sides[0][i].start_s, width_s=sides[0][i].width_s,
                         operations=sum(side[i].operations for side in sides))
            for i in range(count)]


@dataclass(frozen=True)
class GateSettings:
    """The minimum effects a section asks for, and the statistics' knobs."""

    min_effect_rate: float = DEFAULT_MIN_EFFECT_RATE
    min_effect_p99: float = DEFAULT_MIN_EFFECT_P99
    #: a latency whose mean is below this on both sides is not judged (0: every one is)
    latency_floor_s: float = DEFAULT_LATENCY_FLOOR_S
    confidence: float = 0.95
    resamples: int = 2000
    #: fewer window samples than this on either side: ``inconclusive``
    min_samples: int = 4
    seed: int = SEED
    #: the paired gate's statistic over the pairs' log ratios (:func:`paired_effect`):
    #: ``mean`` (their geometric mean, a BCa interval), ``trimmed`` (the mean of the
    #: middle 60 %, :data:`TRIM` cut at each end, a BCa interval), ``t`` (the geometric
    #: mean with Student's t interval)
    paired_statistic: str = "mean"
    #: a paired step's budget: while ``inconclusive`` more pairs are measured until each
    #: side measured this many times the step's duration (:mod:`.paired`)
    paired_budget: float = DEFAULT_PAIRED_BUDGET


@dataclass(frozen=True)
class Effect:
    """The ratio this run / baseline of one metric's window means, its interval and
    what it says against the minimum effect."""

    metric: str
    ratio: float | None
    low: float | None
    high: float | None
    verdict: GateVerdict
    min_effect: float
    #: a latency below this floor (seconds) on both sides: not judged (``unchanged``)
    below_floor: float | None = None
    #: the two sides' means (this run, baseline) of a latency judged against the floor
    means: tuple[float, float] | None = None

    def to_json(self) -> dict[str, Any]:
        data = {"ratio": _finite(self.ratio), "low": _finite(self.low),
                "high": _finite(self.high), "verdict": self.verdict.value,
                "min_effect": self.min_effect}
        if self.below_floor is not None:
            data["below_floor"] = self.below_floor
        return data

    @classmethod
    def from_json(cls, metric: str, data: dict[str, Any]) -> Effect:
        floor = data.get("below_floor")
        return cls(metric=metric, ratio=data.get("ratio"), low=data.get("low"),
                   high=data.get("high"), verdict=_verdict(data.get("verdict")),
                   min_effect=float(data.get("min_effect") or 0.0),
                   below_floor=float(floor) if isinstance(floor, int | float)
                   and not isinstance(floor, bool) else None)

    def interval_text(self) -> str:
        """``0.41 [0.37-0.45]``; ``?`` when not computed."""
        if self.ratio is None:
            return "?"
        if self.low is None or self.high is None:
            return f"{self.ratio:.2f}"
        return f"{self.ratio:.2f} [{self.low:.2f}-{self.high:.2f}]"


@dataclass(frozen=True)
class StepGate:
    """A step's gate: its verdict, why, and the effects behind it (see the module's
    docstring for its JSON, the ``gate`` key of a step)."""

    verdict: GateVerdict
    reason: str
    effects: dict[str, Effect] = field(default_factory=dict)
    #: the metric that decided (None: nothing was computed)
    metric: str | None = None
    samples: int = 0
    baseline_samples: int = 0
    baseline_runs: int = 0
    #: the client host's probe this share slower than in the baseline's runs (-0.1:
    #: faster); None: not probed on one side
    host_slowdown: float | None = None
    #: a note on stalls (windows with nothing completed, or a latency distribution the
    #: Kolmogorov-Smirnov test finds different from the baseline's)
    stall: str | None = None
    #: a regressed step measured again: ``confirmed`` or ``not reproduced``
    retest: str | None = None

    @property
    def deciding(self) -> Effect | None:
        if self.metric is not None and self.metric in self.effects:
            return self.effects[self.metric]
        return self.effects.get("rate_hz")

    @property
    def ratio(self) -> float | None:
        return self.deciding.ratio if self.deciding else None

    @property
    def low(self) -> float | None:
        return self.deciding.low if self.deciding else None

    @property
    def high(self) -> float | None:
        return self.deciding.high if self.deciding else None

    @property
    def fails(self) -> bool:
        return self.verdict is GateVerdict.REGRESSED

    def short(self) -> str:
        """The table's ``vs base``: ``rate 0.41 [0.37-0.45] regressed``."""
        effect = self.deciding
        label = {"rate_hz": "rate", "p99_s": "p99", "p50_s": "p50"}.get(
            effect.metric if effect else "", "")
        number = f"{label} {effect.interval_text()} " if effect and effect.ratio is not None \
            else ""
        retest = f" ({self.retest})" if self.retest else ""
        return f"{number}{self.verdict.value}{retest}"

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict.value, "reason": self.reason, "metric": self.metric,
                "ratio": _finite(self.ratio), "low": _finite(self.low),
                "high": _finite(self.high),
                "effects": {name: e.to_json() for name, e in self.effects.items()},
                "samples": self.samples, "baseline_samples": self.baseline_samples,
                "baseline_runs": self.baseline_runs,
                "host_slowdown": _finite(self.host_slowdown), "stall": self.stall,
                "retest": self.retest}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepGate:
        effects = data.get("effects") or {}
        return cls(verdict=_verdict(data.get("verdict")), reason=str(data.get("reason", "")),
                   effects={name: Effect.from_json(name, value)
                            for name, value in effects.items() if isinstance(value, dict)},
                   metric=data.get("metric"), samples=int(data.get("samples") or 0),
                   baseline_samples=int(data.get("baseline_samples") or 0),
                   baseline_runs=int(data.get("baseline_runs") or 0),
                   host_slowdown=data.get("host_slowdown"), stall=data.get("stall"),
                   retest=data.get("retest"))


def _verdict(value: Any) -> GateVerdict:
    try:
        return GateVerdict(value)
    except ValueError:
        return GateVerdict.INCONCLUSIVE


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def effect(metric: str, now: Sequence[float], base: Sequence[float], *, min_effect: float,
           higher_is_better: bool, settings: GateSettings = GateSettings(),
           runs: Sequence[Sequence[float]] = ()) -> Effect:
    """The ratio mean(now) / mean(base) with its bootstrap interval, and its verdict
    against ``min_effect`` (see the module's docstring). ``runs``: ``base`` by baseline
    run; with several, the interval is widened by their spread (:func:`run_spread`)."""
    import numpy as np
    from scipy.stats import bootstrap

    def inconclusive(ratio: float | None = None) -> Effect:
        return Effect(metric, ratio, None, None, GateVerdict.INCONCLUSIVE, min_effect)

    if len(now) < settings.min_samples or len(base) < settings.min_samples:
        return inconclusive()
    a, b = np.asarray(now, dtype=float), np.asarray(base, dtype=float)
    if b.mean() <= 0:
        return inconclusive()
    ratio = float(a.mean() / b.mean())

    def statistic(x, y, axis=-1):
        below = np.mean(y, axis=axis)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(below > 0, np.mean(x, axis=axis) / below, np.nan)

    if np.ptp(a) == 0 and np.ptp(b) == 0:  # no spread: the ratio is exact
        low = high = ratio
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degenerate resamples: reported as NaN
            result = bootstrap((a, b), statistic, n_resamples=settings.resamples,
                               confidence_level=settings.confidence, method="percentile",
                               vectorized=True, paired=False,
                               rng=np.random.default_rng(settings.seed))
        low, high = (float(result.confidence_interval.low),
                     float(result.confidence_interval.high))
        if not (math.isfinite(low) and math.isfinite(high)):
            return inconclusive(ratio)
    lowest, highest = run_spread(runs)
    low, high = low / highest, high / lowest
    return Effect(metric, ratio, low, high, _against(low, high, min_effect, higher_is_better),
                  min_effect)


def paired_effect(metric: str, pairs: Sequence[tuple[float, float]], *, min_effect: float,
                  higher_is_better: bool, settings: GateSettings = GateSettings()) -> Effect:
    """The ratio B / A of a metric measured in pairs ``(a, b)`` of runs made one right
    after the other (a paired comparison's A B B A ...): the geometric mean of the
    pairs' own ratios b / a, with the BCa bootstrap interval of that mean over the
    pairs (:func:`scipy.stats.bootstrap`, a fixed seed), widened to Student's t
    interval where that is wider (a few pairs' bootstrap is too narrow; not for the
    ``trimmed`` statistic). Each pair's ratio is taken
    under the machine's load of that moment: a load that halves both runs of a pair
    leaves its ratio alone, where the windows of the two sides pooled carry it whole
    (beside ``stress-ng --cpu 4`` the same server measured 0.66-2.27 of itself from
    one 0.5 s run to the next). A pair with a side at zero (nothing completed, a
    stall) counts that side as a hundredth of the other's: a large, finite effect."""
    import numpy as np
    from scipy.stats import bootstrap

    def inconclusive(ratio: float | None = None) -> Effect:
        return Effect(metric, ratio, None, None, GateVerdict.INCONCLUSIVE, min_effect)

    usable = [(a, b) for a, b in pairs if a is not None and b is not None
              and math.isfinite(a) and math.isfinite(b) and (a > 0 or b > 0)]
    if len(usable) < settings.min_samples:
        return inconclusive()
    a = np.asarray([max(x, y / 100) for x, y in usable], dtype=float)
    b = np.asarray([max(y, x / 100) for x, y in usable], dtype=float)
    logs = np.log(b / a)
    name = settings.paired_statistic
    if name not in PAIRED_STATISTICS:
        raise ValueError(f"paired_statistic {name!r}: one of {', '.join(PAIRED_STATISTICS)}")
    if name == "trimmed":
        from scipy.stats import trim_mean

        def center(x, axis=-1):
            return trim_mean(x, TRIM, axis=axis)
    else:
        def center(x, axis=-1):
            return np.mean(x, axis=axis)
    ratio = float(np.exp(center(logs)))
    if np.ptp(logs) == 0:
        low = high = ratio
    elif name == "t":
        from scipy.stats import ttest_1samp

        interval = ttest_1samp(logs, 0.0).confidence_interval(settings.confidence)
        low, high = float(np.exp(interval.low)), float(np.exp(interval.high))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degenerate resamples: reported as NaN
            result = bootstrap((logs,), center, n_resamples=settings.resamples,
                               confidence_level=settings.confidence, method="BCa",
                               rng=np.random.default_rng(settings.seed))
        low, high = (float(np.exp(result.confidence_interval.low)),
                     float(np.exp(result.confidence_interval.high)))
        if name == "mean":
            # the bootstrap of a few pairs knows only them: at 4 its interval is about
            # half Student's t's, and a 23 % loss came out ``unchanged`` at the first
            # look in 5 of 200 trials resampled from measured pairs
            # (benchmarks/gate_power.py); at many pairs the two agree. The mean's
            # interval is the hull of both (``trimmed`` keeps the bootstrap's: the t
            # interval of the mean is the one a starved run carries)
            from scipy.stats import ttest_1samp

            t = ttest_1samp(logs, 0.0).confidence_interval(settings.confidence)
            low, high = min(low, float(np.exp(t.low))), max(high, float(np.exp(t.high)))
    if not (math.isfinite(low) and math.isfinite(high)):
        return inconclusive(ratio)
    return Effect(metric, ratio, low, high,
                  _against(low, high, min_effect, higher_is_better), min_effect)


def floored(e: Effect, now: Sequence[float], base: Sequence[float], floor: float) -> Effect:
    """Latency effect ``e`` not judged when the means of both sides' values (``now``,
    ``base``) are below ``floor`` seconds: ``unchanged``, with :attr:`Effect.below_floor`
    and the two means (the reason says so). A rate, a floor of 0, no values or one side at
    or above the floor: ``e`` as it is."""
    if e.metric == "rate_hz" or floor <= 0 or not now or not base:
        return e
    mine, theirs = sum(now) / len(now), sum(base) / len(base)
    if not (mine < floor and theirs < floor):
        return e
    return replace(e, verdict=GateVerdict.UNCHANGED, below_floor=floor, means=(mine, theirs))


def _seconds_text(value: float) -> str:
    """``7 us``, ``0.42 ms``, ``105 ms``."""
    if value < 1e-3:
        return f"{value * 1e6:.0f} us"
    return f"{value * 1e3:.3g} ms"


def floor_note(effects: dict[str, Effect]) -> str | None:
    """What the step's reason says of its latencies below the floor, or None."""
    notes = []
    for key in ("p99_s", "p50_s"):
        e = effects.get(key)
        if e is None or e.below_floor is None:
            continue
        name = _WORDS[key][0]
        means = (f" (mean {_seconds_text(e.means[1])} -> {_seconds_text(e.means[0])})"
                 if e.means else "")
        notes.append(f"{name}{means} below the latency floor "
                     f"({_seconds_text(e.below_floor)}) on both sides: not judged")
    return "; ".join(notes) or None


def _with_floor(reason: str, effects: dict[str, Effect]) -> str:
    note = floor_note(effects)
    return f"{reason}; {note}" if note else reason


def _against(low: float, high: float, min_effect: float, higher_is_better: bool
             ) -> GateVerdict:
    """The verdict of an interval ``[low, high]`` on a ratio against ``min_effect``."""
    if higher_is_better:
        worse, better = 1 - min_effect, 1 / (1 - min_effect)
        regressed, improved = high < worse, low > better
    else:
        worse, better = 1 + min_effect, 1 / (1 + min_effect)
        regressed, improved = low > worse, high < better
    if regressed:
        return GateVerdict.REGRESSED
    if improved:
        return GateVerdict.IMPROVED
    if min(worse, better) <= low and high <= max(worse, better):
        return GateVerdict.UNCHANGED
    return GateVerdict.INCONCLUSIVE


def reproduced(first: StepGate, again: StepGate) -> bool:
    """A ``regressed`` step measured again reproduced its regression: the second
    measurement is ``regressed`` too, or, on the metric that decided the first, its
    ratio lies beyond the minimum effect and its whole interval on the worse side of no
    change (the same slowdown, shown real, though its interval alone reaches back over
    the bound). A transient that made the first measurement (a busy moment, a stall)
    leaves the second near 1 or its interval across it: ``not reproduced``.

    Measured beside ``stress-ng --cpu 4`` (benchmarks/bench_gate.py --paired, 2026-11-29):
    a side B 22-25 % slower came out 0.78 [0.71-0.85] ``regressed``, then 0.84
    [0.77-0.90]: by ``regressed`` alone not reproduced, by this rule confirmed. The
    same server (A/A) must be ``regressed`` first (none of 22 trials were) and then
    again below the bound with its interval below 1 (2.5 % at most at 4 pairs, far
    less at 16)."""
    if again.fails:
        return True
    if first.metric is None:
        return False
    effect = again.effects.get(first.metric)
    if (effect is None or effect.ratio is None or effect.low is None or effect.high is None
            or effect.below_floor is not None):
        return False
    if first.metric == "rate_hz":
        return effect.ratio <= 1 - effect.min_effect and effect.high < 1
    return effect.ratio >= 1 + effect.min_effect and effect.low > 1


def judge_pairs(pairs: Sequence[tuple[WindowSample, WindowSample]], *,
                settings: GateSettings = GateSettings()) -> StepGate:
    """The gate of a paired step: ``pairs`` of runs ``(a, b)`` made one right after
    the other, each run as one :class:`WindowSample` (its succeeded operations over its
    measured window, its p50 and p99). Rate and p99 by :func:`paired_effect`; the
    verdict as :func:`judge_samples`'s (regressed, else inconclusive, else improved,
    else unchanged)."""
    common: dict[str, Any] = dict(samples=len(pairs), baseline_samples=len(pairs),
                                  baseline_runs=1)
    if len(pairs) < settings.min_samples:
        return StepGate(GateVerdict.INCONCLUSIVE,
                        f"too few pairs of runs ({len(pairs)}; at least "
                        f"{settings.min_samples}): raise duration", **common)
    effects = {"rate_hz": paired_effect(
        "rate_hz", [(a.rate_hz, b.rate_hz) for a, b in pairs],
        min_effect=settings.min_effect_rate, higher_is_better=True, settings=settings)}
    for key in ("p50_s", "p99_s"):
        latencies = [(getattr(a, key), getattr(b, key)) for a, b in pairs]
        both = [(x, y) for x, y in latencies if x is not None and y is not None]
        if both:
            effects[key] = floored(
                paired_effect(key, latencies, min_effect=settings.min_effect_p99,
                              higher_is_better=False, settings=settings),
                [y for _, y in both], [x for x, _ in both], settings.latency_floor_s)
    judged = [effects[name] for name in ("rate_hz", "p99_s") if name in effects]
    deciding = judged[0]
    for wanted in (GateVerdict.REGRESSED, GateVerdict.INCONCLUSIVE, GateVerdict.IMPROVED,
                   GateVerdict.UNCHANGED):
        found = next((e for e in judged if e.verdict is wanted), None)
        if found is not None:
            deciding = found
            break
    empty = sum(1 for _, b in pairs if b.operations == 0)
    stall = (f"{empty} of {len(pairs)} runs of side B completed nothing (stalls)"
             if empty else None)
    reason = _with_floor(_reason(deciding), effects)
    if deciding.verdict is GateVerdict.INCONCLUSIVE:
        note = pairs_needed_note([(a.rate_hz, b.rate_hz) for a, b in pairs],
                                 settings.min_effect_rate, settings.confidence)
        reason = f"{reason}; {note}" if note else reason
    return StepGate(deciding.verdict, reason, effects, deciding.metric, stall=stall, **common)


def pairs_needed(spread: float, ratio: float, bound: float, confidence: float = 0.95
                 ) -> int | None:
    """About how many pairs whose log ratios B / A spread by ``spread`` (their
    standard deviation) it takes for the interval of a true ``ratio`` to end beyond
    ``bound`` (half the time: the interval's half-width equal to the distance between
    them on the log scale; the normal quantile, so a slight underestimate at a few
    pairs). None when ``ratio`` is not beyond ``bound`` (no count of pairs shows it)."""
    from scipy.stats import norm

    if spread <= 0 or ratio <= 0 or bound <= 0 or math.isclose(ratio, bound):
        return None
    distance = abs(math.log(bound) - math.log(ratio))
    if distance == 0:
        return None
    z = float(norm.ppf(0.5 + confidence / 2))
    return max(2, math.ceil((z * spread / distance) ** 2))


def pairs_needed_note(rates: Sequence[tuple[float, float]], min_effect: float,
                      confidence: float = 0.95) -> str | None:
    """What an ``inconclusive`` paired step says of its noise: the spread of its
    pairs' log rate ratios, and how many pairs it would take to show a rate loss of
    the minimum effect's and a half (0.85 -> 0.75 of A: the issue's 25 % against the
    default 15 %) at that spread. Beside ``stress-ng --cpu 4`` on 2 cores the spread
    of one xrootd against itself was 0.6-1.3: a 25 % loss takes 90-420 pairs, where
    the default budget measures 12 (docs/benchmarks.md)."""
    import statistics

    logs = [math.log(b / a) for a, b in rates if a > 0 and b > 0]
    if len(logs) < 2:
        return None
    spread = statistics.stdev(logs)
    target = 1 - 1.5 * min_effect
    needed = pairs_needed(spread, target, 1 - min_effect, confidence)
    if needed is None or target <= 0:
        return None
    return (f"the pairs' log rate ratios spread by {spread:.2f} (standard deviation): at "
            f"that spread a rate of {target:.2f} of A's takes about {needed} pairs to come "
            f"out regressed ({len(logs)} measured; raise the paired budget, or quiet the "
            f"client host)")


def run_spread(runs: Sequence[Sequence[float]]) -> tuple[float, float]:
    """The baseline runs' own spread: the lowest and highest run mean over the mean of
    all their samples (1, 1 for fewer than two runs). The windows of one step know only
    the noise within a step; runs of the same version on the same site differ by more
    (on this project's loaded machine up to -74 % ... +175 % per 5 s step), and a
    regression is only one beyond that: the ratio's interval is divided by these
    bounds."""
    means = [sum(run) / len(run) for run in runs if run]
    pooled = [value for run in runs for value in run]
    if len(means) < 2 or not pooled:
        return 1.0, 1.0
    center = sum(pooled) / len(pooled)
    if center <= 0 or min(means) <= 0:
        return 1.0, 1.0
    return min(means) / center, max(means) / center


def _latencies(samples: Sequence[WindowSample], key: str) -> list[float]:
    return [value for s in samples if (value := getattr(s, key)) is not None]


def stall_note(now: Sequence[WindowSample], base: Sequence[WindowSample]) -> str | None:
    """Windows in which nothing completed while others did (a stall), or a per-window
    p50 distribution the two-sample Kolmogorov-Smirnov test finds different from the
    baseline's (p < 0.01): said, not judged."""
    notes = []
    empty = sum(1 for s in now if s.operations == 0)
    if empty and empty < len(now):
        notes.append(f"{empty} of {len(now)} windows completed nothing (stalls)")
    mine, theirs = _latencies(now, "p50_s"), _latencies(base, "p50_s")
    if len(mine) >= 4 and len(theirs) >= 4:
        from scipy.stats import ks_2samp

        test = ks_2samp(mine, theirs)
        if test.pvalue < 0.01:
            notes.append(f"per-window p50 distribution differs from the baseline's "
                         f"(Kolmogorov-Smirnov D={test.statistic:.2f}, p={test.pvalue:.1g})")
    return "; ".join(notes) or None


#: said with a ``regressed`` against a single baseline run
ONE_RUN = ("; one baseline run: the interval knows nothing of this site's run-to-run "
           "noise (on a busy host the same server again can come out regressed): give "
           "three or more (--storage-baseline a.json b.json c.json)")


def judge_samples(now: Sequence[WindowSample], bases: Sequence[Sequence[WindowSample]], *,
                  settings: GateSettings = GateSettings(),
                  host_slowdown: float | None = None, host_p: float | None = None,
                  host_shown: float | None = None,
                  not_comparable: str | None = None) -> StepGate:
    """The gate of a step with window samples ``now`` against the windows of the same
    step in each baseline run (``bases``, pooled); see :func:`_judge_samples`. A
    ``regressed`` against one baseline run says that one run cannot know the site's
    noise (:data:`ONE_RUN`): beside ``stress-ng --cpu 4`` (load 20-40) the same xrootd
    came out ``regressed (confirmed)`` against one earlier run (0.48, 0.39 of it)."""
    gate = _judge_samples(now, bases, settings=settings, host_slowdown=host_slowdown,
                          host_p=host_p, host_shown=host_shown,
                          not_comparable=not_comparable)
    if gate.verdict is GateVerdict.REGRESSED and gate.baseline_runs == 1:
        gate = replace(gate, reason=gate.reason + ONE_RUN)
    return gate


def _judge_samples(now: Sequence[WindowSample], bases: Sequence[Sequence[WindowSample]], *,
                  settings: GateSettings = GateSettings(),
                  host_slowdown: float | None = None, host_p: float | None = None,
                  host_shown: float | None = None,
                  not_comparable: str | None = None) -> StepGate:
    """The gate of a step with window samples ``now`` against the windows of the same
    step in each baseline run (``bases``, pooled). ``host_slowdown``: how much slower
    the client host probed than in the baseline runs; ``host_p``: the p-value of its
    probes being slower (:func:`host_pvalue`; None: not tested). A regression is
    blamed on the host (``inconclusive``) only when the host is both that much slower
    (:data:`HOST_SLOWER`) and shown slower (``host_p`` below :data:`HOST_ALPHA`), and
    the slowdown every probe shows (``host_shown``, :func:`host_shown_slowdown`; None:
    ``host_slowdown``) can explain it. ``not_comparable``: a reason the step cannot be
    judged at all (an open loop that missed its schedule)."""
    pooled = [sample for base in bases for sample in base]
    common: dict[str, Any] = dict(samples=len(now), baseline_samples=len(pooled),
                                  baseline_runs=sum(1 for base in bases if base),
                                  host_slowdown=host_slowdown)
    if not_comparable:
        return StepGate(GateVerdict.INCONCLUSIVE, not_comparable, **common)
    if not pooled:
        return StepGate(GateVerdict.INCONCLUSIVE,
                        "the baseline has no per-window samples of this step (results of "
                        "an earlier release): run the baseline again with this release",
                        **common)
    if len(now) < settings.min_samples or len(pooled) < settings.min_samples:
        return StepGate(GateVerdict.INCONCLUSIVE,
                        f"too few window samples ({len(now)} here, {len(pooled)} in the "
                        f"baseline; at least {settings.min_samples} each): raise duration",
                        **common)
    effects = {
        "rate_hz": effect("rate_hz", [s.rate_hz for s in now], [s.rate_hz for s in pooled],
                          min_effect=settings.min_effect_rate, higher_is_better=True,
                          settings=settings,
                          runs=[[s.rate_hz for s in base] for base in bases]),
    }
    for key in ("p50_s", "p99_s"):  # p50 shown against p99's minimum effect, not judged
        mine, theirs = _latencies(now, key), _latencies(pooled, key)
        if mine and theirs:
            effects[key] = floored(
                effect(key, mine, theirs, min_effect=settings.min_effect_p99,
                       higher_is_better=False, settings=settings,
                       runs=[_latencies(base, key) for base in bases]),
                mine, theirs, settings.latency_floor_s)
    judged = [effects[name] for name in ("rate_hz", "p99_s") if name in effects]
    stall = stall_note(now, pooled)
    for wanted in (GateVerdict.REGRESSED, GateVerdict.INCONCLUSIVE, GateVerdict.IMPROVED,
                   GateVerdict.UNCHANGED):
        deciding = next((e for e in judged if e.verdict is wanted), None)
        if deciding is not None:
            break
    assert deciding is not None
    gate = StepGate(deciding.verdict, _with_floor(_reason(deciding), effects), effects,
                    deciding.metric, stall=stall, **common)
    slower = (gate.verdict is GateVerdict.REGRESSED and host_slowdown is not None
              and host_slowdown > HOST_SLOWER)
    if slower and not (host_p is not None and host_p < HOST_ALPHA):
        assert host_slowdown is not None
        shown = "not tested" if host_p is None else f"Mann-Whitney p={host_p:.2g}"
        return replace(gate, reason=f"{gate.reason}; the client host probed "
                                    f"{host_slowdown:.0%} slower than the baseline's, not "
                                    f"shown slower ({shown}; at least {HOST_ALPHA:g} with "
                                    f"fewer than three baseline runs): not blamed on it")
    credit = host_slowdown if host_shown is None else host_shown
    if (slower and credit is not None and not _beyond_the_host(deciding, credit)):
        assert host_p is not None
        gate = replace(gate, verdict=GateVerdict.INCONCLUSIVE,
                       reason=f"client host {host_slowdown:.0%} slower than the baseline's "
                              f"(its probe before and after the step; every probe at least "
                              f"{credit:.0%}, Mann-Whitney p={host_p:.2g}): {gate.reason}, "
                              f"which may be the host's; run again on a quieter host")
    elif (gate.verdict is GateVerdict.REGRESSED and host_slowdown is not None
            and host_slowdown > HOST_SLOWER):
        gate = replace(gate, reason=f"{gate.reason}; the client host was {host_slowdown:.0%} "
                                    f"slower than the baseline's, which cannot explain it")
    return gate


def _beyond_the_host(e: Effect, slowdown: float) -> bool:
    """Whether effect ``e`` stays wholly beyond its minimum effect once the client host's
    own slowdown is credited to it: a host ``slowdown`` slower (0.26: at 74 % of its
    baseline speed) can lower a rate by that factor and raise a latency by its inverse,
    no more. A rate ratio of 0.22 [0.16-0.30] on a host 26 % slower is still a
    regression (0.30 / 0.74 = 0.41, beyond 0.85); 0.70 [0.62-0.78] is not (1.05)."""
    speed = 1 - slowdown
    if speed <= 0.05 or e.low is None or e.high is None:
        return False
    if e.metric == "rate_hz":
        return e.high / speed < 1 - e.min_effect
    return e.low * speed > 1 + e.min_effect


_WORDS = {"rate_hz": ("rate", "lower"), "p99_s": ("p99", "higher"), "p50_s": ("p50", "higher")}


def _reason(e: Effect) -> str:
    name, worse = _WORDS.get(e.metric, (e.metric, "worse"))
    if e.below_floor is not None:
        return floor_note({e.metric: e}) or name
    if e.ratio is None:
        return f"{name}: not enough samples to compare"
    interval = (f"ratio {e.ratio:.2f}, 95 % interval "
                f"{e.low:.2f}-{e.high:.2f}" if e.low is not None and e.high is not None
                else f"ratio {e.ratio:.2f}, no interval")
    bound = f"{e.min_effect:.0%} {worse}"
    return {
        GateVerdict.REGRESSED: f"{name} {interval}: wholly beyond the minimum effect "
                               f"({bound})",
        GateVerdict.IMPROVED: f"{name} {interval}: better beyond the minimum effect",
        GateVerdict.UNCHANGED: f"{name} {interval}: within the minimum effect ({bound})",
        GateVerdict.INCONCLUSIVE: _straddled(e, name, interval, bound),
    }[e.verdict]


def _straddled(e: Effect, name: str, interval: str, bound: str) -> str:
    """Which bound an inconclusive interval crosses: the regression's (it may be
    slower by the minimum effect) or only the improvement's (not slower by it, not
    shown to be better)."""
    if e.low is None or e.high is None:
        return f"{name} {interval}: no interval"
    m = e.min_effect
    worse = 1 - m if e.metric == "rate_hz" else 1 + m
    crosses_worse = e.low < worse < e.high
    if crosses_worse:
        return (f"{name} {interval}: straddles the minimum effect ({bound}); more windows "
                f"or baseline runs would decide")
    return (f"{name} {interval}: not {bound} (no regression), but not shown within "
            f"the minimum effect either (the interval crosses {1 / worse:.2f} on the "
            f"other side)")


@dataclass(frozen=True)
class HostProbe:
    """The client host's speed around a step, by :func:`probe_client_host` (MB/s of
    SHA-256 over a buffer in memory: no storage involved)."""

    before_mb_s: float
    after_mb_s: float | None = None

    @property
    def mb_s(self) -> float:
        """The faster of the two: a host slower both before and after the step was
        busier during it (one slow probe is not enough to blame the host)."""
        return max(v for v in (self.before_mb_s, self.after_mb_s) if v is not None)

    def to_json(self) -> dict[str, Any]:
        return {"before_mb_s": self.before_mb_s, "after_mb_s": self.after_mb_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostProbe | None:
        before = data.get("before_mb_s")
        if not before:
            return None
        after = data.get("after_mb_s")
        return cls(float(before), None if after is None else float(after))


#: the probe's buffer and its time budget: 0.5 s, not 0.1 s. Beside ``stress-ng --cpu 4``
#: (load 20-24) 25 probes of each length: 28 % of the 0.1 s probes came out more than
#: 25 % below their median (the gate's "host slower" bound), 4 % of the 0.5 s ones; a
#: 0.1 s probe before and after a step did not follow the step's rate (Spearman 0.1
#: over 92 steps), so it made real regressions ``inconclusive`` at random. A longer
#: probe still sees a host busier for the whole step set (what it is for), and rarely
#: the load's swings of the moment.
_PROBE_BUFFER = b"\x5a" * (256 * 1024)
PROBE_S = 0.5


def probe_client_host(seconds: float = PROBE_S) -> float:
    """MB/s of SHA-256 over a 256 KiB buffer for about ``seconds`` of wall time (at
    most 10 000 rounds): a host whose cores are shared with other work hashes slower.
    Wall time, not CPU time: waiting for a core is what a busy host does to a step."""
    rounds, began = 0, time.perf_counter()
    deadline = began + seconds
    while rounds < 10_000:
        hashlib.sha256(_PROBE_BUFFER).digest()
        rounds += 1
        if time.perf_counter() >= deadline:
            break
    elapsed = max(time.perf_counter() - began, 1e-9)
    return rounds * len(_PROBE_BUFFER) / elapsed / 1e6


def host_pvalue(now: HostProbe | None, bases: Sequence[HostProbe | None]) -> float | None:
    """How sure it is that the host was slower around this step than around the
    baseline runs' steps: the exact one-sided Mann-Whitney U test
    (:func:`scipy.stats.mannwhitneyu`) of this step's probes (before, after) against
    all the baseline runs' probes. None when a side was not probed."""
    from scipy.stats import mannwhitneyu

    def speeds(probe: HostProbe | None) -> list[float]:
        if probe is None:
            return []
        return [v for v in (probe.before_mb_s, probe.after_mb_s) if v is not None]

    mine = speeds(now)
    theirs = [v for base in bases for v in speeds(base)]
    if not mine or not theirs:
        return None
    return float(mannwhitneyu(mine, theirs, alternative="less", method="exact").pvalue)


def host_shown_slowdown(now: HostProbe | None, bases: Sequence[HostProbe | None]
                        ) -> float | None:
    """The slowdown every probe shows: 1 - (this step's fastest probe) / (the baseline
    runs' slowest probe), 0 when they overlap; None when a side was not probed. What a
    regression is credited with before the host is blamed for it (the median's
    slowdown, :func:`host_slowdown`, is said, not credited): beside ``stress-ng`` a
    capped server whose probes were all below the three baseline runs' was excused by
    a median slowdown of 60 % with a rate of 0.10 [0.05-0.39]."""
    mine = [v for v in (now.before_mb_s, now.after_mb_s) if v is not None] if now else []
    theirs = [v for base in bases if base is not None
              for v in (base.before_mb_s, base.after_mb_s) if v is not None]
    if not mine or not theirs or min(theirs) <= 0:
        return None
    return max(0.0, 1 - max(mine) / min(theirs))


def host_slowdown(now: HostProbe | None, bases: Sequence[HostProbe | None]) -> float | None:
    """How much slower the host probed now than in the baseline runs (median of their
    probes): 0.4 for 40 % slower; None when a side was not probed."""
    import statistics

    speeds = [base.mb_s for base in bases if base is not None]
    if now is None or not speeds:
        return None
    reference = statistics.median(speeds)
    return 1 - now.mb_s / reference if reference > 0 else None
