"""The reporting functions on typed step records: table, CSV/HTML, benchmark export,
results file, plots, Allure categories, progress line. No server needed: the records
are built here the way the engine fills them."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_storagescale.errors import StorageError, StorageScaleUsageError
from pytest_storagescale.load.plan import StepProgress
from pytest_storagescale.load.stats import SideResult, StepResult, latency_summary, new_histogram
from pytest_storagescale.records import (
    BaselineComparison,
    ClientInfo,
    RuleCheck,
    RunInfo,
    StepRecord,
    Verdict,
)
from pytest_storagescale.reporting import plots
from pytest_storagescale.reporting.allure_report import (
    categories,
    storage_failures,
    write_session_files,
)
from pytest_storagescale.reporting.benchmark_json import benchmark_document, write_benchmark_json
from pytest_storagescale.reporting.html import table_csv, table_html, write_report
from pytest_storagescale.reporting.outcomes import RunSummary, TestOutcome, TestOutcomes
from pytest_storagescale.reporting.progress import LiveProgress
from pytest_storagescale.reporting.results import ResultsFile
from pytest_storagescale.reporting.table import format_table, format_violations

REPO = Path(__file__).resolve().parent.parent
ALLURE = REPO / ".tools" / "node_modules" / ".bin" / "allure"


def side(clients=50, *, succeeded=500, failed=0, hung=0, nbytes=0, duration_s=10.0,
         latencies=((0.004, 98), (0.012, 2)), timeline=None) -> SideResult:
    histogram = new_histogram()
    for seconds, count in latencies:
        histogram.record_value(int(seconds * 1e6), count)
    return SideResult(
        clients=clients, duration_s=duration_s, succeeded=succeeded, failed=failed,
        hung=hung, bytes=nbytes, latency_s=latency_summary(histogram), errors={},
        error_examples={}, timeline=timeline or {}, histogram=histogram.encode().decode(),
    )


def record(section="stat", clients=50, *, sides=None, verdict=Verdict.PASS, label=None,
           warmup_s=0.0, started=1000.0, ended=None, **fields) -> StepRecord:
    sides = sides if sides is not None else {section: side(clients)}
    result = None
    if sides:
        duration = next(iter(sides.values())).duration_s
        result = StepResult(section, clients, started,
                            ended if ended is not None else started + warmup_s + duration + 1,
                            duration, warmup_s, sides)
    return StepRecord(step_id=f"main-{section}-{clients}", test=f"suite.py::test_{section}",
                      section=section, operation=section, clients=clients, label=label,
                      result=result, verdict=verdict, warmup_s=warmup_s, started=started,
                      system="xrootd", **fields)


RUN = RunInfo(
    endpoint="root://localhost:1094//data", endpoint_id="embedded xrootd (root)",
    embedded=True, system="xrootd", version="5.6.1", version_source="probed",
    thresholds_file="thresholds/xrootd/5.toml", thresholds_reason="matches 5.6.1",
    run_id="run-1", started=1_700_000_000.0, executor="threads", driver="xrootd",
    client=ClientInfo(host="ci-1", user="me", versions={"pytest": "9.2.0"}, argv=["pytest"]),
)


def mixed() -> StepRecord:
    return record("mixed", 4, label="mixed", sides={
        "readers": side(4, succeeded=40, nbytes=400_000_000),
        "writers": side(4, succeeded=20, nbytes=100_000_000, failed=1),
    })


# -- table -----------------------------------------------------------------------------

def test_table_text_plain_composite_and_unmeasured_steps():
    steps = [record(), mixed(),
             record("get", 3, sides={}, verdict=Verdict.ERROR, error="could not connect")]
    assert format_table(steps) == [
        "op                     clients  succeeded     rate  MB/s  failed  hung     p50    p99"
        "  verdict",
        "stat                        50        500  50.0 Hz     -       0     0  4.0 ms  12 ms"
        "  pass",
        "mixed/readers (mixed)        4         40  4.00 Hz  40.0       0     0  4.0 ms  12 ms"
        "  pass",
        "mixed/writers (mixed)        4         20  2.00 Hz  10.0       1     0  4.0 ms  12 ms"
        "  pass",
        "get                          3          -        -     -       -     -       -      -"
        "  error",
    ]


def test_table_baseline_column():
    compared = record(baseline=BaselineComparison("old.json", "5.5", True, 60.0, -0.12))
    new = record("ls", 5, baseline=BaselineComparison("old.json", "5.5", False))
    plain = record("put", 5)
    assert format_table([compared, new, plain]) == [
        "op    clients  succeeded     rate  MB/s  failed  hung     p50    p99  vs base  verdict",
        "stat       50        500  50.0 Hz     -       0     0  4.0 ms  12 ms     -12%  pass",
        "ls          5        500  50.0 Hz     -       0     0  4.0 ms  12 ms      new  pass",
        "put         5        500  50.0 Hz     -       0     0  4.0 ms  12 ms           pass",
    ]
    assert "vs base" not in format_table([plain])[0]


def test_derived_metrics_column():
    """The seeds' key numbers: mix_ratio on a mixed step's first row, recovery_s
    (infinite: never recovered) on the probe's; plain numbers in the CSV."""
    mixing = mixed()
    mixing.derived = {"mix_ratio": 0.8712}
    probe = record("recovery", 1, label="probe 2", derived={"recovery_s": 12.5})
    never = record("recovery", 1, label="probe 9", derived={"recovery_s": math.inf})
    lines = format_table([record(), mixing, probe, never])
    assert lines[0].split() == ["op", "clients", "succeeded", "rate", "MB/s", "failed",
                                "hung", "p50", "p99", "derived", "verdict"]
    at = lines[0].index("derived")  # the column's text starts under its name
    assert [line[at:].split("  ")[0] for line in lines[1:]] == [
        "", "mix_ratio 0.871", "", "recovery_s 12.50 s", "recovery_s never"]
    assert "derived" not in format_table([record()])[0]
    csv = table_csv([record(), mixing, probe, never]).splitlines()
    assert csv[0].split(",")[9:11] == ["mix_ratio", "recovery_s"]
    assert [line.split(",")[9:11] for line in csv[1:]] == [
        ["", ""], ["0.8712", ""], ["", ""], ["", "12.5"], ["", "inf"]]
    assert "<td>mix_ratio 0.871</td>" in table_html([mixing])


