"""``storagescale compare``: runs side by side from their results files, the page with
the scans overlaid, bad input as exit status 4; and the upgrade flow's fixes (the
change column, a baseline of another thresholds file said once, recovery probes
matched by time since the overload)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import matplotlib.pyplot  # noqa: F401 - loaded before pytester's snapshot of sys.modules
import pytest
from faults import DutyCycle
from test_baseline import PLAN as BASELINE_PLAN
from test_baseline import SUITE as BASELINE_SUITE
from test_reporting_units import RUN, record, side
from test_xrootd6 import _built

from pytest_storagescale import cli
from pytest_storagescale import compare as compare_module
from pytest_storagescale.baseline import Baseline
from pytest_storagescale.compare import detail_lines, load_runs, report_lines
from pytest_storagescale.records import BaselineComparison, Verdict
from pytest_storagescale.reporting import plots
from pytest_storagescale.reporting.results import ResultsFile
from pytest_storagescale.servers.xrootd_releases import BUILT_VERSION

REPO = Path(__file__).resolve().parent.parent

#: test_baseline's stat scan (1 and 2 clients, 0.3 s), judged by a rate floor
PLAN = BASELINE_PLAN.replace('"rate_hz >= 0.5 * baseline", "hung <= baseline"',
                             '"hung == 0", "rate_hz >= {floor}"')
assert "{floor}" in PLAN
#: the same plan whose gate cannot decide (on the file driver a step's p99 is a few
#: microseconds: a busy machine's scheduling alone made it 11x, "regressed"), for the
#: tests of what the comparison says rather than of the gate
PLAN_NO_GATE = PLAN.format(floor=0).replace(
    "[ops.stat]\n", "[ops.stat]\nmin_effect_rate = 0.99\nmin_effect_p99 = 99\n", 1)
assert "min_effect_p99 = 99" in PLAN_NO_GATE

#: the stat scan and a functional check that fails when H4_BROKEN is set
SUITE = BASELINE_SUITE.replace("import pytest", "import os\n\nimport pytest") + """
def test_checksum_check():
    assert "H4_BROKEN" not in os.environ, "the server answered the wrong adler32"
