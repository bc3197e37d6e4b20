"""``storagescale history TARGET``: each step's figures over the runs of a history.

Per step (storage, operation, door, clients, plan scale): a text table of rate and p99
per run in time order with the storage version, then the change points and the slow
drift :mod:`.changes` finds. ``--png DIR`` / ``--html DIR`` draw each step's rate and
p99 over the runs, coloured by version, and each operation's rate and p99 against
clients, one line per version (matplotlib: without it the text is written and the
plots are said to be left out). Exit status 1 when a change point or a drift is to the
worse beyond the minimum effect, 0 otherwise, 4 on bad input.
"""

from __future__ import annotations

import argparse
import base64
import html
import re
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StorageScaleUsageError
from ..gate import DEFAULT_MIN_EFFECT_P99, DEFAULT_MIN_EFFECT_RATE
from .changes import Change, Drift, change_points, drift, metrics
from .store import HistoryStep, opened, shown, upgrade_note

COMMAND = "storagescale history"
GATE_FAILED = 1
#: each step's series is judged over its newest runs: this many by default (PELT's cost
#: grows with the square of the runs: 200 runs, 8 steps took 13 s on 2 busy cores)
DEFAULT_LAST = 100
MAX_LAST = 1000


@dataclass
class Series:
    """One step's runs, oldest first, with what moved."""

    key: tuple[str, str, str, int, float]
    steps: list[HistoryStep]
    changes: list[Change] = field(default_factory=list)
    drifts: list[Drift] = field(default_factory=list)

    @property
    def title(self) -> str:
        system, section, door, clients, scale = self.key
        return (f"{system} {section} clients={clients}" + (f" door={door}" if door else "")
                + (f" scale={scale:g}" if scale != 1 else ""))

    @property
    def worse(self) -> bool:
        return any(change.worse for change in self.changes) or bool(self.drifts)


def build_series(steps: list[HistoryStep], min_effect_rate: float = DEFAULT_MIN_EFFECT_RATE,
                 min_effect_p99: float = DEFAULT_MIN_EFFECT_P99,
                 last: int = DEFAULT_LAST) -> list[Series]:
    """The history's steps grouped by :attr:`.HistoryStep.key` (each step's ``last``
    runs), each judged."""
    groups: dict[tuple[str, str, str, int, float], list[HistoryStep]] = defaultdict(list)
    for step in steps:
        groups[step.key].append(step)
    found = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[4], k[3])):
        series = Series(key, groups[key][-last:])
        for metric in metrics(min_effect_rate, min_effect_p99):
            values = [getattr(step, metric.name) for step in series.steps]
            changes = change_points(values, metric)
            series.changes += changes
            moved = drift(values, metric, since=changes[-1].index if changes else 0)
            if moved is not None:
                series.drifts.append(moved)
        found.append(series)
    return found


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f} Hz" if value >= 100 else f"{value:.3g} Hz"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if value >= factor or unit == "us":
            return f"{value / factor:.3g} {unit}"
    return f"{value:g} s"  # pragma: no cover


def _when(started: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(started))


def _run_name(step: HistoryStep, number: int) -> str:
    return f"run {number} ({step.run_id}, version {step.version or '?'})"


def _throughput(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def series_lines(series: Series) -> list[str]:
    # MB/s (schema version 2) for the steps that move bytes (put, get): else left out
    moves_bytes = any(step.mb_s for step in series.steps)
    rows: list[tuple[str, ...]] = [("run", "started (UTC)", "version", "rate",
                                    *(("MB/s",) if moves_bytes else ()), "p99", "verdict", "")]
    marks: dict[int, list[str]] = defaultdict(list)
    for change in series.changes:
        marks[change.index].append(f"<- {change.metric} {change.ratio:.2f}x")
    for number, step in enumerate(series.steps, start=1):
        rows.append((str(number), _when(step.started), step.version or "?",
                     _rate(step.rate_hz),
                     *((_throughput(step.mb_s),) if moves_bytes else ()),
                     _seconds(step.p99_s), step.verdict, " ".join(marks[number - 1])))
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = [series.title]
    lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(
        row, widths, strict=True)).rstrip() for row in rows]
    for change in series.changes:
        step = series.steps[change.index]
        what = _rate if change.metric == "rate_hz" else _seconds
        lines.append(
            f"  change point: {change.metric} moved {change.ratio:.2f}x "
            f"({what(change.before)} -> {what(change.after)}) at "
            f"{_run_name(step, change.index + 1)}"
            f"{': WORSE beyond the minimum effect' if change.worse else ': better'}")
    for moved in series.drifts:
        lines.append(
            f"  drift: {moved.metric} moved {moved.ratio:.2f}x over runs {moved.first + 1}-"
            f"{moved.last + 1} ({series.steps[moved.first].version} -> "
            f"{series.steps[moved.last].version}; {moved.per_run:.3f}x per run, 95 % "
            f"{moved.low:.3f}-{moved.high:.3f}) with no single change point beyond the "
            f"minimum effect: WORSE")
    if not series.changes and not series.drifts:
        lines.append("  no change point, no drift")
    return lines


