"""One load step from the suite's point of view: plan it from the thresholds section,
measure it on the engine (holding the endpoint), judge it against the rules (and the
baseline), and log the :class:`StepRecord`."""

from __future__ import annotations

import math
import os
import posixpath
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from .baseline import is_probe, measured_nothing, since_fault
from .cluster import run_cluster_step
from .drivers.base import Driver
from .drivers.registry import driver_class, scheme_driver
from .errors import (
    StepError,
    StorageError,
    StorageScaleUsageError,
    StorageScaleWarning,
    ThresholdsError,
)
from .gate import (
    ACHIEVED_SHARE,
    GateSettings,
    GateVerdict,
    HostProbe,
    StepGate,
    host_pvalue,
    host_shown_slowdown,
    host_slowdown,
    judge_samples,
    probe_client_host,
    reproduced,
)
from .limits import check_open_files, check_threads
from .load.engine import StepInterrupted, refuse_out_of_process, run_step
from .load.executors import isolates_clients, planned_processes
from .load.operations import get_operation, stays_in_process
from .load.plan import StepContext, StepPlan, StepProgress
from .paired import alone_because, measure_paired, side_b
from .records import RuleCheck, RunInfo, StepRecord, Verdict, all_passed
from .session import Door, StorageRun
from .session.stopping import stop_cause
from .thresholds import SectionPlan, ThresholdSet, evaluate

#: derives metrics (``mix_ratio``) from a measured step and earlier ones
Derive = Callable[[StepRecord], dict[str, float]]
#: ``True``/``False``, or decides from the measured step whether to judge it
Judge = bool | Callable[[StepRecord], bool]


@dataclass(frozen=True)
class StepRequest:
    """What a test asks for: section ``section`` at ``clients``; ``overrides`` replace
    the section's values (``duration``, ``hang_timeout``, ``warmup``, parameters);
    ``label`` names the step's role in a multi-step test; ``side`` runs one side of a
    composite section alone; ``door`` names the door its clients use (None: the
    endpoint's own); ``arrival_rate`` makes it an open-loop step at that offered rate
    (``clients`` its cap on requests in flight; 0: the closed loop); ``step`` is what
    the test gives the operation (:class:`~.load.plan.StepContext`: doors by name,
    extra data); ``cluster`` the Dask scheduler its clients run on (None: this
    host; the ``storage_cluster`` fixture gives ``--storage-cluster``)."""

    test: str
    system: str
    section: str
    clients: int
    overrides: dict[str, Any] = field(default_factory=dict)
    label: str | None = None
    side: str | None = None
    door: str | None = None
    arrival_rate: float = 0.0
    step: StepContext = field(default_factory=StepContext)
    cluster: str | None = None


@dataclass
class StepOutcome:
    """A finished step as the test sees it."""

    record: StepRecord
    thresholds: ThresholdSet
    run_info: RunInfo


def section_plan(thresholds: ThresholdSet, section: str) -> SectionPlan:
    plan = thresholds.section(section)
    if plan is None:
        raise ThresholdsError(
            f"{thresholds.path}: no [ops.{section}] section; the suite asked for a {section} "
            f"step. Add [ops.{section}] with clients = [...] to the file."
        )
    return plan