"""


def _two_runs(pytester, tmp_path, monkeypatch) -> tuple[Path, Path]:
    """Two real runs of a stat scan (local driver) and a functional check: version 1.0
    passes everything; version 2.0 is judged by a rate floor no step reaches and its
    check fails."""
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_suite=SUITE)
    for version, floor in (("1.0", "0"), ("2.0", "1e12")):
        folder = pytester.path / f"thr{version}" / "xrootd"
        folder.mkdir(parents=True)
        (folder / "any.toml").write_text(PLAN.format(floor=floor))
        if version == "2.0":
            monkeypatch.setenv("H4_BROKEN", "1")
        pytester.runpytest(f"--storage-endpoint=file://{area}", f"--storage-version={version}",
                           f"--storage-thresholds=thr{version}", "-p", "no:cacheprovider",
                           f"--storage-results=run{version}.json")
    return pytester.path / "run1.0.json", pytester.path / "run2.0.json"


def test_compare_prints_the_runs_side_by_side(pytester, tmp_path, monkeypatch, capsys):
    before, after = _two_runs(pytester, tmp_path, monkeypatch)
    document = json.loads(after.read_text())
    assert document["verdict"] == "FAILED"  # written at the session's end
    assert {t["nodeid"]: t["outcome"] for t in document["tests"]}[
        "test_suite.py::test_checksum_check"] == "failed"
    capsys.readouterr()
    # B regressed (its steps' rules failed, its check failed): the gate fails, exit 1
    assert cli.main(["compare", str(before), str(after), "--html", str(tmp_path / "page")]) == 1
    out = capsys.readouterr().out.splitlines()
    # the gate's verdict and what changed open the text: outcomes first, then regressions
    gate, out = out[:out.index("")], out[out.index("") + 1:]
    assert gate[0] == ("gate: FAILED: B: xrootd 2.0 against A: xrootd 1.0 (1 behaviour "
                       "change not accepted, 2 regressions, 0 failures of B)")
    assert gate[1].startswith("behaviour changes not accepted (1; ")
    assert gate[2] == ("  test_suite.py::test_checksum_check: passed -> failed: "
                       "AssertionError: the server answered the wrong adler32")
    assert gate[3] == "regressions (the steps' rules):"
    assert [line.split(":")[0] for line in gate[4:]] == ["  stat at 1 clients",
                                                         "  stat at 2 clients"]
    # a title over each run's column group, then the seeds' columns per run
    assert out[0].split() == ["A:", "xrootd", "1.0", "B:", "xrootd", "2.0"]
    assert out[1].split() == ["op", "clients", "succeeded", "(rate)", "p99", "failed", "hung",
                              "A", "verdict", "succeeded", "(rate)", "p99", "failed", "hung",
                              "B", "verdict", "rate", "vs", "A"]
    title_b, column_b = out[0].index("B:"), out[1].index("succeeded", out[1].index("A verdict"))
    assert title_b == column_b
    # succeeded (rate) p99 failed hung verdict, for each run, then the rate's change
    run = r"\d+ \([\d.]+ Hz\)\s+[\d.]+ [mu]?s\s+0\s+0\s+"
    for clients, line in zip((1, 2), out[2:4], strict=True):
        assert re.fullmatch(rf"stat\s+{clients}\s+{run}pass\s+{run}fail\s+(0|[+-]\d+)%",
                            line), line
    text = "\n".join(out)
    assert "  A: xrootd 1.0 (from --storage-version) at file://" in text
    assert "verdict PASSED" in text
    assert "verdict FAILED" in text
    assert "stat at 1 clients: A pass -> B fail (rate_hz >= 1e12 (observed" in text
    assert ("test_suite.py::test_checksum_check: A passed -> B failed: AssertionError: the "
            "server answered the wrong adler32") in text
    assert "test_stat" not in text.split("checks whose outcome changed")[1]  # load: above
    page = (tmp_path / "page" / "index.html").read_text()
    assert out[-1] == f"page: {tmp_path / 'page' / 'index.html'}"
    assert "<h2>Scans, runs overlaid</h2>" in page and 'alt="scan stat, runs overlaid"' in page
    assert "stat at 1 clients: A pass -&gt; B fail" in page
    # the page opens with the gate's verdict and what changed, the table below
    assert page.index("<h1 class='verdict failed'>gate FAILED</h1>") < page.index(
        "test_checksum_check: passed -&gt; failed") < page.index("Steps, run by run")


def test_the_overlay_draws_every_run_on_a_log_concurrency_axis():
    runs = {"A: xrootd 5.5.3": [record("stat", c, sides={"stat": side(c, succeeded=100 * c)})
                                for c in (5, 50, 200)],
            "B: xrootd 6.2.1": [record("stat", c, sides={"stat": side(c, succeeded=50 * c)})
                                for c in (5, 50)]}
    figure = plots.overlay_figure("stat", runs)
    rate_axes, p99_axes = figure.axes
    assert [line.get_label() for line in rate_axes.get_lines()] == list(runs)
    assert [list(line.get_xdata()) for line in rate_axes.get_lines()] == [[5, 50, 200], [5, 50]]
    assert list(rate_axes.get_lines()[1].get_ydata()) == pytest.approx([25.0, 250.0])
    assert p99_axes.get_ylabel().startswith("p99") and len(p99_axes.get_lines()) == 2
    assert p99_axes.get_xscale() == "log"


def _results(path: Path, steps, version: str) -> Path:
    run = dataclasses.replace(RUN, version=version)
    ResultsFile(path).write(run, steps)
    return path


def test_compare_aligns_sides_derived_metrics_and_the_judged_probe(tmp_path, capsys):
    """A recovery test is compared by its judged probe, however many probes each run
    needed; a mixed step by side, its derived metric on a row of its own."""
    def recovery(probes: int, recovered_after: float):
        steps = [record("recovery", 2, label="before", verdict=Verdict.INFO, started=0),
                 record("recovery", 50, label="overload", verdict=Verdict.INFO, started=20,
                        ended=40)]
        for number in range(1, probes + 1):
            last = number == probes
            steps.append(record(
                "recovery", 2, label=f"probe {number}", started=40 + 10 * number,
                verdict=Verdict.PASS if last else Verdict.INFO,
                derived={"recovery_s": recovered_after if last else float("inf")}))
        return [dataclasses.replace(s, step_id=f"s{i}", test="suite.py::test_recovery")
                for i, s in enumerate(steps)]
    mixed = record("mixed", 4, label="mixed", derived={"mix_ratio": 0.8}, sides={
        "readers": side(4, succeeded=40), "writers": side(4, succeeded=20)})
    old = _results(tmp_path / "a.json", [*recovery(1, 12.0), mixed], "5.5.3")
    new = _results(tmp_path / "b.json", [*recovery(3, 31.0),
                                         dataclasses.replace(mixed, derived={"mix_ratio": 0.5})],
                   "6.2.1")
    capsys.readouterr()
    assert cli.main(["compare", str(old), str(new)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("gate: PASSED: B: xrootd 6.2.1 against A: xrootd 5.5.3")
    lines = lines[lines.index("") + 1:]  # the table under the gate
    names = [line.strip().split("  ")[0] for line in lines[2:] if line.strip()][:8]
    assert names == ["recovery (before)", "recovery (overload)", "recovery (last probe)",
                     "recovery_s", "mixed/readers (mixed)", "mix_ratio",
                     "mixed/writers (mixed)", "runs:"]
    assert lines[5].split() == ["recovery_s", "12.00", "s", "31.00", "s"]
    assert not any("probe 1" in line or "probe 3" in line for line in lines)


def test_compare_names_the_door_when_the_runs_used_several(tmp_path):
    """A --storage-load-doors run: a door column, a scan per door, never a root step
    beside a davs one."""
    steps = [dataclasses.replace(record("stat", c, sides={"stat": side(c, succeeded=s)}),
                                 door=door, step_id=f"{door}{c}")
             for door, s in (("root", 100), ("davs", 40)) for c in (1, 5)]
    files = [_results(tmp_path / f"{v}.json", steps, v) for v in ("5.5.3", "6.2.1")]
    lines = detail_lines(load_runs(files))
    assert lines[1].split()[:3] == ["op", "door", "clients"]
    rows = [line.split()[:4] for line in lines[2:7]]
    assert rows == [["stat", "root", "1", "100"], ["stat", "root", "5", "100"], [],
                    ["stat", "davs", "1", "40"], ["stat", "davs", "5", "40"]]


@pytest.mark.parametrize("files, message", [
    ([], "give two or more results files to compare (got 0)"),
    (["a.json"], "give two or more results files to compare (got 1)"),
    (["a.json", "missing.json"], "missing.json: cannot read it (No such file or directory)"),
    (["a.json", "bench.json"], "bench.json: no 'steps' list of step objects; this is not a "
                               "pytest-storagescale results file"),
    (["a.json", "broken.json"], "broken.json: not JSON"),
])
def test_bad_input_is_one_paragraph_and_exit_status_4(tmp_path, files, message):
    _results(tmp_path / "a.json", [record()], "5.5.3")
    (tmp_path / "bench.json").write_text('{"benchmarks": []}')
    (tmp_path / "broken.json").write_text('{"steps": [')
    script = Path(sys.executable).with_name("storagescale")  # the installed console script
    done = subprocess.run([str(script), "compare", *files], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 4, done
    assert done.stdout == ""
    assert done.stderr.startswith("ERROR: storagescale compare") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_an_unwritable_page_folder_is_exit_status_4(tmp_path, capsys):
    files = [str(_results(tmp_path / f"{n}.json", [record()], "5.5.3")) for n in "ab"]
    (tmp_path / "a-file").write_text("")
    assert cli.main(["compare", *files, "--html", str(tmp_path / "a-file" / "page")]) == 4
    assert "--html" in capsys.readouterr().err


def test_results_without_tests_say_the_outcomes_are_not_known(tmp_path):
    """A results file of an earlier release holds no test outcomes: not 'none changed'."""
    old = Path(__file__).parent / "data" / "results-0.1.0.json"
    lines = report_lines(load_runs([old, old]))
    assert lines[-1].startswith("checks whose outcome changed: not known")
    assert "load steps whose verdict changed: none" in lines


# -- the upgrade flow's fixes ----------------------------------------------------------------

@pytest.mark.parametrize("change, text", [(-0.004, "0%"), (0.004, "0%"), (-0.12, "-12%"),
                                          (0.5, "+50%"), (None, "-")])
def test_the_change_column_never_says_minus_zero(change, text):
    assert BaselineComparison("b.json", "5.5.3", True, 10.0, change).change_text() == text


def test_recovery_probes_are_matched_by_time_since_the_overload(tmp_path):
    """The baseline's version recovered in one probe, 10 s after its overload; this
    run's third probe (30 s after) is compared with that probe, its first (10 s
    after) too: never with a 'probe 3' the baseline does not have, or by number."""
    def probes(ends):
        steps = [(record("recovery", 50, label="overload", verdict=Verdict.INFO,
                         started=0), 100.0)]
        steps += [(record("recovery", 2, label=f"probe {n}", started=end - 5), end)
                  for n, end in enumerate(ends, 1)]
        return [dataclasses.replace(s, step_id=f"b{i}", test="t.py::test_recovery", ended=end)
                for i, (s, end) in enumerate(steps)]
    base_steps = probes([110.0, 130.0])  # the baseline: probes 10 s and 30 s after
    baseline = Baseline(_results(tmp_path / "base.json", base_steps, "5.5.3"))
    assert baseline.since_fault == {"b1": 10.0, "b2": 30.0}
    now = probes([112.0, 119.0, 128.0, 160.0])
    assert [baseline.find(step, since=step.ended - 100).step_id for step in now[1:]] == \
        ["b1", "b1", "b2", "b2"]
    # an earlier run's baseline, probes matched on their own: by key, as before
    assert baseline.find(now[1]).step_id == "b1" and baseline.find(now[3]) is None


def test_a_baseline_of_another_thresholds_file_is_said_once_plainly(pytester, tmp_path):
    """The normal upgrade: the new version's run chose another thresholds file than
    the baseline's. Said once, before the load, and not as a warning."""
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_suite=SUITE)
    for name in ("old", "new"):
        (pytester.path / name / "xrootd").mkdir(parents=True)
        (pytester.path / name / "xrootd" / f"{name}.toml").write_text(PLAN_NO_GATE)
    args = [f"--storage-endpoint=file://{area}", "--storage-version=2.0", "-p",
            "no:cacheprovider", "-k", "stat"]
    pytester.runpytest(*args, "--storage-thresholds=old", "--storage-results=old.json")
    result = pytester.runpytest(*args, "--storage-thresholds=new",
                                "--storage-baseline=old.json", "--storage-results=new.json")
    result.assert_outcomes(passed=2)
    # each step's JSON says what its baseline step measured: rate, p99, failed, hung
    old = {s["clients"]: s for s in json.loads((pytester.path / "old.json").read_text())["steps"]}
    for step in json.loads((pytester.path / "new.json").read_text())["steps"]:
        base, was = step["baseline"], old[step["clients"]]
        assert base["matched"] and base["version"] == "2.0" and base["verdict"] == "pass"
        assert (base["rate_hz"], base["p99_s"], base["failed"], base["hung"]) == (
            was["rate_hz"], was["latency_s"]["p99"], 0, 0)
    said = [line for line in result.outlines if line.startswith("storagescale: baseline")
            or "WARNING" in line]
    assert said == [f"storagescale: baseline {pytester.path / 'old.json'} (xrootd 2.0) was "
                    f"planned by old.toml, this run by new.toml: steps of the same section, "
                    f"concurrency and door are compared, the others are 'new'."]
    assert "WARNING" not in result.stdout.str()


