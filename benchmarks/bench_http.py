"""HTTP/WebDAV stat (PROPFIND Depth 0) rates: the http driver against the physical limit.

Against the embedded xrootd's davs:// door (XrdHttp, TLS verified against its
throwaway CA), for C = 1, 10, 50 clients, each contender in a fresh process, side by
side in one run and alternated over rounds:

- ``h2load``: nghttp2's load generator in C (HTTP/1.1, ``-c C``, one keep-alive
  connection per client; it does not verify TLS), the physical limit of the door;
- bare loops of each candidate library, one keep-alive connection per client, each
  reading the whole 207 answer and nothing more: ``http.client`` / ``urllib3`` /
  ``pycurl`` easy handles in C threads, ``pycurl-multi`` (C easy handles on one
  multi handle in one thread), ``aiohttp`` and ``httpx`` (C tasks on one event loop,
  each with its own one-connection client; measured only when importable, e.g.
  ``PYTHONPATH=/tmp/site`` after ``pip install --target /tmp/site aiohttp httpx``);
- ``driver-http``: this package's http driver, C clients in threads calling
  ``stat`` (parsing the answer into a StatInfo), the plugin's way;
- ``engine-http``: the plugin's engine (``run_step`` of the ``stat`` operation with
  the http driver: hang detection, histograms, timeline), what a suite measures;
- ``driver-gfal2``: the gfal2 driver the same way (what ``gfal-*`` users feel);
- ``driver-http@REV`` (with ``--baseline REV``): the http driver as it was in git
  revision ``REV``, the same way: a change's before and after, side by side.

Each rate is successes / measured seconds after a warm-up (connections made and
TLS done before the clock runs); the child process's CPU (user + system) per
operation is printed too. Prints a Markdown table (docs/benchmarks.md quotes it).
Usage::

    .venv/bin/python benchmarks/bench_http.py --quick        # ~1 minute
    .venv/bin/python benchmarks/bench_http.py --rounds 2 --duration 5
    .venv/bin/python benchmarks/bench_http.py --only pycurl,driver-http --baseline HEAD~1
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import io
import json
import os
import re
import resource
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

PROPFIND_HEADERS = {"Depth": "0"}
CONTENDERS = ("h2load", "http.client", "urllib3", "pycurl", "pycurl-multi", "aiohttp",
              "httpx", "driver-http", "engine-http", "driver-gfal2")


@dataclass(frozen=True)
class Target:
    """What every contender stats: one file on the door, and the CA to trust."""

    host: str
    port: int
    path: str
    ca_dir: str

    @property
    def https(self) -> str:
        return f"https://{self.host}:{self.port}{self.path}"

    @property
    def davs(self) -> str:
        return f"davs://{self.host}:{self.port}{self.path}"


@dataclass(frozen=True)
class Measure:
    contender: str
    clients: int
    rate: float
    cpu_per_op_us: float
    operations: int
    note: str = ""


# -- the contenders (each runs in its own process) ------------------------------------
class Clock:
    """Shared start and end of the measured window; counts per client."""

    def __init__(self, clients: int, warmup: float, duration: float) -> None:
        self.counts = [0] * clients
        self.errors: list[str] = []
        self.warmup, self.duration = warmup, duration
        self.start()

    def start(self) -> None:
        """The window starts a warm-up from now (again after a contender's set-up)."""
        self.begin = time.monotonic() + self.warmup
        self.end = self.begin + self.duration

    def tick(self, index: int) -> bool:
        """Count one success (inside the window); False when the window is over."""
        now = time.monotonic()
        if now >= self.end:
            return False
        if now >= self.begin:
            self.counts[index] += 1
        return True


def context(target: Target) -> ssl.SSLContext:
    return ssl.create_default_context(capath=target.ca_dir)


def threads(clients: int, clock: Clock, make: Callable[[int], Callable[[], None]]) -> None:
    """C threads, each with its own client (made before the clock runs)."""
    ops = [make(i) for i in range(clients)]
    for op in ops:
        op()  # connect and TLS before the window
    clock.start()

    def loop(index: int) -> None:
        op = ops[index]
        while True:
            try:
                op()
            except Exception as exc:  # noqa: BLE001 - counted and shown, not fatal
                clock.errors.append(str(exc)[:200])
                if len(clock.errors) > 100:
                    return
            if not clock.tick(index):
                return
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def run_http_client(target: Target, clients: int, clock: Clock) -> None:
    import http.client

    def make(_: int):
        connection = http.client.HTTPSConnection(target.host, target.port,
                                                 context=context(target), timeout=30)

        def op() -> None:
            connection.request("PROPFIND", target.path, headers=PROPFIND_HEADERS)
            response = connection.getresponse()
            response.read()
            assert response.status == 207, response.status
        return op
    threads(clients, clock, make)


def run_urllib3(target: Target, clients: int, clock: Clock) -> None:
    import urllib3

    def make(_: int):
        pool = urllib3.HTTPSConnectionPool(target.host, target.port, maxsize=1, block=True,
                                           ssl_context=context(target), retries=False,
                                           timeout=urllib3.Timeout(30))

        def op() -> None:
            response = pool.request("PROPFIND", target.path, headers=PROPFIND_HEADERS)
            assert response.status == 207, response.status
        return op
    threads(clients, clock, make)


def curl_handle(target: Target):
    import pycurl

    handle = pycurl.Curl()
    handle.setopt(pycurl.URL, target.https)
    handle.setopt(pycurl.CUSTOMREQUEST, "PROPFIND")
    handle.setopt(pycurl.HTTPHEADER, ["Depth: 0"])
    handle.setopt(pycurl.CAPATH, target.ca_dir)
    handle.setopt(pycurl.TIMEOUT_MS, 30_000)
    handle.setopt(pycurl.NOSIGNAL, 1)
    return handle


def run_pycurl(target: Target, clients: int, clock: Clock) -> None:
    import pycurl

    def make(_: int):
        handle = curl_handle(target)

        def op() -> None:
            body = io.BytesIO()
            handle.setopt(pycurl.WRITEFUNCTION, body.write)
            handle.perform()
            assert handle.getinfo(pycurl.RESPONSE_CODE) == 207
        return op
    threads(clients, clock, make)


def run_pycurl_multi(target: Target, clients: int, clock: Clock) -> None:
    import pycurl

    multi = pycurl.CurlMulti()
    handles = [curl_handle(target) for _ in range(clients)]

    def start(index: int) -> None:
        handle = handles[index]
        handle.body = io.BytesIO()
        handle.setopt(pycurl.WRITEFUNCTION, handle.body.write)
        handle.index = index
        multi.add_handle(handle)
    for index in range(clients):
        start(index)
    running = clients
    while running:
        while multi.perform()[0] == pycurl.E_CALL_MULTI_PERFORM:
            pass
        multi.select(1.0)
        while True:
            queued, done, failed = multi.info_read()
            for handle in done:
                multi.remove_handle(handle)
                assert handle.getinfo(pycurl.RESPONSE_CODE) == 207
                if clock.tick(handle.index):
                    start(handle.index)
                else:
                    running -= 1
            if failed:
                raise RuntimeError(f"pycurl-multi: {failed[0][1:]}")
            if not queued:
                break


def run_aiohttp(target: Target, clients: int, clock: Clock) -> None:
    import aiohttp

    async def client(index: int) -> None:
        connector = aiohttp.TCPConnector(limit=1, ssl=context(target))
        async with aiohttp.ClientSession(connector=connector) as session:
            while True:
                async with session.request("PROPFIND", target.https,
                                           headers=PROPFIND_HEADERS) as response:
                    await response.read()
                    assert response.status == 207
                if not clock.tick(index):
                    return

    async def main() -> None:
        await asyncio.gather(*(client(i) for i in range(clients)))
    asyncio.run(main())


def run_httpx(target: Target, clients: int, clock: Clock) -> None:
    import httpx

    async def client(index: int) -> None:
        limits = httpx.Limits(max_connections=1)
        async with httpx.AsyncClient(verify=context(target), limits=limits) as session:
            while True:
                response = await session.request("PROPFIND", target.https,
                                                 headers=PROPFIND_HEADERS)
                assert response.status_code == 207
                if not clock.tick(index):
                    return

    async def main() -> None:
        await asyncio.gather(*(client(i) for i in range(clients)))
    asyncio.run(main())


def baseline_driver(revision: str) -> type:
    """The http driver class of git revision ``revision`` (its module loaded under
    another name, next to this checkout's)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    name = "pytest_storagescale.drivers._http_baseline"
    folder = "pytest_storagescale/drivers/http"
    listed = subprocess.run(["git", "-C", root, "ls-tree", "--name-only", f"{revision}:{folder}"],
                            capture_output=True, text=True)
    if listed.returncode == 0:  # a package (drivers/http/): its files, imported as one
        where = tempfile.mkdtemp(prefix="http-baseline-")
        for file in listed.stdout.split():
            with open(os.path.join(where, file), "w") as stream:
                stream.write(subprocess.run(
                    ["git", "-C", root, "show", f"{revision}:{folder}/{file}"],
                    capture_output=True, text=True, check=True).stdout)
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(where, "__init__.py"), submodule_search_locations=[where])
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        try:
            spec.loader.exec_module(package)  # imports each of its modules
        finally:
            shutil.rmtree(where, ignore_errors=True)
        return package.HTTPDriver
    source = subprocess.run(
        ["git", "-C", root, "show", f"{revision}:pytest_storagescale/drivers/http.py"],
        capture_output=True, text=True, check=True).stdout
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, None))
    sys.modules[name] = module
    exec(compile(source, f"{revision}:pytest_storagescale/drivers/http.py", "exec"),
         module.__dict__)
    return module.HTTPDriver


def run_driver(name: str, target: Target, clients: int, clock: Clock) -> None:
    from pytest_storagescale.drivers.registry import driver_spec

    name, _, revision = name.removeprefix("driver-").partition("@")
    spec = driver_spec(target.davs, driver=name, options={"ca_dir": target.ca_dir})
    cls = baseline_driver(revision) if revision else spec.driver_class

    def make(index: int):
        driver = cls(spec.endpoint, client_id=f"client{index}", timeout=30,
                     options=spec.options)

        def op() -> None:
            assert not driver.stat(target.path).is_dir
        return op
    threads(clients, clock, make)


def run_engine(target: Target, clients: int, clock: Clock) -> None:
    """One engine step; its successes go into the clock's counts."""
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.load.engine import run_step
    from pytest_storagescale.load.operations import get_operation
    from pytest_storagescale.load.plan import StepPlan

    root = f"{target.path.rpartition('/')[0]}/bench-engine-{os.getpid()}"
    warmup, duration = clock.begin - time.monotonic(), clock.end - clock.begin
    result = run_step(StepPlan(
        operation=get_operation("stat"), clients=clients, duration=duration,
        warmup=max(0.0, warmup), hang_timeout=30, workdir=f"{root}/step",
        driver=driver_spec(target.davs, writable_root=root, options={"ca_dir": target.ca_dir}),
    ))
    clock.counts[0] = result.total.succeeded
    clock.errors.extend(f"{result.total.failed} failed" for _ in [0] if result.total.failed)


#: what each contender imports, before its CPU is measured
LIBRARIES = {
    "http.client": ("http.client",), "urllib3": ("urllib3",), "pycurl": ("pycurl",),
    "pycurl-multi": ("pycurl",), "aiohttp": ("aiohttp",), "httpx": ("httpx",),
    "driver-http": ("pytest_storagescale.drivers.registry", "pytest_storagescale.drivers.http"),
    "engine-http": ("pytest_storagescale.drivers.registry", "pytest_storagescale.drivers.http",
                    "pytest_storagescale.load.engine", "pytest_storagescale.load.operations"),
    "driver-gfal2": ("pytest_storagescale.drivers.registry", "gfal2"),
}
RUNNERS: dict[str, Callable[[Target, int, Clock], None]] = {
    "http.client": run_http_client, "urllib3": run_urllib3, "pycurl": run_pycurl,
    "pycurl-multi": run_pycurl_multi, "aiohttp": run_aiohttp, "httpx": run_httpx,
    "driver-http": lambda t, c, k: run_driver("http", t, c, k),
    "engine-http": run_engine,
    "driver-gfal2": lambda t, c, k: run_driver("gfal2", t, c, k),
}


def child(contender: str, target: Target, clients: int, warmup: float,
          duration: float) -> Measure:
    """Run one contender in this process and measure it."""
    # the library's imports (0.1 s of CPU for the plugin's) stay out of the CPU measured
    for module in LIBRARIES.get(contender.partition("@")[0], ()):
        importlib.import_module(module)
    clock = Clock(clients, warmup, duration)
    before = resource.getrusage(resource.RUSAGE_SELF)
    runner = (functools.partial(run_driver, contender) if contender.startswith("driver-http@")
              else RUNNERS[contender])
    runner(target, clients, clock)
    after = resource.getrusage(resource.RUSAGE_SELF)
    operations = sum(clock.counts)
    # CPU over the whole run (set-up and warm-up too, not the imports): an upper bound
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    total = operations * (warmup + duration) / duration
    errors = f"{len(clock.errors)} errors, e.g. {clock.errors[0]}" if clock.errors else ""
    return Measure(contender, clients, operations / duration,
                   1e6 * cpu / total if total else float("nan"), operations, errors)


def h2load(target: Target, clients: int, warmup: float, duration: float) -> Measure:
    command = ["h2load", "--h1", "-c", str(clients), "-D", f"{int(duration * 1000)}ms",
               "--warm-up-time", f"{max(1, int(warmup * 1000))}ms",
               "-H", ":method: PROPFIND", "-H", "Depth: 0", target.https]
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=warmup + duration + 60)
    rate = re.search(r"finished in .*?, ([\d.]+) req/s", done.stdout)
    requests = re.search(r"requests: .*?(\d+) succeeded, (\d+) failed", done.stdout)
    codes = re.search(r"status codes: (\d+) 2xx", done.stdout)
    if not (rate and requests and codes):
        raise RuntimeError(f"h2load: {done.stdout[-500:]} {done.stderr[-300:]}")
    failed = int(requests.group(2))
    # requests still in flight when the duration ends count as failed
    return Measure("h2load", clients, float(rate.group(1)), float("nan"), int(codes.group(1)),
                   note=f"{failed} failed (in flight at the end)" if failed else "")


