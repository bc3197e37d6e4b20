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
    "SCHEMA_VERSION", "History", "HistoryError", "check_outputs", "check_session_target",
    "StepPusher", "keep_run", "open_history", "record_run",
]


class StepPusher:
    """``--storage-pushgateway`` at the end of each step (on the process that owns the
    results): the run's steps so far pushed; after a push that failed, none until the
    session's end (whose push is said in the summary), so an unreachable gateway costs
    one deadline, not one per step."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.failed = False

    def step_ended(self, ledger: Any) -> None:
        if self.url is None or self.failed or ledger.run is None or not ledger.steps:
            return
        from .prometheus import push_run

        line = push_run(self.url, ledger.results.document(ledger.run, ledger.steps))
        self.failed = not line.startswith("pushgateway:")


def check_outputs(settings: Any) -> None:
    """At session start, before any load: the history opens (made when new) with a
    schema this release reads, the OpenMetrics file can be written (else exit 4)."""
    if settings.history is not None:
        check_session_target(settings.history, settings.invocation_path)
    from ..errors import StorageScaleUsageError
    from ..session import unwritable_file

    reason = unwritable_file(settings.openmetrics_path())
    if reason is not None:
        raise StorageScaleUsageError(
            f"--storage-openmetrics {settings.openmetrics_path()}: the OpenMetrics file "
            f"cannot be written there: {reason}. Give a file in a folder you can write, "
            f"e.g. --storage-openmetrics=results/storagescale.prom.")


def keep_run(settings: Any, document: Mapping[str, Any]) -> list[str]:
    """At the session's end, on the process that owns the results: the run appended to
    ``--storage-history``, pushed to ``--storage-pushgateway``, written to
    ``--storage-openmetrics``; a line for each."""
    lines = []
    if settings.history is not None:
        lines.append(record_run(settings.history, settings.invocation_path, document))
    if settings.pushgateway is not None:
        from .prometheus import push_run

        lines.append(push_run(settings.pushgateway, document))
    if settings.openmetrics_path() is not None:
        from .prometheus import write_openmetrics

        lines.append(write_openmetrics(settings.openmetrics_path(), document))
    return lines
