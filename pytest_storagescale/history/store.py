"""The history database: SQLAlchemy Core tables, the schema version, runs appended.

A target is a SQLite file's path (the default: made 0600, its journal inherits that) or
a SQLAlchemy URL (``sqlite:///PATH``, ``postgresql://USER:PASSWORD@HOST/DB``, which
uses psycopg). Every table is ``storagescale_*``; ``storagescale_schema`` holds one row,
the schema's version: a database written by a newer release is refused (one
paragraph), never read as if it were this one's; one written by an older release is
upgraded in place, once, in one transaction (:data:`MIGRATIONS`, through Alembic's
operations), or refused with the reason when it cannot be. A URL is shown without its
password (:func:`shown`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StorageScaleUsageError
from ..redact import redact_data, redact_text, redact_url, register_url

#: this release's schema; a database of a higher one is refused, of a lower one upgraded
SCHEMA_VERSION = 2
#: how long a call waits for the database (connect, a locked SQLite file): seconds
DEADLINE_S = 30
#: the URL schemes taken (``postgresql`` goes through psycopg)
SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg")
#: at most this many runs are read back per query (the newest)
MAX_RUNS = 10_000


class HistoryError(StorageScaleUsageError):  # type: ignore[misc]
    """The history cannot be used: a bad target, a newer schema, a foreign database."""


def shown(target: str) -> str:
    """``target`` as it may be printed: a URL without its password."""
    return redact_text(redact_url(str(target)))


def _url(target: str, base: Path) -> Any:
    """The SQLAlchemy URL of ``target`` (a path, or a URL of :data:`SCHEMES`)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    text = str(target).strip()
    if not text:
        raise HistoryError("--storage-history: empty value. Give a SQLite file, e.g. "
                           "--storage-history=history.sqlite, or a postgresql:// URL.")
    if "://" not in text:
        path = Path(text).expanduser()
        path = path if path.is_absolute() else base / path
        return make_url("sqlite://").set(database=str(path))
    register_url(text)
    try:
        url = make_url(text)
    except ArgumentError:
        url = None
    if url is None or url.drivername not in SCHEMES:
        raise HistoryError(
            f"--storage-history {shown(text)}: not a history this release can keep. Give a "
            f"SQLite file's path (e.g. history.sqlite), sqlite:///PATH, or "
            f"postgresql://USER:PASSWORD@HOST:PORT/DATABASE.")
    if url.drivername.startswith("postgresql"):
        return url.set(drivername="postgresql+psycopg")
    if not url.database or url.database == ":memory:":
        raise HistoryError(f"--storage-history {shown(text)}: an SQLite history needs a "
                           f"file, e.g. sqlite:///results/history.sqlite.")
    return url


def check_target(target: str, base: Path = Path(".")) -> str:
    """``target`` checked by its form only (no database reached): kept as written."""
    _url(target, base)
    return str(target).strip()


