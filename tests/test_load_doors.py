"""Load steps over several doors of one storage (``--storage-load-doors``): the test
ids, the door in the results, the table's door column, the server's own log of the
davs requests, baselines matched by door, and a door the storage does not have."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pytest_storagescale.baseline import Baseline
from pytest_storagescale.config import parse_load_doors
from pytest_storagescale.errors import StorageScaleUsageError
from pytest_storagescale.records import RunInfo, StepRecord
from pytest_storagescale.reporting.table import COLUMNS, format_table

PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "1s"
warmup = "0s"
hang_timeout = "20s"

[ops.stat]
clients = [2]

[[ops.stat.expect]]
clients = "*"
rules = ["succeeded >= 1", "rate_hz >= 0.5 * baseline"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()
"""

#: the small stat step of the brief: 1 s, 2 clients
ARGS = ("--storage-thresholds=thr", "--storage-duration=1s", "--storage-clients=2",
        "-p", "no:cacheprovider", "-v")


def _suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "any.toml").write_text(PLAN)


def _table(lines: list[str]) -> list[str]:
    """The storagescale table: its header and rows (up to ``results:``)."""
    start = next(i for i, line in enumerate(lines) if re.match(r"op\s+(door\s+)?clients", line))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("results:"))
    return lines[start:end]


def _require_xrootd() -> None:
    if shutil.which("xrootd") is None and not Path("/usr/bin/xrootd").exists():
        pytest.fail("xrootd is not installed: run 'make setup'")


# -- the embedded xrootd's two doors -----------------------------------------------------

def test_stat_step_runs_over_root_and_davs_of_the_embedded_xrootd(pytester):
    _require_xrootd()
    _suite(pytester)
    result = pytester.runpytest_subprocess(*ARGS, "--storage-load-doors=all",
                                           "--storage-results=r.json", "--alluredir=allure")
    result.assert_outcomes(passed=2)
    # the door follows the scan's concurrency in the id: [c2] stays a prefix
    result.stdout.fnmatch_lines(["*test_stat[[]c2-root[]] PASSED*",
                                 "*test_stat[[]c2-davs[]] PASSED*"])
    document = json.loads((pytester.path / "r.json").read_text())
    assert document["run"]["door"] == "root"  # the endpoint's own door
    steps = document["steps"]
    assert [(s["door"], s["test"].rpartition("[")[2]) for s in steps] == [
        ("root", "c2-root]"), ("davs", "c2-davs]")]
    assert all(s["succeeded"] >= 1 for s in steps)
    table = _table(result.stdout.lines)
    assert table[0].split()[:3] == ["op", "door", "clients"]
    assert [row.split()[:3] for row in table[1:]] == [["stat", "root", "2"],
                                                     ["stat", "davs", "2"]]
    assert all(row.split()[-1] == "pass" for row in table[1:])
    # Allure: the door is a parameter of the step (and a label)
    doors = {}
    for path in (pytester.path / "allure").glob("*-result.json"):
        test = json.loads(path.read_text())
        parameters = {p["name"]: p["value"] for p in test["parameters"]}
        labels = {la["name"]: la["value"] for la in test["labels"]}
        doors[test["name"]] = (parameters["door"], labels["door"])
    assert doors == {"test_stat[c2-root]": ("'root'", "root"),
                     "test_stat[c2-davs]": ("'davs'", "davs")}


def test_an_unknown_door_is_one_usage_error_before_any_load(pytester):
    _suite(pytester)
    result = pytester.runpytest_subprocess(*ARGS, "--storage-load-doors=root,ftp",
                                           "--storage-results=r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert errors == ["ERROR: --storage-load-doors: unknown door 'ftp'. The doors of the "
                      "embedded xrootd: root, davs. Name some of those, or all; another door "
                      "of a remote storage is added with --storage-door NAME=URL."]
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert not (pytester.path / "r.json").exists()  # no step ran


@pytest.mark.parametrize("value", ["all,root", "root;davs", ",", "9p"])
def test_malformed_door_lists_are_refused(value):
    with pytest.raises(StorageScaleUsageError, match="--storage-load-doors: .* is not a list"):
        parse_load_doors(value)


def test_door_lists_parse():
    assert parse_load_doors("all") == ("all",)
    assert parse_load_doors(" root, davs ,root") == ("root", "davs")


# -- a remote storage with a davs door: the server's log, baselines ----------------------

def _http_requests(log: Path) -> int:
    """Requests XrdHttp traced (``http.trace all``: one ``Parsing first line: PROPFIND
    /path HTTP/1.1`` per request) in the server's log."""
    return len(re.findall(r"Parsing first line: [A-Z]+ /", log.read_text(errors="replace")))