def report_lines(target: str, all_series: list[Series], runs: int) -> list[str]:
    lines = [f"history {shown(target)}: {runs} runs, {len(all_series)} steps"
             f"{upgrade_note(target)}"]
    for series in all_series:
        lines += ["", *series_lines(series)]
    worse = [series.title for series in all_series if series.worse]
    lines += ["", f"moved to the worse: {', '.join(worse)}" if worse else
              "no step moved to the worse beyond the minimum effect"]
    return lines


# -- plots ---------------------------------------------------------------------------

def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_")[:120] or "step"


def series_figure(series: Series) -> Any:
    """Rate and p99 over the runs, a colour per version, change points as lines."""
    from matplotlib.ticker import MaxNLocator

    from ..reporting.plots import _pyplot, plain

    plt = _pyplot()
    figure, (rate_axes, p99_axes) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    versions = list(dict.fromkeys(step.version for step in series.steps))
    for version in versions:
        points = [(number, step) for number, step in enumerate(series.steps, start=1)
                  if step.version == version]
        rate_axes.plot([n for n, _ in points], [s.rate_hz for _, s in points], marker="o",
                       linestyle="", label=plain(version or "?"))
        p99_axes.plot([n for n, _ in points], [s.p99_s for _, s in points], marker="o",
                      linestyle="", label=plain(version or "?"))
    for change in series.changes:
        axes = rate_axes if change.metric == "rate_hz" else p99_axes
        colour = "tab:red" if change.worse else "tab:green"
        axes.axvline(change.index + 0.5, color=colour, linestyle="--")
        # named at the line's top: the first run of the new level, its version, the move
        axes.text(change.index + 0.55, 0.98, plain(
            f"run {change.index + 1} ({series.steps[change.index].version or '?'}) "
            f"{change.ratio:.2f}x"), color=colour, fontsize="small", va="top",
            transform=axes.get_xaxis_transform())
    rate_axes.set_ylabel("operations per second")
    rate_axes.set_ylim(bottom=0)
    rate_axes.set_title(plain(series.title))
    p99_axes.set_ylabel("p99 latency (s)")
    p99_axes.set_ylim(bottom=0)
    p99_axes.set_xlabel("run (oldest first)")
    p99_axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axes in (rate_axes, p99_axes):
        axes.legend(fontsize="small", title="version")
        axes.grid(True, alpha=0.3)
    return figure


def clients_figure(name: str, all_series: list[Series]) -> Any:
    """One operation's rate and p99 against clients, a line per version (the median
    over that version's runs)."""
    from ..reporting.plots import _concurrency_axis, _pyplot, plain

    plt = _pyplot()
    figure, (rate_axes, p99_axes) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    by_version: dict[str, dict[int, list[HistoryStep]]] = defaultdict(lambda: defaultdict(list))
    for series in all_series:
        for step in series.steps:
            by_version[step.version][step.clients].append(step)
    clients: list[float] = []
    for version, points in by_version.items():
        counts = sorted(points)
        clients += counts
        for axes, metric in ((rate_axes, "rate_hz"), (p99_axes, "p99_s")):
            values = [[getattr(s, metric) for s in points[c] if getattr(s, metric) is not None]
                      for c in counts]
            axes.plot(counts, [statistics.median(v) if v else float("nan") for v in values],
                      marker="o", label=plain(version or "?"))
    rate_axes.set_ylabel("operations per second")
    rate_axes.set_ylim(bottom=0)
    rate_axes.set_title(plain(f"scan: {name}"))
    p99_axes.set_ylabel("p99 latency (s)")
    p99_axes.set_ylim(bottom=0)
    for axes in (rate_axes, p99_axes):
        axes.legend(fontsize="small", title="version")
        axes.grid(True, alpha=0.3)
    _concurrency_axis(p99_axes, clients or [1])
    return figure


def draw(all_series: list[Series]) -> dict[str, bytes]:
    """File name -> PNG: each step over the runs, each operation against clients."""
    from ..reporting.plots import _png

    pictures = {f"{_slug(s.title)}.png": _png(series_figure(s)) for s in all_series}
    scans: dict[tuple[str, str, str, float], list[Series]] = defaultdict(list)
    for series in all_series:
        system, section, door, _, scale = series.key
        scans[(system, section, door, scale)].append(series)
    for (system, section, door, scale), group in scans.items():
        name = f"{system} {section}" + (f" door={door}" if door else "") + (
            f" scale={scale:g}" if scale != 1 else "")
        pictures[f"clients-{_slug(name)}.png"] = _png(clients_figure(name, group))
    return pictures