def test_a_mean_and_its_deviation_are_one_cell_with_an_error_bar():
    """Seed 001 wrote its dd tries as "8.13 +/- 0.48 MB/sec": a ``*_mean`` beside its
    ``*_stddev`` is one ``mb_s 8.13 ± 0.48`` in the table; the CSV keeps both columns."""
    tries = record("dd_direct", 1, label="try 10/10", derived={
        "mb_s_mean": 8.13, "mb_s_stddev": 0.48, "rate_hz_mean": 0.13,
        "rate_hz_stddev": 0.0077, "mix_ratio": 0.5})
    lines = format_table([tries])
    at = lines[0].index("derived")
    assert lines[1][at:].split("  ")[0] == (
        "mb_s 8.13 ± 0.48, rate_hz 0.13 ± 0.0077, mix_ratio 0.5")
    assert table_csv([tries]).splitlines()[0].split(",")[9:13] == [
        "mb_s_mean", "mb_s_stddev", "rate_hz_mean", "rate_hz_stddev"]


def test_violations_table():
    checks = [
        RuleCheck("rate_hz >= 100", "rate_hz", ">=", 100.0, 50.0, False),
        RuleCheck("hung == 0", "hung", "==", 0.0, 0.0, True),
        RuleCheck("rate_hz >= 0.9 * baseline", "rate_hz", ">=", None, 50.0, None, relative=True),
    ]
    lines = format_violations(checks, "t.toml")
    assert lines[0].split() == ["metric", "observed", "limit", "rule", "file", "result"]
    assert lines[1].split() == ["rate_hz", "50", ">=", "100", "rate_hz", ">=", "100", "t.toml",
                                "VIOLATED"]
    assert lines[2].split()[-1] == "ok" and lines[3].endswith("not checked")
    assert "(no baseline)" in lines[3]