# -- the shipped relative rules ----------------------------------------------------------------

SHIPPED = sorted((REPO / "thresholds").glob("*/*.toml"))
#: a relative rule on a rate or throughput: ``readers.mb_s >= 0.25 * baseline``
RELATIVE = re.compile(r"((?:\w+\.)?(?:rate_hz|mb_s|mb_s_mean)) >= ([\d.]+) \* baseline")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_file_leaves_the_baseline_to_the_gate(path):
    """Issue 32: the shipped relative rules on a rate or throughput ('rate_hz >= 0.25 *
    baseline') became the gate's effect sizes (gate.py: the ratio's 95 % interval
    against min_effect_rate / min_effect_p99). No shipped scan keeps one but a mean over
    tries (mb_s_mean, which has no per-window samples); each file says how it is judged
    against a baseline, and the minimum effects it sets are fractions the gate takes."""
    document = tomllib.loads(path.read_text())
    for section, plan in document["ops"].items():
        relative = [RELATIVE.fullmatch(text) for block in plan.get("expect", [])
                    for text in block["rules"] if "baseline" in text]
        assert all(match is not None and match[1] == "mb_s_mean" for match in relative), \
            section
        for key in ("min_effect_rate", "min_effect_p99"):
            assert 0 < plan.get(key, 0.5) < (1 if key == "min_effect_rate" else 100)
    text = path.read_text()
    assert "min_effect_rate = 0.15" in text and 'docs/thresholds.md, "The gate"' in text