def plan_step(run: StorageRun, request: StepRequest, section: SectionPlan, *,
              thresholds: ThresholdSet | None = None, door: Door | None = None
              ) -> StepRecord:
    """The record the step will fill, holding the engine's plan (``record.plan``);
    ``thresholds`` (default: the run's file for the system) and ``door`` (default: the
    run's door the request names) as the test's fixtures give them."""
    overrides = dict(request.overrides)
    settings = run.settings
    duration = overrides.pop("duration", None) or settings.duration or section.duration
    hang_timeout = (overrides.pop("hang_timeout", None) or settings.hang_timeout
                    or section.hang_timeout)
    warmup = overrides.pop("warmup", section.warmup)
    operation = get_operation(section.operation)
    params = {**section.params, **overrides}
    if request.side is not None:
        operation = _side_operation(operation, request, section)
        params = {k: v for k, v in params.items() if k in operation.param_names}
    if stays_in_process(operation):  # before anything is made: one sentence, no load
        refuse_out_of_process(operation, "cluster" if request.cluster else settings.executor)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    step_id = run.ledger.next_step_id(worker)
    try:  # before the step's load: one paragraph naming ulimit -n or ulimit -u
        driver_class = run.endpoint.driver_spec(None).driver_class
        clients = request.clients * max(1, len(operation.sides))
        if not request.cluster:  # a cluster's clients are on its hosts
            processes = planned_processes(settings.executor, clients, driver_class)
            check_open_files(clients, getattr(driver_class, "files_per_client", 2),
                             processes=processes)
            check_threads(clients, processes=processes)
    except StorageScaleUsageError as exc:
        raise StepError(f"{request.section} step at {request.clients} clients: {exc}") \
            from None
    door = door or run.door(request.door)  # the run directory as that door names it
    thresholds = thresholds or run.thresholds(request.system)
    plan = StepPlan(
        operation=operation, clients=request.clients, duration=duration, warmup=warmup,
        hang_timeout=hang_timeout, driver=door.spec,
        workdir=door.path(f"{request.section}-c{request.clients}-{step_id}"), params=params,
        max_operations=section.max_operations, arrival_rate=request.arrival_rate,
        arrivals=section.arrivals, step=request.step,
    )
    record = StepRecord(
        step_id=step_id, test=request.test, section=request.section,
        operation=operation.name, clients=request.clients, system=request.system,
        worker=worker, label=request.label, side=request.side,
        max_operations=section.max_operations, duration_s=duration, warmup_s=warmup,
        hang_timeout_s=hang_timeout, params=dict(params), executor=settings.executor,
        thresholds_file=str(thresholds.path), started=time.time(),
        client_cpu_limit=getattr(settings, "client_cpu_limit", None) or 0.9, door=door.name,
        plan=plan, arrival_rate=request.arrival_rate,
        arrivals=section.arrivals if request.arrival_rate else "",
    )
    return record


def endpoint_driver(run: StorageRun) -> type[Driver] | None:
    """The driver class of the session's endpoint, found by ``--storage-driver`` or the
    URL scheme alone (the embedded server is not started for it); None for a bad URL,
    which the endpoint's own check reports."""
    settings = run.settings
    try:
        if settings.driver != "auto":
            return driver_class(settings.driver)
        endpoint = run.endpoint
        scheme = (endpoint.protocol if endpoint.is_embedded
                  else urlsplit(settings.endpoint or "").scheme)
        return scheme_driver(scheme)
    except Exception:  # noqa: BLE001 - the endpoint's own check reports a bad URL
        return None


def client_host_lines(run: StorageRun) -> list[str]:
    """:func:`executor_line` for the session's endpoint, and its driver's word on how it
    makes the requests."""
    driver = endpoint_driver(run)
    try:
        requests = driver.request_line(run.settings.driver_options or {}) if driver else None
    except Exception:  # noqa: BLE001 - the endpoint's own check reports bad options
        requests = None
    return [executor_line(run.settings.executor, driver), *([requests] if requests else [])]


def executor_line(executor: str, driver: type | None) -> str:
    """The header's word on how a step's clients are spread over processes."""
    limit = int(getattr(driver, "clients_per_process", 0) or 0)
    name = getattr(driver, "name", "the driver")
    isolated = executor == "auto" and driver is not None and isolates_clients(driver)
    where = ("threads of one spawned process (its client library never runs in "
             "pytest's: a crash of it costs the step, not the session)" if isolated
             else "threads of one process")
    if executor == "threads" or not limit:
        return (f"clients: {where} ({executor} executor"
                f"{'' if limit else f'; {name} needs no sharding'})")
    return (f"clients: at most {limit} per process ({name}'s clients_per_process; its "
            f"client library slows down with more connections in one process), "
            f"{where + ' up to that, then ' if executor == 'auto' else ''}"
            f"ceil(clients / {limit}) processes, at least one per core")


def _side_operation(operation, request: StepRequest, section: SectionPlan):
    sides = {name: op for name, op, _ in operation.groups(request.clients)}
    if request.side not in sides:
        raise ThresholdsError(
            f"[ops.{section.name}] runs {operation.name}, which has no side "
            f"{request.side!r}; sides: {', '.join(sides) or 'none'}."
        )
    return sides[request.side]


