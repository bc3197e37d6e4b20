"""suites/dcache without a dCache distribution runs against the embedded Apache WebDAV
door; the run says so where its verdict is read (issue 31, "the verdict a user
reads"): a line of the terminal summary, under -q too, and its results' label."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pytest_storagescale.records import ClientInfo, RunInfo

REPO = Path(__file__).resolve().parent.parent


def test_the_dcache_suite_on_apache_says_it_met_no_dcache(tmp_path):
    empty = tmp_path / "no-dcache-here"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(REPO / "suites" / "dcache" /
                                             "test_dcache_functional.py"),
         "-k", "test_stat_file_and_directory", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "--rootdir", str(REPO)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "STORAGESCALE_DCACHE_DIST": str(empty)})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    said = [line for line in output.splitlines()
            if line.startswith("storagescale: NOT the system the suite is named after")]
    assert len(said) == 1, output[-4000:]
    assert "Apache WebDAV door" in said[0] and "not a dCache" in said[0], said
    assert "scripts/dcache-dist.sh" in said[0], said


def test_a_stand_in_is_in_the_results_and_their_label():
    from pytest_storagescale.plugin import run_label

    info = RunInfo(endpoint="davs://127.0.0.1:1/x", endpoint_id="x", embedded=True,
                   system="dcache", version="apache-2.4.71", version_source="detected",
                   thresholds_file="t.toml", thresholds_reason="r", run_id="r1",
                   started=1.0, executor="auto", driver="http",
                   client=ClientInfo(host="h", user="u", versions={}, argv=[]),
                   stand_in="the Apache WebDAV door, not a dCache")
    again = RunInfo.from_json(info.to_json())
    assert again.stand_in == info.stand_in
    assert run_label(again) == "dcache suite against apache-2.4.71 (not dcache)"
    assert "stand_in" not in RunInfo.from_json({**info.to_json(), "stand_in": ""}).to_json()
