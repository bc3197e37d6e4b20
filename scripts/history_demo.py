"""The history of runs end to end (issue 37's "done when"; ``make history-demo``).

A sequence of real runs of ``suites/xrootd``'s stat scan, each against an embedded
xrootd started here, fills one SQLite history (``--storage-history``) and pushes each
step to a real Pushgateway (Debian's ``prometheus-pushgateway``) that a real Prometheus
(Debian's ``prometheus``) scrapes, both started on loopback in the run's folder:

    1-3   XRootD 5.5.3 (Debian's)
    4-6   XRootD 6.2.1 (built into ~/.cache by scripts/build-xrootd6.sh)
    7     XRootD 6.2.1, deliberately slowed: the server's process in a cgroup whose CPU
          is capped (cgroup v1 ``cpu.cfs_quota_us``, or v2 ``cpu.max``) at CPU_CAP of
          one core
    8     XRootD 6.2.1 again

Then ``storagescale history`` prints the per-release table, draws the curves (PNG and
HTML) and must name the slowed run (its run id and version) as a change point to the
worse; Prometheus's HTTP API is asked for the last run's stat rate per version (equal
to that run's results file), and each panel query of the shipped Grafana dashboard
(docs/examples/grafana-storagescale.json) must return series.

``--dcache`` (``make history-demo HISTORY_DCACHE=1``) then adds a run of suites/dcache's
namespace scan (ls, plan scale 0.2) on each cached embedded dCache release, into the
same history and Pushgateway: a series of its own (storage ``dcache``); a run whose
dCache did not start makes the exit status 1.

Exit status: 0 when the history named the slowed run at one client count at least and
Prometheus answered both versions with the last runs' rates and every panel returned
series; 1 otherwise; 4 when something it needs is missing (root for the cgroup, the
built 6.2.1, the Debian packages), said in one paragraph.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "examples" / "grafana-storagescale.json"
#: the slowed run's share of one core
CPU_CAP = 0.05
#: (label, release requested, slowed)
#: (three runs a release: with two, on this busy machine, the noise of a step's rate
#: between two runs of one release, up to 5x, hid the slowed run at some client counts)
SEQUENCE = (*(("5.5.3", None, False),) * 3, *(("6.2.1", "6.2.1", False),) * 3,
            ("6.2.1", "6.2.1", True), ("6.2.1", "6.2.1", False))


class Missing(Exception):
    """Something the demo needs is not on this machine: exit 4."""


# -- the CPU cap ---------------------------------------------------------------------

def _cgroup_parent() -> tuple[Path, str]:
    """Where a CPU-capped cgroup can be made: (folder, 'v1' or 'v2')."""
    if os.geteuid() != 0:
        raise Missing("the slowed run caps the server's CPU with a cgroup, which needs root: "
                      "run make history-demo as root (as make setup is).")
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").is_file():
        return v1, "v1"
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.controllers"
    if controllers.is_file() and "cpu" in controllers.read_text().split():
        with contextlib.suppress(OSError):
            (v2 / "cgroup.subtree_control").write_text("+cpu")
        return v2, "v2"
    raise Missing("no cgroup CPU controller is mounted (/sys/fs/cgroup/cpu of cgroup v1, or "
                  "cgroup v2 with cpu in cgroup.controllers): the slowed run cannot be "
                  "slowed. Run on a host or container with the cpu controller.")


@contextlib.contextmanager
def cpu_capped(pids: list[int], share: float) -> Iterator[str]:
    """``pids`` (all their threads) in a new cgroup capped at ``share`` of one core
    while the block runs; the cgroup is removed after (its processes moved back)."""
    parent, kind = _cgroup_parent()
    group = parent / f"storagescale-history-demo-{os.getpid()}"
    group.mkdir()
    period = 100_000
    quota = max(1000, int(share * period))
    try:
        if kind == "v1":
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {period}")
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        yield f"cgroup {kind} {group} ({quota} us of CPU per {period} us)"
    finally:
        for _ in range(50):  # the server's processes back to the parent, then rmdir
            left = (group / "cgroup.procs").read_text().split()
            for pid in left:
                with contextlib.suppress(OSError):
                    (parent / "cgroup.procs").write_text(pid)
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)


# -- Pushgateway and Prometheus -------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - loopback
        return bytes(answer.read())


def _ready(url: str, process: subprocess.Popen, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise Missing(f"{process.args[0]} exited {process.returncode} at its start: see "
                          f"its log in the run's folder.")
        try:
            _get(url)
            return
        except OSError:
            time.sleep(0.2)
    raise Missing(f"{url} did not answer within {deadline_s} s.")


@contextlib.contextmanager
def monitoring(folder: Path) -> Iterator[tuple[str, str]]:
    """A Pushgateway and a Prometheus scraping it every second, on loopback, their data
    in ``folder``: (gateway URL, Prometheus URL)."""
    for command in ("prometheus", "prometheus-pushgateway"):
        if shutil.which(command) is None:
            raise Missing(f"{command} is not installed: make setup installs it (Debian "
                          f"package {command}).")
    gateway_port, prometheus_port = _free_port(), _free_port()
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: pushgateway\n"
        "    honor_labels: true\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{gateway_port}']}}]\n")
    log = (folder / "monitoring.log").open("wb")
    processes = [
        subprocess.Popen(["prometheus-pushgateway",
                          f"--web.listen-address=127.0.0.1:{gateway_port}",
                          f"--persistence.file={folder / 'pushgateway.data'}"],
                         stdout=log, stderr=log, start_new_session=True),
        subprocess.Popen(["prometheus", f"--config.file={config}",
                          f"--storage.tsdb.path={folder / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                         stdout=log, stderr=log, start_new_session=True),
    ]
    try:
        _ready(f"http://127.0.0.1:{gateway_port}/-/ready", processes[0])
        _ready(f"http://127.0.0.1:{prometheus_port}/-/ready", processes[1])
        yield f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{prometheus_port}"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        log.close()


def query(prometheus: str, promql: str) -> list[dict]:
    """Prometheus's HTTP API: the instant vector of ``promql``."""
    answer = json.loads(_get(f"{prometheus}/api/v1/query?"
                             f"{urllib.parse.urlencode({'query': promql})}"))
    if answer.get("status") != "success":
        raise RuntimeError(f"Prometheus answered {answer}")
    return list(answer["data"]["result"])