def server_watch(run: StorageRun, record: StepRecord):
    """The servers' side of the step (:class:`~.load.server_monitor.ServerWatch`): the
    embedded server this process runs (its processes; its summary monitoring when it
    reports) or a remote storage's monitoring stream; None when there is neither (an
    xdist worker: the controller runs the server)."""
    server, listener = run.endpoint.embedded_server, getattr(run.endpoint, "listener", None)
    plan = record.plan
    if (server is None and listener is None) or plan is None:
        return None
    from .load.server_monitor import ServerWatch

    def send(count: int) -> None:
        """``count`` requests of the step's operation (a stat, or an ls of the run
        directory), over the step's door: a calibration of the server's counters, once
        per session and operation."""
        driver = plan.driver.connect("server-counters", timeout=plan.client_timeout)
        request = driver.ls if plan.operation.name == "ls" else driver.stat
        try:
            for _ in range(count):
                request(posixpath.dirname(plan.workdir.rstrip("/")) or "/")
        finally:
            driver.close()

    pids = server.server_pids() if server is not None else []
    billing = _billing_watch(server, plan)
    exporter = _exporter_watch(server, plan, record.door)
    where = ([f"embedded {server.kind} (pid {', '.join(map(str, pids))})"] if pids else []) \
        + ([f"xrd.report to {listener.address}"] if listener is not None else []) \
        + ([f"billing in {billing.log.folder}"] if billing is not None else []) \
        + ([f"exporter {exporter.url}"] if exporter is not None and exporter.url else [])
    return ServerWatch(source="; ".join(where), operation=plan.operation.name, pids=pids,
                       listener=listener, door=record.door, send=send, billing=billing,
                       billing_counter=billing.counter if billing is not None else "",
                       exporter=exporter)


def _billing_watch(server, plan):
    """The step's folder in dCache's billing (:mod:`.load.dcache_billing`) when the
    embedded server keeps one (``billing_directory``: the embedded dCache) and the
    step's operation moves files (a get, a put, readers beside writers, the tape
    steps), else None. Its files' ends are marked now, before the set-up: a stage's
    records name its files by the set-up's writes."""
    folder = getattr(server, "billing_directory", None)
    if folder is None:
        return None
    from .load.dcache_billing import WATCHED, BillingLog, BillingWatch, counter_for

    counter = counter_for(plan.operation.name, len(plan.operation.sides) > 1)
    if not counter and plan.operation.name not in WATCHED:  # a namespace step
        return None  # moves no file: nothing to compare
    watch = BillingWatch(BillingLog(folder), plan.workdir, counter=counter)
    watch.prime()
    return watch


def _exporter_watch(server, plan, door: str = ""):
    """dCache's Prometheus exporter over the step (:mod:`.load.dcache_exporter`) when
    the embedded server is a dCache (``prometheus_url``): one that says the release
    ships none when it is "" (10.2), else None (another kind of server). ``door``: the
    step's (on ``srm`` the SRM door's request counter is compared)."""
    url = getattr(server, "prometheus_url", None)
    if url is None:
        return None
    from .load.dcache_exporter import ExporterWatch, no_exporter

    if not url:
        return ExporterWatch("", "", "", plan.operation.name,
                             note=getattr(server, "exporter_note", "")
                             or no_exporter(getattr(server, "version", "")))
    from .servers.dcache import PROMETHEUS_USER

    return ExporterWatch(url, PROMETHEUS_USER, server.password, plan.operation.name,
                         door=door)


