"""The seeds' hand-drawn pictures, drawn from the step records (matplotlib, PNG bytes).

- :func:`timeline_png`: one step, per second: completions and failures (left axis),
  clients with an operation in flight and hung clients (right axis). The timeline
  ends with the step: the measured window, plus the drain after it only while
  something still happened there (see :func:`timeline_seconds`), so an idle tail
  never looks like a dead server. The rates are drawn over the warm-up and the
  measured window only (:func:`rate_bins`): the drain's second holds only the
  operations still in flight, and a window that ends mid-second (a count-bounded
  step) would show a drop that never happened; such a last part second is drawn as
  its count over its length, or left out when shorter than half a second (unless it
  is the whole step: a step shorter than a second is one bin, never an empty plot);
- :func:`ecdf_png`: one step's latency distribution (ECDF, from its HdrHistogram),
  like seed 002's readv ECDFs and seed 003's ``transfertimex.jpg``;
- :func:`scan_png`: rate (and MB/s) vs clients with the thresholds drawn on it, and
  failed and hung vs clients, like seed 003's ``writerate.jpg``; :func:`overlay_png`:
  one scan of several runs (``storagescale compare``), rate and p99 vs clients. The concurrency
  axis is logarithmic whenever a scan has more than one concurrency: the seeds scan
  5 ... 1,000 clients, and a linear axis squeezes the first half of the table into
  its left edge. Every count and rate axis starts at zero; failed and hung are
  whole numbers (an axis of 0 ... 1 when all are 0).

matplotlib is imported when a picture is drawn, never at plugin start.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Sequence
from typing import Any

from ..records import StepRecord

#: the per-second series the engine records for each side
TIMELINE_SERIES = ("completions", "failures", "in_flight", "hung")
#: line colours per side: completions, failures, in flight, hung
_COLOURS = (("tab:blue", "tab:orange", "tab:green", "tab:red"),
            ("tab:cyan", "tab:brown", "tab:olive", "tab:pink"))


def available() -> bool:
    """matplotlib can be imported (an environment without the ``report`` extra: the
    pages say the plots are left out)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display; safe in threads of a headless CI job
    import matplotlib.pyplot as plt

    return plt


#: control characters (C0, DEL, C1, direction overrides): no glyph, written as escapes
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def plain(text: object) -> str:
    """``text`` as matplotlib shows it as written: a ``$`` would start mathtext (a step
    name or version ``$x$`` drawn as math, ``$\\foo$`` a parse error that crashed the
    page), so each is escaped (``\\$``, drawn as ``$``); a control character from a
    results file is written as its escape (``\\x1b``)."""
    shown = _CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}"
                          if ord(match.group()) < 0x100 else f"\\u{ord(match.group()):04x}",
                          str(text))
    return shown.replace("$", r"\$")


