"""The gate's noise and power, measured as a stream of paired runs (issue 32).

Six embedded xrootd 5.5.3 (root://), each in a cgroup v1 ``cpu`` group of its own
(as ``bench_gate.py --paired``): for each kind a side A and a side B: a second server
as it is (**A/A**), one SIGSTOPped ``--rate-stop-ms`` of every ``--rate-period-ms``
(**rate**) and one SIGSTOPped ``--p99-stop-ms`` of every ``--p99-period-ms``
(**p99**), each duty cycle running for the whole stream in a process of its own
(``bench_gate.DutyCycle``: SIGCONT at its end). Pair after pair, rotating the three
kinds, side A's run and side B's run are made one right after the other exactly as
the plugin's paired mode makes them (:func:`pytest_storagescale.paired.measure_alternating`'s
runs: a closed-loop stat step at ``--clients`` clients, ``--run`` s after ``--warmup``
s, the order mirrored from one pair of a kind to the next: A B, B A, ...), while
``stress-ng --cpu N`` loads the machine. Every pair goes to ``--out`` as one JSON line
(both runs' :func:`~pytest_storagescale.paired.run_sample`, their window samples, the
wall time, the load).

The stream is then cut, by ``benchmarks/gate_replay.py``, into consecutive trials
judged by the shipped gate code (:func:`pytest_storagescale.paired.sequential_verdict`:
the first round of pairs, more pairs while inconclusive up to a budget, a regressed
verdict measured again on the next pairs): the verdicts are those the plugin would
have given on those very runs, for several budgets from one stream. Usage::

    .venv/bin/python benchmarks/bench_gate_stream.py --minutes 40 --out stream.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_gate import ROOT, CpuGroup, DutyCycle, Stress  # noqa: E402

KINDS = ("A/A", "rate", "p99")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=40.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--run", type=float, default=0.75, help="seconds a run")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--stress", type=int, default=4)
    parser.add_argument("--rate-stop-ms", type=float, default=25.0)
    parser.add_argument("--rate-period-ms", type=float, default=100.0)
    parser.add_argument("--p99-stop-ms", type=float, default=15.0)
    parser.add_argument("--p99-period-ms", type=float, default=150.0)
    args = parser.parse_args()
    problems = [f"--{name} {value}: must be above 0" for name, value in
                (("minutes", args.minutes), ("clients", args.clients), ("run", args.run))
                if value <= 0]
    problems += [f"--{kind}-stop-ms must be above 0 and below --{kind}-period-ms"
                 for kind, stop, period in (("rate", args.rate_stop_ms, args.rate_period_ms),
                                            ("p99", args.p99_stop_ms, args.p99_period_ms))
                 if not 0 < stop < period]
    if not (os.geteuid() == 0 and CpuGroup.ROOT.joinpath("cpu.cfs_quota_us").exists()):
        problems.append("needs root and the cgroup v1 cpu controller (/sys/fs/cgroup/cpu)")
    if args.stress and shutil.which("stress-ng") is None:
        problems.append("--stress needs stress-ng: bash scripts/bootstrap.sh all (or --stress 0)")
    if problems:
        print("bench_gate_stream: " + "; ".join(problems), file=sys.stderr)
        return 4
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    return stream(args)


def stream(args) -> int:
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.load.engine import run_step
    from pytest_storagescale.load.operations import get_operation
    from pytest_storagescale.load.plan import StepPlan
    from pytest_storagescale.paired import run_sample
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    limit = args.minutes * 60
    began = time.monotonic()
    count = {kind: 0 for kind in KINDS}
    with ExitStack() as stack, args.out.open("w") as out:
        stack.enter_context(Stress(args.stress, limit + 300))
        # each kind its own side A: a server measured in every pair and one idle two
        # pairs in three are not alike (a first stream with one side A for the three
        # kinds measured its A/A pairs' p99 at 0.53 [0.28-0.88] over 23 pairs)
        servers = {name: stack.enter_context(EmbeddedXRootD(https=False))
                   for name in ("A/A", "rate", "p99", "A-A/A", "A-rate", "A-p99")}
        for name, server in servers.items():
            stack.enter_context(CpuGroup(server.pid, name.replace("/", "")))
        specs = {name: driver_spec(f"root://127.0.0.1:{server.port}/{ROOT}",
                                   writable_root=ROOT) for name, server in servers.items()}
        cycles = {
            "rate": stack.enter_context(DutyCycle(
                servers["rate"].pid, stopped_s=args.rate_stop_ms / 1e3,
                period_s=args.rate_period_ms / 1e3, limit_s=limit + 120)),
            "p99": stack.enter_context(DutyCycle(
                servers["p99"].pid, stopped_s=args.p99_stop_ms / 1e3,
                period_s=args.p99_period_ms / 1e3, limit_s=limit + 120))}
        header = {"header": True, "version": servers["A/A"].version, "clients": args.clients,
                  "run_s": args.run, "warmup_s": args.warmup, "stress": args.stress,
                  "rate_cycle_ms": [args.rate_stop_ms, args.rate_period_ms],
                  "p99_cycle_ms": [args.p99_stop_ms, args.p99_period_ms],
                  "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                   time.gmtime())}
        out.write(json.dumps(header) + "\n")
        index = 0
        try:
            while time.monotonic() - began < limit:
                kind = KINDS[index % len(KINDS)]
                order = "AB" if count[kind] % 2 == 0 else "BA"
                samples, windows, seconds = {}, {}, {}
                for which in order:
                    spec = specs[f"A-{kind}"] if which == "A" else specs[kind]
                    plan = StepPlan(operation=get_operation("stat"), clients=args.clients,
                                    duration=args.run, warmup=args.warmup, hang_timeout=30.0,
                                    driver=spec, workdir=f"{ROOT}/s{index}{which}")
                    t0 = time.monotonic()
                    result = run_step(plan, executor="auto")
                    seconds[which] = time.monotonic() - t0
                    samples[which] = run_sample(result).to_json()
                    samples[which]["failed"] = result.total.failed + result.total.hung
                    windows[which] = [w.to_json() for w in result.total.windows]
                out.write(json.dumps({
                    "index": index, "kind": kind, "order": order, "t": time.monotonic() - began,
                    "a": samples["A"], "b": samples["B"], "a_windows": windows["A"],
                    "b_windows": windows["B"], "seconds": seconds,
                    "load": os.getloadavg()[0]}) + "\n")
                out.flush()
                count[kind] += 1
                index += 1
        except KeyboardInterrupt:
            print("interrupted: the pairs so far are in the file", file=sys.stderr)
    with args.out.open("a") as out:  # the duty cycles ended with the stack: their shares
        out.write(json.dumps({"stopped_share": {name: cycle.stopped_share
                                                for name, cycle in cycles.items()}}) + "\n")
    print(f"{index} pairs in {(time.monotonic() - began) / 60:.1f} min: "
          + ", ".join(f"{k} {v}" for k, v in count.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