def measure(run: StorageRun, record: StepRecord,
            progress: Callable[[StepProgress], None] | None, *,
            clients_per_host: int = 0, section: SectionPlan | None = None,
            cluster: str | None = None) -> None:
    """Run the step's plan (``record.plan``) on the engine, holding the endpoint, its
    clients on ``cluster``'s hosts when one is given; fill ``record``. With
    ``--storage-compare-with`` a closed-loop step is measured on both sides in
    alternation (:mod:`.paired`; ``section`` gives the gate's minimum effects):
    ``record.result`` is side B's, ``record.paired`` both sides'."""
    plan = record.plan
    assert plan is not None, "measure() takes a record from plan_step()"
    paired = paired_side(run, record, cluster, section)
    watch = server_watch(run, record) if paired is None else None
    observe = watch.bracket if watch is not None else None
    try:
        with run.ledger.lock():
            record.lock_acquired = time.time()
            before = probe_client_host() if _probed(run) else None
            if cluster:  # the clients run on its hosts
                record.executor = "cluster"
                record.result = run_cluster_step(cluster, plan, progress,
                                                 clients_per_host=clients_per_host,
                                                 observe=observe)
            elif paired is not None:
                both = measure_paired(
                    run, plan, paired, progress=progress, executor=run.settings.executor,
                    door_timeout=run.door(record.door).timeout,
                    settings=_gate_settings(section), door=record.door)
                record.result, record.paired = both.b, both.to_json()
                record.gate = both.gate
                record.baseline = both.comparison(run.endpoint.version)
            else:
                record.result = run_step(plan, executor=run.settings.executor,
                                         progress=progress, observe=observe)
            if before is not None:
                record.probe = HostProbe(before, probe_client_host())
    except StorageError as exc:
        record.ended, record.verdict, record.error = time.time(), Verdict.ERROR, str(exc)
        return
    except StorageScaleUsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - an operation's own code (a site's): the
        # step is recorded as an error naming it, never lost from the table and JSON
        record.ended, record.verdict = time.time(), Verdict.ERROR
        record.error = f"{type(exc).__name__} in {plan.operation.name}'s step: {exc}"
        return
    except StepInterrupted as interrupted:
        record.result = interrupted.result
        record.verdict = Verdict.INTERRUPTED
        record.error = (f"interrupted ({stop_cause()}) after {interrupted.result.duration_s:.3g} s "
                        f"of measurement; the clients were stopped and the step cleaned up")
    record.started, record.ended = record.result.started, record.result.ended
    record.cleanup_error = record.result.cleanup_error
    if watch is not None:  # CPU over the measured window, the counters over the load
        measure_from = record.result.started + record.result.warmup_s
        record.server = watch.usage(measure_from, measure_from + record.result.duration_s)


def paired_side(run: StorageRun, record: StepRecord, cluster: str | None = None,
                section: SectionPlan | None = None):
    """Side B of a paired comparison for this step (:func:`.paired.side_b`), or None:
    no ``--storage-compare-with``, an open-loop step, a cluster's, one its test hands
    doors or a context (:func:`.paired.alone_because`), or a step of a recovery (its
    probes are timed from its overload's end: paired, each probe's runs on both sides
    would count in its ``recovery_s``); measured on A alone, as without the option."""
    if record.arrival_rate or cluster or (record.plan and alone_because(record.plan)):
        return None
    if section is not None and section.recovery is not None:
        return None
    return side_b(run)


def _gate_settings(section: SectionPlan | None) -> GateSettings:
    if section is None:
        return GateSettings()
    return GateSettings(min_effect_rate=section.min_effect_rate,
                        min_effect_p99=section.min_effect_p99,
                        latency_floor_s=section.latency_floor,
                        paired_budget=section.paired_budget)


def step_run_info(run: StorageRun, system: str, thresholds: ThresholdSet) -> RunInfo:
    """The run's info; with ``--storage-compare-with``, naming side B."""
    info = run.run_info(system, thresholds)
    side = side_b(run)
    if side is None:
        return info
    return replace(info, compare_with=f"{side.display} (version {side.endpoint.version})")


def _probed(run: StorageRun) -> bool:
    """The client host is probed around each step (:func:`~.gate.probe_client_host`,
    0.5 s before and after) when the run is compared with a baseline or writes results
    (which may be the next run's baseline)."""
    settings = run.settings
    return bool(getattr(settings, "baseline", None) or getattr(settings, "results", None))


def not_comparable(record: StepRecord) -> str | None:
    """Why an open-loop step measured its client host or nothing comparable, or None:
    its schedule was not kept (:attr:`StepRecord.schedule_missed`), or its door achieved
    less than :data:`~.gate.ACHIEVED_SHARE` of the offered rate with no failure and no
    hang to say why, more than a tenth of the requests scheduled in the window neither
    completed, failed, hung nor were dropped in it (still in flight at its end: the
    window is shorter than the door's answers). Requests dropped at the cap on requests
    in flight are a measurement (the door did not keep up): the rules judge them."""
    total = record.total
    if not record.arrival_rate or total is None or total.open_loop is None:
        return None
    if record.schedule_missed:
        return record.schedule_text()
    achieved, offered = total.rate_hz, record.arrival_rate
    scheduled = total.open_loop.scheduled
    unaccounted = scheduled - (total.succeeded + total.failed + total.hung + total.throttled
                               + total.dropped)
    if (achieved < ACHIEVED_SHARE * offered and not (total.failed or total.hung)
            and unaccounted > 0.1 * scheduled):
        return (f"the door achieved {achieved:.3g}/s of the {offered:g}/s offered: "
                f"{unaccounted} of the {scheduled} requests scheduled in the window neither "
                f"completed, failed, hung nor were dropped in it (still in flight at its "
                f"end): the window is shorter than the door's answers, so the step says "
                f"nothing on its rate; raise duration")
    return None


