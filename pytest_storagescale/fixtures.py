"""Fixtures a suite uses, small ones built from smaller ones so that a site's conftest
can replace any of them:

- ``storage_settings``: the session's resolved options (option > env > ini > default);
  ``storage_suite_options``: a suite's own (``pytest_storagescale_options``), resolved
  the same way;
- ``storage_endpoint``: the storage under test (URL, version, run directory, clients);
- ``storage_embedded_server``: the embedded server (None for a remote storage);
- ``storage_doors``: every door of the storage (one client spec per protocol);
- ``storage_system`` / ``storage_thresholds``: which thresholds file applies;
- ``storage_known_issues``: the files whose ``[known_issues]`` apply to a check;
- ``storage_clients``: the step's concurrency, parametrized from the file's scan;
  ``storage_arrival_rate``: an open-loop section's offered rate (requests/s), instead;
- ``storage_load``: runs load steps and judges them, over the door
  ``storage_load_door`` names (parametrized by ``--storage-load-doors``); built from
  ``storage_endpoint``, ``storage_thresholds`` and ``storage_cluster`` (the Dask
  scheduler its clients run on: ``--storage-cluster``), so a conftest overriding any
  of them changes the steps' plan;
- ``storage_client`` / ``storage_test_dir``: a client of the endpoint and a fresh
  directory for one functional test (removed after it).

A hook that gets only the ``config`` reads the session through :func:`storage_view`
(a frozen :class:`SessionView`), never the session object itself.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pytest

from . import scenarios
from .drivers.base import CreatedPaths, Driver
from .drivers.spec import DriverSpec
from .errors import (
    HungClientsViolation,
    StepError,
    StorageError,
    StorageScaleUsageError,
    StorageScaleWarning,
    ThresholdViolation,
)
from .load.engine import remove_created
from .load.plan import StepContext
from .paired import SIDE_B_ID, checks_on_both_sides, side_run
from .records import StepRecord, Verdict
from .reporting.allure_report import allure_dir, attach_step
from .reporting.plots import scan_of
from .reporting.progress import LiveProgress
from .reporting.table import format_violations, format_why
from .session import Door, StorageRun
from .session.doors import DOOR_TIMEOUT, build_doors, door_names
from .session.endpoint import main_door_name
from .shipped import shipped_thresholds
from .stash import storage_run_key
from .steps import Derive, Judge, StepOutcome, StepRequest, run_load_step
from .thresholds import SectionPlan, ThresholdSet, select_thresholds

#: the ``user_properties`` key by which a test report says a step finished
STEP_PROPERTY = "storagescale_step"
#: the test's property (JUnit XML) giving each compared step's gate (gate.py)
GATE_PROPERTY = "storagescale_gate"
#: deadline of a functional test's requests when no hang timeout is set
CLIENT_TIMEOUT = 60.0
#: StorageLoad's cluster when none is given: ``--storage-cluster``'s
FROM_SETTINGS: Any = object()


def _run(request: pytest.FixtureRequest) -> StorageRun:
    return request.config.stash[storage_run_key]


def storage_run(config: pytest.Config) -> StorageRun | None:
    """The session's storage state, for the plugin's own code and the project's tests
    (not public: a suite reads :func:`storage_view` or the fixtures); None before the
    plugin set it up (or when it is not active)."""
    return config.stash.get(storage_run_key, None)


@dataclass(frozen=True)
class SessionView:
    """What a suite's hook that gets only the ``config`` may read of the session
    (:func:`storage_view`): a read-only copy taken when asked, not the session."""

    #: the resolved options (``--storage-*`` > environment > ini > default)
    settings: Any
    #: a suite's own options (``pytest_storagescale_options``), resolved the same way:
    #: name (``storage_ceph_xcache``) -> value
    suite_options: Mapping[str, Any]
    #: no ``--storage-endpoint``: the plugin runs an embedded server
    is_embedded: bool
    #: the embedded server's kind (``xrootd``, ``ceph``...; meaningful when embedded)
    embedded_kind: str
    #: the embedded server this process runs (None: remote, not started, or a worker)
    embedded_server: Any
    _door_names: Callable[[], tuple[str, ...]] = field(repr=False, compare=False)
    _thresholds: Callable[[str], ThresholdSet] = field(repr=False, compare=False)

    @property
    def door_names(self) -> tuple[str, ...]:
        """The doors' names, known before any server starts (``root``, ``davs``...;
        to parametrize a check by door at collection)."""
        return self._door_names()

    def thresholds(self, system: str) -> ThresholdSet:
        """The thresholds file matched for ``system`` and the storage version."""
        return self._thresholds(system)


def suite_option_values(run: StorageRun) -> Mapping[str, Any]:
    """A suite's own options: name -> value (read-only)."""
    return MappingProxyType({name: setting.value
                             for name, setting in run.suite_options.items()})


