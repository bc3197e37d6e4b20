"""The seeds' hand-drawn pictures, drawn from the results (matplotlib, PNG bytes).

- :func:`timeline_png`: one step, per second: completions, failures, operations in
  flight and hung clients;
- :func:`ecdf_png`: one step's latency distribution (ECDF, from its HdrHistogram),
  like seed 002's readv ECDFs and seed 003's ``transfertimex.jpg``;
- :func:`scan_png`: rate (and MB/s) vs clients with the thresholds drawn on it, and
  failed and hung vs clients, like seed 003's ``writerate.jpg``.

matplotlib is imported when a picture is drawn, never at plugin start.
"""

from __future__ import annotations

import io
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display; safe in threads of a headless CI job
    import matplotlib.pyplot as plt

    return plt


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    _pyplot().close(figure)
    return buffer.getvalue()


def step_title(step: dict[str, Any]) -> str:
    label = f" ({step['label']})" if step.get("label") else ""
    side = f"/{step['side']}" if step.get("side") else ""
    return f"{step['op']}{side}{label} at {step['clients']} clients"


def timeline_png(step: dict[str, Any]) -> bytes:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 3.2))
    sides = step.get("sides") or {step["op"]: step}
    for name, side in sides.items():
        timeline = side.get("timeline") or {}
        seconds = range(len(timeline.get("completions", [])))
        prefix = f"{name} " if len(sides) > 1 else ""
        axes.plot(seconds, timeline.get("completions", []), label=f"{prefix}completed/s")
        axes.plot(seconds, timeline.get("failures", []), label=f"{prefix}failed/s")
        axes.plot(seconds, timeline.get("in_flight", []), linestyle="--",
                  label=f"{prefix}in flight")
        axes.plot(seconds, timeline.get("hung", []), linestyle=":", label=f"{prefix}hung")
    warmup = step.get("warmup_s") or 0
    if warmup:
        axes.axvspan(0, warmup, color="0.9", label="warm-up")
    axes.set_xlabel("seconds since the step started")
    axes.set_ylabel("per second / clients")
    axes.set_title(f"timeline: {step_title(step)}")
    axes.legend(fontsize="small", ncol=2)
    return _png(figure)


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


def ecdf_png(step: dict[str, Any]) -> bytes:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 3.2))
    sides = step.get("sides") or {step["op"]: step}
    for name, side in sides.items():
        xs, ys = ecdf_points(side.get("histogram", ""))
        if xs:
            axes.step(xs, ys, where="post", label=name)
    axes.set_xscale("log")
    axes.set_xlabel("latency (s)")
    axes.set_ylabel("fraction of operations")
    axes.set_ylim(0, 1.02)
    axes.set_title(f"latency ECDF: {step_title(step)}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
    return _png(figure)


def _limits(steps: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    """(clients, limit) of the rules on ``metric`` that each step was checked against."""
    points = []
    for step in steps:
        for check in step.get("checks", []):
            if check["metric"] == metric and check.get("limit") is not None:
                points.append((step["clients"], check["limit"]))
    return sorted(points)


def scan_png(steps: list[dict[str, Any]]) -> bytes:
    """One scan (steps of one thresholds section, one per concurrency)."""
    plt = _pyplot()
    steps = sorted(steps, key=lambda s: s["clients"])
    clients = [s["clients"] for s in steps]
    figure, (rate_axes, error_axes) = plt.subplots(
        2, 1, figsize=(7, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    rate_axes.plot(clients, [s["rate_hz"] for s in steps], marker="o", label="rate (Hz)")
    limits = _limits(steps, "rate_hz")
    if limits:
        rate_axes.plot([c for c, _ in limits], [v for _, v in limits], linestyle="--",
                       marker="_", markersize=14, color="tab:red", label="rate_hz limit")
    baseline = [(s["clients"], s["baseline"]["rate_hz"]) for s in steps
                if s.get("baseline", {}).get("rate_hz") is not None]
    if baseline:
        rate_axes.plot(*zip(*baseline, strict=True), marker="x", linestyle=":", color="0.4",
                       label=f"baseline ({steps[0]['baseline'].get('version', '?')})")
    rate_axes.set_ylabel("operations per second")
    if any(s.get("bytes") for s in steps):
        mb_axes = rate_axes.twinx()
        mb_axes.plot(clients, [s["mb_s"] for s in steps], marker="s", color="tab:green",
                     label="MB/s")
        mb_axes.set_ylabel("MB/s")
        mb_axes.legend(loc="upper right", fontsize="small")
    rate_axes.legend(loc="upper left", fontsize="small")
    rate_axes.set_title(f"scan: {steps[0]['op']}")
    rate_axes.grid(True, alpha=0.3)
    error_axes.plot(clients, [s["failed"] for s in steps], marker="o", color="tab:orange",
                    label="failed")
    error_axes.plot(clients, [s["hung"] for s in steps], marker="^", color="tab:red",
                    label="hung")
    error_axes.set_xlabel("concurrent clients")
    error_axes.set_ylabel("count")
    error_axes.legend(fontsize="small")
    error_axes.grid(True, alpha=0.3)
    if len(clients) > 1 and max(clients) / max(min(clients), 1) >= 20:
        error_axes.set_xscale("log")
    return _png(figure)


def scans(steps: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Steps grouped by scan: plain (unlabelled) steps of one section."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for step in steps:
        if step.get("label") or step.get("verdict") == "error":
            continue
        grouped.setdefault(step["op"], []).append(step)
    return grouped
