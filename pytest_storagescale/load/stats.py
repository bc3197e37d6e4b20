"""What a load step measures, and how partial measurements merge.

A :class:`SideAccumulator` collects one side of a step (a plain step has one side,
a mixed step has ``readers`` and ``writers``) inside one process; accumulators
from several processes merge through :meth:`SideAccumulator.to_wire` /
:meth:`SideAccumulator.from_wire`. Latencies go into an HdrHistogram (microsecond
resolution, 3 significant digits, up to one hour) so they merge exactly.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import psutil
from hdrh.histogram import HdrHistogram

from ..gate import WindowSample, combine
from ..redact import redact_text

_LOWEST_US, _HIGHEST_US, _DIGITS = 1, 3_600_000_000, 3
#: the latency summary's keys (``latency_s``), in seconds
LATENCIES = ("mean", "p50", "p90", "p99", "max")


def new_histogram() -> HdrHistogram:
    return HdrHistogram(_LOWEST_US, _HIGHEST_US, _DIGITS)


#: the measured window is cut in this many equal sub-windows, each a sample of the
#: step's rate and latency for the gate (:mod:`~pytest_storagescale.gate`)
WINDOWS = 10
#: a sub-window's latency histogram: 2 significant digits (1 %), a tenth of the memory
_WINDOW_DIGITS = 2


def _window_histogram() -> HdrHistogram:
    return HdrHistogram(_LOWEST_US, _HIGHEST_US, _WINDOW_DIGITS)


class SideAccumulator:
    """Counts, bytes, latencies and a per-second timeline for one side of a step."""

    def __init__(self, seconds: int, window: tuple[float, float] | None = None) -> None:
        #: the measured window: (its start in seconds since the step's start, its
        #: planned length); None: no per-window samples (an accumulator that only merges
        #: takes its parts')
        self.window = window
        #: per sub-window of the measured window (:data:`WINDOWS`): succeeded operations
        #: and their latencies
        self.window_operations = [0] * WINDOWS
        self.window_histograms: list[HdrHistogram | None] = [None] * WINDOWS
        # one writer: the coordinator thread of the process (no lock needed)
        self.succeeded = 0
        self.failed = 0
        #: operations the storage throttled past their deadline (HTTP 429/503 with
        #: Retry-After): not failed, not succeeded
        self.throttled = 0
        #: what the clients' drivers counted over the step (Driver.counters: redirects,
        #: door_seconds), warm-up and drain included
        self.counters: dict[str, float] = {}
        self.bytes = 0
        self.errors: Counter[str] = Counter()
        self.error_examples: dict[str, str] = {}
        self.histogram = new_histogram()
        # per second since the step start (warm-up included): completions, failures,
        # operations in flight and hung clients (sampled once a second)
        self.completions = [0] * seconds
        self.failures = [0] * seconds
        self.in_flight = [0] * seconds
        self.hung_series = [0] * seconds
        self.hung = 0
        #: seconds actually measured (shorter than the duration when a count bound ended
        #: the step early)
        self.measured_s = 0.0
        #: operations that finished before the window (warm-up) and after it (the drain
        #: of those in flight at its end): the storage served them, the rate does not
        #: count them
        self.warmup_operations = 0
        self.drain_operations = 0
        #: an open-loop step's own counts (None: the closed loop)
        self.open: OpenLoopAccumulator | None = None

    @classmethod
    def for_clock(cls, clock: Any) -> SideAccumulator:
        """An accumulator of a step on ``clock`` (a :class:`~.plan.StepClock`, which
        imports this module), cutting its measured window in
        :data:`WINDOWS` samples."""
        return cls(clock.seconds, window=(clock.measure_from - clock.start_at,
                                          clock.end_at - clock.measure_from))

    def record(self, at: float, latency_s: float, nbytes: int, error: BaseException | None,
               counted: bool) -> None:
        """Record one operation finished ``at`` seconds after the step's start.
        ``counted`` is False during warm-up."""
        second = int(at)
        if 0 <= second < len(self.completions):
            if error is None:
                self.completions[second] += 1
            else:
                self.failures[second] += 1
        if not counted:
            self.warmup_operations += 1
            return
        if error is not None and getattr(error, "error_class", None) == "throttled":
            self.throttled += 1
        elif error is None:
            self.succeeded += 1
            self.bytes += nbytes
            micros = min(max(int(latency_s * 1e6), _LOWEST_US), _HIGHEST_US)
            self.histogram.record_value(micros)
            self._record_window(at, micros)
        else:
            self.failed += 1
            cls = getattr(error, "error_class", None) or type(error).__name__
            self.errors[cls] += 1
            if cls not in self.error_examples:  # credentials out before the cut
                self.error_examples[cls] = redact_text(str(error))[:300]

    def _record_window(self, at: float, micros: int) -> None:
        if self.window is None:
            return
        begin, length = self.window
        index = int((at - begin) / length * WINDOWS) if length > 0 else -1
        if 0 <= index < WINDOWS:
            self.window_operations[index] += 1
            histogram = self.window_histograms[index]
            if histogram is None:
                histogram = self.window_histograms[index] = _window_histogram()
            histogram.record_value(micros)

    def window_samples(self, measured_s: float) -> list[WindowSample]:
        """The sub-windows wholly inside the measured window (``measured_s``: a step
        ended early by its count bound or Ctrl-C has fewer); empty without a window."""
        if self.window is None or self.window[1] <= 0:
            return []
        width = self.window[1] / WINDOWS
        samples = []
        for index in range(WINDOWS):
            if (index + 1) * width > measured_s * (1 + 1e-6):
                break
            histogram = self.window_histograms[index]
            counted = histogram is not None and histogram.get_total_count() > 0
            samples.append(WindowSample(
                start_s=round(index * width, 6), width_s=round(width, 6),
                operations=self.window_operations[index],
                p50_s=histogram.get_value_at_percentile(50) / 1e6
                if counted and histogram is not None else None,
                p99_s=histogram.get_value_at_percentile(99) / 1e6
                if counted and histogram is not None else None))
        return samples

    def add_counters(self, counters: dict[str, float]) -> None:
        """Add one client's (or one process's) driver counts."""
        for name, value in counters.items():
            self.counters[name] = self.counters.get(name, 0) + value

    def to_wire(self) -> dict[str, Any]:
        """A picklable, JSON-able form, for the process executor."""
        return {
            "succeeded": self.succeeded, "failed": self.failed, "bytes": self.bytes,
            "throttled": self.throttled, "counters": dict(self.counters),
            "errors": dict(self.errors),
            "error_examples": self.error_examples,
            "histogram": self.histogram.encode().decode("ascii"),
            "completions": self.completions, "failures": self.failures,
            "in_flight": self.in_flight, "hung_series": self.hung_series, "hung": self.hung,
            "measured_s": self.measured_s, "warmup_operations": self.warmup_operations,
            "drain_operations": self.drain_operations,
            "open": self.open.to_wire() if self.open is not None else None,
            "window": list(self.window) if self.window is not None else None,
            "window_operations": self.window_operations,
            "window_histograms": [h.encode().decode("ascii") if h is not None else None
                                  for h in self.window_histograms],
        }

    def merge_wire(self, wire: dict[str, Any]) -> None:
        self.succeeded += wire["succeeded"]
        self.failed += wire["failed"]
        self.throttled += wire.get("throttled", 0)
        self.add_counters(wire.get("counters") or {})
        self.bytes += wire["bytes"]
        self.errors.update(wire["errors"])
        for cls, text in wire["error_examples"].items():
            self.error_examples.setdefault(cls, text)
        self.histogram.add(HdrHistogram.decode(wire["histogram"].encode("ascii")))
        for name in ("completions", "failures", "in_flight", "hung_series"):
            mine, theirs = getattr(self, name), wire[name]
            for i in range(min(len(mine), len(theirs))):
                mine[i] += theirs[i]
        self.hung += wire["hung"]
        self.measured_s = max(self.measured_s, wire["measured_s"])
        self.warmup_operations += wire.get("warmup_operations", 0)
        self.drain_operations += wire.get("drain_operations", 0)
        if wire.get("open") is not None:
            self.open = self.open or OpenLoopAccumulator()
            self.open.merge_wire(wire["open"])
        if wire.get("window") is not None:  # the clients' processes cut the same window
            self.window = self.window or (float(wire["window"][0]), float(wire["window"][1]))
            for index, count in enumerate(wire.get("window_operations") or []):
                if index < WINDOWS:
                    self.window_operations[index] += count
            for index, encoded in enumerate(wire.get("window_histograms") or []):
                if index < WINDOWS and encoded:
                    part = HdrHistogram.decode(encoded.encode("ascii"))
                    histogram = self.window_histograms[index]
                    if histogram is None:
                        histogram = self.window_histograms[index] = _window_histogram()
                    histogram.add(part)


#: a request of an open-loop step sent this much later than its intended time (seconds)
#: is ``late``: the client host (its dispatcher, or a free client) could not keep the
#: schedule; its lateness is in its response time
LATE_AFTER_S = 0.01


class OpenLoopAccumulator:
    """What an open-loop step measures besides a closed loop's counts: the service
    time of each request (from its actual send), the requests scheduled in the window,
    those dropped (the cap on requests in flight was reached at their intended time)
    and those sent late (:data:`LATE_AFTER_S`)."""

    def __init__(self) -> None:
        self.service = new_histogram()
        self.scheduled = 0
        self.dropped = 0
        self.late = 0

    def record(self, latency_s: float, service_s: float, succeeded: bool) -> None:
        """One request of the window: ``latency_s`` from its intended start,
        ``service_s`` from its send."""
        if latency_s - service_s > LATE_AFTER_S:
            self.late += 1
        if succeeded:
            self.service.record_value(min(max(int(service_s * 1e6), _LOWEST_US), _HIGHEST_US))

    def to_wire(self) -> dict[str, Any]:
        return {"service": self.service.encode().decode("ascii"), "scheduled": self.scheduled,
                "dropped": self.dropped, "late": self.late}

    def merge_wire(self, wire: dict[str, Any]) -> None:
        self.service.add(HdrHistogram.decode(wire["service"].encode("ascii")))
        self.scheduled += wire["scheduled"]
        self.dropped += wire["dropped"]
        self.late += wire["late"]


@dataclass
class OpenLoopResult:
    """An open-loop step's own figures (one side): the offered rate, the requests its
    schedule held in the window, those dropped and sent late, and the service time
    (from the actual send; ``latency_s`` of the side is the response time, from the
    intended start)."""

    offered_hz: float
    scheduled: int = 0
    dropped: int = 0
    late: int = 0
    service_latency_s: dict[str, float] = field(default_factory=dict)
    service_histogram: str = ""

    @classmethod
    def from_accumulator(cls, acc: OpenLoopAccumulator, offered_hz: float) -> OpenLoopResult:
        return cls(offered_hz=offered_hz, scheduled=acc.scheduled, dropped=acc.dropped,
                   late=acc.late, service_latency_s=latency_summary(acc.service),
                   service_histogram=acc.service.encode().decode("ascii"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OpenLoopResult | None:
        if not data.get("offered_hz"):
            return None
        latency = data.get("service_latency_s") or {}
        return cls(offered_hz=float(data["offered_hz"]),
                   scheduled=int(data.get("scheduled") or 0),
                   dropped=int(data.get("dropped") or 0), late=int(data.get("late") or 0),
                   service_latency_s={k: _nan_for_none(latency.get(k)) for k in LATENCIES},
                   service_histogram=data.get("service_histogram") or "")

    def to_json(self) -> dict[str, Any]:
        return {"offered_hz": self.offered_hz, "scheduled": self.scheduled,
                "dropped": self.dropped, "late": self.late,
                "service_latency_s": {k: _finite(v) for k, v in self.service_latency_s.items()},
                "service_histogram": self.service_histogram}

    @classmethod
    def merged(cls, parts: list[OpenLoopResult]) -> OpenLoopResult | None:
        if not parts:
            return None
        service = new_histogram()
        for part in parts:
            if part.service_histogram:
                service.add(HdrHistogram.decode(part.service_histogram.encode("ascii")))
        return cls(offered_hz=sum(p.offered_hz for p in parts),
                   scheduled=sum(p.scheduled for p in parts),
                   dropped=sum(p.dropped for p in parts), late=sum(p.late for p in parts),
                   service_latency_s=latency_summary(service),
                   service_histogram=service.encode().decode("ascii"))


@dataclass
class SideResult:
    """The measured outcome of one side of a step (what the table and rules read)."""

    clients: int
    duration_s: float
    succeeded: int
    failed: int
    hung: int
    bytes: int
    latency_s: dict[str, float]
    errors: dict[str, int]
    error_examples: dict[str, str]
    timeline: dict[str, list[int]]
    #: the latency HdrHistogram (microseconds), base64 as HdrHistogram encodes it
    histogram: str = ""
    #: operations the storage throttled (429/503 with Retry-After) past their deadline
    throttled: int = 0
    #: redirects the clients followed (a dCache door to its pools), and the seconds
    #: their requests spent before the last server answered; over the whole step
    redirects: int = 0
    door_seconds: float = 0.0
    #: operations finished in the warm-up, and in the drain after the window (not in
    #: the rate): with ``succeeded + failed``, all that the storage served in the step
    warmup_operations: int = 0
    drain_operations: int = 0
    #: an open-loop step's figures (None: a closed loop)
    open_loop: OpenLoopResult | None = None
    #: the measured window's sub-windows (:data:`WINDOWS`), the gate's samples; empty in
    #: results of earlier releases
    windows: list[WindowSample] = field(default_factory=list)

    @classmethod
    def from_accumulator(cls, acc: SideAccumulator, clients: int, duration_s: float,
                         offered_hz: float = 0.0) -> SideResult:
        return cls(
            open_loop=(OpenLoopResult.from_accumulator(acc.open or OpenLoopAccumulator(),
                                                       offered_hz) if offered_hz else None),
            clients=clients, duration_s=duration_s, succeeded=acc.succeeded,
            failed=acc.failed, hung=acc.hung, bytes=acc.bytes,
            latency_s=latency_summary(acc.histogram),
            histogram=acc.histogram.encode().decode("ascii"), throttled=acc.throttled,
            redirects=int(acc.counters.get("redirects", 0)),
            door_seconds=float(acc.counters.get("door_seconds", 0.0)),
            warmup_operations=acc.warmup_operations, drain_operations=acc.drain_operations,
            errors=dict(acc.errors), error_examples=dict(acc.error_examples),
            timeline=trimmed_timeline({
                "completions": acc.completions, "failures": acc.failures,
                "in_flight": acc.in_flight, "hung": acc.hung_series,
            }),
            windows=acc.window_samples(duration_s),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SideResult:
        """Read :meth:`to_json` output, or a step record of the previous release (whose
        one-sided records hold these keys at their top level; see :func:`sides_from_json`).
        Derived values (``rate_hz``, ``mb_s``...) are recomputed, not read."""
        latency = data.get("latency_s") or {}
        return cls(
            clients=int(data.get("clients", 0)), duration_s=float(data.get("duration_s", 0.0)),
            succeeded=int(data.get("succeeded", 0)), failed=int(data.get("failed", 0)),
            hung=int(data.get("hung", 0)), bytes=int(data.get("bytes", 0)),
            latency_s={key: _nan_for_none(latency.get(key)) for key in LATENCIES},
            errors=dict(data.get("errors") or {}),
            error_examples=dict(data.get("error_examples") or {}),
            timeline={key: list(value) for key, value in (data.get("timeline") or {}).items()},
            histogram=data.get("histogram") or "",
            throttled=int(data.get("throttled") or 0),
            redirects=int(data.get("redirects") or 0),
            door_seconds=float(data.get("door_seconds") or 0.0),
            warmup_operations=int(data.get("warmup_operations") or 0),
            drain_operations=int(data.get("drain_operations") or 0),
            open_loop=OpenLoopResult.from_json(data),
            windows=[WindowSample.from_json(w) for w in data.get("windows") or []
                     if isinstance(w, dict)],
        )

    @property
    def rate_hz(self) -> float:
        return self.succeeded / self.duration_s if self.duration_s > 0 else 0.0

    # an open-loop step's metrics (a closed loop: 0, and its achieved rate is its rate)
    @property
    def offered_hz(self) -> float:
        return self.open_loop.offered_hz if self.open_loop is not None else 0.0

    @property
    def achieved_hz(self) -> float:
        return self.rate_hz

    @property
    def dropped(self) -> int:
        return self.open_loop.dropped if self.open_loop is not None else 0

    @property
    def late(self) -> int:
        return self.open_loop.late if self.open_loop is not None else 0

    @property
    def rate_per_min(self) -> float:
        return self.rate_hz * 60

    @property
    def mbit_s(self) -> float:
        return self.mb_s * 8

    @property
    def mb_s(self) -> float:
        return self.bytes / self.duration_s / 1e6 if self.duration_s > 0 else 0.0

    @property
    def door_latency_s(self) -> float:
        """Mean seconds a redirected request spent at the door (before its last
        server answered); NaN without redirects, or when the driver did not time them
        (the xrootd driver counts redirects only: XrdCl does not tell the door's time)."""
        return (self.door_seconds / self.redirects if self.redirects and self.door_seconds
                else float("nan"))

    @property
    def error_ratio(self) -> float:
        attempts = self.succeeded + self.failed + self.hung
        return (self.failed + self.hung) / attempts if attempts else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "clients": self.clients, "duration_s": self.duration_s,
            "succeeded": self.succeeded, "failed": self.failed, "hung": self.hung,
            "throttled": self.throttled, "redirects": self.redirects,
            "door_seconds": self.door_seconds, "door_latency_s": _finite(self.door_latency_s),
            "bytes": self.bytes, "rate_hz": self.rate_hz,
            "rate_per_min": self.rate_per_min,
            "mb_s": self.mb_s, "mbit_s": self.mbit_s,
            "error_ratio": self.error_ratio,
            "latency_s": {k: _finite(v) for k, v in self.latency_s.items()},
            "errors": self.errors, "error_examples": self.error_examples,
            "timeline": self.timeline, "histogram": self.histogram,
            "warmup_operations": self.warmup_operations,
            "drain_operations": self.drain_operations,
            "windows": [window.to_json() for window in self.windows],
            **({"achieved_hz": self.achieved_hz, **self.open_loop.to_json()}
               if self.open_loop is not None else {}),
        }