def dashboard_queries(storage: str, operation: str) -> list[tuple[str, str]]:
    """Each panel's PromQL of the shipped dashboard, its variables set as Grafana would
    (``$storage`` one value; ``$operation`` and ``$clients`` "All": ``.*``)."""
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", ()):
            promql = (target["expr"].replace("$storage", storage)
                      .replace("$operation", operation).replace("$clients", ".*"))
            found.append((panel["title"], promql))
    return found


# -- the runs -------------------------------------------------------------------------

def _run(number: int, label: str, requested: str | None, slowed: bool, folder: Path,
         history: Path, gateway: str, scale: str) -> dict:
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    server = EmbeddedXRootD(https=False, tpc=False)
    if requested is not None:
        server.requested_version = requested
    results = folder / f"run{number}.json"
    with server:
        command = [sys.executable, "-m", "pytest", "suites/xrootd/test_xrootd_scalability.py",
                   "-k", "test_stat_scan", "-p", "no:cacheprovider", "-q",
                   f"--storage-endpoint={server.url}", f"--storage-version={server.version}",
                   f"--storage-scale={scale}", f"--storage-results={results}",
                   f"--storage-history={history}", f"--storage-pushgateway={gateway}"]
        began = time.monotonic()
        with cpu_capped(server.server_pids(), CPU_CAP) if slowed else \
                contextlib.nullcontext("") as cap:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                  timeout=900, check=False)
        took = time.monotonic() - began
    (folder / f"run{number}.log").write_text(done.stdout + done.stderr)
    if not results.is_file():
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise RuntimeError(f"run {number}: no results file (pytest exit {done.returncode})")
    document = json.loads(results.read_text())
    rates = ", ".join(f"{step['clients']} clients {step['rate_hz']:,.0f} Hz"
                      for step in document["steps"])
    said = [line for line in done.stdout.splitlines()
            if line.startswith(("history:", "pushgateway:", "storagescale:"))]
    print(f"run {number}: xrootd {server.version}{' SLOWED by ' + cap if slowed else ''}: "
          f"pytest exit {done.returncode} in {took:.0f} s; {rates}", flush=True)
    for line in said:
        print(f"    {line}", flush=True)
    if label != server.version:
        raise RuntimeError(f"run {number}: the server said {server.version}, not {label}")
    return document


