"""Multi-host steps: the same 1,000-client ``stat`` step on 1, 2 and 4 namespace hosts
(tests/netns.py: network namespaces on a bridge, a real ``dask worker`` in each)
against the bare single-host engine, on one embedded xrootd.

- engine: :func:`run_step` with the threads executor in this process (1 host);
- cluster N: the coordinator (:mod:`pytest_storagescale.cluster`) with 1000/N clients
  on each of N namespace hosts.

Per configuration: the rate (succeeded / duration), the coordinator's overhead (the
clock-offset measurement, the time to send the hosts their shares, the merge of their
reports, and the step's wall time beyond the engine's for the same warm-up and
duration), and each host's peak memory. All on one machine: the hosts share its CPUs,
so the rates say what the coordinator costs, not what more machines would buy.
Every measurement starts from fresh processes (the engine in a child process, the
namespace workers restarted), as bench_engine.py does. Needs root (``ip netns``). Usage::

    .venv/bin/python benchmarks/bench_cluster.py [--clients 1000] [--duration 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from netns import NamespaceCluster, bridge_xrootd  # noqa: E402

from pytest_storagescale.cluster import hosts as cluster_hosts  # noqa: E402
from pytest_storagescale.cluster.coordinator import ClusterExecutor  # noqa: E402
from pytest_storagescale.drivers.registry import driver_spec  # noqa: E402
from pytest_storagescale.load.engine import run_step  # noqa: E402
from pytest_storagescale.load.operations import get_operation  # noqa: E402
from pytest_storagescale.load.plan import StepPlan  # noqa: E402


def raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def plan_for(url: str, root: str, clients: int, args, tag: str) -> StepPlan:
    return StepPlan(operation=get_operation("stat"), clients=clients, duration=args.duration,
                    warmup=args.warmup, hang_timeout=30.0,
                    driver=driver_spec(url, writable_root=root), workdir=f"{root}/{tag}")


def engine(url: str, root: str, args, tag: str) -> dict:
    """The single-host engine, in a fresh process (as bench_engine.py measures it: a
    process holding thousands of idle XRootD connections is slower)."""
    done = subprocess.run(
        [sys.executable, __file__, "--engine-step", url, root, tag, "--clients",
         str(args.clients), "--duration", str(args.duration), "--warmup", str(args.warmup)],
        capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def engine_step(url: str, root: str, args, tag: str) -> dict:
    raise_open_files()
    plan = plan_for(url, root, args.clients, args, tag)
    began = time.monotonic()
    result = run_step(plan)
    wall = time.monotonic() - began
    return {"rate": result.total.rate_hz, "wall": wall, "failed": result.total.failed,
            "hung": result.total.hung}


def cluster(address: str, url: str, root: str, hosts: int, args, tag: str) -> dict:
    plan = plan_for(url, root, args.clients, args, tag)
    began = time.monotonic()
    connection = cluster_hosts.connect(address)
    everyone = connection.hosts()
    offsets_s = time.monotonic() - began
    cluster_hosts.check_offsets(everyone, address)
    executor = ClusterExecutor(connection, everyone[:hosts])
    result = run_step(plan, executor=executor)
    wall = time.monotonic() - began
    return {"rate": result.total.rate_hz, "wall": wall, "failed": result.total.failed,
            "hung": result.total.hung, "lost": executor.lost, "offsets_s": offsets_s,
            "dispatch_s": executor.dispatch_s, "merge_s": executor.merge_s,
            "rss_mb": max(h.peak_rss_mb or 0 for h in executor.hosts),
            "per_host": [round(h.rate_hz) for h in executor.hosts]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine-step", nargs=3, metavar=("URL", "ROOT", "TAG"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_step:
        url, root, tag = args.engine_step
        print(json.dumps(engine_step(url, root, args, tag)))
        return
    raise_open_files()
    configs = ["engine", "cluster 1", "cluster 2", "cluster 4"]
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as scratch, \
            NamespaceCluster(4, Path(scratch), threads=1) as hosts, \
            bridge_xrootd(https=False) as server:
        url = f"root://{hosts.head}:{server.port}//storagescale"
        root = f"/storagescale/bench-{time.time_ns()}"
        driver_spec(url, writable_root=root).connect("bench", timeout=30).mkdir(root)
        try:
            for round_ in range(args.rounds):
                order = configs if round_ % 2 == 0 else configs[::-1]
                for name in order:
                    tag = f"{name.replace(' ', '')}-{round_}"
                    if name == "engine":
                        outcome = engine(url, root, args, tag)
                    else:
                        hosts.restart_workers()  # fresh processes, as the engine's
                        outcome = cluster(hosts.address, url, root, int(name.split()[1]),
                                          args, tag)
                    runs[name].append(outcome)
                    print(f"# round {round_} {name}: {outcome}", flush=True)
        finally:
            cluster_hosts.disconnect()
    report(runs, args)


def report(runs: dict[str, list[dict]], args) -> None:
    base_rate = statistics.median(r["rate"] for r in runs["engine"])
    base_wall = statistics.median(r["wall"] for r in runs["engine"])
    print(f"\n{args.clients} clients of stat, warm-up {args.warmup:g} s, duration "
          f"{args.duration:g} s, median of {args.rounds} rounds\n")
    print("| clients on | rate | vs engine | step wall time | over the engine's | "
          "clock offsets | ready + start | merge | peak memory per host | failed/hung/lost |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, outcomes in runs.items():
        rate = statistics.median(r["rate"] for r in outcomes)
        wall = statistics.median(r["wall"] for r in outcomes)
        bad = "/".join(str(sum(r.get(k, 0) for r in outcomes)) for k in ("failed", "hung",
                                                                           "lost"))
        if name == "engine":
            print(f"| 1 host (engine, in process) | {rate:,.0f} Hz | 1.00 | {wall:.1f} s | - "
                  f"| - | - | - | - | {bad} |")
            continue
        med = {k: statistics.median(r[k] for r in outcomes)
               for k in ("offsets_s", "dispatch_s", "merge_s", "rss_mb")}
        n = name.split()[1]
        print(f"| {n} namespace host{'s' if n != '1' else ''} x {args.clients // int(n)} | "
              f"{rate:,.0f} Hz | {rate / base_rate:.2f} | {wall:.1f} s | "
              f"{wall - base_wall:+.2f} s | {med['offsets_s'] * 1e3:.0f} ms | "
              f"{med['dispatch_s'] * 1e3:.0f} ms | {med['merge_s'] * 1e3:.0f} ms | "
              f"{med['rss_mb']:.0f} MB | {bad} |")


if __name__ == "__main__":
    main()
