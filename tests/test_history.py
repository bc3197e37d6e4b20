"""The history of runs (``--storage-history``, ``storagescale history``): real runs of a
tiny suite on the memory driver appended to SQLite, the schema version refused when
newer, change points and drift found in series of known shape, and a history in a real
PostgreSQL started here."""

from __future__ import annotations

import json
import random
import re
import shutil
import stat
import tempfile
from pathlib import Path

import matplotlib.pyplot  # noqa: F401 - loaded before pytester's snapshot of sys.modules
import pytest
import sqlalchemy
import sqlalchemy.dialects.postgresql  # noqa: F401 - before pytester's snapshot (no re-import)
import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401 - the same

from pytest_storagescale import cli
from pytest_storagescale.history import SCHEMA_VERSION, HistoryError, open_history
from pytest_storagescale.history.changes import change_points, drift, metrics
from pytest_storagescale.history.command import build_series

PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "0.3s"
hang_timeout = "5s"

[ops.stat]
clients = [1, 2]

[[ops.stat.expect]]
clients = "*"
rules = ["failed == 0"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()
"""

RATE, P99 = metrics()


def _suite(pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    (pytester.path / "thr" / "xrootd").mkdir(parents=True)
    (pytester.path / "thr" / "xrootd" / "any.toml").write_text(PLAN)


def _run(pytester, version: str, *extra: str):
    return pytester.runpytest(
        f"--storage-endpoint=memory://history-{version}/area", f"--storage-version={version}",
        "--storage-thresholds=thr", "-p", "no:cacheprovider", *extra)


def test_runs_of_a_suite_fill_the_history_and_the_command_reads_it(pytester, capsys):
    _suite(pytester)
    for version in ("1.0", "2.0"):
        result = _run(pytester, version, "--storage-history=runs.sqlite")
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines(["history: run * appended to *runs.sqlite"])
    path = pytester.path / "runs.sqlite"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    history = open_history(str(path), create=False)
    try:
        steps = history.history_steps()
        assert history.run_count() == 2
    finally:
        history.close()
    assert [(s.version, s.clients) for s in steps] == [("1.0", 1), ("1.0", 2), ("2.0", 1),
                                                         ("2.0", 2)]
    for step in steps:
        assert step.rate_hz and step.rate_hz > 0 and step.verdict == "pass"
        assert step.windows and all("operations" in window for window in step.windows)
        assert step.figures["succeeded"] > 0
    capsys.readouterr()
    status = cli.main(["history", str(path), "--html", str(pytester.path / "page"),
                       "--png", str(pytester.path / "png")])
    out = capsys.readouterr().out
    assert status in (0, 1)  # the memory driver's rate is what it is: the table is asserted
    assert "history " + str(path) + ": 2 runs, 2 steps" in out
    assert "xrootd stat clients=1 door=memory" in out and "xrootd stat clients=2" in out
    assert out.count(" 1.0 ") == 2 and out.count(" 2.0 ") == 2
    assert sorted(p.name for p in (pytester.path / "png").iterdir()) == [
        "clients-xrootd_stat_door=memory.png", "xrootd_stat_clients=1_door=memory.png",
        "xrootd_stat_clients=2_door=memory.png"]
    assert "data:image/png;base64," in (pytester.path / "page" / "index.html").read_text()


def test_under_xdist_only_the_controller_writes_the_run(pytester):
    _suite(pytester)
    result = _run(pytester, "1.0", "--storage-history=runs.sqlite", "-n", "2")
    result.assert_outcomes(passed=2)
    history = open_history(str(pytester.path / "runs.sqlite"), create=False)
    try:
        assert history.run_count() == 1
        assert sorted(step.clients for step in history.history_steps()) == [1, 2]
    finally:
        history.close()


def test_a_newer_schema_is_refused_before_any_step(pytester, capsys):
    _suite(pytester)
    _run(pytester, "1.0", "--storage-history=runs.sqlite").assert_outcomes(passed=2)
    engine = sqlalchemy.create_engine(f"sqlite:///{pytester.path / 'runs.sqlite'}")
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("UPDATE storagescale_schema SET version = :v"),
                           {"v": SCHEMA_VERSION + 1})
    engine.dispose()
    result = _run(pytester, "1.0", "--storage-history=runs.sqlite")
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*its schema is version {SCHEMA_VERSION + 1}*reads version "
                                 f"{SCHEMA_VERSION} at most*Upgrade pytest-storagescale*"])
    assert "Traceback" not in result.stderr.str() and "passed" not in result.stdout.str()
    capsys.readouterr()
    assert cli.main(["history", str(pytester.path / "runs.sqlite")]) == 4
    assert f"schema is version {SCHEMA_VERSION + 1}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["mysql://user:s3cretpassw0rd@db.example/h",
                                   "sqlite+pysqlite://user:s3cretpassw0rd@x/h", "postgresql:///"])
def test_a_bad_history_is_one_paragraph_exit_4_without_the_password(pytester, value):
    _suite(pytester)
    result = _run(pytester, "1.0", f"--storage-history={value}")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--storage-history*Give a SQLite file's path*"])
    assert "s3cretpassw0rd" not in result.stdout.str() + result.stderr.str()


def test_an_unreachable_postgresql_is_exit_4_without_the_password(pytester):
    _suite(pytester)
    result = _run(pytester, "1.0",
                  "--storage-history=postgresql://u:s3cretpassw0rd@127.0.0.1:9/h")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*history postgresql://*127.0.0.1:9/h: the database cannot "
                                 "be used*"])
    assert "s3cretpassw0rd" not in result.stdout.str() + result.stderr.str()


def _noisy(runs: int, seed: int, level: float = 1000.0) -> list[float]:
    noise = random.Random(seed)
    return [level * (1 + noise.gauss(0, 0.03)) for _ in range(runs)]


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_a_2x_slowdown_from_run_k_is_the_change_point_at_k(k):
    rates = [value * (0.5 if index >= k else 1) for index, value in enumerate(_noisy(8, k))]
    found = change_points(rates, RATE)
    assert [(c.index, c.worse) for c in found] == [(k, True)]
    assert 0.4 < found[0].ratio < 0.6
    assert drift(rates, RATE, since=k) is None


def test_a_single_slow_run_is_a_change_down_and_back():
    rates = [value * (0.5 if index == 4 else 1) for index, value in enumerate(_noisy(8, 9))]
    assert [(c.index, c.worse) for c in change_points(rates, RATE)] == [(4, True), (5, False)]


@pytest.mark.parametrize("seed", range(5))
def test_a_steady_series_has_no_change_point_and_no_drift(seed):
    rates = _noisy(12, seed)
    assert change_points(rates, RATE) == []
    assert drift(rates, RATE) is None


def test_a_drift_of_5_percent_per_run_over_8_runs_is_reported():
    noise = random.Random(4)
    rates = [1000 * 0.95 ** index * (1 + noise.gauss(0, 0.01)) for index in range(8)]
    assert change_points(rates, RATE) == []  # no single step beyond 15 %
    moved = drift(rates, RATE)
    assert moved is not None and (moved.first, moved.last) == (0, 7)
    assert 0.65 < moved.ratio < 0.75 and moved.high < 1
    # a p99 that rose 5 % per run: the same, the other way
    latencies = [0.01 / value for value in rates]
    assert drift(latencies, P99) is not None and change_points(latencies, P99) == []


def _document(number: int, version: str, rate: float, p99: float) -> dict:
    return {"format": 2, "verdict": "passed", "tests": [], "run": {
        "run_id": f"run-{number}", "started": 1_700_000_000 + 3600 * number, "system": "dcache",
        "version": version, "endpoint": "root://user:hidden@door.example//data",
        "endpoint_id": "root://door.example//data", "door": "root", "scale": 1.0,
        "thresholds_file": "thresholds/dcache/10.toml", "client": {"host": "ci-1"}},
        "steps": [{"step_id": "main-001", "test": "t::test_ls[c50]", "op": "ls",
                   "operation": "ls", "door": "root", "clients": 50, "rate_hz": rate,
                   "latency_s": {"p50": p99 / 3, "p99": p99}, "failed": 0, "hung": 0,
                   "verdict": "pass", "windows": [{"start_s": 0, "width_s": 1,
                                                   "operations": int(rate), "p50_s": p99 / 3,
                                                   "p99_s": p99}]}]}


def _fill(target: str, rates: list[float]) -> None:
    history = open_history(target)
    try:
        for number, rate in enumerate(rates, start=1):
            version = f"10.2.{number}"
            history.append(_document(number, version, rate, 10 / rate))
    finally:
        history.close()


def test_the_command_names_the_run_and_version_of_a_slowdown_exit_1(tmp_path, capsys):
    rates = [value * (0.5 if index >= 5 else 1) for index, value in enumerate(_noisy(8, 2))]
    _fill(str(tmp_path / "h.sqlite"), rates)
    assert cli.main(["history", str(tmp_path / "h.sqlite")]) == 1
    out = capsys.readouterr().out
    assert "dcache ls clients=50 door=root" in out
    assert re.search(r"change point: rate_hz moved 0\.[45]\dx \(\d[\d,]* Hz -> ", out), out
    assert "at run 6 (run-6, version 10.2.6): WORSE beyond the minimum effect" in out
    assert "hidden" not in out


def test_the_curves_mark_and_name_each_change_point(tmp_path):
    """The run figure of a step: a dashed line at each change point, red to the worse,
    green back, named by its first run, version and move."""
    from pytest_storagescale.history.command import series_figure

    rates = [value * (0.5 if index == 4 else 1) for index, value in enumerate(_noisy(8, 9))]
    _fill(str(tmp_path / "h.sqlite"), rates)
    history = open_history(str(tmp_path / "h.sqlite"), create=False)
    try:
        (series,) = build_series(history.history_steps())
    finally:
        history.close()
    rate_axes = series_figure(series).axes[0]
    lines = [(line.get_xdata()[0], line.get_color()) for line in rate_axes.lines
             if line.get_linestyle() == "--"]
    assert lines == [(4.5, "tab:red"), (5.5, "tab:green")]
    names = [text.get_text() for text in rate_axes.texts]
    assert len(names) == 2 and names[0].startswith("run 5 (10.2.5) 0.")
    assert names[1].startswith("run 6 (10.2.6) ")


def test_the_command_exits_0_on_a_steady_history_and_1_on_a_drift(tmp_path, capsys):
    _fill(str(tmp_path / "steady.sqlite"), _noisy(8, 1))
    assert cli.main(["history", str(tmp_path / "steady.sqlite")]) == 0
    assert "no change point, no drift" in capsys.readouterr().out
    _fill(str(tmp_path / "drift.sqlite"), [1000 * 0.95 ** i for i in range(8)])
    assert cli.main(["history", str(tmp_path / "drift.sqlite")]) == 1
    out = capsys.readouterr().out
    assert "drift: rate_hz moved 0.70x over runs 1-8 (10.2.1 -> 10.2.8" in out


def test_the_table_shows_mb_s_for_steps_that_move_bytes(tmp_path, capsys):
    """A put step's MB/s (a column from schema version 2) is in its table; a stat
    step's table has none."""
    history = open_history(str(tmp_path / "h.sqlite"))
    try:
        for number, mb_s in ((1, 41.5), (2, 39.25)):
            document = _document(number, f"10.2.{number}", 40.0, 0.2)
            document["steps"][0].update(op="put", operation="put", mb_s=mb_s, throttled=3)
            history.append(document)
        history.append(_document(3, "10.2.3", 500.0, 0.02))
    finally:
        history.close()
    assert cli.main(["history", str(tmp_path / "h.sqlite")]) == 0
    out = capsys.readouterr().out
    put = out.split("dcache put clients=50 door=root")[1].split("\n\n")[0]
    assert re.search(r"rate\s+MB/s\s+p99", put) and " 41.5 " in put and " 39.2 " in put, put
    ls = out.split("dcache ls clients=50 door=root")[1].split("\n\n")[0]
    assert "MB/s" not in ls, ls
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'h.sqlite'}")
    with engine.connect() as connection:
        assert connection.execute(sqlalchemy.text(
            "SELECT mb_s, throttled FROM storagescale_steps ORDER BY id")).all() == [
            (41.5, 3), (39.25, 3), (None, None)]
    engine.dispose()


