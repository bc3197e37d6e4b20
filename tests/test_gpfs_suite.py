"""suites/gpfs through a real POSIX mount (the test's own directory on this
machine's disk: O_DIRECT and O_DSYNC writes for real), with the plan made small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent


def test_gpfs_suite_on_a_posix_mount(pytester, tmp_path):
    text = (REPO / "thresholds" / "gpfs" / "default.toml").read_text()
    for old, new in {'file_size = "1GB"': 'file_size = "4MB"', "\ntries = 10": "\ntries = 3",
                     'duration = "5m"': 'duration = "1s"', 'file_size = "100MB"':
                     'file_size = "1MB"', "entries = 1000": "entries = 50",
                     # this machine's disk is no GPFS: gate on the mechanism only
                     "mb_s_mean >= 7.3": "mb_s_mean > 0", "mb_s_mean >= 5.7": "mb_s_mean > 0",
                     "mb_s_mean >= 100": "mb_s_mean > 0", "mb_s_stddev <= 1.0": "failed == 0",
                     "mb_s_stddev <= 1.2": "failed == 0", "mb_s_stddev <= 5": "failed == 0"
                     }.items():
        assert old in text, old
        text = text.replace(old, new)
    folder = tmp_path / "thr" / "gpfs"
    folder.mkdir(parents=True)
    (folder / "default.toml").write_text(text)
    mount = tmp_path / "mount"
    mount.mkdir()
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "gpfs"), f"--storage-thresholds={folder.parent}",
        f"--storage-endpoint=file://{mount}", "--storage-version=5.1.9",
        "--storage-results=r.json", "-p", "no:cacheprovider",
    )
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([
        "dd_direct (try 1/3)*1*info", "dd_direct (try 3/3)*1*pass",
        "dd_dsync (try 3/3)*pass", "dd_read (try 3/3)*pass",
        "ls_under_io/listers*4*pass", "ls_under_io/writers*4*pass",
    ])
    steps = json.loads((pytester.path / "r.json").read_text())["steps"]
    direct = [s for s in steps if s["op"] == "dd_direct"]
    assert [s["succeeded"] for s in direct] == [1, 1, 1]  # one file per try
    assert all(s["bytes"] == 4_000_000 - 4_000_000 % 65536 for s in direct)
    last = direct[-1]["derived"]
    assert last["mb_s_mean"] > 0 and last["mb_s_stddev"] >= 0
    assert list(mount.iterdir()) == []  # the run directory is gone