def test_csv_and_html():
    steps = [record(), mixed(), record("get", 3, sides={}, verdict=Verdict.ERROR)]
    csv = table_csv(steps).splitlines()
    # the units in the header (the results' metric names), plain numbers in the cells,
    # empty when not measured; always the client CPU column (not measured here)
    assert csv[0] == ("op,clients,succeeded,rate_hz,mb_s,failed,hung,p50_s,p99_s,client_cpu,"
                      "client_saturated,verdict")
    assert csv[1] == "stat,50,500,50,,0,0,0.004001,0.012007,,,pass"
    assert csv[2] == "mixed/readers (mixed),4,40,4,40,0,0,0.004001,0.012007,,,pass"
    assert csv[4] == "get,3,,,,,,,,,,error" and len(csv) == 5
    page = table_html(steps)
    assert page.count('<tr class="pass">') == 3 and page.count('<tr class="error">') == 1
    assert "<td>mixed/readers (mixed)</td>" in page


def test_csv_has_the_throttled_and_redirect_counts_of_the_steps_that_have_some():
    """throttled, redirects and door_latency_s after hung, as the table shows the
    counts: plain numbers, the door time empty where not timed (XRootD's redirects)."""
    davs, root = side(), side()
    davs.throttled, davs.redirects, davs.door_seconds = 3, 500, 2.5
    root.redirects = 400
    steps = [record(sides={"stat": davs}), record("get", sides={"get": root}),
             record("ls", 3, sides={}, verdict=Verdict.ERROR)]
    csv = table_csv(steps).splitlines()
    assert csv[0].startswith("op,clients,succeeded,rate_hz,mb_s,failed,hung,throttled,"
                             "redirects,door_latency_s,p50_s,p99_s,")
    assert csv[1].startswith("stat,50,500,50,,0,0,3,500,0.005,0.004001,")
    assert csv[2].startswith("get,50,500,50,,0,0,0,400,,0.004001,")
    assert csv[3] == "ls,3,,,,,,,,,,,,,error"
    assert table_csv([record()]).splitlines()[0] == (  # none: no such columns
        "op,clients,succeeded,rate_hz,mb_s,failed,hung,p50_s,p99_s,client_cpu,"
        "client_saturated,verdict")


def test_report_page(tmp_path):
    steps = [record(clients=5), record(clients=50), mixed(),
             record("get", 3, sides={}, verdict=Verdict.ERROR)]
    summary = RunSummary("FAILED", 1, {"failed": 1, "passed": 1}, [
        TestOutcome("t.py::test_put", "functional", "failed", "StorageError: <refused>"),
        TestOutcome("t.py::test_stat[c5]", "load", "passed")], "run-1", RUN.started, "e")
    page = write_report(tmp_path / "report", RUN, steps, summary).read_text()
    # one scan (stat: the labelled and the unmeasured steps are no scan), 3 measured x 2
    assert page.count("data:image/png;base64,") == 1 + 3 * 2
    assert "scan stat" in page
    # the verdict first, then the run's facts, the tests (causes escaped), the steps
    body = page[page.index("<body>"):]
    assert body.index("<h1 class='verdict failed'>FAILED</h1>") < body.index("<h2>Tests")
    assert "1 failed, 1 passed (pytest exit status 1)" in page
    for fact in ("xrootd 5.6.1 (probed)", "run-1", "2023-11-14 22:13:20 UTC", "plan scale"):
        assert fact in body[:body.index("<h2>Tests")], fact
    assert body.index("StorageError: &lt;refused&gt;") < body.index("<h2>Load steps")
    assert (tmp_path / "report" / "table.csv").read_text().count("\n") == 1 + 5


_OUTCOMES = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_load():
    pass

class TestSiteConformance:
    def test_check(self):
        pytest.fail("root door (root://h//a): checksum adler32 /a/f: the storage answered "
                    "an error; expected success.", pytrace=False)

def test_assert():
    answer = ["b"]
    assert answer == ["a", "b"]

@pytest.fixture
def broken():
    raise RuntimeError("no client certificate in /tmp/x")

def test_error(broken):
    pass

def test_missing_fixture(no_such_fixture):
    pass

def test_skip():
    pytest.skip("no davs door")

@pytest.mark.xfail(reason="known issue", strict=True)
def test_xpass():
    pass

@pytest.mark.xfail(reason="known issue")
def test_xfail():
    assert False
