"""suites/dcache against the embedded xrootd, over davs:// and root://, with and
without xdist: its functional and scalability tests, and the shared conformance checks
over both of the server's doors with XRootD 5.5's known issues as strict expected
failures; under xdist no two load steps may overlap in time."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent

#: the shipped fallback plan runs at this scale: 30 s steps become 1 s, the 200
#: overload clients 4, the 450 short files 9
SCALE = 0.02
#: rules that gate a site's door, relaxed to gate only the mechanism on a loaded
#: 2-core CI box (half-second probes are noisy; mixing costs this machine a lot). The
#: probes' window (recover_within, 120 s) is not scaled: it once was, and its 2.4 s
#: ended beside stress-ng --cpu 4 before a probe got the rate back
RELAX = {
    "recover_fraction = 0.8": "recover_fraction = 0.3",
    "mix_ratio >= 0.2": "mix_ratio > 0",
}


@pytest.fixture
def small_plan(tmp_path):
    text = (REPO / "thresholds" / "dcache" / "default.toml").read_text()
    for old, new in RELAX.items():
        assert old in text, f"fallback plan changed: {old!r} not found"
        text = text.replace(old, new)
    folder = tmp_path / "thr" / "dcache"
    folder.mkdir(parents=True)
    (folder / "default.toml").write_text(text + STREAMING)
    return folder.parent


#: suites/dcache/test_streaming.py's two steps (the fallback plan has none: a site's
#: storage of no known version is not asked for bulk reads), small: whole files read
#: one after another, and as many writers beside the readers
STREAMING = """
[ops.streaming]
op = "stream"
clients = [2]
file_size = "4MB"
files = 3
duration = "2s"
warmup = "0s"

[[ops.streaming.expect]]
clients = "*"
rules = ["failed == 0", "hung == 0", "client_mb_s_min > 0"]

[ops.streaming_mixed]
op = "stream_mixed"
clients = [2]
file_size = "4MB"
files = 3
duration = "2s"
warmup = "0s"

[[ops.streaming_mixed.expect]]
clients = "*"
rules = ["readers.failed == 0", "writers.failed == 0", "readers.hung == 0",
         "writers.hung == 0"]
"""


#: the suite's own tests (functional, scalability: 5 and the open-loop scan's 2 rates,
#: streaming 2), all of which pass on either door
OWN_TESTS = 9 + 5 + 2 + 2
#: the conformance checks (17 by 2 doors) whose outcome is not a pass on the embedded
#: xrootd 5.5, and the words their reasons must carry: the known issues of
#: thresholds/xrootd/5.x.toml, and persist-on-close, which only root:// can ask for
NOT_PASSED = {
    "test_persist_on_close[root]": ("xfail", "[known_issues] 'persist_on_close[root]'"),
    "test_readv_repeated_chunk[root]": ("xfail", "[known_issues] 'readv_repeated_chunk[root]'"),
    "test_overwrite[root]": ("xfail", "[known_issues] 'overwrite'"),
    "test_overwrite[davs]": ("xfail", "[known_issues] 'overwrite'"),
    "test_persist_on_close[davs]": ("skip", "not an XRootD door: persist-on-close"),
}
CONFORMANCE_CHECKS = 17
#: suites/dcache/test_dcache_behaviour.py's checks by door: XRootD 5.5 accepts the
#: stage request; neither door takes a password login, and each check needs one protocol
BEHAVIOUR = {"test_prepare_stage[root]": "pass", "test_prepare_stage[davs]": "skip",
             "test_bad_logins_do_not_block_a_correct_client[root]": "skip",
             "test_bad_logins_do_not_block_a_correct_client[davs]": "skip"}


def _junit_outcomes(path: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(module, test id) -> ("pass"|"xfail"|"skip"|"fail", message) from the JUnit XML."""
    outcomes = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[2]
        outcome, message = "pass", ""
        for child in case:
            if child.tag == "skipped":
                outcome = "xfail" if child.get("type") == "pytest.xfail" else "skip"
            elif child.tag in ("failure", "error"):
                outcome = "fail"
            message = child.get("message") or ""
        outcomes[(module, case.get("name"))] = (outcome, message)
    return outcomes


def _assert_conformance(outcomes: dict) -> None:
    """The conformance checks ran over both doors: all pass but the known issues."""
    checks = {name: value for (module, name), value in outcomes.items()
              if module == "test_conformance"}
    assert len(checks) == 2 * CONFORMANCE_CHECKS, sorted(checks)
    assert {name.rpartition("[")[2] for name in checks} == {"root]", "davs]"}
    failing = {name: value for name, value in checks.items() if value[0] != "pass"}
    assert set(failing) == set(NOT_PASSED), failing
    for name, (outcome, words) in NOT_PASSED.items():
        assert failing[name][0] == outcome, (name, failing[name])
        assert words in failing[name][1], (name, failing[name])
    xfails = [message for outcome, message in failing.values() if outcome == "xfail"]
    assert all("known issue of xrootd 5.*" in message and "5.x.toml" in message
               for message in xfails), xfails


