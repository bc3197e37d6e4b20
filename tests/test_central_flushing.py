"""The central-flushing comparison (seed 004, ``suites/dcache/test_tape.py``'s
``test_central_flushing``): its windows' order and pairing, and its verdict by the
paired gate's statistics, on samples built here (no server)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_storagescale.gate import GateSettings, GateVerdict, WindowSample, judge_samples
from suites.dcache import tape

REPO = Path(__file__).resolve().parents[1]
WIDTH_S = 20.0


def _sample(mb_s: float, p99: float = 1.0) -> WindowSample:
    """A 20 s window that wrote ``mb_s`` MB/s (its count: bytes)."""
    return WindowSample(0.0, WIDTH_S, int(mb_s * 1e6 * WIDTH_S), p50_s=p99 / 2, p99_s=p99)


def _windows(disk: list[float], tape_mb_s: list[float]) -> list[tuple[str, WindowSample]]:
    """Windows in the measured order (disk tape tape disk ...), the n-th of each label
    from the lists."""
    rates = {"disk": iter(disk), "tape": iter(tape_mb_s)}
    return [(label, _sample(next(rates[label]))) for label in tape.window_order(len(disk))]


def test_windows_alternate_as_the_paired_gate_alternates_two_servers() -> None:
    from pytest_storagescale.paired import pairs_order

    assert tape.window_order(4) == ["disk", "tape", "tape", "disk",
                                    "disk", "tape", "tape", "disk"]
    for pairs in (1, 2, 4, 7):  # the paired mode's A B B A ..., A the disk windows
        assert tape.window_order(pairs) == [{"A": "disk", "B": "tape"}[side]
                                            for side in pairs_order(pairs)]
    assert tape.window_order(1) == ["disk", "tape"]
    assert len(tape.window_order()) == 2 * tape.FLUSHING_PAIRS
    assert tape.FLUSHING_PAIRS >= GateSettings().min_samples  # the gate's fewest
    with pytest.raises(ValueError, match="0 pairs"):
        tape.window_order(0)


def test_the_nth_disk_window_is_paired_with_the_nth_tape_window() -> None:
    """D1 T1 T2 D2 D3 T3 T4 D4: each pair made one right after the other."""
    windows = _windows([10, 20, 30, 40], [11, 21, 31, 41])
    pairs = tape.flushing_pairs(windows)
    assert [(round(a.rate_hz / 1e6), round(b.rate_hz / 1e6)) for a, b in pairs] == [
        (10, 11), (20, 21), (30, 31), (40, 41)]
    # a window without its partner (the step stopped after a disk window) is left out
    assert len(tape.flushing_pairs(windows[:5])) == 2
    with pytest.raises(ValueError, match="disk or tape only"):
        tape.flushing_pairs([("disk", _sample(1)), ("flush", _sample(1))])


def test_flushing_that_halves_the_writers_is_regressed() -> None:
    """tape at half the disk windows' MB/s, the machine's load swinging both windows of
    a pair alike: ratio 0.5, its interval wholly below 1 - 0.3."""
    disk = [40.0, 12.0, 30.0, 8.0]
    noise = [1.02, 0.97, 1.01, 0.99]
    flushing = tape.judge_flushing(_windows(disk, [d * 0.5 * n for d, n in zip(disk, noise, strict=True)]),
                                   GateSettings(min_effect_rate=0.3))
    assert flushing.verdict is GateVerdict.REGRESSED
    metrics = flushing.metrics()
    assert metrics["flush_regressed"] == 1.0
    assert metrics["flush_ratio"] == pytest.approx(0.5, abs=0.02)
    assert metrics["flush_ratio_low"] <= metrics["flush_ratio"] <= metrics["flush_ratio_high"]
    assert metrics["flush_ratio_high"] < 0.7
    assert "over 4 pairs: regressed" in flushing.text()
    # a site that lets flushing cost 60 % of the writers: not beyond it
    lenient = tape.judge_flushing(_windows(disk, [d * 0.5 * n for d, n in zip(disk, noise, strict=True)]),
                                  GateSettings(min_effect_rate=0.6))
    assert lenient.verdict is not GateVerdict.REGRESSED
    assert lenient.metrics()["flush_regressed"] == 0.0


def test_flushing_that_costs_nothing_is_unchanged_through_a_load_swing() -> None:
    """The machine's load moves both windows of a pair (10 to 80 MB/s), tape within 3 %
    of disk: the paired ratio is ~1 with a narrow interval, ``unchanged`` at the
    shipped share (0.5); the same windows pooled (the gate against a baseline's) give
    an interval too wide to say so."""
    disk = [10.0, 80.0, 25.0, 60.0]
    tape_mb_s = [10.2, 78.0, 25.5, 59.0]
    flushing = tape.judge_flushing(_windows(disk, tape_mb_s), GateSettings(min_effect_rate=0.5))
    assert flushing.verdict is GateVerdict.UNCHANGED
    metrics = flushing.metrics()
    assert metrics["flush_regressed"] == 0.0
    assert 0.9 < metrics["flush_ratio_low"] <= 1.0 <= metrics["flush_ratio_high"] < 1.1
    pooled = judge_samples([_sample(v) for v in tape_mb_s], [[_sample(v) for v in disk]],
                           settings=GateSettings(min_effect_rate=0.5))
    effect = pooled.effects["rate_hz"]
    assert effect.high - effect.low > 5 * (metrics["flush_ratio_high"]
                                           - metrics["flush_ratio_low"])


def test_faster_tape_windows_are_improved() -> None:
    flushing = tape.judge_flushing(_windows([10, 20, 15, 12], [30, 61, 44, 37]),
                                   GateSettings(min_effect_rate=0.5))
    assert flushing.verdict is GateVerdict.IMPROVED
    assert flushing.metrics()["flush_regressed"] == 0.0


def test_noisy_pairs_are_inconclusive_not_a_verdict() -> None:
    """Pairs that disagree (tape 0.3 to 1.5 of disk): the interval straddles the
    bound, ``inconclusive``; the rule's flush_regressed stays 0, the numbers are shown."""
    flushing = tape.judge_flushing(_windows([10, 10, 10, 10], [3, 15, 5, 12]),
                                   GateSettings(min_effect_rate=0.15))
    assert flushing.verdict is GateVerdict.INCONCLUSIVE
    metrics = flushing.metrics()
    assert metrics["flush_regressed"] == 0.0
    assert metrics["flush_ratio_low"] < 0.85 < metrics["flush_ratio_high"]
    assert "inconclusive" in flushing.text()


def test_too_few_pairs_give_no_ratio_so_the_step_has_no_verdict() -> None:
    """3 pairs (fewer than the gate's 4): the ratio and its interval are NaN, which
    the suite's step reports as undefined derived metrics (an error, never a pass)."""
    windows = _windows([10, 10, 10, 10], [5, 5, 5, 5])[:6]
    flushing = tape.judge_flushing(windows)
    assert flushing.pairs == 3
    assert flushing.verdict is GateVerdict.INCONCLUSIVE
    metrics = flushing.metrics()
    assert all(math.isnan(metrics[name])
               for name in ("flush_ratio", "flush_ratio_low", "flush_ratio_high"))
    assert metrics["flush_regressed"] == 0.0


def test_a_window_is_sampled_as_its_bytes_per_second() -> None:
    """A step's result as the gate's sample: bytes (not writes) over the measured
    window, so the ratio is of MB/s; no latency without a succeeded write."""
    total = SimpleNamespace(bytes=200_000_000, succeeded=20,
                            latency_s={"p50": 0.8, "p99": 2.5})
    sample = tape.window_sample(SimpleNamespace(total=total, duration_s=20.0))
    assert sample.rate_hz == pytest.approx(10e6)
    assert (sample.p50_s, sample.p99_s) == (0.8, 2.5)
    empty = SimpleNamespace(bytes=0, succeeded=0, latency_s={"p50": float("nan")})
    sample = tape.window_sample(SimpleNamespace(total=empty, duration_s=20.0))
    assert (sample.operations, sample.p50_s, sample.p99_s) == (0, None, None)


class _Library:
    """A tape library's log that gains one flush per read (``control.records()``)."""

    def __init__(self, since: float, error_every: int = 0) -> None:
        self.since, self.reads, self.error_every = since, 0, error_every

    def records(self) -> list[dict]:
        self.reads += 1
        old = [{"op": "put", "started": self.since - 10}]  # before the windows: not counted
        gets = [{"op": "get", "started": self.since + 1}]
        return old + gets + [{"op": "put", "started": self.since + i,
                              "error": "drive" if self.error_every and i % self.error_every
                              == 0 else None} for i in range(1, self.reads + 1)]


def test_disk_windows_wait_for_the_tape_windows_flushes_bounded(monkeypatch) -> None:
    monkeypatch.setattr(tape.time, "sleep", lambda seconds: None)
    library = _Library(since=1000.0)
    assert tape.wait_flushed(library, 1000.0, 3, timeout=60) == 0
    assert library.reads == 3
    # failed flushes are not flushes; the wait ends at its deadline with the missing count
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(tape.time, "monotonic", lambda: float(next(clock)))
    stuck = _Library(since=1000.0, error_every=1)
    assert tape.wait_flushed(stuck, 1000.0, 5, timeout=30) == 5
    assert stuck.reads <= 5


def test_the_shipped_files_fail_the_step_on_a_regressed_verdict() -> None:
    """Both releases' [ops.tape_write]: the share flushing may cost (min_effect_rate
    0.5) and the rule on the verdict; a last window whose interval lies below it fails
    the step, one across it passes."""
    from pytest_storagescale.load.operations import OPERATIONS, register_operation
    from pytest_storagescale.metrics import DERIVED, register_metric
    from pytest_storagescale.thresholds import evaluate, load_thresholds
    from suites.dcache import streaming

    with OPERATIONS.kept(), DERIVED.kept():
        for operation in (*tape.OPERATIONS, *streaming.OPERATIONS):
            register_operation(operation, replace=True)
        for metric, description in {**streaming.METRICS, **tape.METRICS}.items():
            register_metric(metric, description, replace=True)
        for name in ("10.2.25.toml", "11.2.5.toml"):
            section = load_thresholds(REPO / "thresholds" / "dcache" / name).section(
                "tape_write")
            assert section is not None and section.min_effect_rate == 0.5
            rules = section.rules_for(4)
            assert "flush_regressed == 0" in [rule.text for rule in rules]
            settings = GateSettings(min_effect_rate=section.min_effect_rate)
            for tape_mb_s, passes in (([4.0, 4.1, 3.9, 4.0], False),
                                      ([9.0, 10.5, 8.0, 11.0], True)):
                derived = tape.judge_flushing(_windows([10, 10, 10, 10], tape_mb_s),
                                              settings).metrics()
                # the step's other metrics (failed, hung, lost, ...) at 0: a clean window
                checks = evaluate(rules, lambda metric, values=derived: values.get(
                    metric, 0.0))
                assert all(check.passed is not False for check in checks) is passes, (
                    name, tape_mb_s, checks)