def sides_from_json(record: dict[str, Any]) -> dict[str, SideResult]:
    """The sides of a step record: ``"sides": {name: {...}}`` when it has several,
    else the record itself is its one side, named by its operation."""
    if record.get("sides"):
        return {name: SideResult.from_json(part) for name, part in record["sides"].items()}
    name = record.get("operation") or record.get("op") or "step"
    return {name: SideResult.from_json(record)}


def latency_summary(h: HdrHistogram) -> dict[str, float]:
    """mean, p50, p90, p99 and max in seconds (NaN when nothing was recorded)."""
    if not h.get_total_count():
        return {k: float("nan") for k in LATENCIES}
    return {
        "mean": h.get_mean_value() / 1e6,
        "p50": h.get_value_at_percentile(50) / 1e6,
        "p90": h.get_value_at_percentile(90) / 1e6,
        "p99": h.get_value_at_percentile(99) / 1e6,
        "max": h.get_max_value() / 1e6,
    }


def _finite(value: float) -> float | None:
    return None if value != value else value  # NaN -> null in JSON


def _nan_for_none(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def usable_cores() -> int:
    """The cores this process (and the client processes it spawns) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ClientUsage:
    """What the clients cost their host over the measured window: CPU (user + system)
    of the processes that ran them, their resident memory at the window's end, and
    how they were spread over processes."""

    cpu_s: float
    #: the measured window, wall seconds
    window_s: float
    #: the cores the client processes may use (``os.sched_getaffinity``)
    cores: int
    processes: int = 1
    #: the most clients one process ran
    clients_per_process: int = 0
    rss_mb: float = 0.0
    #: clients whose requests a driver's compiled loop made (the rest: the Python loop)
    compiled_clients: int = 0

    @property
    def cpu(self) -> float:
        """CPU use as a fraction of the usable cores (1: every core busy); NaN when no
        window was measured."""
        if self.window_s <= 0 or self.cores <= 0:
            return float("nan")
        return self.cpu_s / (self.window_s * self.cores)

    @classmethod
    def merged(cls, parts: list[ClientUsage]) -> ClientUsage | None:
        """The processes of one host together (same window, same cores)."""
        if not parts:
            return None
        return cls(cpu_s=sum(p.cpu_s for p in parts), window_s=max(p.window_s for p in parts),
                   cores=max(p.cores for p in parts), processes=sum(p.processes for p in parts),
                   clients_per_process=max(p.clients_per_process for p in parts),
                   rss_mb=sum(p.rss_mb for p in parts),
                   compiled_clients=sum(p.compiled_clients for p in parts))

    def to_json(self) -> dict[str, Any]:
        return {"cpu": _finite(self.cpu), "cpu_s": self.cpu_s, "window_s": self.window_s,
                "cores": self.cores, "processes": self.processes,
                "clients_per_process": self.clients_per_process, "rss_mb": self.rss_mb,
                "compiled_clients": self.compiled_clients}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClientUsage:
        return cls(cpu_s=float(data.get("cpu_s") or 0.0),
                   window_s=float(data.get("window_s") or 0.0),
                   cores=int(data.get("cores") or 0), processes=int(data.get("processes") or 1),
                   clients_per_process=int(data.get("clients_per_process") or 0),
                   rss_mb=float(data.get("rss_mb") or 0.0),
                   compiled_clients=int(data.get("compiled_clients") or 0))


def trimmed_timeline(series: dict[str, list[int]]) -> dict[str, list[int]]:
    """The per-second series cut after the last second in which any of them is not 0.

    The accumulator's series are as long as the step's ceiling plus its hang timeout
    (:class:`~.plan.StepClock`), however soon the step ended: a test that raised a
    count-bounded step's ceiling to 10 h wrote 36,902 seconds a series for runs of
    0.1-0.3 s (a 36 MB results file, rewritten after each test). The seconds cut are
    zeros in every series: no count is lost."""
    end = 0
    for values in series.values():
        last = next((i + 1 for i in range(len(values) - 1, -1, -1) if values[i]), 0)
        end = max(end, last)
    return {name: list(values[:end]) for name, values in series.items()}


def live_children_cpu_s() -> float:
    """The CPU time so far of this client process's living descendants (their own and
    what their ended children took), 0 outside a client process.

    A child's time reaches :func:`os.times` only once it ended and was waited for: the
    dcap movers' factory (``drivers/dcap_mover.py``) lives as long as its clients, so its
    movers' CPU came in at once when it ended, inside a short step's window (1.67 s of
    CPU in a 0.81 s window: "saturated"). Counted alive, each second is counted once: a
    descendant that ends between the two readings moves from here into its waiter's
    children's times. Only in a client process (a child of the session's process): the
    session's own descendants are the embedded servers, not clients."""
    import multiprocessing

    if multiprocessing.parent_process() is None:
        return 0.0
    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0.0
    for child in descendants:
        try:
            t = child.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMeter:
    """This process's CPU time (every thread, user + system, and its children's: the
    command-line tools a load client runs per request, ``drivers/commands.py``, once
    they ended; its living descendants', the dcap movers' factory and its movers, by
    :func:`live_children_cpu_s`) between :meth:`start` and :meth:`stop`: the measured
    window of the clients it runs.

    The coordinator marks it (:meth:`mark`) on every tick; :meth:`start` begins the window
    at the last mark, so a coordinator that busy clients kept from running at the
    window's start still meters the whole window (a little more than it)."""

    def __init__(self, clients: int) -> None:
        self.clients = clients
        self._latest: tuple[float, float] | None = None
        self._began: tuple[float, float] | None = None
        self.usage: ClientUsage | None = None

    @staticmethod
    def _now() -> tuple[float, float]:
        times = os.times()
        return time.time(), (times.user + times.system + times.children_user
                             + times.children_system)

    def mark(self) -> None:
        self._latest = self._now()

    def start(self) -> None:
        if self._began is None:
            wall, cpu = self._latest or self._now()
            self._began = wall, cpu + live_children_cpu_s()

    def stop(self) -> None:
        """End the window (once; a meter never started measured nothing)."""
        if self._began is None or self.usage is not None:
            return
        (wall0, cpu0), (wall1, cpu1) = self._began, self._now()
        cpu1 += live_children_cpu_s()
        self.usage = ClientUsage(cpu_s=max(0.0, cpu1 - cpu0), window_s=max(0.0, wall1 - wall0),
                                 cores=usable_cores(), processes=1,
                                 clients_per_process=self.clients, rss_mb=_rss_mb())

    def count_compiled(self, clients: int) -> None:
        """How many of its clients a compiled loop served (into :attr:`usage`)."""
        if self.usage is not None:
            self.usage = replace(self.usage, compiled_clients=clients)