#: under xdist: 2 workers (as make test's -n 2), not 4: the same lock and merge between
#: processes, and measured side by side at load 35-42 the -n 4 run took 413 s of wall
#: time and 21.6 s of CPU in its pytest processes, the -n 2 run 306 s and 15.6 s
@pytest.mark.long_running
@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("protocol", ["root", "davs"])
def test_dcache_suite(pytester, small_plan, protocol, workers, monkeypatch):
    monkeypatch.setenv("STORAGESCALE_LARGE_MB", "4")
    results = pytester.path / "results.json"
    outcome = pytester.runpytest_subprocess(
        str(REPO / "suites" / "dcache"), f"--storage-thresholds={small_plan}",
        "--storage-embedded=xrootd",  # the suite's own default is the Apache door
        f"--storage-embedded-protocol={protocol}", "--storage-clients=2",
        f"--storage-scale={SCALE}",
        f"--storage-results={results}", "-n", workers, "-p", "no:cacheprovider",
        "--junitxml=junit.xml",
    )
    xfailed = sum(outcome == "xfail" for outcome, _ in NOT_PASSED.values())
    skips = list(BEHAVIOUR.values()).count("skip")
    outcome.assert_outcomes(
        passed=OWN_TESTS + 2 * CONFORMANCE_CHECKS - len(NOT_PASSED) + len(BEHAVIOUR) - skips,
        skipped=len(NOT_PASSED) - xfailed + skips, xfailed=xfailed)
    outcomes = _junit_outcomes(pytester.path / "junit.xml")
    assert {name: value[0] for (module, name), value in outcomes.items()
            if module == "test_dcache_behaviour"} == BEHAVIOUR
    own = {key: value for key, value in outcomes.items()
           if key[0] not in ("test_conformance", "test_dcache_behaviour")}
    assert len(own) == OWN_TESTS and all(value == ("pass", "") for value in own.values()), own
    _assert_conformance(outcomes)
    outcome.stdout.fnmatch_lines([
        f"storagescale: dcache 5.* at {protocol}://127.0.0.1:*",
        "*thresholds: *dcache/default.toml (matched version * with pattern '[*]'); plan scale 0.02",
        "op*clients*succeeded*rate*",
    ])
    # rows are in start order, which xdist shuffles: look for each on its own
    for row in ("ls *2*pass", "copyout *2*pass", "transactions *2*pass",
                "mixed/readers (alone)*info", "mixed/writers (alone)*info",
                "mixed/readers (mixed)*pass", "mixed/writers (mixed)*pass",
                "recovery (before)*info", "recovery (overload)*4*info",
                "recovery (probe 1)*"):
        outcome.stdout.fnmatch_lines([row])
    document = json.loads(results.read_text())
    steps = document["steps"]
    assert document["run"]["system"] == "dcache"
    ops = sorted({s["op"] for s in steps})
    assert ops == ["copyout", "ls", "ls_open", "mixed", "recovery", "streaming",
                   "streaming_mixed", "transactions"]
    streaming = next(s for s in steps if s["op"] == "streaming")
    assert streaming["verdict"] == "pass" and streaming["succeeded"] > 0
    assert streaming["derived"]["client_mb_s_min"] > 0, streaming["derived"]
    transactions = next(s for s in steps if s["op"] == "transactions")
    # the count bound, scaled with the files: 450 -> 9
    assert transactions["operations_bound"] == 9
    assert transactions["succeeded"] + transactions["failed"] == 9
    mixed = next(s for s in steps if s["op"] == "mixed" and s["label"] == "mixed")
    assert mixed["derived"]["mix_ratio"] > 0
    recovery = [s for s in steps if s["op"] == "recovery"]
    assert recovery[-1]["verdict"] == "pass" and recovery[-1]["derived"]["recovery_s"] >= 0
    # one merged results file; load steps never overlap, whatever the workers did
    intervals = sorted((s["lock_acquired"], s["ended"]) for s in steps)
    for (_, ended), (next_start, _) in zip(intervals, intervals[1:], strict=False):
        assert ended <= next_start, f"steps overlap: {intervals}"
    if workers != "0":
        assert len({s["worker"] for s in steps}) > 1, "all steps ran on one worker"
    # the step notes travel in the reports but stay out of the JUnit XML
    assert "storagescale_step" not in (pytester.path / "junit.xml").read_text()
