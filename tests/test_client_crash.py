"""A client library that crashes mid-step (XrdCl segfaulting on a garbled answer)
costs that step, never the session: under the ``auto`` executor the xrootd and gfal2
load clients run in a spawned process, and one that dies without its report makes
the step an ``error`` naming how it ended. The crash is a real SIGSEGV sent to the
client process, from the step's own progress, against a real xrootd."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest
from faults import OnceMeasuring, progress_conftest

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.executors import ClientsCrashed
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan

pytestmark = pytest.mark.integration


def client_processes(pid: int | None = None) -> list[psutil.Process]:
    """The spawned client processes of ``pid`` (default: this process)."""
    return [child for child in psutil.Process(pid).children()
            if "spawn_main" in " ".join(child.cmdline())]


def segfault_clients(pid: int | None = None) -> None:
    """SIGSEGV to every client process of ``pid``: as if its library crashed."""
    processes = client_processes(pid)
    assert processes, "no client process: the clients ran in this process"
    for process in processes:
        os.kill(process.pid, signal.SIGSEGV)


def test_a_client_process_killed_by_a_signal_is_the_steps_error(xrootd_area,
                                                                embedded_xrootd):
    root, driver = xrootd_area
    plan = StepPlan(operation=get_operation("stat"), clients=3, duration=30.0, warmup=0.2,
                    hang_timeout=5.0, workdir=f"{root}/step",
                    driver=driver_spec(embedded_xrootd.url, writable_root=root))
    crash = OnceMeasuring(segfault_clients)
    with pytest.raises(ClientsCrashed) as raised:
        run_step(plan, executor="auto", progress=crash)
    crash.join()
    error = raised.value
    assert error.error_class == "client_crash" and "killed by SIGSEGV" in str(error)
    assert "3 of the step's 3 clients" in str(error)
    assert driver.ls(root) == []  # the step's directory removed all the same


THRESHOLDS = """
[storage]
system = "xrootd"
versions = ["*"]

[ops.crashing]
op = "stat"
clients = [2]
duration = "30s"
hang_timeout = "5s"

[ops.after]
op = "stat"
clients = [2]
duration = "1s"
hang_timeout = "5s"

[[ops.after.expect]]
rules = ["failed == 0"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("crashing")
def test_crashing(storage_load, storage_clients):
    storage_load.run()

@pytest.mark.storagescale_op("after")
def test_after(storage_load, storage_clients):
    storage_load.run()
"""

#: the step's own progress (the live progress, quiet without a terminal, replaced):
#: once the crashing step measured, its client process gets a SIGSEGV
CONFTEST = progress_conftest("""\
if state.succeeded > 0 and state.total_s > 20 and not Path("crashed").exists():
    Path("crashed").touch()
    segfault_clients()""", imports="""\
import sys
from pathlib import Path

sys.path.insert(0, {tests!r})
from test_client_crash import segfault_clients""")


def test_a_crash_mid_step_costs_the_step_not_the_session(pytester):
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "t.toml").write_text(THRESHOLDS)
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeconftest(CONFTEST.format(tests=os.path.dirname(__file__)))
    result = pytester.runpytest_subprocess(
        "--storage-thresholds=thr", "--storage-results=r.json", "-p", "no:cacheprovider",
        "-p", "no:xdist")
    output = result.stdout.str()
    assert result.ret == 1, output  # a failed test, not exit 139
    steps = {step["op"]: step for step in
             json.loads((pytester.path / "r.json").read_text())["steps"]}
    assert steps["crashing"]["verdict"] == "error", steps["crashing"]
    assert "killed by SIGSEGV" in steps["crashing"]["error"]
    assert steps["after"]["verdict"] == "pass", steps["after"]
    result.stdout.fnmatch_lines(["*killed by SIGSEGV*"])
