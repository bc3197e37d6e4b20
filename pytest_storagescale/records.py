"""Typed records of a run and its steps: what the rules, baselines, the table, plots,
Allure and the benchmark export all read.

A :class:`StepRecord` is one load step: what was planned (section, operation,
concurrency, timings), what the engine measured (:class:`StepResult`, None when the
step could not run), what was derived from it and earlier steps (``mix_ratio``), and
the verdict with the rule checks behind it. :meth:`StepRecord.metric` is the one
metric lookup. ``to_json``/``from_json`` give the results file's format; records
written by the previous release (no ``format`` key) or before doors were recorded
(no ``door`` key: the run's main door) still load, so old results serve as baselines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .gate import HostProbe, StepGate, WindowSample
from .load.server_usage import ServerUsage
from .load.stats import (
    LATE_AFTER_S,
    ClientUsage,
    HostResult,
    SideResult,
    StepResult,
    sides_from_json,
)
from .metrics import MEASURED, STEP_MEASURED
from .units import format_change

if TYPE_CHECKING:
    from .load.plan import StepPlan

#: the results format this release writes; the previous release wrote no ``format``
FORMAT = 2


class Verdict(StrEnum):
    """A step's outcome. ``error``: nothing (or too little) was measured, so no
    verdict on the storage can be given; ``info``: measured, not judged (a step of a
    multi-step test); ``interrupted``: stopped by the user, with what it measured."""

    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    INFO = "info"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class RuleCheck:
    """One rule checked against a step. ``passed`` is None when a relative rule had
    no baseline step to compare with (reported, not failed)."""

    rule: str
    metric: str
    comparison: str
    limit: float | None
    observed: float
    passed: bool | None
    baseline: float | None = None
    relative: bool = False

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RuleCheck:
        observed = data.get("observed")
        return cls(
            rule=data.get("rule", ""), metric=data.get("metric", ""),
            comparison=data.get("comparison", ""), limit=data.get("limit"),
            observed=float("nan") if observed is None else float(observed),
            passed=data.get("passed"), baseline=data.get("baseline"),
            relative=bool(data.get("relative", False)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule, "metric": self.metric, "comparison": self.comparison,
            "limit": self.limit, "observed": self.observed, "passed": self.passed,
            "baseline": self.baseline, "relative": self.relative,
        }

    @property
    def violation(self) -> str:
        """``rate_hz >= 4 (observed 2.1)``, with the baseline for a relative rule."""
        base = f", baseline {self.baseline:.6g}" if self.relative and self.baseline is not None \
            else ""
        return f"{self.rule} (observed {self.observed:.6g}{base})"


def all_passed(checks: list[RuleCheck]) -> bool:
    """No rule failed (a relative rule without a baseline does not fail)."""
    return all(check.passed is not False for check in checks)


def violations(checks: list[RuleCheck]) -> list[str]:
    """The failed rules with what was observed, e.g. ``hung == 0 (observed 2)``."""
    return [check.violation for check in checks if check.passed is False]


@dataclass(frozen=True)
class BaselineComparison:
    """How a step compares with the same step of the baseline run: the baseline
    step's rate, p99, failed, hung, verdict and derived metrics (``recovery_s``), and
    the rate's change."""

    file: str
    version: str
    matched: bool
    rate_hz: float | None = None
    rate_change: float | None = None
    p99_s: float | None = None
    failed: int | None = None
    hung: int | None = None
    verdict: str | None = None
    derived: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BaselineComparison:
        return cls(file=str(data.get("file", "")), version=str(data.get("version", "?")),
                   matched=bool(data.get("matched")), rate_hz=data.get("rate_hz"),
                   rate_change=data.get("rate_change"), p99_s=data.get("p99_s"),
                   failed=data.get("failed"), hung=data.get("hung"),
                   verdict=data.get("verdict"),
                   derived={k: float("inf") if v is None else float(v)
                            for k, v in (data.get("derived") or {}).items()})

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "version": self.version, "matched": self.matched,
                "rate_hz": self.rate_hz, "rate_change": self.rate_change,
                "p99_s": self.p99_s, "failed": self.failed, "hung": self.hung,
                "verdict": self.verdict, "derived": dict(self.derived)}

    def change_text(self) -> str:
        """The rate's change for the table: ``-12%``, ``new`` when unmatched."""
        if not self.matched:
            return "new"
        return format_change(self.rate_change)


