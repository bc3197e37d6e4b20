"""Reports people read: Allure results (and the HTML report in a real browser), the
self-contained --storage-report page, live progress."""

from __future__ import annotations

import contextlib
import csv
import functools
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from plans import mechanism_plan

from pytest_storagescale.load.plan import StepProgress
from pytest_storagescale.reporting.progress import LiveProgress

REPO = Path(__file__).resolve().parent.parent
ALLURE = REPO / ".tools" / "node_modules" / ".bin" / "allure"


def _run_suite(pytester, *extra, select="stat_scan or ls_scan"):
    # the shipped plan without its speed floors: these tests are about the reports
    return pytester.runpytest_subprocess(
        str(REPO / "suites" / "xrootd"), f"--storage-thresholds={mechanism_plan(pytester.path)}",
        "--storage-clients=2,3", "--storage-duration=0.5s", "-p", "no:cacheprovider",
        "-k", select, *extra,
    )


#: the xdist group of the tests that read :func:`suite_runs` (under ``--dist loadgroup``
#: they run on one worker, so the module's three runs are made once)
SUITE_RUNS_GROUP = pytest.mark.xdist_group("reports_suite_runs")


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory):
    """The suite's stat and ls scans (as :func:`_run_suite`) run three times against
    the embedded xrootd, each run writing every output its readers look at, so that
    the Allure history, the HTML report, the report page and the pytest-benchmark
    tests read the same runs (7 runs of the same scans before: 84 s and 44 s of a make
    test in the two slowest): ``first`` (``--alluredir=first``, the report page
    ``report/``, ``--storage-benchmark-json=old.json``), ``second`` (``second/``,
    ``second.json``, ``new.json``) and ``third`` (``third/``, with ``second.json`` as
    its baseline). Each is a :class:`pytest.RunResult`; ``path`` is their folder."""
    from types import SimpleNamespace

    path = tmp_path_factory.mktemp("suite-runs")
    thresholds = mechanism_plan(path)
    # a session of its own, as pytester's subprocess runs have (its HOME, no addopts)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTEST_ADDOPTS", "TOX_ENV_DIR")}
    env.update(HOME=str(path), USERPROFILE=str(path),
               PYTHONPATH=os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")])))

    def run(name: str, *extra: str) -> pytest.RunResult:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", f"--basetemp={path / f'basetemp-{name}'}",
             str(REPO / "suites" / "xrootd"), f"--storage-thresholds={thresholds}",
             "--storage-clients=2,3", "--storage-duration=0.5s", "-p", "no:cacheprovider",
             "-k", "stat_scan or ls_scan", f"--alluredir={name}", *extra],
            cwd=path, env=env, capture_output=True, text=True, timeout=600)
        return pytest.RunResult(done.returncode, done.stdout.splitlines(),
                                done.stderr.splitlines(), 0.0)

    return SimpleNamespace(
        path=path,
        first=run("first", "--storage-report=report", "--storage-benchmark-json=old.json"),
        second=run("second", "--storage-results=second.json",
                   "--storage-benchmark-json=new.json"),
        third=run("third", "--storage-baseline=second.json"))


