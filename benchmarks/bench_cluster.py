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

``--scale 4x5,4x250,4x500,8x250`` measures the seeds' scale instead: H namespace hosts
x C clients each, their Dask workers submitted as SLURM jobs (``--storage-cluster
slurm:N`` against a SLURM cluster of the benchmark's own, :mod:`pytest_storagescale.
cluster.slurm`; ``--launcher dask`` starts the workers directly), a namespace scan
(``stat``, ``ls``) and a copy-out scan (``get``) per configuration. Per step: clients,
rate, failed/hung/lost, and what the client hosts cost: each host's resident memory
(every process in its namespace: slurmd, the job's nanny and worker) idle and at its
peak during the step, so memory per host and per client; the machine's available
memory at its lowest; the xrootd's resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
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
from suite_runs import Periodic, available_mb, process_rss_mb  # noqa: E402

from pytest_storagescale.cluster import hosts as cluster_hosts  # noqa: E402
from pytest_storagescale.cluster.coordinator import ClusterExecutor  # noqa: E402
from pytest_storagescale.drivers.registry import driver_spec  # noqa: E402
from pytest_storagescale.load.engine import run_step  # noqa: E402
from pytest_storagescale.load.operations import get_operation  # noqa: E402
from pytest_storagescale.load.plan import StepPlan  # noqa: E402
from pytest_storagescale.servers.netns import rss_by_namespace  # noqa: E402


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
    parser.add_argument("--scale", help="HOSTSxCLIENTS,... (e.g. 4x5,4x500,8x250)")
    parser.add_argument("--ops", default="stat,ls,get", help="the scale steps' operations")
    parser.add_argument("--launcher", choices=("slurm", "dask"), default="slurm")
    parser.add_argument("--hang-timeout", type=float, default=120.0)
    parser.add_argument("--engine-step", nargs=3, metavar=("URL", "ROOT", "TAG"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_step:
        url, root, tag = args.engine_step
        print(json.dumps(engine_step(url, root, args, tag)))
        return
    if args.scale:
        scale(args)
        return
    raise_open_files()
    configs = ["engine", "cluster 1", "cluster 2", "cluster 4"]
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as scratch, \
            NamespaceCluster(4, Path(scratch), threads=1) as hosts, \
            bridge_xrootd(https=False) as server:
        url = f"root://{server.host}:{server.port}//storagescale"
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


# -- the seeds' scale ---------------------------------------------------------------------
SCALE_PARAMS = {"stat": {}, "ls": {"entries": 100}, "get": {"file_size": 65536, "files": 20}}


def namespace_rss_mb(*netns: str) -> dict[str, float]:
    """Resident memory of every process in each network namespace ``netns`` (MB)."""
    return {name: rss / 1e6 for name, rss in rss_by_namespace(
        {name: name for name in netns}).items()}


class MemorySampler(Periodic):
    """Every 0.5 s until stopped: each namespace's resident memory (its peak kept), the
    machine's available memory (its lowest) and the server's (its peak)."""

    def __init__(self, netns: list[str], server_pid: int) -> None:
        super().__init__()
        self.netns, self.server_pid = netns, server_pid
        self.peak = dict.fromkeys(netns, 0.0)
        self.lowest_available = available_mb()
        self.server_peak = 0.0

    def sample(self) -> None:
        for netns, mb in namespace_rss_mb(*self.netns).items():
            self.peak[netns] = max(self.peak[netns], mb)
        self.lowest_available = min(self.lowest_available, available_mb())
        self.server_peak = max(self.server_peak, process_rss_mb(self.server_pid))


def scale_step(connection, hosts, network, url: str, root: str, op: str, per_host: int,
               args, server_pid: int) -> dict:
    """One step of ``op`` with ``per_host`` clients on each of ``hosts``."""
    plan = StepPlan(operation=get_operation(op), clients=per_host * len(hosts),
                    duration=args.duration, warmup=args.warmup, hang_timeout=args.hang_timeout,
                    driver=driver_spec(url, writable_root=root), params=SCALE_PARAMS[op],
                    workdir=f"{root}/{op}-{len(hosts)}x{per_host}-{time.time_ns()}")
    netns = [network_host(network, h).netns for h in hosts]
    idle = namespace_rss_mb(*netns)
    executor = ClusterExecutor(connection, hosts, clients_per_host=per_host)
    began = time.monotonic()
    with MemorySampler(netns, server_pid) as memory:
        result = run_step(plan, executor=executor)
    wall = time.monotonic() - began
    growth = [memory.peak[n] - idle[n] for n in netns]
    return {"op": op, "hosts": len(hosts), "per_host": per_host, "clients": plan.clients,
            "rate": result.total.rate_hz, "mb_s": result.total.mb_s,
            "succeeded": result.total.succeeded, "failed": result.total.failed,
            "hung": result.total.hung, "lost": executor.lost,
            "lost_hosts": sum(1 for h in executor.hosts if h.lost), "wall": wall,
            "lost_reasons": [f"{h.name}: {h.lost_reason}" for h in executor.hosts if h.lost],
            "dispatch_s": executor.dispatch_s,
            "idle_host_mb": statistics.mean(idle.values()),
            "peak_host_mb": max(memory.peak.values()),
            "per_client_mb": statistics.mean(growth) / per_host,
            "worker_peak_mb": max((h.peak_rss_mb or 0) for h in executor.hosts),
            "lowest_available_mb": memory.lowest_available,
            "server_peak_mb": memory.server_peak,
            "errors": dict(result.total.errors)}


def network_host(network, host):
    """The namespace host a Dask worker runs on (by its address)."""
    return next(h for h in network.hosts if host.address in (h.address, h.address6))


def scale(args) -> None:
    """The seeds' scale: H hosts x C clients, launched as SLURM jobs (or Dask workers)."""
    import dask

    from pytest_storagescale.cluster.slurm import EmbeddedSlurm, SlurmNode

    configs = [tuple(int(v) for v in c.split("x")) for c in args.scale.split(",")]
    most = max(h for h, _ in configs)
    ops = args.ops.split(",")
    raise_open_files()
    rows: list[dict] = []
    before = available_mb()
    with tempfile.TemporaryDirectory() as scratch:
        network = NamespaceCluster(most, Path(scratch), threads=1,
                                   dask=args.launcher == "dask")
        batch = None
        try:
            began = time.monotonic()
            network.start()
            network_s = time.monotonic() - began
            with bridge_xrootd(https=False) as server:
                if args.launcher == "slurm":
                    controller = network.add_controller()
                    batch = EmbeddedSlurm(
                        Path(scratch) / "slurm-run",
                        [SlurmNode(h.name, h.address, h.netns) for h in network.hosts],
                        controller=SlurmNode("ctl", controller.address, controller.netns),
                        scheduler_host=network.head).start()
                    os.environ.update(batch.environment)
                    cluster_hosts.RECIPE_START_TIMEOUT["slurm"] = 600.0
                    address = f"slurm:{most}"
                    import dask_jobqueue  # noqa: F401 - its defaults, then ours

                    config = {f"jobqueue.slurm.{key}": value for key, value in
                              batch.jobqueue_config(python=sys.executable,
                                                    memory="16GiB").items()}
                else:
                    address, config = network.address, {}
                with dask.config.set(config):
                    began = time.monotonic()
                    connection = cluster_hosts.connect(address)
                    joined_s = time.monotonic() - began
                    hosts = connection.hosts()
                    idle = list(namespace_rss_mb(
                        *(network_host(network, h).netns for h in hosts)).values())
                    print(f"# network {network_s:.1f} s, SLURM "
                          f"{batch.started_in if batch else 0:.1f} s, {most} workers joined in "
                          f"{joined_s:.1f} s; idle host {statistics.mean(idle):.0f} MB; "
                          f"available {before:.0f} MB before", flush=True)
                    url = f"root://{server.host}:{server.port}//storagescale"
                    root = f"/storagescale/bench-scale-{time.time_ns()}"
                    driver_spec(url, writable_root=root).connect("bench", timeout=30).mkdir(root)
                    pid = server.process.pid
                    # one client per host first: what every worker loads once (the
                    # driver, the compiled loop) is not counted as the clients' memory
                    scale_step(connection, hosts, network, url, root, "stat", 1, args, pid)
                    for count, per_host in configs:
                        for op in ops:
                            try:
                                row = scale_step(connection, hosts[:count], network, url, root,
                                                 op, per_host, args, pid)
                            except Exception as exc:  # noqa: BLE001 - the limit, reported
                                row = {"op": op, "hosts": count, "per_host": per_host,
                                       "clients": count * per_host, "error": repr(exc)[:300]}
                            rows.append(row)
                            print(f"# {json.dumps(row)}", flush=True)
                    cluster_hosts.disconnect()
        finally:
            cluster_hosts.disconnect()
            if batch is not None:
                batch.stop()
            network.stop()
    scale_report(rows, args)


def scale_report(rows: list[dict], args) -> None:
    print(f"\nwarm-up {args.warmup:g} s, duration {args.duration:g} s, launcher "
          f"{args.launcher}\n")
    print("| step | hosts x clients | rate | failed/hung/lost (hosts lost) | wall | "
          "host idle | host peak | per client | worker peak | machine available (lowest) | "
          "xrootd peak |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        shape = f"{r['hosts']} x {r['per_host']} = {r['clients']:,}"
        if "error" in r:
            print(f"| {r['op']} | {shape} | error: {r['error']} |  |  |  |  |  |  |  |  |")
            continue
        rate = f"{r['rate']:,.0f} Hz" + (f" ({r['mb_s']:.1f} MB/s)" if r["mb_s"] else "")
        print(f"| {r['op']} | {shape} | {rate} | {r['failed']}/{r['hung']}/{r['lost']} "
              f"({r['lost_hosts']}) | {r['wall']:.1f} s | {r['idle_host_mb']:.0f} MB | "
              f"{r['peak_host_mb']:.0f} MB | {r['per_client_mb']:.2f} MB | "
              f"{r['worker_peak_mb']:.0f} MB | {r['lowest_available_mb']:,.0f} MB | "
              f"{r['server_peak_mb']:.0f} MB |")


if __name__ == "__main__":
    main()
