"""suites/ceph against a plain embedded xrootd with an XCache door in front
(``--storage-embedded xcache``: starts in a second, where the suite's own Ceph gateway
takes seconds: tests/test_ceph_gateway.py), the shipped seed plan at a small scale
(``--storage-scale``), with the latency limits of Echo's gateways relaxed for a
loaded 2-core CI box."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

#: one Ceph cluster at a time with the CephFS tests (xdist_group network_namespaces):
#: twice the CephFS monitor did not answer within 180 s (its log empty) while this
#: suite's Ceph ran on the other worker, and passed alone; not explained
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("network_namespaces")]
REPO = Path(__file__).resolve().parent.parent


def test_ceph_suite(pytester, tmp_path):
    text = (REPO / "thresholds" / "ceph" / "default.toml").read_text()
    for old, new in {
            # the embedded xrootd measured hot_ratio 1.0 to 3.5 on this machine: the
            # test checks the mechanism, not this server
            "hot_ratio <= 2": "hot_ratio <= 100",
            # latency limits of Echo's gateways, not of a loaded 2-core CI box
            '"p50_s <= 0.01", "mean_s <= 0.05"': '"p50_s <= 1", "mean_s <= 1"',
            '"p50_s <= 0.001", "mean_s <= 0.05"': '"p50_s <= 1", "mean_s <= 1"',
            '"p50_s <= 0.42"': '"p50_s <= 1"', '"p50_s <= 0.46"': '"p50_s <= 1"',
            '"p50_s <= 0.1"': '"p50_s <= 1"', '"p50_s <= 0.5"': '"p50_s <= 1"'}.items():
        assert old in text, old
        text = text.replace(old, new)
    folder = tmp_path / "thr" / "ceph"
    folder.mkdir(parents=True)
    (folder / "default.toml").write_text(text)
    # 1 GB files become 4 MB. Steps of 3 s, not the scaled 1 s: on a loaded 2-core box
    # (load 30-40) a client's first 4 MB copy through the cold cache, with the door's
    # login, took over 1 s at 8 clients (p50 1.2-1.5 s), so a 1 s distinct_xcache step
    # measured no operation and was, rightly, an error (min_operations)
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "ceph"), "--storage-embedded=xcache",
        f"--storage-thresholds={folder.parent}",
        "--storage-scale=0.004", "--storage-duration=3s", "--storage-clients=1,8",
        "--storage-results=r.json", "-p", "no:cacheprovider",
    )
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines([
        "*thresholds: *ceph/default.toml*plan scale 0.004*",
        "distinct *1*info",
        "hotfile (same file)*1*pass",
        "distinct_xcache *1*info",
        "hotfile_xcache (same file)*1*pass",
        "readv *1*pass", "readv *8*pass", "readv_xcache *1*pass", "readv_xcache *8*pass",
        "read *1*pass", "read *8*pass", "read_xcache *1*pass", "read_xcache *8*pass",
    ])
    steps = json.loads((pytester.path / "r.json").read_text())["steps"]
    assert {s["params"]["file_size"] for s in steps if s["op"] == "hotfile"} == {4_000_000}
    assert all(s["succeeded"] > 0 and s["failed"] == 0 for s in steps)
    same = next(s for s in steps if s.get("label") == "same file")
    assert same["derived"]["hot_ratio"] > 0
    hot = next(c for c in same["checks"] if c["rule"] == "hot_ratio <= 100")
    assert hot["observed"] == same["derived"]["hot_ratio"]


@pytest.mark.slow_server
def test_a_ceph_daemon_killed_mid_run_is_named_in_the_summary(pytester):
    """The embedded Ceph gateway's monitor is killed during the run: the terminal
    summary names it, its pid, the signal and when, with its log's last lines (on a
    busy machine the gateway and its XCache once stopped answering mid-run and
    nothing said why). Before, its daemons run without the self-abort timeouts a
    starved machine can trip."""
    pytester.makepyfile(test_kill="""
        import json, os, signal, subprocess

        def test_the_daemons_never_abort_themselves(storage_endpoint):
            # a starved box: no OSD suicide on a slow op thread, no monitor shutdown
            # on a filling /tmp (both their own defaults)
            run = storage_endpoint.embedded.directory / "run"
            for name, key in (("osd.0", "osd_op_thread_suicide_timeout"),
                              ("osd.0", "osd_command_thread_suicide_timeout"),
                              ("mon.a", "mon_data_avail_crit")):
                answer = subprocess.run(
                    ["ceph", "--admin-daemon", str(run / f"{name}.asok"), "config",
                     "get", key], capture_output=True, text=True, timeout=60)
                assert json.loads(answer.stdout)[key] == "0", (name, key, answer)

        def test_kill_the_monitor(storage_endpoint):
            server = storage_endpoint.embedded
            monitor = next(d for d in server.daemons if d.name == "mon.a")
            print("KILLED", monitor.pid)
            os.kill(monitor.pid, signal.SIGKILL)
            monitor.process.wait(timeout=60)
    """)
    result = pytester.runpytest_subprocess(
        "--storage-embedded=ceph", "-s", "-p", "no:cacheprovider",
        f"--storage-thresholds={REPO / 'thresholds'}")
    result.assert_outcomes(passed=2)
    pid = re.search(r"KILLED (\d+)", result.stdout.str()).group(1)
    result.stdout.fnmatch_lines([
        f"storagescale: the embedded ceph lost a daemon during the run: mon.a (pid {pid}) "
        "ended at *:*:* UTC, * s after it started: killed by SIGKILL; every storage call "
        "it served after that failed. The last lines of its logs:",
        "--- mon.a: mon.a.log",
    ])
    summary = result.stdout.str().split("lost a daemon", 1)[1]
    assert "osd.0 (pid" not in summary and "gateway (pid" not in summary