@contextlib.contextmanager
def _chromium():
    """A headless Chromium (selenium), quit at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--window-size=1400,1800"):
        options.add_argument(argument)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        yield browser
    finally:
        browser.quit()


def _results(directory: Path) -> dict[str, dict]:
    results = {}
    for path in directory.glob("*-result.json"):
        result = json.loads(path.read_text())
        results[result["name"]] = result
    return results


@pytest.mark.integration
@pytest.mark.long_running
@SUITE_RUNS_GROUP
def test_allure_results_and_stable_history(suite_runs):
    first, second, third, path = (suite_runs.first, suite_runs.second, suite_runs.third,
                                  suite_runs.path)
    first.assert_outcomes(passed=4)
    second.assert_outcomes(passed=4)
    a, b = _results(path / "first"), _results(path / "second")
    # the overview's Environment names the run's verdict (and a baseline's gate)
    assert third.ret in (0, 1)  # the load steps' gate on a busy machine decides
    environment = (path / "third" / "environment.properties").read_text()
    verdict = "PASSED (4 passed)" if third.ret == 0 else "FAILED"
    assert f"run.verdict={verdict}" in environment, environment
    assert f"run.baseline={path / 'second.json'}" in environment
    assert "run.behaviour_gate=gate\\: no behaviour change against" in environment
    step = a["test_stat_scan[c3]"]
    parameters = {p["name"]: p for p in step["parameters"]}
    assert parameters["op"]["value"] == "'stat'" and parameters["clients"]["value"] == "3"
    assert parameters["endpoint"]["value"] == "'embedded xrootd (root)'"
    assert parameters["storage version"]["value"].startswith("'5.")
    measured = parameters["rate_hz (step)"]
    assert measured.get("excluded") is True and float(measured["value"]) > 0
    names = [attachment["name"] for attachment in step["attachments"]]
    assert names == ["table: stat at 3 clients", "table: stat at 3 clients (CSV)",
                     "timeline: stat at 3 clients", "latency ECDF: stat at 3 clients",
                     "step JSON: stat at 3 clients",
                     "scan: stat (rate, failed, hung vs clients)"]
    # a new embedded server (new port) and new numbers: still the same history
    for name in a:
        assert a[name]["historyId"] == b[name]["historyId"], name
    environment = (path / "first" / "environment.properties").read_text()
    assert "storage.system=xrootd" in environment and "client.pytest=" in environment
    assert "run.verdict=PASSED (4 passed)" in environment and "run.baseline" not in environment
    categories = json.loads((path / "first" / "categories.json").read_text())
    assert [c["name"] for c in categories][:2] == ["Hung clients", "Threshold violations"]


@pytest.mark.integration
def test_allure_results_written_once_under_xdist(pytester):
    result = _run_suite(pytester, "--alluredir=out", "-n", "2")
    result.assert_outcomes(passed=4)
    out = pytester.path / "out"
    assert (out / "environment.properties").is_file() and (out / "categories.json").is_file()
    assert len(_results(out)) == 4
    # the scan plot of the later concurrency covers both steps, whichever worker ran them
    steps = [json.loads(p.read_text()) for p in out.glob("*-attachment.json")]
    assert {s["clients"] for s in steps if s["op"] == "stat"} == {2, 3}


@pytest.mark.integration
@SUITE_RUNS_GROUP
def test_allure_html_report_shows_the_scan_plot_in_a_browser(suite_runs, tmp_path):
    if not ALLURE.exists():
        pytest.fail(f"{ALLURE} missing: run 'make setup' (installs the Allure command line)")
    suite_runs.first.assert_outcomes(passed=4)
    report = tmp_path / "report"
    subprocess.run([str(ALLURE), "generate", str(suite_runs.path / "first"), "-o",
                    str(report), "--clean"], check=True, capture_output=True, timeout=120)
    case = next(json.loads(p.read_text()) for p in (report / "data" / "test-cases").glob("*")
                if json.loads(p.read_text())["name"] == "test_stat_scan[c3]")
    scan = next(a for a in case["testStage"]["attachments"] if a["name"].startswith("scan:"))

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(report))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        with _chromium() as browser:
            browser.get(f"http://127.0.0.1:{server.server_address[1]}/#testresult/{case['uid']}")
            wait = WebDriverWait(browser, 30)
            wait.until(lambda b: b.find_elements(By.XPATH, "//*[contains(text(), 'scan: stat')]"))[
                0].click()
            image = wait.until(lambda b: [i for i in b.find_elements(By.TAG_NAME, "img")
                                          if scan["source"] in (i.get_attribute("src") or "")])[0]
            wait.until(lambda b: b.execute_script("return arguments[0].naturalWidth", image) > 0)
            assert browser.execute_script("return arguments[0].naturalWidth", image) > 300
            browser.save_screenshot(str(tmp_path / "allure-step.png"))
    finally:
        server.shutdown()


@pytest.mark.integration
@SUITE_RUNS_GROUP
def test_storage_report_page(suite_runs):
    result = suite_runs.first
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["report: */report/index.html"])
    page = (suite_runs.path / "report" / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 2 + 4 * 2  # 2 scans, 4 steps x 2 plots
    assert "<td>stat</td>" in page and "scan stat" in page
    csv = (suite_runs.path / "report" / "table.csv").read_text().splitlines()
    assert csv[0].startswith("op,clients,succeeded,rate") and len(csv) == 5


#: a functional test beside the load steps, failing on the storage's answer
_MISSING_FILE_TEST = """
def test_written_file_is_there(storage_client, storage_test_dir):
    storage_client.stat(f"{storage_test_dir}/never-written.dat")
