"""The typed step record: what goes into the results file comes back the same, and
the one metric lookup reads every kind of metric."""

from __future__ import annotations

import math

from pytest_storagescale.load.stats import SideAccumulator, SideResult, StepResult
from pytest_storagescale.records import (
    BaselineComparison,
    RuleCheck,
    StepRecord,
    Verdict,
)


def _side(clients: int, succeeded: int, latency_s: float, error: Exception | None = None
          ) -> SideResult:
    accumulator = SideAccumulator(4)
    for index in range(succeeded):
        accumulator.record(index % 4, latency_s * (1 + index % 3), 1000, None, counted=True)
    if error is not None:
        accumulator.record(1, latency_s, 0, error, counted=True)
    accumulator.hung = 1
    return SideResult.from_accumulator(accumulator, clients, 3.2)


def _record(sides: dict[str, SideResult]) -> StepRecord:
    result = StepResult(operation="mixed", clients=4, started=100.0, ended=104.5,
                        duration_s=3.2, warmup_s=0.5, sides=sides, cleanup_error="refused")
    return StepRecord(
        step_id="gw1-007", test="t.py::test_mix[c4]", section="mixed", operation="mixed",
        clients=4, system="dcache", worker="gw1", label="mixed", max_operations=50,
        duration_s=60.0, warmup_s=0.5, hang_timeout_s=10.0, params={"file_size": 1000},
        executor="threads", thresholds_file="thr/dcache/default.toml", started=90.0,
        lock_acquired=99.0, ended=105.0, result=result, derived={"mix_ratio": 0.4,
                                                               "recovery_s": math.inf},
        verdict=Verdict.FAIL,
        checks=[RuleCheck("mix_ratio >= 0.5", "mix_ratio", ">=", 0.5, 0.4, False)],
        cleanup_error="refused",
        baseline=BaselineComparison("base.json", "9.2", True, 10.0, -0.12),
    )


def test_a_record_reads_back_the_same():
    record = _record({"readers": _side(4, 30, 0.01, ValueError("short read")),
                      "writers": _side(4, 12, 0.05)})
    again = StepRecord.from_json(record.to_json())
    assert again.to_json() == record.to_json()
    # the plan and the measurement keep their own times
    assert again.duration_s == 60.0 and again.result.duration_s == 3.2
    assert (again.result.started, again.result.ended) == (100.0, 104.5)
    assert (again.started, again.ended) == (90.0, 105.0)
    assert again.result.cleanup_error == "refused" and again.result.clients == 4
    assert again.verdict is Verdict.FAIL and again.violations == record.violations
    assert again.baseline == record.baseline


def test_one_metric_lookup():
    record = _record({"readers": _side(4, 30, 0.01, ValueError("x")),
                      "writers": _side(4, 12, 0.05)})
    assert record.metric("readers.succeeded") == 30
    assert record.metric("succeeded") == 42
    assert record.metric("hung") == 2 and record.metric("failed") == 1
    assert record.metric("rate_hz") == 42 / 3.2
    assert record.metric("readers.p50_s") < record.metric("writers.p50_s")
    assert record.metric("mix_ratio") == 0.4
    assert math.isinf(record.metric("recovery_s"))
    for unknown in ("pilots.rate_hz", "rate", "histogram", "readers.timeline"):
        assert math.isnan(record.metric(unknown)), unknown


def test_a_step_that_never_ran_has_no_measurement():
    record = StepRecord(step_id="main-001", test="t", section="ls", operation="ls",
                        clients=5, verdict=Verdict.ERROR, error="refused")
    again = StepRecord.from_json(record.to_json())
    assert again.result is None and again.total is None and again.error == "refused"
    assert math.isnan(again.metric("rate_hz"))