def test_series_are_per_step(tmp_path):
    _fill(str(tmp_path / "h.sqlite"), [100.0, 100.0])
    history = open_history(str(tmp_path / "h.sqlite"), create=False)
    try:
        document = _document(3, "11.0", 100.0, 0.1)
        document["steps"][0]["clients"] = 5
        history.append(document)
        series = build_series(history.history_steps())
    finally:
        history.close()
    assert [(s.key[1], s.key[3], len(s.steps)) for s in series] == [("ls", 5, 1), ("ls", 50, 2)]


def test_a_missing_history_file_is_exit_4(tmp_path, capsys):
    assert cli.main(["history", str(tmp_path / "none.sqlite")]) == 4
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("argument", ["--last=1", "--last=5000", "--min-effect-rate=1.5"])
def test_bad_command_arguments_are_exit_4(tmp_path, capsys, argument):
    _fill(str(tmp_path / "h.sqlite"), [100.0, 100.0])
    assert cli.main(["history", str(tmp_path / "h.sqlite"), argument]) == 4
    assert "ERROR: " in capsys.readouterr().err


def test_last_judges_only_the_newest_runs(tmp_path, capsys):
    rates = [value * (0.5 if index >= 3 else 1) for index, value in enumerate(_noisy(10, 3))]
    _fill(str(tmp_path / "h.sqlite"), rates)
    assert cli.main(["history", str(tmp_path / "h.sqlite")]) == 1
    capsys.readouterr()
    assert cli.main(["history", str(tmp_path / "h.sqlite"), "--last=6"]) == 0
    out = capsys.readouterr().out
    assert "10.2.5" in out and "10.2.4 " not in out