"""


@pytest.mark.integration
def test_storage_report_states_the_run_verdict_first(pytester, tmp_path):
    """Load steps that pass and one functional test that fails (under xdist: the
    controller writes the page from the workers' reports): the page says FAILED first,
    as the exit status does, and lists the failure first with its cause, no traceback."""
    pytester.makepyfile(test_functional=_MISSING_FILE_TEST)
    result = _run_suite(pytester, "test_functional.py", "--storage-report=report", "-n", "2",
                        select="stat_scan or written_file")
    result.assert_outcomes(passed=2, failed=1)
    assert result.ret == 1
    page = pytester.path / "report" / "index.html"
    text = page.read_text()
    assert "Traceback" not in text and "def test_written_file_is_there" not in text
    assert "storage_client.stat(" not in text  # the cause, not the failing source line
    from selenium.webdriver.common.by import By

    with _chromium() as browser:
        browser.get(page.as_uri())
        headings = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "h1, h2")]
        assert headings[:3] == ["FAILED", "Tests", "Load steps"], headings
        assert "1 failed, 2 passed (pytest exit status 1)" in browser.find_element(
            By.CLASS_NAME, "counts").text
        facts = browser.find_element(By.CLASS_NAME, "facts").text
        assert re.search(r"storage xrootd 5\.\S+ \(", facts), facts
        assert re.search(r"run id storagescale-run-\S+", facts), facts
        assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", facts), facts
        rows = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
                for row in browser.find_elements(By.CSS_SELECTOR, "table.tests tr")[1:]]
    assert [row[:2] for row in rows] == [["failed", "functional"], ["passed", "load"],
                                         ["passed", "load"]], rows
    assert rows[0][2].endswith("::test_written_file_is_there"), rows[0][2]
    assert sorted(row[2].rpartition("::")[2] for row in rows[1:]) == [
        "test_stat_scan[c2]", "test_stat_scan[c3]"]
    # the storage's answer (whatever the wording around it), one paragraph
    cause = rows[0][3]
    assert "never-written.dat" in cause and "no such file" in cause.lower(), cause
    assert len(cause.splitlines()) <= 3 and rows[1][3] == rows[2][3] == "", cause


_KEY_NUMBERS_PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "0.5s"
hang_timeout = "30s"

[ops.mixed]
clients = [1]
file_size = "1kB"
files = 2

[[ops.mixed.expect]]
rules = ["mix_ratio > 0"]

[ops.recovery]
op = "stat"
clients = [1]
overload_clients = 2
overload_duration = "0.5s"
recover_fraction = 0.01
recover_within = "30s"

[[ops.recovery.expect]]
rules = ["recovery_s <= 60"]
"""

_KEY_NUMBERS_SUITE = """
import pytest

@pytest.mark.storagescale_op("mixed")
def test_mixing(storage_load, storage_clients):
    storage_load.mixing()

@pytest.mark.storagescale_op("recovery")
def test_recovery(storage_load):
    storage_load.recovery()
"""


def test_key_numbers_in_the_table_and_every_report(pytester):
    """The seeds' mix_ratio and recovery_s (derived metrics) in the terminal table, the
    HTML page, its CSV (plain numbers under metric-named columns) and Allure."""
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "t.toml").write_text(_KEY_NUMBERS_PLAN)
    pytester.makepyfile(test_suite=_KEY_NUMBERS_SUITE)
    result = pytester.runpytest_subprocess(
        "--storage-endpoint=memory://reports/area", "--storage-version=1.0",
        "--storage-thresholds=thr", "--storage-report=report", "--alluredir=allure",
        "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["op * p99  derived * verdict",
                                 "mixed/readers (mixed) * mix_ratio * pass",
                                 "recovery (probe*) * recovery_s * pass"])
    page = (pytester.path / "report" / "index.html").read_text()
    assert "<th>derived</th>" in page and "<td>mix_ratio " in page
    assert "<td>recovery_s " in page
    rows = list(csv.DictReader(io.StringIO(
        (pytester.path / "report" / "table.csv").read_text())))
    assert float(next(r["mix_ratio"] for r in rows if r["mix_ratio"])) > 0
    assert float(next(r["recovery_s"] for r in rows if r["recovery_s"])) >= 0
    for row in rows:  # every cell but the names and the verdict a plain number
        for column, cell in row.items():
            if column not in ("op", "verdict") and cell:
                float(cell)
    parameters = {p["name"] for path in (pytester.path / "allure").glob("*-result.json")
                  for p in json.loads(path.read_text()).get("parameters", [])}
    assert "mix_ratio (mixed)" in parameters
    assert any(name.startswith("recovery_s (probe") for name in parameters), parameters


