"""The gate (pytest_storagescale/gate.py, issue 32): per-window samples, a ratio with a
bootstrap interval against one or several baseline runs, a four-valued verdict, the
client host's probe, a regressed step measured again. The statistics on synthetic
samples with effects large enough to be certain; the mechanism end to end on the
memory driver, slowed by its ``latency`` option (sleeps: the rate follows the latency
whatever this machine's load). No assertion on this machine's speed."""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
from pathlib import Path

import pytest
from plans import op_section, plan

from pytest_storagescale import gate as gate_module
from pytest_storagescale.config import parse_baselines
from pytest_storagescale.errors import ThresholdsError
from pytest_storagescale.gate import (
    GateSettings,
    GateVerdict,
    HostProbe,
    StepGate,
    WindowSample,
    combine,
    effect,
    host_slowdown,
    judge_samples,
    probe_client_host,
)
from pytest_storagescale.load.stats import WINDOWS
from pytest_storagescale.thresholds import load_thresholds


def windows(rate: float, p99: float, *, seed: int, count: int = 10, noise: float = 0.1,
            width: float = 0.5) -> list[WindowSample]:
    """``count`` windows around ``rate`` and ``p99``, each off by a normal ``noise``."""
    draw = random.Random(seed)
    return [WindowSample(i * width, width,
                         max(0, round(rate * width * (1 + draw.gauss(0, noise)))),
                         p99 / 3, p99 * (1 + draw.gauss(0, noise)))
            for i in range(count)]


def baselines(seed: int, runs: int = 3) -> list[list[WindowSample]]:
    return [windows(1000, 0.05, seed=seed * 100 + run) for run in range(runs)]


# -- the statistics ------------------------------------------------------------------

def test_a_and_a_are_never_regressed():
    """40 A/A pairs, 10 % noise per window: never regressed (unchanged or
    inconclusive), most of them unchanged."""
    verdicts = [judge_samples(windows(1000, 0.05, seed=seed), baselines(seed)).verdict
                for seed in range(40)]
    assert GateVerdict.REGRESSED not in verdicts
    assert verdicts.count(GateVerdict.UNCHANGED) >= 30, verdicts


def test_half_the_rate_regressed_with_its_ratio_and_interval():
    gate = judge_samples(windows(500, 0.05, seed=7), baselines(7))
    assert gate.verdict is GateVerdict.REGRESSED and gate.metric == "rate_hz"
    assert gate.low is not None and gate.high is not None and gate.ratio is not None
    assert gate.low < gate.ratio < gate.high < 0.85
    assert 0.4 < gate.ratio < 0.6
    assert gate.reason.startswith(f"rate ratio {gate.ratio:.2f}, 95 % interval")
    assert "wholly beyond the minimum effect (15% lower)" in gate.reason
    assert (gate.samples, gate.baseline_samples, gate.baseline_runs) == (10, 30, 3)


def test_twice_the_p99_regressed():
    gate = judge_samples(windows(1000, 0.10, seed=3), baselines(3))
    assert gate.verdict is GateVerdict.REGRESSED and gate.metric == "p99_s"
    assert gate.low is not None and gate.low > 1.25
    assert gate.effects["rate_hz"].verdict is GateVerdict.UNCHANGED


def test_twice_the_rate_improved():
    assert judge_samples(windows(2000, 0.05, seed=5), baselines(5)).verdict \
        is GateVerdict.IMPROVED


def test_an_interval_across_the_minimum_effect_is_inconclusive():
    """20 % lower with 60 % noise per window: the interval straddles 0.85."""
    gate = judge_samples(windows(800, 0.05, seed=11, noise=0.6),
                         [windows(1000, 0.05, seed=12, noise=0.6)])
    assert gate.verdict is GateVerdict.INCONCLUSIVE
    assert "straddles the minimum effect" in gate.reason


def test_the_interval_is_reproducible():
    """A fixed seed: the same samples give the same interval."""
    now, base = windows(900, 0.05, seed=1), baselines(1)
    assert judge_samples(now, base) == judge_samples(now, base)


def test_min_effect_is_the_sections():
    """A 30 % lower rate regressed at the default 15 %, not with min_effect_rate 0.5."""
    now, base = windows(700, 0.05, seed=2, noise=0.02), baselines(2)
    assert judge_samples(now, base).verdict is GateVerdict.REGRESSED
    loose = judge_samples(now, base, settings=GateSettings(min_effect_rate=0.5))
    assert loose.verdict is not GateVerdict.REGRESSED


def test_a_busier_client_host_makes_a_regression_inconclusive():
    gate = judge_samples(windows(500, 0.05, seed=4), baselines(4), host_slowdown=0.4,
                         host_p=0.01)
    assert gate.verdict is GateVerdict.INCONCLUSIVE
    assert gate.reason.startswith("client host 40% slower than the baseline's")
    # the same host as in the baseline: the regression stands
    assert judge_samples(windows(500, 0.05, seed=4), baselines(4),
                         host_slowdown=0.05, host_p=0.01).verdict is GateVerdict.REGRESSED


def test_a_host_probed_slower_but_not_shown_slower_is_not_blamed():
    """Beside stress-ng the probe moved 2.3x faster to 79 % slower with the server
    alike or capped: a slowdown the probes do not show (Mann-Whitney p at or above
    0.05; with one baseline run it cannot be below 1/6) keeps the regression, saying
    why the host was not blamed."""
    for p in (None, 0.17, 0.05):
        gate = judge_samples(windows(500, 0.05, seed=4), baselines(4), host_slowdown=0.4,
                             host_p=p)
        assert gate.verdict is GateVerdict.REGRESSED, (p, gate.reason)
        assert "the client host probed 40% slower than the baseline's, not shown slower" \
            in gate.reason


