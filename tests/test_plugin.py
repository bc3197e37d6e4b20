"""The plugin as a user meets it: options, header, parametrization, verdicts, results.

These runs use the reference driver (``file://`` endpoints) so they are fast; the
same paths against a real server are in ``test_xrootd_integration.py``.
"""

from __future__ import annotations

import json

import pytest
from faults import progress_conftest

THRESHOLDS = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "0.3s"
warmup = "0s"
hang_timeout = "5s"

[ops.stat]
clients = [1, 3]

[[ops.stat.expect]]
clients = "*"
rules = ["failed == 0", "hung == 0", "rate_hz >= RATE"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat_scan(storage_load, storage_clients):
    storage_load.run()

@pytest.mark.storagescale_op("put")
def test_put_scan(storage_load, storage_clients):
    storage_load.run()
"""


@pytest.fixture
def suite(pytester, tmp_path):
    """A suite folder with a thresholds file; returns the args pointing at a file:// area."""
    area = tmp_path / "area"
    area.mkdir()

    def make(rate: str = "1", thresholds: str = THRESHOLDS) -> list[str]:
        pytester.makepyfile(test_suite=SUITE)
        folder = pytester.path / "thr" / "xrootd"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "any.toml").write_text(thresholds.replace("RATE", rate))
        return [f"--storage-endpoint=file://{area}", "--storage-version=1.0",
                "--storage-thresholds=thr", "-p", "no:cacheprovider"]

    make.area = area  # type: ignore[attr-defined]
    return make


def test_scan_is_parametrized_from_thresholds_and_passes(pytester, suite):
    args = suite()
    result = pytester.runpytest(*args, "-rs", "--storage-results=out/results.json")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines([
        "collected 3 items",
        "storagescale: xrootd 1.0 (from --storage-version): thresholds *thr/xrootd/any.toml "
        "(matched version 1.0 with pattern '[*]')",
        "storagescale: xrootd 1.0 at file://* (version from --storage-version)",
        "*thresholds: *any.toml (matched version 1.0 with pattern '[*]')",
        "op*clients*succeeded*rate*MB/s*failed*hung*p50*p99*verdict",
        "stat*1*Hz*-*0*0*pass",
        "stat*3*Hz*-*0*0*pass",
        "*SKIPPED*has no [[]ops.put[]] section*",
    ])
    document = json.loads((pytester.path / "out" / "results.json").read_text())
    assert document["run"]["version"] == "1.0" and document["run"]["system"] == "xrootd"
    assert document["run"]["client"]["versions"]["pytest"]
    steps = document["steps"]
    assert [s["clients"] for s in steps] == [1, 3]
    for step in steps:
        for key in ("test", "op", "clients", "duration_s", "started", "ended", "succeeded",
                    "failed", "hung", "rate_hz", "mb_s", "latency_s", "errors", "verdict",
                    "violations"):
            assert key in step, key
        assert step["succeeded"] > 0 and step["verdict"] == "pass"
        assert step["rate_hz"] == pytest.approx(step["succeeded"] / step["duration_s"])
        assert set(step["latency_s"]) >= {"p50", "p90", "p99", "max"}
        assert step["ended"] > step["started"]
    # the run's directory is removed at the end; nothing else was touched
    assert list(suite.area.iterdir()) == []


def test_clients_option_overrides_scan_list(pytester, suite):
    result = pytester.runpytest(*suite(), "--storage-clients=2", "-v")
    result.stdout.fnmatch_lines(["*test_stat_scan[[]c2[]] PASSED*"])
    result.assert_outcomes(passed=1, skipped=1)


def test_broken_rule_fails_with_violation_table(pytester, suite):
    result = pytester.runpytest(*suite(rate="1e12"), "--storage-clients=1")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "*stat step at 1 clients broke its thresholds (*any.toml, matched version 1.0*",
        "*metric*observed*limit*rule*file*result*",
        "*rate_hz*>= 1e+12*rate_hz >= 1e12*any.toml*VIOLATED*",
        "stat*1*fail",
    ])
    assert "Traceback" not in result.stdout.str()