class _Terminal:
    """The public TerminalReporter attributes LiveProgress uses."""

    isatty = True

    def flush(self):
        pass


def _progress(elapsed_s):
    return StepProgress(operation="ls", clients=50, elapsed_s=elapsed_s, total_s=1200.0,
                        rate_hz=5.0, succeeded=300, failed=2, hung=1)


def test_live_progress_line(pytestconfig, monkeypatch, capsys):
    terminal = _Terminal()
    monkeypatch.setattr(pytestconfig.pluginmanager, "get_plugin",
                        lambda name: terminal if name == "terminalreporter" else None)
    progress = LiveProgress(pytestconfig)
    if hasattr(pytestconfig, "workerinput"):
        assert not progress.enabled  # an xdist worker's output is no terminal
        return
    assert progress.enabled == (pytestconfig.get_verbosity() >= 0)
    progress.enabled = True
    monkeypatch.setenv("COLUMNS", "200")  # shutil.get_terminal_size reads it first
    progress(_progress(61.2))
    progress(_progress(62.2))
    progress.clear()
    progress.clear()  # nothing shown: nothing to erase
    # the row below pytest's line made once, the progress written there and the cursor
    # put back where pytest left it each time, then the row erased
    def below(text):
        return f"\x1b7\x1bD\r{text}\x1b[K\x1b8"

    assert capsys.readouterr().out == "".join([
        "\x1bD\x1bM", below(LiveProgress.format(_progress(61.2))),
        below(LiveProgress.format(_progress(62.2))), below("")])
    # never wider than the terminal: a wrapped line would overwrite pytest's next rows
    monkeypatch.setenv("COLUMNS", "40")
    progress(_progress(63.2))
    assert below(LiveProgress.format(_progress(63.2))[:39]) in capsys.readouterr().out
    terminal.isatty = False
    assert not LiveProgress(pytestconfig).enabled


