"""The history of runs: every run appended to a database (``--storage-history``:
SQLite by default, PostgreSQL by URL) and read back by ``storagescale history``, each
step's figures over the runs, their change points and slow drift.

:mod:`.store` the database (SQLAlchemy Core, schema version); :mod:`.changes` change
points (ruptures) and drift (Theil-Sen); :mod:`.command` the text table, the curves and
the exit status; :mod:`.prometheus` each step's figures pushed to a Pushgateway.
SQLAlchemy, ruptures, prometheus_client and matplotlib are imported when used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    "keep_run", "record_run",
]


def keep_run(settings: Any, document: Mapping[str, Any]) -> list[str]:
    """At the session's end, on the process that owns the results: the run appended to
    ``--storage-history`` and pushed to ``--storage-pushgateway``; a line for each."""
    lines = []
    if settings.history is not None:
        lines.append(record_run(settings.history, settings.invocation_path, document))
    if settings.pushgateway is not None:
        from .prometheus import push_run

        lines.append(push_run(settings.pushgateway, document))
    return lines