def _stat_scan(pytester, server, name: str, *extra: str):
    """suites/xrootd's stat scan at 5 clients against ``server``, judged by the shipped
    thresholds/xrootd/5.x.toml."""
    return pytester.runpytest_subprocess(
        str(REPO / "suites" / "xrootd"), f"--storage-endpoint={server.url}",
        f"--storage-thresholds={REPO / 'thresholds'}", "--storage-clients=5",
        "-p", "no:cacheprovider", "-k", "stat_scan", f"--storage-results={name}.json", *extra)


def _gate(pytester, name: str) -> dict | None:
    return json.loads((pytester.path / f"{name}.json").read_text())["steps"][0].get("gate")


@pytest.mark.integration
def test_the_gate_fails_a_slower_server_and_passes_the_same_one(pytester):
    """The shipped 5.x.toml against the embedded xrootd: a run of the same server with
    the first run's results as its baseline is not regressed; the same server
    duty-cycled (running a twentieth of the time: a slower version) is, measured again
    and confirmed, the failure naming the ratio and its interval. Without a baseline
    there is no gate."""
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    with EmbeddedXRootD(https=False) as server:
        for _ in range(3):
            # a loaded 2-core machine (docs/benchmarks.md: the same server's runs 1,772-
            # 22,855/s, a load that moves for minutes): baseline and run again, side by
            # side in time, never the slower server
            _stat_scan(pytester, server, "before").assert_outcomes(passed=1)
            assert _gate(pytester, "before") is None  # no baseline
            same = _stat_scan(pytester, server, "same", "--storage-baseline=before.json")
            if (_gate(pytester, "same") or {}).get("verdict") != "regressed":
                break
        same.assert_outcomes(passed=1)
        assert (_gate(pytester, "same") or {}).get("verdict") != "regressed"
        for _ in range(3):  # a client host much busier than at the baseline: inconclusive
            with DutyCycle(server.pid):
                slower = _stat_scan(pytester, server, "slower",
                                    "--storage-baseline=before.json")
            if (_gate(pytester, "slower") or {}).get("verdict") != "inconclusive":
                break
    slower.assert_outcomes(failed=1)
    slower.stdout.fnmatch_lines(["*stat step at 5 clients broke its thresholds*",
                                 "*gate: * vs baseline * (95 % interval) wholly *VIOLATED*"])
    gate = _gate(pytester, "slower")
    assert gate is not None and gate["verdict"] == "regressed"
    assert gate["retest"] == "confirmed"


