"""The history's schema versions migrate forward: a real history of schema version 1
(``tests/data/history-v1.sqlite``, written by pytest-storagescale 0.1.0 from two runs of
test_history.py's suite on the memory driver) upgraded in place, once, all or nothing,
in SQLite and in a real PostgreSQL started here; refused with exit 4 when it cannot be."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest
import sqlalchemy
from test_history import _run, _suite

from pytest_storagescale import cli
from pytest_storagescale.history import SCHEMA_VERSION, HistoryError, open_history
from pytest_storagescale.history import store as history_store

V1 = Path(__file__).parent / "data" / "history-v1.sqlite"


def _schema(url: str) -> tuple[int, set[str], set[str]]:
    """The schema version, the steps' columns and the runs' indexes, read directly."""
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            version = connection.execute(sqlalchemy.text(
                "SELECT version FROM storagescale_schema")).scalar_one()
        inspector = sqlalchemy.inspect(engine)
        columns = {column["name"] for column in inspector.get_columns("storagescale_steps")}
        indexes = {index["name"] for index in inspector.get_indexes("storagescale_runs")}
    finally:
        engine.dispose()
    return version, columns, indexes


def _v1_copy(folder: Path) -> Path:
    path = folder / "history.sqlite"
    shutil.copyfile(V1, path)
    path.chmod(0o600)
    return path


def test_the_fixture_is_a_version_1_history():
    """What the other tests upgrade: schema version 1, its columns, its two runs."""
    version, columns, indexes = _schema(f"sqlite:///{V1}")
    assert version == 1 and SCHEMA_VERSION == 2
    assert "mb_s" not in columns and "throttled" not in columns and "rate_hz" in columns
    assert history_store.RUNS_INDEX not in indexes


def test_a_run_upgrades_a_version_1_history_and_appends_to_it(pytester):
    _suite(pytester)
    path = _v1_copy(pytester.path)
    result = _run(pytester, "1.2", f"--storage-history={path}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"history: run 3 appended to {path} (its schema upgraded "
                                 f"from version 1 to {SCHEMA_VERSION})"])
    version, columns, indexes = _schema(f"sqlite:///{path}")
    assert version == SCHEMA_VERSION
    assert {"mb_s", "throttled", "dropped"} <= columns
    assert history_store.RUNS_INDEX in indexes
    history = open_history(str(path), create=False)
    try:
        steps = history.history_steps()
    finally:
        history.close()
    # the two version 1 runs kept, their new columns filled from their figures
    assert [(s.version, s.clients) for s in steps] == [
        ("1.0", 1), ("1.0", 2), ("1.1", 1), ("1.1", 2), ("1.2", 1), ("1.2", 2)]
    assert all(step.mb_s == 0.0 for step in steps)  # stat moves no bytes: 0, not null
    with sqlalchemy.create_engine(f"sqlite:///{path}").connect() as connection:
        throttled = connection.execute(sqlalchemy.text(
            "SELECT throttled FROM storagescale_steps ORDER BY id")).scalars().all()
    assert throttled == [0] * 6
    # a second run: no upgrade left to make, none said
    again = _run(pytester, "1.2", f"--storage-history={path}")
    again.stdout.fnmatch_lines(["history: run 4 appended to *history.sqlite"])
    assert "upgraded" not in again.stdout.str()


def test_the_command_upgrades_a_version_1_history_and_says_so(tmp_path, capsys):
    path = _v1_copy(tmp_path)
    assert cli.main(["history", str(path)]) in (0, 1)  # the memory driver's rates: as found
    out = capsys.readouterr().out
    assert out.startswith(f"history {path}: 2 runs, 2 steps (its schema upgraded from "
                          f"version 1 to {SCHEMA_VERSION})\n"), out
    assert out.count(" 1.0 ") == 2 and out.count(" 1.1 ") == 2
    assert _schema(f"sqlite:///{path}")[0] == SCHEMA_VERSION


def test_a_failed_upgrade_changes_nothing_and_is_exit_4(tmp_path, capsys):
    """A version 1 history that already has a ``dropped`` column (altered by hand): the
    upgrade fails at its third column, and the two it had added are rolled back."""
    path = _v1_copy(tmp_path)
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text(
            "ALTER TABLE storagescale_steps ADD COLUMN dropped INTEGER"))
    engine.dispose()
    assert cli.main(["history", str(path)]) == 4
    err = capsys.readouterr().err
    assert "its schema is version 1 (written by pytest-storagescale 0.1.0)" in err
    assert "the upgrade failed, nothing was changed: duplicate column name: dropped" in err
    assert "Traceback" not in err
    version, columns, indexes = _schema(f"sqlite:///{path}")
    assert version == 1 and "mb_s" not in columns and "throttled" not in columns
    assert history_store.RUNS_INDEX not in indexes


def test_without_alembic_an_older_history_is_refused_naming_the_extra(tmp_path, monkeypatch):
    path = _v1_copy(tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "alembic.migration", None)
    with pytest.raises(HistoryError, match=r"upgrades with Alembic: Alembic is not installed: "
                       r"install it with pip install 'pytest-storagescale\[history\]'"):
        open_history(str(path), create=False)
    assert _schema(f"sqlite:///{path}")[0] == 1


def test_two_runs_starting_at_once_upgrade_it_once(tmp_path):
    """Two openers at once (two CI jobs): the schema row is locked before it is read,
    so one upgrades and the other finds it done; neither fails."""
    path = _v1_copy(tmp_path)
    failures: list[BaseException] = []
    barrier = threading.Barrier(2)

    def open_it() -> None:
        try:
            barrier.wait(timeout=30)
            open_history(str(path)).close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    version, columns, _ = _schema(f"sqlite:///{path}")
    assert version == SCHEMA_VERSION and {"mb_s", "throttled", "dropped"} <= columns


@pytest.mark.integration
def test_a_version_1_history_in_a_real_postgresql_is_upgraded(tmp_path, capsys):
    """The fixture's tables and rows copied into a real PostgreSQL (its version 1 DDL as
    SQLAlchemy reflects it): a role that does not own the tables cannot alter them, the
    upgrade is refused with exit 4 and changes nothing; the owner's upgrade succeeds."""
    from pytest_storagescale.servers.postgres import SUPERUSER, PostgresCluster, postgres_bin_dir

    if postgres_bin_dir() is None:
        pytest.skip("PostgreSQL is not installed (scripts/bootstrap.sh installs postgresql)")
    parent = Path(tempfile.mkdtemp(prefix="storagescale-pgschema-"))
    parent.chmod(0o711)  # the cluster's user (postgres, when root) goes through
    database = PostgresCluster(parent / "postgres").start()
    try:
        database.create_databases("history", ("runs",))
        url = f"postgresql+psycopg://history:{database.password}@127.0.0.1:{database.port}/runs"
        source = sqlalchemy.create_engine(f"sqlite:///{V1}")
        target = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        metadata = sqlalchemy.MetaData()
        metadata.reflect(source)
        with source.connect() as reading, target.begin() as writing:
            metadata.create_all(writing)
            for table in metadata.sorted_tables:
                rows = [dict(row._mapping) for row in reading.execute(table.select())]
                writing.execute(table.insert(), rows)
            # the serial's next value past the copied ids, as version 1 had left it
            for table in ("storagescale_runs", "storagescale_steps"):
                writing.execute(sqlalchemy.text(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                    f"(SELECT max(id) FROM {table}))"))
        source.dispose()
        target.dispose()
        assert _schema(url)[0] == 1
        tables = ("storagescale_schema", "storagescale_runs", "storagescale_steps")
        database.sql("".join(f"ALTER TABLE {t} OWNER TO {SUPERUSER};\n"
                             f"GRANT SELECT, INSERT, UPDATE ON {t} TO history;\n"
                             for t in tables), database="runs")
        capsys.readouterr()
        assert cli.main(["history", url]) == 4
        err = capsys.readouterr().err
        assert "the upgrade failed, nothing was changed: must be owner of table" in err, err
        assert database.password not in err
        version, columns, indexes = _schema(url)
        assert version == 1 and "mb_s" not in columns
        database.sql("".join(f"ALTER TABLE {t} OWNER TO history;\n" for t in tables),
                     database="runs")
        assert cli.main(["history", url]) in (0, 1)
        out = capsys.readouterr().out
        assert f"2 runs, 2 steps (its schema upgraded from version 1 to {SCHEMA_VERSION})" \
            in out
        version, columns, indexes = _schema(url)
        assert version == SCHEMA_VERSION and {"mb_s", "throttled", "dropped"} <= columns
        assert history_store.RUNS_INDEX in indexes
        history = open_history(url, create=False)
        try:
            from test_history import _document

            run = history.append(_document(3, "1.2", 500.0, 0.02))
            steps = history.history_steps()
        finally:
            history.close()
        assert run == 3 and len(steps) == 5
        assert [s.mb_s for s in steps if s.version in ("1.0", "1.1")] == [0.0] * 4
    finally:
        database.stop()
        shutil.rmtree(parent, ignore_errors=True)