def gate_step(run: StorageRun, record: StepRecord, section: SectionPlan,
              since: float | None = None) -> StepGate | None:
    """The step's gate against the baseline runs (:mod:`~.gate`); None without a
    baseline (an open-loop step that is :func:`not_comparable` is ``inconclusive`` even
    then)."""
    why = not_comparable(record)
    if record.paired is not None:  # judged B / A as it was measured (measure())
        return record.gate
    baseline = run.baseline
    if baseline is None:
        return StepGate(GateVerdict.INCONCLUSIVE, why) if why else None
    bases = baseline.matches(record, since)
    if not bases:
        return None  # a step the baseline does not have: 'new'
    settings = _gate_settings(section)
    probes = [base.probe for base in bases]
    return judge_samples(record.windows, [base.windows for base in bases], settings=settings,
                         host_slowdown=host_slowdown(record.probe, probes),
                         host_p=host_pvalue(record.probe, probes),
                         host_shown=host_shown_slowdown(record.probe, probes),
                         not_comparable=why)


def gate_check(gate: StepGate) -> RuleCheck:
    """A regressed gate as a failed rule: the failure message names the metric, its
    ratio to the baseline and the interval."""
    effect = gate.deciding
    assert effect is not None and effect.ratio is not None
    rate = effect.metric == "rate_hz"
    bound = 1 - effect.min_effect if rate else 1 + effect.min_effect
    key = "min_effect_rate" if rate else "min_effect_p99"
    return RuleCheck(
        rule=f"gate: {effect.metric} vs baseline {effect.interval_text()} (95 % interval) "
             f"wholly {'below' if rate else 'above'} {bound:g} ({key} = {effect.min_effect:g})",
        metric=effect.metric, comparison=">=" if rate else "<=", limit=bound,
        observed=effect.ratio, passed=False)


def counts_disagree(record: StepRecord) -> str | None:
    """Why the server's count of the step's operations and its clients' disagree by
    more than 2 % (:func:`~.load.server_monitor.disagreement`; dCache's exporter's
    too, :func:`~.load.server_monitor.exporter_disagreement`), or None. The exporter's
    calls taken for retries inside the clients' operations (:func:`~.load.
    server_monitor.exporter_retries`) go into the record (``server.exporter.retried``
    and ``retries``)."""
    issued = record.issued_operations
    if record.server is None or issued is None or record.total is None:
        return None
    from .load.server_monitor import disagreement, exporter_disagreement, exporter_retries

    total = record.total
    failed = total.failed + total.throttled
    retried, retries = exporter_retries(issued, total.hung, record.server, failed)
    if retried and record.server.exporter is not None:  # the record says what it took
        record.server = replace(record.server, exporter=replace(
            record.server.exporter, retried=retried, retries=retries))
    return (disagreement(issued, total.hung, record.server, total.clients)
            or exporter_disagreement(issued, total.hung, record.server, total.clients,
                                     clients_failed=failed))


#: what a step whose server counters could not be taken says where its verdict is read
UNMEASURED = ("not measured: the server's count of its operations (the check that the "
              "step measured its own load and nothing else: {why})")


def counts_unmeasured(record: StepRecord) -> str:
    """Why the check that the server counted the step's operations as its clients did
    could not run although it should have (``""``: it ran, or does not apply): the
    step's pass or failure does not include it."""
    return record.server.counts_unmeasured if record.server is not None else ""


def unmeasured_lines(steps: list[StepRecord]) -> list[str]:
    """Under the table: each judged step whose server counters could not be taken, and
    why (``stat at 4 clients (pass): not measured: ...``)."""
    return [f"{step.title} ({step.verdict}): " + UNMEASURED.format(why=why)
            for step in steps
            if step.verdict in (Verdict.PASS, Verdict.FAIL)
            and (why := counts_unmeasured(step))]


