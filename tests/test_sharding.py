"""Thousands of clients per host: the executors keep every process within the driver's
clients per process, and every client stays its own connection (the server's own
count of established connections says so), with results, histograms and timelines
merged from the processes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psutil
import pytest

from pytest_storagescale.drivers import memory
from pytest_storagescale.drivers.memory import MemoryDriver
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.spec import DriverSpec
from pytest_storagescale.drivers.xrootd import XRootDDriver
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.executors import clients_per_process, process_count
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan
from pytest_storagescale.load.stats import usable_cores
from pytest_storagescale.servers.xrootd import EmbeddedXRootD
from pytest_storagescale.steps import executor_line


def plan(driver, clients: int, **kw) -> StepPlan:
    values = dict(operation=get_operation("stat"), clients=clients, duration=1.0, warmup=0.0,
                  hang_timeout=10.0, driver=driver, workdir="/area/step")
    values.update(kw)
    return StepPlan(**values)


@pytest.fixture
def memory_spec(request):
    yield driver_spec(f"memory://shard-{request.node.name[-40:]}/area", writable_root="/area")
    memory.clear_stores()


def test_process_count_keeps_every_process_within_its_limit(memory_spec):
    cores = max(2, usable_cores())
    xrootd = driver_spec("root://127.0.0.1:1094//area", writable_root="/area")
    assert XRootDDriver.clients_per_process > 0 and MemoryDriver.clients_per_process == 0
    assert clients_per_process(plan(xrootd, 10)) == XRootDDriver.clients_per_process
    assert clients_per_process(plan(xrootd, 10, clients_per_process=7)) == 7
    # C clients over ceil(C / limit) processes, at least one per core, never more than C
    assert process_count(plan(xrootd, 5000, clients_per_process=200), 5000) == max(25, cores)
    assert process_count(plan(xrootd, 201, clients_per_process=200), 201) == max(2, cores)
    assert process_count(plan(xrootd, 1), 1) == 1
    # a count the plan sets wins; a driver without a limit gets one process per core
    assert process_count(plan(xrootd, 5000, processes=3), 5000) == 3
    assert process_count(plan(memory_spec, 5000), 5000) == cores


def test_auto_runs_threads_within_the_limit_and_processes_above_it(memory_spec):
    # the memory driver has no limit: one process, whatever the count
    step = run_step(plan(memory_spec, 6), executor="auto")
    assert step.client.processes == 1 and step.total.succeeded > 0
    # above a limit: put (each process's own store) over ceil(6 / 2) = 3 processes
    step = run_step(plan(memory_spec, 6, operation=get_operation("put"), clients_per_process=2,
                         params={"file_size": 1000}), executor="auto")
    assert step.client.processes == 3 and step.client.clients_per_process == 2
    assert step.total.succeeded > 0 and step.total.failed == 0 and step.total.hung == 0


class ShardProbeDriver(MemoryDriver):
    """The memory driver, leaving a file named by its process id in $SS_SHARD_PROBE_DIR
    in each shard process it is told it runs in (imported there as this module)."""

    @classmethod
    def in_shard_process(cls) -> None:
        Path(os.environ["SS_SHARD_PROBE_DIR"], str(os.getpid())).touch()


def test_each_shard_process_is_told(memory_spec, tmp_path, monkeypatch):
    """Driver.in_shard_process runs in every process of a sharded step (the xrootd
    driver gives them their own count of event loops there), and not in the parent."""
    monkeypatch.setenv("SS_SHARD_PROBE_DIR", str(tmp_path))
    probe = DriverSpec(ShardProbeDriver, memory_spec.endpoint_url, "/area")
    put = {"operation": get_operation("put"), "params": {"file_size": 1000}}
    step = run_step(plan(probe, 6, clients_per_process=2, processes=3, **put),
                    executor="auto")
    assert step.client.processes == 3 and step.total.succeeded > 0
    told = {int(p.name) for p in tmp_path.iterdir()}
    assert len(told) == 3 and os.getpid() not in told
    run_step(plan(probe, 2, clients_per_process=2, **put), executor="auto")  # threads
    assert len(list(tmp_path.iterdir())) == 3


def test_header_says_how_clients_are_spread():
    line = executor_line("auto", XRootDDriver)
    assert f"at most {XRootDDriver.clients_per_process} per process" in line
    assert "threads of one spawned process" in line and "a crash of it costs the step" in line
    assert "threads of one process" in executor_line("auto", MemoryDriver)
    assert "threads of one process" in executor_line("threads", XRootDDriver)


class ConnectionWatch:
    """The server's established connections on its port, sampled while a step runs:
    the most seen at once, and the most each client process held at once."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.most = 0
        self.client_pids: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.3):
            connections = [c for c in psutil.net_connections(kind="tcp")
                           if c.status == psutil.CONN_ESTABLISHED]
            served = [c for c in connections if c.laddr and c.laddr.port == self.port]
            self.most = max(self.most, len(served))
            pids: dict[int, int] = {}
            for c in connections:  # the client ends: remote port is the server's
                if c.raddr and c.raddr.port == self.port and c.pid:
                    pids[c.pid] = pids.get(c.pid, 0) + 1
            # the most each process held in one sample (a scan of /proc can miss a
            # socket that changes under it: one sample may undercount a process)
            for pid, count in pids.items():
                self.client_pids[pid] = max(self.client_pids.get(pid, 0), count)

    def __enter__(self) -> ConnectionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_a_sharded_step_keeps_one_connection_per_client():
    clients, limit = 300, 50
    with EmbeddedXRootD(https=False) as server:
        root = "/storagescale/sharding"
        admin = driver_spec(server.url, writable_root=root).connect("admin", timeout=10)
        admin.mkdir(root)
        step = plan(driver_spec(server.url, writable_root=root), clients, duration=4.0,
                    warmup=2.0, clients_per_process=limit, workdir=f"{root}/stat")
        with ConnectionWatch(server.port) as watch:
            result = run_step(step, executor="auto")
        admin.remove_tree(root)
    total = result.total
    assert total.succeeded > 0 and total.failed == 0 and total.hung == 0, total.errors
    usage = result.client
    assert usage.processes == clients // limit and usage.clients_per_process == limit
    assert usage.rss_mb > 0 and usage.cpu_s > 0
    # every client its own connection: the server saw all of them at once (plus the
    # step's coordinator and at most a few session connections)
    assert clients <= watch.most <= clients + 5, watch.most
    if watch.client_pids:  # the owning processes are visible (root, or our own user)
        # this process holds the session's admin and coordinator connections
        children = {pid: n for pid, n in watch.client_pids.items() if pid != os.getpid()}
        assert len(children) == clients // limit, watch.client_pids
        # never more than its share; a busy machine's scan of /proc can miss a socket
        # that changes under it, so a process may be seen one or two short in every sample
        over = {pid: n for pid, n in children.items() if n > limit}
        assert not over, f"processes holding more than {limit} connections: {over}"
        short = {pid: n for pid, n in children.items() if n < limit - 2}
        assert not short, f"processes seen with fewer than {limit - 2} connections: {short}"
    # the processes' measurements merged: latencies of every success, a timeline
    from hdrh.histogram import HdrHistogram

    histogram = HdrHistogram.decode(total.histogram.encode("ascii"))
    assert histogram.get_total_count() == total.succeeded
    assert sum(total.timeline["completions"]) >= total.succeeded
    assert max(total.timeline["in_flight"]) <= clients
    assert time.time() - result.ended < 60
