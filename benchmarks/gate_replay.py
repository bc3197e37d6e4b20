"""The gate's verdicts on a measured stream of paired runs (``bench_gate_stream.py``).

The stream's pairs of each kind (A/A, rate, p99), in the order measured, are cut into
consecutive trials judged by the shipped code: the paired gate
(:func:`pytest_storagescale.gate.judge_pairs`, looked at after each of
:func:`pytest_storagescale.paired.look_points`'s counts of pairs, stopping at the first
conclusive verdict; a ``regressed`` one measured again on the next pairs of the stream:
``confirmed`` or ``not reproduced``), and the stored-baseline gate
(:func:`pytest_storagescale.gate.judge_samples`, the statistics alone, no host probe:
the host rule only ever turns ``regressed`` into ``inconclusive``) on side B's runs
joined into a step against three earlier stretches of side A's runs. No number is
made up: each trial's verdict is the one the gate gives on those runs.

Per kind: the injection's effect measured over the whole stream (the geometric mean of
all its pairs' ratios B / A, with its BCa interval), the pairs' log-ratio spread, and
per budget and statistic the verdicts' shares with exact (Clopper-Pearson) intervals,
the pairs and the wall time per verdict. Usage::

    .venv/bin/python benchmarks/gate_replay.py stream.jsonl [--budgets 12,24,48] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_storagescale.gate import (  # noqa: E402
    GateSettings,
    WindowSample,
    judge_pairs,
    judge_samples,
    paired_effect,
    pairs_needed,
    reproduced,
)
from pytest_storagescale.paired import look_points  # noqa: E402

KINDS = ("A/A", "rate", "p99")
NAMES = {"A/A": "A/A (the same server)", "rate": "rate: SIGSTOP duty cycle",
         "p99": "p99: short SIGSTOPs"}


def load(path: Path) -> tuple[dict, dict[str, list[dict]], dict]:
    header: dict = {}
    shares: dict = {}
    pairs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("header"):
            header = record
        elif "stopped_share" in record:
            shares = record["stopped_share"]
        elif record.get("kind") in pairs:
            pairs[record["kind"]].append(record)
    return header, pairs, shares


def sample(data: dict) -> WindowSample:
    return WindowSample.from_json(data)


def paired_trials(records: list[dict], settings: GateSettings, budget: int,
                  first: int) -> list[dict]:
    """Consecutive trials over ``records``: each the paired gate's looks (first
    ``first`` pairs, then more while inconclusive up to ``budget``), a regressed one
    measured again on the next pairs (the same rule)."""
    looks = look_points(first, budget)
    trials: list[dict] = []
    at = 0

    def one(start: int):
        for count in looks:
            if start + count > len(records):
                return None, count
            chunk = records[start:start + count]
            gate = judge_pairs([(sample(r["a"]), sample(r["b"])) for r in chunk],
                               settings=settings)
            if gate.verdict.value != "inconclusive" or count == looks[-1]:
                return gate, count
        return None, 0

    while True:
        gate, used = one(at)
        if gate is None:
            break
        seconds = sum(sum(r["seconds"].values()) for r in records[at:at + used])
        verdict = gate.verdict.value
        end = at + used
        if gate.fails:
            again, used_again = one(end)
            if again is None:
                break
            seconds += sum(sum(r["seconds"].values()) for r in records[end:end + used_again])
            end += used_again
            verdict = ("regressed (confirmed)" if reproduced(gate, again)
                       else "inconclusive (not reproduced)")
        rate = gate.effects.get("rate_hz")
        trials.append({"verdict": verdict, "first": gate.verdict.value, "pairs": end - at,
                       "seconds": seconds, "metric": gate.metric,
                       "rate": rate.ratio if rate else None})
        at = end
    return trials


def stored_trials(kind_records: list[dict], a_records: list[dict], settings: GateSettings,
                  runs_per_step: int, baselines: int) -> list[dict]:
    """The stored-baseline gate on the same stream: side B's ``runs_per_step``
    consecutive runs joined into one step (their windows in order) judged against
    ``baselines`` steps of side A's runs measured before it (each as many runs,
    disjoint, the latest first); a regressed step judged again on side B's next
    runs. The statistics alone (no host probe)."""
    def step(records: list[dict], side: str) -> list[WindowSample]:
        return [WindowSample.from_json(w) for r in records for w in r[f"{side}_windows"]]

    def base_steps(before_t: float) -> list[list[WindowSample]] | None:
        earlier = [r for r in a_records if r["t"] < before_t]
        steps = []
        for k in range(baselines):
            stop = len(earlier) - k * runs_per_step
            chunk = earlier[stop - runs_per_step:stop] if stop - runs_per_step >= 0 else []
            if len(chunk) < runs_per_step:
                return None
            steps.append(step(chunk, "a"))
        return steps

    trials = []
    at = 0
    while at + runs_per_step <= len(kind_records):
        chunk = kind_records[at:at + runs_per_step]
        bases = base_steps(chunk[0]["t"])
        if bases is None:
            at += runs_per_step
            continue
        gate = judge_samples(step(chunk, "b"), bases, settings=settings)
        verdict = gate.verdict.value
        used = runs_per_step
        if gate.fails:
            again = kind_records[at + used:at + 2 * used]
            if len(again) < used:
                break
            second = judge_samples(step(again, "b"), bases, settings=settings)
            verdict = ("regressed (confirmed)" if reproduced(gate, second)
                       else "inconclusive (not reproduced)")
            used *= 2
        b_seconds = sum(r["seconds"]["B"] for r in kind_records[at:at + used])
        trials.append({"verdict": verdict, "first": gate.verdict.value, "pairs": used,
                       "seconds": b_seconds, "rate": gate.effects["rate_hz"].ratio})
        at += used
    return trials


def share(hits: int, count: int, decimals: int = 0) -> str:
    """``hits`` of ``count`` and their share with its exact (Clopper-Pearson) 95 %
    interval, in percent with ``decimals`` (also for ``gate_power.py``)."""
    from scipy.stats import binomtest

    if not count:
        return "-"
    ci = binomtest(hits, count).proportion_ci(confidence_level=0.95, method="exact")
    return (f"{hits}/{count} = {hits / count:.{decimals}%} "
            f"[{ci.low:.{decimals}%}-{ci.high:.{decimals}%}]")


def effect_line(records: list[dict]) -> str:
    pairs = [(sample(r["a"]).rate_hz, sample(r["b"]).rate_hz) for r in records]
    e = paired_effect("rate_hz", pairs, min_effect=0.15, higher_is_better=True)
    logs = [math.log(b / a) for a, b in pairs if a > 0 and b > 0]
    p99 = [(r["a"]["p99_s"], r["b"]["p99_s"]) for r in records
           if r["a"]["p99_s"] and r["b"]["p99_s"]]
    e99 = paired_effect("p99_s", p99, min_effect=0.25, higher_is_better=False)
    sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
    needed = pairs_needed(sd, 0.75, 0.85) if len(logs) > 1 else None
    pair_s = statistics.median(sum(r["seconds"].values()) for r in records)
    return (f"rate {e.interval_text()}, p99 {e99.interval_text()} over {len(records)} "
            f"pairs; sd of a pair's log rate ratio {sd:.2f}: at that spread a rate of 0.75 "
            f"comes out regressed (half the time) after about {needed} pairs, "
            f"{(needed or 0) * pair_s / 60:.0f} min at {pair_s:.1f} s a pair")


def table(pairs: dict[str, list[dict]], budgets: list[int], statistics_: list[str],
          first: int) -> list[str]:
    rows = ["| mode | statistic | budget (pairs a side) | side B | trials | regressed "
            "(confirmed): share [95 % interval] | inconclusive | unchanged | improved | "
            "pairs per verdict (median) | wall time per verdict (mean) |",
            "|---|---|---:|---|---:|---|---:|---:|---:|---:|---:|"]
    for name in statistics_:
        settings = GateSettings(paired_statistic=name)
        for budget in budgets:
            for kind in KINDS:
                trials = paired_trials(pairs[kind], settings, budget, first)
                rows.append(row("paired", name, str(budget), kind, trials))
    every = sorted((r for k in KINDS for r in pairs[k]), key=lambda r: r["t"])
    for baselines in (1, 3):
        for kind in KINDS:
            trials = stored_trials(pairs[kind], every, GateSettings(), runs_per_step=4,
                                   baselines=baselines)
            rows.append(row(f"stored, {baselines} baseline run{'s' * (baselines > 1)}",
                            "mean (windows)", "4 runs (3 s)", kind, trials))
    return rows


def row(mode: str, statistic: str, budget: str, kind: str, trials: list[dict]) -> str:
    count = len(trials)
    if not count:
        return f"| {mode} | {statistic} | {budget} | {NAMES[kind]} | 0 | - | | | | | |"
    hits = sum(t["verdict"].startswith("regressed") for t in trials)
    return (f"| {mode} | {statistic} | {budget} | {NAMES[kind]} | {count} | "
            f"{share(hits, count)} | "
            f"{sum(t['verdict'].startswith('inconclusive') for t in trials)} | "
            f"{sum(t['verdict'] == 'unchanged' for t in trials)} | "
            f"{sum(t['verdict'] == 'improved' for t in trials)} | "
            f"{statistics.median(t['pairs'] for t in trials):g} | "
            f"{statistics.mean(t['seconds'] for t in trials):.0f} s |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stream", type=Path)
    parser.add_argument("--budgets", default="12,24,48",
                        type=lambda text: [int(x) for x in text.split(",")])
    parser.add_argument("--statistics", default="mean,trimmed",
                        type=lambda text: text.split(","))
    parser.add_argument("--first", type=int, default=4)
    args = parser.parse_args()
    if not args.stream.is_file():
        print(f"gate_replay: {args.stream}: no such file (bench_gate_stream.py --out writes "
              f"it)", file=sys.stderr)
        return 4
    header, pairs, shares = load(args.stream)
    seconds = [sum(r["seconds"].values()) for k in KINDS for r in pairs[k]]
    loads = [r["load"] for k in KINDS for r in pairs[k]]
    failed = sum(r["a"].get("failed", 0) + r["b"].get("failed", 0)
                 for k in KINDS for r in pairs[k])
    print(f"Stream of {header.get('started', '?')}: {sum(map(len, pairs.values()))} pairs "
          f"({', '.join(f'{k} {len(v)}' for k, v in pairs.items())}) in "
          f"{sum(seconds) / 60:.1f} min of runs, xrootd {header.get('version')}, stat at "
          f"{header.get('clients')} clients, runs of {header.get('run_s')} s after "
          f"{header.get('warmup_s')} s of warm-up, stress-ng --cpu {header.get('stress')}, "
          f"{header.get('cpus')} cores, 1-minute load average "
          f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f} (median "
          f"{statistics.median(loads) if loads else 0:.1f}); rate cycle "
          f"{header.get('rate_cycle_ms')} ms, p99 cycle {header.get('p99_cycle_ms')} ms, "
          f"stopped {shares}; {failed} requests failed or hung; a pair took "
          f"{statistics.median(seconds) if seconds else 0:.1f} s (median).")
    print()
    for kind in KINDS:
        print(f"- {NAMES[kind]}: {effect_line(pairs[kind])}")
    print()
    print("\n".join(table(pairs, args.budgets, args.statistics, args.first)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
