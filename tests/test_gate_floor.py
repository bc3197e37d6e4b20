"""The gate's latency floor (pytest_storagescale/gate.py, ``latency_floor``): a p50 or
p99 below it on both sides is not judged. Seen in a fresh-clone make test: a file
driver's p99 of 7 us read 105 us on a busy machine, and the gate called the step
``regressed (confirmed)``. Synthetic window samples with effects large enough to be
certain; no assertion on this machine's speed."""

from __future__ import annotations

import random
import re

import pytest

from pytest_storagescale.errors import ThresholdsError
from pytest_storagescale.gate import (
    DEFAULT_LATENCY_FLOOR_S,
    GateSettings,
    GateVerdict,
    StepGate,
    WindowSample,
    judge_pairs,
    judge_samples,
)
from pytest_storagescale.thresholds import load_thresholds


def windows(rate: float, p99: float, *, seed: int, count: int = 10,
            noise: float = 0.05) -> list[WindowSample]:
    draw = random.Random(seed)
    return [WindowSample(i * 0.5, 0.5, round(rate * 0.5 * (1 + draw.gauss(0, noise))),
                         p99 / 3, p99 * (1 + draw.gauss(0, noise)))
            for i in range(count)]


def pairs(p99_a: float, p99_b: float, *, seed: int, count: int = 6):
    draw = random.Random(seed)
    found = []
    for _ in range(count):
        a, b = (WindowSample(0, 1.0, round(10_000 * draw.lognormvariate(0, 0.05)),
                             p99 / 3, p99 * draw.lognormvariate(0, 0.05))
                for p99 in (p99_a, p99_b))
        found.append((a, b))
    return found


def test_microseconds_fifteen_times_longer_are_below_the_floor():
    """7 us -> 105 us: the rate unchanged, the p99 15x, both below 1 ms: not judged."""
    gate = judge_samples(windows(1000, 105e-6, seed=1), [windows(1000, 7e-6, seed=2)])
    assert gate.verdict is GateVerdict.UNCHANGED, gate.reason
    p99 = gate.effects["p99_s"]
    assert p99.ratio is not None and p99.ratio > 10  # measured, shown, not judged
    assert p99.below_floor == DEFAULT_LATENCY_FLOOR_S == 0.001
    assert p99.verdict is GateVerdict.UNCHANGED
    assert gate.effects["p50_s"].below_floor == 0.001
    assert re.search(r"p99 \(mean 7 us -> 1\d\d us\) below the latency floor \(1 ms\) on both "
                     r"sides: not judged", gate.reason), gate.reason
    # without the floor, today's gate: the same samples regressed by their p99
    bare = judge_samples(windows(1000, 105e-6, seed=1), [windows(1000, 7e-6, seed=2)],
                         settings=GateSettings(latency_floor_s=0))
    assert bare.verdict is GateVerdict.REGRESSED and bare.metric == "p99_s", bare.reason


def test_milliseconds_fifteen_times_longer_still_regressed():
    gate = judge_samples(windows(1000, 0.300, seed=1), [windows(1000, 0.020, seed=2)])
    assert gate.verdict is GateVerdict.REGRESSED and gate.metric == "p99_s", gate.reason
    assert gate.effects["p99_s"].below_floor is None
    assert "floor" not in gate.reason


def test_one_side_above_the_floor_is_judged():
    """0.4 ms -> 6 ms: the slower side is above the floor, so the change is judged."""
    gate = judge_samples(windows(1000, 0.006, seed=3), [windows(1000, 0.0004, seed=4)])
    assert gate.verdict is GateVerdict.REGRESSED and gate.metric == "p99_s", gate.reason


def test_the_floor_is_the_sections():
    now, base = windows(1000, 0.030, seed=5), [windows(1000, 0.003, seed=6)]
    assert judge_samples(now, base).verdict is GateVerdict.REGRESSED
    high = judge_samples(now, base, settings=GateSettings(latency_floor_s=0.05))
    assert high.verdict is GateVerdict.UNCHANGED, high.reason
    assert "below the latency floor (50 ms)" in high.reason


def test_a_rate_regression_is_judged_whatever_the_latency():
    gate = judge_samples(windows(400, 105e-6, seed=7), [windows(1000, 7e-6, seed=8)])
    assert gate.verdict is GateVerdict.REGRESSED and gate.metric == "rate_hz", gate.reason
    assert re.search(r"p99 \(mean 7 us -> 1\d\d us\) below the latency floor", gate.reason)


def test_paired_microseconds_are_below_the_floor_milliseconds_are_not():
    small = judge_pairs(pairs(7e-6, 105e-6, seed=1))
    assert small.verdict is GateVerdict.UNCHANGED, small.reason
    assert small.effects["p99_s"].below_floor == 0.001
    assert "below the latency floor (1 ms) on both sides: not judged" in small.reason
    bare = judge_pairs(pairs(7e-6, 105e-6, seed=1), settings=GateSettings(latency_floor_s=0))
    assert bare.verdict is GateVerdict.REGRESSED, bare.reason
    large = judge_pairs(pairs(0.020, 0.300, seed=1))
    assert large.verdict is GateVerdict.REGRESSED and large.metric == "p99_s", large.reason


def test_below_the_floor_round_trips_through_json():
    gate = judge_samples(windows(1000, 105e-6, seed=1), [windows(1000, 7e-6, seed=2)])
    again = StepGate.from_json(gate.to_json())
    assert again.effects["p99_s"].below_floor == 0.001
    assert gate.to_json()["effects"]["p99_s"]["below_floor"] == 0.001
    assert "below_floor" not in gate.to_json()["effects"]["rate_hz"]


SECTION = """
[storage]
system = "xrootd"
versions = ["*"]

[ops.stat]
clients = [1]
EXTRA
"""


@pytest.mark.parametrize(("line", "seconds"), [("", 0.001), ('latency_floor = "5ms"', 0.005),
                                               ("latency_floor = 0.02", 0.02),
                                               ("latency_floor = 0", 0.0),
                                               ('latency_floor = "0s"', 0.0)])
def test_latency_floor_key_of_a_section(tmp_path, line, seconds):
    from pytest_storagescale.steps import _gate_settings

    path = tmp_path / "t.toml"
    path.write_text(SECTION.replace("EXTRA", line))
    section = load_thresholds(path).sections["stat"]
    assert section.latency_floor == seconds
    assert _gate_settings(section).latency_floor_s == seconds


@pytest.mark.parametrize(("line", "says"), [('latency_floor = "fast"', "is not a duration"),
                                            ('latency_floor = "2m"', "longer than 60 s"),
                                            ("latency_floor = -1", "longer than zero"),
                                            ("latency_floor = true", "is not a duration")])
def test_bad_latency_floors(tmp_path, line, says):
    path = tmp_path / "t.toml"
    path.write_text(SECTION.replace("EXTRA", line))
    with pytest.raises(ThresholdsError, match=rf"\[ops\.stat\]\.latency_floor: .*{says}"):
        load_thresholds(path)
