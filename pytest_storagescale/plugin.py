"""The pytest entry point: options, ini keys, markers, header, parametrization, summary.

Thin by design: settings live in :mod:`.config`, session state in :mod:`.session`,
fixtures in :mod:`.fixtures`.
"""

from __future__ import annotations

import pytest

from .config import OPTIONS, Settings
from .errors import StorageScaleUsageError
from .fixtures import (  # noqa: F401 - fixtures are registered by import
    STEP_PROPERTY,
    marker_arg,
    storage_clients,
    storage_endpoint,
    storage_load,
    storage_system,
    storage_thresholds,
)
from .reporting.allure_report import allure_dir, write_session_files
from .reporting.benchmark_json import write_benchmark_json
from .reporting.html import write_report
from .reporting.table import format_table
from .session import StorageRun
from .stash import storage_run_key

WORKER_INPUT_KEY = "storagescale"

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
    # an xdist worker gets the controller's run id, endpoint and shared folder
    shared = getattr(config, "workerinput", {}).get(WORKER_INPUT_KEY)
    run = StorageRun(Settings.from_config(config), shared=shared)
    config.stash[storage_run_key] = run
    if not run.is_worker:  # a worker leaves the steps in its reports for the controller
        config.pluginmanager.register(StepCollector(run), "storagescale-step-collector")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: hand every worker the same run (and embedded endpoint)."""
    run: StorageRun = node.config.stash[storage_run_key]
    node.workerinput[WORKER_INPUT_KEY] = run.shared_info()


class StepCollector:
    """Takes finished steps out of test reports (this process's, or on the xdist
    controller every worker's) into the table and the results file. The step also
    leaves the report's user_properties, so JUnit XML does not carry it."""

    def __init__(self, run: StorageRun) -> None:
        self.run = run

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        steps = [value for name, value in report.user_properties if name == STEP_PROPERTY]
        if not steps:
            return
        report.user_properties[:] = [
            (name, value) for name, value in report.user_properties if name != STEP_PROPERTY
        ]
        for step in steps:
            self.run.record_step(step["run"], step["step"])


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
        if run.is_worker:
            # an xdist worker cannot stop the session with a usage error; a collection
            # error shows the same one paragraph (no traceback) and aborts the run
            raise pytest.Collector.CollectError(f"ERROR: {exc}") from None
        # raised from here it would become a collection error with a traceback; it is
        # raised as a usage error (exit code 4) once collection is done
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


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """After collection the thresholds are known: say which file and why."""
    run = config.stash.get(storage_run_key, None)
    if run is None:
        return []
    return [
        f"storagescale: {system} {run.version} ({run.version_source}): thresholds "
        f"{thresholds.path} ({thresholds.reason})"
        for system, thresholds in run.resolved_thresholds().items()
    ]


def pytest_collection_modifyitems(config: pytest.Config) -> None:
    run = config.stash[storage_run_key]
    if run.collection_errors:
        raise StorageScaleUsageError(run.collection_errors[0])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the reports and clean up before the summary (which reports both)."""
    run = session.config.stash.get(storage_run_key, None)
    if run is None:
        return
    try:
        if not run.is_worker:
            # steps whose test report never arrived (a worker that crashed after the
            # step ended) are still in the session's shared step log
            for run_info, record in run.logged_steps():
                run.record_step(run_info, record)
        if not run.is_worker and run.steps:
            report = run.settings.report_path()
            if report is not None:
                run.report_page = write_report(report, run.results.run, run.steps)
            benchmark_json = run.settings.benchmark_json_path()
            if benchmark_json is not None:
                write_benchmark_json(benchmark_json, run.results.run, run.steps)
            allure_results = allure_dir(session.config)
            if allure_results is not None:
                write_session_files(allure_results, run.results.run)
    finally:
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
        f" (version {info.get('version_source', 'given')})"
    )
    terminalreporter.write_line(
        f"              thresholds: {info['thresholds_file']} ({info['thresholds_reason']})"
    )
    for line in format_table(run.steps):
        terminalreporter.write_line(line)
    if run.results.path is not None:
        terminalreporter.write_line(f"results: {run.results.path}")
    if run.report_page is not None:
        terminalreporter.write_line(f"report: {run.report_page}")


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(storage_run_key, None)
    if run is not None:
        run.finish()