"""


def test_every_test_outcome_and_its_cause(pytester):
    """What the HTML report lists: each test's kind, outcome (as pytest counts it) and
    cause (the message, not the traceback), failures first."""
    pytester.makepyfile(test_outcomes=_OUTCOMES)
    run = SimpleNamespace(run_id="run-1", started=1.0, endpoint=SimpleNamespace(display="e"))
    outcomes = TestOutcomes(run)
    pytester.inline_run("-p", "no:storagescale", "-p", "no:cacheprovider", plugins=[outcomes])
    summary = outcomes.summary(1)
    found = {t.nodeid.rpartition("::")[2]: (t.kind, t.outcome, t.cause) for t in summary.tests}
    assert found["test_load"] == ("load", "passed", "")
    assert found["test_check"] == ("conformance", "failed", "root door (root://h//a): checksum "
                                   "adler32 /a/f: the storage answered an error; expected "
                                   "success.")
    kind, outcome, cause = found["test_assert"]
    assert (kind, outcome) == ("functional", "failed")
    assert cause.removeprefix("AssertionError: ").startswith("assert ['b'] == ['a', 'b']")
    assert found["test_error"] == ("functional", "error",
                                   "RuntimeError: no client certificate in /tmp/x")
    assert found["test_missing_fixture"][1:] == ("error", "fixture 'no_such_fixture' not found")
    assert found["test_skip"][1:] == ("skipped", "no davs door")
    assert found["test_xpass"][1] == "failed" and "XPASS(strict)" in found["test_xpass"][2]
    assert found["test_xfail"][1] == "xfailed"
    assert [t.outcome for t in summary.tests] == [
        "failed", "failed", "failed", "error", "error", "skipped", "xfailed", "passed"]
    assert summary.verdict == "FAILED" and summary.counts_text == (
        "3 failed, 2 error, 1 skipped, 1 xfailed, 1 passed")
    assert outcomes.summary(0).verdict == "FAILED"  # never green beside a red test
    assert all("Traceback" not in t.cause and "def test_" not in t.cause
               for t in summary.tests)


# -- benchmark export ------------------------------------------------------------------

def test_benchmark_document_and_pytest_benchmark_compare(tmp_path):
    steps = [record(clients=5), mixed(), record("get", 3, sides={}, verdict=Verdict.ERROR)]
    steps[0].sides["stat"].redirects = 7  # a door's redirects to its data servers
    document = benchmark_document(RUN, steps)
    names = [b["name"] for b in document["benchmarks"]]
    assert names == ["stat[c5]", "mixed[c4] (mixed)"]  # no latencies, no benchmark
    stat = document["benchmarks"][0]
    assert stat["stats"]["rounds"] == 500 and stat["stats"]["ops"] == 50.0
    assert stat["stats"]["min"] <= stat["stats"]["median"] <= stat["stats"]["max"]
    assert stat["extra_info"]["verdict"] == "pass" and stat["group"] == "xrootd stat"
    assert stat["extra_info"]["redirects"] == 7
    assert document["benchmarks"][1]["stats"]["rounds"] == 60  # both sides
    write_benchmark_json(tmp_path / "old.json", RUN, steps)
    write_benchmark_json(tmp_path / "new.json", RUN, steps)
    compare = shutil.which("pytest-benchmark", path=str(Path(sys.executable).parent))
    assert compare, "pytest-benchmark is a test dependency (pip install -e .[test])"
    done = subprocess.run([compare, "compare", str(tmp_path / "old.json"),
                           str(tmp_path / "new.json"), "--group-by", "name",
                           "--columns", "min,median,max,ops"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert done.returncode == 0, done.stderr
    assert "benchmark 'stat[c5]': 2 tests" in done.stdout


# -- results file ----------------------------------------------------------------------

def test_results_file_round_trip(tmp_path):
    derived = record("mixed", 4, label="mixed", sides=mixed().sides,
                     derived={"mix_ratio": 0.8, "recovery_s": float("inf")})
    steps = [record(), derived, record("get", 3, sides={}, verdict=Verdict.ERROR,
                                       error="could not connect")]
    results = ResultsFile(tmp_path / "out" / "results.json")
    results.write(RUN, steps)
    text = results.path.read_text()
    document = json.loads(text)  # strict JSON: NaN and infinity written as null
    assert "NaN" not in text and "Infinity" not in text
    assert document["format"] == 2 and RunInfo.from_json(document["run"]) == RUN
    again = [StepRecord.from_json(step) for step in document["steps"]]
    for name in ("rate_hz", "p99_s", "mb_s", "succeeded", "failed"):
        assert again[0].metric(name) == steps[0].metric(name), name
    assert again[1].metric("readers.mb_s") == steps[1].metric("readers.mb_s") == 40.0
    assert again[1].metric("mix_ratio") == 0.8 and math.isnan(again[1].metric("recovery_s"))
    assert again[2].result is None and again[2].verdict is Verdict.ERROR
    assert [s.name for s in again] == [s.name for s in steps]
    assert os.listdir(tmp_path / "out") == ["results.json"]  # no temporary file left
    ResultsFile(None).write(RUN, steps)  # no path: nothing to do


def _usage_error(path: Path) -> str:
    with pytest.raises(StorageScaleUsageError) as caught:
        ResultsFile(path).check_writable()
    message = str(caught.value)
    assert str(path) in message and "--storage-results" in message and "\n" not in message
    return message


def test_check_writable_refuses_paths_that_cannot_be_written(tmp_path):
    assert "cannot create a file in /proc" in _usage_error(Path("/proc/results.json"))
    (tmp_path / "plain").write_text("a file")
    assert f"{tmp_path / 'plain'} is a file" in _usage_error(tmp_path / "plain" / "r.json")
    assert "is a directory" in _usage_error(tmp_path)
    before = sorted(os.listdir(tmp_path))
    ResultsFile(tmp_path / "new" / "deeper" / "results.json").check_writable()
    ResultsFile(tmp_path / "results.json").check_writable()
    ResultsFile(None).check_writable()
    assert sorted(os.listdir(tmp_path)) == before  # checked, nothing left behind


def _check_as_other_user(path: Path) -> str | None:
    """check_writable's message as an unprivileged user (root may write anywhere)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.close(read)
        message = ""
        try:
            os.setgid(65534)
            os.setuid(65534)
            ResultsFile(path).check_writable()
        except StorageScaleUsageError as exc:
            message = str(exc)
        except Exception as exc:  # reported to the parent, whose assertion shows it
            message = f"unexpected {exc!r}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as stream:
        text = stream.read().decode()
    os.waitpid(child, 0)
    return text or None


