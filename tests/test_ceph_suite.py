"""suites/ceph against the embedded xrootd, with the shipped plan made small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent


def test_ceph_suite(pytester, tmp_path):
    text = (REPO / "thresholds" / "ceph" / "default.toml").read_text()
    for old, new in {'file_size = "1GB"': 'file_size = "2MB"',
                     'file_size = "2GB"': 'file_size = "8MB"',
                     'duration = "60s"': 'duration = "0.5s"',
                     'warmup = "5s"': 'warmup = "0.2s"',
                     "clients = [1, 64]": "clients = [1, 8]",
                     # the embedded xrootd measured hot_ratio 1.0 to 3.5 on this
                     # machine: the test checks the mechanism, not this server
                     "hot_ratio <= 2": "hot_ratio <= 100",
                     # latency limits of Echo's gateways, not of a loaded 2-core CI box
                     '"p50_s <= 0.01", "mean_s <= 0.05"': '"p50_s <= 1", "mean_s <= 1"',
                     '"p50_s <= 0.1"': '"p50_s <= 1"', '"p50_s <= 0.5"': '"p50_s <= 1"'}.items():
        assert old in text, old
        text = text.replace(old, new)
    folder = tmp_path / "thr" / "ceph"
    folder.mkdir(parents=True)
    (folder / "default.toml").write_text(text)
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "ceph"), f"--storage-thresholds={folder.parent}",
        "--storage-results=r.json", "-p", "no:cacheprovider",
    )
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([
        "*thresholds: *ceph/default.toml*",
        "distinct *5*info",
        "hotfile (same file)*5*pass",
        "readv *1*pass", "readv *8*pass", "read *1*pass", "read *8*pass",
    ])
    steps = json.loads((pytester.path / "r.json").read_text())["steps"]
    same = next(s for s in steps if s.get("label") == "same file")
    assert same["derived"]["hot_ratio"] > 0
    assert same["checks"][-1]["rule"] == "hot_ratio <= 100"
    assert same["checks"][-1]["observed"] == same["derived"]["hot_ratio"]
