"""An upgrade caught (issue 24): suites/dcache against the embedded dCache 10.2.25 keeps
its results, then against 11.2.5 with them as the baseline, and ``storagescale
compare`` prints both side by side. Two dCache starts in all (one per pytest run);
the steps are short (a small plan scale, the WebDAV and xrootd doors, a subset of the
suite: a namespace scan, a copy-out scan and two functional checks). What it asserts
is what the two runs really showed (docs/dcache-upgrade.md): each run names its own
version and the thresholds file chosen for it, the second run's steps are judged
against the first's (each holds its baseline step), and the comparison names both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_storagescale.servers.dcache import cached_releases

pytestmark = [pytest.mark.integration, pytest.mark.slow_server]
REPO = Path(__file__).resolve().parent.parent
BEFORE, AFTER = "10.2.25", "11.2.5"
SUBSET = ("test_namespace_scan or test_copy_out_scan or test_put_get_checksum "
          "or test_stat_file_and_directory")


def _run(pytester, version: str, *extra: str):
    return pytester.runpytest_subprocess(
        str(REPO / "suites" / "dcache"), "--storage-embedded=dcache",
        f"--storage-embedded-version={version}", "--storage-load-doors=davs,root",
        "--storage-scale=0.02", "--storage-clients=2", "-k", SUBSET,
        "-p", "no:cacheprovider", *extra, timeout=900)


def test_an_upgrade_from_10_2_to_11_2_is_judged_against_the_first_run(pytester):
    missing = {BEFORE, AFTER} - set(cached_releases())
    if missing:
        pytest.fail(f"dCache {', '.join(sorted(missing))} not in the distribution cache: "
                    "run 'make setup' (scripts/dcache-dist.sh)")
    before, after = pytester.path / "before.json", pytester.path / "after.json"
    first = _run(pytester, BEFORE, f"--storage-results={before}")
    assert first.ret == 0, first.stdout.str()[-3000:]
    first.stdout.fnmatch_lines([f"storagescale: dcache {BEFORE} at davs://*",
                                f"*thresholds: *dcache/*.toml (matched version {BEFORE}*"])
    second = _run(pytester, AFTER, f"--storage-baseline={before}",
                  f"--storage-results={after}")
    # the gate's verdict is the second run's exit status: 0 or 1 (a regression), never
    # a usage error or an internal error
    assert second.ret in (0, 1), second.stdout.str()[-3000:]
    second.stdout.fnmatch_lines([f"storagescale: dcache {AFTER} at davs://*",
                                 f"*thresholds: *dcache/*.toml (matched version {AFTER}*"])
    documents = [json.loads(path.read_text()) for path in (before, after)]
    assert [doc["run"]["version"] for doc in documents] == [BEFORE, AFTER]
    judged = [step for step in documents[1]["steps"] if step.get("baseline")]
    assert judged, "no step of the second run was compared with the first"
    assert {step["door"] for step in judged} >= {"davs", "root"}
    compare = subprocess.run(
        [str(Path(sys.executable).with_name("storagescale")), "compare", str(before),
         str(after)], capture_output=True, text=True, timeout=120)
    assert compare.returncode in (0, 1), compare.stderr
    assert BEFORE in compare.stdout and AFTER in compare.stdout
    print(compare.stdout)