def test_a_foreign_database_is_refused(tmp_path):
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'other.sqlite'}")
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("CREATE TABLE storagescale_runs (id INTEGER)"))
    engine.dispose()
    with pytest.raises(HistoryError, match="no schema version"):
        open_history(str(tmp_path / "other.sqlite"))


@pytest.mark.integration
def test_a_history_in_a_real_postgresql(tmp_path, capsys):
    from pytest_storagescale.servers.postgres import PostgresCluster, postgres_bin_dir

    if postgres_bin_dir() is None:
        pytest.skip("PostgreSQL is not installed (scripts/bootstrap.sh installs postgresql)")
    parent = Path(tempfile.mkdtemp(prefix="storagescale-pghistory-"))
    parent.chmod(0o711)  # the cluster's user (postgres, when root) goes through
    database = PostgresCluster(parent / "postgres").start()
    try:
        database.create_databases("history", ("runs",))
        url = f"postgresql://history:{database.password}@127.0.0.1:{database.port}/runs"
        rates = [value * (0.5 if index >= 4 else 1) for index, value in enumerate(_noisy(6, 5))]
        _fill(url, rates)
        assert cli.main(["history", url]) == 1
        out = capsys.readouterr().out
        assert "at run 5 (run-5, version 10.2.5): WORSE" in out
        assert database.password not in out
        history = open_history(url, create=False)
        try:
            windows = history.history_steps()[0].windows
        finally:
            history.close()
        assert json.loads(json.dumps(windows))[0]["operations"] == int(rates[0])
    finally:
        database.stop()
        shutil.rmtree(parent, ignore_errors=True)


