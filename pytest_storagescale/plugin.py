"""The pytest entry point: options, ini keys, markers, header, parametrization, summary.

Thin by design: settings live in :mod:`.config`, session state in :mod:`.session`,
fixtures in :mod:`.fixtures`.
"""

from __future__ import annotations

import pytest

from .config import OPTIONS, Settings
from .errors import StorageScaleUsageError
from .fixtures import (  # noqa: F401 - fixtures are registered by import
    marker_arg,
    storage_clients,
    storage_endpoint,
    storage_load,
    storage_system,
    storage_thresholds,
)
from .reporting.table import format_table
from .session import StorageRun
from .stash import storage_run_key

MARKERS = (
    "storagescale_op(op): a load test of this operation; storage_clients is parametrized "
    "from the thresholds file's scan list for it.",
    "storagescale_system(name): the storage system whose thresholds folder applies "
    "(--storage-system overrides).",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("storagescale", "storage scalability and acceptance tests")
    for name, (flag, _, _, help_text) in OPTIONS.items():
        group.addoption(flag, dest=name, default=None, help=help_text)
        parser.addini(name, help=help_text, default=None)


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    config.stash[storage_run_key] = StorageRun(Settings.from_config(config))


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(storage_run_key, None)
    if run is None:
        return []
    lines = [f"storagescale: endpoint {run.endpoint_display}"]
    lines += [f"  {line}" for line in run.settings.header_lines()]
    return lines


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``storage_clients`` from the matched thresholds file."""
    if "storage_clients" not in metafunc.fixturenames:
        return
    op = marker_arg(metafunc.definition, "storagescale_op")
    if op is None:
        return
    run: StorageRun = metafunc.config.stash[storage_run_key]
    system = run.system_for(marker_arg(metafunc.definition, "storagescale_system"))
    try:
        thresholds = run.thresholds(system)
    except StorageScaleUsageError as exc:
        # raised from collection it would become a collection error with a traceback
        run.collection_errors.append(str(exc))
        metafunc.parametrize("storage_clients", [pytest.param(None, marks=pytest.mark.skip(
            reason=f"not collected: {exc}"))], indirect=True, ids=["error"])
        return
    op_plan = thresholds.op(op)
    if op_plan is None:
        reason = (f"{thresholds.path} has no [ops.{op}] section: this storage version is "
                  f"not tested for {op}")
        metafunc.parametrize("storage_clients", [pytest.param(
            None, marks=pytest.mark.skip(reason=reason))], indirect=True, ids=["no-plan"])
        return
    clients = run.settings.clients or op_plan.clients
    metafunc.parametrize("storage_clients", list(clients), indirect=True,
                         ids=[f"c{c}" for c in clients])


def pytest_collection_modifyitems(config: pytest.Config) -> None:
    run = config.stash[storage_run_key]
    if run.collection_errors:
        raise StorageScaleUsageError(run.collection_errors[0])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Clean up before the summary, so that a failed clean-up can be reported in it."""
    run = session.config.stash.get(storage_run_key, None)
    if run is not None:
        run.finish()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    run = config.stash.get(storage_run_key, None)
    if run is not None and run.cleanup_error:
        terminalreporter.write_line(
            f"storagescale: could not remove this run's directory {run.run_id}: "
            f"{run.cleanup_error}. Remove it by hand.", yellow=True,
        )
    if run is None or not run.steps:
        return
    info = run.results.run
    terminalreporter.section("storagescale")
    terminalreporter.write_line(
        f"storagescale: {info['system']} {info['version']} at {info['endpoint']}"
    )
    terminalreporter.write_line(
        f"              thresholds: {info['thresholds_file']} ({info['thresholds_reason']})"
    )
    for line in format_table(run.steps):
        terminalreporter.write_line(line)
    if run.results.path is not None:
        terminalreporter.write_line(f"results: {run.results.path}")


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(storage_run_key, None)
    if run is not None:
        run.finish()