def test_check_writable_refuses_a_folder_without_write_permission():
    # not under tmp_path: pytest makes its base folder private to this user, and the
    # check must fail on the folder itself, not on a folder above it
    top = Path(tempfile.mkdtemp(prefix="storagescale-"))
    folder = top / "read-only"
    try:
        top.chmod(0o755)
        folder.mkdir(mode=0o555)
        if os.geteuid() == 0:
            message = _check_as_other_user(folder / "results.json")
        else:
            message = _usage_error(folder / "results.json")
        assert message and f"cannot create a file in {folder} (Permission denied)" in message
        assert os.listdir(folder) == []
    finally:
        folder.chmod(0o755)
        shutil.rmtree(top)


# -- plots -----------------------------------------------------------------------------

def _timeline(values: dict[str, list[int]], length: int) -> dict[str, list[int]]:
    return {name: values.get(name, []) + [0] * (length - len(values.get(name, [])))
            for name in plots.TIMELINE_SERIES}


def test_timeline_is_cut_at_the_end_of_the_step():
    # warm-up 1 s + 3 s measured; the engine records up to the hang timeout (20 s)
    quiet = _timeline({"completions": [5, 9, 9, 9], "in_flight": [2, 2, 2, 2]}, 24)
    step = record(clients=2, warmup_s=1.0, started=100.0, ended=104.5,
                  sides={"stat": side(2, duration_s=3.0, timeline=quiet)})
    assert plots.timeline_seconds(step) == 4
    assert {len(s) for s in plots.timeline_series(step)["stat"].values()} == {4}
    # a client hung: the drain is drawn while it was hung, not the zeros after it
    hung = _timeline({"completions": [5, 9, 9, 9], "in_flight": [2] * 4 + [1] * 8,
                      "hung": [0] * 6 + [1] * 6}, 24)
    step = record(clients=2, warmup_s=1.0, started=100.0, ended=130.0,
                  sides={"stat": side(2, duration_s=3.0, hung=1, timeline=hung)})
    assert plots.timeline_seconds(step) == 12
    # never past the step's wall-clock end
    step = record(clients=2, warmup_s=1.0, started=100.0, ended=109.2,
                  sides={"stat": side(2, duration_s=3.0, hung=1, timeline=hung)})
    assert plots.timeline_seconds(step) == 10
    assert plots.timeline_seconds(record(sides={})) == 0


