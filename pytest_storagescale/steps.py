"""One load step from the suite's point of view: plan it from the thresholds file,
run it on the engine (holding the endpoint), judge it against the rules (and the
baseline), and describe it as a results record."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .baseline import rate_change, record_metric
from .errors import StorageError, ThresholdsError
from .load.engine import StepPlan, run_step
from .load.operations import OPERATIONS
from .load.stats import StepResult
from .session import StorageRun
from .thresholds import ThresholdSet, evaluate


@dataclass
class StepOutcome:
    """A finished step as the test sees it."""

    result: StepResult | None
    record: dict[str, Any]
    thresholds: ThresholdSet
    run_info: dict[str, Any]


def run_load_step(
    run: StorageRun, *, test: str, system: str, op: str, clients: int,
    overrides: dict[str, Any] | None = None, label: str | None = None,
    judge: bool | Callable[[StepResult], bool] = True,
    derive: Callable[[StepResult], dict[str, float]] | None = None,
    side: str | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> StepOutcome:
    """Run section ``op`` of the matched thresholds file at ``clients``, and judge
    it against the section's rules.

    ``label`` names the step's role in a multi-step test (``baseline``,
    ``overload``...); ``judge=False`` records a measurement without rules
    (verdict ``info``); ``derive`` adds metrics computed from the result and
    earlier steps (``mix_ratio``, ``recovery_s``) before the rules are checked;
    ``judge`` may decide from the result. ``side`` runs one side of a composite
    section alone (``readers`` of ``mixed``: its ``get`` with the section's
    parameters)."""
    thresholds = run.thresholds(system)
    op_plan = thresholds.op(op)
    if op_plan is None:
        raise ThresholdsError(
            f"{thresholds.path}: no [ops.{op}] section; the suite asked for a {op} step. "
            f"Add [ops.{op}] with clients = [...] to the file."
        )
    overrides = dict(overrides or {})
    settings = run.settings
    duration = overrides.pop("duration", None) or settings.duration or op_plan.duration
    hang_timeout = (
        overrides.pop("hang_timeout", None) or settings.hang_timeout or op_plan.hang_timeout
    )
    warmup = overrides.pop("warmup", op_plan.warmup)
    tag = run.next_tag()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    operation = op_plan.operation
    params = {**op_plan.params, **overrides}
    if side is not None:
        groups = {name: op for name, op, _ in OPERATIONS[operation].groups(clients)}
        if side not in groups:
            raise ThresholdsError(
                f"{thresholds.path}: [ops.{op}] runs {operation}, which has no side "
                f"{side!r}; sides: {', '.join(groups) or 'none'}."
            )
        operation = groups[side].name
        params = {k: v for k, v in params.items() if k in groups[side].param_names}
    plan = StepPlan(
        op=operation, clients=clients, duration=duration, warmup=warmup,
        hang_timeout=hang_timeout, endpoint_url=run.endpoint.url,
        driver=run.driver_name, workdir=f"{run.run_dir}/{op}-c{clients}-{worker}-{tag}",
        writable_root=run.run_dir, params=params, tag=run.connection_tag(),
        driver_options=run.driver_options, operations=op_plan.operations,
    )
    record: dict[str, Any] = {
        "step_id": f"{worker}-{tag}", "worker": worker, "label": label,
        "operation": operation, "operations_bound": op_plan.operations, "side": side,
        "test": test, "op": op, "clients": clients, "system": system,
        "duration_s": duration, "warmup_s": warmup, "hang_timeout_s": hang_timeout,
        "params": plan.params, "executor": settings.executor,
        "thresholds_file": str(thresholds.path), "started": time.time(),
    }
    result = None
    try:
        with run.load_lock():
            record["lock_acquired"] = time.time()
            result = run_step(plan, executor=settings.executor, progress=progress)
    except StorageError as exc:
        record.update(
            ended=time.time(), verdict="error", violations=[], error=str(exc),
            succeeded=0, failed=0, hung=0, rate_hz=0.0, mb_s=0.0, bytes=0,
            latency_s={}, errors={exc.error_class: 1}, checks=[],
        )
    else:
        if derive is not None:
            result.extra.update(derive(result))
        total = result.total
        if callable(judge):
            judge = judge(result)
        base = run.baseline.find(record) if run.baseline else None
        verdict = evaluate(
            op_plan.rules_for(clients) if judge else [], result.metric,
            baseline=(lambda name: record_metric(base, name)) if base else None,
        )
        record.update(
            started=result.started, ended=result.ended, **total.to_json(),
            verdict=verdict.verdict if judge else "info", violations=verdict.violations,
            derived=dict(result.extra),
            checks=[check.to_json() for check in verdict.checks],
            cleanup_error=result.cleanup_error,
        )
        if run.baseline is not None:
            record["baseline"] = {
                "file": str(run.baseline.path), "version": run.baseline.version,
                "matched": base is not None,
                "rate_hz": record_metric(base, "rate_hz") if base else None,
                "rate_change": rate_change(record, base),
            }
        record["clients"] = clients
        if len(result.sides) > 1:
            record["sides"] = {name: part.to_json() for name, part in result.sides.items()}
    run_info = run.run_info(system, thresholds)
    run.step_finished(result)
    run.log_step({**record, "run_info": run_info})
    return StepOutcome(result, record, thresholds, run_info)