def storage_view(config: pytest.Config) -> SessionView | None:
    """The session as a hook that gets only the ``config`` may read it
    (:class:`SessionView`); None before the plugin set it up, or when it is not
    active. A test uses the fixtures instead."""
    run = config.stash.get(storage_run_key, None)
    if run is None:
        return None
    endpoint = run.endpoint
    return SessionView(settings=run.settings, suite_options=suite_option_values(run),
                       is_embedded=endpoint.is_embedded,
                       embedded_kind=endpoint.embedded_kind,
                       embedded_server=endpoint.embedded_server,
                       _door_names=lambda: tuple(door_names(run)),
                       _thresholds=run.thresholds)


def marker_arg(node: Any, name: str) -> str | None:
    marker = node.get_closest_marker(name)
    return marker.args[0] if marker and marker.args else None


class StorageEndpoint:
    """A handle on the storage under test: its URL, version and this run's directory.

    ``client(name)`` opens a new client that may write only inside :attr:`run_dir`,
    which exists when the handle is made."""

    def __init__(self, run: StorageRun, run_dir: str) -> None:
        self._run = run
        self.run_dir = run_dir
        #: what this process's clients made (every ``mkdir``, ``put``...): the only
        #: entries a test's folder's removal removes
        self.created = CreatedPaths(run_dir)

    @classmethod
    def like(cls, endpoint: StorageEndpoint) -> StorageEndpoint:
        """A handle of this class on ``endpoint``'s storage and run directory: a
        conftest's ``storage_endpoint`` that changes one property of the plugin's."""
        return cls(endpoint._run, endpoint.run_dir)

    @property
    def url(self) -> str:
        return self._run.endpoint.url.url

    @property
    def display(self) -> str:
        return self._run.endpoint.display

    @property
    def run_id(self) -> str:
        """This run's id (its directory's name under the test area)."""
        return self._run.run_id

    @property
    def version(self) -> str:
        return self._run.endpoint.version

    @property
    def driver_name(self) -> str:
        """The registry name of the driver in use (``xrootd``, ``gfal2``, ``local``...)."""
        return self._run.endpoint.driver_name

    @property
    def driver_spec(self):
        """The picklable :class:`DriverSpec` of this run's clients (for subprocesses)."""
        return self._run.endpoint.driver_spec(self.run_dir)

    @property
    def embedded(self):
        """The embedded server (``freeze()``, ``thaw()``, ``pid``), or None for a remote one."""
        return self._run.endpoint.embedded_server

    @property
    def is_embedded(self) -> bool:
        """No ``--storage-endpoint``: the storage is the plugin's embedded server (also
        in an xdist worker, where :attr:`embedded` is None: the controller runs it)."""
        return self._run.endpoint.is_embedded

    @property
    def embedded_kind(self) -> str | None:
        """The embedded server's kind (``xrootd``, ``ceph``...), None for a remote one."""
        return self._run.endpoint.embedded_kind if self.is_embedded else None

    def authorization_tokens(self) -> dict[str, str]:
        """The embedded server's tokens for the authorization checks (``readonly``,
        ``write``, ``expired``), minted once by its issuer (the controller's, under
        xdist); empty for a remote storage or a server with no issuer."""
        return self._run.endpoint.authorization_tokens()

    def client(self, name: str = "functional", *, timeout: float | None = None) -> Driver:
        """A new client (own connection and login) named ``name`` for the storage's
        logs; the driver turns the name into a login it accepts."""
        timeout = timeout or self._run.settings.hang_timeout or CLIENT_TIMEOUT
        client = self.driver_spec.connect(name, timeout=timeout)
        client.created = self.created
        return client

    driver = client  # the previous release's name

    def path(self, *parts: str) -> str:
        """A path inside this run's directory."""
        return "/".join([self.run_dir, *parts])

    @property
    def door(self) -> Door:
        """The endpoint's own door: the load steps' clients when no other door is
        named (its spec and run directory are this handle's)."""
        timeout = self._run.settings.hang_timeout or DOOR_TIMEOUT
        return Door(main_door_name(self._run.endpoint), self.driver_spec, self.run_dir,
                    timeout)