def test_the_host_is_credited_with_the_slowdown_every_probe_shows():
    """Seen beside stress-ng with three baseline runs: a server capped to a tenth of its
    rate (0.10 [0.05-0.39]) on a host whose probes were all below the baseline runs'
    (median 60 % slower) was excused. The credit is what every probe shows (here 37 %:
    its fastest probe against their slowest), not the median's 60 %: a rate of 0.40 is
    still a regression.
    A host every probe shows 60 % slower can explain it."""
    three = [HostProbe(400.0, 700.0), HostProbe(500.0, 650.0), HostProbe(600.0, 550.0)]
    now = HostProbe(200.0, 250.0)
    shown = gate_module.host_shown_slowdown(now, three)
    assert shown == pytest.approx(1 - 250 / 400)
    assert gate_module.host_shown_slowdown(HostProbe(500.0, 900.0), three) == 0.0
    assert gate_module.host_shown_slowdown(None, three) is None
    slow, base = windows(400, 0.05, seed=4, noise=0.02), baselines(4)
    kept = judge_samples(slow, base, host_slowdown=0.6, host_p=1 / 28, host_shown=shown)
    assert kept.verdict is GateVerdict.REGRESSED, kept.reason
    assert "which cannot explain it" in kept.reason
    excused = judge_samples(slow, base, host_slowdown=0.6, host_p=1 / 28, host_shown=0.6)
    assert excused.verdict is GateVerdict.INCONCLUSIVE, excused.reason
    assert "every probe at least 60%, Mann-Whitney p=0.036" in excused.reason


def test_host_pvalue_is_a_one_sided_rank_test_of_the_probes():
    """Two probes against one baseline run's two: at best 1/6; against three runs'
    six, 1/28 when both are below all six; a faster host: near 1; not probed: None."""
    slow = HostProbe(100.0, 110.0)
    assert gate_module.host_pvalue(slow, [HostProbe(500.0, 520.0)]) == pytest.approx(1 / 6)
    three = [HostProbe(500.0, 520.0), HostProbe(480.0, 530.0), HostProbe(490.0, 510.0)]
    assert gate_module.host_pvalue(slow, three) == pytest.approx(1 / 28)
    assert gate_module.host_pvalue(slow, three) < gate_module.HOST_ALPHA
    mixed = HostProbe(100.0, 600.0)  # slow before, fast after: not shown
    assert gate_module.host_pvalue(mixed, three) > gate_module.HOST_ALPHA
    assert gate_module.host_pvalue(HostProbe(900.0, 950.0), three) > 0.9
    assert gate_module.host_pvalue(None, three) is None
    assert gate_module.host_pvalue(slow, [None]) is None


def test_a_regression_beyond_what_the_busier_host_explains_stands():
    """Seen beside stress-ng: a server capped to a fifth of its rate on a host probed 26 %
    slower was `inconclusive`, so a -78 % step passed. The host's slowdown is credited
    to the step (its rate ratio divided by the host's speed); what is still beyond the
    minimum effect is a regression, naming the host."""
    now, base = windows(200, 0.05, seed=4, noise=0.02), baselines(4)
    gate = judge_samples(now, base, host_slowdown=0.26, host_p=0.01)
    assert gate.verdict is GateVerdict.REGRESSED, gate.reason
    assert "client host was 26% slower than the baseline's, which cannot explain it" in \
        gate.reason
    # a regression the host's slowdown could explain is still not blamed on the storage
    assert judge_samples(windows(700, 0.05, seed=4, noise=0.02), base,
                         host_slowdown=0.26, host_p=0.01).verdict is GateVerdict.INCONCLUSIVE


def test_host_slowdown_against_the_median_of_the_baselines_probes():
    now = HostProbe(before_mb_s=300.0, after_mb_s=200.0)  # its faster one counts
    assert host_slowdown(now, [HostProbe(500.0, 500.0), HostProbe(600.0, 600.0), None]) == \
        pytest.approx(1 - 300 / 550)
    assert host_slowdown(None, [HostProbe(500.0)]) is None
    assert host_slowdown(now, [None]) is None


def test_a_baseline_without_window_samples_is_inconclusive_saying_so():
    gate = judge_samples(windows(500, 0.05, seed=1), [[]])
    assert gate.verdict is GateVerdict.INCONCLUSIVE
    assert "baseline has no per-window samples" in gate.reason


def test_too_few_samples_are_inconclusive():
    gate = judge_samples(windows(500, 0.05, seed=1, count=3), baselines(1))
    assert gate.verdict is GateVerdict.INCONCLUSIVE and "too few window samples" in gate.reason
    assert effect("rate_hz", [1.0, 2.0], [1.0, 2.0], min_effect=0.15,
                  higher_is_better=True).verdict is GateVerdict.INCONCLUSIVE


def test_a_step_that_cannot_be_compared_is_inconclusive_with_its_reason():
    gate = judge_samples(windows(500, 0.05, seed=1), baselines(1),
                         not_comparable="schedule not kept: 59 of the requests were late")
    assert gate.verdict is GateVerdict.INCONCLUSIVE
    assert gate.reason == "schedule not kept: 59 of the requests were late"


def test_stalls_and_a_different_latency_distribution_are_noted():
    stalled = windows(1000, 0.05, seed=9)
    stalled[3] = WindowSample(1.5, 0.5, 0)
    slow = [WindowSample(w.start_s, w.width_s, w.operations, 1.0, 2.0) for w in stalled]
    gate = judge_samples(slow, baselines(9))
    assert gate.stall is not None
    assert "1 of 10 windows completed nothing (stalls)" in gate.stall
    assert "Kolmogorov-Smirnov" in gate.stall


