"""The seeds' scale through ``--storage-cluster embedded-slurm:N`` (issue 36): the
xrootd suite's namespace scan (``suites/xrootd``: ``test_stat_scan``, ``test_ls_scan``)
run by pytest as a user runs it, its clients on N client hosts whose Dask workers the
plugin's own SLURM cluster runs as batch jobs, at 400, 1,000 and 2,000 clients in total.

A real xrootd (Debian's, as ``tests/test_slurm_embedded.py`` starts it: on the address of
an interface made for it, reached by the namespace hosts through their default route) and
one pytest run of the suite with a plan of its own (thresholds ``clients = [...]`` for
``stat`` and ``ls``, short steps; the rules: no failed, hung or lost client). Per step,
from the run's results JSON: total clients, each host's row (its Dask worker, address,
clients, succeeded, rate, p99, worker peak), rate, p99, failed/hung/lost and hosts lost;
and sampled by this script every 0.5 s while pytest runs: each client host's memory
(every process in its namespace: slurmd, the job's slurmstepd, shell, nanny and worker,
resident) at its peak during the step, and the machine's available memory at its
lowest, and the 1-minute load average at its highest (the machine is shared; the
step's own client threads count in it too). From pytest's header: SLURM up, the jobs
joined (the time to a ready cluster).

Needs root and SLURM (scripts/bootstrap.sh servers). Usage::

    .venv/bin/python benchmarks/bench_slurm_scale.py [--hosts 4] [--clients 400,1000,2000]
        [--ops stat,ls] [--duration 3] [--warmup 1] [--hang-timeout 60] [--timeout 1500]
        [--nofile 1024]
"""

from __future__ import annotations

import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from netns import bridge_xrootd  # noqa: E402
from suite_runs import (  # noqa: E402
    Periodic,
    available_mb,
    load_average,
    run_pytest,
    scale_options,
    scale_plan,
)

from pytest_storagescale.servers.netns import handle, rss_by_namespace  # noqa: E402

SUITE = REPO / "suites" / "xrootd" / "test_xrootd_scalability.py"
TESTS = {"stat": "test_stat_scan", "ls": "test_ls_scan"}
HEADER = re.compile(r"embedded SLURM for this run: controller \S+, (\d+) client hosts "
                    r"\(network namespaces\), up in ([\d.]+) s, \d+ worker jobs joined "
                    r"([\d.]+) s later")
NODE = re.compile(r"^  slurm node (ns\d+) (\S+): job (\d+) (\w+), Dask worker (\S+), "
                  r"memory (\d+) MB", re.M)


def thresholds(args) -> str:
    return scale_plan("xrootd", args.clients,
                      {op: {"entries": 10} if op == "ls" else {} for op in args.ops}, args)


def host_memory_mb() -> dict[str, float]:
    """Each embedded-SLURM client host's resident memory (MB): its namespace found by
    its slurmd (``slurmd -D -N nsK``), then every process in that namespace."""
    hosts = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if command[0].endswith(b"slurmd") and b"-N" in command[:-1]:
            hosts[command[command.index(b"-N") + 1].decode()] = handle(int(entry))
    return {name: rss / 1e6 for name, rss in rss_by_namespace(hosts).items()}