def measure(contender: str, target: Target, clients: int, warmup: float,
            duration: float) -> Measure | None:
    """One contender at C clients, in a fresh process (None: not installed)."""
    if contender == "h2load":
        return h2load(target, clients, warmup, duration) if shutil.which("h2load") else None
    command = [sys.executable, __file__, "--child", contender, "--clients", str(clients),
               "--warmup", str(warmup), "--duration", str(duration),
               "--target", json.dumps(target.__dict__)]
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=warmup + duration + 120, env=os.environ)
    if done.returncode == 3:  # the library is not importable
        return None
    if done.returncode != 0:
        raise RuntimeError(f"{contender} C={clients}: {done.stderr[-1500:]}")
    return Measure(**json.loads(done.stdout.strip().splitlines()[-1]))


def prepare(server) -> Target:
    """A 1 kB file on the door, written over HTTPS: what every contender stats."""
    import http.client

    parts = urlsplit(server.https_url)
    path = f"{parts.path}/bench-http-stat"
    target = Target(parts.hostname, parts.port, path, server.ca_dir)
    connection = http.client.HTTPSConnection(target.host, target.port,
                                             context=context(target), timeout=30)
    connection.request("PUT", path, body=b"x" * 1000)
    response = connection.getresponse()
    response.read()
    if response.status not in (200, 201, 204):
        raise RuntimeError(f"PUT {path}: HTTP {response.status}")
    connection.close()
    return target


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f}/{five:.2f}"