def too_little_measured(record: StepRecord, section: SectionPlan) -> str | None:
    """Why the step measured too little for any verdict, or None. Completed means
    succeeded, failed, hung (a hang is a measurement: the storage stopped answering) or
    throttled (the storage said to come back later)."""
    assert record.result is not None
    window = record.result.duration_s
    for name, side in record.result.sides.items():
        done = side.succeeded + side.failed + side.hung + side.throttled
        if done >= section.min_operations:
            continue
        where = f" by its {name}" if len(record.result.sides) > 1 else ""
        what = "no operation" if done == 0 else f"only {done} operation(s)"
        return (f"{what} completed{where} in {window:.3g} s, fewer than min_operations = "
                f"{section.min_operations}: the step is shorter than "
                f"{'one operation' if done == 0 else 'the operations it needs'}; raise "
                f"duration (now {record.duration_s:g} s) or the plan scale")
    return None


def too_few_for_percentiles(record: StepRecord, rules: list) -> str | None:
    """A rule on a percentile needs enough operations for one to lie above it: p99
    needs 100, p90 10, p50 2. Why not, or None."""
    for rule in rules:
        side, _, bare = rule.metric.rpartition(".")
        match = re.fullmatch(r"p(\d+)_s", bare)
        if match is None:
            continue
        needed = math.ceil(100 / (100 - int(match.group(1))))
        sides = record.result.sides if record.result is not None else {}
        result = sides.get(side) if side else record.total
        succeeded = result.succeeded if result is not None else 0
        if succeeded < needed:
            return (f"rule {rule.text!r} needs at least {needed} succeeded operations for "
                    f"its percentile to mean something; the step has {succeeded}: raise "
                    f"duration (now {record.duration_s:g} s) or the plan scale")
    return None


def _undefined_metrics(derived: dict[str, float]) -> str | None:
    undefined = [name for name, value in derived.items() if value != value]  # NaN
    if not undefined:
        return None
    return (f"derived metric(s) {', '.join(undefined)} undefined (NaN): the steps they are "
            f"computed from measured nothing to compare; raise duration")


def empty_baseline(run: StorageRun, base: StepRecord | None, rules: list) -> str | None:
    """Why the step's relative rules cannot be checked against its baseline step, which
    measured nothing (:func:`~.baseline.measured_nothing`), or None."""
    relative = [rule.text for rule in rules if rule.relative]
    if (base is None or run.baseline is None or not relative
            or (why := measured_nothing(base)) is None):
        return None
    return (f"relative rule(s) {', '.join(map(repr, relative))} compare with the baseline's "
            f"step {base.title} of {run.baseline.path}, which measured nothing ({why}): "
            f"against its zeros they would pass whatever this step measured; give a "
            f"baseline whose step measured (an earlier run that passed), or drop the "
            f"relative rules")


def _since_fault(run: StorageRun, record: StepRecord) -> float | None:
    """A recovery probe's seconds since its overload ended (the session's step log
    holds the overload, whichever process ran it); None for any other step."""
    if not is_probe(record):
        return None
    return since_fault(record, (step for _, step in run.ledger.logged()))


def _error(record: StepRecord, why: str) -> None:
    record.verdict, record.error = Verdict.ERROR, why


def judge_step(run: StorageRun, record: StepRecord, section: SectionPlan, *,
               judge: Judge, derive: Derive | None) -> None:
    """Check the step measured enough, derive metrics, then check the section's rules
    (and the baseline's). A step that measured too little is an ``error``, never a
    pass."""
    if record.result is None:
        return
    if (why := too_little_measured(record, section)) is not None:
        return _error(record, why)
    if (why := counts_disagree(record)) is not None:
        return _error(record, why)
    record.derived.update(record.result.observed)  # Operation.observe, every process's
    if derive is not None:
        record.derived.update(derive(record))
    if (why := _undefined_metrics(record.derived)) is not None:
        return _error(record, why)
    baseline = run.baseline
    since = _since_fault(run, record) if baseline is not None else None
    base = baseline.find(record, since) if baseline is not None else None
    if baseline is not None and record.paired is None:  # paired: side A is its baseline
        record.baseline = baseline.compare(record, since)
    if not (judge(record) if callable(judge) else judge):
        record.verdict = Verdict.INFO
        return
    rules = section.rules_for(record.clients, rate=record.arrival_rate)
    if (why := too_few_for_percentiles(record, rules)) is not None:
        return _error(record, why)
    if (why := empty_baseline(run, base, rules)) is not None:
        return _error(record, why)
    record.checks = evaluate(rules, record.metric,
                             baseline=base.metric_or_none if base is not None else None)
    record.gate = gate_step(run, record, section, since)
    if record.gate is not None and record.gate.fails:
        record.checks.append(gate_check(record.gate))
    record.verdict = Verdict.PASS if all_passed(record.checks) else Verdict.FAIL
    if not_comparable(record) is not None:  # the client host's trouble, not the storage's
        record.verdict = Verdict.INFO


