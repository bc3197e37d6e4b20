"""The seeds-style table: one row per step (per side for a mixed step).

    op    clients  succeeded      rate   failed  hung   p50     p99    verdict
    stat       50     55100   11020 Hz       0     0   4 ms   12 ms   pass
"""

from __future__ import annotations

import math
from typing import Any

COLUMNS = ("op", "clients", "succeeded", "rate", "MB/s", "failed", "hung", "p50", "p99",
           "verdict")


def format_rate(hz: float) -> str:
    if hz >= 100:
        return f"{hz:.0f} Hz"
    if hz >= 10:
        return f"{hz:.1f} Hz"
    return f"{hz:.2f} Hz"


def format_seconds(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s" if seconds < 100 else f"{seconds:.0f} s"


def format_change(step: dict[str, Any]) -> str:
    """The rate's change against the baseline: ``-12%``, ``new`` when unmatched."""
    base = step.get("baseline")
    if not base:
        return ""
    if not base.get("matched"):
        return "new"
    change = base.get("rate_change")
    return "-" if change is None else f"{change * 100:+.0f}%"


def step_rows(step: dict[str, Any], *, with_baseline: bool = False) -> list[list[str]]:
    """Table rows for one step of the JSON results."""
    rows = []
    sides = step.get("sides") or {step["op"]: step}
    for side_name, side in sides.items():
        name = step["op"] if len(sides) == 1 else f"{step['op']}/{side_name}"
        if step.get("side"):
            name = f"{step['op']}/{step['side']}"
        if step.get("label") and step.get("label") != step.get("side"):
            name += f" ({step['label']})"
        latency = side.get("latency_s", {})
        rows.append([
            name,
            str(side["clients"]),
            str(side["succeeded"]),
            format_rate(side["rate_hz"]),
            f"{side['mb_s']:.1f}" if side.get("bytes") else "-",
            str(side["failed"]),
            str(side["hung"]),
            format_seconds(latency.get("p50")),
            format_seconds(latency.get("p99")),
            *([format_change(step)] if with_baseline else []),
            step["verdict"],
        ])
    return rows


def render(rows: list[list[str]], columns: tuple[str, ...] = COLUMNS) -> list[str]:
    """Align ``rows`` under ``columns``: text left, numbers right."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c)
              for i, c in enumerate(columns)]
    left = {0, len(columns) - 1}

    def line(cells):
        return "  ".join(
            cell.ljust(w) if i in left else cell.rjust(w) for i, (cell, w) in
            enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(columns), *(line(r) for r in rows)]


def columns_for(steps: list[dict[str, Any]]) -> tuple[bool, tuple[str, ...]]:
    """The columns of a table of ``steps``: a ``vs base`` column when compared."""
    with_baseline = any("baseline" in step for step in steps)
    columns = COLUMNS if not with_baseline else (*COLUMNS[:-1], "vs base", COLUMNS[-1])
    return with_baseline, columns


def format_table(steps: list[dict[str, Any]]) -> list[str]:
    with_baseline, columns = columns_for(steps)
    rows = [row for step in steps for row in step_rows(step, with_baseline=with_baseline)]
    return render(rows, columns)


def format_violations(checks: list[dict[str, Any]], thresholds_file: str) -> list[str]:
    """The failure table of one step: metric, observed, limit, rule, file."""
    def limit(check: dict[str, Any]) -> str:
        if check["limit"] is None:
            return "(no baseline)"
        return f"{check['comparison']} {check['limit']:.6g}"

    def result(check: dict[str, Any]) -> str:
        return {True: "ok", False: "VIOLATED", None: "not checked"}[check["passed"]]

    rows = [
        [c["metric"], f"{c['observed']:.6g}", limit(c), c["rule"], thresholds_file, result(c)]
        for c in checks
    ]
    return render(rows, ("metric", "observed", "limit", "rule", "file", "result"))
