"""The pytest entry point: options, ini keys, markers, hooks, header,
parametrization, summary.

Thin by design: settings live in :mod:`.config`, session state in :mod:`.session`,
fixtures in :mod:`.fixtures`, hook specs in :mod:`.hooks`, what a site's hooks add in
:mod:`.extensions`.
"""

from __future__ import annotations

import dataclasses
import getpass
import importlib.util
import re
import socket
import sys
from collections.abc import Callable
from typing import Any

import pytest

from . import extensions, fixtures
from .cluster import breakdown_lines as cluster_breakdown_lines
from .cluster import disconnect as cluster_disconnect
from .cluster import header_lines as cluster_header_lines
from .cluster.address import refuse_recipe_under_xdist
from .compare import session_gate
from .config import (
    EMBEDDED_CHOICES,
    FLAGS,
    OPTIONS,
    REPEATABLE,
    Setting,
    Settings,
    resolve_setting,
)
from .drivers.grid import configure_xrootd_client
from .drivers.registry import extra_hint
from .errors import StorageScaleUsageError
from .fixtures import (  # noqa: F401 - fixtures are registered by import
    STEP_PROPERTY,
    _storagescale_checks_share_the_endpoint,
    marker_arg,
    parametrize_load_doors,
    parametrize_sides,
    storage_arrival_rate,
    storage_client,
    storage_clients,
    storage_cluster,
    storage_doors,
    storage_embedded_server,
    storage_endpoint,
    storage_known_issues,
    storage_load,
    storage_load_door,
    storage_settings,
    storage_side,
    storage_suite_options,
    storage_system,
    storage_test_dir,
    storage_thresholds,
)
from .history import StepPusher, keep_run
from .history import check_outputs as check_history_outputs
from .paired import check_compare_with, side_b
from .paired import finish as finish_paired
from .records import ClientInfo, RunInfo, Verdict
from .redact import (
    redact_argv,
    redact_exception,
    redact_report,
    redact_text,
    redact_url,
    register_url,
)
from .reporting.allure_report import allure_dir, write_session_files
from .reporting.behaviour import BehaviourGate
from .reporting.benchmark_json import write_benchmark_json
from .reporting.failures import fold_storage_skip, shorten_storage_failure
from .reporting.html import write_report
from .reporting.outcomes import PLUGIN_NAME as OUTCOMES
from .reporting.outcomes import RunSummary, TestOutcomes, note_fixed_known_issue
from .reporting.progress import StepLines
from .reporting.table import format_failures, format_table
from .servers.orphans import STOPPED_ORPHANS
from .servers.xrootd_releases import use_client_release
from .session import WORKER_INPUT_KEY, Role, StorageRun, client_versions, role_of
from .session.stopping import TermAsInterrupt, xdist_worker_pids
from .shipped import pyargs_folders
from .stash import storage_run_key
from .steps import client_host_lines, endpoint_driver, unmeasured_lines

#: a test using one of these needs the storage: the endpoint is checked before any test
STORAGE_FIXTURES = frozenset({"storage_endpoint", "storage_load"})
#: the plugin's fixtures: a test using one (or a fixture using one) uses the storage
PLUGIN_FIXTURES = frozenset(name for name, value in vars(fixtures).items()
                            if name.startswith("storage_") and callable(value))
#: the session uses the storage (:func:`use_storage` ran)
storage_used_key = pytest.StashKey[bool]()
#: the endpoint's header lines were shown (else after collection, once storage is used)
header_shown_key = pytest.StashKey[bool]()
#: SIGTERM as Ctrl-C for the session, and the xdist workers it is passed on to
sigterm_key = pytest.StashKey[TermAsInterrupt]()
xdist_nodes_key = pytest.StashKey[list]()
#: the behaviour gate's verdict against the baseline (said in the summary)
behaviour_gate_key = pytest.StashKey[BehaviourGate]()
#: what became of the run in --storage-history and --storage-pushgateway (or why not)
history_lines_key = pytest.StashKey[list[str]]()

MARKERS = (
    "storagescale_op(section): a load test of this thresholds section ([ops.<section>]); "
    "storage_clients (an open-loop section's storage_arrival_rate) is parametrized from "
    "its scan list.",
    "storagescale_system(name): the storage system whose thresholds folder applies "
    "(--storage-system overrides).",
)


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    group = parser.getgroup("storagescale", "storage scalability and acceptance tests")
    # a suite's own options (pytest_storagescale_options), added as each conftest that
    # declares some is registered (pluggy's historic call), kept for pytest_configure
    declared: dict[str, tuple] = {}
    config = pluginmanager.get_plugin("pytestconfig")
    if config is not None:
        config.stash[suite_options_key] = declared
    pluginmanager.hook.pytest_storagescale_options.call_historic(
        result_callback=lambda answer: add_suite_options(group, parser, declared, answer))
    from .servers.family import embedded_help

    for name, (flag, _, _, help_text) in OPTIONS.items():
        if name == "storage_embedded":  # the registered kinds (config imports no server)
            help_text = f"{help_text} Registered: {embedded_help()}."
        action = ("append" if name in REPEATABLE else
                  "store_true" if name in FLAGS else "store")
        group.addoption(flag, dest=name, default=None, action=action, help=help_text)
        parser.addini(name, help=help_text, default=None)