def table(results: dict[tuple[str, int], list[Measure]], clients: list[int],
          contenders: list[str]) -> str:
    """The Markdown table: the range over rounds, the ratios of the median rounds to
    h2load and to pycurl, the median CPU per operation."""
    def median(key):  # the median round: a round a burst of other load hit stays out
        values = [m.rate for m in results.get(key, [])]
        return statistics.median(values) if values else None

    lines = ["| stat/s (PROPFIND) | " + " | ".join(f"C={c}" for c in clients) + " |",
             "|---|" + "---|" * len(clients)]
    for contender in contenders:
        cells = []
        for c in clients:
            runs = results.get((contender, c))
            if not runs:
                cells.append("")
                continue
            rates = sorted(m.rate for m in runs)
            text = (f"{rates[0]:,.0f}" if len(rates) == 1 or rates[0] == rates[-1]
                    else f"{rates[0]:,.0f}-{rates[-1]:,.0f}")
            cpu = [m.cpu_per_op_us for m in runs if m.cpu_per_op_us == m.cpu_per_op_us]
            if cpu:
                text += f" ({statistics.median(cpu):,.0f} µs CPU/op)"
            h2, own, bare = median(("h2load", c)), median((contender, c)), median(("pycurl", c))
            if h2 and contender != "h2load":
                text += f", {own / h2:.2f}×h2load"
            if bare and contender.startswith(("driver-http", "engine-http")):
                text += f", {own / bare:.2f}×pycurl"
            cells.append(text)
        if any(cells):
            lines.append(f"| {contender} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round of 2 s per contender")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--clients", default="1,10,50")
    parser.add_argument("--only", default="", help="comma-separated contenders")
    parser.add_argument("--baseline", metavar="REV", help="also the http driver of git "
                        "revision REV (driver-http@REV), right after driver-http")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        try:
            result = child(args.child, Target(**json.loads(args.target)), int(args.clients),
                           args.warmup, args.duration)
        except ImportError:
            sys.exit(3)
        print(json.dumps(result.__dict__))
        return
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 2.0, 0.5
    clients = [int(c) for c in args.clients.split(",")]
    contenders = [c for c in CONTENDERS if not args.only or c in args.only.split(",")]
    if args.baseline:
        subprocess.run(["git", "rev-parse", "--verify", f"{args.baseline}^{{commit}}"],
                       check=True, capture_output=True,
                       cwd=os.path.dirname(os.path.abspath(__file__)))
        at = contenders.index("driver-http") + 1 if "driver-http" in contenders else 0
        contenders.insert(at, f"driver-http@{args.baseline}")
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    results: dict[tuple[str, int], list[Measure]] = {}
    loads = []
    with EmbeddedXRootD(https=True) as server:
        target = prepare(server)
        print(f"xrootd {server.version}, {target.https}, {os.cpu_count()} cores, "
              f"load average at start {load_average()}", file=sys.stderr)
        for round_ in range(args.rounds):
            order = contenders if round_ % 2 == 0 else contenders[::-1]
            for c in clients:
                loads.append(os.getloadavg()[0])
                for contender in order:
                    result = measure(contender, target, c, args.warmup, args.duration)
                    if result is None:
                        continue
                    results.setdefault((contender, c), []).append(result)
                    print(f"round {round_ + 1} C={c} {contender}: {result.rate:,.0f}/s "
                          f"({result.cpu_per_op_us:,.0f} µs CPU/op, "
                          f"{result.operations} ops) load {load_average()} {result.note}",
                          file=sys.stderr, flush=True)
    print(table(results, clients, contenders))
    print(f"\n{args.rounds} round(s) of {args.duration:g} s after "
          f"{args.warmup:g} s warm-up; 1-minute load average before each series "
          f"{min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores.")


if __name__ == "__main__":
    main()