def _tables() -> tuple[Any, Any, Any, Any]:
    from sqlalchemy import (
        JSON,
        Column,
        Float,
        ForeignKey,
        Index,
        Integer,
        MetaData,
        String,
        Table,
        Text,
    )

    metadata = MetaData()
    schema = Table("storagescale_schema", metadata,
                   Column("version", Integer, nullable=False),
                   Column("written_by", String(100), nullable=False))
    runs = Table(
        "storagescale_runs", metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("run_id", String(200), nullable=False),
        Column("started", Float, nullable=False),
        Column("recorded", Float, nullable=False),
        Column("system", String(100), nullable=False),
        Column("version", String(200), nullable=False),
        Column("endpoint", Text, nullable=False),
        Column("endpoint_id", Text, nullable=False),
        Column("door", String(100), nullable=False),
        Column("thresholds_file", Text, nullable=False),
        Column("scale", Float, nullable=False),
        Column("host", String(255), nullable=False),
        Column("verdict", String(100), nullable=False),
        # the results file's run info, tests' outcomes and behaviour gate
        Column("document", JSON, nullable=False),
        # version 2: each series is read by system, in time order
        Index(RUNS_INDEX, "system", "started"),
    )
    steps = Table(
        "storagescale_steps", metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("run", Integer, ForeignKey("storagescale_runs.id", ondelete="CASCADE"),
               nullable=False, index=True),
        Column("step_id", String(100), nullable=False),
        Column("test", Text, nullable=False),
        Column("section", String(200), nullable=False),
        Column("operation", String(100), nullable=False),
        Column("door", String(100), nullable=False),
        Column("clients", Integer, nullable=False),
        Column("arrival_rate", Float),
        Column("rate_hz", Float),
        Column("p50_s", Float),
        Column("p99_s", Float),
        Column("failed", Integer),
        Column("hung", Integer),
        Column("verdict", String(100), nullable=False),
        Column("gate", String(100)),
        # every scalar figure of the step, its latencies and derived metrics
        Column("figures", JSON, nullable=False),
        # the per-window samples (gate.py's contract); null in results without them
        Column("windows", JSON),
        # version 2 (:func:`_upgrade_to_2`): the throughput and the open-loop counts
        *(Column(name, kind) for name, kind in _v2_columns()),
    )
    return metadata, schema, runs, steps


#: the index on runs that schema version 2 adds
RUNS_INDEX = "ix_storagescale_runs_system_started"


def _v2_columns() -> list[tuple[str, Any]]:
    """The step columns schema version 2 adds (nullable: a step of a version 1 history
    without the figure keeps null)."""
    from sqlalchemy import Float, Integer

    return [("mb_s", Float), ("throttled", Integer), ("dropped", Integer)]


def _upgrade_to_2(operations: Any, connection: Any, steps: Any) -> None:
    """Version 1 -> 2: the steps' ``mb_s``, ``throttled`` and ``dropped`` as columns
    (filled from each step's ``figures``, where version 1 kept them), and the runs'
    index on system and start time."""
    from sqlalchemy import Column, bindparam, select, update

    for name, kind in _v2_columns():
        operations.add_column("storagescale_steps", Column(name, kind))
    operations.create_index(RUNS_INDEX, "storagescale_runs", ["system", "started"])
    change = (update(steps).where(steps.c.id == bindparam("row"))
              .values({name: bindparam(f"new_{name}") for name, _ in _v2_columns()}))
    last = 0
    while True:  # in pages of rows: a history of many runs is never read whole
        page = connection.execute(select(steps.c.id, steps.c.figures).where(
            steps.c.id > last).order_by(steps.c.id).limit(1000)).all()
        if not page:
            return
        rows = []
        for row, figures in page:
            figures = figures if isinstance(figures, dict) else {}
            values = {f"new_{name}": _number(figures.get(name)) for name, _ in _v2_columns()}
            for name in ("throttled", "dropped"):
                number = values[f"new_{name}"]
                values[f"new_{name}"] = int(number) if number is not None else None
            rows.append({"row": row, **values})
        connection.execute(change, rows)
        last = page[-1][0]


#: schema version -> (what it changes, the step from the version before it)
MIGRATIONS = {
    2: ("the steps' mb_s, throttled and dropped as columns, an index on runs",
        _upgrade_to_2),
}
#: the upgrades made by this process: target -> (from version, to version)
UPGRADED: dict[str, tuple[int, int]] = {}


@dataclass
class HistoryStep:
    """One step of one run, as the history keeps it."""

    run: int
    run_id: str
    started: float
    system: str
    version: str
    scale: float
    section: str
    operation: str
    door: str
    clients: int
    rate_hz: float | None
    p99_s: float | None
    verdict: str
    figures: dict[str, Any] = field(default_factory=dict)
    windows: list[dict[str, Any]] | None = None
    mb_s: float | None = None

    @property
    def key(self) -> tuple[str, str, str, int, float]:
        """Which series the step belongs to: storage, operation, door, clients, scale."""
        return (self.system, self.section, self.door, self.clients, self.scale)


