"""What the paired gate's budget buys, resampled from measured pairs (``bench_gate.py``).

``bench_gate.py --paired --json trials.jsonl`` keeps each trial's pairs of runs (side
A's and side B's rate of one run each, made one right after the other). This takes the
pairs of each kind (A/A: the same server; rate: side B on a SIGSTOP duty cycle; ...)
from one or more such files as that kind's measured noise, draws trials from them
(pairs drawn with replacement, independently: a bootstrap of the pairs, not new runs)
and judges each with the shipped code exactly as the plugin's paired mode does
(:func:`pytest_storagescale.gate.judge_pairs` at each of
:func:`pytest_storagescale.paired.look_points`' counts, a ``regressed`` trial measured
again on fresh draws and kept when :func:`pytest_storagescale.gate.reproduced`).

What it gives is the share of verdicts a budget would give *at the noise measured*: a
prediction from measured pairs, to choose a ``paired_budget``, not a calibration run
(which measures each trial; ``bench_gate.py``). The rate only (the trial files keep the
pairs' rates, not their latencies): a verdict here is the rate's. Time per verdict is
the pairs it used (retest included) times the files' measured seconds a pair.

Usage::

    .venv/bin/python benchmarks/gate_power.py /tmp/trials.jsonl [more.jsonl] \\
        --budgets 12,32,64 --trials 400
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate_replay import share  # noqa: E402  (benchmarks/, this script's folder)

from pytest_storagescale.gate import GateSettings, WindowSample, judge_pairs, reproduced  # noqa: E402
from pytest_storagescale.paired import PAIRS, look_points  # noqa: E402

NAMES = {"A/A": "A/A (the same server)", "rate": "rate: SIGSTOP duty cycle",
         "p99": "p99: short SIGSTOPs"}


def load(paths: list[Path]) -> tuple[dict[str, list[tuple[float, float]]], float, list[float]]:
    """Per kind its measured pairs (rate A, rate B); the seconds a pair took (the
    median over the trials not measured again: a trial's seconds count its retest,
    its pairs do not); the loads."""
    pairs: dict[str, list[tuple[float, float]]] = {}
    seconds: list[float] = []
    loads: list[float] = []
    for path in paths:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            kind, got = record.get("kind"), record.get("pairs") or []
            if kind is None or not got:
                continue
            pairs.setdefault(kind, []).extend((float(a), float(b)) for a, b in got)
            if record.get("seconds") and not record.get("again"):
                seconds.append(record["seconds"] / len(got))
            if record.get("load") is not None:
                loads.append(float(record["load"]))
    return pairs, statistics.median(seconds), loads


def one_trial(pool: list[tuple[float, float]], budget: int, settings: GateSettings,
              rng) -> tuple[str, int]:
    """One trial drawn from ``pool``: its verdict (retest included) and the pairs used."""
    def judged() -> tuple[object, int]:
        drawn: list[tuple[WindowSample, WindowSample]] = []
        gate = None
        for count in look_points(PAIRS, budget):
            while len(drawn) < count:
                a, b = pool[int(rng.integers(len(pool)))]
                drawn.append((WindowSample(0.0, 1.0, int(round(a))),
                              WindowSample(0.0, 1.0, int(round(b)))))
            gate = judge_pairs(drawn, settings=settings)
            if gate.verdict.value != "inconclusive":
                break
        return gate, len(drawn)

    gate, used = judged()
    if not gate.fails:
        return gate.verdict.value, used
    again, more = judged()
    return ("regressed (confirmed)" if reproduced(gate, again)
            else "inconclusive (not reproduced)"), used + more


def main() -> int:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trials_files", type=Path, nargs="+")
    parser.add_argument("--budgets", default="12,32,64",
                        type=lambda text: [int(x) for x in text.split(",")])
    parser.add_argument("--trials", type=int, default=400)
    parser.add_argument("--kinds", default="A/A,rate")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--shifted", type=float, default=None, metavar="RATIO",
                        help="add a kind: the A/A pairs with side B's rate times RATIO "
                             "(the same-server noise with an exact effect)")
    args = parser.parse_args()
    missing = [str(p) for p in args.trials_files if not p.is_file()]
    if missing or not 1 <= args.trials <= 100_000:
        print(f"gate_power: {', '.join(missing) or args.trials}: give bench_gate.py --json "
              f"files that exist and --trials from 1 to 100000", file=sys.stderr)
        return 4
    pairs, per_pair, loads = load(args.trials_files)
    kinds = [k for k in args.kinds.split(",") if k in pairs]
    if args.shifted is not None and "A/A" in pairs:
        shifted = f"A/A x {args.shifted:g}"
        pairs[shifted] = [(a, b * args.shifted) for a, b in pairs["A/A"]]
        NAMES[shifted] = f"the same server's pairs, B's rate x {args.shifted:g}"
        kinds.append(shifted)
    print(f"{sum(len(pairs[k]) for k in kinds)} measured pairs "
          f"({', '.join(f'{k} {len(pairs[k])}' for k in kinds)}) from "
          f"{', '.join(p.name for p in args.trials_files)}; load average "
          f"{min(loads):.1f}-{max(loads):.1f}; {args.trials} resampled trials per row")
    for kind in kinds:
        logs = [math.log(b / a) for a, b in pairs[kind] if a > 0 and b > 0]
        print(f"- {NAMES.get(kind, kind)}: geometric mean B / A "
              f"{math.exp(statistics.mean(logs)):.3f}, sd of a pair's log ratio "
              f"{statistics.stdev(logs):.3f}")
    print(f"- a pair took {per_pair:.1f} s (median of the trials not measured again)")
    print()
    print("| budget (pairs a side) | paired_budget of a 3 s step | side B | regressed "
          "(confirmed) [95 % interval] | inconclusive | unchanged | improved | pairs per "
          "verdict (median) | time per verdict (mean) |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|")
    settings = GateSettings()
    for budget in args.budgets:
        for kind in kinds:
            rng = np.random.default_rng(args.seed)
            results = [one_trial(pairs[kind], budget, settings, rng)
                       for _ in range(args.trials)]
            verdicts = [v for v, _ in results]
            used = [n for _, n in results]
            hits = sum(v.startswith("regressed") for v in verdicts)
            print(f"| {budget} | {budget / PAIRS:g} | {NAMES.get(kind, kind)} | "
                  f"{share(hits, len(verdicts), decimals=1)} | "
                  f"{sum(v.startswith('inconclusive') for v in verdicts)} | "
                  f"{verdicts.count('unchanged')} | {verdicts.count('improved')} | "
                  f"{statistics.median(used):g} | "
                  f"{statistics.mean(used) * per_pair:.0f} s |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
