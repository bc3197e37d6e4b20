"""Baselines: relative rules, step matching, the change column, and a real slower
server failing against a normal run's baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_storagescale.baseline import Baseline, rate_change
from pytest_storagescale.errors import StorageScaleUsageError, ThresholdsError
from pytest_storagescale.records import StepRecord, Verdict, all_passed, violations
from pytest_storagescale.thresholds import evaluate, parse_rule

REPO = Path(__file__).resolve().parent.parent
#: results written by the previous release (0.1.0, before the typed records):
#: suites/xrootd and suites/dcache at 2 clients against the embedded xrootd
OLD_RESULTS = Path(__file__).parent / "data" / "results-0.1.0.json"


@pytest.mark.parametrize(
    "text, relative, factor",
    [("rate_hz >= 0.9 * baseline", True, 0.9), ("hung <= baseline", True, 1.0),
     ("p99_s <= 1.5*baseline", True, 1.5), ("rate_hz >= 4", False, 4.0)],
)
def test_relative_rules_parse(text, relative, factor):
    rule = parse_rule(text)
    assert (rule.relative, rule.limit) == (relative, factor)


@pytest.mark.parametrize("text", ["rate_hz >= baseline * 0.9", "rate_hz >= 0.9 baseline",
                                  "rate_hz >= 0.9 * base"])
def test_bad_relative_rules(text):
    with pytest.raises(ThresholdsError, match="0.9 \\* baseline"):
        parse_rule(text)


def test_relative_rule_evaluation():
    rules = [parse_rule("rate_hz >= 0.9 * baseline"), parse_rule("hung <= baseline")]
    now = {"rate_hz": 85.0, "hung": 0.0}
    base = {"rate_hz": 100.0, "hung": 0.0}
    checks = evaluate(rules, now.__getitem__, base.get)
    assert not all_passed(checks)
    assert violations(checks) == ["rate_hz >= 0.9 * baseline (observed 85, baseline 100)"]
    assert checks[0].limit == pytest.approx(90.0) and checks[0].baseline == 100.0
    # no baseline step: reported (passed None), never failed
    missing = evaluate(rules, now.__getitem__, None)
    assert all_passed(missing) and [c.passed for c in missing] == [None, None]


def test_results_of_the_previous_release_load_as_a_baseline():
    """The kept file was written by 0.1.0: its steps read back with every metric."""
    baseline = Baseline(OLD_RESULTS)
    assert baseline.version == "5.5.3"
    document = json.loads(OLD_RESULTS.read_text())
    assert "format" not in document and len(baseline.steps) >= 9
    for old in document["steps"]:
        step = StepRecord.from_json(old)
        assert step.verdict is Verdict(old["verdict"])
        assert step.metric("rate_hz") == pytest.approx(old["rate_hz"])
        assert step.metric("p99_s") == pytest.approx(old["latency_s"]["p99"])
        assert step.metric("failed") == old["failed"]
        for side, values in (old.get("sides") or {}).items():
            assert step.metric(f"{side}.mb_s") == pytest.approx(values["mb_s"])
    mixed = baseline.steps[("mixed", 2, "mixed", None)]
    assert mixed.metric("mix_ratio") == pytest.approx(
        document["steps"][-1]["derived"]["mix_ratio"])
    # and what this release writes reads back the same
    again = StepRecord.from_json(mixed.to_json())
    assert again.to_json() == mixed.to_json()


def test_one_metric_lookup_reads_sides_latency_and_derived():
    step = StepRecord.from_json(json.loads(OLD_RESULTS.read_text())["steps"][-1])
    assert step.metric("readers.mb_s") > 0 and step.metric("writers.rate_hz") > 0
    assert step.metric("rate_hz") == pytest.approx(
        step.metric("readers.rate_hz") + step.metric("writers.rate_hz"))
    assert step.metric("p50_s") > 0
    assert step.metric("pilots.mb_s") != step.metric("pilots.mb_s")  # NaN: no such side
    assert step.metric("no_such_metric") != step.metric("no_such_metric")
    base = StepRecord.from_json({**step.to_json(), "succeeded": step.total.succeeded * 2,
                                 "sides": None})
    assert rate_change(step, base) == pytest.approx(-0.5)


def test_bad_baseline_files(tmp_path):
    with pytest.raises(StorageScaleUsageError, match="cannot read it"):
        Baseline(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(StorageScaleUsageError, match="not JSON"):
        Baseline(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"benchmarks": []}')
    with pytest.raises(StorageScaleUsageError, match="no 'steps' list"):
        Baseline(tmp_path / "other.json")
    # the shape found only after the load ran in 0.1.0: steps that are not objects
    (tmp_path / "ints.json").write_text('{"steps": [1, 2]}')
    with pytest.raises(StorageScaleUsageError, match="not a pytest-storagescale results"):
        Baseline(tmp_path / "ints.json")


PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "0.3s"
hang_timeout = "5s"

[ops.stat]
clients = [1, 2]

[[ops.stat.expect]]
clients = "*"
rules = ["failed == 0", "rate_hz >= 0.5 * baseline", "hung <= baseline"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()
"""