def test_header_names_each_setting_and_its_source(pytester, suite, monkeypatch):
    args = suite()
    pytester.makeini("[pytest]\nstorage_executor = processes\n")
    monkeypatch.setenv("STORAGESCALE_HANG_TIMEOUT", "7s")
    result = pytester.runpytest(*args, "--storage-duration=2s", "--collect-only")
    result.stdout.fnmatch_lines([
        "storagescale: endpoint file://*",
        "  storage_version: 1.0 (from --storage-version)",
        "  storage_duration: 2.0 (from --storage-duration)",
        "  storage_hang_timeout: 7.0 (from $STORAGESCALE_HANG_TIMEOUT)",
        "  storage_executor: processes (from ini storage_executor)",
    ])


def test_header_shows_the_defaults_and_how_clients_run_only_under_v(pytester, suite):
    args = suite()
    quiet = pytester.runpytest(*args, "--collect-only")
    header = [line for line in quiet.stdout.lines if line.startswith("  ")]
    assert header and not any("(from default)" in line for line in header), header
    assert not any(line.startswith("  clients:") for line in header), header
    assert all(len(line) < 200 for line in header), header
    verbose = pytester.runpytest(*args, "--collect-only", "-v")
    verbose.stdout.fnmatch_lines(["  storage_executor: auto (from default)",
                                  "  clients: threads of one process*"])


def test_skips_of_one_reason_are_one_summary_line(pytester, suite):
    """Tests that use the storage and skip for the same reason at different lines: one
    "SKIPPED [n]" line (pytest folds by line); a test without storage keeps its line."""
    args = suite()
    pytester.makepyfile(test_suite="""
        import pytest

        def test_one(storage_endpoint):
            pytest.skip("no redirector here")

        def test_two(storage_endpoint):
            x = 1
            pytest.skip("no redirector here")

        @pytest.mark.parametrize("n", [1, 2])
        def test_more(storage_endpoint, n):
            pytest.skip("no redirector here")

        def test_plain():
            pytest.skip("not about storage")
    """)
    result = pytester.runpytest(*args, "-rs")
    result.assert_outcomes(skipped=5)
    result.stdout.fnmatch_lines(["SKIPPED [[]4[]] test_suite.py: no redirector here",
                                 "SKIPPED [[]1[]] test_suite.py:15: not about storage"])


@pytest.mark.parametrize(
    "option, message",
    [
        ("--storage-executor=fibers",
         "ERROR: --storage-executor: unknown value 'fibers'. Valid values: threads, processes, auto."),
        ("--storage-duration=soon", "ERROR: --storage-duration: 'soon' is not a duration.*"),
        ("--storage-clients=many", "ERROR: --storage-clients: 'many' is not a list*"),
        ("--storage-driver=curl",
         "ERROR: unknown driver 'curl'. Known drivers: xrootd, http, gfal2, local, memory*"),
        ("--storage-scale=2", "ERROR: --storage-scale: '2' is not a plan scale*"),
        ("--storage-driver-option=token", "ERROR: --storage-driver-option: '[*][*][*]' is not key=value*"),
    ],
)
def test_bad_option_is_one_error_line(pytester, suite, option, message):
    result = pytester.runpytest(*suite(), option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_bad_thresholds_file_is_a_usage_error(pytester, suite):
    args = suite(thresholds=THRESHOLDS.replace("failed == 0", "failures == 0"))
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: *any.toml: [[]ops.stat.expect[]][[]0[]].rules[[]0[]]: unknown metric 'failures'*"]
    )
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_no_file_for_version_is_a_usage_error(pytester, suite):
    args = suite(thresholds=THRESHOLDS.replace('["*"]', '["5.5.*"]'))
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: *no thresholds file matches xrootd version '1.0'*"])


