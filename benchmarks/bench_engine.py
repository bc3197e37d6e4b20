"""The engine's overhead: its stat rate against a bare loop of the same client library.

For C = 1, 50, 200, 1000 clients against the embedded xrootd, run side by side in
one process and alternated over ROUNDS rounds:

- bare: C threads, each with its own XRootD FileSystem (own login, like the
  engine's clients), calling ``stat`` back to back and counting successes;
- engine: ``run_step`` of the ``stat`` operation with the same C, warm-up and
  duration (hang detection, HdrHistogram, per-second timeline included).

Each measurement runs in a fresh process (the XRootD client keeps idle connections
for minutes, and a process holding thousands of them is slower), with the order
alternated per round. Prints a Markdown table (docs/benchmarks.md quotes it) with
the ratio engine/bare and the engine's resident memory growth at each C. Usage::

    .venv/bin/python benchmarks/bench_engine.py [--duration 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from XRootD import client

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.endpoints.embedded import EmbeddedXRootD
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bare_loop(server, target: str, clients: int, warmup: float,
              duration: float, tag: str) -> float:
    counts = [0] * clients
    ready = threading.Barrier(clients + 1)
    times: dict[str, float] = {}

    def worker(index: int) -> None:
        fs = client.FileSystem(f"root://{tag}{index:05d}@127.0.0.1:{server.port}")
        fs.stat(target, timeout=30)  # log in before the clock runs, as the engine does
        ready.wait()
        measure_from, end_at = times["from"], times["end"]
        while True:
            status, _ = fs.stat(target, timeout=30)
            now = time.time()
            if now > end_at:
                return
            if status.ok and now >= measure_from:
                counts[index] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    start = time.time()
    times["from"], times["end"] = start + warmup, start + warmup + duration
    ready.wait()
    for thread in threads:
        thread.join()
    return sum(counts) / duration


def engine_step(server, root: str, clients: int, warmup: float,
                duration: float, tag: str) -> tuple[float, float]:
    peak = [rss_mb()]
    before = peak[0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], rss_mb())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = run_step(StepPlan(
        operation=get_operation("stat"), clients=clients, duration=duration, warmup=warmup,
        hang_timeout=30, driver=driver_spec(server.url, writable_root=root),
        workdir=f"{root}/{tag}",
    ))
    done.set()
    watcher.join()
    step = result.total
    assert step.failed == 0 and step.hung == 0, step.errors
    return step.rate_hz, peak[0] - before


def measure(args: argparse.Namespace) -> None:
    """One measurement in this (fresh) process; prints its result as JSON."""
    server = argparse.Namespace(port=args.port, url=f"root://127.0.0.1:{args.port}//storagescale")
    if args.measure == "bare":
        result = {"rate_hz": bare_loop(server, args.target, args.clients_one, args.warmup,
                                       args.duration, args.tag)}
    else:
        rate, grown = engine_step(server, "/storagescale/bench", args.clients_one,
                                  args.warmup, args.duration, args.tag)
        result = {"rate_hz": rate, "rss_growth_mb": grown}
    print(json.dumps(result), flush=True)


def run_isolated(kind: str, port: int, target: str, clients: int, args, tag: str) -> dict:
    """Each measurement in its own process: no connection of an earlier measurement
    is left in the client library to weigh on the next one."""
    command = [sys.executable, __file__, "--measure", kind, "--port", str(port),
               "--target", target, "--clients-one", str(clients), "--tag", tag,
               "--warmup", str(args.warmup), "--duration", str(args.duration)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default="1,50,200,1000")
    parser.add_argument("--measure", choices=("bare", "engine"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--clients-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tag", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args)
        return
    rows = []
    with EmbeddedXRootD(https=False) as server:
        root = "/storagescale/bench"
        target = f"{root}/bare/stat-target"
        admin = client.FileSystem(f"root://ssbench@127.0.0.1:{server.port}")
        admin.mkdir(f"{root}/bare", 1)  # MAKEPATH
        handle = client.File()
        handle.open(f"root://ssbench@127.0.0.1:{server.port}/{target}", 2 | 8)  # DELETE
        handle.write(b"x" * 1024)
        handle.close()
        step = 0
        for clients in (int(c) for c in args.clients.split(",")):
            bare, engine, memory = [], [], []
            for round_number in range(args.rounds):
                order = ("bare", "engine") if round_number % 2 == 0 else ("engine", "bare")
                for kind in order:
                    step += 1
                    result = run_isolated(kind, server.port, target, clients, args,
                                          f"{kind[0]}{step:02d}")
                    (bare if kind == "bare" else engine).append(result["rate_hz"])
                    if kind == "engine":
                        memory.append(result["rss_growth_mb"])
            b, e = sum(bare) / len(bare), sum(engine) / len(engine)
            rows.append((clients, b, e, e / b, max(memory), bare, engine))
            print(f"C={clients}: bare {[round(x) for x in bare]} Hz, engine "
                  f"{[round(x) for x in engine]} Hz, ratio of means {e / b:.2f}, engine RSS "
                  f"growth {max(memory):.0f} MB", flush=True)
    print()
    print(f"stat against the embedded xrootd {server.version}, {args.rounds} rounds of "
          f"{args.warmup:g} s warm-up + {args.duration:g} s, each measurement in a fresh "
          f"process, order alternated per round")
    print()
    print("| clients | bare loop (Hz) | engine (Hz) | engine / bare | engine RSS growth (MB) |")
    print("|---:|---:|---:|---:|---:|")
    for clients, b, e, ratio, grown, _, _ in rows:
        print(f"| {clients} | {b:.0f} | {e:.0f} | {ratio:.2f} | {grown:.0f} |")


if __name__ == "__main__":
    main()