def test_davs_steps_reach_the_davs_door_and_meet_the_davs_baseline(pytester):
    """A remote storage (an xrootd of the test's own, tracing its HTTP requests) with a
    davs door: the default run loads root alone (the table has no door column), the
    davs step's requests are in the server's log, and a baseline written without doors
    judges the root step only."""
    _require_xrootd()
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    _suite(pytester)
    with EmbeddedXRootD(extra_config="http.trace all") as server:
        args = [*ARGS, f"--storage-endpoint={server.url}",
                f"--storage-door=davs={server.https_url}",
                f"--storage-driver-option=ca_dir={server.ca_dir}"]
        before = _http_requests(server.log_path)

        # the default: the endpoint's door only; ids and table as before doors existed
        default = pytester.runpytest_subprocess(*args, "--storage-results=root.json")
        default.assert_outcomes(passed=1)
        default.stdout.fnmatch_lines(["*test_stat[[]c2[]] PASSED*"])
        assert "door" not in _table(default.stdout.lines)[0].split()
        assert _http_requests(server.log_path) == before  # root only: no HTTP request

        davs = pytester.runpytest_subprocess(*args, "--storage-load-doors=davs",
                                             "--storage-results=davs.json")
        davs.assert_outcomes(passed=1)
        davs.stdout.fnmatch_lines(["*test_stat[[]c2-davs[]] PASSED*"])
        # one door, not the endpoint's: the table names it
        assert [row.split()[:2] for row in _table(davs.stdout.lines)] == [
            ["op", "door"], ["stat", "davs"]]
        step = json.loads((pytester.path / "davs.json").read_text())["steps"][0]
        assert step["door"] == "davs" and step["succeeded"] >= 1
        # every stat the step counted was answered by XrdHttp: it is in the server's log
        assert _http_requests(server.log_path) - before >= step["succeeded"]

        # a baseline of an older release (no doors) whose root step was 1000x faster
        document = json.loads((pytester.path / "root.json").read_text())
        for record in [document["run"], *document["steps"]]:
            del record["door"]
        document["steps"][0]["succeeded"] *= 1000
        (pytester.path / "base.json").write_text(json.dumps(document))
        both = pytester.runpytest_subprocess(*args, "--storage-load-doors=all",
                                             "--storage-baseline=base.json",
                                             "--storage-results=both.json")
    both.assert_outcomes(passed=1, failed=1)
    both.stdout.fnmatch_lines(["*test_stat[[]c2-root[]] FAILED*",
                               "*test_stat[[]c2-davs[]] PASSED*",
                               "*stat step at 2 clients over the root door broke its thresholds*"])
    steps = {s["door"]: s for s in json.loads((pytester.path / "both.json").read_text())["steps"]}
    assert steps["root"]["baseline"]["matched"] is True
    assert steps["root"]["baseline"]["rate_change"] < -0.9  # against the 1000x rate
    assert steps["davs"]["baseline"]["matched"] is False  # not judged by the root step
    relative = [c for c in steps["davs"]["checks"] if c["relative"]]
    assert relative and all(c["passed"] is None for c in relative)
    # the table's rows (a 'gate:' line under it gives an inconclusive step's reason)
    lines = [row for row in _table(both.stdout.lines)[1:] if not row.startswith("gate:")]
    rows = [row.split() for row in lines]
    assert [(r[0], r[1], r[-1]) for r in rows] == [("stat", "root", "fail"),
                                                  ("stat", "davs", "pass")]
    # vs base: the rate's change (then the gate's ratio and verdict), 'new' unmatched
    assert re.search(r"\s-\d+%( |$)", lines[0]) and rows[1][-2] == "new"


# -- records, baselines and the table without a server -----------------------------------

def _step(door: str, clients: int = 2, succeeded: int = 10) -> StepRecord:
    return StepRecord.from_json({
        "step_id": f"main-{door}", "test": "t", "op": "stat", "operation": "stat",
        "clients": clients, "door": door, "verdict": "pass", "succeeded": succeeded,
        "failed": 0, "hung": 0, "bytes": 0, "duration_s": 1.0,
        "latency_s": {"p50": 0.001, "p99": 0.002},
    })


def _baseline(tmp_path: Path, steps: list[StepRecord], run_door: str, *,
              main_door: str | None) -> Baseline:
    run = RunInfo.from_json({"system": "xrootd", "version": "5.5.3", "door": run_door})
    path = tmp_path / f"base-{run_door or 'none'}.json"
    path.write_text(json.dumps({"run": run.to_json(),
                                "steps": [s.to_json() for s in steps]}))
    return Baseline(path, main_door=main_door)


def test_baseline_steps_match_by_door(tmp_path):
    root, davs = _step("root"), _step("davs")
    with_doors = _baseline(tmp_path, [_step("root", succeeded=99)], "root", main_door="root")
    assert with_doors.find(root).metric("succeeded") == 99
    assert with_doors.find(davs) is None
    # results written before doors: their steps are the baseline run's main door
    legacy = [_step("", succeeded=77)]
    old = _baseline(tmp_path, legacy, "", main_door="root")
    assert old.find(root).metric("succeeded") == 77
    assert old.find(davs) is None
    # this run's main door is davs: the door-less baseline judges the davs steps
    assert _baseline(tmp_path, legacy, "", main_door="davs").find(davs) is not None