class Sampler(Periodic):
    """Every 0.5 s until stopped, with the wall-clock time: each host's memory and the
    machine's available memory (bounded: one sample list per run)."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[tuple[float, dict[str, float], float, float]] = []

    def hosts(self) -> dict[str, float]:
        return host_memory_mb()

    def sample(self) -> None:
        self.samples.append((time.time(), self.hosts(), available_mb(),
                             float(load_average().split()[0])))

    def between(self, began: float, ended: float) -> tuple[dict[str, float], float, float]:
        """Each host's peak memory, the lowest available memory and the highest
        1-minute load average sampled in (began, ended]."""
        peak: dict[str, float] = {}
        lowest, load = float("nan"), 0.0
        for at, hosts, free, load1 in self.samples:
            if began < at <= ended:
                for name, mb in hosts.items():
                    peak[name] = max(peak.get(name, 0.0), mb)
                lowest = free if lowest != lowest else min(lowest, free)
                load = max(load, load1)
        return peak, lowest, load


def run(args) -> tuple[list[dict], dict, str, Sampler, float]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the xrootd's 2,000 sockets
    with tempfile.TemporaryDirectory() as scratch, bridge_xrootd(https=False) as server:
        address = server.host  # what the hosts reach
        work = Path(scratch)
        (work / "thr" / "xrootd").mkdir(parents=True)
        (work / "thr" / "xrootd" / "scale.toml").write_text(thresholds(args))
        selected = " or ".join(TESTS[op] for op in args.ops)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                   f"--storage-endpoint=root://{address}:{server.port}//storagescale",
                   "--storage-version=5.5", "--storage-thresholds=thr",
                   f"--storage-cluster=embedded-slurm:{args.hosts}",
                   "--storage-results=out.json", "-v", "-k", selected, str(SUITE)]

        def limits() -> None:  # pytest (and the jobs it submits) with the user's limit
            if args.nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
        sampler = Sampler()
        steps, meta, output = run_pytest(command, work, timeout=args.timeout, log=args.log,
                                         beside=[sampler], preexec_fn=limits)
        return steps, meta, output, sampler, meta["began"]


def report(steps: list[dict], meta: dict, output: str, sampler: Sampler, began: float,
           args) -> None:
    header = HEADER.search(output)
    nodes = NODE.findall(output)
    if header:
        up, joined = float(header.group(2)), float(header.group(3))
        print(f"\nembedded-slurm:{args.hosts}: SLURM up in {up:.1f} s, the worker jobs joined "
              f"{joined:.1f} s later: a ready cluster {up + joined:.1f} s after the start")
    for node in nodes:
        print(f"  {node[0]} {node[1]}: job {node[2]} {node[3]}, worker {node[4]}, "
              f"idle {node[5]} MB")
    print(f"\nwarm-up {args.warmup:g} s, duration {args.duration:g} s, hang_timeout "
          f"{args.hang_timeout:g} s; pytest exit {meta['code']}\n")
    print("| step | clients (per host) | rate | p99 | failed/hung/lost (hosts lost) | "
          "host peak memory | worker peak | machine available (lowest) | load average |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    previous = began
    for step in steps:
        result = step.get("result") or {}
        ended = float(result.get("ended") or 0) or time.time()
        hosts = step.get("hosts") or []
        peak, lowest, load = sampler.between(previous, ended + 1.0)
        previous = ended + 1.0
        shares = "/".join(str(h["clients"]) for h in hosts) or "-"
        lost_hosts = sum(1 for h in hosts if h.get("lost"))
        p99 = (step.get("latency_s") or {}).get("p99")
        worker = max((h.get("peak_rss_mb") or 0 for h in hosts), default=0)
        print(f"| {step.get('op')} | {step.get('clients'):,} ({shares}) | "
              f"{step.get('rate_hz') or 0:,.0f} Hz | "
              f"{'-' if p99 is None else f'{p99 * 1e3:.1f} ms'} | "
              f"{step.get('failed')}/{step.get('hung')}/{step.get('lost', 0)} ({lost_hosts}) | "
              f"{' '.join(f'{k} {v:.0f}' for k, v in sorted(peak.items())) or '-'} MB | "
              f"{worker:.0f} MB | {lowest:,.0f} MB | {load:.0f} |")
        if step.get("error"):
            print(f"|  | error: {' '.join(str(step['error']).split())[:300]} |")
    print()
    for step in steps:
        print(f"{step.get('op')} {step.get('clients')} clients, per host:")
        for h in step.get("hosts") or []:
            p99 = h.get("p99_s")
            print(f"  {h['worker']} {h['address']}: {h['clients']} clients, {h['succeeded']} "
                  f"succeeded, {h['rate_hz']:,.0f} Hz, p99 "
                  f"{'-' if p99 is None else f'{p99 * 1e3:.1f} ms'}, failed {h['failed']}, "
                  f"hung {h['hung']}, lost {h['lost']}, worker peak "
                  f"{h.get('peak_rss_mb') or 0:.0f} MB"
                  + (f", lost: {h['lost_reason']}" if h.get("lost_reason") else ""))
    table = re.findall(r"^(?:storagescale: cluster|  host ).*$", output, re.M)
    if table:
        print("\nthe plugin's own host lines:")
        print("\n".join(table[:60]))


def main() -> None:
    parser = scale_options(__doc__, ops=TESTS, clients="400,1000,2000", default_ops="stat,ls",
                           duration=3.0, timeout=1500.0, log="/tmp/bench_slurm_scale.log")
    parser.add_argument("--nofile", type=int, default=0,
                        help="pytest's soft limit on open files (its jobs inherit it: "
                             "SLURM's PropagateResourceLimits); else the hard limit, as "
                             "the xrootd's")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, SLURM's daemons)")
    steps, meta, output, sampler, began = run(args)
    report(steps, meta, output, sampler, began, args)


if __name__ == "__main__":
    main()
