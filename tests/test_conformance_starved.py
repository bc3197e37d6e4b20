"""Issue 11: an xrootd starved of threads. With ``xrd.sched maxt 4`` the XrdHttp door of
xrootd 5.5.3 answers nothing (its log: "Thread limit has been reached!") while the root
door keeps answering: a root:// only run sees nothing wrong. The conformance suite, run
through both doors with a short request deadline, fails the davs checks (at their set-up:
the check's directory cannot be made) with the door and the deadline, passes the root
checks, and ends in bounded time. The checks are ones that use one door only: a check
that compares doors (stat_fields, cross_door_read) fails on its root variant too, naming
the davs door.

That the thread cap is the cause is shown by a control: the same server with only
``maxt`` raised answers the same davs request within the deadline. (xrootd's own
"Thread limit has been reached!" line is no proof either way: it is logged only when a
worker that finds no idle peer is refused a new one, which happened at start-up in
most runs here and not at all in one CI run whose davs door was just as mute.)"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from plans import xrootd_plan

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import StorageError
from pytest_storagescale.servers.xrootd import EmbeddedXRootD

pytestmark = [pytest.mark.slow_server, pytest.mark.integration]
REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "suites" / "conformance"
#: scheduler threads too few for XrdHttp (measured on 5.5.3: maxt 4 to 6 leave davs mute,
#: maxt 7 answers)
STARVED = "xrd.sched mint 1 maxt 4 avlt 1 idle 60"
#: the control: the same scheduler settings with threads enough
FED = "xrd.sched mint 1 maxt 32 avlt 1 idle 60"
#: each door request's deadline (--storage-hang-timeout)
DEADLINE_S = 5
#: the whole run: two checks per door, a few deadlines each, on a busy 2-core machine
RUN_BOUND_S = 120.0


def _davs_answer(server: EmbeddedXRootD) -> str:
    """What one davs stat of the test area got within the deadline: "answered" or the
    error's text."""
    spec = driver_spec(server.https_url, options={"ca_dir": server.ca_dir})
    try:
        driver = spec.connect("starved-control", timeout=DEADLINE_S)
        try:
            driver.stat("/storagescale")
        finally:
            driver.close()
    except StorageError as error:
        return str(error)
    return "answered"


def test_a_thread_starved_http_door_is_caught(pytester, tmp_path):
    # the control: with threads enough, the same server's davs door answers
    with EmbeddedXRootD(extra_config=FED) as fed:
        assert _davs_answer(fed) == "answered"
    with EmbeddedXRootD(extra_config=STARVED) as starved:
        began = time.monotonic()
        result = pytester.runpytest_subprocess(
            str(SUITE), f"--storage-endpoint={starved.url}",
            f"--storage-door=davs={starved.https_url}",
            f"--storage-driver-option=ca_dir={starved.ca_dir}",
            f"--storage-thresholds={xrootd_plan(tmp_path)}",
            f"--storage-hang-timeout={DEADLINE_S}s", "-p", "no:cacheprovider",
            "-k", "put_get_checksum or missing_file_error", "-v",
        )
        took = time.monotonic() - began
    out = result.stdout.str()
    assert took < RUN_BOUND_S, f"the starved run took {took:.0f} s:\n{out[-3000:]}"
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 2, out[-3000:]
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) == 2, out[-3000:]
    for check in ("put_get_checksum", "missing_file_error"):
        assert re.search(rf"::test_{check}\[root\] PASSED", out), (check, out[-3000:])
        assert re.search(rf"::test_{check}\[davs\] (FAILED|ERROR)", out), (check, out[-3000:])
        # the report's section: its first line is the check's one-paragraph message
        report = re.search(rf"_ (?:ERROR at setup of )?TestConformance\.test_{check}\[davs\] "
                           rf"_+\n(.+)", out)
        assert report, (check, out[-3000:])
        message = report.group(1)
        assert re.match(r"davs door \(davs://127\.0\.0\.1:\d+/storagescale\): ", message), \
            message
        assert re.search(rf"timed out .*\(deadline {DEADLINE_S} s\)", message), message
    assert "Traceback" not in out, out[-3000:]