def retest(run: StorageRun, request: StepRequest, record: StepRecord, section: SectionPlan, *,
           thresholds: ThresholdSet, door: Door | None,
           progress: Callable[[StepProgress], None] | None) -> None:
    """Measure a regressed step once more before it fails: ``confirmed`` when the
    second measurement regressed too (the step fails), ``not reproduced`` when not
    (its gate is then ``inconclusive`` and the step does not fail on it). Never silent:
    the gate's reason says both."""
    gate = record.gate
    assert gate is not None
    again = plan_step(run, request, section, thresholds=thresholds, door=door)
    measure(run, again, progress, clients_per_host=section.clients_per_host, section=section,
            cluster=request.cluster)
    if again.verdict is Verdict.INTERRUPTED:  # Ctrl-C ends the session, as ever
        record.gate = replace(gate, retest="interrupted")
        record.verdict = Verdict.INTERRUPTED
        record.error = (f"interrupted (Ctrl-C) while measuring the regressed step again; "
                        f"its first measurement: {gate.reason}")
        return
    second = gate_step(run, again, section, _since_fault(run, record)) \
        if again.result is not None and again.verdict is not Verdict.INTERRUPTED else None
    if second is not None and reproduced(gate, second):
        record.gate = replace(gate, retest="confirmed",
                              reason=f"{gate.reason}; measured again: {second.short()}")
        return
    seen = second.short() if second is not None else f"not measured ({again.error})"
    record.gate = replace(gate, verdict=GateVerdict.INCONCLUSIVE, retest="not reproduced",
                          reason=f"regressed, then measured again: {seen}; first: "
                                 f"{gate.reason}")
    record.checks = [check for check in record.checks if not check.rule.startswith("gate:")]
    record.verdict = Verdict.PASS if all_passed(record.checks) else Verdict.FAIL


def run_load_step(run: StorageRun, request: StepRequest, *, judge: Judge = True,
                  derive: Derive | None = None,
                  progress: Callable[[StepProgress], None] | None = None,
                  thresholds: ThresholdSet | None = None,
                  door: Door | None = None) -> StepOutcome:
    """Plan, measure, judge and log one step: ``section`` of ``thresholds`` (default:
    the run's file for the system) over ``door`` (default: the one the request
    names)."""
    thresholds = thresholds or run.thresholds(request.system)
    section = section_plan(thresholds, request.section)
    record = plan_step(run, request, section, thresholds=thresholds, door=door)
    # logged as begun: a process killed mid-step (an xdist worker) still leaves its step
    run.ledger.begin(step_run_info(run, request.system, thresholds), record)
    measure(run, record, progress, clients_per_host=section.clients_per_host, section=section,
            cluster=request.cluster)
    if record.verdict is not Verdict.INTERRUPTED:
        judge_step(run, record, section, judge=judge, derive=derive)
        if record.gate is not None and record.gate.fails:
            retest(run, request, record, section, thresholds=thresholds, door=door,
                   progress=progress)
    if record.verdict in (Verdict.PASS, Verdict.FAIL) and (why := counts_unmeasured(record)):
        # the test's report says it too (pytest's warnings summary and count), not only
        # the table's note and the JSON
        warnings.warn(StorageScaleWarning(f"{record.title} ({record.verdict}): "
                                          + UNMEASURED.format(why=why)), stacklevel=2)
    run_info = step_run_info(run, request.system, thresholds)
    run.ledger.append(run_info, record)
    return StepOutcome(record, thresholds, run_info)
