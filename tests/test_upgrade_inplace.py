"""``make upgrade-inplace``'s suite runs (issue 34): scripts/upgrade_inplace.py runs the
storage's suite against the old release after the tree is written (its results kept)
and against the new release after the verify, judged against the first run
(``--storage-baseline``); the judged run's exit status is the flow's verdict. The
XRootD flow (5.5.3 -> 6.2.1 on one data directory, seconds to start) with a short plan:
one 1 s stat step whose rule relative to the baseline (``rate_hz >= 100 *
baseline``) cannot fail without one, so the run before passes and the run after can
only fail by being judged against it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_storagescale.servers.xrootd_releases import BUILT_VERSION, built_prefix

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "upgrade_inplace.py"

#: one short stat step; the statistical gate cannot decide (the minimum effects are out
#: of reach), so only the relative rule judges the run after against the run before
PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "1s"
warmup = "0.2s"
hang_timeout = "10s"

[ops.stat]
clients = [2]
min_effect_rate = 0.99
min_effect_p99 = 99

[[ops.stat.expect]]
clients = "*"
rules = ["failed == 0", "rate_hz >= 100 * baseline"]
"""


def _flow(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--server", "xrootd", "--workdir",
                           str(tmp_path / "work"), "--size", "64KiB", *arguments],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.integration
def test_the_run_after_the_upgrade_is_judged_against_the_run_before(tmp_path):
    if built_prefix() is None:
        pytest.skip(f"XRootD {BUILT_VERSION} is not built on this machine: run "
                    f"'bash scripts/build-xrootd6.sh' (make setup runs it)")
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    done = _flow(tmp_path, "--pytest-args",
                 f"-k test_stat_scan --storage-thresholds {plan}")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    # the files were all there: the failure is the judged run's
    assert "verdict as expected (every file ok was expected; verify's exit status 0)" in out
    assert "the suite (suites/xrootd) before the upgrade: exit status 0" in out, out
    assert "the suite (suites/xrootd) after the upgrade: exit status 1" in out, out
    assert "judged against xrootd-before.json" in out
    assert "the suite judged against the run before the upgrade FAILED" in out
    before = json.loads((tmp_path / "work" / "xrootd-before.json").read_text())
    after = json.loads((tmp_path / "work" / "xrootd-after.json").read_text())
    assert before["run"]["version"] == "5.5.3"
    assert after["run"]["version"] == BUILT_VERSION
    # the run before was no run against a fresh server: the tree's folder sat beside it
    assert before["run"]["embedded"] is False and after["run"]["embedded"] is False
    (step,) = [s for s in after["steps"] if s.get("op") == "stat"]
    assert step["baseline"]["version"] == "5.5.3" and step["baseline"]["matched"]
    assert step["verdict"] == "fail"
    assert any("rate_hz >= 100 * baseline" in v for v in step["violations"]), step
    (first,) = [s for s in before["steps"] if s.get("op") == "stat"]
    assert first["verdict"] == "pass" and not first.get("baseline")
    # the endpoint went through the environment, never the command line (another local
    # user reads argv in /proc: the embedded dCache's WebDAV URL holds its password)
    for when, results in (("before", before), ("after", after)):
        log = (tmp_path / "work" / f"xrootd-{when}.log").read_text()
        assert "storage_endpoint: root://127.0.0.1:" in log
        assert "(from $STORAGESCALE_ENDPOINT)" in log
        assert not any("storage-endpoint" in arg for arg in results["run"]["client"]["argv"])


def test_bad_pytest_args_are_one_paragraph_exit_4(tmp_path):
    done = _flow(tmp_path, "--pytest-args", "-k 'unclosed")
    assert done.returncode == 4
    assert done.stderr.startswith("ERROR: --pytest-args") and "Traceback" not in done.stderr
    assert not (tmp_path / "work").exists()  # before anything: no server, no folder
