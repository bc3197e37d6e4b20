"""The per-host breakdown of a cluster step: what each client host ran and measured,
so that a slow client host (a saturated NIC) shows up as itself and not as a storage
regression. Light: no Dask import (the results file reads it back)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class HostResult:
    """One client host's share of a step.

    ``started``/``ended`` are the host's measured window on the coordinator's clock
    (the host's own monotonic window, moved by its measured ``clock_offset_s``).
    ``lost`` counts the clients of a host that did not report by the step's end plus
    ``hang_timeout`` (its worker died or its network was cut); ``lost_reason`` says why.
    """

    name: str
    address: str
    worker: str
    clients: int
    #: the host's clock minus the coordinator's, as measured before the step (seconds)
    clock_offset_s: float
    #: half the round trip of that measurement: the offset is known to +- this
    clock_uncertainty_s: float = 0.0
    #: the indices of its clients (first and last; they are a stride or a block)
    first_client: int = 0
    last_client: int = 0
    started: float = 0.0
    ended: float = 0.0
    duration_s: float = 0.0
    succeeded: int = 0
    failed: int = 0
    hung: int = 0
    lost: int = 0
    bytes: int = 0
    p50_s: float | None = None
    p99_s: float | None = None
    #: the worker process's peak resident memory (MB, 10^6 bytes)
    peak_rss_mb: float | None = None
    lost_reason: str | None = None
    #: the worker's CPU over the measured window, as a fraction of the host's cores
    client_cpu: float | None = None

    @property
    def rate_hz(self) -> float:
        return self.succeeded / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def mb_s(self) -> float:
        return self.bytes / self.duration_s / 1e6 if self.duration_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(rate_hz=self.rate_hz, mb_s=self.mb_s)
        return {key: (None if isinstance(value, float) and not math.isfinite(value) else value)
                for key, value in data.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostResult:
        """Read :meth:`to_json` output; unknown keys are ignored, missing ones default."""
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def lost_text(hosts: list[HostResult]) -> str | None:
    """``host ns2 (10.1.2.2) lost: 25 clients (worker left the cluster)``, or None."""
    parts = [f"host {h.name} ({h.address}) lost: {h.lost} clients"
             + (f" ({h.lost_reason})" if h.lost_reason else "")
             for h in hosts if h.lost]
    return "; ".join(parts) or None


def format_hosts(hosts: list[HostResult]) -> list[str]:
    """The per-host rows of a step's breakdown (for the table with ``-v``)."""
    from ..reporting.table import format_rate, format_seconds

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