#: a suite's options as declared: name -> (flag, parser, default, help)
suite_options_key = pytest.StashKey[dict[str, tuple]]()
#: a suite option's name: ``storage_<suite>_<what>``
SUITE_OPTION = re.compile(r"storage_[a-z0-9]+(_[a-z0-9]+)+")


def add_suite_options(group, parser: pytest.Parser, declared: dict[str, tuple],
                      answer: Any) -> None:
    """Add one conftest's ``pytest_storagescale_options`` answer: each option as a
    flag and an ini key, as the plugin's own; the same entry again (a conftest seen
    twice) is fine."""
    for name, entry in dict(answer or {}).items():
        flag = f"--{str(name).replace('_', '-')}"
        if not (SUITE_OPTION.fullmatch(str(name)) and isinstance(entry, tuple)
                and len(entry) == 4 and entry[0] == flag
                and (entry[1] is None or callable(entry[1]))) or name in OPTIONS:
            raise StorageScaleUsageError(
                f"pytest_storagescale_options: {name!r}: {entry!r} is not a suite option. "
                f"Give {{'storage_<suite>_<what>': ('--storage-<suite>-<what>', parser or "
                f"None, default, 'help')}}, a name the plugin's options do not use.")
        if name in declared:
            continue
        declared[name] = entry
        group.addoption(flag, dest=name, default=None, help=entry[3])
        parser.addini(name, help=entry[3], default=None)


def resolve_suite_options(config: pytest.Config) -> dict[str, Setting]:
    """The suite options declared, each resolved as the plugin's own (option >
    environment > ini > default, with where from)."""
    resolved = {name: resolve_setting(config, name, entry)
                for name, entry in config.stash.get(suite_options_key, {}).items()}
    for setting in resolved.values():  # a URL's password is never printed
        if isinstance(setting.value, str) and "://" in setting.value:
            register_url(setting.value)
    return resolved


def take_stand_in(config: pytest.Config, run: StorageRun) -> None:
    """What a suite says stood in for its system (``pytest_storagescale_stand_in``)."""
    said = config.hook.pytest_storagescale_stand_in(config=config)
    if said:
        run.stand_in = str(said)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from . import hooks

    pluginmanager.add_hookspecs(hooks)


def pytest_plugin_registered(plugin: object, manager: pytest.PytestPluginManager) -> None:
    """Take the operations, metrics and drivers a conftest or plugin adds (this hook
    is historic: it is also called for those registered before this plugin)."""
    extensions.register(plugin, manager)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Under ``--pyargs``, the named packages' conftests load now, as a path argument's
    do (pytest would load them only at collection: a shipped suite's server and options
    would be lost). Only the list pytest reads for its initial conftests is extended.
    First, before a conftest can import the XRootD bindings: the client release the
    run's environment names (``STORAGESCALE_XROOTD_CLIENT``, docs/upgrade.md)."""
    use_client_release()
    namespace = early_config.known_args_namespace
    if not (getattr(namespace, "pyargs", False) and namespace.file_or_dir):
        return
    folders = pyargs_folders(namespace.file_or_dir)
    if folders:  # pytest's own fallback when no argument is a path: where it was started
        here = early_config.invocation_params.dir
        paths = [here / str(arg).split("::", 1)[0] for arg in namespace.file_or_dir]
        folders += [] if any(path.exists() for path in paths) else [here]
        namespace.file_or_dir = [*namespace.file_or_dir, *map(str, folders)]


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    config.pluginmanager.register(SecretRedaction(), "storagescale-redaction")
    # an xdist worker gets the controller's run id, endpoint and shared folder
    shared = getattr(config, "workerinput", {}).get(WORKER_INPUT_KEY)
    settings = Settings.from_config(config).check_choices(embedded_choices())
    settings = with_suite_embedded(settings, config)
    run = StorageRun(settings, role=role_of(config), shared=shared)
    run.suite_options = resolve_suite_options(config)
    config.stash[storage_run_key] = run
    take_stand_in(config, run)
    # inert until used: a session given no storage setting touches neither the
    # environment nor a client library until a test needing the storage is collected
    # (under xdist without a setting: the controller once a worker collected one,
    # pytest_xdist_node_collection_finished; a worker of a controller that used it
    # from the start, at once)
    if storage_asked(settings) or (run.is_worker and not run.deferred):
        use_storage(config)
    if run.role is Role.CONTROLLER:
        config.pluginmanager.register(WorkerUsageErrors(run), "storagescale-worker-usage")
    if run.owns_results:  # a worker's reports tell the controller a step is logged
        config.pluginmanager.register(StepCollector(run, config), "storagescale-step-collector")
        config.pluginmanager.register(TestOutcomes(run), OUTCOMES)  # the HTML's verdict
    # SIGTERM (timeout, a CI runner's cancel) ends the session as Ctrl-C does; the
    # xdist controller passes it on to its workers (those pytest_configure_node saw)
    nodes: list = []
    config.stash[xdist_nodes_key] = nodes
    config.stash[sigterm_key] = sigterm = TermAsInterrupt(lambda: xdist_worker_pids(nodes))
    sigterm.install()


