"""The engine beside the physical limit: root:// stat, 1 MB put and 1 MB get at
C = 1, 10, 50, 200, 1000, 5000 clients against the embedded xrootd, three ways:

- engine: ``run_step`` with the ``auto`` executor (threads up to the XRootD driver's
  clients_per_process, above it that many clients per spawned process), hang
  detection, HdrHistogram and per-second timeline included, its requests made by the
  driver's compiled client loop (the default, ``client_loop=compiled``);
- engine-py: the same with ``client_loop=python`` (every request through the XRootD
  Python bindings);
- C++: ``benchmarks/xrdcl_loop.cc`` (compiled here into build/bench/ against Debian's
  libxrootd-client-dev): one XrdCl::FileSystem and login per thread, sharded over the
  same number of processes as the engine; at C >= 1000 also in one process (the
  collapse the sharding avoids);
- C++ async (stat only): the same client program with ``--mode async``: no thread per
  client, each client's next stat issued from its last one's response handler (the
  way the engine's compiled loop makes stat);
- bare: the same loop in Python (XRootD bindings, one FileSystem and login per
  thread), sharded the same way.

Each measurement runs in fresh processes (the XRootD client keeps idle connections
for minutes), the order alternated per round. For every point: rate (MB/s for
put/get), the ratios, client CPU per operation (user + system of the client
processes over the measured window) and their resident memory. The load average
is printed before each series; the table goes to stdout and, with --write-docs,
into docs/benchmarks.md between the ``engine-bench`` markers. Usage::

    .venv/bin/python benchmarks/bench_engine.py [--quick] [--rounds 2] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from XRootD import client

from pytest_storagescale.drivers import grid  # XRD_* settings: the xrootd driver puts them
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.xrootd import XRootDDriver
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.executors import process_count
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan
from pytest_storagescale.servers.xrootd import EmbeddedXRootD

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build" / "bench"
DOCS = REPO / "docs" / "benchmarks.md"
MARKERS = ("<!-- engine-bench:start (written by benchmarks/bench_engine.py --write-docs) -->",
           "<!-- engine-bench:end -->")
ROOT = "/storagescale/bench"
SIZE = 1_000_000
KINDS = ("engine", "engine-py", "cxx", "cxx-async", "bare")


@dataclass
class Point:
    """One measurement: ``rate`` operations/s, ``mb_s``, client CPU seconds over the
    window, client resident memory, processes."""

    kind: str
    op: str
    clients: int
    rate: float
    mb_s: float
    cpu_s: float
    window_s: float
    rss_mb: float
    processes: int
    failed: int = 0

    @property
    def cpu_per_op_us(self) -> float:
        done = self.rate * self.window_s
        return self.cpu_s / done * 1e6 if done else math.nan


def warmup_for(clients: int) -> float:
    """Logins of thousands of clients take seconds: a longer warm-up at large C."""
    return max(2.0, clients / 500)


#: the most clients per process (0: the driver's clients_per_process); --clients-per-process
PER_PROCESS = [0]


def engine_processes(clients: int) -> int:
    """How many processes the auto executor gives C xrootd clients."""
    if clients <= (PER_PROCESS[0] or XRootDDriver.clients_per_process):
        return 1
    spec = driver_spec("root://127.0.0.1:1//x", writable_root="/x")
    return process_count(StepPlan(get_operation("stat"), clients, 1, 0, 1, spec, "/x",
                                  clients_per_process=PER_PROCESS[0]), clients)


# -- the three kinds ------------------------------------------------------------------
def engine_point(url: str, op: str, clients: int, warmup: float, duration: float,
                 tag: str, loop: str = "compiled") -> Point:
    params = {"file_size": SIZE, "files": 1} if op == "get" else (
        {"file_size": SIZE} if op == "put" else {})
    result = run_step(StepPlan(
        operation=get_operation(op), clients=clients, duration=duration, warmup=warmup,
        hang_timeout=60, driver=driver_spec(url, writable_root=ROOT,
                                            options={"client_loop": loop}),
        workdir=f"{ROOT}/{tag}", params=params, clients_per_process=PER_PROCESS[0]),
        executor="auto")
    total, usage = result.total, result.client
    rss = usage.rss_mb + (psutil.Process().memory_info().rss / 1e6 if usage.processes > 1 else 0)
    kind = "engine" if loop == "compiled" else "engine-py"
    return Point(kind, op, clients, total.rate_hz, total.mb_s, usage.cpu_s, usage.window_s,
                 rss, usage.processes, total.failed + total.hung)


def bare_request(fs, server: str, op: str, path: str, data: bytes) -> int:
    """One request of a bare loop: bytes moved, -1 when it failed."""
    if op == "stat":
        return 0 if fs.stat(path, timeout=60)[0].ok else -1
    handle = client.File()
    if op == "get":
        if not handle.open(f"{server}/{path}", timeout=60)[0].ok:
            return -1
        status, got = handle.read(0, SIZE, timeout=60)
        handle.close(timeout=60)
        return len(got) if status.ok else -1
    if not handle.open(f"{server}/{path}", 2 | 8, 0o644, timeout=60)[0].ok:  # DELETE|MAKEPATH
        return -1
    status, _ = handle.write(data, 0, SIZE, timeout=60)
    handle.close(timeout=60)
    return SIZE if status.ok else -1


def bare_share(port: int, op: str, first: int, step: int, clients: int, start_at: float,
               warmup: float, duration: float, tag: str) -> dict:
    """Clients first, first + step, ... of a bare loop, in this process."""
    counts, moved, failures = [0] * clients, [0] * clients, [0] * clients
    measure_from, end_at = start_at + warmup, start_at + warmup + duration
    data = b"x" * SIZE

    def worker(index: int) -> None:
        server = f"root://{tag}{index:05d}@127.0.0.1:{port}"
        fs = client.FileSystem(server)
        fs.stat("/", timeout=60)  # log in before the clock, as the C++ loop does
        while (delay := start_at - time.time()) > 0:
            time.sleep(delay)
        n = 0
        while True:
            path = (f"{ROOT}/bare/put/{tag}{index:05d}-{n}" if op == "put"
                    else f"{ROOT}/bare/{op}-target")
            got = bare_request(fs, server, op, path, data)
            n += 1
            now = time.time()
            if now > end_at:
                return
            if now < measure_from:
                continue
            if got >= 0:
                counts[index] += 1
                moved[index] += got
            else:
                failures[index] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(first, clients, step)]
    for thread in threads:
        thread.start()
    while (delay := measure_from - time.time()) > 0:
        time.sleep(delay)
    cpu0 = sum(os.times()[:2])
    while (delay := end_at - time.time()) > 0:
        time.sleep(delay)
    cpu = sum(os.times()[:2]) - cpu0
    rss = psutil.Process().memory_info().rss / 1e6
    for thread in threads:
        thread.join(timeout=120)
    return {"ok": sum(counts), "bytes": sum(moved), "cpu_s": cpu, "rss_mb": rss,
            "failed": sum(failures)}


def loops_environment(processes: int) -> dict[str, str]:
    """The environment of a contender's processes: XrdCl's event loops per process as
    the engine's (grid.XROOTD_EVENT_LOOPS alone, XROOTD_SHARD_EVENT_LOOPS sharded),
    unless the user set XRD_PARALLELEVTLOOP."""
    loops = grid.XROOTD_EVENT_LOOPS if processes == 1 else grid.XROOTD_SHARD_EVENT_LOOPS
    return {**os.environ, "XRD_PARALLELEVTLOOP": os.environ.get("XRD_PARALLELEVTLOOP",
                                                                str(loops))}


def bare_point(port: int, op: str, clients: int, warmup: float, duration: float,
               tag: str) -> Point:
    processes = engine_processes(clients)
    start_at = time.time() + 3 + clients / 1000
    command = [sys.executable, __file__, "--bare-share", "--port", str(port), "--op", op,
               "--clients-one", str(clients), "--tag", tag, "--warmup", str(warmup),
               "--duration", str(duration), "--start-at", str(start_at),
               "--shares", str(processes)]
    runs = [subprocess.Popen([*command, "--share", str(i)], stdout=subprocess.PIPE, text=True,
                             env=loops_environment(processes))
            for i in range(processes)]
    parts = [json.loads(run.communicate(timeout=900)[0].strip().splitlines()[-1])
             for run in runs]
    return Point("bare", op, clients, sum(p["ok"] for p in parts) / duration,
                 sum(p["bytes"] for p in parts) / duration / 1e6,
                 sum(p["cpu_s"] for p in parts), duration, sum(p["rss_mb"] for p in parts),
                 processes, sum(p["failed"] for p in parts))


def cxx_point(binary: Path, port: int, op: str, clients: int, warmup: float,
              duration: float, tag: str, processes: int, mode: str = "threads") -> Point:
    path = {"stat": f"{ROOT}/bare/stat-target", "get": f"{ROOT}/bare/get-target",
            "put": f"{ROOT}/bare/put"}[op]
    done = subprocess.run(
        [str(binary), "--port", str(port), "--path", path, "--op", op, "--size", str(SIZE),
         "--clients", str(clients), "--processes", str(processes), "--warmup", str(warmup),
         "--duration", str(duration), "--tag", tag, "--mode", mode],
        capture_output=True, text=True, timeout=900, check=True,
        env=loops_environment(processes))
    data = json.loads(done.stdout.strip().splitlines()[-1])
    kind = "cxx-async" if mode == "async" else (
        "cxx" if processes > 1 or clients <= 200 else "cxx-1")
    return Point(kind, op, clients,
                 data["rate_hz"], data["mb_s"], data["cpu_s"], duration, data["rss_mb"],
                 processes, int(data["failed"]))


# -- orchestration ---------------------------------------------------------------------
def build_loop() -> Path:
    """Compile the C++ loop (Debian libxrootd-client-dev) into build/bench/."""
    BUILD.mkdir(parents=True, exist_ok=True)
    binary, source = BUILD / "xrdcl_loop", REPO / "benchmarks" / "xrdcl_loop.cc"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        if not Path("/usr/include/xrootd/XrdCl/XrdClFileSystem.hh").exists():
            sys.exit("the C++ loop needs the XrdCl headers: apt-get install "
                     "libxrootd-client-dev (scripts/bootstrap.sh installs it)")
        subprocess.run(["g++", "-O2", "-std=c++17", "-I/usr/include/xrootd", str(source),
                        "-o", str(binary), "-lXrdCl", "-lpthread"], check=True)
    return binary


def isolated(kind: str, port: int, op: str, clients: int, args, tag: str) -> Point:
    """An engine measurement in a fresh process."""
    command = [sys.executable, __file__, "--engine-one", "--port", str(port), "--op", op,
               "--clients-one", str(clients), "--tag", tag, "--warmup",
               str(warmup_for(clients)), "--duration", str(args.duration),
               "--client-loop", "python" if kind == "engine-py" else "compiled",
               "--clients-per-process", str(PER_PROCESS[0])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {op} C={clients} failed:\n{done.stderr[-3000:]}")
    return Point(**json.loads(done.stdout.strip().splitlines()[-1]))


def split_cores(server: EmbeddedXRootD) -> None:
    """Every thread of the server on the last usable core (threads it starts later
    inherit it), this process and every contender it starts on the others."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--split-cores needs at least 2 usable cores")
    for task in Path(f"/proc/{server.pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), {cores[-1]})
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
    os.sched_setaffinity(0, set(cores[:-1]))  # this thread: the contenders start from it


def prepare(server: EmbeddedXRootD) -> None:
    admin = client.FileSystem(f"root://ssbench@127.0.0.1:{server.port}")
    admin.mkdir(f"{ROOT}/bare/put", 1)  # MAKEPATH
    for name, size in (("stat-target", 1024), ("get-target", SIZE)):
        handle = client.File()
        handle.open(f"root://ssbench@127.0.0.1:{server.port}/{ROOT}/bare/{name}", 2 | 8)
        handle.write(b"x" * size)
        handle.close()


def forget_puts(server: EmbeddedXRootD) -> None:
    """The files a put measurement wrote (gigabytes): removed on the server's disk."""
    data = server.directory / "data" / ROOT.strip("/")
    put_dir = data / "bare" / "put"
    for entry in put_dir.iterdir():
        entry.unlink()
    for entry in data.iterdir():
        if entry.name != "bare":
            shutil.rmtree(entry, ignore_errors=True)


#: the server's crashes during the run (xrootd 5.5.3 has died of SIGSEGV under 5,000
#: put clients): each is restarted, the point measured again, and the docs say so
CRASHES: list[str] = []


def measure_point(kind: str, server, binary: Path, op: str, clients: int, args,
                  tag: str) -> Point:
    for attempt in (1, 2):
        try:
            point = _measure_point(kind, server, binary, op, clients, args, tag)
        except Exception:
            if attempt == 2 or not server.exit_note():
                raise
        died = server.exit_note()
        if not died:
            return point
        if attempt == 2:
            raise RuntimeError(f"the server crashed again in {kind} {op} C={clients}: {died}")
        CRASHES.append(f"{kind} {op} C={clients}: {died.split('. The last lines')[0]}")
        print(f"server crash, restarted; measuring again: {CRASHES[-1]}", flush=True)
        server.restart()
    raise AssertionError("unreachable")


def _measure_point(kind: str, server, binary: Path, op: str, clients: int, args,
                   tag: str) -> Point:
    warmup = warmup_for(clients)
    if kind in ("engine", "engine-py"):
        point = isolated(kind, server.port, op, clients, args, tag)
    elif kind == "bare":
        point = bare_point(server.port, op, clients, warmup, args.duration, tag)
    else:
        processes = 1 if kind == "cxx-1" else engine_processes(clients)
        point = cxx_point(binary, server.port, op, clients, warmup, args.duration, tag,
                          processes, "async" if kind == "cxx-async" else "threads")
    if op == "put":
        forget_puts(server)
    return point


def series(server, binary: Path, op: str, clients: int, args, counter: list[int]
           ) -> dict[str, list[Point]]:
    kinds = [k for k in KINDS if k in args.kinds.split(",")
             and (op == "stat" or k != "cxx-async")] + (
        ["cxx-1"] if op == "stat" and clients >= 1000 and "cxx" in args.kinds.split(",") else [])
    points: dict[str, list[Point]] = {kind: [] for kind in kinds}
    for round_number in range(args.rounds):
        order = kinds if round_number % 2 == 0 else kinds[::-1]
        for kind in order:
            counter[0] += 1
            tag = f"{kind[0]}{counter[0]:03d}"[:3]
            points[kind].append(measure_point(kind, server, binary, op, clients, args, tag))
    return points


def mean(points: list[Point], attribute: str) -> float:
    values = [getattr(p, attribute) for p in points]
    return sum(values) / len(values) if values else math.nan


def rows_for(op: str, clients: int, points: dict[str, list[Point]], load: float) -> dict:
    value = "mb_s" if op != "stat" else "rate"
    row = {"op": op, "clients": clients, "load": load}
    for kind, measured in points.items():
        row[kind] = mean(measured, value)
        row[f"{kind}_all"] = [round(getattr(p, value)) for p in measured]
        row[f"{kind}_cpu_us"] = mean(measured, "cpu_per_op_us")
        row[f"{kind}_rss"] = max((p.rss_mb for p in measured), default=math.nan)
        row[f"{kind}_procs"] = measured[0].processes if measured else 0
        row[f"{kind}_failed"] = sum(p.failed for p in measured)
    return row


def fmt(value: float, digits: int = 0) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"


def _with_failures(r: dict, kind: str) -> str:
    """The kind's mean, and its failed requests over all rounds when there were any."""
    unit = (" Hz" if r["op"] == "stat" else " MB/s") if kind == "engine" else ""
    failed = r.get(f"{kind}_failed", 0)
    return fmt(r.get(kind, math.nan)) + unit + (f" ({failed:,} failed)" if failed else "")


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| op | C | load avg | procs | engine | engine, Python loop | C++ loop | C++ async "
        "| bare Python | engine / C++ | engine / C++ async | engine / bare | CPU/op engine "
        "(us) | CPU/op Python loop | CPU/op C++ | CPU/op C++ async | CPU/op bare | engine RSS "
        "(MB) | C++ one process |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['clients']} | {r['load']:.1f} | {r['engine_procs']} | "
            f"{_with_failures(r, 'engine')} | {_with_failures(r, 'engine-py')} | "
            f"{_with_failures(r, 'cxx')} | {_with_failures(r, 'cxx-async')} | "
            f"{_with_failures(r, 'bare')} | "
            f"{fmt(r.get('engine', math.nan) / r.get('cxx', math.nan), 2)} | "
            f"{fmt(r.get('engine', math.nan) / r.get('cxx-async', math.nan), 2)} | "
            f"{fmt(r.get('engine', math.nan) / r.get('bare', math.nan), 2)} | "
            f"{fmt(r.get('engine_cpu_us', math.nan))} | "
            f"{fmt(r.get('engine-py_cpu_us', math.nan))} | "
            f"{fmt(r.get('cxx_cpu_us', math.nan))} | "
            f"{fmt(r.get('cxx-async_cpu_us', math.nan))} | {fmt(r.get('bare_cpu_us', math.nan))} | "
            f"{fmt(r.get('engine_rss', math.nan))} | {_with_failures(r, 'cxx-1')} |")
    return lines


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets, met or not, from this run's numbers (those measured)."""
    stat = {r["clients"]: r for r in rows if r["op"] == "stat"}
    lines = []

    def judge(text: str, value: float, target: float, at_least: bool = True) -> None:
        if value == value:  # not NaN: both kinds were measured
            met = value >= target if at_least else value <= target
            lines.append(f"- {text} = {value:.2f} (target {'>=' if at_least else '<='} "
                         f"{target}: {'met' if met else 'NOT met'})")

    def of(row: dict, key: str) -> float:
        return row.get(key, math.nan)

    for c in (50, 200, 1000):
        if c in stat:
            judge(f"stat at C={c}: engine / C++", of(stat[c], "engine") / of(stat[c], "cxx"),
                  0.9)
    if 5000 in stat and 200 in stat:
        judge("stat at C=5000 over C=200", of(stat[5000], "engine") / of(stat[200], "engine"),
              0.8)
        lines.append(f"- client RSS at C=5000 stat: {of(stat[5000], 'engine_rss'):.0f} MB "
                     f"(target < 2000)")
    for r in rows:
        if r["op"] == "get":
            judge(f"1 MB get at C={r['clients']}: engine / bare",
                  of(r, "engine") / of(r, "bare"), 0.9)
    if 50 in stat:
        judge("CPU per stat at C=50: engine / bare",
              of(stat[50], "engine_cpu_us") / of(stat[50], "bare_cpu_us"), 1.3, False)
    return lines