def _folder(path: Path, flag: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageScaleUsageError(f"{COMMAND} {flag} {path}: cannot make the folder "
                                     f"({exc.strerror or exc}). Give a folder you can "
                                     f"write.") from None
    return path


def write_pictures(arguments: argparse.Namespace, lines: list[str],
                   all_series: list[Series]) -> list[str]:
    """The PNG files and the HTML page asked for; what was written, as lines."""
    from ..reporting.plots import available

    wanted = [(flag, path) for flag, path in (("--png", arguments.png),
                                              ("--html", arguments.html)) if path is not None]
    if not wanted:
        return []
    folders = {flag: _folder(path, flag) for flag, path in wanted}
    if not available():
        return ["plots left out: matplotlib is not installed (pip install "
                "'pytest-storagescale[report]'); the text above is the history"]
    pictures = draw(all_series)
    said = []
    if "--png" in folders:
        for name, data in pictures.items():
            (folders["--png"] / name).write_bytes(data)
        said.append(f"png: {len(pictures)} files in {folders['--png']}")
    if "--html" in folders:
        images = "\n".join(
            f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
            f'{base64.b64encode(data).decode()}"></figure>' for name, data in pictures.items())
        page = (f"<!doctype html><html><head><meta charset='utf-8'><title>storagescale "
                f"history</title></head><body><h1>History of runs</h1><pre>"
                f"{html.escape(chr(10).join(lines))}</pre>\n{images}\n</body></html>\n")
        (folders["--html"] / "index.html").write_text(page, encoding="utf-8")
        said.append(f"page: {folders['--html'] / 'index.html'}")
    return said


# -- the command ---------------------------------------------------------------------

def _effect(value: str) -> float:
    try:
        number = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        number = float("nan")
    if not 0 < number < 1:
        raise StorageScaleUsageError(f"{COMMAND}: minimum effect {value!r} is not a fraction "
                                     f"above 0 and below 1; write e.g. 0.15 or 15%.")
    return number


def _last(value: str) -> int:
    try:
        runs = int(value)
    except ValueError:
        runs = 0
    if not 2 <= runs <= MAX_LAST:
        raise StorageScaleUsageError(f"{COMMAND}: --last {value!r} is not a number of runs "
                                     f"from 2 to {MAX_LAST}; write e.g. --last 50.")
    return runs


def add_parser(commands: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """``storagescale history`` under the ``storagescale`` command."""
    history = commands.add_parser(
        "history", help="each step's rate and p99 over the runs of a history, its change "
                        "points and drift",
        description="Print, per step, the rate and p99 of every run of the history "
                    "(--storage-history) in time order with the storage version, and where "
                    "they moved: change points (ruptures' PELT) and a slow drift across "
                    "releases (Theil-Sen). Exit status 1 when one is to the worse beyond "
                    "the minimum effect, 0 otherwise, 4 on bad input.")
    history.add_argument("target", metavar="HISTORY",
                         help="the SQLite file, or a postgresql:// URL")
    history.add_argument("--system", help="only runs of this storage system")
    history.add_argument("--op", help="only steps of this operation (thresholds section)")
    history.add_argument("--clients", type=int, help="only steps at these many clients")
    history.add_argument("--min-effect-rate", type=_effect, default=DEFAULT_MIN_EFFECT_RATE,
                         metavar="FRACTION", help="a rate this much lower is a regression "
                         f"(default {DEFAULT_MIN_EFFECT_RATE:g}, the gate's)")
    history.add_argument("--min-effect-p99", type=_effect, default=DEFAULT_MIN_EFFECT_P99,
                         metavar="FRACTION", help="a p99 this much higher is a regression "
                         f"(default {DEFAULT_MIN_EFFECT_P99:g}, the gate's)")
    history.add_argument("--last", type=_last, default=DEFAULT_LAST, metavar="RUNS",
                         help=f"each step's newest RUNS runs (default {DEFAULT_LAST}, at most "
                         f"{MAX_LAST})")
    history.add_argument("--png", type=Path, metavar="DIR", help="write the curves as PNG "
                         "files into DIR")
    history.add_argument("--html", type=Path, metavar="DIR", help="write DIR/index.html with "
                         "the table and the curves")
    history.set_defaults(handler=history_command)


def history_command(arguments: argparse.Namespace) -> int:
    with opened(arguments.target, create=False) as history:
        steps = history.history_steps(arguments.system)
        runs = history.run_count()
    steps = [step for step in steps
             if (arguments.op is None or step.section == arguments.op)
             and (arguments.clients is None or step.clients == arguments.clients)]
    all_series = build_series(steps, arguments.min_effect_rate, arguments.min_effect_p99,
                              arguments.last)
    lines = report_lines(arguments.target, all_series, runs)
    for line in lines:
        print(line)
    for line in write_pictures(arguments, lines, all_series):
        print(line)
    return GATE_FAILED if any(series.worse for series in all_series) else 0