def _usable(run: StorageRun) -> None:
    """Fail the test in one paragraph when the run directory cannot be made."""
    try:
        run.area.ensure()
    except StorageScaleUsageError as exc:
        reason = str(exc)
    else:
        return
    pytest.fail(reason, pytrace=False)  # outside the except: no "during handling of"


#: the fixture that says which side of a paired comparison a check runs on
SIDE_FIXTURE = "storage_side"


@pytest.fixture(scope="session")
def storage_side(request: pytest.FixtureRequest) -> str:
    """``A``: the storage under test; ``B``: side B of a paired comparison
    (``--storage-compare-with`` a release: each check runs on both sides,
    :func:`parametrize_sides`)."""
    return "B" if getattr(request, "param", None) == "B" else "A"


def parametrize_sides(metafunc: pytest.Metafunc) -> None:
    """With ``--storage-compare-with`` a release of the embedded server, run every test
    of the storage that runs no load step (a check) on side A under its own id and on
    side B as ``[side-B...]`` (:mod:`.paired`: its outcomes against A's are the
    behaviour gate)."""
    names = metafunc.fixturenames
    if SIDE_FIXTURE not in names or "storage_load" in names:
        return
    run: StorageRun = metafunc.config.stash[storage_run_key]
    if not checks_on_both_sides(run.settings):
        return
    hidden = getattr(pytest, "HIDDEN_PARAM", None)  # pytest 8.4+: A keeps its own id
    metafunc.parametrize(SIDE_FIXTURE, [None, "B"], indirect=True, scope="session",
                         ids=[hidden if hidden is not None else "side-A", SIDE_B_ID])


def _side(request: pytest.FixtureRequest, side: str):
    """The run as the check's side sees it (:func:`.paired.side_run`)."""
    return side_run(_run(request), side)


@pytest.fixture(scope="session")
def storage_endpoint(request: pytest.FixtureRequest, storage_side: str) -> StorageEndpoint:
    """The storage under test: ``--storage-endpoint``, or the embedded XRootD server
    (side B's second embedded server for a check's side B variant).

    Its run directory exists when a test gets it; an endpoint that cannot be used
    (refused, read-only, wrong credentials) fails the test with one paragraph."""
    run = _side(request, storage_side)
    _usable(run)
    return StorageEndpoint(run, run.area.path)


