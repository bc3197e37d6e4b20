"""A verdict is only given on what was measured: a step that completed nothing (or too
little for its rules) is an error, never a pass; a failed step says why. Runs on the
memory driver, whose latency and failures the test sets (issue 8)."""

from __future__ import annotations

import json

import pytest

PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "DURATION"
hang_timeout = "30s"

[ops.stat]
clients = [1]
MIN

[[ops.stat.expect]]
rules = RULES

[ops.mixed]
clients = [1]
file_size = "1kB"
files = 2

[[ops.mixed.expect]]
rules = ["mix_ratio > 0"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()

@pytest.mark.storagescale_op("mixed")
def test_mixing(storage_load, storage_clients):
    storage_load.mixing()
"""


@pytest.fixture
def run_plan(pytester):
    def run(*, duration="0.5s", rules='["failed == 0"]', minimum="", options=(), k="stat",
            hang_timeout="30s"):
        folder = pytester.path / "thr" / "xrootd"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "t.toml").write_text(
            PLAN.replace("DURATION", duration).replace("RULES", rules).replace("MIN", minimum)
            .replace('hang_timeout = "30s"', f'hang_timeout = "{hang_timeout}"'))
        pytester.makepyfile(test_suite=SUITE)
        args = ["--storage-endpoint=memory://verdicts/area", "--storage-version=1.0",
                "--storage-thresholds=thr", "--storage-results=r.json", "-k", k,
                "-p", "no:cacheprovider", *(f"--storage-driver-option={o}" for o in options)]
        result = pytester.runpytest_subprocess(*args)
        steps = json.loads((pytester.path / "r.json").read_text())["steps"]
        return result, steps
    return run


def test_a_step_that_completed_nothing_is_an_error_not_a_pass(run_plan):
    # every stat takes 2 s, the step lasts 0.5 s: nothing completes inside it
    result, [step] = run_plan(options=["latency=2"])
    result.assert_outcomes(failed=1)
    assert step["verdict"] == "error" and step["succeeded"] == step["failed"] == 0
    result.stdout.fnmatch_lines([
        "*stat step at 1 clients gave no verdict: no operation completed in 0.5 s, fewer "
        "than min_operations = 1: the step is shorter than one operation; raise duration*",
        "stat *1 *0 *error",
    ])


def test_min_operations_is_the_floor_of_a_verdict(run_plan):
    result, [step] = run_plan(minimum="min_operations = 1000000", options=["latency=0.01"])
    result.assert_outcomes(failed=1)
    assert step["verdict"] == "error" and 0 < step["succeeded"] < 1_000_000
    assert "fewer than min_operations = 1000000" in step["error"]


def test_a_percentile_rule_needs_enough_operations(run_plan):
    # about 10 stats in 0.5 s: a p99 over them would be the maximum of ten, not a p99
    result, [step] = run_plan(rules='["p99_s <= 10"]', options=["latency=0.05"])
    result.assert_outcomes(failed=1)
    assert step["verdict"] == "error" and step["succeeded"] < 100
    assert "'p99_s <= 10' needs at least 100 succeeded operations" in step["error"]
    # p50 needs two: the same step passes a median rule
    result, [step] = run_plan(rules='["p50_s <= 10"]', options=["latency=0.05"])
    result.assert_outcomes(passed=1)


def test_a_mixed_step_whose_steps_alone_measured_nothing_is_an_error(run_plan):
    result, steps = run_plan(options=["latency=2"], k="mixing")
    result.assert_outcomes(failed=1)
    # the first step alone already could not give a verdict: mixing stops there
    assert [s["verdict"] for s in steps] == ["error"]
    assert "completed by its" not in steps[0]["error"]  # a one-sided step names no side


def test_a_failed_step_says_why(run_plan):
    result, [step] = run_plan(options=["fail_every=2"])
    result.assert_outcomes(failed=1)
    assert step["failed"] > 0
    [error_class] = step["errors"]
    result.stdout.fnmatch_lines([
        "*stat step at 1 clients broke its thresholds*",
        "*failed*== 0*VIOLATED*",
        "why:",
        f"  * x {error_class}: *",
    ])
    # and the terminal summary repeats it under the table
    result.stdout.fnmatch_lines(["stat *fail", "why:", "  stat at 1 clients (fail):",
                                 f"    * x {error_class}: *"])


@pytest.mark.parametrize("rules, verdict", [
    ('["failed == 0"]', "fail"),  # no rule names hung: "hung == 0" judges the step
    ('["failed == 0", "hung <= 1000"]', "pass"),  # a rule naming hung replaces it
])
def test_hung_and_lost_are_judged_unless_the_file_says_otherwise(run_plan, rules, verdict):
    # the client's third request and every later one hang: the step has hung clients
    result, [step] = run_plan(rules=rules, options=["hang_after=2"], hang_timeout="1s")
    assert step["hung"] > 0 and step["verdict"] == verdict, step
    checks = {check["rule"]: check["passed"] for check in step["checks"]}
    assert checks["lost == 0"] is True  # the other default: one host, nothing lost
    if verdict == "fail":
        assert checks["hung == 0"] is False
        result.stdout.fnmatch_lines(["*hung*== 0*VIOLATED*"])
    else:
        assert "hung == 0" not in checks and checks["hung <= 1000"] is True