def _run_dcache(number: int, release: str, folder: Path, history: Path, gateway: str,
                scale: str) -> dict | None:
    """A run of suites/dcache's namespace scan (ls) on the embedded dCache ``release``
    (the plugin starts it: minutes), into the same history and Pushgateway."""
    results = folder / f"run{number}.json"
    command = [sys.executable, "-m", "pytest", "suites/dcache/test_dcache_scalability.py",
               "-k", "test_namespace_scan", "-p", "no:cacheprovider", "-q",
               "--storage-embedded=dcache", f"--storage-embedded-version={release}",
               f"--storage-scale={scale}", f"--storage-results={results}",
               f"--storage-history={history}", f"--storage-pushgateway={gateway}"]
    began = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=3600,
                          check=False)
    took = time.monotonic() - began
    (folder / f"run{number}.log").write_text(done.stdout + done.stderr)
    if not results.is_file():
        print(f"run {number}: dcache {release}: NO results (pytest exit {done.returncode} "
              f"in {took:.0f} s; see {folder / f'run{number}.log'})", flush=True)
        return None
    document = json.loads(results.read_text())
    rates = ", ".join(f"{step['clients']} clients {step['rate_hz']:,.0f} Hz"
                      for step in document["steps"] if step.get("rate_hz") is not None)
    print(f"run {number}: dcache {document['run'].get('version')}: pytest exit "
          f"{done.returncode} in {took:.0f} s (its start included); ls {rates}", flush=True)
    for line in done.stdout.splitlines():
        if line.startswith(("history:", "pushgateway:")):
            print(f"    {line}", flush=True)
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=ROOT / "storagescale-results" /
                        "history-demo", help="the run's folder (emptied first)")
    parser.add_argument("--scale", default="1", help="--storage-scale of each run (1: the "
                        "plans' 5 s steps)")
    parser.add_argument("--dcache", action="store_true", help="then a run of suites/dcache's "
                        "namespace scan on each cached embedded dCache release (at plan scale "
                        "0.2; each start takes minutes)")
    arguments = parser.parse_args(argv)
    from pytest_storagescale.servers.xrootd_releases import BUILT_VERSION, built_prefix

    folder = arguments.folder.resolve()
    try:
        if built_prefix() is None:
            raise Missing(f"XRootD {BUILT_VERSION} is not built: make setup builds it into "
                          f"~/.cache (15-30 min once).")
        _cgroup_parent()
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        history = folder / "history.sqlite"
        began = time.monotonic()
        with monitoring(folder) as (gateway, prometheus):
            documents = [_run(number, label, requested, slowed, folder, history, gateway,
                              arguments.scale)
                         for number, (label, requested, slowed) in enumerate(SEQUENCE, 1)]
            dcache_good = True
            if arguments.dcache:
                from pytest_storagescale.servers.dcache import cached_releases

                for number, release in enumerate(sorted(cached_releases()),
                                                 len(SEQUENCE) + 1):
                    dcache_good &= _run_dcache(number, release, folder, history, gateway,
                                               "0.2") is not None
            good = _judge(folder, history, prometheus, documents) and dcache_good
        print(f"history-demo: {len(documents)} runs and the checks in "
              f"{time.monotonic() - began:.0f} s; verdict "
              f"{'as expected' if good else 'NOT as expected'}")
        return 0 if good else 1
    except Missing as exc:
        print(f"history-demo: NOT RUN: {exc}", file=sys.stderr)
        return 4


def _judge(folder: Path, history: Path, prometheus: str, documents: list[dict]) -> bool:
    slowed = next(number for number, item in enumerate(SEQUENCE, 1) if item[2])
    slowed_id = documents[slowed - 1]["run"]["run_id"]
    began = time.monotonic()
    shown = subprocess.run([str(Path(sys.executable).parent / "storagescale"), "history",
                            str(history), "--html", str(folder / "page"), "--png",
                            str(folder / "png")], cwd=ROOT, capture_output=True, text=True,
                           timeout=600, check=False)
    print(f"\n$ storagescale history {history} --html {folder / 'page'} --png "
          f"{folder / 'png'}   (exit status {shown.returncode}, "
          f"{time.monotonic() - began:.0f} s)")
    print(shown.stdout + shown.stderr)
    named = re.findall(rf"change point: (?:rate_hz|p99_s) moved [\d.]+x .* at run {slowed} "
                       rf"\({re.escape(slowed_id)}, version 6\.2\.1\): WORSE", shown.stdout)
    found = bool(named) and shown.returncode == 1
    print(f"the slowed run (run {slowed}, {slowed_id}) named as a change point to the worse "
          f"{len(named)} times (rate or p99, over {len(documents[0]['steps'])} stat steps): "
          f"{'yes' if found else 'NO'}")

    # Prometheus: the last run's stat rate per version, as its results file says
    last = {}
    for document in documents:
        last[document["run"]["version"]] = {step["clients"]: step["rate_hz"]
                                            for step in document["steps"]}
    clients = max(set.intersection(*(set(rates) for rates in last.values())))
    promql = f'storagescale_step_rate_hz{{storage="xrootd",operation="stat",clients="{clients}"}}'
    deadline, answer = time.monotonic() + 60, []
    while time.monotonic() < deadline:  # scraped every second; the last push a moment ago
        answer = query(prometheus, promql)
        by_version = {item["metric"]["version"]: float(item["value"][1]) for item in answer}
        if all(by_version.get(v) == last[v][clients] for v in last):
            break
        time.sleep(1)
    print(f"\nPrometheus {prometheus}/api/v1/query?query={promql}")
    for item in sorted(answer, key=lambda item: item["metric"]["version"]):
        version = item["metric"]["version"]
        print(f"  version {version}: {float(item['value'][1]):,.1f} Hz (the last {version} "
              f"run's results file: {last[version][clients]:,.1f} Hz)")
    by_version = {item["metric"]["version"]: float(item["value"][1]) for item in answer}
    answered = set(by_version) == set(last) and all(
        by_version[v] == last[v][clients] for v in last)
    print(f"Prometheus answered the last run's rate of each version: "
          f"{'yes' if answered else 'NO'}")

    print(f"\nthe Grafana dashboard's panels ({DASHBOARD.relative_to(ROOT)}), each query "
          f"with storage=xrootd, operation=stat, clients=All:")
    panels_ok = True
    for title, panel_query in dashboard_queries("xrootd", "stat"):
        series = query(prometheus, panel_query)
        panels_ok &= bool(series)
        print(f"  {title}: {len(series)} series")
    return found and answered and panels_ok


if __name__ == "__main__":
    sys.exit(main())