def _rss_mb() -> float:
    try:
        return psutil.Process().memory_info().rss / 1e6
    except psutil.Error:
        return math.nan


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


@dataclass
class StepResult:
    """One load step: an operation at a concurrency, with one or more sides."""

    operation: str
    clients: int
    started: float
    ended: float
    duration_s: float
    warmup_s: float
    sides: dict[str, SideResult] = field(default_factory=dict)
    #: why the step's directory could not be removed afterwards (None: removed)
    cleanup_error: str | None = None
    #: stopped by Ctrl-C: measured until then (``duration_s`` is the measured window)
    interrupted: bool = False
    #: what the clients cost their host (None: not measured, e.g. an older record)
    client: ClientUsage | None = None
    #: a cluster step's per-host breakdown (empty: the clients ran in this process)
    hosts: list[HostResult] = field(default_factory=list)
    #: clients of hosts lost mid-step (a cluster step; a metric rules may name)
    lost: int = 0
    #: what the operation observed (Operation.observe), summed over the processes and
    #: hosts that ran its clients; the judge puts it into the record's derived metrics
    observed: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> SideResult:
        """The whole step; for a one-sided step, that side."""
        if len(self.sides) == 1:
            return next(iter(self.sides.values()))
        parts = list(self.sides.values())
        merged = new_histogram()
        for part in parts:
            if part.histogram:
                merged.add(HdrHistogram.decode(part.histogram.encode("ascii")))
        return SideResult(
            clients=sum(p.clients for p in parts), duration_s=self.duration_s,
            succeeded=sum(p.succeeded for p in parts), failed=sum(p.failed for p in parts),
            hung=sum(p.hung for p in parts), bytes=sum(p.bytes for p in parts),
            latency_s=latency_summary(merged),
            errors=dict(sum((Counter(p.errors) for p in parts), Counter())),
            error_examples={k: v for p in parts for k, v in p.error_examples.items()},
            timeline={},
            histogram=merged.encode().decode("ascii"),
            throttled=sum(p.throttled for p in parts),
            redirects=sum(p.redirects for p in parts),
            door_seconds=sum(p.door_seconds for p in parts),
            warmup_operations=sum(p.warmup_operations for p in parts),
            drain_operations=sum(p.drain_operations for p in parts),
            open_loop=OpenLoopResult.merged([p.open_loop for p in parts if p.open_loop]),
            windows=combine([p.windows for p in parts]),
        )