def test_the_openmetrics_file_of_a_run(pytester):
    _suite(pytester)
    (pytester.path / "afile").write_text("")
    result = _run(pytester, "1.0", "--storage-openmetrics=afile/steps.prom")
    assert result.ret == 4  # a folder that is a file: said before any step
    result.stderr.fnmatch_lines(["*--storage-openmetrics*cannot be written there*"])
    assert "passed" not in result.stdout.str()
    result = _run(pytester, "1.0", "--storage-openmetrics=out/steps.prom")  # out/ made
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"openmetrics: {pytester.path / 'out' / 'steps.prom'}"])
    text = (pytester.path / "out" / "steps.prom").read_text()
    assert text.endswith("# EOF\n")
    for clients in (1, 2):
        line = (f'storagescale_step_rate_hz{{clients="{clients}",door="memory",'
                f'operation="stat",storage="xrootd",version="1.0"}} ')
        assert re.search(f"^{re.escape(line)}[1-9]", text, re.MULTILINE), text


def test_a_history_that_cannot_take_the_run_at_the_end_is_said(tmp_path):
    """The database became unusable between session start and end: one line, no
    traceback, the URL's password not in it."""
    from pytest_storagescale.history import record_run

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'other.sqlite'}")
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("CREATE TABLE storagescale_runs (id INTEGER)"))
    engine.dispose()
    line = record_run(str(tmp_path / "other.sqlite"), tmp_path, _document(1, "1", 1.0, 1.0))
    assert line.startswith("storagescale: history NOT written: ") and "no schema" in line
    line = record_run("postgresql://u:s3cretpassw0rd@127.0.0.1:9/h", tmp_path,
                      _document(1, "1", 1.0, 1.0))
    assert line.startswith("storagescale: history NOT written: ")
    assert "s3cretpassw0rd" not in line and "127.0.0.1:9/h" in line