@dataclass
class StepRecord:
    """One load step: plan, measurement, derived metrics, verdict and checks."""

    step_id: str
    test: str
    #: the thresholds section that planned the step (``copyout``); "op" in the JSON
    section: str
    #: the engine operation it ran (``get``)
    operation: str
    #: the step's concurrency (per side for a composite operation)
    clients: int
    system: str = ""
    worker: str = "main"
    label: str | None = None
    side: str | None = None
    max_operations: int = 0
    duration_s: float = 0.0
    warmup_s: float = 0.0
    hang_timeout_s: float = 0.0
    params: dict[str, Any] = field(default_factory=dict)
    executor: str = "threads"
    thresholds_file: str = ""
    started: float = 0.0
    lock_acquired: float | None = None
    ended: float = 0.0
    result: StepResult | None = None
    derived: dict[str, float] = field(default_factory=dict)
    verdict: Verdict = Verdict.INFO
    checks: list[RuleCheck] = field(default_factory=list)
    #: why no verdict could be given (verdict ``error``)
    error: str | None = None
    cleanup_error: str | None = None
    baseline: BaselineComparison | None = None
    #: above this ``client_cpu`` the step measured its client host, not the storage
    #: (``--storage-client-cpu-limit``)
    client_cpu_limit: float = 0.9
    #: the door the step's clients used (``root``, ``davs``: ``--storage-load-doors``);
    #: "" in results written before doors were recorded (the run's main door)
    door: str = ""
    #: the engine's plan of the step (operation, clients, timings, driver spec, work
    #: directory), which the fields above record; None for a step read from a results
    #: file (the plan is not written: the fields are its record)
    plan: StepPlan | None = field(default=None, repr=False, compare=False)
    #: what the servers did during the step by their own account (None: not measured)
    server: ServerUsage | None = None
    #: an open-loop step's offered rate (requests/s; ``clients`` is then its cap on
    #: requests in flight) and schedule (``constant``, ``poisson``); 0: a closed loop
    arrival_rate: float = 0.0
    arrivals: str = ""
    #: the gate against the baseline runs (:mod:`~pytest_storagescale.gate`): None
    #: without a baseline, or for a step not judged
    gate: StepGate | None = None
    #: the client host's speed around the step (:func:`~.gate.probe_client_host`)
    probe: HostProbe | None = None
    #: a paired step's both sides (``--storage-compare-with``: :mod:`~.paired`'s
    #: ``PairedResult.to_json``: side B named, the order of the runs, each side's rate,
    #: p50, p99 and windows); None: measured on one side
    paired: dict[str, Any] | None = None

    # -- reading ---------------------------------------------------------------
    @property
    def sides(self) -> dict[str, SideResult]:
        return dict(self.result.sides) if self.result is not None else {}

    @property
    def total(self) -> SideResult | None:
        """The whole step (a one-sided step: that side); None when nothing ran."""
        return self.result.total if self.result is not None else None

    @property
    def measured(self) -> bool:
        return self.result is not None

    @property
    def client(self) -> ClientUsage | None:
        """What the clients cost their host (None: not measured)."""
        return self.result.client if self.result is not None else None

    @property
    def client_cpu(self) -> float:
        """CPU of the client processes over the window, per usable core (NaN: unknown)."""
        return self.client.cpu if self.client is not None else float("nan")

    @property
    def client_saturated(self) -> bool:
        """The client host's cores were (nearly) all busy: the step measured the client
        host, not the storage."""
        return self.client_cpu > self.client_cpu_limit  # False for NaN

    def saturation_text(self) -> str:
        """Why the step's numbers are the client host's, for the failure message."""
        usage = self.client
        assert usage is not None
        spread = (f"{usage.processes} processes of at most {usage.clients_per_process} "
                  f"clients" if usage.processes > 1 else "one process")
        return (f"client host saturated: the clients used {usage.cpu:.0%} of its "
                f"{usage.cores} cores ({spread}), above the limit of "
                f"{self.client_cpu_limit:.0%}: this step measured the client host, not the "
                f"storage; run fewer clients per host or more client hosts")

    #: an open-loop step with more of its window's requests sent late than this share
    #: did not keep its schedule (the client host could not)
    LATE_SHARE = 0.05

    @property
    def schedule_missed(self) -> bool:
        """An open-loop step whose client host could not keep the schedule: more than
        :attr:`LATE_SHARE` of its sent requests went late, or its client CPU was over
        the limit."""
        total = self.total
        if not self.arrival_rate or total is None or total.open_loop is None:
            return False
        sent = total.succeeded + total.failed + total.throttled + total.hung
        return self.client_saturated or (sent > 0 and total.late > self.LATE_SHARE * sent)

    def schedule_text(self) -> str:
        """Why an open-loop step's schedule was not kept, for the failure message."""
        total = self.total
        assert total is not None
        cpu = self.client_cpu
        whose = ("" if math.isnan(cpu) or self.client_saturated else
                 f"; the clients themselves used {cpu:.0%} of its cores: other work on the "
                 f"host kept them waiting")
        return (f"schedule not kept: {total.late} of the requests were sent more than "
                f"{LATE_AFTER_S * 1000:g} ms after their intended time: the client host "
                f"could not offer {self.arrival_rate:g}/s{whose}; their lateness is in the "
                f"response times. Offer less per host, use more client hosts, or a host of "
                f"its own")

    # -- the servers' side (load/server_monitor.py) -----------------------------------
    @property
    def server_cpu(self) -> float:
        """CPU of the server processes over the window, per core (NaN: unknown)."""
        return self.server.cpu if self.server is not None else float("nan")

    def _server_count(self, value: int | None) -> float:
        return float("nan") if value is None else float(value)

    @property
    def server_ops(self) -> float:
        """Requests the server counted over the load (NaN: no counters)."""
        return self._server_count(self.server.requests if self.server else None)

    @property
    def server_threads(self) -> float:
        return self._server_count(self.server.threads if self.server else None)

    @property
    def server_connections(self) -> float:
        return self._server_count(self.server.connections if self.server else None)

    @property
    def server_saturated(self) -> bool:
        """The server processes kept (nearly) every core busy: the step measured a
        server at its limit (the same limit as the client's)."""
        return self.server_cpu > self.client_cpu_limit  # False for NaN

    def server_saturation_text(self) -> str:
        """Why the step's numbers are a saturated server's, for the failure message."""
        assert self.server is not None
        return (f"server saturated: its processes used {self.server.cpu:.0%} of their "
                f"{self.server.cores} cores over the window, above the limit of "
                f"{self.client_cpu_limit:.0%}: this step measured the server at its CPU "
                f"limit")

    @property
    def issued_operations(self) -> int | None:
        """Every operation the clients finished in the step: warm-up, window and drain
        (None: nothing measured)."""
        total = self.total
        if total is None:
            return None
        return (total.warmup_operations + total.succeeded + total.failed + total.throttled
                + total.drain_operations)

    def metric(self, name: str) -> float:
        """A rule metric: derived (``mix_ratio``), a side's (``readers.mb_s``) or the
        whole step's (``rate_hz``, ``p99_s``). NaN when the step has none: no rule
        accepts NaN."""
        if name in self.derived:
            value = self.derived[name]
            return float("nan") if value is None else float(value)
        if name == "lost":
            return float(self.lost) if self.result is not None else float("nan")
        if name in STEP_MEASURED:  # the whole step's, not a side's
            return float(getattr(self, name))
        side_name, _, bare = name.rpartition(".")
        if self.result is None:
            return float("nan")
        side = self.result.sides.get(side_name) if side_name else self.result.total
        if side is None or bare not in MEASURED:
            return float("nan")
        if bare.endswith("_s") and bare[:-2] in side.latency_s:
            value = side.latency_s[bare[:-2]]
        else:
            value = getattr(side, bare)
        return float("nan") if value is None else float(value)

    def metric_or_none(self, name: str) -> float | None:
        value = self.metric(name)
        return None if math.isnan(value) else value

    @property
    def windows(self) -> list[WindowSample]:
        """The per-window samples of the whole step (the gate's); empty when nothing
        was measured or the results are of an earlier release."""
        total = self.total
        return list(total.windows) if total is not None else []

    @property
    def hosts(self) -> list[HostResult]:
        """A cluster step's per-host breakdown (empty: the clients ran in this process
        or nothing was measured); part of its result."""
        return self.result.hosts if self.result is not None else []

    @property
    def lost(self) -> int:
        """Clients of hosts lost mid-step (a cluster step)."""
        return self.result.lost if self.result is not None else 0

    @property
    def violations(self) -> list[str]:
        return violations(self.checks)

    @property
    def key(self) -> tuple:
        """What identifies the step across runs (baseline matching): section,
        concurrency, label, side and door (a step of results written before doors were
        recorded has no door in its key)."""
        key = (self.section, self.scan_point, self.label, self.side)
        return (*key, self.door) if self.door else key

    @property
    def scan_point(self) -> int | str:
        """Where the step is in its scan: its clients, or an open loop's offered rate
        (``"50/s"``)."""
        return f"{self.arrival_rate:g}/s" if self.arrival_rate else self.clients

    @property
    def title(self) -> str:
        """``copyout/readers (alone) at 50 clients``; ``stat at 50/s (at most 200 in
        flight)`` for an open loop."""
        if self.arrival_rate:
            return f"{self.name} at {self.arrival_rate:g}/s (at most {self.clients} in flight)"
        return f"{self.name} at {self.clients} clients"

    @property
    def name(self) -> str:
        """The step's name in tables: section, side and label."""
        side = f"/{self.side}" if self.side else ""
        label = f" ({self.label})" if self.label and self.label != self.side else ""
        return f"{self.section}{side}{label}"

    # -- the results file --------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "format": FORMAT, "step_id": self.step_id, "worker": self.worker,
            "test": self.test, "op": self.section, "operation": self.operation,
            "label": self.label, "side": self.side, "door": self.door,
            **({"arrival_rate": self.arrival_rate, "arrivals": self.arrivals,
                "max_in_flight": self.clients} if self.arrival_rate else {}),
            "system": self.system, "operations_bound": self.max_operations,
            "warmup_s": self.warmup_s,
            "hang_timeout_s": self.hang_timeout_s, "params": self.params,
            "executor": self.executor, "thresholds_file": self.thresholds_file,
            "started": self.started, "lock_acquired": self.lock_acquired,
            "ended": self.ended, "duration_s": self.duration_s,
        }
        if self.result is not None:
            total = self.result.total
            document.update(total.to_json())
            document["clients_total"] = total.clients
            # the measured window (a count-bounded step ends early) beside the plan's
            document["duration_s"] = self.result.duration_s
            document["planned_duration_s"] = self.duration_s
            document["result"] = {
                "started": self.result.started, "ended": self.result.ended,
                "duration_s": self.result.duration_s, "clients": self.result.clients,
                "cleanup_error": self.result.cleanup_error,
            }
            if self.result.client is not None:
                document["client_cpu"] = self.result.client.to_json()["cpu"]
                document["client_host"] = self.result.client.to_json()
            if self.server is not None:
                document["server"] = self.server.to_json()
                document["server_cpu"] = self.server.to_json()["cpu"]
                document["server_ops"] = self.server.requests
                document["server_saturated"] = self.server_saturated
            if len(self.result.sides) > 1:
                document["sides"] = {name: side.to_json()
                                     for name, side in self.result.sides.items()}
        document.update({
            "clients": self.clients, "verdict": self.verdict.value,
            "violations": self.violations, "derived": dict(self.derived),
            "checks": [check.to_json() for check in self.checks],
            "error": self.error, "cleanup_error": self.cleanup_error,
            "client_cpu_limit": self.client_cpu_limit,
            "client_saturated": self.client_saturated,
            **({"schedule_missed": self.schedule_missed} if self.arrival_rate else {}),
        })
        if self.baseline is not None:
            document["baseline"] = self.baseline.to_json()
        if self.gate is not None:
            document["gate"] = self.gate.to_json()
        if self.probe is not None:
            document["client_probe"] = self.probe.to_json()
        if self.paired is not None:
            document["paired"] = self.paired
        if self.hosts:
            document["lost"] = self.lost
            document["hosts"] = [host.to_json() for host in self.hosts]
        return document

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        """Read a step of a results file, this release's or the previous one's."""
        verdict = data.get("verdict", "info")
        baseline = data.get("baseline")
        return cls(
            step_id=str(data.get("step_id", "")), test=str(data.get("test", "")),
            section=str(data.get("op", "")),
            operation=str(data.get("operation") or data.get("op", "")),
            clients=int(data.get("clients", 0)), system=str(data.get("system", "")),
            worker=str(data.get("worker", "main")), label=data.get("label"),
            side=data.get("side"), max_operations=int(data.get("operations_bound") or 0),
            duration_s=float(data.get("planned_duration_s") or data.get("duration_s") or 0.0),
            warmup_s=float(data.get("warmup_s") or 0.0),
            hang_timeout_s=float(data.get("hang_timeout_s") or 0.0),
            params=dict(data.get("params") or {}), executor=str(data.get("executor", "")),
            thresholds_file=str(data.get("thresholds_file", "")),
            started=float(data.get("started") or 0.0), lock_acquired=data.get("lock_acquired"),
            ended=float(data.get("ended") or 0.0), result=_result_from_json(data),
            derived={k: (float("nan") if v is None else float(v))
                     for k, v in (data.get("derived") or {}).items()},
            verdict=Verdict(verdict) if verdict in Verdict._value2member_map_ else Verdict.INFO,
            checks=[RuleCheck.from_json(c) for c in data.get("checks") or []],
            error=data.get("error"), cleanup_error=data.get("cleanup_error"),
            baseline=BaselineComparison.from_json(baseline) if isinstance(baseline, dict)
            else None,
            client_cpu_limit=float(data.get("client_cpu_limit") or 0.9),
            door=str(data.get("door") or ""),
            arrival_rate=float(data.get("arrival_rate") or 0.0),
            arrivals=str(data.get("arrivals") or ""),
            server=ServerUsage.from_json(data["server"])
            if isinstance(data.get("server"), dict) else None,
            gate=StepGate.from_json(data["gate"]) if isinstance(data.get("gate"), dict)
            else None,
            probe=HostProbe.from_json(data["client_probe"])
            if isinstance(data.get("client_probe"), dict) else None,
            paired=data["paired"] if isinstance(data.get("paired"), dict) else None,
        )