def test_timeline_clients_on_their_own_axis():
    timeline = _timeline({"completions": [5, 9, 9, 9], "in_flight": [2, 2, 2, 1],
                          "hung": [0, 0, 0, 1]}, 24)
    step = record(clients=2, warmup_s=1.0, sides={"stat": side(2, duration_s=3.0,
                                                               timeline=timeline)})
    figure = plots.timeline_figure(step)
    rate_axes, client_axes = figure.axes
    assert rate_axes.get_ylabel() == "operations per second"
    assert client_axes.get_ylabel() == "clients"
    assert [patch.get_label() for patch in client_axes.patches] == [
        "clients in flight", "hung clients"]
    # each second a bin: completed/s and failed/s over the warm-up and the window
    assert [list(patch.get_data().edges) for patch in rate_axes.patches
            if patch.get_label().endswith("/s")] == [[0, 1, 2, 3, 4]] * 2
    assert plots.timeline_png(step).startswith(b"\x89PNG")
    assert plots.ecdf_png(step).startswith(b"\x89PNG")
    assert plots.timeline_png(mixed()).startswith(b"\x89PNG")


def _rates(step: StepRecord) -> list[float]:
    return [round(rate, 1) for rate in plots.timeline_rates(step)["stat"]["completions"]]


def test_timeline_has_no_fake_drop_in_its_last_part_second():
    # a count-bounded step that ended 0.32 s into its second second: that part second
    # (437 operations) is no drop to 437/s; it is left out (shorter than half a second)
    step = record(clients=2, started=100.0, ended=101.4, sides={"stat": side(
        2, duration_s=1.32, timeline=_timeline({"completions": [1563, 437]}, 35))})
    assert plots.rate_bins(step) == [0, 1] and _rates(step) == [1563]
    # 0.7 s of a second: drawn as its rate (its count over its length)
    step = record(clients=2, started=100.0, ended=101.8, sides={"stat": side(
        2, duration_s=1.7, timeline=_timeline({"completions": [1000, 700]}, 35))})
    assert plots.rate_bins(step) == [0, 1, 1.7] and _rates(step) == [1000, 1000]
    # a time-bounded step: the drain's second (the operations still in flight) is no
    # rate; the clients in flight are drawn through it
    step = record(clients=2, started=100.0, ended=103.5, sides={"stat": side(2, duration_s=3.0,
        timeline=_timeline({"completions": [9, 9, 9, 2], "in_flight": [2, 2, 2, 1]}, 35))})
    assert _rates(step) == [9, 9, 9] and plots.timeline_seconds(step) == 4
    figure = plots.timeline_figure(step)
    rate_axes, client_axes = figure.axes
    assert rate_axes.get_ylim()[0] == 0 and rate_axes.get_xlim() == (0, 4)
    assert list(client_axes.patches[0].get_data().edges) == [0, 1, 2, 3, 4]


def test_a_step_shorter_than_a_second_has_a_timeline():
    # 450 operations in 0.1 s (a count-bounded step): one bin of 4500/s, not an empty plot
    step = record(clients=10, started=100.0, ended=100.15, sides={"stat": side(
        10, duration_s=0.1, timeline=_timeline({"completions": [450]}, 35))})
    assert plots.rate_bins(step) == [0, 0.1] and _rates(step) == [4500]
    rate_axes = plots.timeline_figure(step).axes[0]
    completed = next(p for p in rate_axes.patches if p.get_label() == "completed/s")
    assert list(completed.get_data().values) == [4500]
    assert rate_axes.get_ylim()[1] > 4500