def write_docs(lines: list[str], markers: tuple[str, str] = MARKERS) -> None:
    """``lines`` into docs/benchmarks.md between ``markers`` (added at its end first)."""
    text = DOCS.read_text()
    start, end = markers
    if start not in text:
        text = text.rstrip() + f"\n\n{start}\n{end}\n"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    DOCS.write_text(head + start + "\n" + "\n".join(lines) + "\n" + end + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer points: stat at C = 10, 200, 5000, put and get at 10")
    parser.add_argument("--split-cores", action="store_true",
                        help="the server on the last core, every client on the others (the "
                             "client side's own scaling, without the server's share of "
                             "the cores; Linux)")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default="1,10,50,200,1000,5000")
    parser.add_argument("--ops", default="stat,put,get")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="which loops to measure (default all): " + ", ".join(KINDS))
    parser.add_argument("--clients-per-process", type=int, default=0,
                        help="the most clients per process for every contender (default: "
                             "the xrootd driver's clients_per_process)")
    parser.add_argument("--write-docs", action="store_true")
    for hidden in ("--engine-one", "--bare-share"):
        parser.add_argument(hidden, action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--port", "--clients-one", "--share", "--shares"):
        parser.add_argument(hidden, type=int, help=argparse.SUPPRESS)
    for hidden in ("--warmup", "--start-at"):
        parser.add_argument(hidden, type=float, help=argparse.SUPPRESS)
    parser.add_argument("--op", help=argparse.SUPPRESS)
    parser.add_argument("--client-loop", default="compiled", help=argparse.SUPPRESS)
    parser.add_argument("--tag", help=argparse.SUPPRESS)
    args = parser.parse_args()
    PER_PROCESS[0] = args.clients_per_process
    if args.engine_one:
        url = f"root://127.0.0.1:{args.port}/{ROOT}"
        point = engine_point(url, args.op, args.clients_one, args.warmup, args.duration,
                             args.tag, args.client_loop)
        print(json.dumps(asdict(point)), flush=True)
        return
    if args.bare_share:
        print(json.dumps(bare_share(args.port, args.op, args.share, args.shares,
                                    args.clients_one, args.start_at, args.warmup,
                                    args.duration, args.tag)), flush=True)
        return
    plan = [(op, int(c)) for op in args.ops.split(",") for c in args.clients.split(",")]
    if args.quick:
        args.rounds, args.duration = 1, 3.0
        plan = [("stat", 10), ("stat", 200), ("stat", 5000), ("put", 10), ("get", 10)]
    binary = build_loop()
    rows, counter = [], [0]
    with EmbeddedXRootD(https=False) as server:
        if args.split_cores:
            split_cores(server)
        prepare(server)
        for op, clients in plan:
            load = os.getloadavg()[0]
            points = series(server, binary, op, clients, args, counter)
            row = rows_for(op, clients, points, load)
            rows.append(row)
            print(f"{op} C={clients} (load {load:.1f}): " + ", ".join(
                f"{kind} {row[f'{kind}_all']}" for kind in points), flush=True)
    mode = "--quick" if args.quick else f"{args.rounds} rounds"
    if args.split_cores:
        mode += (", --split-cores (the server on its own core, every client on the "
                 f"other{'s' if len(os.sched_getaffinity(0)) > 1 else ''})")
    lines = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {os.cpu_count()} cores, xrootd "
        f"{server.version} on loopback, {mode}, {args.duration:g} s per measurement after a "
        f"warm-up of max(2 s, C / 500 s); load avg = the 1-minute load average before each "
        f"series; stat in operations/s, put and get (1 MB files) in MB/s; CPU/op = user + "
        f"system CPU of the client processes over the measured window per operation; RSS "
        f"= resident memory of all client processes (the engine's parent included); "
        f"XrdCl event loops per client process, every contender alike: "
        + (f"{os.environ['XRD_PARALLELEVTLOOP']} (XRD_PARALLELEVTLOOP)."
           if grid.XROOTD_USER_EVENT_LOOPS else
           f"{grid.XROOTD_EVENT_LOOPS} in one process, {grid.XROOTD_SHARD_EVENT_LOOPS} in "
           f"each process of a sharded step."),
        "", *table(rows), "", *targets(rows),
        *(["", "The server crashed during the run and was restarted; the point it crashed "
            "in (or the next one) was measured again:", "",
            *(f"- {crash}" for crash in CRASHES)] if CRASHES else []),
    ]
    print("\n".join(lines))
    if args.write_docs:
        write_docs(lines)


if __name__ == "__main__":
    main()