def storage_asked(settings: Settings) -> bool:
    """A storage setting was given (option, environment, ini or a suite's conftest)."""
    return any(setting.source != "default" for setting in settings.values.values())


def use_storage(config: pytest.Config) -> None:
    """Once, before any XRootD request of this process: the XRootD client's settings
    (environment and library, :func:`.drivers.grid.configure_xrootd_client`), and the
    endpoint's settings checked (a malformed URL, an unknown driver: no request)."""
    if config.stash.get(storage_used_key, False):
        return
    config.stash[storage_used_key] = True
    configure_xrootd_client()
    run = config.stash[storage_run_key]
    if run.deferred:  # the controller starts the embedded server once told
        run.note_storage_collected()
    run.endpoint.check()
    check_compare_with(run)
    check_extras(config, run)
    check_embedded_cluster(run)


def check_embedded_cluster(run: StorageRun) -> None:
    """``--storage-cluster embedded-slurm:N``: what it needs checked before any load
    (SLURM and munge installed, root, an endpoint its namespace hosts reach), and its
    starter registered (cluster/ imports no server)."""
    cluster = run.settings.cluster
    if not cluster or not cluster.lower().startswith("embedded-"):
        return
    from .cluster.hosts import register_recipe
    from .servers import slurm_hosts

    embedded = run.endpoint.is_embedded
    # the dCache over several hosts: its door host is linked to the client hosts
    # (slurm_hosts.offer_door), its doors' address is not this machine's loopback
    on_hosts = (embedded and run.endpoint.embedded_kind == "dcache"
                and run.settings.embedded_hosts > 1)
    slurm_hosts.check_usable(cluster, embedded_endpoint=embedded,
                             endpoint_host=None if embedded else run.endpoint.url.host,
                             embedded_on_hosts=on_hosts)
    register_recipe(slurm_hosts.RECIPE, slurm_hosts.start_cluster)


def check_extras(config: pytest.Config, run: StorageRun) -> None:
    """What the session will need whose library is not installed: a usage error naming
    the extra that installs it (looked up, not imported: each imports it when used)."""
    for what, asked, module, extra, instead in (
            ("--storage-report", run.settings.report_path(), "matplotlib", "report",
             "run without --storage-report"),
            ("--alluredir", allure_dir(config), "matplotlib", "allure",
             "run without --alluredir"),
            ("--storage-cluster", run.settings.cluster, "distributed", "cluster",
             "run without --storage-cluster"),
            ("the embedded server (no --storage-endpoint given)", run.endpoint.is_embedded,
             "cryptography", "servers", "give --storage-endpoint URL of a running server"),
            ("the embedded dCache's token issuer (servers/oidc_issuer.py)",
             run.endpoint.is_embedded and run.endpoint.embedded_kind == "dcache",
             "jwt", "servers", "give --storage-endpoint URL of a running dCache")):
        if asked and importlib.util.find_spec(module) is None:
            raise StorageScaleUsageError(
                f"{what} needs {module}, which is not installed in this environment: "
                f"install it with {extra_hint(extra)}, or {instead}."
            )


def embedded_choices() -> dict[str, Callable[[], tuple[str, ...]]]:
    """The names the embedded server's settings take (:data:`.config.EMBEDDED_CHOICES`):
    the registered servers' kinds, logins and protocols. Given here, where the layers
    meet: config imports no server."""
    from .servers import family

    return dict(zip(EMBEDDED_CHOICES, (family.embedded_kinds, family.embedded_logins,
                                       family.embedded_protocols), strict=True))


def with_suite_embedded(settings: Settings, config: pytest.Config) -> Settings:
    """The embedded server the suite's conftest names, unless the user named one."""
    if settings.embedded is not None:
        return settings
    wanted = set(config.hook.pytest_storagescale_embedded(config=config))
    if len(wanted) > 1:
        raise pytest.UsageError(
            f"the suites given want different embedded servers ({', '.join(sorted(wanted))}"
            f"): run them separately, or choose one with --storage-embedded KIND."
        )
    if wanted:
        return settings.with_value("embedded", wanted.pop(), "the suite's conftest")
    return settings


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: hand every worker the same run (and embedded endpoint); a
    controller not using the storage (no setting given) hands the run only."""
    run: StorageRun = node.config.stash[storage_run_key]
    used = node.config.stash.get(storage_used_key, False)
    node.workerinput[WORKER_INPUT_KEY] = run.shared_info(deferred=not used)
    node.config.stash.get(xdist_nodes_key, []).append(node)  # SIGTERM goes on to it


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """xdist controller given no storage setting: once a worker collected a storage
    test, use the storage (start the embedded server) and hand the endpoint to the
    workers through the shared folder, before xdist schedules any test; the
    endpoint's header lines are said then."""
    config = node.config
    run: StorageRun = config.stash[storage_run_key]
    if config.stash.get(storage_used_key, False) or not run.storage_collected():
        return
    use_storage(config)
    run.hand_endpoint()
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in _header_lines(config, run):
            reporter.write_line(line)