def test_the_header_shows_the_history_url_without_its_password():
    from pytest_storagescale.config import Setting, Settings

    settings = Settings.from_values({
        "storage_history": Setting("postgresql://ci:s3cretpassw0rd@db.example/runs",
                                   "--storage-history"),
        "storage_pushgateway": Setting("http://u:s3cretpassw0rd@127.0.0.1:9091",
                                       "--storage-pushgateway")})
    lines = [line for line in settings.header_lines()
             if line.startswith(("storage_history", "storage_pushgateway"))]
    assert len(lines) == 2 and all("s3cretpassw0rd" not in line for line in lines), lines
    assert "db.example/runs (from --storage-history)" in lines[0]


def test_real_runs_with_a_slowed_release_name_its_first_run(pytester, capsys):
    """Six runs of the suite on the memory driver, each request 2 ms (1.0) then 100 ms
    (1.1, the injected slowdown), 1 s steps: the command names the first 1.1 run, exit
    1. (With 4 ms, at load average 33 on this 2-core machine, the 1.0 runs' own rates
    varied 4-fold, 223-930 Hz, and hid the slowdown; with 20 ms and 0.3 s steps a
    starved 1.0 run's 2 ms requests took 19 ms (43 Hz) and one step completed none.)"""
    _suite(pytester)
    plan = pytester.path / "thr" / "xrootd" / "any.toml"
    plan.write_text(plan.read_text().replace('duration = "0.3s"', 'duration = "1s"'))
    for version, latency in (("1.0", "0.002"),) * 3 + (("1.1", "0.1"),) * 3:
        _run(pytester, version, "--storage-history=runs.sqlite",
             f"--storage-driver-option=latency={latency}").assert_outcomes(passed=2)
    assert cli.main(["history", str(pytester.path / "runs.sqlite")]) == 1
    out = capsys.readouterr().out
    for clients in (1, 2):
        section = out.split(f"xrootd stat clients={clients} door=memory")[1].split("\n\n")[0]
        assert re.search(r"change point: rate_hz moved 0\.[0-4]\dx .* at run 4 \(\S+, "
                         r"version 1\.1\): WORSE", section), section


@pytest.mark.parametrize("module, option, extra, message", [
    ("sqlalchemy", "--storage-history=runs.sqlite", "history", "needs SQLAlchemy"),
    ("prometheus_client", "--storage-pushgateway=http://127.0.0.1:9", "prometheus",
     "Pushgateway NOT pushed"),
])
def test_a_missing_library_is_named_with_its_extra(pytester, module, option, extra, message):
    """SQLAlchemy hidden: exit 4 before any step; prometheus_client hidden: said at the
    end, the run's status kept."""
    _suite(pytester)
    pytester.makeconftest(f"import sys\nsys.modules[{module!r}] = None  # not installed\n")
    result = pytester.runpytest_subprocess(
        "--storage-endpoint=memory://missing/area", "--storage-thresholds=thr",
        "--storage-version=1.0", "-p", "no:cacheprovider", option)
    text = result.stdout.str() + result.stderr.str()
    assert message in text and f"pip install 'pytest-storagescale[{extra}]'" in text, text
    assert result.ret == (4 if module == "sqlalchemy" else 0)
    assert "Traceback" not in text
