"""The history of runs: every run appended to a database (``--storage-history``:
SQLite by default, PostgreSQL by URL) and read back by ``storagescale history``, each
step's figures over the runs, their change points and slow drift.

:mod:`.store` the database (SQLAlchemy Core, schema version); :mod:`.changes` change
points (ruptures) and drift (Theil-Sen); :mod:`.command` the text table, the curves and
the exit status. SQLAlchemy, ruptures and matplotlib are imported when used.
"""

from __future__ import annotations

from .store import (
    SCHEMA_VERSION,
    History,
    HistoryError,
    check_session_target,
    open_history,
    record_run,
)

__all__ = [
    "SCHEMA_VERSION", "History", "HistoryError", "check_session_target", "open_history",
    "record_run",
]
