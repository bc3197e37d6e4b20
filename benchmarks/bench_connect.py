"""Clients connecting at once: two engine steps of C root:// stat clients in a row
against one embedded xrootd (the second right after the first, as a ramp does), for
the engine of a git ref ("before") and of this working tree ("after"), alternated
round by round. Per step: rate, succeeded, failed (by class), hung, and the kernel's
counters over the step (``nstat``: listen-queue overflows and drops, SYN cookies,
SYN retransmissions). As root each variant runs in a network namespace of its own
(``unshare --net``, loopback only), so the counters are its own; else other
programs on the machine add to them. Usage::

    .venv/bin/python benchmarks/bench_connect.py [--before HEAD~1] [--after HEAD]
        [--rounds 2] [--clients 5000] [--duration 5] [--warmup 10] [--timeline]

Measured with it (issue 9): an engine that paced its clients' first requests over the
warm-up and bounded those in flight was worse than the engine that lets them all
connect at once (docs/benchmarks.md, "The engine beside the physical limit").

The engines run from temporary git worktrees of the refs (PYTHONPATH; "after"
defaults to this working tree, whose edits during the run would reach it);
each variant and round runs in its own Python process with its own server.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COUNTERS = ("TcpExtListenOverflows", "TcpExtListenDrops", "TcpExtSyncookiesSent",
            "TcpExtTCPSynRetrans")
#: deadline of one variant's run (two steps, a server start, the spawns)
RUN_TIMEOUT = 900


def kernel_counters() -> dict[str, int]:
    """The kernel's TCP counters of :data:`COUNTERS` (absolute values)."""
    out = subprocess.run(["nstat", "-az", *COUNTERS], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    values = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] in COUNTERS:
            values[fields[0]] = int(fields[1])
    return values


def child(clients: int, duration: float, warmup: float, steps: int) -> None:
    """Run the steps with whatever engine is importable; one JSON line per step."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_engine  # noqa: PLC0415 - the server preparation of the engine benchmark

    from pytest_storagescale.drivers.registry import driver_spec  # noqa: PLC0415
    from pytest_storagescale.load.engine import run_step  # noqa: PLC0415
    from pytest_storagescale.load.operations import get_operation  # noqa: PLC0415
    from pytest_storagescale.load.plan import StepPlan  # noqa: PLC0415
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD  # noqa: PLC0415

    with EmbeddedXRootD(https=False) as server:
        bench_engine.prepare(server)
        url = f"root://127.0.0.1:{server.port}/{bench_engine.ROOT}"
        for step in range(steps):
            before = kernel_counters()
            plan = StepPlan(operation=get_operation("stat"), clients=clients,
                            duration=duration, warmup=warmup, hang_timeout=60,
                            driver=driver_spec(url, writable_root=bench_engine.ROOT),
                            workdir=f"{bench_engine.ROOT}/c{step}", params={})
            total = run_step(plan, executor="auto").total
            after = kernel_counters()
            warmup_seconds = math.ceil(warmup)
            print(json.dumps({
                "step": step, "rate_hz": round(total.rate_hz), "succeeded": total.succeeded,
                "failed": total.failed, "hung": total.hung, "errors": dict(total.errors),
                # the warm-up's failures are not counted: shown here, per second
                "warmup_failures": total.timeline["failures"][:warmup_seconds],
                "warmup_completions": total.timeline["completions"][:warmup_seconds],
                "kernel": {name.removeprefix("TcpExt"): after.get(name, 0) - before.get(name, 0)
                           for name in COUNTERS},
            }), flush=True)


def run_variant(name: str, pythonpath: str | None, args: argparse.Namespace) -> None:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    command = [sys.executable, __file__, "--child", "--clients", str(args.clients),
               "--duration", str(args.duration), "--warmup", str(args.warmup),
               "--steps", str(args.steps)]
    if args.netns:  # a network namespace of its own: the kernel's counters are its alone
        command = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"',
                   "sh", *command]
    result = subprocess.run(command, env=env, cwd=pythonpath or REPO, capture_output=True,
                            text=True, timeout=RUN_TIMEOUT)
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            step = json.loads(line)
            print(f"{name:6} step {step['step']}: {step['rate_hz']:6d}/s ok {step['succeeded']:6d} "
                  f"failed {step['failed']:6d} hung {step['hung']} {step['errors']} "
                  f"kernel {step['kernel']}", flush=True)
            if args.timeline:
                print(f"       warm-up completions/s {step['warmup_completions']}\n"
                      f"       warm-up failures/s    {step['warmup_failures']}", flush=True)
    if result.returncode:
        print(f"{name}: exit {result.returncode}\n{result.stderr[-2000:]}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="HEAD~1", help="git ref of the 'before' engine")
    parser.add_argument("--after", default=None,
                        help="git ref of the 'after' engine (default: this working tree)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeline", action="store_true",
                        help="also print the warm-up's completions and failures per second")
    parser.add_argument("--no-netns", dest="netns", action="store_false",
                        help="run in this network namespace (the default, as root, is a "
                             "new one per variant and round, so that the counters are ours)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.netns = args.netns and os.geteuid() == 0
    if args.child:
        child(args.clients, args.duration, args.warmup, args.steps)
        return
    with contextlib.ExitStack() as trees:
        before = trees.enter_context(worktree(args.before))
        after = trees.enter_context(worktree(args.after)) if args.after else None
        for round_number in range(args.rounds):
            order = [("before", before), ("after", after)]
            for name, path in order if round_number % 2 == 0 else order[::-1]:
                print(f"round {round_number} {name} (load {os.getloadavg()[0]:.1f})",
                      flush=True)
                run_variant(name, path, args)
                time.sleep(5)  # the previous variant's connections leave TIME_WAIT


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[str]:
    """A temporary git worktree of ``ref`` (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="storagescale-engine-") as tree:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", tree, ref],
                       check=True, capture_output=True, timeout=60)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", tree],
                           capture_output=True, timeout=60)


if __name__ == "__main__":
    main()