def test_step_compared_with_the_same_step_of_the_baseline(pytester, tmp_path):
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "any.toml").write_text(PLAN)
    args = [f"--storage-endpoint=file://{area}", "--storage-version=2.0",
            "--storage-thresholds=thr", "-p", "no:cacheprovider"]
    # the first run has no baseline: relative rules are not checked
    first = pytester.runpytest(*args, "--storage-results=first.json")
    first.assert_outcomes(passed=2)
    document = json.loads((pytester.path / "first.json").read_text())
    # pretend the earlier version was 1000x faster at 1 client, and never ran 2
    document["steps"] = [s for s in document["steps"] if s["clients"] == 1]
    document["steps"][0]["succeeded"] *= 1000
    (pytester.path / "base.json").write_text(json.dumps(document))
    second = pytester.runpytest(*args, "--storage-baseline=base.json")
    second.assert_outcomes(passed=1, failed=1)
    second.stdout.fnmatch_lines([
        "*stat step at 1 clients broke its thresholds*",
        "*rate_hz*>= *rate_hz >= 0.5 [*] baseline*VIOLATED*",
        "op*clients*succeeded*rate*vs base*verdict",
        "stat*1*-100%*fail",
        "stat*2*new*pass",
    ])


def test_a_baseline_step_that_measured_nothing_is_no_baseline(pytester, tmp_path):
    """A baseline step that gave no verdict and had 0 succeeded: checked against its
    zeros, 'rate_hz >= 0.5 * baseline' would hold whatever the step measured."""
    args = _file_suite(pytester, tmp_path)
    pytester.runpytest(*args, "--storage-results=first.json").assert_outcomes(passed=2)
    document = json.loads((pytester.path / "first.json").read_text())
    empty = next(s for s in document["steps"] if s["clients"] == 1)
    empty.update(verdict="error", succeeded=0, error="no operation completed in 0.3 s")
    # the 2-client step is judged against its baseline step, not this machine's speed:
    # a baseline rate of 1/s and no windows (the statistical gate: inconclusive)
    other = next(s for s in document["steps"] if s["clients"] == 2)
    other["rate_hz"] = 1.0
    other.pop("windows", None)
    (pytester.path / "base.json").write_text(json.dumps(document))
    second = pytester.runpytest(*args, "--storage-baseline=base.json",
                                "--storage-results=second.json")
    second.assert_outcomes(passed=1, failed=1)
    steps = json.loads((pytester.path / "second.json").read_text())["steps"]
    judged = {s["clients"]: s for s in steps}
    assert judged[2]["verdict"] == "pass"
    assert judged[1]["verdict"] == "error" and judged[1]["succeeded"] > 0
    assert ("relative rule(s) 'rate_hz >= 0.5 * baseline', 'hung <= baseline' compare "
            f"with the baseline's step stat at 1 clients of {pytester.path / 'base.json'}, "
            "which measured "
            "nothing (verdict error, 0 succeeded: no operation completed in 0.3 s)"
            in judged[1]["error"])