def test_allure_holds_each_step_beside_its_baseline_step(pytester, tmp_path):
    """With --storage-baseline, each step's Allure test has the baseline's step beside
    its own (the comparison's two column groups) and its scan of both runs overlaid."""
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "any.toml").write_text(PLAN_NO_GATE)
    args = [f"--storage-endpoint=file://{area}", "--storage-version=2.0", "-p",
            "no:cacheprovider", "-k", "stat", "--storage-thresholds=thr"]
    pytester.runpytest_subprocess(*args, "--storage-results=old.json").assert_outcomes(
        passed=2)
    pytester.runpytest_subprocess(*args, "--storage-baseline=old.json",
                                  "--alluredir=allure").assert_outcomes(passed=2)
    attached, names = {}, []
    for result in (pytester.path / "allure").glob("*-result.json"):
        document = json.loads(result.read_text())
        for attachment in document.get("attachments", []):
            attached[attachment["name"]] = pytester.path / "allure" / attachment["source"]
            names.append(attachment["name"])
    assert sorted(name for name in names if "baseline" in name) == [
        "scan stat: baseline 2.0 and this run overlaid",
        "scan stat: baseline 2.0 and this run overlaid",
        "vs baseline 2.0: stat at 1 clients", "vs baseline 2.0: stat at 2 clients"]
    text = attached["vs baseline 2.0: stat at 2 clients"].read_text().splitlines()
    assert text[0].split() == ["A:", "xrootd", "2.0", "B:", "xrootd", "2.0"]
    assert re.match(r"stat\s+2\s+\d+ \(", text[2]) and text[2].count("pass") == 2
    assert attached["scan stat: baseline 2.0 and this run overlaid"].read_bytes()[:4] == \
        b"\x89PNG"


