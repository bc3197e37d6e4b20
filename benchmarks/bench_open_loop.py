"""The open loop beside the closed loop: the engine's own ceiling, and one stall seen
by both.

1. **Ceiling**: the highest arrival rate the open-loop engine keeps on this machine,
   with the memory driver (no storage: the engine alone) and with root:// stat
   against the embedded xrootd (through the XRootD Python bindings, the open loop's
   path). A rate is kept when nothing is dropped, the achieved rate is at least 95 %
   of the offered one and at most 5 % of the requests were sent late (over 10 ms
   after their intended time). Rates double from 100/s until one is not kept. Beside
   it, the closed loop's rate with as many clients as the open loop's cap (xrootd:
   with the compiled loop, the default, and with the Python bindings).
2. **Stall**: the memory driver's store stalls for S seconds in the middle of a step,
   once at offered rate R (open loop), once with C clients (closed loop); the plot
   shows, for each, the share of requests slower than a given response time.

Usage (``make bench`` runs it after bench_engine.py)::

    .venv/bin/python benchmarks/bench_open_loop.py [--quick] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from hdrh.histogram import HdrHistogram

from pytest_storagescale.drivers import memory
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan
from pytest_storagescale.load.stats import SideResult, StepResult

REPO = Path(__file__).resolve().parent.parent
PLOT = REPO / "docs" / "img" / "open-vs-closed-stall.png"
MARKERS = ("<!-- open-loop-bench:start (written by benchmarks/bench_open_loop.py "
           "--write-docs) -->", "<!-- open-loop-bench:end -->")
ROOT = "/storagescale/bench-open"
STORE = "bench-open"
#: the open loop's cap on requests in flight, and the closed loop's clients beside it
CAP = 50
RATES = (100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


def kept(total: SideResult) -> bool:
    sent = total.succeeded + total.failed + total.hung
    return (total.dropped == 0 and total.achieved_hz >= 0.95 * total.offered_hz
            and total.late <= 0.05 * max(sent, 1) and total.failed == total.hung == 0)


def step(spec, tag: str, duration: float, *, rate: float = 0.0, clients: int = CAP,
         workdir_root: str = "/area") -> StepResult:
    return run_step(StepPlan(
        operation=get_operation("stat"), clients=clients, duration=duration, warmup=0.5,
        hang_timeout=30.0, driver=spec, workdir=f"{workdir_root}/{tag}", arrival_rate=rate),
        executor="auto")


def ladder(spec, duration: float, root: str) -> tuple[float, list[str]]:
    """The highest kept rate, and a line per rate tried."""
    best, lines = 0.0, []
    for number, rate in enumerate(RATES):
        result = step(spec, f"open-{number}", duration, rate=rate, workdir_root=root)
        total, usage = result.total, result.client
        cpu = f"{usage.cpu:.0%}" if usage is not None else "-"
        ok = kept(total)
        lines.append(f"| {rate:,} | {total.achieved_hz:,.0f} | {total.dropped} | "
                     f"{total.late} | {total.latency_s['p99'] * 1e3:.2f} | "
                     f"{total.open_loop.service_latency_s['p99'] * 1e3:.2f} | {cpu} | "
                     f"{'kept' if ok else 'not kept'} |")
        print(lines[-1], flush=True)
        if not ok:
            break
        best = float(rate)
    return best, lines


def closed(spec, duration: float, root: str) -> float:
    return step(spec, "closed", duration, workdir_root=root).total.rate_hz


def memory_spec(**options: str):
    return driver_spec(f"memory://{STORE}/area", writable_root="/area", options=options)


# -- the stall ----------------------------------------------------------------------
def stalled(plan_rate: float, clients: int, stall: float, duration: float) -> SideResult:
    memory.clear_stores()

    def stall_once() -> None:  # a second after the first request
        while memory.served_requests(STORE) < 1:
            time.sleep(0.002)
        time.sleep(1.0)
        memory.stall(STORE)
        time.sleep(stall)
        memory.resume(STORE)

    thread = threading.Thread(target=stall_once, daemon=True)
    thread.start()
    result = step(memory_spec(latency="0.002"), "stall", duration, rate=plan_rate,
                  clients=clients)
    thread.join()
    return result.total


def slower_shares(side: SideResult) -> tuple[list[float], list[float]]:
    """Response times (s) and the share of the window's requests slower than each."""
    histogram = HdrHistogram.decode(side.histogram.encode("ascii"))
    total = histogram.get_total_count()
    times, shares, seen = [], [], 0
    for item in histogram.get_recorded_iterator():
        seen += item.count_added_in_this_iter_step
        times.append(item.value_iterated_to / 1e6)
        shares.append(max((total - seen) / total, 0.5 / total))
    return times, shares


