"""Issue 32's "done when", run as a site runs it: the plugin itself (``pytest
suites/xrootd -k stat_scan``, the shipped ``thresholds/xrootd/5.x.toml``: stat at 5,
50 and 200 clients, 5 s steps) against real embedded xrootd 5.5.3 servers, with no
option beyond the baseline or the second side, beside ``stress-ng --cpu N``.

Per round, in the **stored-baseline** mode (one server throughout, in a cgroup v1
``cpu`` group of its own):

- ``before``: the server as it is, ``--storage-results before.json``;
- ``same``: the same server again, ``--storage-baseline before.json`` (must pass);
- ``capped``: its group's quota at ``--cap`` cores (0.2, the issue's), judged against
  ``before.json`` (must fail, naming every step more than 25 % slower).

And in the **paired** mode (a second server, side B, in a group of its own):

- ``paired A/A``: ``--storage-compare-with`` side B's URL, uncapped (must pass);
- ``paired capped``: side B capped at ``--cap`` cores (must fail).

Each run's pytest exit status, and per step the gate's verdict and ratio with its
interval (from the results file), go to stdout as one table and, with ``--json``, one
line a run. Each run says the cores its server got (its CPU seconds over the run's wall time).
Usage::

    .venv/bin/python benchmarks/bench_gate_suite.py [--rounds 3] [--cap 0.2] [--stress 4]
        [--modes stored,paired] [--json runs.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gate import CpuGroup, Stress, _cpu_seconds  # noqa: E402  (the calibration's own tools)
from suite_runs import run_pytest  # noqa: E402  (the pytest run with its deadline and log)

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
#: each pytest run's deadline (s): a run that does not end is killed and counted
RUN_TIMEOUT_S = 900


def scan(workdir: Path, endpoint: str, name: str, *extra: str) -> dict:
    """One ``pytest suites/xrootd -k stat_scan`` run (``suite_runs.run_pytest``: its
    deadline, its output in ``<name>.log``, its results kept as ``<name>.json`` for the
    runs judged against them): its exit status, wall time and per step (clients) the
    verdict, rate and the gate's verdict/ratio/interval."""
    (workdir / "out.json").unlink(missing_ok=True)
    results, run, output = run_pytest(
        [str(PYTHON), "-m", "pytest", str(REPO / "suites" / "xrootd"), "-k", "stat_scan",
         f"--storage-endpoint={endpoint}", f"--storage-thresholds={REPO / 'thresholds'}",
         "-p", "no:cacheprovider", "-q", "--storage-results=out.json", *extra],
        workdir, timeout=RUN_TIMEOUT_S, log=str(workdir / f"{name}.log"))
    if (workdir / "out.json").exists():
        shutil.copyfile(workdir / "out.json", workdir / f"{name}.json")
    steps = []
    for step in results:
        gate = step.get("gate") or {}
        steps.append({"clients": step.get("clients"), "verdict": step.get("verdict"),
                      "rate_hz": step.get("rate_hz"), "gate": gate.get("verdict"),
                      "retest": gate.get("retest"), "metric": gate.get("metric"),
                      "ratio": gate.get("ratio"), "low": gate.get("low"),
                      "high": gate.get("high"),
                      "rate_ratio": ((gate.get("effects") or {}).get("rate_hz") or {}
                                     ).get("ratio")})
    return {"name": name, "status": run["code"], "seconds": round(run["took"], 1),
            "load": round(os.getloadavg()[0], 1), "steps": steps, "tail": output[-3000:]}


def timed(pid: int, action):
    """``action()`` with the cores server ``pid`` got over it (its CPU seconds, all
    threads, from /proc: ``bench_gate._cpu_seconds``, over the wall time)."""
    cpu0, wall0 = _cpu_seconds(pid), time.monotonic()
    outcome = action()
    cpu1, wall1 = _cpu_seconds(pid), time.monotonic()
    outcome["server_cores"] = (round((cpu1 - cpu0) / (wall1 - wall0), 3)
                               if cpu0 is not None and cpu1 is not None else None)
    return outcome


def step_text(step: dict) -> str:
    if not step.get("gate"):
        return f"{step['clients']}: {step['verdict']} (no gate)"
    retest = f" ({step['retest']})" if step.get("retest") else ""
    ratio = (f"{step['metric']} {step['ratio']:.2f} [{step['low']:.2f}-{step['high']:.2f}] "
             if step.get("ratio") is not None else "")
    rate = (f" (rate {step['rate_ratio']:.2f})" if step.get("rate_ratio") is not None
            and step.get("metric") != "rate_hz" else "")
    return f"{step['clients']}: {ratio}{step['gate']}{retest}{rate} -> {step['verdict']}"