@pytest.mark.integration
def test_throttled_server_fails_against_baseline_of_normal_run(pytester, tmp_path):
    """A real slower "version": the same xrootd with the throttle plugin."""
    plan = PLAN.replace("[ops.stat]", "[ops.get]\nfile_size = \"100kB\"\nfiles = 5") \
               .replace("ops.stat.expect", "ops.get.expect") \
               .replace('duration = "0.3s"', 'duration = "2s"\nwarmup = "0.5s"')
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "any.toml").write_text(plan)
    pytester.makepyfile(test_suite=SUITE.replace('"stat"', '"get"'))
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    results = {}
    for name, extra in (("normal", ""),
                        ("throttled", "xrootd.fslib throttle default\n"
                                      "throttle.throttle data 2m concurrency 2")):
        with EmbeddedXRootD(extra_config=extra, https=False) as server:
            args = [f"--storage-endpoint={server.url}", "--storage-thresholds=thr",
                    "--storage-clients=4", "-p", "no:cacheprovider",
                    f"--storage-results={name}.json"]
            if name == "throttled":
                args.append("--storage-baseline=normal.json")
            results[name] = pytester.runpytest(*args)
    results["normal"].assert_outcomes(passed=1)
    throttled = results["throttled"]
    throttled.assert_outcomes(failed=1)
    throttled.stdout.fnmatch_lines([
        "*get step at 4 clients broke its thresholds*",
        "*rate_hz >= 0.5 [*] baseline*VIOLATED*",
        "op*vs base*verdict",
        "get*4*-*%*fail",
    ])
    normal = json.loads((pytester.path / "normal.json").read_text())["steps"][0]
    slow = json.loads((pytester.path / "throttled.json").read_text())["steps"][0]
    assert slow["baseline"]["matched"] and slow["baseline"]["rate_change"] < -0.5
    assert slow["rate_hz"] < 0.5 * normal["rate_hz"]


def _file_suite(pytester, tmp_path):
    area = tmp_path / "area"
    area.mkdir(exist_ok=True)
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "thr" / "xrootd").mkdir(parents=True, exist_ok=True)
    (pytester.path / "thr" / "xrootd" / "any.toml").write_text(PLAN)
    return [f"--storage-endpoint=file://{area}", "--storage-version=2.0",
            "--storage-thresholds=thr", "-p", "no:cacheprovider"]


def test_a_baseline_of_the_wrong_shape_stops_the_run_before_any_load(pytester, tmp_path):
    args = _file_suite(pytester, tmp_path)
    (pytester.path / "ints.json").write_text('{"steps": [1, 2]}')
    result = pytester.runpytest_subprocess(*args, "--storage-baseline=ints.json",
                                           "--storage-results=r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --storage-baseline *ints.json: *not a "
                                 "pytest-storagescale results file*"])
    assert "Traceback" not in result.stderr.str()
    assert not (pytester.path / "r.json").exists()  # no step ran


@pytest.mark.parametrize("target", ["/proc/r.json", "a-file/r.json"])
def test_an_unwritable_results_path_stops_the_run_before_any_load(pytester, tmp_path, target):
    args = _file_suite(pytester, tmp_path)
    (pytester.path / "a-file").write_text("not a folder")
    result = pytester.runpytest_subprocess(*args, f"--storage-results={target}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --storage-results *r.json*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert list((tmp_path / "area").iterdir()) == []  # no run directory was even made


def test_a_baseline_of_another_system_is_a_warning(pytester, tmp_path):
    args = _file_suite(pytester, tmp_path)
    document = json.loads(OLD_RESULTS.read_text())  # 0.1.0: system xrootd, 5.x.toml
    document["run"]["system"] = "dcache"
    (pytester.path / "base.json").write_text(json.dumps(document))
    result = pytester.runpytest_subprocess(*args, "--storage-baseline=base.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "storagescale: WARNING: baseline *base.json is from storage system 'dcache', not "
        "'xrootd'; thresholds file 5.x.toml, not any.toml: *",
        "op*vs base*",
    ])