@pytest.mark.integration
def test_the_upgrade_flow_on_the_two_real_versions(pytester):
    """The documented flow on the embedded xrootd 5.5.3, then 6.2.1 with the first
    run as its baseline, then storagescale compare: the GSI logins of the 5.5.3 client
    (the same client library in both runs) collapse against 6.2.1, whose fixed 3072-bit
    DH parameters that client spends seconds checking (issue 25: 7.0/s to 0.40/s;
    docs/upgrade.md: 8.2/s to 0.20/s). The comparison names both versions and the
    client library, so the cause is findable."""
    _built()
    # one client, 20 s steps (6.x.toml's are longer, to measure 6.2.1's rate closely)
    flow = [str(REPO / "suites" / "xrootd"), "-k", "auth_rate", "--storage-clients=1",
            "--storage-duration=20s", "--storage-embedded-login", "gsi",
            f"--storage-thresholds={REPO / 'thresholds'}", "-p", "no:cacheprovider"]
    pytester.runpytest_subprocess(*flow, "--storage-results=before.json").assert_outcomes(
        passed=1, skipped=3)
    after = pytester.runpytest_subprocess(
        *flow, "--storage-embedded-version", BUILT_VERSION, "--storage-baseline=before.json",
        "--storage-results=after.json")
    after.stdout.fnmatch_lines(["storagescale: baseline * (xrootd 5.5.3) was planned by "
                                "5.x.toml, this run by 6.x.toml: *"])
    script = Path(sys.executable).with_name("storagescale")
    done = subprocess.run([str(script), "compare", "before.json", "after.json"],
                          cwd=pytester.path, capture_output=True, text=True, timeout=120)
    print(done.stdout)  # the real comparison, in the test's report
    lines = done.stdout.splitlines()
    # the gate's verdict first: exit 1 exactly when the later run's step regressed (the
    # GSI collapse, unless the client host was too busy to tell) or failed
    later = json.loads((pytester.path / "after.json").read_text())["steps"]
    failed = any((step.get("gate") or {}).get("verdict") == "regressed"
                 or step["verdict"] in ("fail", "error") for step in later)
    assert done.returncode == (1 if failed else 0), done.stderr
    assert lines[0].startswith(f"gate: {'FAILED' if failed else 'PASSED'}: B: xrootd "
                               f"{BUILT_VERSION} against A: xrootd 5.5.3")
    if failed:
        assert any(line.startswith("  auth_gsi") for line in lines[:lines.index("")])
    lines = lines[lines.index("") + 1:]  # the table under the gate
    assert lines[0].split() == ["A:", "xrootd", "5.5.3", "B:", "xrootd", BUILT_VERSION]
    row = next(line for line in lines if line.startswith("auth_gsi"))
    assert row.split()[1] == "1"
    facts = [line.strip() for line in lines if line.startswith("  A: ") or
             line.startswith("  B: ")]
    assert [fact.split(";")[0].split(" (")[0] for fact in facts] == [
        "A: xrootd 5.5.3", f"B: xrootd {BUILT_VERSION}"]
    assert all("client vm" in fact or "xrootd 5.5.3," in fact for fact in facts)
    client = {json.loads((pytester.path / f"{name}.json").read_text())["run"]["client"][
        "versions"].get("xrootd") for name in ("before", "after")}
    assert client == {"5.5.3"}  # one client library, two servers
    before, after_step = (json.loads((pytester.path / f"{name}.json").read_text())["steps"][0]
                          for name in ("before", "after"))
    assert before["rate_hz"] > 5 * (after_step["rate_hz"] or 0), (before, after_step)
    assert after_step["baseline"]["matched"] and after_step["baseline"]["rate_change"] < -0.8