def test_scan_axes_start_at_zero_and_count_whole_failures():
    scan = [record(clients=c, sides={"stat": side(c, succeeded=500 + c)}) for c in (5, 50)]
    rate_axes, error_axes = plots.scan_figure(scan).axes[:2]
    assert rate_axes.get_ylim()[0] == 0
    # nothing failed or hung: 0 ... 1 with whole ticks, not -0.05 ... 0.05
    assert error_axes.get_ylim() == (0, 1)
    assert all(float(tick).is_integer() for tick in error_axes.get_yticks())
    hung = [record(clients=5, sides={"stat": side(5, hung=3)})]
    assert plots.scan_figure(hung).axes[1].get_ylim() == (0, pytest.approx(3.3))


def test_scan_plot_has_a_logarithmic_concurrency_axis():
    limit = RuleCheck("rate_hz >= 10", "rate_hz", ">=", 10.0, 50.0, True)
    scan = [record(clients=c, checks=[limit]) for c in (1000, 5, 50)]
    figure = plots.scan_figure(scan)
    rate_axes, error_axes = figure.axes[:2]
    assert error_axes.get_xscale() == rate_axes.get_xscale() == "log"
    assert list(error_axes.get_xticks()) == [5, 50, 1000]
    assert list(rate_axes.get_lines()[0].get_xdata()) == [5, 50, 1000]
    assert plots.scan_figure([record(clients=5)]).axes[1].get_xscale() == "linear"
    assert plots.scan_xscale([5, 5]) == "linear" and plots.scan_xscale([2, 3]) == "log"
    assert plots.scan_png(scan).startswith(b"\x89PNG")


def test_scans_are_plain_measured_steps_by_section():
    steps = [record(clients=5), mixed(), record(clients=50),
             record("stat", 100, sides={}, verdict=Verdict.ERROR), record("ls", 5)]
    grouped = plots.scans(steps)
    assert {name: [s.clients for s in group] for name, group in grouped.items()} == {
        "stat": [5, 50], "ls": [5]}


# -- Allure ----------------------------------------------------------------------------

_FAILING_TESTS = """
from types import SimpleNamespace

import pytest
from storagescale_suites.conformance.checks import fail

from pytest_storagescale import errors
from pytest_storagescale.cluster.hosts import ClusterError
from pytest_storagescale.plugin import pytest_configure  # every module a run imports
from pytest_storagescale.reporting.allure_report import storage_failures

def storage_error(cls, text):
    return cls(text, driver="xrootd", endpoint="root://h", operation="stat", path="/p")

@pytest.mark.parametrize("wording", ["broke its thresholds: hung 2 > 0", "zzz"])
def test_hung(wording):
    raise errors.HungClientsViolation(wording)

@pytest.mark.parametrize("wording", ["broke its thresholds: rate_hz 1 < 4",
                                     "HungClientsViolation could not run StorageError"])
def test_threshold(wording):
    raise errors.ThresholdViolation(wording)

@pytest.mark.parametrize("wording", ["could not run: refused", "hung ThresholdViolation"])
def test_step_error(wording):
    raise errors.StepError(wording)

STORAGE_ERRORS = {cls.__name__: cls for cls in storage_failures()
                  if issubclass(cls, errors.StorageError)}

@pytest.mark.parametrize("cls", sorted(STORAGE_ERRORS))
def test_storage(cls):
    raise storage_error(STORAGE_ERRORS[cls], "no answer")

@pytest.mark.parametrize("wording", ["StepError: HungClientsViolation", "plain"])
def test_assertion(wording):  # a functional test's check of the storage's answer
    assert False, wording

def test_check():  # a conformance check's finding, as the checks write it
    door = SimpleNamespace(name="root", display="root://h:1094//area")
    fail(door, "checksum adler32", "/area/f", "answered an error: no checksum", "success")

def test_client_host():
    raise ClusterError("no client host answered", address="tcp://scheduler:8786")

def test_harness_fail():
    pytest.fail("--storage-tpc-peer 'x': not the URL of a writable area", pytrace=False)

@pytest.fixture
def broken_fixture():
    raise RuntimeError("ThresholdViolation: not really")

def test_infrastructure(broken_fixture):
    pass

def test_passes():
    pass
"""