def _png(figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    _pyplot().close(figure)
    return buffer.getvalue()


# -- timeline ------------------------------------------------------------------------

def _last_active_second(timelines: list[dict[str, list[int]]]) -> int:
    """One past the last second in which any series is non-zero (0: none)."""
    last = 0
    for timeline in timelines:
        for name in TIMELINE_SERIES:
            series = timeline.get(name) or []
            active = [i for i, value in enumerate(series) if value]
            if active:
                last = max(last, active[-1] + 1)
    return last


def timeline_seconds(record: StepRecord) -> int:
    """How many seconds of ``record``'s timeline to draw.

    The engine records the timeline up to ``hang_timeout`` past the measured
    window; after the drain those seconds are zeros. Drawn: the warm-up and the
    measured window, then the drain up to the last second in which an operation
    ended, was in flight or a client hung; never past the step's wall-clock end
    (``ceil(ended - started)``) nor the recorded seconds."""
    result = record.result
    if result is None:
        return 0
    timelines = [side.timeline for side in result.sides.values() if side.timeline]
    recorded = max((len(t.get(name) or []) for t in timelines for name in TIMELINE_SERIES),
                   default=0)
    end = max(math.ceil(result.warmup_s + result.duration_s), _last_active_second(timelines))
    if result.ended > result.started:
        end = min(end, math.ceil(result.ended - result.started))
    return min(end, recorded)


def timeline_series(record: StepRecord) -> dict[str, dict[str, list[int]]]:
    """Each side's timeline cut at :func:`timeline_seconds` (what the picture shows)."""
    end = timeline_seconds(record)
    cut = {}
    for name, side in record.sides.items():
        cut[name] = {series: list((side.timeline.get(series) or [])[:end])
                     for series in TIMELINE_SERIES}
        for values in cut[name].values():
            values.extend([0] * (end - len(values)))
    return cut


#: a last part second shorter than this is left out of the rates (too few operations
#: to be a rate), unless it is the whole step
MIN_PART_SECOND = 0.5


def rate_bins(record: StepRecord) -> list[float]:
    """The bin edges of the drawn rates: the whole seconds of the warm-up and the
    measured window, then the window's last part second when it is at least
    :data:`MIN_PART_SECOND` long or the step's only bin (``[0, 1, 2, 2.6]``: three
    bins, the last 0.6 s long). Empty when nothing was measured."""
    result = record.result
    if result is None:
        return []
    window = min(result.warmup_s + result.duration_s, float(timeline_seconds(record)))
    whole = math.floor(window + 1e-6)
    edges = [float(second) for second in range(whole + 1)]
    part = window - whole
    if part > 1e-6 and (part >= MIN_PART_SECOND or whole == 0):
        edges.append(window)
    return edges if len(edges) > 1 else []


def timeline_rates(record: StepRecord) -> dict[str, dict[str, list[float]]]:
    """Each side's completions and failures per second over :func:`rate_bins`: each
    bin's count over the bin's length."""
    edges = rate_bins(record)
    widths = [right - left for left, right in itertools.pairwise(edges)]
    rates = {}
    for name, side in timeline_series(record).items():
        rates[name] = {
            series: [(side[series][i] if i < len(side[series]) else 0) / width
                     for i, width in enumerate(widths)]
            for series in ("completions", "failures")}
    return rates


def timeline_figure(record: StepRecord) -> Any:
    """The timeline as a matplotlib figure (rate axis left, clients axis right), each
    second drawn as a step (a bin) so that a one-second step shows."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    figure, rate_axes = plt.subplots(figsize=(7, 3.2))
    client_axes = rate_axes.twinx()
    series = timeline_series(record)
    rates = timeline_rates(record)
    end = timeline_seconds(record)
    edges, seconds = rate_bins(record), list(range(end + 1))
    for index, (name, side) in enumerate(series.items()):
        prefix = f"{plain(name)} " if len(series) > 1 else ""
        done, failed, busy, hung = _COLOURS[index % len(_COLOURS)]
        if edges:
            # baseline None: no edge down to 0 where the drawn seconds end
            rate_axes.stairs(rates[name]["completions"], edges, color=done, baseline=None,
                             label=f"{prefix}completed/s")
            rate_axes.stairs(rates[name]["failures"], edges, color=failed, baseline=None,
                             label=f"{prefix}failed/s")
        if end:
            client_axes.stairs(side["in_flight"], seconds, color=busy, linestyle="--",
                               baseline=None, label=f"{prefix}clients in flight")
            client_axes.stairs(side["hung"], seconds, color=hung, linestyle=":",
                               baseline=None, label=f"{prefix}hung clients")
    warmup = record.result.warmup_s if record.result is not None else 0
    if warmup:
        rate_axes.axvspan(0, warmup, color="0.9", label="warm-up")
    rate_axes.set_xlim(0, max(end, 1))
    highest = max((value for side in rates.values() for values in side.values()
                   for value in values), default=0)
    rate_axes.set_ylim(0, highest * 1.1 or 1)
    top = max([record.clients, 1, *(side.clients for side in record.sides.values())])
    client_axes.set_ylim(0, top * 1.05)
    client_axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    rate_axes.set_xlabel("seconds since the step started")
    rate_axes.set_ylabel("operations per second")
    client_axes.set_ylabel("clients")
    rate_axes.set_title(plain(f"timeline: {record.title}"))
    handles, labels = rate_axes.get_legend_handles_labels()
    more_handles, more_labels = client_axes.get_legend_handles_labels()
    client_axes.legend(handles + more_handles, labels + more_labels, fontsize="small",
                       ncol=2, loc="upper right")
    return figure


def timeline_png(record: StepRecord) -> bytes:
    return _png(timeline_figure(record))


# -- latency ECDF ----------------------------------------------------------------------

def ecdf_points(histogram_b64: str) -> tuple[list[float], list[float]]:
    """(latency seconds, cumulative fraction) from an encoded HdrHistogram."""
    from hdrh.histogram import HdrHistogram

    if not histogram_b64:
        return [], []
    histogram = HdrHistogram.decode(histogram_b64.encode("ascii"))
    total = histogram.get_total_count()
    xs, ys, seen = [], [], 0
    for item in histogram.get_recorded_iterator():
        seen += item.count_added_in_this_iter_step
        xs.append(item.value_iterated_to / 1e6)
        ys.append(seen / total)
    return xs, ys


def ecdf_png(record: StepRecord) -> bytes:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 3.2))
    for name, side in record.sides.items():
        xs, ys = ecdf_points(side.histogram)
        if xs:
            axes.step(xs, ys, where="post", label=plain(name))
    axes.set_xscale("log")
    axes.set_xlabel("latency (s)")
    axes.set_ylabel("fraction of operations")
    axes.set_ylim(0, 1.02)
    axes.set_title(plain(f"latency ECDF: {record.title}"))
    axes.grid(True, which="both", alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")
    return _png(figure)


# -- scans -----------------------------------------------------------------------------

def scan_xscale(clients: Sequence[float]) -> str:
    """``log`` when the scan spans more than one concurrency, else ``linear``."""
    return "log" if len(set(clients)) > 1 else "linear"


def scan_point(step: StepRecord) -> float:
    """Where ``step`` is on its scan's axis: its clients, or an open loop's offered rate
    (its clients are the cap on requests in flight)."""
    return step.arrival_rate or step.clients


def _limits(steps: list[StepRecord], metric: str) -> list[tuple[float, float]]:
    """(clients, limit) of the rules on ``metric`` that each step was checked against."""
    return sorted((scan_point(step), check.limit) for step in steps for check in step.checks
                  if check.metric == metric and check.limit is not None)


def _draw_rate(axes: Any, steps: list[StepRecord], clients: list[float]) -> None:
    axes.plot(clients, [s.metric("rate_hz") for s in steps], marker="o", label="rate (Hz)")
    if any(s.arrival_rate for s in steps):  # an open loop: the rate it was offered
        axes.plot(clients, clients, linestyle=":", color="0.5", label="offered")
    limits = _limits(steps, "rate_hz")
    if limits:
        axes.plot([c for c, _ in limits], [v for _, v in limits], linestyle="--",
                  marker="_", markersize=14, color="tab:red", label="rate_hz limit")
    baseline = [(scan_point(s), s.baseline.rate_hz) for s in steps
                if s.baseline is not None and s.baseline.rate_hz is not None]
    if baseline:
        version = next(s.baseline.version for s in steps if s.baseline is not None)
        axes.plot(*zip(*baseline, strict=True), marker="x", linestyle=":", color="0.4",
                  label=plain(f"baseline ({version})"))
    axes.set_ylabel("operations per second")
    axes.set_ylim(bottom=0)
    if any(s.total is not None and s.total.bytes for s in steps):
        mb_axes = axes.twinx()
        mb_axes.plot(clients, [s.metric("mb_s") for s in steps], marker="s",
                     color="tab:green", label="MB/s")
        mb_axes.set_ylabel("MB/s")
        mb_axes.set_ylim(bottom=0)
        mb_axes.legend(loc="upper right", fontsize="small")
    axes.legend(loc="upper left", fontsize="small")
    axes.set_title(plain(f"scan: {steps[0].section}"))
    axes.grid(True, alpha=0.3)


def _concurrency_axis(axes: Any, clients: Sequence[float]) -> None:
    """Ticks at the scanned concurrencies, written as plain numbers (5, 50, 1000)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    axes.set_xscale(scan_xscale(clients))
    axes.xaxis.set_major_locator(FixedLocator(sorted(set(clients))))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel("concurrent clients")


def scan_figure(steps: list[StepRecord]) -> Any:
    """One scan (measured steps of one thresholds section) as a matplotlib figure:
    rate above, failed and hung below, on a shared concurrency axis."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    steps = sorted(steps, key=scan_point)
    clients = [scan_point(s) for s in steps]
    figure, (rate_axes, error_axes) = plt.subplots(
        2, 1, figsize=(7, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    _draw_rate(rate_axes, steps, clients)
    # not clipped: a count of 0 sits on the axis
    error_axes.plot(clients, [s.metric("failed") for s in steps], marker="o",
                    color="tab:orange", label="failed", clip_on=False)
    error_axes.plot(clients, [s.metric("hung") for s in steps], marker="^", color="tab:red",
                    label="hung", clip_on=False)
    open_loop = any(s.arrival_rate for s in steps)
    if open_loop:
        error_axes.plot(clients, [s.metric("dropped") for s in steps], marker="v",
                        color="tab:purple", label="dropped", clip_on=False)
    error_axes.set_ylabel("count")
    counts = [s.metric(name) for s in steps
              for name in ("failed", "hung", *(("dropped",) if open_loop else ()))]
    error_axes.set_ylim(0, max([1, *(c * 1.1 for c in counts if not math.isnan(c))]))
    error_axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    error_axes.legend(fontsize="small")
    error_axes.grid(True, alpha=0.3)
    _concurrency_axis(error_axes, clients)
    if open_loop:
        error_axes.set_xlabel("offered rate (requests/s)")
    return figure


def scan_png(steps: list[StepRecord]) -> bytes:
    return _png(scan_figure(steps))


def overlay_figure(name: str, runs: dict[str, list[StepRecord]]) -> Any:
    """One scan of several runs (``storagescale compare``): rate vs clients above, p99
    vs clients below, one line per run (its title), on the shared concurrency axis."""
    plt = _pyplot()
    figure, (rate_axes, p99_axes) = plt.subplots(
        2, 1, figsize=(7, 5.5), sharex=True, gridspec_kw={"height_ratios": [1, 1]})
    clients: list[float] = []
    for title, steps in runs.items():
        # an open loop's scan is over the offered rate (its clients: the in-flight cap)
        steps = sorted(steps, key=lambda s: s.arrival_rate or s.clients)
        points = [s.arrival_rate or s.clients for s in steps]
        clients += points
        rate_axes.plot(points, [s.metric("rate_hz") for s in steps], marker="o",
                       label=plain(title))
        p99_axes.plot(points, [s.metric("p99_s") for s in steps], marker="o",
                      label=plain(title))
    rate_axes.set_ylabel("operations per second")
    rate_axes.set_ylim(bottom=0)
    rate_axes.set_title(plain(f"scan: {name}"))
    p99_axes.set_ylabel("p99 latency (s)")
    p99_axes.set_ylim(bottom=0)
    for axes in (rate_axes, p99_axes):
        axes.legend(fontsize="small")
        axes.grid(True, alpha=0.3)
    _concurrency_axis(p99_axes, clients or [1])
    if any(s.arrival_rate for steps in runs.values() for s in steps):
        p99_axes.set_xlabel("offered rate (requests/s)")
    return figure


def overlay_png(name: str, runs: dict[str, list[StepRecord]]) -> bytes:
    return _png(overlay_figure(name, runs))


def scans(steps: list[StepRecord]) -> dict[str, list[StepRecord]]:
    """Steps grouped by scan: plain (no label, no side), measured steps of one section
    over one door. Named by the section, ``stat@davs`` when the steps used several
    doors."""
    several = len({step.door for step in steps}) > 1
    grouped: dict[str, list[StepRecord]] = {}
    for step in steps:
        if step.label or step.side or not step.measured:
            continue
        name = f"{step.section}@{step.door}" if several else step.section
        grouped.setdefault(name, []).append(step)
    return grouped


def scan_of(steps: list[StepRecord], record: StepRecord) -> list[StepRecord]:
    """The scan ``record`` belongs to among ``steps`` (its section and door; empty
    for a step of a multi-step test)."""
    return next((scan for scan in scans(steps).values()
                 if any(step.step_id == record.step_id for step in scan)), [])


# -- a cluster step's hosts ----------------------------------------------------------------

def hosts_png(record: StepRecord) -> bytes:
    """Rate (and MB/s) per client host of a cluster step, lost hosts marked: a slow
    client host shows up as itself, not as a storage regression."""
    plt = _pyplot()
    hosts = record.hosts
    figure, axes = plt.subplots(figsize=(7, 0.6 + 0.35 * max(len(hosts), 2)))
    names = [plain(f"{h.name} ({h.clients})") for h in hosts]
    moved = any(h.bytes for h in hosts)
    values = [h.mb_s if moved else h.rate_hz for h in hosts]
    colours = ["tab:red" if h.lost else "tab:blue" for h in hosts]
    axes.barh(names, values, color=colours)
    for index, host in enumerate(hosts):
        if host.lost:
            axes.text(0, index, f"  lost: {host.lost} clients", va="center", fontsize="small")
    axes.invert_yaxis()
    axes.set_xlabel("MB/s" if moved else "operations per second")
    axes.set_ylabel("client host (clients)")
    axes.set_title(plain(f"per host: {record.title}"))
    axes.grid(True, axis="x", alpha=0.3)
    return _png(figure)


# -- the gate's effects ----------------------------------------------------------------------

#: a verdict's colour in the forest plot
_VERDICT_COLOURS = {"regressed": "tab:red", "improved": "tab:green", "unchanged": "0.35",
                    "inconclusive": "tab:orange"}


def forest_figure(rows: Sequence[tuple[str, float, float, float, str, float]]) -> Any:
    """The statistical gate's effects of a run against its baseline, one row per step
    and metric (``label, ratio, low, high, verdict, bound``): the ratio as a dot, its
    95 % interval as a bar coloured by the verdict, the minimum effect it was judged
    against (``bound``: 0.85 for a rate, 1.25 for a p99) as a red tick, and 1 (no
    change) as a line. Ratios on a logarithmic axis: half and double are as far."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(8, 0.9 + 0.32 * max(len(rows), 2)))
    for index, (_, ratio, low, high, verdict, bound) in enumerate(rows):
        colour = _VERDICT_COLOURS.get(verdict, "0.35")
        axes.plot([low, high], [index, index], color=colour, linewidth=3,
                  solid_capstyle="butt")
        axes.plot([ratio], [index], marker="o", color=colour)
        axes.plot([bound], [index], marker="|", markersize=14, color="tab:red")
    axes.axvline(1.0, color="0.5", linewidth=1)
    axes.set_yticks(range(len(rows)), [plain(f"{row[0]}: {row[4]}") for row in rows],
                    fontsize="small")
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.set_xlabel("this run / baseline (95 % interval; red tick: the minimum effect)")
    axes.grid(True, axis="x", which="both", alpha=0.3)
    return figure


def forest_png(rows: Sequence[tuple[str, float, float, float, str, float]]) -> bytes:
    return _png(forest_figure(rows))