RECOVERY_PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "0.3s"
hang_timeout = "5s"

[ops.recovery]
op = "stat"
clients = [1]
overload_clients = 2
overload_duration = "0.3s"
recover_fraction = 0.01
recover_within = "30s"
# this test is about which baseline step a probe is matched with, never this machine's
# speed: the statistical gate judges only a 1000-fold loss or p99s of seconds
min_effect_rate = 0.999
latency_floor = "30s"

[[ops.recovery.expect]]
rules = ["recovery_s <= 60", "rate_hz >= 0.001 * baseline"]
"""

RECOVERY_SUITE = """
import pytest

@pytest.mark.storagescale_op("recovery")
def test_recovery(storage_load):
    storage_load.recovery()
"""


def test_a_run_matches_its_recovery_probe_by_time_not_number(pytester, tmp_path):
    """The baseline's version needed three probes (its results say 'probe 3', ended
    as long after its overload as this run's 'probe 1'): this run's probe is compared
    with it, its relative rule checked, never 'new' for want of a 'probe 1'."""
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_suite=RECOVERY_SUITE)
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "any.toml").write_text(RECOVERY_PLAN)
    args = [f"--storage-endpoint=file://{area}", "--storage-version=2.0",
            "--storage-thresholds=thr", "-p", "no:cacheprovider"]
    pytester.runpytest(*args, "--storage-results=base.json").assert_outcomes(passed=1)
    document = json.loads((pytester.path / "base.json").read_text())
    probe = next(step for step in document["steps"] if step["label"] == "probe 1")
    probe["label"] = "probe 3"
    (pytester.path / "base.json").write_text(json.dumps(document))
    pytester.runpytest(*args, "--storage-baseline=base.json",
                       "--storage-results=now.json").assert_outcomes(passed=1)
    steps = json.loads((pytester.path / "now.json").read_text())["steps"]
    judged = next(step for step in steps if step["label"] == "probe 1")
    assert judged["baseline"]["matched"], judged["baseline"]
    assert judged["baseline"]["rate_hz"] == pytest.approx(probe["rate_hz"])
    relative = next(check for check in judged["checks"] if check["relative"])
    assert relative["passed"] is True and relative["baseline"] == pytest.approx(
        probe["rate_hz"])


# -- the gate: compare as the CI gate by itself (issue 32 parts 3 and 6) -------------------

def _gated(tmp_path: Path, verdicts: dict[int, str]) -> list[str]:
    """Two files of a stat scan at 5, 50 and 200 clients; the later one's steps carry
    the statistical gate's verdict (``gate`` key, gate.py's contract) per clients."""
    from pytest_storagescale.gate import Effect, GateVerdict, StepGate

    files = []
    for name in "ab":
        steps = [dataclasses.replace(record("stat", c), step_id=f"s{c}") for c in verdicts]
        path = _results(tmp_path / f"{name}.json", steps, "5.5.3" if name == "a" else "6.2.1")
        document = json.loads(path.read_text())
        document["tests"] = []  # outcomes kept (none): the behaviour part is compared
        if name == "b":
            for step in document["steps"]:
                verdict = GateVerdict(verdicts[step["clients"]])
                ratio = 0.41 if verdict is GateVerdict.REGRESSED else 0.95
                step["gate"] = StepGate(verdict, "window means", {"rate_hz": Effect(
                    "rate_hz", ratio, ratio - 0.04, ratio + 0.04 if ratio < 0.9 else 1.2,
                    verdict, 0.15)}, metric="rate_hz", retest="confirmed"
                    if verdict is GateVerdict.REGRESSED else None).to_json()
        path.write_text(json.dumps(document))
        files.append(str(path))
    return files


def test_compare_fails_on_a_regression_of_the_statistical_gate_naming_its_interval(
        tmp_path, capsys):
    files = _gated(tmp_path, {5: "unchanged", 50: "regressed", 200: "inconclusive"})
    capsys.readouterr()
    assert cli.main(["compare", *files]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("gate: FAILED: B: xrootd 6.2.1 against A: xrootd 5.5.3 (0 behaviour "
                      "changes not accepted, 1 regression, 0 failures of B)")
    assert out[1] == "behaviour changes not accepted: none"
    assert out[2] == "regressions (the statistical gate: ratio to the baseline [95 % interval]):"
    assert out[3] == ("  stat at 50 clients: rate 0.41 [0.37-0.45] regressed (confirmed) "
                      "(window means)")
    assert out[4] == "inconclusive (decide nothing either way):"
    assert out[5].startswith("  stat at 200 clients: rate 0.95 [0.91-1.20] inconclusive")
    # the same files with nothing regressed: exit 0, the verdict says so
    files = _gated(tmp_path, {5: "unchanged", 50: "improved", 200: "unchanged"})
    assert cli.main(["compare", *files]) == 0
    assert capsys.readouterr().out.startswith("gate: PASSED: B: xrootd 6.2.1 against A")


def test_compare_fails_on_a_failure_of_the_later_run_even_unchanged(tmp_path, capsys):
    """A check that failed in both runs changed nothing, yet the later run failed: the
    gate is never green on a failed run."""
    files = []
    for name in "ab":
        path = _results(tmp_path / f"{name}.json", [record()], name)
        document = json.loads(path.read_text())
        document["tests"] = [{"nodeid": "t.py::test_checksum", "kind": "functional",
                              "outcome": "failed", "cause": "wrong adler32"}]
        path.write_text(json.dumps(document))
        files.append(str(path))
    capsys.readouterr()
    assert cli.main(["compare", *files]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("(0 behaviour changes not accepted, 0 regressions, 1 failure "
                           "of B)")
    assert "  t.py::test_checksum: failed: wrong adler32" in out


def test_the_page_draws_the_gate_as_a_forest_of_ratios_with_intervals(tmp_path):
    files = _gated(tmp_path, {5: "unchanged", 50: "regressed", 200: "inconclusive"})
    runs = load_runs([Path(name) for name in files])
    rows = compare_module.forest_rows(runs[-1])
    assert [(label, verdict) for label, *_, verdict, _ in rows] == [
        ("stat at 5 clients (rate)", "unchanged"), ("stat at 50 clients (rate)", "regressed"),
        ("stat at 200 clients (rate)", "inconclusive")]
    assert rows[1][1:4] == pytest.approx((0.41, 0.37, 0.45)) and rows[1][5] == pytest.approx(
        0.85)
    figure = plots.forest_figure(rows)
    (axes,) = figure.axes
    assert axes.get_xscale() == "log"
    assert [t.get_text() for t in axes.get_yticklabels()] == [
        "stat at 5 clients (rate): unchanged", "stat at 50 clients (rate): regressed",
        "stat at 200 clients (rate): inconclusive"]
    page = compare_module.page_html(runs)
    # the forest comes right under what changed, before the facts and the table
    assert page.index("<h1 class='verdict failed'>gate FAILED</h1>") < page.index(
        'alt="the gate: B / A per step, 95 % intervals"') < page.index("Steps, run by run")
