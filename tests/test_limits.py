"""What one client host can run is checked before the load: open files against
``ulimit -n`` (issue 8: 500 clients with ``ulimit -n 256`` died with a raw
``OSError: Too many open files`` and lost the step)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "1s"
hang_timeout = "10s"

[ops.stat]
clients = [{clients}]

[[ops.stat.expect]]
rules = ["failed == 0"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()
"""


def _limit_open_files():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.integration
@pytest.mark.parametrize("executor, clients, needed", [
    ("threads", 500, 564),
    # auto: at most 200 xrootd clients per process, so 10 processes of 200
    ("auto", 2000, 264),
], ids=["threads", "auto-sharded"])
def test_more_clients_than_open_files_is_one_paragraph(tmp_path, embedded_xrootd, executor,
                                                       clients, needed):
    (tmp_path / "thr" / "xrootd").mkdir(parents=True)
    (tmp_path / "thr" / "xrootd" / "t.toml").write_text(PLAN.format(clients=clients))
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_suite.py",
         f"--storage-endpoint={embedded_xrootd.url}", "--storage-thresholds=thr",
         "--storage-results=r.json", f"--storage-executor={executor}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        preexec_fn=_limit_open_files,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert (f"stat step at {clients} clients: a step of {clients} clients needs about "
            f"{needed} open files per process (1 per client), and this process may open 256 "
            f"(ulimit -n: soft 256, hard 256). Raise the limit, e.g. 'ulimit -n {needed}'"
            ) in output, output[-2000:]
    assert "Too many open files" not in output and "Traceback" not in output


def test_the_open_files_check_counts_the_processes_the_executor_will_use():
    """500 xrootd clients fit in ulimit -n 256 when auto spreads them over 3 processes
    (at most 200 each), not in one process of threads."""
    from pytest_storagescale.drivers.xrootd import XRootDDriver
    from pytest_storagescale.load.executors import planned_processes, usable_cores

    assert XRootDDriver.clients_per_process == 200
    assert planned_processes("threads", 500, XRootDDriver) == 1
    assert planned_processes("auto", 200, XRootDDriver) == 1
    assert planned_processes("auto", 500, XRootDDriver) == max(3, usable_cores())
    assert planned_processes("auto", 5000, XRootDDriver) == 25
    assert planned_processes("processes", 10, XRootDDriver) == max(2, usable_cores())
    assert planned_processes("auto", 5000, object) == 1  # a driver without a limit


def test_the_soft_limit_is_raised_to_the_hard_one():
    code = ("import resource; from pytest_storagescale.limits import raise_open_files_limit;"
            "print(*raise_open_files_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))")

    def limits():
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 512))

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         preexec_fn=limits, check=True).stdout.split()
    assert out == ["512", "512", "512", "512"]