class History:
    """An open history (:func:`open_history`)."""

    def __init__(self, engine: Any, target: str) -> None:
        self.engine = engine
        self.target = target
        self.metadata, self.schema, self.runs, self.steps = _tables()

    def close(self) -> None:
        self.engine.dispose()

    def check_schema(self, *, create: bool) -> None:
        """Make the tables of a new history (``create``); refuse a newer schema;
        upgrade an older one (:meth:`upgrade`)."""
        from sqlalchemy import inspect, select

        names = set(inspect(self.engine).get_table_names())
        if "storagescale_schema" not in names:
            if names & {"storagescale_runs", "storagescale_steps"}:
                raise HistoryError(
                    f"--storage-history {shown(self.target)}: the database has history tables "
                    f"but no schema version: it was not written by pytest-storagescale. Give "
                    f"another file or database.")
            if not create:
                raise HistoryError(f"history {shown(self.target)}: no history there (no run "
                                   f"was written to it). Write runs with --storage-history.")
            with self.engine.begin() as connection:
                self.metadata.create_all(connection)
                connection.execute(self.schema.insert().values(
                    version=SCHEMA_VERSION, written_by=_release()))
            return
        with self.engine.connect() as connection:
            found = connection.execute(select(self.schema.c.version,
                                              self.schema.c.written_by)).all()
        if len(found) != 1:
            raise HistoryError(f"history {shown(self.target)}: its schema table holds "
                               f"{len(found)} rows, not one: the database is damaged.")
        version, writer = found[0]
        if version > SCHEMA_VERSION:
            raise HistoryError(
                f"history {shown(self.target)}: its schema is version {version} (written by "
                f"pytest-storagescale {writer}); this release ({_release()}) reads version "
                f"{SCHEMA_VERSION} at most. Upgrade pytest-storagescale, or give a new "
                f"history file or database.")
        if version < SCHEMA_VERSION:
            self.upgrade(version, writer)

    def upgrade(self, version: int, writer: str) -> None:
        """The schema of ``version`` brought to :data:`SCHEMA_VERSION`, each step of
        :data:`MIGRATIONS` in turn, in one transaction (all or nothing); the schema row
        is locked first, so two runs starting at once upgrade it once."""
        from sqlalchemy import select, update

        why = (f"history {shown(self.target)}: its schema is version {version} (written by "
               f"pytest-storagescale {writer}) and this release ({_release()}) keeps version "
               f"{SCHEMA_VERSION}")
        try:
            from alembic.migration import MigrationContext
            from alembic.operations import Operations
        except ImportError:
            raise HistoryError(f"{why}, which it upgrades with Alembic: Alembic is not "
                               f"installed: install it with pip install "
                               f"'pytest-storagescale[history]'.") from None
        try:
            with self.engine.begin() as connection:
                # the write lock (SQLite) / the row lock (PostgreSQL) before reading
                connection.execute(update(self.schema).values(version=self.schema.c.version))
                current = connection.execute(select(self.schema.c.version)).scalar_one()
                if current >= SCHEMA_VERSION:
                    return  # another run upgraded it meanwhile
                operations = Operations(MigrationContext.configure(connection))
                for step in range(current + 1, SCHEMA_VERSION + 1):
                    MIGRATIONS[step][1](operations, connection, self.steps)
                connection.execute(update(self.schema).values(version=SCHEMA_VERSION,
                                                              written_by=_release()))
        except Exception as exc:  # noqa: BLE001 - the database's refusal (a role without ALTER)
            reason = redact_text(str(getattr(exc, "orig", None) or exc).strip().splitlines()[0])
            raise HistoryError(
                f"{why}; the upgrade failed, nothing was changed: {reason}. Run once with a "
                f"database role that may alter its tables (the upgrade is made once, at the "
                f"start of a run or by storagescale history), or give a new history.") from None
        UPGRADED[self.target] = (current, SCHEMA_VERSION)

    def append(self, document: Mapping[str, Any]) -> int:
        """Append the run of a results document (``{"run", "steps", "verdict", ...}``,
        :meth:`.reporting.results.ResultsFile.document`); its id."""
        document = redact_data(_finite(dict(document)))
        info = document.get("run") or {}
        client = info.get("client") or {}
        row = {
            "run_id": str(info.get("run_id", "")), "started": float(info.get("started") or 0),
            "recorded": time.time(), "system": str(info.get("system", "")),
            "version": str(info.get("version", "")),
            "endpoint": shown(str(info.get("endpoint", ""))),
            "endpoint_id": shown(str(info.get("endpoint_id", ""))),
            "door": str(info.get("door", "")),
            "thresholds_file": str(info.get("thresholds_file", "")),
            "scale": float(info.get("scale") or 1.0), "host": str(client.get("host", "")),
            "verdict": str(document.get("verdict") or ""),
            "document": {key: value for key, value in document.items() if key != "steps"},
        }
        with self.engine.begin() as connection:
            run = connection.execute(self.runs.insert().values(**row)).inserted_primary_key[0]
            rows = [_step_row(run, step) for step in document.get("steps") or ()]
            if rows:
                connection.execute(self.steps.insert(), rows)
        return int(run)

    def history_steps(self, system: str | None = None) -> list[HistoryStep]:
        """Every step of the newest :data:`MAX_RUNS` runs, oldest run first."""
        from sqlalchemy import select

        runs, steps = self.runs, self.steps
        newest = select(runs.c.id).order_by(runs.c.started.desc(), runs.c.id.desc()).limit(
            MAX_RUNS)
        if system is not None:
            newest = newest.where(runs.c.system == system)
        query = (select(runs.c.id, runs.c.run_id, runs.c.started, runs.c.system,
                        runs.c.version, runs.c.scale, steps.c.section, steps.c.operation,
                        steps.c.door, steps.c.clients, steps.c.rate_hz, steps.c.p99_s,
                        steps.c.verdict, steps.c.figures, steps.c.windows, steps.c.mb_s)
                 .join(steps, steps.c.run == runs.c.id)
                 .where(runs.c.id.in_(newest.scalar_subquery()))
                 .order_by(runs.c.started, runs.c.id, steps.c.id))
        with self.engine.connect() as connection:
            return [HistoryStep(*row) for row in connection.execute(query)]

    def run_count(self) -> int:
        from sqlalchemy import func, select

        with self.engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(self.runs))
                       .scalar_one())


