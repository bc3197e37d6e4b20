"""The per-host breakdown of a cluster step: what each client host ran and measured,
so that a slow client host (a saturated NIC) shows up as itself and not as a storage
regression. The record itself, :class:`HostResult`, is part of the step's result
(:class:`~pytest_storagescale.load.stats.StepResult`); this module formats it. Light: no
Dask import."""

from __future__ import annotations

import math
from typing import Any

from ..load.stats import HostResult
from ..units import format_rate, format_seconds

__all__ = ["HostResult", "breakdown_lines", "format_hosts", "lost_text"]


def lost_text(hosts: list[HostResult]) -> str | None:
    """``host ns2 (10.1.2.2) lost: 25 clients (worker left the cluster)``, or None."""
    parts = [f"host {h.name} ({h.address}) lost: {h.lost} clients"
             + (f" ({h.lost_reason})" if h.lost_reason else "")
             for h in hosts if h.lost]
    return "; ".join(parts) or None


def format_hosts(hosts: list[HostResult]) -> list[str]:
    """The per-host rows of a step's breakdown (for the table with ``-v``)."""
    rows = []
    for h in hosts:
        mb = f"{h.mb_s:.1f}" if h.bytes else "-"
        rows.append(
            f"  host {h.name:<12} {h.address:<15} clients {h.clients:>5}  "
            f"succeeded {h.succeeded:>8}  {format_rate(h.rate_hz):>10}  MB/s {mb:>7}  "
            f"failed {h.failed}  hung {h.hung}  lost {h.lost}  "
            f"p99 {format_seconds(h.p99_s)}  cpu {_percent(h.client_cpu)}  "
            f"offset {h.clock_offset_s * 1e3:+.1f} ms")
    return rows


def _percent(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.0%}"


def breakdown_lines(steps: list[Any], verbose: int = 0) -> list[str]:
    """Under the table: each cluster step's hosts (with ``-v``), and lost hosts always."""
    lines = []
    for step in steps:
        hosts = getattr(step, "hosts", None)
        if not hosts:
            continue
        lost = lost_text(hosts)
        if verbose > 0 or lost:
            lines.append(f"{step.title}: {len(hosts)} client hosts"
                         + (f"; {lost}" if lost else ""))
        if verbose > 0:
            lines += format_hosts(hosts)
    return lines