@pytest.fixture(autouse=True)
def _storagescale_checks_share_the_endpoint(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test of the storage that runs no load (a functional or conformance check)
    holds the endpoint shared with the other checks: no load test of the session
    runs its steps meanwhile, and a check waits for the one that does (a load test
    takes it alone at its first step, :meth:`StorageLoad._hold_endpoint`). Not named
    ``storage_*``: autouse, it must not count as a test using the storage."""
    names = set(request.fixturenames)
    run = request.config.stash.get(storage_run_key, None)
    if run is None or "storage_endpoint" not in names or "storage_load" in names:
        yield
        return
    with run.ledger.shared():
        yield


@pytest.fixture(scope="session")
def storage_settings(request: pytest.FixtureRequest):
    """The session's resolved options (``--storage-*`` > environment > ini > default)."""
    return _run(request).settings


@pytest.fixture
def storage_cluster(storage_settings) -> str | None:
    """The Dask scheduler the load steps' clients run on (``--storage-cluster``; None:
    this host). A suite's conftest may override it, e.g. with its embedded server's
    own hosts for one test."""
    return storage_settings.cluster


@pytest.fixture(scope="session")
def storage_suite_options(request: pytest.FixtureRequest) -> Mapping[str, Any]:
    """A suite's own options (declared with ``pytest_storagescale_options``), resolved
    as the plugin's: name (``storage_ceph_xcache``) -> value (None: not given)."""
    return suite_option_values(_run(request))


@pytest.fixture(scope="session")
def storage_embedded_server(request: pytest.FixtureRequest, storage_side: str):
    """The embedded server (``kind``, ``freeze()``, ``thaw()``, ``pid``, its doors'
    URLs), or None when the storage under test is a remote one."""
    endpoint = _side(request, storage_side).endpoint
    return endpoint.embedded_server if endpoint.is_embedded else None


@pytest.fixture(scope="session")
def storage_doors(storage_endpoint: StorageEndpoint, storage_side: str,
                  request: pytest.FixtureRequest) -> dict[str, Door]:
    """Door name -> :class:`Door`: every door of the storage, each guarded to this
    run's directory (which exists: ``storage_endpoint`` made it)."""
    return build_doors(_side(request, storage_side))  # the run directory exists


@pytest.fixture
def storage_client(storage_endpoint: StorageEndpoint, request: pytest.FixtureRequest):
    """A client of the endpoint for one test, closed after it."""
    client = storage_endpoint.client(f"functional-{request.node.name}")
    yield client
    client.close()


@pytest.fixture
def storage_test_dir(storage_endpoint: StorageEndpoint, storage_client: Driver,
                     request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh directory for this test inside the run directory, removed after it:
    what the endpoint's clients made in it (a file only as written, not older than the
    run), bottom-up; anything else is left, named in a warning."""
    name = re.sub(r"[^\w.-]+", "-", request.node.name).strip("-")
    folder = storage_endpoint.path("functional", name)
    if storage_client.created is None:  # a site's own storage_client
        storage_client.created = storage_endpoint.created
    storage_client.mkdir(folder)
    yield folder
    remove_folder(storage_client, folder)


def remove_folder(client: Driver, folder: str, *, who: str = "clean-up") -> None:
    """Remove what ``client``'s recorder saw made in ``folder`` (:func:`remove_created`);
    what is left, or a refusal, is a warning naming it: the test's verdict stands, and
    the run directory's removal names what is still there at the end."""
    if client.created is None:  # records nothing it makes: nothing is proved the test's
        warnings.warn(StorageScaleWarning(f"{who}: {folder} not removed: its client "
                                          f"records nothing it makes"), stacklevel=2)
        return
    try:
        left = remove_created(client, client.created.below(folder), client.run_started())
    except StorageError as exc:
        left = f"{folder} not removed: {exc}"
    if left:
        warnings.warn(StorageScaleWarning(f"{who}: {left}"), stacklevel=2)


@pytest.fixture
def storage_system(request: pytest.FixtureRequest) -> str:
    """The storage system whose thresholds apply to this test."""
    return _run(request).system_for(marker_arg(request.node, "storagescale_system"))


@pytest.fixture
def storage_thresholds(request: pytest.FixtureRequest, storage_system: str,
                       storage_side: str):
    """The thresholds file matched for this test's system and the storage version
    (side B's version for a check's side B variant)."""
    return _side(request, storage_side).thresholds(storage_system)


@pytest.fixture
def storage_known_issues(request: pytest.FixtureRequest, storage_thresholds: ThresholdSet,
                         storage_system: str, storage_side: str) -> list[ThresholdSet]:
    """The thresholds files whose ``[known_issues]`` apply to this test: the system's
    (``storage_thresholds``) and, when the session runs an embedded server of another
    kind (the dCache suite on the embedded xrootd), that server's own
    (``<thresholds>/<kind>/``, else the shipped ones): the issues belong to the software
    that answers."""
    run = _side(request, storage_side)
    kind = run.endpoint.embedded_kind if run.endpoint.is_embedded else None
    if not kind or kind == storage_system:
        return [storage_thresholds]
    for root in (run.settings.thresholds_path(), shipped_thresholds()):
        if root is not None and root.is_dir() and (root / kind).is_dir():
            return [storage_thresholds,
                    select_thresholds(root, kind, run.endpoint.version, steps=False)]
    return [storage_thresholds]


@pytest.fixture
def storage_clients(request: pytest.FixtureRequest) -> int:
    """This step's concurrency, parametrized from the thresholds file's scan list."""
    param = getattr(request, "param", None)
    if param is None:
        raise pytest.UsageError(
            "storage_clients is parametrized only for tests marked "
            "@pytest.mark.storagescale_op('<section>')."
        )
    return param


@pytest.fixture
def storage_arrival_rate(request: pytest.FixtureRequest) -> float:
    """This open-loop step's offered rate (requests/s), parametrized from the
    thresholds section's ``arrival_rate`` list."""
    param = getattr(request, "param", None)
    if param is None:
        raise pytest.UsageError(
            "storage_arrival_rate is parametrized only for tests marked "
            "@pytest.mark.storagescale_op('<section>') of an open-loop section "
            "(arrival_rate = [...]).")
    return param


#: the fixture a load test's door comes from (parametrized only with several doors)
DOOR_FIXTURE = "storage_load_door"


def parametrize_load_doors(metafunc: pytest.Metafunc) -> None:
    """Run every test that uses ``storage_load`` once per ``--storage-load-doors``
    door (ids ``[c10-davs]``); nothing changes while the load runs over the main door
    only. The door names are known without starting a server."""
    if DOOR_FIXTURE not in metafunc.fixturenames:
        return
    run: StorageRun = metafunc.config.stash[storage_run_key]
    doors = run.load_doors
    if doors == (run.main_door,):
        return
    metafunc.parametrize(DOOR_FIXTURE, list(doors), indirect=True, ids=list(doors))


@pytest.fixture
def storage_load_door(request: pytest.FixtureRequest) -> str | None:
    """The door this test's load steps use: a name of ``--storage-load-doors``, or
    None for the endpoint's own door (the default)."""
    return getattr(request, "param", None)


class StorageLoad:
    """Runs load steps for one test over one door (``door_name``; None: the
    endpoint's own, ``endpoint.door``), planned from ``thresholds``; a step that breaks
    a rule fails the test."""

    def __init__(self, request: pytest.FixtureRequest, system: str,
                 door_name: str | None = None, *, endpoint: StorageEndpoint | None = None,
                 thresholds: ThresholdSet | None = None,
                 cluster: Any = FROM_SETTINGS) -> None:
        self._request = request
        self._run = _run(request)
        self._system = system
        self.door_name = door_name
        self.endpoint = endpoint
        self.thresholds = thresholds if thresholds is not None else \
            self._run.thresholds(system)
        self.outcomes: list[StepOutcome] = []
        #: the Dask scheduler the steps' clients run on (None: this host; default:
        #: ``--storage-cluster``)
        self.cluster: str | None = (self._run.settings.cluster if cluster is FROM_SETTINGS
                                    else cluster)
        #: the endpoint held alone from the test's first step to its end
        self._holding = False

    @property
    def door(self) -> Door:
        """The door the steps' clients use (its driver spec, this run's directory on
        it); the run directory exists when it returns."""
        if self.door_name is None and self.endpoint is not None:
            return self.endpoint.door
        return self._run.door(self.door_name)

    @property
    def nodeid(self) -> str:
        return self._request.node.nodeid

    def section_name(self, section: str | None) -> str:
        """``section``, or the test's ``storagescale_op`` marker."""
        section = section or marker_arg(self._request.node, "storagescale_op")
        if section is None:
            raise pytest.UsageError(
                f"{self.nodeid}: storage_load needs a section, or mark the test "
                f"@pytest.mark.storagescale_op('<section>')."
            )
        return section

    def section_plan(self, section: str) -> SectionPlan:
        """The section; no section for this storage version skips the test (the
        thresholds file is the test plan)."""
        thresholds = self.thresholds
        plan = thresholds.section(section)
        if plan is None:
            pytest.skip(f"{thresholds.path} has no [ops.{section}] section: this storage "
                        f"version is not tested for {section}")
        return plan

    def rate_for(self, rate: float | None) -> float:
        """``rate``, or the test's parametrized ``storage_arrival_rate`` (0: none, a
        closed loop)."""
        node = self._request.node
        if rate is None and hasattr(node, "callspec"):
            rate = node.callspec.params.get("storage_arrival_rate")
        return float(rate or 0.0)

    def clients_for(self, clients: int | None) -> int:
        node = self._request.node
        if clients is None and hasattr(node, "callspec"):
            clients = node.callspec.params.get("storage_clients")
        if clients is None:
            raise pytest.UsageError(f"{self.nodeid}: storage_load needs clients=N.")
        return clients

    def run(self, section: str | None = None, clients: int | None = None, *,
            check: bool = True, label: str | None = None, judge: Judge = True,
            derive: Derive | None = None, side: str | None = None,
            arrival_rate: float | None = None,
            doors: Mapping[str, DriverSpec | Door] | None = None,
            context: Mapping[str, Any] | None = None, **overrides: Any) -> StepRecord:
        """Run ``section`` of the thresholds file (default: the test's
        ``storagescale_op`` marker) at ``clients`` (default: the test's parametrized
        concurrency); return the step's record.

        ``overrides`` replace the section's values for this step (``duration=``,
        ``hang_timeout=``, ``warmup=``, parameters such as ``file_size=``). With
        ``check=False`` a broken rule is recorded but does not fail the test.
        ``label`` names the step's role in a multi-step test; ``judge=False`` records
        it without rules (verdict ``info``), or ``judge`` decides from the record;
        ``derive`` adds metrics computed from it (and earlier steps) before the rules
        are checked; ``side`` runs one side of a composite section alone.
        ``arrival_rate`` (default: the test's parametrized ``storage_arrival_rate``):
        an open-loop step at that offered rate, its clients the section's
        ``max_in_flight``. ``doors`` (name -> :class:`DriverSpec` or :class:`Door`) and
        ``context`` (anything else by name) are the step context its operation's
        ``prepare`` gets (:class:`~pytest_storagescale.load.plan.StepContext`)."""
        section, rate = self.section_name(section), self.rate_for(arrival_rate)
        plan = self.section_plan(section)
        clients = (clients or plan.max_in_flight or 1) if rate else self.clients_for(clients)
        _usable(self._run)
        self._hold_endpoint()
        step = StepContext(
            doors={name: door.spec if isinstance(door, Door) else door
                   for name, door in (doors or {}).items()},
            extra=dict(context or {}))
        request = StepRequest(test=self.nodeid, system=self._system, section=section,
                              clients=clients, overrides=overrides, label=label, side=side,
                              door=self.door_name, arrival_rate=rate, step=step,
                              cluster=self.cluster)
        progress = LiveProgress(self._request.config)
        try:
            outcome = run_load_step(self._run, request, judge=judge, derive=derive,
                                    progress=progress if progress.enabled else None,
                                    thresholds=self.thresholds, door=self.door)
        finally:
            progress.clear()
        self.outcomes.append(outcome)
        self._report(outcome)
        if outcome.record.verdict is Verdict.INTERRUPTED:
            # the step is logged (the session's end puts it in the results and the
            # table); Ctrl-C goes on to end the session, as pytest does
            raise KeyboardInterrupt(f"{outcome.record.title}: {outcome.record.error}")
        self._raise_for(outcome, check)
        return outcome.record

    def _hold_endpoint(self) -> None:
        """From the test's first step to its end, the endpoint is this test's alone
        (:meth:`~.session.ledger.StepLedger.lock`): no other worker's step or check
        comes between a multi-step test's steps (a recovery test's overload and its
        probes) or beside them."""
        if self._holding:
            return
        hold = self._run.ledger.lock()
        hold.__enter__()
        self._holding = True

        def release() -> None:
            self._holding = False
            hold.__exit__(None, None, None)

        self._request.node.addfinalizer(release)

    def _report(self, outcome: StepOutcome) -> None:
        if allure_dir(self._request.config) is not None:
            logged = [step for _, step in self._run.ledger.logged()]
            scan = scan_of(logged, outcome.record)
            attach_step(outcome.record, outcome.run_info, scan,
                        door_parameter=self.door_name is not None)
            if self._run.baseline is not None:  # the baseline's step beside this one
                from .compare import attach_to_allure

                attach_to_allure(self._run.baseline, outcome.run_info, outcome.record, scan)
        # the report says a step finished; whoever owns the results (this process or
        # the xdist controller, see plugin.StepCollector) reads it from the step log
        self._request.node.user_properties.append((STEP_PROPERTY, outcome.record.step_id))
        if outcome.record.gate is not None:  # a JUnit <property> per step compared
            self._request.node.user_properties.append(
                (GATE_PROPERTY, f"{outcome.record.title}: {outcome.record.gate.short()}"))

    def _raise_for(self, outcome: StepOutcome, check: bool) -> None:
        record = outcome.record
        what = (f"{record.name} step at {record.arrival_rate:g}/s" if record.arrival_rate
                else f"{record.name} step at {record.clients} clients")
        if self.door_name is not None:
            what += f" over the {record.door} door"
        why = [f"  {line}" for line in format_why(record)]
        if record.verdict is Verdict.ERROR:
            raise StepError("\n".join([f"{what} gave no verdict: {record.error}",
                                       *why[1:]]))
        if check and record.verdict is Verdict.FAIL:
            thresholds = outcome.thresholds
            lines = [
                f"{what} broke its thresholds ({thresholds.path}, "
                f"{thresholds.reason or 'given file'}):",
                *format_violations(record.checks, str(thresholds.path)),
                *(["why:", *why] if why else []),
            ]
            hung = any(c.metric.rpartition(".")[2] == "hung" and c.passed is False
                       for c in record.checks)
            raise (HungClientsViolation if hung else ThresholdViolation)("\n".join(lines))

    # the multi-step tests (see :mod:`pytest_storagescale.scenarios`)
    def mixing(self, section: str | None = None, clients: int | None = None) -> StepRecord:
        """Seed 004's readers and writers alone, then mixed: see :func:`scenarios.mixing`."""
        return scenarios.mixing(self, section, clients)

    def repeat(self, section: str | None = None, clients: int | None = None) -> StepRecord:
        """Seed 001's repeated tries with an error bar: see :func:`scenarios.repeat`."""
        return scenarios.repeat(self, section, clients)

    def recovery(self, section: str | None = None) -> StepRecord:
        """Seed 000's recovery after an overload: see :func:`scenarios.recovery`."""
        return scenarios.recovery(self, section)


@pytest.fixture
def storage_load(request: pytest.FixtureRequest, storage_system: str,
                 storage_load_door: str | None, storage_endpoint: StorageEndpoint,
                 storage_thresholds: ThresholdSet, storage_cluster: str | None) -> StorageLoad:
    """Runs load steps (``storage_load.run()``) over this test's door and judges them
    against the thresholds: ``storage_thresholds``' sections plan the steps and its
    rules judge them; ``storage_endpoint``'s door carries them (unless
    ``--storage-load-doors`` names another); their clients run on
    ``storage_cluster``'s hosts when it names one."""
    return StorageLoad(request, storage_system, storage_load_door,
                       endpoint=storage_endpoint, thresholds=storage_thresholds,
                       cluster=storage_cluster)