def plot(open_side: SideResult, closed_side: SideResult, rate: float, clients: int,
         stall: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for side, label in ((open_side, f"open loop, {rate:g} requests/s"),
                        (closed_side, f"closed loop, {clients} clients")):
        times, shares = slower_shares(side)
        axes.step(times, shares, where="post", label=f"{label} ({side.succeeded} requests, "
                                                     f"p99 {side.latency_s['p99']:.3g} s)")
    axes.axvline(stall, color="grey", linestyle=":", label=f"the stall: {stall:g} s")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("response time (s)")
    axes.set_ylabel("share of the window's requests slower")
    axes.set_title("One stall of the storage, two ways to load it (memory driver)")
    axes.legend(fontsize=8)
    figure.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(PLOT, dpi=100)


def xrootd_ceiling(duration: float) -> tuple[float, list[str], float, float, str]:
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    with EmbeddedXRootD(https=False) as server:
        url = f"root://127.0.0.1:{server.port}/{ROOT}"
        spec = driver_spec(url, writable_root=ROOT)
        best, lines = ladder(spec, duration, ROOT)
        compiled = closed(spec, duration, ROOT)
        python = closed(driver_spec(url, writable_root=ROOT,
                                    options={"client_loop": "python"}), duration, ROOT)
        return best, lines, compiled, python, server.version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter steps")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--no-xrootd", action="store_true")
    args = parser.parse_args()
    duration = 2.0 if args.quick else 4.0
    header = ["| offered /s | achieved /s | dropped | late | p99 response (ms) | "
              "p99 service (ms) | client CPU | |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
    began = time.strftime("%Y-%m-%d %H:%M")
    load = os.getloadavg()[0]
    print("memory driver:", flush=True)
    memory_best, memory_lines = ladder(memory_spec(), duration, "/area")
    memory_closed = closed(memory_spec(), duration, "/area")
    rate, clients, stall = 100.0, 8, 2.0
    open_side = stalled(rate, 1000, stall, 6.0)
    closed_side = stalled(0.0, clients, stall, 6.0)
    plot(open_side, closed_side, rate, clients, stall)
    lines = [
        f"Measured {began} on {os.cpu_count()} cores (1-minute load average {load:.1f} "
        f"at the start: the machine is shared), {duration:g} s steps after a 0.5 s warm-up, "
        f"stat, at most {CAP} requests in flight (the closed loop: {CAP} clients), the "
        f"auto executor. Kept: nothing dropped, achieved >= 95 % of offered, at most 5 % "
        f"sent over 10 ms late.", "",
        f"**Memory driver** (the engine alone): open-loop ceiling **{memory_best:,.0f}/s**; "
        f"the closed loop with {CAP} clients: {memory_closed:,.0f}/s.", "", *header,
        *memory_lines, ""]
    if not args.no_xrootd:
        print("xrootd:", flush=True)
        best, xrootd_lines, compiled, python, version = xrootd_ceiling(duration)
        lines += [
            f"**root:// stat, embedded xrootd {version}** (open loop through the Python "
            f"bindings): open-loop ceiling **{best:,.0f}/s**; the closed loop with {CAP} "
            f"clients: {compiled:,.0f}/s with the compiled loop, {python:,.0f}/s with "
            f"the Python bindings.", "", *header, *xrootd_lines, ""]
    lines += [
        f"**The stall** (memory driver, 2 ms per request, the store stalled {stall:g} s a "
        f"second into a 6 s window): open loop at {rate:g}/s: {open_side.succeeded} "
        f"requests, p50 {open_side.latency_s['p50'] * 1e3:.1f} ms, p99 "
        f"{open_side.latency_s['p99']:.2f} s, max {open_side.latency_s['max']:.2f} s; closed "
        f"loop with {clients} clients: {closed_side.succeeded} requests, p50 "
        f"{closed_side.latency_s['p50'] * 1e3:.1f} ms, p99 "
        f"{closed_side.latency_s['p99'] * 1e3:.1f} ms, max "
        f"{closed_side.latency_s['max']:.2f} s (the plot in "
        f"[Open and closed loops](open-loop.md)).",
    ]
    print("\n".join(lines))
    if args.write_docs:
        from bench_engine import write_docs  # (this folder: the script's own)

        write_docs(lines, MARKERS)


if __name__ == "__main__":
    main()