def _result_from_json(data: dict[str, Any]) -> StepResult | None:
    """The measurement of a results-file step; None for a step that never ran (an
    ``error`` step of the previous release has counts of zero and no histogram)."""
    if "succeeded" not in data or (data.get("verdict") == "error" and "histogram" not in data):
        return None
    sides = sides_from_json(data)
    # this release writes the measurement's own times; the previous one only the step's
    measured = data.get("result") or data
    return StepResult(
        operation=str(data.get("operation") or data.get("op", "")),
        clients=int(measured.get("clients") or data.get("clients", 0)),
        started=float(measured.get("started") or 0.0),
        ended=float(measured.get("ended") or 0.0),
        duration_s=float(measured.get("duration_s") or 0.0),
        warmup_s=float(data.get("warmup_s") or 0.0), sides=sides,
        cleanup_error=measured.get("cleanup_error"),
        # this release's client CPU and memory; older records have none
        client=ClientUsage.from_json(data["client_host"])
        if isinstance(data.get("client_host"), dict) else None,
        hosts=[HostResult.from_json(h) for h in data.get("hosts") or []],
        lost=int(data.get("lost") or 0),
    )


@dataclass(frozen=True)
class ClientInfo:
    """Where the load came from."""

    host: str
    user: str
    versions: dict[str, str]
    argv: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "user": self.user, "versions": self.versions,
                "argv": self.argv}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClientInfo:
        return cls(host=str(data.get("host", "")), user=str(data.get("user", "")),
                   versions=dict(data.get("versions") or {}), argv=list(data.get("argv") or []))


