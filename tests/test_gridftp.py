"""The embedded GridFTP door (GSI): started for real, used through the gfal2 driver
over gsiftp:// with the session's proxy, refusing a proxy it cannot map or none at all
with a message naming the credential, and suites/dcache run over it with a shrunk plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_storagescale.errors import EndpointError
from pytest_storagescale.servers import processes
from pytest_storagescale.servers.gridftp import EmbeddedGridFTP

pytestmark = [pytest.mark.slow_server, pytest.mark.integration]
REPO = Path(__file__).resolve().parent.parent


#: the door's checks (tests/gridftp_door_checks.py), run in a process of their own
DOOR_CHECKS = Path(__file__).resolve().parent / "gridftp_door_checks.py"


def test_the_gridftp_door(pytester):
    """Started for real, used through gfal2 over gsiftp:// with the session's proxy,
    refusing a proxy it cannot map or none at all with a message naming the
    credential: ``gridftp_door_checks.py`` in a pytest process of its own, run again
    (within :data:`GFAL2_CRASH_RUNS`) only when gfal2 crashed it."""
    for _ in range(GFAL2_CRASH_RUNS):
        outcome = pytester.runpytest_subprocess(str(DOOR_CHECKS), "-p", "no:cacheprovider")
        if not _gfal2_crashed(outcome):
            break
    outcome.assert_outcomes(passed=4)


def test_missing_binary_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(processes, "SBIN_PATH", str(tmp_path))
    with pytest.raises(EndpointError, match="apt-get install globus-gridftp-server-progs"):
        EmbeddedGridFTP.check_installed()


#: runs of the door's checks or the gsiftp suite when gfal2 crashed the previous one
GFAL2_CRASH_RUNS = 3


def _gfal2_crashed(outcome) -> bool:
    """Whether the run died inside the gfal2 client library (a segfault or an abort
    with ``drivers/gfal2.py`` on the stack).

    In whole ``make test`` runs beside ``stress-ng --cpu 4``, gfal2's GridFTP plugin
    crashed the suite's pytest process in 3 of 3 runs (partial reads in
    ``pread_bytes``, an abort in a load step's ``ls``; docs/compatibility.md); on a
    quiet machine it never did. The gfal2 driver no longer asks for partial reads over
    gsiftp:// (the crash of 11 in 30 short runs), but an abort on Globus's callback
    thread was seen once more since. This test is about the suite's outcomes, so such
    a run goes again, at most :data:`GFAL2_CRASH_RUNS` times in all."""
    err = outcome.stderr.str()
    if "its client library (gfal2) crashed" in outcome.stdout.str():
        return True  # in a load step's client process: that step's error (ClientsCrashed)
    # an abort on a Globus callback thread ("Assertion ! GLOBUS_I_FTP_CLIENT_BAD_MAGIC")
    # has no gfal2 frame on the Python stacks faulthandler prints
    return ("Fatal Python error: Segmentation fault" in err
            or "Fatal Python error: Aborted" in err) and (
                "drivers/gfal2.py" in err or "GLOBUS_" in err)


def _only_data_connections_refused(results: Path) -> bool:
    """Whether the run's only failures were GridFTP data connections the server did
    not accept (``errno_ECOMM``, "globus_xio: Unable to connect" to its data port):
    beside ``stress-ng --cpu 4`` one such failure in 85-200 operations was seen in 2
    of 5 whole ``make test`` runs, never on a quiet machine. The suite measures and
    reports it as it should; this test is about the suite's outcomes, so such a run
    goes again (within :data:`GFAL2_CRASH_RUNS`)."""
    try:
        steps = json.loads(results.read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return False
    failed = [step for step in steps if step["failed"]]
    return bool(failed) and all(set(step["errors"]) == {"errno_ECOMM"} for step in failed)


def _only_hung_requests(results: Path) -> bool:
    """Whether the run's only problems were requests that hung (no failure): in one
    fresh-clone CI run (2026-11-26, load average ~5) the first ls over gsiftp, 1 client,
    hung its whole 60 s deadline while every other step of the run was clean; not seen
    in the runs before. The suite measured and reported the hang as it should; this
    test is about the suite's outcomes, so such a run goes again (within
    :data:`GFAL2_CRASH_RUNS`)."""
    try:
        steps = json.loads(results.read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return False
    hung = [step for step in steps if step["hung"]]
    return bool(hung) and not any(step["failed"] for step in steps)


def _only_lost_gridftp_connections(results: Path) -> bool:
    """Whether the run's only failures were GridFTP control connections gfal2 lost
    (error class ``communication``): one such failure in a mixed step of ~100
    operations was seen in 1 of 3 runs of this test on this session's busy machine
    (load average ~8), none on a quiet one; a run with it goes again (within
    :data:`GFAL2_CRASH_RUNS`)."""
    try:
        steps = json.loads(results.read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return False
    failed = [step for step in steps if step["failed"]]
    return bool(failed) and all(set(step["errors"]) <= {"communication", "errno_ECOMM"}
                                for step in failed)


@pytest.mark.long_running
def test_dcache_suite_over_gsiftp(pytester, monkeypatch):
    """`pytest suites/dcache --storage-embedded gridftp`: the functional and conformance
    checks over gsiftp:// (vector reads not applicable, said so) and every scan."""
    monkeypatch.setenv("STORAGESCALE_LARGE_MB", "4")
    results = pytester.path / "results.json"
    args = (str(REPO / "suites" / "dcache"), "--storage-embedded=gridftp",
            "--storage-scale=0.05", "--storage-clients=1", f"--storage-results={results}",
            "-p", "no:cacheprovider", "-rs")
    for _ in range(GFAL2_CRASH_RUNS):
        results.unlink(missing_ok=True)  # each run's own results, never the last one's
        outcome = pytester.runpytest_subprocess(*args)
        if not (_gfal2_crashed(outcome) or _only_data_connections_refused(results)
                or _only_hung_requests(results) or _only_lost_gridftp_connections(results)):
            break
    # + ls_open's one rate; suites/dcache/test_dcache_behaviour.py's 2 checks skip (no
    # HTTP or xrootd door); the streaming steps' 2 skip (embedded-gridftp.toml has no
    # [ops.streaming] / [ops.streaming_mixed])
    outcome.assert_outcomes(passed=27 + 1, skipped=4 + 2 + 2)
    outcome.stdout.fnmatch_lines([
        "storagescale: dcache gridftp-* at gsiftp://localhost:*/storagescale *",
        "*thresholds: *dcache/embedded-gridftp.toml (matched version gridftp-*",
        "*gsiftp door: not applicable: GridFTP has no vector read request*",
    ])
    document = json.loads(results.read_text())
    assert document["run"]["version"].startswith("gridftp-")
    steps = document["steps"]
    assert {s["op"] for s in steps} == {"ls", "ls_open", "copyout", "transactions", "mixed",
                                        "recovery"}
    for step in steps:  # every step measured something, and nothing failed or hung
        assert step["succeeded"] > 0, step["op"]
        assert step["failed"] == 0 and step["hung"] == 0, (step["op"], step["errors"])
    assert all(s["verdict"] in ("pass", "info") for s in steps)
    copy = next(s for s in steps if s["op"] == "copyout")
    assert copy["bytes"] == copy["succeeded"] * 500_000  # 10 MB x 0.05, to local disk