def _screen(output: str, width: int = 200) -> list[str]:
    """What a VT100 terminal shows after ``output`` (the escapes pytest and the live
    progress write with --color=no: CR, LF, ESC 7/8/D/M, ESC [K)."""
    rows, row, col, saved = [[]], 0, 0, (0, 0)
    escapes = re.compile(r"\x1b(\[[0-9;]*[A-Za-z]|[78DM])")
    position = 0
    while position < len(output):
        match = escapes.match(output, position)
        char = output[position]
        if match:
            code, position = match.group(1), match.end()
            if code == "7":
                saved = (row, col)
            elif code == "8":
                row, col = saved
            elif code in ("D", "M"):
                row = row + 1 if code == "D" else row - 1
            elif code == "[K":
                del rows[row][col:]
        else:
            position += 1
            if char == "\r":
                col = 0
            elif char == "\n":
                row, col = row + 1, 0
            elif char.isprintable() and col < width:
                line = rows[row]
                line.extend(" " * (col + 1 - len(line)))
                line[col], col = char, col + 1
        while len(rows) <= row:
            rows.append([])
    return ["".join(line).rstrip() for line in rows]


def test_live_progress_leaves_pytests_line_whole_in_a_terminal(pytester):
    """In a real terminal (a pty): the steps' progress shows below pytest's line and
    goes, and pytest's dots stay on one line after the file name, written once."""
    import pty

    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "t.toml").write_text(
        '[storage]\nsystem = "xrootd"\nversions = ["*"]\n[defaults]\nduration = "1.5s"\n'
        'hang_timeout = "10s"\n[ops.stat]\nclients = [1, 2, 3]\n')
    pytester.makepyfile(test_suite="""
        import pytest

        def test_before():
            pass

        @pytest.mark.storagescale_op("stat")
        def test_stat(storage_load, storage_clients):
            storage_load.run()
    """)
    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "pytest", "test_suite.py", "--color=no",
               "--storage-endpoint=memory://progress/area", "--storage-version=1.0",
               "--storage-thresholds=thr", "-p", "no:cacheprovider"]
    env = {**os.environ, "COLUMNS": "200", "LINES": "50", "TERM": "xterm"}
    with subprocess.Popen(command, cwd=pytester.path, stdin=follower, stdout=follower,
                          stderr=follower, env=env) as process:
        os.close(follower)
        chunks = []
        with contextlib.suppress(OSError):  # EIO once the process closed the pty
            while chunk := os.read(leader, 65536):
                chunks.append(chunk)
        process.wait(timeout=120)
    os.close(leader)
    output = b"".join(chunks).decode(errors="replace")
    assert "storagescale: stat 1 clients" in output  # the progress was shown
    screen = _screen(output)
    [line] = [line for line in screen if line.startswith("test_suite.py")]
    assert re.fullmatch(r"test_suite\.py \.{4} +\[100%\]", line), screen
    assert output.count("test_suite.py ") == 1, screen  # the file name written once
    assert not any(line.strip() in (".", "..") for line in screen), screen
    assert not any("storagescale: stat" in line for line in screen), screen  # erased


@pytest.mark.integration
@SUITE_RUNS_GROUP
def test_pytest_benchmark_compare_reads_our_results(suite_runs):
    suite_runs.first.assert_outcomes(passed=4)
    suite_runs.second.assert_outcomes(passed=4)
    path = suite_runs.path
    document = json.loads((path / "new.json").read_text())
    stat = next(b for b in document["benchmarks"] if b["name"] == "stat[c3]")
    assert stat["stats"]["rounds"] > 0 and stat["stats"]["ops"] > 0
    assert stat["stats"]["min"] <= stat["stats"]["median"] <= stat["stats"]["max"]
    compare = shutil.which("pytest-benchmark", path=str(Path(sys.executable).parent))
    done = subprocess.run(
        [compare, "compare", str(path / "old.json"), str(path / "new.json"),
         "--group-by", "name", "--columns", "min,median,max,ops"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "benchmark 'stat[c3]': 2 tests" in done.stdout
    assert "ls[c2] (" in done.stdout