def _release() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-storagescale")
    except PackageNotFoundError:  # pragma: no cover - a checkout not installed
        return "unknown"


def _finite(value: Any) -> Any:
    """JSON without NaN or infinities (PostgreSQL's JSON refuses them): null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(
        value, bool) else None


def _step_row(run: int, step: Mapping[str, Any]) -> dict[str, Any]:
    latency = step.get("latency_s") or {}
    figures = {key: value for key, value in step.items()
               if _number(value) is not None and key != "format"}
    figures.update({f"{name}_s": latency.get(name) for name in ("p50", "p90", "p99", "max")})
    figures.update(step.get("derived") or {})
    gate = step.get("gate") or {}
    return {
        "run": run, "step_id": str(step.get("step_id", "")), "test": str(step.get("test", "")),
        "section": str(step.get("op") or step.get("operation") or ""),
        "operation": str(step.get("operation") or ""), "door": str(step.get("door") or ""),
        "clients": int(step.get("clients") or 0),
        "arrival_rate": _number(step.get("arrival_rate")),
        "rate_hz": _number(step.get("rate_hz")), "p50_s": _number(latency.get("p50")),
        "p99_s": _number(latency.get("p99")), "failed": step.get("failed"),
        "hung": step.get("hung"), "verdict": str(step.get("verdict") or ""),
        "gate": gate.get("verdict"), "figures": figures,
        "windows": step.get("windows") if isinstance(step.get("windows"), list) else None,
        "mb_s": _number(step.get("mb_s")), "throttled": _count(step.get("throttled")),
        "dropped": _count(step.get("dropped")),
    }


def _count(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _private_sqlite(path: Path) -> None:
    """A new SQLite file made 0600 before SQLite opens it (its journal and WAL take the
    file's mode); an existing file is left as it is."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return
    except OSError as exc:
        raise HistoryError(f"--storage-history {path}: the history file cannot be made there "
                           f"({exc.strerror or exc}). Give a file in a folder you can "
                           f"write.") from None
    os.close(handle)


def open_history(target: str, *, base: Path = Path("."), create: bool = True) -> History:
    """The history at ``target`` (relative paths from ``base``), its schema checked
    (made when ``create`` and none is there). Bad input, a newer schema, a database
    that cannot be reached: :class:`HistoryError`, one paragraph."""
    try:
        import sqlalchemy
    except ImportError:
        raise HistoryError(
            "the history of runs needs SQLAlchemy, which is not installed in this "
            "environment: install it with pip install 'pytest-storagescale[history]'."
        ) from None
    url = _url(target, base)
    if url.drivername == "sqlite":
        path = Path(url.database)
        if create:
            _private_sqlite(path)
        elif not path.is_file():
            raise HistoryError(f"history {path}: no such file. Give the file written with "
                               f"--storage-history.")
        engine = sqlalchemy.create_engine(url, connect_args={"timeout": DEADLINE_S},
                                          poolclass=sqlalchemy.pool.NullPool)
    else:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise HistoryError(
                f"history {shown(target)}: a PostgreSQL history needs psycopg, which is "
                f"not installed: install it with pip install 'pytest-storagescale[history]'."
            ) from None
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool, connect_args={
            "connect_timeout": DEADLINE_S,
            "options": f"-c statement_timeout={DEADLINE_S * 1000}"})
    history = History(engine, str(target))
    try:
        history.check_schema(create=create)
    except HistoryError:
        history.close()
        raise
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy's, or the driver's unwrapped
        history.close()
        reason = redact_text(str(getattr(exc, "orig", None) or exc).strip().splitlines()[0])
        raise HistoryError(f"history {shown(target)}: the database cannot be used: {reason}. "
                           f"Check the file or URL (and that the server is up).") from None
    except BaseException:
        history.close()
        raise
    return history


