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
clients = [500]

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
def test_more_clients_than_open_files_is_one_paragraph(tmp_path, embedded_xrootd):
    (tmp_path / "thr" / "xrootd").mkdir(parents=True)
    (tmp_path / "thr" / "xrootd" / "t.toml").write_text(PLAN)
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_suite.py",
         f"--storage-endpoint={embedded_xrootd.url}", "--storage-thresholds=thr",
         "--storage-results=r.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        preexec_fn=_limit_open_files,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert ("stat step at 500 clients: a step of 500 clients needs about 564 open files per "
            "process (1 per client), and this process may open 256 (ulimit -n: soft 256, "
            "hard 256). Raise the limit, e.g. 'ulimit -n 564'") in output, output[-2000:]
    assert "Too many open files" not in output and "Traceback" not in output


def test_the_soft_limit_is_raised_to_the_hard_one():
    code = ("import resource; from pytest_storagescale.limits import raise_open_files_limit;"
            "print(*raise_open_files_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))")

    def limits():
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 512))

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         preexec_fn=limits, check=True).stdout.split()
    assert out == ["512", "512", "512", "512"]