def test_the_gate_round_trips_through_json():
    gate = judge_samples(windows(500, 0.05, seed=8), baselines(8))
    data = json.loads(json.dumps(gate.to_json()))
    assert data["verdict"] == "regressed" and data["metric"] == "rate_hz"
    assert data["low"] < data["ratio"] < data["high"]
    assert set(data["effects"]) == {"rate_hz", "p50_s", "p99_s"}
    again = StepGate.from_json(data)
    assert (again.verdict, again.ratio, again.low, again.high) == \
        (gate.verdict, gate.ratio, gate.low, gate.high)
    assert again.short() == gate.short() and "regressed" in gate.short()


def test_a_mixed_steps_windows_add_their_sides_operations():
    readers, writers = windows(100, 0.05, seed=1), windows(50, 0.05, seed=2)
    both = combine([readers, writers])
    assert [w.operations for w in both] == [r.operations + w.operations
                                           for r, w in zip(readers, writers, strict=True)]
    assert all(w.p99_s is None for w in both)
    assert combine([readers, []]) == readers


def test_the_probe_needs_no_storage_and_is_bounded():
    speed = probe_client_host(0.02)
    assert speed > 0
    # long enough to see a busier host, not the swings of the moment; bounded: a step
    # pays it twice
    assert 0.3 <= gate_module.PROBE_S <= 0.5


# -- the thresholds' keys and the option ------------------------------------------------

SECTION = """
[storage]
system = "xrootd"
versions = ["*"]

[ops.stat]
clients = [1]
EXTRA
"""