@contextmanager
def opened(target: str, *, base: Path = Path("."), create: bool = True) -> Iterator[History]:
    history = open_history(target, base=base, create=create)
    try:
        yield history
    finally:
        history.close()


def check_session_target(target: str, base: Path) -> None:
    """At session start, before any load: the history can be opened (made when new)
    and its schema is not newer than this release's (else :class:`HistoryError`)."""
    with opened(target, base=base, create=True):
        pass


def record_run(target: str, base: Path, document: Mapping[str, Any]) -> str:
    """Append the run of ``document`` at the session's end: the line that says so (or
    why it was not: the run's results are kept in the results file either way)."""
    try:
        with opened(target, base=base, create=True) as history:
            run = history.append(document)
    except HistoryError as exc:
        return f"storagescale: history NOT written: {exc}"
    except Exception as exc:  # noqa: BLE001 - the database's errors: said, never raised
        reason = redact_text(str(getattr(exc, "orig", None) or exc).strip().splitlines()[0])
        return f"storagescale: history NOT written to {shown(target)}: {reason}"
    return f"history: run {run} appended to {shown(target)}{upgrade_note(target)}"


def upgrade_note(target: str) -> str:
    """`` (its schema upgraded from version 1 to 2)`` when this process upgraded the
    history at ``target`` since it was last said, else empty."""
    if str(target) not in UPGRADED:
        return ""
    before, after = UPGRADED.pop(str(target))
    return f" (its schema upgraded from version {before} to {after})"