#: after Ctrl-C or SIGTERM, how long the xdist controller waits for the steps its
#: workers are stopping (their clients' report, a probe before the clean-up: seconds)
STOP_GRACE = 8.0
#: a step begun on an xdist worker that died before it finished
LOST_WORKER = ("the xdist worker {worker} was lost mid-step (it crashed or was killed "
               "while running {test}): what it measured is lost; xdist replaced it")
#: a step begun and never recorded as finished, at the session's end
UNFINISHED_STEP = ("the step never finished: the process running it ({worker}) stopped "
                   "before recording it (it died, or an error outside the measurement)")
#: the same after Ctrl-C (an xdist worker stopped mid-step)
INTERRUPTED_STEP = ("interrupted (Ctrl-C) before the step finished; what the process "
                    "running it ({worker}) measured is lost")


#: how the collection error of a usage error an xdist worker met while collecting starts
WORKER_USAGE_ERROR = "storagescale usage error: "


class WorkerUsageErrors:
    """xdist controller: a usage error a worker met while collecting (a thresholds file
    refused) is said once, on stderr, with exit status 4, as without ``-n``; the
    collection error xdist shows points there instead of repeating it."""

    def __init__(self, run: StorageRun) -> None:
        self.run = run

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        text = str(report.longrepr or "")
        if not (report.failed and text.startswith(WORKER_USAGE_ERROR)):
            return
        paragraph = redact_text(text[len(WORKER_USAGE_ERROR):].strip())
        if paragraph not in self.run.collection_errors:
            self.run.collection_errors.append(paragraph)
        report.longrepr = "not collected: the storage settings were refused (ERROR on stderr)"

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.run.collection_errors:
            print(f"ERROR: {self.run.collection_errors[0]}", file=sys.stderr)
            session.exitstatus = pytest.ExitCode.USAGE_ERROR


class StepCollector:
    """When a test report (this process's, or on the xdist controller every worker's)
    says a step finished, takes the new steps of the shared step log into the table
    and the results file. The note leaves the report, so JUnit XML does not carry it.
    On the xdist controller (whose workers show no live progress) it prints one line
    per finished step (:class:`StepLines`), unless ``-q``."""

    def __init__(self, run: StorageRun, config: pytest.Config) -> None:
        self.run = run
        self.step_lines = StepLines(config)
        self.pusher = StepPusher(run.settings.pushgateway)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        new = []
        if any(name == STEP_PROPERTY for name, _ in report.user_properties):
            report.user_properties[:] = [
                (name, value) for name, value in report.user_properties
                if name != STEP_PROPERTY
            ]
            new = self.run.ledger.sync()
            self.pusher.step_ended(self.run.ledger)  # --storage-pushgateway, per step
        self.step_lines.report(report, new)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport) -> None:
        """xdist controller: a worker died running ``crashitem``; the step it had begun
        is an error naming it."""
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        if worker is not None:
            self.run.ledger.lose(worker, LOST_WORKER.format(worker=worker, test=crashitem))