def problems(args: argparse.Namespace) -> list[str]:
    """Each bad option, named with its fix."""
    modes = set(args.modes.split(","))
    found = []
    if not modes or not modes <= {"stored", "paired"}:
        found.append(f"--modes {args.modes}: give stored, paired or stored,paired")
    if args.rounds < 1:
        found.append(f"--rounds {args.rounds}: must be 1 or more")
    if not 0 < args.cap < 2:
        found.append(f"--cap {args.cap}: a share of cores above 0 and below 2 (the "
                     f"issue's cap is 0.2)")
    if args.stress < 0:
        found.append(f"--stress {args.stress}: 0 (none) or more stress-ng workers")
    return found


def run_rounds(args: argparse.Namespace, keep) -> None:
    """The rounds of each mode, against embedded xrootd 5.5.3 servers started here."""
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    modes = set(args.modes.split(","))
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-gate-suite-") as tmp:
        workdir = Path(tmp)
        stack.enter_context(Stress(args.stress, 4 * 3600))
        server_a = stack.enter_context(EmbeddedXRootD(https=False))
        group_a = stack.enter_context(CpuGroup(server_a.pid, "A"))
        server_b = group_b = None
        if "paired" in modes:
            server_b = stack.enter_context(EmbeddedXRootD(https=False))
            group_b = stack.enter_context(CpuGroup(server_b.pid, "B"))
        for round_ in range(1, args.rounds + 1):
            if "stored" in modes:
                keep("stored", "before", round_,
                     timed(server_a.pid, lambda: scan(workdir, server_a.url, "before")))
                keep("stored", "same", round_, timed(server_a.pid, lambda: scan(
                    workdir, server_a.url, "same", "--storage-baseline=before.json")))
                group_a.cap(args.cap)
                try:
                    keep("stored", "capped", round_, timed(server_a.pid, lambda: scan(
                        workdir, server_a.url, "capped", "--storage-baseline=before.json")))
                finally:
                    group_a.cap(None)
            if server_b is not None and group_b is not None:
                side_b = f"--storage-compare-with={server_b.url}"
                keep("paired", "A/A", round_, timed(server_b.pid, partial(
                    scan, workdir, server_a.url, "paired-aa", side_b)))
                group_b.cap(args.cap)
                try:
                    keep("paired", "capped", round_, timed(server_b.pid, partial(
                        scan, workdir, server_a.url, "paired-capped", side_b)))
                finally:
                    group_b.cap(None)


def table(outcomes: list[dict]) -> list[str]:
    """The markdown table of the runs, by mode and kind."""
    lines = ["| mode | run | rounds | exit 0 (passed) | exit 1 (failed) | steps regressed "
             "(confirmed) | steps inconclusive | other steps | server cores (median) | "
             "wall time (mean) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, kind in [("stored", "before"), ("stored", "same"), ("stored", "capped"),
                       ("paired", "A/A"), ("paired", "capped")]:
        runs = [o for o in outcomes if o["mode"] == mode and o["kind"] == kind]
        if not runs:
            continue
        steps = [s for o in runs for s in o["steps"]]
        confirmed = sum(s.get("gate") == "regressed" for s in steps)
        inconclusive = sum(s.get("gate") == "inconclusive" for s in steps)
        cores = sorted(o["server_cores"] for o in runs if o["server_cores"] is not None)
        lines.append(
            f"| {mode} | {kind} | {len(runs)} | {sum(o['status'] == 0 for o in runs)} | "
            f"{sum(o['status'] == 1 for o in runs)} | {confirmed} of {len(steps)} | "
            f"{inconclusive} | {len(steps) - confirmed - inconclusive} | "
            f"{cores[len(cores) // 2] if cores else '-'} | "
            f"{sum(o['seconds'] for o in runs) / len(runs):.0f} s |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cap", type=float, default=0.2, help="cores of the capped runs")
    parser.add_argument("--stress", type=int, default=4, help="stress-ng --cpu N (0: none)")
    parser.add_argument("--modes", default="stored,paired")
    parser.add_argument("--json", type=Path, help="one line a run, appended")
    args = parser.parse_args()
    if found := problems(args):
        print("bench_gate_suite: " + "; ".join(found) + ". Nothing was started.",
              file=sys.stderr)
        return 4
    outcomes: list[dict] = []

    def keep(mode: str, kind: str, round_: int, outcome: dict) -> None:
        outcome.update(mode=mode, kind=kind, round=round_)
        outcomes.append(outcome)
        print(f"{mode:6} {kind:13} round {round_}: exit {outcome['status']}, "
              f"{outcome['seconds']} s, load {outcome['load']}, server "
              f"{outcome['server_cores']} core; "
              + "; ".join(step_text(step) for step in outcome["steps"]), flush=True)
        if outcome["status"] not in (0, 1):
            print(outcome["tail"], flush=True)
        if args.json:
            with args.json.open("a") as out:
                out.write(json.dumps({k: v for k, v in outcome.items() if k != "tail"}) + "\n")

    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    run_rounds(args, keep)
    print(f"\nbench_gate_suite: {began}, {args.rounds} rounds, cap {args.cap} core, "
          f"stress-ng --cpu {args.stress}")
    print("\n".join(table(outcomes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
