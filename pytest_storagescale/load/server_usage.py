"""What the storage's servers did during a step, by their own account: the record
:mod:`pytest_storagescale.load.server_monitor` fills and the step record keeps.

Three sources. The server processes of an embedded server, sampled with psutil over
the measured window: CPU (user + system, per core), threads, TCP connections. A
server's own counters (XRootD's summary monitoring, ``xrd.report``; the embedded
dCache's billing records of the step's folder), read at the load's start and end:
the requests it served by kind over warm-up, window and drain, which the step
compares with the requests its clients made. And, on the embedded dCache 11, its
Prometheus exporter's counters over the load (:mod:`.dcache_exporter`), compared too
where one of them counts the step's operation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .dcache_exporter import ExporterFigures

#: dCache's billing (:mod:`.dcache_billing`): every pool transfer of the step
TRANSFERS = "transfers"
#: the counters of XRootD's summary (``<ops>``) that count requests; ``rs`` (the
#: segments of vector reads) and ``ws`` count segments, not requests
REQUEST_COUNTERS = ("open", "rf", "rd", "pr", "rv", "wv", "wr", "sync", "getf", "putf",
                    "misc")


@dataclass(frozen=True)
class ServerUsage:
    """One step as the servers saw it. Any part may be unknown (None): no process to
    sample (a remote storage), no counters (a server without summary monitoring)."""

    #: where the figures come from (``embedded xrootd pid 123; xrd.report``)
    source: str = ""
    #: the measured window the processes were sampled over (wall seconds)
    window_s: float = 0.0
    #: CPU (user + system) of the server processes over the window, seconds
    cpu_s: float | None = None
    #: the cores the server processes may use
    cores: int = 0
    #: the most threads and TCP connections the server processes had in the window
    threads: int | None = None
    connections: int | None = None
    #: requests the server counted by kind (XRootD's ``<ops>`` names: ``misc`` holds
    #: stat, ls, mkdir, rm...) from the load's start to its end: logins, warm-up,
    #: window and drain; empty when it gave no counters
    ops: dict[str, int] = field(default_factory=dict)
    #: the counter compared with the clients' operations ("" none: the operation has
    #: no counter of its own)
    counted: str = ""
    #: how many of ``counted`` the server adds per operation of the step's kind,
    #: measured on the server (XRootD 5 counts a stat twice in ``misc``)
    per_operation: float = 1.0
    #: why the counters are missing ("" when present or never asked for)
    counters_note: str = ""
    #: the counter the step's operations were to be compared with (its server was
    #: asked for counters and the operation has one; "" none), whether or not they
    #: could be: see :attr:`counts_unmeasured`
    compare_with: str = ""
    #: how many of ``counted`` one client's login may add (XRootD: its ``kXR_ping``
    #: counts twice in ``misc``; dCache's billing: none, a login moves no file)
    per_login: float = 2.0
    #: dCache's Prometheus exporter over the load (:mod:`.dcache_exporter`): None when
    #: the server has none to ask (not a dCache); figures with a ``note`` and nothing
    #: else when it could not be read (10.2 ships no exporter: the note says so)
    exporter: ExporterFigures | None = None

    @property
    def counts_unmeasured(self) -> str:
        """Why the check that the server counted the step's operations as its clients
        did (:func:`~pytest_storagescale.load.server_monitor.disagreement`: no load from
        outside the plugin, none lost) could not run, though it should have; "" when
        it ran or does not apply."""
        if self.compare_with and not self.counted:
            return self.counters_note or (f"the server's {self.compare_with!r} count was "
                                          f"not taken")
        return self.exporter_unmeasured

    @property
    def exporter_unmeasured(self) -> str:
        """Why the exporter's count of the step's operations, which an exporter that
        answers has, was not taken ("" taken, or nothing to compare)."""
        figures = self.exporter
        if figures is None or not figures.counter or figures.operations is not None:
            return ""
        return f"dCache's exporter: {figures.note or 'not read'}"

    @property
    def cpu(self) -> float:
        """CPU use as a fraction of the cores (1: every core busy); NaN: not measured."""
        if self.cpu_s is None or self.window_s <= 0 or self.cores <= 0:
            return math.nan
        return self.cpu_s / (self.window_s * self.cores)

    @property
    def requests(self) -> int | None:
        """Every request the server counted over the load (None: no counters)."""
        if not self.ops:
            return None
        if TRANSFERS in self.ops:  # dCache's billing counts pool transfers, not requests
            return self.ops[TRANSFERS]
        return sum(self.ops.get(name, 0) for name in REQUEST_COUNTERS)

    @property
    def operations(self) -> float | None:
        """The step's operations as the server counted them (its ``counted`` counter
        over its count per operation); None when not comparable."""
        if not self.ops or not self.counted or self.per_operation <= 0:
            return None
        return self.ops.get(self.counted, 0) / self.per_operation

    def to_json(self) -> dict[str, Any]:
        cpu = self.cpu
        return {"source": self.source, "cpu": None if math.isnan(cpu) else cpu,
                "cpu_s": self.cpu_s, "window_s": self.window_s, "cores": self.cores,
                "threads": self.threads, "connections": self.connections,
                "requests": self.requests, "ops": dict(self.ops), "counted": self.counted,
                "per_operation": self.per_operation, "operations": self.operations,
                "counters_note": self.counters_note, "compare_with": self.compare_with,
                "per_login": self.per_login, "counts_unmeasured": self.counts_unmeasured,
                "exporter": self.exporter.to_json() if self.exporter is not None else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerUsage:
        return cls(source=str(data.get("source") or ""),
                   window_s=float(data.get("window_s") or 0.0), cpu_s=data.get("cpu_s"),
                   cores=int(data.get("cores") or 0), threads=data.get("threads"),
                   connections=data.get("connections"),
                   ops={str(k): int(v) for k, v in (data.get("ops") or {}).items()},
                   counted=str(data.get("counted") or ""),
                   per_operation=float(data.get("per_operation") or 1.0),
                   counters_note=str(data.get("counters_note") or ""),
                   compare_with=str(data.get("compare_with") or ""),
                   per_login=float(data.get("per_login", 2.0)),
                   exporter=ExporterFigures.from_json(data["exporter"])
                   if isinstance(data.get("exporter"), dict) else None)