class SecretRedaction:
    """No credential in a test's report: the exception (what the terminal, JUnit and
    Allure build their text from) is redacted before any report is made, then the
    report's failure text and captured output, before any other plugin reads them."""

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        if call.excinfo is not None:
            redact_exception(call.excinfo.value)
        outcome = yield
        redact_report(outcome.get_result())

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_make_collect_report(self, collector: pytest.Collector):
        outcome = yield  # a module that cannot be imported: its error, redacted
        redact_report(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test the storage's answer failed: one paragraph instead of a traceback; its
    skip folded with those of the same reason; a known issue that passed says so."""
    outcome = yield
    shorten_storage_failure(item, call, outcome.get_result())
    fold_storage_skip(item, outcome.get_result())
    note_fixed_known_issue(outcome.get_result())


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The endpoint and the settings given; when no setting was, after collection once
    a test of the storage is collected (:func:`pytest_report_collectionfinish`)."""
    run = config.stash.get(storage_run_key, None)
    if run is None or not config.stash.get(storage_used_key, False):
        return []
    config.stash[header_shown_key] = True
    return _header_lines(config, run)


def _header_lines(config: pytest.Config, run: StorageRun) -> list[str]:
    verbose = config.get_verbosity() > 0  # -v: the defaults and how clients run too
    secrets = getattr(endpoint_driver(run), "secret_options", ())
    lines = [f"storagescale: endpoint {run.endpoint.display}"]
    lines += [f"  {line}" for line in run.settings.header_lines(verbose=verbose,
                                                                 secret_options=secrets)]
    lines += [f"  {name}: {redact_url(str(setting.value))} (from {setting.source})"
              for name, setting in run.suite_options.items()
              if setting.value is not None and (verbose or setting.source != "default")]
    lines += [f"  {line}" for line in client_host_lines(run)] if verbose else []
    return lines + cluster_header_lines(run.settings.cluster)  # hosts and clock offsets


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``storage_clients`` from the matched thresholds file, then the load
    tests' door (``--storage-load-doors``: ids ``[c10-davs]``)."""
    parametrize_clients(metafunc)
    parametrize_load_doors(metafunc)
    parametrize_sides(metafunc)  # --storage-compare-with: the checks on both sides


#: the fixtures a load test's scan parametrizes: a closed loop's concurrencies, an
#: open loop's offered rates
SCAN_FIXTURES = ("storage_clients", "storage_arrival_rate")


def parametrize_clients(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``storage_clients`` (or an open-loop section's
    ``storage_arrival_rate``) from the matched thresholds file."""
    fixture = next((f for f in SCAN_FIXTURES if f in metafunc.fixturenames), None)
    if fixture is None:
        return
    section = marker_arg(metafunc.definition, "storagescale_op")
    if section is None:
        return
    run: StorageRun = metafunc.config.stash[storage_run_key]
    system = run.system_for(marker_arg(metafunc.definition, "storagescale_system"))
    try:
        use_storage(metafunc.config)  # the thresholds may ask the storage for its version
        thresholds = run.thresholds(system)
    except StorageScaleUsageError as exc:
        if run.is_worker:
            # an xdist worker cannot stop the session with a usage error; a collection
            # error shows the same one paragraph (no traceback) and aborts the run
            # (the controller says it once on stderr, exit status 4: WorkerUsageErrors)
            raise pytest.Collector.CollectError(f"{WORKER_USAGE_ERROR}{exc}") from None
        # raised from here it would become a collection error with a traceback; it is
        # raised as a usage error (exit code 4) once collection is done
        run.collection_errors.append(str(exc))
        metafunc.parametrize(fixture, [pytest.param(None, marks=pytest.mark.skip(
            reason=f"not collected: {exc}"))], indirect=True, ids=["error"])
        return
    plan = thresholds.section(section)
    reason = scan_mismatch(fixture, plan, section, str(thresholds.path))
    if plan is None or reason is not None:
        metafunc.parametrize(fixture, [pytest.param(
            None, marks=pytest.mark.skip(reason=reason or ""))], indirect=True, ids=["no-plan"])
        return
    if fixture == "storage_arrival_rate":
        metafunc.parametrize(fixture, list(plan.arrival_rates), indirect=True,
                             ids=[f"r{rate:g}hz" for rate in plan.arrival_rates])
        return
    clients = run.settings.clients or plan.clients
    metafunc.parametrize("storage_clients", list(clients), indirect=True,
                         ids=[f"c{c}" for c in clients])


def scan_mismatch(fixture: str, plan, section: str, path: str) -> str | None:
    """Why a test with ``fixture`` has no steps in ``plan``: no section, or a section
    of the other loop (None: it has)."""
    if plan is None:
        return (f"{path} has no [ops.{section}] section: this storage version is not "
                f"tested for {section}")
    if fixture == "storage_arrival_rate" and not plan.open_loop:
        return (f"[ops.{section}] of {path} scans clients (a closed loop); this test runs "
                f"an open-loop scan: give the section arrival_rate = [...]")
    if fixture == "storage_clients" and plan.open_loop:
        return (f"[ops.{section}] of {path} scans arrival rates (an open loop); this test "
                f"runs a closed-loop scan: use the storage_arrival_rate fixture")
    return None


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """After collection the thresholds are known: say which file and why."""
    run = config.stash.get(storage_run_key, None)
    if run is None or not config.stash.get(storage_used_key, False):
        return []
    header = [] if config.stash.get(header_shown_key, False) else _header_lines(config, run)
    endpoint = run.endpoint
    scale = f" at plan scale {run.settings.scale:g}" if run.settings.scale != 1 else ""
    lines = [
        f"storagescale: {system} {endpoint.version} ({endpoint.version_source}): thresholds "
        f"{thresholds.path} ({thresholds.reason}){scale}"
        for system, thresholds in run.resolved_thresholds().items()
    ]
    return header + lines + _baseline_warnings(run)


def _baseline_warnings(run: StorageRun) -> list[str]:
    """A baseline of another storage system, plan scale or thresholds file, said once,
    before any load (not again in the summary: the table's ``vs base`` shows it)."""
    try:
        baseline = run.baseline
    except StorageScaleUsageError:
        return []  # reported as a usage error after collection
    if baseline is None:
        return []
    warnings = {baseline.warning(system, str(thresholds.path), run.settings.scale)
                for system, thresholds in run.resolved_thresholds().items()}
    return [f"storagescale: {warning}" for warning in sorted(w for w in warnings if w)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Usage problems found while collecting, a baseline of the wrong shape, and an
    endpoint the tests cannot use stop the session before any load runs."""
    run = config.stash[storage_run_key]
    if run.collection_errors:
        raise StorageScaleUsageError(run.collection_errors[0])
    take_stand_in(config, run)  # a suite's conftest met only while collecting too
    _ = run.baseline  # read and checked now
    if any(PLUGIN_FIXTURES & set(getattr(item, "fixturenames", ())) for item in items):
        use_storage(config)  # a test of the storage was collected
    try:
        refuse_in_process_steps(run, items)
    except StorageScaleUsageError as exc:
        if not run.is_worker:
            raise
        # an xdist worker: as a collection error the controller says once on stderr,
        # exit status 4 (WorkerUsageErrors); none of its tests runs
        config.hook.pytest_collectreport(report=pytest.CollectReport(
            "", "failed", f"{WORKER_USAGE_ERROR}{exc}", []))
        items[:] = []
    if run.role is Role.SINGLE and not config.option.collectonly and any(
            STORAGE_FIXTURES & set(getattr(item, "fixturenames", ())) for item in items):
        run.check_endpoint()  # once, here (the xdist controller: at session start)
        side_b(run)  # --storage-compare-with: side B started and checked before any load


def refuse_in_process_steps(run: StorageRun, items: list[pytest.Item]) -> None:
    """With ``--storage-executor processes`` or ``--storage-cluster``, a load test whose
    section runs an operation that stays in pytest's process
    (:attr:`~.load.operations.Operation.in_process`) is a usage error before any load,
    naming the operation, instead of a step that measures nothing."""
    from .load.engine import refuse_out_of_process
    from .load.operations import get_operation, stays_in_process

    executor = "cluster" if run.settings.cluster else run.settings.executor
    if executor in ("threads", "auto"):
        return
    for item in items:
        if "storage_load" not in getattr(item, "fixturenames", ()):
            continue
        system = run.system_for(marker_arg(item, "storagescale_system"))
        for marker in item.iter_markers("storagescale_op"):
            try:
                plan = run.thresholds(system).section(marker.args[0]) if marker.args else None
                operation = get_operation(plan.operation) if plan is not None else None
            except StorageScaleUsageError:
                continue  # said where the thresholds are read
            if operation is not None and stays_in_process(operation):
                refuse_out_of_process(operation, executor, item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Before anything runs: the output paths (results, HTML report, benchmark JSON),
    and on the xdist controller a given endpoint, before it starts the workers
    (xdist's own session start comes last). A usage error, once, exit code 4."""
    run = session.config.stash.get(storage_run_key, None)
    if run is None or not run.owns_results:
        return
    run.check_outputs()
    check_history_outputs(run.settings)  # a newer schema, an unwritable file: exit 4
    if run.role is Role.CONTROLLER and run.settings.cluster:
        refuse_recipe_under_xdist(run.settings.cluster)  # each worker would start one
    if run.role is Role.CONTROLLER and run.settings.endpoint and (
            not session.config.option.collectonly):
        run.check_endpoint()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the reports and clean up before the summary (which reports both)."""
    run = session.config.stash.get(storage_run_key, None)
    if run is None:
        return
    try:
        if run.owns_results:
            # steps whose test report never arrived (a worker that crashed after the
            # step ended) are still in the session's shared step log; one begun and
            # never finished is an error naming its process (interrupted after Ctrl-C)
            run.ledger.sync()
            if session.exitstatus == pytest.ExitCode.INTERRUPTED:
                # an xdist worker stopping its step (SIGTERM passed on, or Ctrl-C)
                # logs it with what it measured within a few seconds
                run.ledger.settle(STOP_GRACE)
                run.ledger.lose(None, INTERRUPTED_STEP, Verdict.INTERRUPTED)
            else:
                run.ledger.lose(None, UNFINISHED_STEP)
        ledger = run.ledger
        report = run.settings.report_path()
        if run.owns_results:  # every test's outcome, for the report and the results
            summary = _finish_results(session, run)
            _junit_behaviour_gate(session.config)
        if run.owns_results and report is not None:
            run.report_page = write_report(report, ledger.run, ledger.steps, summary,
                                           session.config.stash.get(behaviour_gate_key, None))
        if run.owns_results and ledger.steps and ledger.run is not None:
            benchmark_json = run.settings.benchmark_json_path()
            if benchmark_json is not None:
                write_benchmark_json(benchmark_json, ledger.run, ledger.steps)
            allure_results = allure_dir(session.config)
            if allure_results is not None:  # the overview names the verdict and baseline
                write_session_files(allure_results, ledger.run, _run_verdict(
                    run, summary, session.config.stash.get(behaviour_gate_key, None)))
    finally:
        if session.exitstatus == pytest.ExitCode.INTERRUPTED:  # a frozen storage: no wait
            run.area.session_interrupted = True
        finish_paired(run)  # side B's run directory and server (--storage-compare-with)
        run.finish()  # clean-up errors and Ctrl-C are said in the summary, never raised
        if run.area.cleanup_interrupted:
            session.exitstatus = pytest.ExitCode.INTERRUPTED


def _junit_behaviour_gate(config: pytest.Config) -> None:
    """The behaviour gate into pytest's ``--junitxml`` file, written by then
    (:func:`~.compare.junit_behaviour_gate`); a file it cannot rewrite is said."""
    from _pytest.junitxml import xml_key

    from .compare import junit_behaviour_gate

    xml = config.stash.get(xml_key, None)
    path = getattr(xml, "logfile", None)
    note = junit_behaviour_gate(path, config.stash.get(behaviour_gate_key, None))
    if note:
        config.get_terminal_writer().line(note, yellow=True)


def _finish_results(session: pytest.Session, run: StorageRun) -> RunSummary:
    """The behaviour gate (a failed one makes the exit status 1), the run's summary,
    and the results file written when a test ran, load steps or not: a run of checks
    alone is the baseline of the next (a run stopped before any test writes none)."""
    ledger = run.ledger
    outcomes: TestOutcomes = session.config.pluginmanager.getplugin(OUTCOMES)
    gate = behaviour_gate(run, outcomes, ledger.steps, getattr(session, "items", ()))
    if gate is not None:
        session.config.stash[behaviour_gate_key] = gate
        if not gate.passed and session.exitstatus == pytest.ExitCode.OK:
            # every test passed or is a known issue: the run fails all the same
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    summary = outcomes.summary(session.exitstatus)
    info = ledger.run or (stepless_run_info(run) if summary.tests else None)
    if info is not None:
        ledger.results.finish(info, ledger.steps, summary.verdict,
                              [dataclasses.asdict(test) for test in summary.tests],
                              gate=gate.to_json() if gate is not None else None)
        session.config.stash[history_lines_key] = keep_run(  # the controller only
            run.settings, ledger.results.document(info, ledger.steps))
    return summary


def _run_verdict(run: StorageRun, summary: RunSummary,
                 gate: BehaviourGate | None) -> dict[str, str]:
    """The run's verdict, its baseline and behaviour gate, for Allure's overview."""
    found = {"run.verdict": f"{summary.verdict} ({summary.counts_text})"}
    baselines = run.settings.baseline_paths()
    if baselines:
        found["run.baseline"] = ", ".join(map(str, baselines))
    if gate is not None:
        found["run.behaviour_gate"] = gate.headline()
    return found


def behaviour_gate(run: StorageRun, outcomes: TestOutcomes,
                   steps: list, items: list | tuple = ()) -> BehaviourGate | None:
    """The run's behaviour against its baselines (None without ``--storage-baseline``):
    its checks' outcomes and its load steps' error kinds and throttling, judged by the
    site's acceptance file (:mod:`.reporting.behaviour`). A baseline that cannot be
    read now (it was at collection) fails the gate, saying so. With
    ``--storage-compare-with`` a release, also the checks' outcomes on side B against
    side A's (:func:`.paired.behaviour_gate`; ``items``: the session's)."""
    from .paired import behaviour_gate as paired_gate
    from .paired import twins

    tests = {test.nodeid: test.outcome for test in outcomes.tests.values()
             if test.kind != "load"}
    causes = {test.nodeid: test.cause for test in outcomes.tests.values()}
    paired = (paired_gate(run, tests, causes, twins(list(items)), steps)
              if run.settings.compare_with else None)
    paths = run.settings.baseline_paths()
    if not paths:
        return paired
    try:
        stored = session_gate(paths, run.settings.accept, tests, causes, steps)
    except StorageScaleUsageError as exc:
        from .reporting.behaviour import Change

        stored = BehaviourGate(", ".join(map(str, paths)), (Change(
            str(paths[0]), "readable", "unreadable", fails=True, cause=str(exc)),))
    if paired is None:
        return stored
    return dataclasses.replace(stored, baseline=f"{stored.baseline}; {paired.baseline}",
                               changes=stored.changes + paired.changes,
                               accept_file=stored.accept_file or paired.accept_file)


def stepless_run_info(run: StorageRun) -> RunInfo:
    """The run's facts in the results file when no load step ran (checks only): what
    is known without asking the storage again (its version once a thresholds file was
    chosen for it, else the one given)."""
    settings, endpoint = run.settings, run.endpoint
    chosen = next(iter(run.resolved_thresholds().items()), None)
    system = chosen[0] if chosen else (settings.system or "")
    version = endpoint.version if chosen else (settings.version or "")
    return RunInfo(
        endpoint=endpoint.display, endpoint_id=endpoint.display,
        embedded=endpoint.is_embedded, system=system, version=version,
        version_source=endpoint.version_source if version else "",
        thresholds_file=str(chosen[1].path) if chosen else "",
        thresholds_reason=chosen[1].reason if chosen else "", run_id=run.run_id,
        started=run.started, executor=settings.executor, driver=settings.driver,
        client=ClientInfo(host=socket.gethostname(), user=getpass.getuser(),
                          versions=client_versions(), argv=redact_argv(sys.argv[1:])),
        scale=settings.scale)


def _write_behaviour_gate(terminalreporter, config: pytest.Config) -> None:
    """The run's behaviour against its baseline, failed or not (``gate: ...``)."""
    gate = config.stash.get(behaviour_gate_key, None)
    if gate is not None:
        terminalreporter.section("storagescale gate", red=not gate.passed,
                                 green=gate.passed)
        for line in gate.lines():
            terminalreporter.write_line(line)


def _write_session_notes(terminalreporter, run) -> None:
    """What went wrong around the tests: a run directory left behind, the embedded
    server dead mid-run, stale run directories and orphaned embedded servers of
    earlier sessions."""
    if run.stand_in:  # where the verdict is read, whatever -q hides
        terminalreporter.write_line(f"storagescale: NOT the system the suite is named "
                                    f"after: {run.stand_in}", red=True, bold=True)
    if run.cleanup_error:
        terminalreporter.write_line(
            f"storagescale: could not remove this run's directory {run.run_id}: "
            f"{run.cleanup_error}", yellow=True,
        )
    if run.endpoint.exit_note:
        terminalreporter.write_line(f"storagescale: {run.endpoint.exit_note}", red=True)
    if run.area.stale_note:
        terminalreporter.write_line(run.area.stale_note, yellow=True)
    for orphan in STOPPED_ORPHANS:
        terminalreporter.write_line(
            f"storagescale: stopped an embedded server left by a dead run: "
            f"{orphan.describe()}", yellow=True)
    STOPPED_ORPHANS.clear()  # said once (pytester runs many sessions in one process)


def run_label(info) -> str:
    """``dcache 11.2.5``; a stand-in's: ``dcache suite against apache-2.4.71 (not dcache)``."""
    if info.stand_in:
        return f"{info.system} suite against {info.version} (not {info.system})"
    return f"{info.system} {info.version}"


def _write_history(terminalreporter, config: pytest.Config) -> None:
    """What became of the run in ``--storage-history`` and ``--storage-pushgateway``."""
    for line in config.stash.get(history_lines_key, []):
        terminalreporter.write_line(line)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    run = config.stash.get(storage_run_key, None)
    if run is None:
        return
    _write_session_notes(terminalreporter, run)
    _write_behaviour_gate(terminalreporter, config)
    _write_history(terminalreporter, config)
    info = run.ledger.run
    if not run.ledger.steps or info is None:  # functional checks only: their results
        if run.ledger.results.path is not None:  # and report still exist
            terminalreporter.write_line(f"results: {run.ledger.results.path}")
        if run.report_page is not None:
            terminalreporter.write_line(f"report: {run.report_page}")
        return
    terminalreporter.section("storagescale")
    terminalreporter.write_line(
        f"storagescale: {run_label(info)} at {info.endpoint}"
        f" (version {info.version_source or 'given'})"
    )
    scale = f"; plan scale {info.scale:g}" if info.scale != 1 else ""
    terminalreporter.write_line(
        f"              thresholds: {info.thresholds_file} ({info.thresholds_reason}){scale}"
    )
    _write_paired(terminalreporter, info)
    for line in format_table(run.ledger.steps, info.door):
        terminalreporter.write_line(line)
    for line in cluster_breakdown_lines(run.ledger.steps, config.option.verbose):
        terminalreporter.write_line(line)  # a cluster step's hosts (-v), lost hosts
    for line in unmeasured_lines(run.ledger.steps):  # a check that could not run
        terminalreporter.write_line(line, yellow=True)
    failures = format_failures(run.ledger.steps, info.door)
    if failures:
        terminalreporter.write_line("why:")
        for line in failures:
            terminalreporter.write_line(f"  {line}")
    if run.ledger.results.path is not None:
        terminalreporter.write_line(f"results: {run.ledger.results.path}")
    if run.report_page is not None:
        terminalreporter.write_line(f"report: {run.report_page}")


def _write_paired(terminalreporter, info: RunInfo) -> None:
    """Under the header of a paired run (``--storage-compare-with``): whose figures
    the rows are."""
    if info.compare_with:
        terminalreporter.write_line(
            f"              paired: each row is side B, {info.compare_with}; vs base is "
            f"B / side A (the endpoint above), measured in alternating runs (A B B A)")


def pytest_unconfigure(config: pytest.Config) -> None:
    sigterm = config.stash.get(sigterm_key, None)
    if sigterm is not None:
        sigterm.restore()
    run = config.stash.get(storage_run_key, None)
    if run is not None:
        finish_paired(run)
        run.finish()
    cluster_disconnect()  # a recipe's batch jobs or local workers stop with the session