@dataclass(frozen=True)
class RunInfo:
    """The run a step belongs to: endpoint, storage system and version, thresholds."""

    endpoint: str
    endpoint_id: str
    embedded: bool
    system: str
    version: str
    version_source: str
    thresholds_file: str
    thresholds_reason: str
    run_id: str
    started: float
    executor: str
    driver: str
    client: ClientInfo
    #: plan scale (``--storage-scale``); 1 for the plan as written
    scale: float = 1.0
    #: driver option names in use (never their values)
    driver_options: tuple[str, ...] = ()
    #: the endpoint's own door (the load steps' default); "" in older results
    door: str = ""
    #: the server that stood in for the system under test, when a suite ran against
    #: another (suites/dcache without a dCache distribution: the Apache WebDAV door);
    #: "" when the storage was the system's own
    stand_in: str = ""
    #: side B of a paired comparison (``--storage-compare-with``): its endpoint and
    #: version; "" when the run measured one side
    compare_with: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "endpoint": self.endpoint, "endpoint_id": self.endpoint_id,
            "embedded": self.embedded, "system": self.system, "version": self.version,
            "version_source": self.version_source, "thresholds_file": self.thresholds_file,
            "thresholds_reason": self.thresholds_reason, "run_id": self.run_id,
            "started": self.started, "executor": self.executor, "driver": self.driver,
            "client": self.client.to_json(), "scale": self.scale,
            "driver_options": list(self.driver_options), "door": self.door,
            **({"stand_in": self.stand_in} if self.stand_in else {}),
            **({"compare_with": self.compare_with} if self.compare_with else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunInfo:
        text = {key: str(data.get(key, "")) for key in (
            "endpoint", "system", "version", "version_source", "thresholds_file",
            "thresholds_reason", "run_id", "executor", "driver")}
        return cls(
            **text, endpoint_id=str(data.get("endpoint_id") or data.get("endpoint", "")),
            embedded=bool(data.get("embedded")), started=float(data.get("started") or 0.0),
            client=ClientInfo.from_json(data.get("client") or {}),
            scale=float(data.get("scale") or 1.0),
            driver_options=tuple(data.get("driver_options") or ()),
            door=str(data.get("door") or ""), stand_in=str(data.get("stand_in") or ""),
            compare_with=str(data.get("compare_with") or ""),
        )