def test_door_in_the_record_and_the_old_results_without_it():
    step = _step("davs")
    again = StepRecord.from_json(step.to_json())
    assert again.door == "davs" and again.key == ("stat", 2, None, None, "davs")
    old = json.loads((Path(__file__).parent / "data" / "results-0.1.0.json").read_text())
    record = StepRecord.from_json(old["steps"][0])
    assert record.door == "" and len(record.key) == 4
    assert RunInfo.from_json(old["run"]).door == ""


def test_the_table_has_a_door_column_only_for_several_doors():
    one = format_table([_step("root", 2), _step("root", 5)])
    assert one[0].split() == [c for column in COLUMNS for c in column.split()]
    assert format_table([_step("root")], main_door="root")[0] == one[0]
    several = format_table([_step("root"), _step("davs")])
    assert several[0].split()[:3] == ["op", "door", "clients"]
    assert [line.split()[1] for line in several[1:]] == ["root", "davs"]
    # one door that is not the endpoint's own is named too
    other = format_table([_step("davs")], main_door="root")
    assert [line.split()[:2] for line in other] == [["op", "door"], ["stat", "davs"]]


# -- a door that lists nothing (dcap): its service connections list elsewhere ---------

#: an embedded dCache's doors as the session names them (the davs URL with its password)
DCACHE_DOORS = {"davs": "davs://storagescale:pw@localhost:2880/storagescale",
                "root": "root://localhost:1094//storagescale",
                "srm": "srm://localhost:8443/storagescale",
                "dcap": "gsidcap://localhost:22128/storagescale",
                "gsiftp": "gsiftp://localhost:2811/storagescale"}


def _dcap_spec(**options):
    from pytest_storagescale.drivers.registry import driver_spec

    return driver_spec(DCACHE_DOORS["dcap"], options=options)


def test_a_dcap_door_lists_through_the_first_xrootd_door_else_webdav():
    """The session gives a dcap door's spec the option naming the door its service
    connections list through: the storage's first XRootD door, else its WebDAV door
    (its URL without the password: the dcap client's proxy logs in there); a door that
    lists, and a dcap door given one, are left as they are; no such door, none."""
    from pytest_storagescale.session.endpoint import with_listing_door

    spec = with_listing_door(_dcap_spec(), DCACHE_DOORS)
    assert spec.options["listing_door"] == "root://localhost:1094//storagescale"
    no_root = {k: v for k, v in DCACHE_DOORS.items() if k != "root"}
    spec = with_listing_door(_dcap_spec(), no_root)
    assert spec.options["listing_door"] == "davs://localhost:2880/storagescale"
    assert "pw" not in repr(spec) and "pw" not in spec.options["listing_door"]
    given = _dcap_spec(listing_door="davs://door:443/area")
    assert with_listing_door(given, DCACHE_DOORS) is given
    only = {k: v for k, v in DCACHE_DOORS.items() if k in ("dcap", "srm", "gsiftp")}
    assert "listing_door" not in with_listing_door(_dcap_spec(), only).options
    from pytest_storagescale.drivers.registry import driver_spec

    root = driver_spec(DCACHE_DOORS["root"])
    assert with_listing_door(root, DCACHE_DOORS) is root


@pytest.mark.parametrize(("value", "words"), [
    ("srm://door:8443/area", "not the URL of an XRootD or WebDAV door"),
    ("not a url", "not the URL of an XRootD or WebDAV door"),
    ("davs://user:secret@door:443/area", "without user or password"),
])
def test_a_listing_door_that_cannot_list_is_one_usage_error(value, words):
    with pytest.raises(StorageScaleUsageError, match=words) as caught:
        _dcap_spec(listing_door=value)
    assert "secret" not in str(caught.value)


def test_a_dcap_load_client_never_lists_through_the_other_door():
    """A load client (the engine gave it its step's stop: ``Driver.halted``) is refused
    a listing before anything is sent, saying why (its step would measure the other
    door); a service connection is refused a path outside the dcap door's test area;
    without a listing door, the listing is refused as before (libdcap's call back)."""
    import threading

    from pytest_storagescale.errors import StorageError

    spec = _dcap_spec(listing_door=DCACHE_DOORS["root"])
    load = spec.client(0, timeout=5)
    load.halted = threading.Event()
    with pytest.raises(StorageError, match="a load client never lists through the other"):
        load.ls("/storagescale/run")
    service = spec.connect("cleanup", timeout=5)
    with pytest.raises(StorageError, match="outside the dcap door's test area"):
        service.ls("/elsewhere/run")
    bare = _dcap_spec().connect("cleanup", timeout=5)
    with pytest.raises(StorageError, match="listing is not sent.*every interface"):
        bare.ls("/storagescale/run")
    for client in (load, service, bare):
        client.close()