EXPECTED = {
    "test_hung": "Hung clients", "test_threshold": "Threshold violations",
    "test_step_error": "Storage errors", "test_storage": "Storage errors",
    "test_assertion": "Storage errors", "test_check": "Storage errors",
    "test_client_host": "Test infrastructure", "test_harness_fail": "Test infrastructure",
    "test_infrastructure": "Test infrastructure",
}
#: the StorageError classes the failing tests raise (every one a run knows)
STORAGE_ERROR_COUNT = sum(issubclass(cls, StorageError) for cls in storage_failures())


def _categories(result: dict) -> list[str]:
    """The categories Allure gives ``result``: every category whose status and regexes
    (full match, dot matching newlines, as Allure's Java Pattern.matches) match."""
    details = result.get("statusDetails") or {}
    names = []
    for category in categories():
        statuses = category.get("matchedStatuses") or []
        if statuses and result["status"] not in statuses:
            continue
        if not all(re.fullmatch(category[key], details.get(field) or "", re.DOTALL)
                   for key, field in (("messageRegex", "message"), ("traceRegex", "trace"))
                   if key in category):
            continue
        names.append(category["name"])
    return names


def _allure_run(pytester) -> Path:
    pytester.makepyfile(test_failing=_FAILING_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:storagescale", "-p", "no:cacheprovider",
                                           "--alluredir=allure-results")
    result.assert_outcomes(passed=1, failed=11 + STORAGE_ERROR_COUNT, errors=1)
    directory = pytester.path / "allure-results"
    write_session_files(directory, RUN)
    return directory


def test_allure_categories_match_failures_by_class(pytester):
    directory = _allure_run(pytester)
    results = [json.loads(p.read_text()) for p in directory.glob("*-result.json")]
    assert len(results) == 13 + STORAGE_ERROR_COUNT
    for result in results:
        test = result["name"].split("[")[0]
        expected = [EXPECTED[test]] if test in EXPECTED else []
        assert _categories(result) == expected, (result["name"],
                                                 result.get("statusDetails"))
    # the message allure-pytest writes begins with the class; rewording changed nothing
    hung = next(r for r in results if r["name"] == "test_hung[zzz]")
    assert hung["statusDetails"]["message"] == (
        "pytest_storagescale.errors.HungClientsViolation: zzz")
    assert json.loads((directory / "categories.json").read_text()) == categories()
    # a conformance check's message, as allure-pytest writes it
    check = next(r for r in results if r["name"] == "test_check")
    assert check["statusDetails"]["message"].startswith(
        "pytest_storagescale.errors.StorageCheckFailure: root door (root://h:1094//area)")
    environment = (directory / "environment.properties").read_text().splitlines()
    assert "storage.system=xrootd" in environment and "client.pytest=9.2.0" in environment


@pytest.mark.integration
def test_allure_command_line_puts_each_failure_in_one_category(pytester, tmp_path):
    if not ALLURE.exists():
        pytest.fail(f"{ALLURE} missing: run 'make setup' (installs the Allure command line)")
    directory = _allure_run(pytester)
    report = tmp_path / "report"
    subprocess.run([str(ALLURE), "generate", str(directory), "-o", str(report), "--clean"],
                   check=True, capture_output=True, timeout=180)
    tree = json.loads((report / "data" / "categories.json").read_text())
    found = {group["name"]: sorted({leaf["name"].split("[")[0]
                                    for message in group["children"]
                                    for leaf in message["children"]})
             for group in tree["children"]}
    assert found == {
        "Hung clients": ["test_hung"], "Threshold violations": ["test_threshold"],
        "Storage errors": ["test_assertion", "test_check", "test_step_error", "test_storage"],
        "Test infrastructure": ["test_client_host", "test_harness_fail", "test_infrastructure"],
    }


# -- progress --------------------------------------------------------------------------

def _progress(**changes) -> StepProgress:
    values = dict(operation="ls", clients=50, elapsed_s=61.2, total_s=1200.0, rate_hz=5.0,
                  succeeded=300, failed=2, hung=1)
    return StepProgress(**{**values, **changes})


def test_progress_line_text():
    assert LiveProgress.format(_progress()) == (
        "storagescale: ls 50 clients 61/1200 s (1139 s left)  rate 5.00 Hz  failed 2  hung 1")
    assert "(0 s left)" in LiveProgress.format(_progress(elapsed_s=1201.0))
    assert "rate 11020 Hz" in LiveProgress.format(_progress(rate_hz=11020.4))