@pytest.mark.parametrize(
    "endpoint, message",
    [
        ("gopher://host/x", "ERROR: --storage-endpoint gopher://host/x: no driver serves gopher://*"),
        ("root://host:1094", "ERROR: --storage-endpoint: *has no test-area path*"),
    ],
)
def test_bad_endpoint_url(pytester, suite, endpoint, message):
    args = [a for a in suite() if not a.startswith("--storage-endpoint")]
    result = pytester.runpytest(*args, f"--storage-endpoint={endpoint}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_steps_survive_a_crashed_xdist_worker(pytester, suite):
    """A worker that dies right after its step: the step is still in the results."""
    args = suite()
    pytester.makepyfile(test_suite="""
        import os
        import pytest

        @pytest.mark.storagescale_op("stat")
        def test_stat_then_crash(storage_load, storage_clients):
            storage_load.run()
            if storage_clients == 1:
                os._exit(3)  # the worker dies before reporting this test
    """)
    result = pytester.runpytest_subprocess(*args, "-n", "2", "--storage-results=r.json")
    result.stdout.fnmatch_lines(["*crashed while running*test_stat_then_crash*c1*"])
    steps = json.loads((pytester.path / "r.json").read_text())["steps"]
    assert sorted(s["clients"] for s in steps) == [1, 3]
    for row in ("stat *1 *pass", "stat *3 *pass"):  # in start order, which varies
        result.stdout.fnmatch_lines([row])


#: a conftest that kills its own xdist worker (SIGKILL) once, from the step's own
#: progress (the live progress, quiet without a terminal, replaced): mid-step
KILLING_CONFTEST = progress_conftest("""\
if state.succeeded > 0 and not Path("killed").exists():
    Path("killed").write_text(os.environ["PYTEST_XDIST_WORKER"])
    os.kill(os.getpid(), signal.SIGKILL)""", imports="import os\nimport signal\nfrom pathlib import Path")


def test_a_step_whose_xdist_worker_is_killed_is_an_error_naming_it(pytester, suite):
    args = suite()
    pytester.makeconftest(KILLING_CONFTEST)
    result = pytester.runpytest_subprocess(*args, "-k", "stat", "-n", "2",
                                           "--storage-duration=3s", "--storage-results=r.json")
    killed = (pytester.path / "killed").read_text()
    result.stdout.fnmatch_lines([f"*worker '{killed}' crashed while running*test_stat_scan*"])
    steps = json.loads((pytester.path / "r.json").read_text())["steps"]
    assert sorted(step["verdict"] for step in steps) == ["error", "pass"], steps
    [lost] = [step for step in steps if step["verdict"] == "error"]
    assert lost["worker"] == killed
    assert f"the xdist worker {killed} was lost mid-step" in lost["error"]
    result.stdout.fnmatch_lines(["stat *error*"])


def test_under_xdist_each_finished_step_is_a_line_and_the_table_is_in_test_order(
        pytester, suite):
    """The controller (no live progress under -n) says each step as it is logged, and
    its table groups each test's scan in concurrency order, whatever order the
    workers ran them in."""
    plan = THRESHOLDS.replace("clients = [1, 3]", "clients = [1, 2, 3]") + (
        '\n[ops.again]\nop = "stat"\nclients = [1, 2, 3]\n')
    args = suite(thresholds=plan)
    pytester.makepyfile(test_suite="""
        import pytest

        @pytest.mark.storagescale_op("stat")
        def test_stat_scan(storage_load, storage_clients):
            storage_load.run()

        @pytest.mark.storagescale_op("again")
        def test_again_scan(storage_load, storage_clients):
            storage_load.run()
    """)
    result = pytester.runpytest_subprocess(*args, "-n", "2", "--storage-results=r.json")
    result.assert_outcomes(passed=6)
    out = result.stdout.lines
    for test, section in (("test_stat_scan", "stat"), ("test_again_scan", "again")):
        for clients in (1, 2, 3):
            result.stdout.fnmatch_lines([
                f"storagescale: {test}[[]c{clients}[]] {section} at {clients} clients over "
                f"file: * Hz, failed 0, hung 0: pass"])
    rows = [line.split()[:2] for line in out if line.split()[:1] in (["stat"], ["again"])]
    assert len(rows) == 6, out
    assert [clients for _, clients in rows] == ["1", "2", "3"] * 2, rows
    assert {section for section, _ in rows[:3]} != {section for section, _ in rows[3:]}
    assert len({section for section, _ in rows[:3]}) == 1, rows  # one scan after the other


def test_table_order_is_by_test_then_concurrency_then_start():
    from pytest_storagescale.records import StepRecord
    from pytest_storagescale.reporting.table import table_order

    def step(test, clients, started, label=None):
        return StepRecord(f"s{started}", f"t.py::{test}", "stat", "stat", clients,
                          started=started, label=label)

    ran = [step("test_b[c5]", 5, 1), step("test_a[c50]", 50, 2), step("test_b[c1]", 1, 3),
           step("test_a[c5]", 5, 4), step("test_rec", 2, 5, "before"),
           step("test_rec", 90, 6, "overload"), step("test_rec", 2, 7, "probe 1")]
    assert [(s.test.partition("::")[2], s.clients) for s in table_order(ran)] == [
        ("test_b[c1]", 1), ("test_b[c5]", 5), ("test_a[c5]", 5), ("test_a[c50]", 50),
        ("test_rec", 2), ("test_rec", 90), ("test_rec", 2)]  # a test's steps as they ran


def test_bad_thresholds_under_xdist_is_one_paragraph_and_exit_4(pytester, suite, monkeypatch):
    """Both workers refuse the file while collecting; the controller says it once on
    stderr, exit status 4, as a run without -n (CI=true: pytest's summary lines are not
    shortened, as on a CI runner)."""
    monkeypatch.setenv("CI", "true")
    args = suite(thresholds=THRESHOLDS.replace("failed == 0", "failures == 0"))
    result = pytester.runpytest_subprocess(*args, "-n", "2")
    said = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, said
    result.stderr.fnmatch_lines([
        "ERROR: *any.toml: [[]ops.stat.expect[]][[]0[]].rules[[]0[]]: unknown metric 'failures'*",
    ])
    assert said.count("unknown metric 'failures'") == 1, said
    assert "Traceback" not in said and "INTERNALERROR" not in said
    assert " passed" not in said


def test_storage_system_option_picks_the_thresholds_folder(pytester, suite):
    args = suite()
    other = pytester.path / "thr" / "gpfs"
    other.mkdir(parents=True)
    (other / "any.toml").write_text(THRESHOLDS.replace('system = "xrootd"', 'system = "gpfs"')
                                    .replace("clients = [1, 3]", "clients = [2]")
                                    .replace("RATE", "1"))
    result = pytester.runpytest(*args, "--storage-system=gpfs", "-v")
    result.stdout.fnmatch_lines([
        "*test_stat_scan[[]c2[]] PASSED*",
        "storagescale: gpfs 1.0 at file://*",
        "*thresholds: *thr/gpfs/any.toml*",
    ])
    missing = pytester.runpytest(*args, "--storage-system=eos")
    assert missing.ret == pytest.ExitCode.USAGE_ERROR
    missing.stderr.fnmatch_lines(["ERROR: *no thresholds folder for storage system 'eos'*"])


def test_processes_executor_through_the_plugin(pytester, suite):
    result = pytester.runpytest(*suite(), "--storage-executor=processes",
                                "--storage-clients=3", "--storage-results=r.json")
    result.assert_outcomes(passed=1, skipped=1)
    step = json.loads((pytester.path / "r.json").read_text())["steps"][0]
    assert step["executor"] == "processes" and step["succeeded"] > 0 and step["hung"] == 0


#: counts the resolutions of the endpoint's driver (each driver_spec() runs the driver
#: class's check_options once) and writes them at the session's end
COUNTING_CONFTEST = """
from pathlib import Path
from pytest_storagescale.drivers.local import LocalDriver

RESOLVED = []
_check = LocalDriver.check_options.__func__

def _counting(cls, options):
    RESOLVED.append(1)
    return _check(cls, options)

LocalDriver.check_options = classmethod(_counting)

def pytest_sessionfinish(session):
    Path("resolved").write_text(str(len(RESOLVED)))
"""


def test_the_endpoint_is_resolved_once_whatever_the_number_of_steps(pytester, suite):
    """The driver spec of the endpoint and its doors is resolved once per session
    (session/endpoint.ResolvedEndpoint), not again per step: as many resolutions for
    a scan of 1 step as for a scan of 4 (was 3-7 per step)."""
    pytester.makeconftest(COUNTING_CONFTEST)
    counts = []
    for clients in ("[1]", "[1, 2, 3, 4]"):
        args = suite(thresholds=THRESHOLDS.replace("clients = [1, 3]", f"clients = {clients}"))
        result = pytester.runpytest_subprocess(*args, "-k", "stat")
        result.assert_outcomes(passed=clients.count(",") + 1)
        counts.append(int((pytester.path / "resolved").read_text()))
    assert counts[0] == counts[1], counts
    assert counts[0] <= 3, counts  # the endpoint, and its door's spec
