"""The engine's overhead: its stat rate against a bare loop of the same client library.

For C = 1, 50, 200, 1000 clients against the embedded xrootd, run side by side in
one process and alternated over ROUNDS rounds:

- bare: C threads, each with its own XRootD FileSystem (own login, like the
  engine's clients), calling ``stat`` back to back and counting successes;
- engine: ``run_step`` of the ``stat`` operation with the same C, warm-up and
  duration (hang detection, HdrHistogram, per-second timeline included).

Prints a Markdown table (the README quotes it) with the ratio engine/bare and the
engine's resident memory growth at each C. Usage::

    .venv/bin/python benchmarks/bench_engine.py [--duration 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from XRootD import client

from pytest_storagescale.endpoints.embedded import EmbeddedXRootD
from pytest_storagescale.load.engine import StepPlan, run_step


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bare_loop(server: EmbeddedXRootD, target: str, clients: int, warmup: float,
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


def engine_step(server: EmbeddedXRootD, root: str, clients: int, warmup: float,
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
        op="stat", clients=clients, duration=duration, warmup=warmup, hang_timeout=30,
        endpoint_url=server.url, driver="xrootd", workdir=f"{root}/{tag}",
        writable_root=root, tag=tag,
    ))
    done.set()
    watcher.join()
    step = result.total
    assert step.failed == 0 and step.hung == 0, step.errors
    return step.rate_hz, peak[0] - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default="1,50,200,1000")
    args = parser.parse_args()
    rows = []
    with EmbeddedXRootD() as server:
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
                # alternate who goes first: every step leaves its connections open on
                # the server for a while, which weighs on whoever runs next
                step += 1
                order = ("bare", "engine") if round_number % 2 == 0 else ("engine", "bare")
                for who in order:
                    if who == "bare":
                        bare.append(bare_loop(server, target, clients, args.warmup,
                                              args.duration, f"b{step:02d}"))
                    else:
                        rate, grown = engine_step(server, root, clients, args.warmup,
                                                  args.duration, f"e{step:02d}")
                        engine.append(rate)
                        memory.append(grown)
            b, e = sum(bare) / len(bare), sum(engine) / len(engine)
            rows.append((clients, b, e, e / b, max(memory)))
            print(f"C={clients}: bare {b:.0f} Hz, engine {e:.0f} Hz, ratio {e / b:.2f}, "
                  f"engine RSS growth {max(memory):.0f} MB", flush=True)
    print()
    print(f"stat against the embedded xrootd {server.version}, {args.rounds} rounds of "
          f"{args.warmup:g} s warm-up + {args.duration:g} s, order alternated per round")
    print()
    print("| clients | bare loop (Hz) | engine (Hz) | engine / bare | engine RSS growth (MB) |")
    print("|---:|---:|---:|---:|---:|")
    for clients, b, e, ratio, grown in rows:
        print(f"| {clients} | {b:.0f} | {e:.0f} | {ratio:.2f} | {grown:.0f} |")


if __name__ == "__main__":
    main()