def test_min_effect_keys_of_a_section(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(SECTION.replace("EXTRA", "min_effect_rate = 0.3\nmin_effect_p99 = 1.5"))
    section = load_thresholds(path).sections["stat"]
    assert (section.min_effect_rate, section.min_effect_p99) == (0.3, 1.5)
    path.write_text(SECTION.replace("EXTRA", ""))
    section = load_thresholds(path).sections["stat"]
    assert (section.min_effect_rate, section.min_effect_p99) == (0.15, 0.25)


@pytest.mark.parametrize("line", ["min_effect_rate = 1.5", "min_effect_rate = 0",
                                  "min_effect_p99 = -1", 'min_effect_p99 = "25%"'])
def test_bad_min_effects(tmp_path, line):
    path = tmp_path / "t.toml"
    path.write_text(SECTION.replace("EXTRA", line))
    name = line.split()[0]
    with pytest.raises(ThresholdsError, match=f"ops.stat.*{name}: must be a number above 0"):
        load_thresholds(path)


def test_baselines_from_the_option_or_one_per_line():
    assert parse_baselines(["a.json", "b.json"]) == ("a.json", "b.json")
    assert parse_baselines("a.json\n  b.json c.json\n") == ("a.json", "b.json", "c.json")


# -- the engine's windows ---------------------------------------------------------------

def test_a_step_keeps_its_window_samples(tmp_path):
    from pytest_storagescale.drivers import memory
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.load.engine import run_step
    from pytest_storagescale.load.operations import get_operation
    from pytest_storagescale.load.plan import StepPlan
    from pytest_storagescale.load.stats import SideResult

    spec = driver_spec("memory://gate-windows/area", writable_root="/area",
                       options={"latency": "0.002"})
    try:
        result = run_step(StepPlan(operation=get_operation("stat"), clients=2, duration=1.0,
                                   warmup=0.2, hang_timeout=5.0, driver=spec,
                                   workdir="/area/step"))
    finally:
        memory.clear_stores()
    total = result.total
    assert len(total.windows) == WINDOWS
    assert sum(w.operations for w in total.windows) == total.succeeded > 0
    assert all(w.width_s == pytest.approx(0.1) for w in total.windows)
    assert all(w.p99_s is not None and w.p99_s >= 0.002 for w in total.windows
               if w.operations)
    again = SideResult.from_json(json.loads(json.dumps(total.to_json())))
    assert again.windows == total.windows


# -- end to end on the memory driver ---------------------------------------------------

#: a stat step at 4 clients for 1 s, judged by ``failed == 0`` (tests/plans.py)
PLAN = plan(op_section("stat", 4, ("failed == 0",)))

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()
"""


@pytest.fixture
def gate_run(pytester):
    folder = pytester.path / "thr" / "xrootd"
    folder.mkdir(parents=True)
    (folder / "t.toml").write_text(PLAN)
    pytester.makepyfile(test_suite=SUITE)

    def run(name: str, latency: str, *baselines: str, **inline):
        args = ["--storage-endpoint=memory://gate/area", "--storage-version=1.0",
                "--storage-thresholds=thr", f"--storage-results={name}.json",
                "-p", "no:cacheprovider", f"--storage-driver-option=latency={latency}",
                f"--junitxml={name}.xml",
                *(f"--storage-baseline={base}" for base in baselines)]
        result = pytester.runpytest(*args, **inline)
        [step] = json.loads((pytester.path / f"{name}.json").read_text())["steps"]
        return result, step
    run.path = pytester.path  # type: ignore[attr-defined]
    return run


@pytest.fixture
def steady_host(monkeypatch):
    """The client host's probe made constant (this machine's load varies between the
    runs of a test; the probe's own effect is tested with a probe made slower)."""
    import pytest_storagescale.steps as steps

    monkeypatch.setattr(steps, "probe_client_host", lambda: 500.0)
    return steps


def test_a_slower_storage_fails_the_gate_and_the_same_one_does_not(gate_run, steady_host):
    """Two baseline runs at 20 ms a request; a run at 80 ms (a quarter of the rate, four
    times the latency: an effect this machine's load cannot hide, nor make) fails naming
    the ratio and its interval, measured again and confirmed; a run at 20 ms again is
    not regressed."""
    for name in ("a", "b"):
        gate_run(name, "0.02")[0].assert_outcomes(passed=1)
    slow, step = gate_run("slow", "0.08", "a.json", "b.json")
    assert step["gate"]["verdict"] == "regressed", step["gate"]
    slow.assert_outcomes(failed=1)
    slow.stdout.fnmatch_lines(["*stat step at 4 clients broke its thresholds*",
                               "*gate: *vs baseline * (95 % interval) wholly*VIOLATED*"])
    gate = step["gate"]
    assert gate["verdict"] == "regressed" and gate["retest"] == "confirmed"
    assert gate["baseline_runs"] == 2 and gate["baseline_samples"] == 2 * WINDOWS
    assert gate["high"] < 0.85 or gate["effects"]["p99_s"]["low"] > 1.25
    assert step["verdict"] == "fail" and len(step["windows"]) == WINDOWS
    assert step["client_probe"] == {"before_mb_s": 500.0, "after_mb_s": 500.0}
    junit = (gate_run.path / "slow.xml").read_text()  # JUnit: a property per step
    assert '<property name="storagescale_gate" value="stat at 4 clients: rate ' in junit
    assert "regressed (confirmed)" in junit
    same, step = gate_run("same", "0.02", "a.json", "b.json")
    same.assert_outcomes(passed=1)
    assert step["gate"]["verdict"] in ("unchanged", "inconclusive", "improved")


def test_a_busier_client_host_is_not_blamed_on_the_storage(gate_run, steady_host,
                                                           monkeypatch):
    """The slower run (a quarter of the rate) on a client host whose probes hash
    100 MB/s against the three baseline runs' 500, a fifth of their speed and below all
    six of theirs (Mann-Whitney p = 1/28), which could explain it: inconclusive, saying
    so, and the test passes its rules."""
    for name in ("a", "b", "c"):
        gate_run(name, "0.02")[0].assert_outcomes(passed=1)
    monkeypatch.setattr(steady_host, "probe_client_host", lambda: 100.0)
    busy, step = gate_run("busy", "0.08", "a.json", "b.json", "c.json")
    busy.assert_outcomes(passed=1)
    assert step["gate"]["verdict"] == "inconclusive"
    assert step["gate"]["reason"].startswith("client host 80% slower than the baseline's")
    assert step["gate"]["host_slowdown"] == pytest.approx(0.8)


def test_a_baseline_of_an_earlier_release_is_inconclusive(gate_run, pytester):
    gate_run("a", "0.02")[0].assert_outcomes(passed=1)
    document = json.loads((pytester.path / "a.json").read_text())
    for step in document["steps"]:
        step.pop("windows")
    (pytester.path / "old.json").write_text(json.dumps(document))
    result, step = gate_run("b", "0.08", "old.json")
    result.assert_outcomes(passed=1)
    assert step["gate"]["verdict"] == "inconclusive"
    assert "no per-window samples" in step["gate"]["reason"]


# -- where people look: the table, and the open loop's own trouble ------------------------

def _step(rate_change: float | None = None, gate: StepGate | None = None, *, server=None,
          succeeded: int = 100, arrival_rate: float = 0.0, failed: int = 0,
          dropped: int = 0):
    from pytest_storagescale.load.stats import LATENCIES, OpenLoopResult, SideResult, StepResult
    from pytest_storagescale.records import BaselineComparison, StepRecord, Verdict

    side = SideResult(clients=2, duration_s=10.0, succeeded=succeeded, failed=failed, hung=0,
                      bytes=0, latency_s={key: 0.01 for key in LATENCIES}, errors={},
                      error_examples={}, timeline={},
                      open_loop=OpenLoopResult(offered_hz=arrival_rate, scheduled=200,
                                               dropped=dropped)
                      if arrival_rate else None)
    result = StepResult(operation="stat", clients=2, started=0.0, ended=10.0, duration_s=10.0,
                        warmup_s=0.0, sides={"stat": side})
    baseline = None if rate_change is None else BaselineComparison(
        file="a.json", version="1", matched=True, rate_hz=20.0, rate_change=rate_change)
    return StepRecord(step_id="1", test="t", section="stat", operation="stat", clients=2,
                      result=result, verdict=Verdict.FAIL, baseline=baseline, gate=gate,
                      server=server, arrival_rate=arrival_rate)


def test_the_table_shows_the_ratio_its_interval_and_the_verdict():
    from pytest_storagescale.reporting.table import format_table

    gate = judge_samples(windows(500, 0.05, seed=8), baselines(8))
    lines = format_table([_step(-0.5, gate)])
    assert lines[0].split()[-3:] == ["vs", "base", "verdict"]
    assert f"-50% rate {gate.effects['rate_hz'].interval_text()} regressed" in lines[1]
    assert lines[-1] == f"gate: stat at 2 clients: regressed: {gate.reason}"
    # unchanged: in the column, no note
    same = judge_samples(windows(1000, 0.05, seed=8), baselines(8))
    assert same.verdict is GateVerdict.UNCHANGED
    lines = format_table([_step(0.01, same)])
    assert "unchanged" in lines[1] and not lines[-1].startswith("gate:")


def test_the_server_column_counts_the_steps_operations_beside_its_requests():
    """Issue 31 item 16: XRootD 5 counts a stat twice; the server column says so."""
    from pytest_storagescale.load.server_usage import ServerUsage
    from pytest_storagescale.reporting.table import server_cell

    usage = ServerUsage(ops={"misc": 254236, "open": 10}, counted="misc", per_operation=2.0)
    assert server_cell(_step(server=usage)) == "127118 stat (254246 req, 2/stat)"
    assert server_cell(_step(server=ServerUsage(ops={"misc": 7}))) == "7 req"


def test_an_open_loop_step_that_achieved_far_less_than_offered_is_not_comparable():
    """Issue 32 part 5: SRM at 20/s offered, 2/s achieved, nothing failed nor hung."""
    from pytest_storagescale.steps import not_comparable

    why = not_comparable(_step(succeeded=20, arrival_rate=20.0))
    assert why is not None and why.startswith(
        "the door achieved 2/s of the 20/s offered: 180 of the 200 requests scheduled in "
        "the window neither completed, failed, hung nor were dropped in it")
    assert not_comparable(_step(succeeded=190, arrival_rate=20.0)) is None  # kept up
    # dropped at the cap: the door did not keep up, a measurement the rules judge
    assert not_comparable(_step(succeeded=20, arrival_rate=20.0, dropped=175)) is None
    # failures say why: the rules judge the step
    assert not_comparable(_step(succeeded=20, arrival_rate=20.0, failed=5)) is None
    assert not_comparable(_step(succeeded=20)) is None  # a closed loop


def test_the_baseline_runs_own_spread_widens_the_interval():
    """Two baseline runs at 1000/s and 600/s: a run at 700/s is within their own
    spread, not a regression; against the first alone it is one."""
    fast, slow = windows(1000, 0.05, seed=21), windows(600, 0.05, seed=22)
    now = windows(700, 0.05, seed=23)
    assert judge_samples(now, [fast]).verdict is GateVerdict.REGRESSED
    both = judge_samples(now, [fast, slow])
    assert both.verdict is not GateVerdict.REGRESSED
    assert both.low is not None and both.low < 0.85 < both.high
    assert gate_module.run_spread([[1.0, 1.0], [3.0, 3.0]]) == (0.5, 1.5)
    assert gate_module.run_spread([[1.0, 2.0]]) == (1.0, 1.0)


def test_an_inconclusive_reason_names_the_bound_it_crosses():
    """An interval above the regression bound that crosses the improvement's: no
    regression, said so, not 'straddles the minimum effect'."""
    now = [0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.0, 1.1, 1.2]
    up = effect("rate_hz", now, [1.0] * 10, min_effect=0.15, higher_is_better=True)
    assert up.verdict is GateVerdict.INCONCLUSIVE
    assert up.low is not None and up.high is not None and 0.85 < up.low < 1 / 0.85 < up.high
    assert gate_module._reason(up).endswith(
        "not 15% lower (no regression), but not shown within the minimum effect either "
        "(the interval crosses 1.18 on the other side)")
    down = effect("rate_hz", [x * 0.8 for x in now], [1.0] * 10, min_effect=0.15,
                  higher_is_better=True)
    assert "straddles the minimum effect (15% lower)" in gate_module._reason(down)


def test_the_csv_holds_the_gate():
    from pytest_storagescale.reporting.table import GATE_CSV, csv_rows

    gate = judge_samples(windows(500, 0.05, seed=8), baselines(8))
    header, row = csv_rows([_step(-0.5, gate)])
    cells = dict(zip(header, row, strict=True))
    assert tuple(header[header.index("rate_change") + 1:][:5]) == GATE_CSV
    assert cells["gate_verdict"] == "regressed" and cells["gate_metric"] == "rate_hz"
    assert float(cells["gate_low"]) < float(cells["gate_ratio"]) < float(cells["gate_high"])


def test_ctrl_c_while_a_regressed_step_is_measured_again_ends_the_session(gate_run,
                                                                           steady_host,
                                                                           monkeypatch):
    """The second measurement interrupted (as Ctrl-C leaves it): the session stops, the
    step is 'interrupted', its gate says so (a retest is never a place Ctrl-C is lost)."""
    from pytest_storagescale.records import Verdict

    gate_run("a", "0.02")[0].assert_outcomes(passed=1)
    real, calls = steady_host.measure, []

    def measure(run, record, *args, **kwargs):
        real(run, record, *args, **kwargs)
        calls.append(record.step_id)
        if len(calls) == 2:
            record.verdict = Verdict.INTERRUPTED
    monkeypatch.setattr(steady_host, "measure", measure)
    result, step = gate_run("slow", "0.08", "a.json", no_reraise_ctrlc=True)
    assert len(calls) == 2
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert step["verdict"] == "interrupted" and step["gate"]["retest"] == "interrupted"
    assert step["error"].startswith("interrupted (Ctrl-C) while measuring the regressed step")


# -- paired runs (--storage-compare-with): the load of a pair's moment cancels ----------

def loaded_pairs(factor: float, *, seed: int, count: int = 6,
                 load: float = 1.0, noise: float = 0.15) -> list[tuple[WindowSample, WindowSample]]:
    """``count`` pairs of runs (A, B), B at ``factor`` times A's rate; the machine's load
    moves each pair's rate by a log-normal ``load`` (both runs of a pair alike: they
    are made one right after the other) and each run by its own ``noise``."""
    draw = random.Random(seed)
    pairs = []
    for _ in range(count):
        moment = draw.lognormvariate(0, load)
        speeds = [moment * f * draw.lognormvariate(0, noise) for f in (1.0, factor)]
        # a closed loop: the latency is the rate's inverse
        a, b = (WindowSample(0, 1.0, round(10_000 * speed), 0.001 / speed, 0.005 / speed)
                for speed in speeds)
        pairs.append((a, b))
    return pairs


def test_pairs_cancel_a_load_that_moves_from_pair_to_pair():
    """The same runs seen as pooled windows (the gate's stored-baseline statistics) and
    as pairs: a load that moves each pair's rate (log-normal, sigma 1) hides a halved rate from the
    pooled windows (their interval straddles the minimum effect) and not from the
    pairs' ratios; the same server on both sides is never regressed."""
    halved = [gate_module.judge_pairs(loaded_pairs(0.5, seed=seed)) for seed in range(20)]
    assert all(g.verdict is GateVerdict.REGRESSED for g in halved), [g.short() for g in halved]
    assert all(g.high is not None and g.high < 0.85 for g in halved)
    pooled = [judge_samples([b for _, b in loaded_pairs(0.5, seed=seed)],
                            [[a for a, _ in loaded_pairs(0.5, seed=seed)]]).verdict
              for seed in range(20)]
    assert pooled.count(GateVerdict.REGRESSED) <= 10, pooled  # what the pairs fixed
    same = [gate_module.judge_pairs(loaded_pairs(1.0, seed=seed)).verdict for seed in range(40)]
    assert GateVerdict.REGRESSED not in same and GateVerdict.IMPROVED not in same


def test_paired_ratio_is_the_geometric_mean_of_the_pairs_with_its_interval():
    pairs = [(WindowSample(0, 1, 1000), WindowSample(0, 1, 500)),
             (WindowSample(0, 1, 4000), WindowSample(0, 1, 2000)),
             (WindowSample(0, 1, 100), WindowSample(0, 1, 50)),
             (WindowSample(0, 1, 2000), WindowSample(0, 1, 1000))]
    gate = gate_module.judge_pairs(pairs)
    assert gate.effects["rate_hz"].interval_text() == "0.50 [0.50-0.50]"
    assert gate.verdict is GateVerdict.REGRESSED and gate.samples == 4
    assert "p99_s" not in gate.effects  # no latency measured: rate only


def test_too_few_pairs_and_a_stalled_side():
    few = gate_module.judge_pairs(loaded_pairs(0.5, seed=1, count=3))
    assert few.verdict is GateVerdict.INCONCLUSIVE and "too few pairs of runs (3" in few.reason
    pairs = loaded_pairs(1.0, seed=2)
    pairs[1] = (pairs[1][0], WindowSample(0, 1.0, 0))  # B completed nothing in one run
    gate = gate_module.judge_pairs(pairs)
    assert gate.stall == "1 of 6 runs of side B completed nothing (stalls)"
    assert gate.ratio is not None and math.isfinite(gate.ratio) and gate.ratio < 1


# -- a real server capped by a cgroup (issue 32's "done when", its cheap part) ------------

class CpuCap:
    """The threads of process ``pid`` in a cgroup v1 ``cpu`` group of their own with a
    CFS quota of ``cores`` (new threads inherit it), until the block ends (then moved
    back to the root group and the group removed, whatever happened)."""

    ROOT = Path("/sys/fs/cgroup/cpu")

    def __init__(self, pid: int, cores: float = 0.2) -> None:
        self.pid, self.cores = pid, cores
        self.group = self.ROOT / f"storagescale-gate-test-{os.getpid()}"

    def __enter__(self) -> CpuCap:
        self.group.mkdir()
        (self.group / "cpu.cfs_period_us").write_text("100000")
        (self.group / "cpu.cfs_quota_us").write_text(str(int(100000 * self.cores)))
        for thread in os.listdir(f"/proc/{self.pid}/task"):
            with contextlib.suppress(ProcessLookupError, OSError):
                (self.group / "tasks").write_text(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        for thread in (self.group / "tasks").read_text().split():
            with contextlib.suppress(ProcessLookupError, OSError):
                (self.ROOT / "tasks").write_text(thread)
        self.group.rmdir()


def _cgroup_cpu() -> bool:
    return os.geteuid() == 0 and (CpuCap.ROOT / "cpu.cfs_quota_us").exists()


@pytest.mark.integration
@pytest.mark.skipif(not _cgroup_cpu(), reason="needs root and the cgroup v1 cpu controller")
def test_a_real_xrootd_capped_by_a_cgroup_fails_the_gate(pytester):
    """The shipped 5.x.toml's stat scan at 5 clients against the embedded xrootd: run,
    then with the server's threads capped at 0.03
    core by a cgroup (regressed, measured again and confirmed: fails, naming the ratio
    and its interval). 0.03, not the issue's 0.2: on this loaded machine the clients,
    not the server, set the rate (6,200/s measured with and without a 0.2 core cap); a
    cap far below what the server uses is an effect no load can hide."""
    import shutil

    if shutil.which("xrootd") is None:
        pytest.skip("needs the xrootd server (scripts/bootstrap.sh)")
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    repo = Path(__file__).resolve().parent.parent

    def scan(server, name: str, *extra: str):
        result = pytester.runpytest_subprocess(
            str(repo / "suites" / "xrootd"), f"--storage-endpoint={server.url}",
            f"--storage-thresholds={repo / 'thresholds'}", "--storage-clients=5",
            "-p", "no:cacheprovider", "-k", "stat_scan", f"--storage-results={name}.json",
            *extra)
        step = json.loads((pytester.path / f"{name}.json").read_text())["steps"][0]
        return result, step

    with EmbeddedXRootD(https=False) as server:
        scan(server, "before")[0].assert_outcomes(passed=1)
        # The same server again is not asserted here: one baseline run on a busy machine
        # is not certain to call it unchanged (that is the calibration's question,
        # benchmarks/bench_gate.py and docs/benchmarks.md). The capped server is an
        # effect no load can hide, except the host probe's own judgement: a client host
        # much slower than at the baseline makes the verdict inconclusive (that is the
        # mechanism working), so the capped scan is tried up to three times.
        for _ in range(3):
            with CpuCap(server.pid, cores=0.03):
                capped, step = scan(server, "capped", "--storage-baseline=before.json")
            if step["gate"]["verdict"] != "inconclusive":
                break
    print(step["gate"])  # the measured ratios, in the test's report
    capped.assert_outcomes(failed=1)
    capped.stdout.fnmatch_lines(["*gate: * vs baseline * (95 % interval) wholly *VIOLATED*"])
    assert step["gate"]["verdict"] == "regressed" and step["gate"]["retest"] == "confirmed"


def test_a_regression_against_one_baseline_run_says_what_one_run_cannot_know():
    """Beside stress-ng (load 20-40) the same xrootd came out regressed (confirmed)
    against one earlier run: a regressed verdict against one run says so, against
    three it does not."""
    slow = windows(400, 0.05, seed=9, noise=0.02)
    one = judge_samples(slow, baselines(9, runs=1))
    assert one.verdict is GateVerdict.REGRESSED and one.reason.endswith(gate_module.ONE_RUN)
    three = judge_samples(slow, baselines(9, runs=3))
    assert three.verdict is GateVerdict.REGRESSED and "one baseline run" not in three.reason


# -- the paired gate's statistics, its note on noise, its budget (issue 32, 2026-11-29) ---

def heavy_tailed_pairs(factor: float, *, seed: int, count: int = 16,
                       outliers: int = 2) -> list[tuple[WindowSample, WindowSample]]:
    """``count`` pairs, B at ``factor`` times A's rate, a small noise per pair; in
    ``outliers`` of them side A starved (a twentieth of its rate: the runs' scheduler
    on a loaded host), as the calibration's streams showed (log ratios up to +-2.5)."""
    draw = random.Random(seed)
    pairs = []
    for index in range(count):
        a = 10_000 * draw.lognormvariate(0, 0.05)
        b = 10_000 * factor * draw.lognormvariate(0, 0.05)
        if index < outliers:
            a /= 20
        pairs.append((WindowSample(0, 1.0, round(a)), WindowSample(0, 1.0, round(b))))
    return pairs


def test_the_trimmed_statistic_is_not_carried_by_a_starved_run():
    """One of 16 pairs whose side A was starved pulls the geometric mean of a 0.6 rate
    over the bound (inconclusive); the trimmed mean of the log ratios (the middle 60 %)
    stays at 0.6 and decides; the same server (no outlier) is unchanged by all three."""
    pairs = heavy_tailed_pairs(0.6, seed=3, outliers=1)
    mean = gate_module.judge_pairs(pairs)
    trimmed = gate_module.judge_pairs(pairs, settings=GateSettings(paired_statistic="trimmed"))
    assert mean.verdict is GateVerdict.INCONCLUSIVE, mean.short()
    assert trimmed.verdict is GateVerdict.REGRESSED, trimmed.short()
    assert trimmed.ratio is not None and 0.55 < trimmed.ratio < 0.65
    for name in ("mean", "trimmed", "t"):
        same = gate_module.judge_pairs(heavy_tailed_pairs(1.0, seed=4, outliers=0),
                                       settings=GateSettings(paired_statistic=name))
        assert same.verdict is GateVerdict.UNCHANGED, (name, same.short())


def test_the_t_interval_is_students_on_the_log_ratios():
    from scipy.stats import ttest_1samp

    pairs = loaded_pairs(0.7, seed=5, count=8)
    gate = gate_module.judge_pairs(pairs, settings=GateSettings(paired_statistic="t"))
    logs = [math.log(b.rate_hz / a.rate_hz) for a, b in pairs]
    ci = ttest_1samp(logs, 0.0).confidence_interval(0.95)
    rate = gate.effects["rate_hz"]
    assert rate.low == pytest.approx(math.exp(ci.low))
    assert rate.high == pytest.approx(math.exp(ci.high))
    with pytest.raises(ValueError, match="paired_statistic 'median'"):
        gate_module.judge_pairs(pairs, settings=GateSettings(paired_statistic="median"))


def test_pairs_needed_from_the_spread():
    # (1.96 * 1.0 / ln(0.85 / 0.75)) ** 2 = 245.2
    assert gate_module.pairs_needed(1.0, 0.75, 0.85) == 246
    assert gate_module.pairs_needed(0.5, 0.75, 0.85) == 62
    assert gate_module.pairs_needed(1.0, 0.85, 0.85) is None


def test_an_inconclusive_paired_step_says_how_many_pairs_its_noise_needs():
    """A wide spread of the pairs' ratios: inconclusive, and the reason names the
    spread and the pairs a 25 % loss would take at it; a decided step says nothing of
    it."""
    noisy = gate_module.judge_pairs(loaded_pairs(0.8, seed=6, count=8, noise=0.8))
    assert noisy.verdict is GateVerdict.INCONCLUSIVE, noisy.short()
    assert "spread by" in noisy.reason and "a rate of 0.78 of A's takes about" in noisy.reason
    decided = gate_module.judge_pairs(loaded_pairs(0.5, seed=6, count=8))
    assert decided.verdict is GateVerdict.REGRESSED and "spread by" not in decided.reason


def test_paired_budget_key_of_a_section(tmp_path):
    from pytest_storagescale.steps import _gate_settings

    path = tmp_path / "t.toml"
    path.write_text(SECTION.replace("EXTRA", "paired_budget = 10"))
    section = load_thresholds(path).sections["stat"]
    assert section.paired_budget == 10.0
    assert _gate_settings(section).paired_budget == 10.0
    path.write_text(SECTION.replace("EXTRA", ""))
    assert load_thresholds(path).sections["stat"].paired_budget == 3.0
    for bad in ("paired_budget = 0.5", "paired_budget = 101", 'paired_budget = "10x"'):
        path.write_text(SECTION.replace("EXTRA", bad))
        with pytest.raises(ThresholdsError, match=r"\[ops.stat\].paired_budget: must be a number "
                                                  "from 1 to 100"):
            load_thresholds(path)


# -- the retest: what reproduces a regression (2026-11-29) ---------------------------------

def _gate(metric: str, ratio: float, low: float, high: float, verdict: GateVerdict,
          min_effect: float) -> StepGate:
    from pytest_storagescale.gate import Effect

    return StepGate(verdict=verdict, reason="measured", metric=metric,
                    effects={metric: Effect(metric, ratio, low, high, verdict, min_effect)})


@pytest.mark.parametrize(("again", "expected"), [
    ((0.72, 0.62, 0.80, GateVerdict.REGRESSED), True),       # regressed again
    ((0.84, 0.77, 0.90, GateVerdict.INCONCLUSIVE), True),    # beyond 0.85, wholly below 1
    ((0.84, 0.74, 1.02, GateVerdict.INCONCLUSIVE), False),   # its interval reaches 1
    ((0.90, 0.84, 0.97, GateVerdict.INCONCLUSIVE), False),   # within the minimum effect
    ((1.05, 0.95, 1.12, GateVerdict.UNCHANGED), False),      # the first was a busy moment
])
def test_a_retest_reproduces_a_rate_regression_beyond_the_minimum_effect(again, expected):
    """Measured beside stress-ng: a side B 22-25 % slower, 0.78 [0.71-0.85] regressed,
    then 0.84 [0.77-0.90]: the same slowdown, shown real: confirmed. A retest near 1 or
    with its interval across 1 is 'not reproduced'."""
    first = _gate("rate_hz", 0.78, 0.71, 0.845, GateVerdict.REGRESSED, 0.15)
    assert gate_module.reproduced(first, _gate("rate_hz", *again, 0.15)) is expected


def test_a_retest_reproduces_a_p99_regression_on_its_own_side_of_one():
    """A p99 regression is reproduced by a p99 beyond 1 + its minimum effect with its
    interval wholly above 1; never by the rate's figures, never below its floor."""
    first = _gate("p99_s", 2.2, 1.4, 3.1, GateVerdict.REGRESSED, 0.25)
    assert gate_module.reproduced(first, _gate("p99_s", 1.4, 1.1, 1.9,
                                                GateVerdict.INCONCLUSIVE, 0.25))
    assert not gate_module.reproduced(first, _gate("p99_s", 1.2, 1.05, 1.4,
                                                    GateVerdict.INCONCLUSIVE, 0.25))
    assert not gate_module.reproduced(first, _gate("rate_hz", 0.5, 0.4, 0.6,
                                                    GateVerdict.INCONCLUSIVE, 0.15))
    from pytest_storagescale.gate import Effect
    floored = StepGate(verdict=GateVerdict.UNCHANGED, reason="floor", metric="p99_s",
                       effects={"p99_s": Effect("p99_s", 1.6, 1.3, 2.0,
                                                GateVerdict.UNCHANGED, 0.25,
                                                below_floor=0.001)})
    assert not gate_module.reproduced(first, floored)


def test_four_pairs_are_not_unchanged_on_the_bootstraps_narrow_interval():
    """Four pairs' log ratios +-0.12, +0.06, -0.09 (a mean of -0.8 %, spread 0.12): the
    bootstrap of 4 knows only them and spans 0.92-1.06 (``unchanged``), where Student's
    t, three degrees of freedom, spans 0.83-1.20: straddling the 15 % bound, so
    ``inconclusive``. Resampled from measured pairs, a 23 % loss came out
    ``unchanged`` at the first look in 5 of 200 trials before the interval was the hull
    of both (benchmarks/gate_power.py)."""
    import math

    from scipy.stats import ttest_1samp

    logs = [0.12, -0.12, 0.06, -0.09]
    pairs = [(WindowSample(0, 1.0, 10_000), WindowSample(0, 1.0, round(10_000 * math.exp(x))))
             for x in logs]
    gate = gate_module.judge_pairs(pairs)
    rate = gate.effects["rate_hz"]
    t = ttest_1samp([math.log(b.operations / a.operations) for a, b in pairs],
                    0.0).confidence_interval(0.95)
    assert rate.low <= math.exp(t.low) + 1e-9 and rate.high >= math.exp(t.high) - 1e-9
    assert rate.verdict is GateVerdict.INCONCLUSIVE, gate.short()
    assert rate.low < 0.85 < rate.ratio
    # the bootstrap alone (the trimmed statistic's interval here: a fifth of 4 trims
    # nothing) is the narrow one the hull widens
    alone = gate_module.judge_pairs(pairs, settings=GateSettings(paired_statistic="trimmed"))
    assert alone.effects["rate_hz"].verdict is GateVerdict.UNCHANGED, alone.short()
