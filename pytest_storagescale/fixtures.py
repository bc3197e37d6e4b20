"""Fixtures a suite uses: the endpoint, the thresholds, and the load-step runner."""

from __future__ import annotations

from typing import Any

import pytest

from .drivers.base import Driver
from .load.stats import StepResult
from .reporting.table import format_violations
from .session import StepOutcome, StorageRun
from .stash import storage_run_key

#: the ``user_properties`` key that carries a finished step in a test report
STEP_PROPERTY = "storagescale_step"


def _run(request: pytest.FixtureRequest) -> StorageRun:
    return request.config.stash[storage_run_key]


def marker_arg(node: Any, name: str) -> str | None:
    marker = node.get_closest_marker(name)
    return marker.args[0] if marker and marker.args else None


class StorageEndpoint:
    """A handle on the storage under test: its URL, version and this run's directory.

    ``driver()`` returns a new client that may write only inside :attr:`run_dir`.
    """

    def __init__(self, run: StorageRun) -> None:
        self._run = run

    @property
    def url(self) -> str:
        return self._run.endpoint.url

    @property
    def display(self) -> str:
        return self._run.endpoint.display

    @property
    def version(self) -> str:
        return self._run.version

    @property
    def run_dir(self) -> str:
        return self._run.run_dir

    @property
    def embedded(self):
        """The embedded server (``freeze()``, ``thaw()``, ``pid``), or None for a remote one."""
        return self._run.embedded_server

    def driver(self, client_id: str = "sstest", *, timeout: float = 60.0) -> Driver:
        return self._run.driver(client_id, timeout=timeout)

    def path(self, *parts: str) -> str:
        """A path inside this run's directory."""
        return "/".join([self.run_dir, *parts])


@pytest.fixture(scope="session")
def storage_endpoint(request: pytest.FixtureRequest) -> StorageEndpoint:
    """The storage under test: ``--storage-endpoint``, or the embedded XRootD server."""
    return StorageEndpoint(_run(request))


@pytest.fixture
def storage_system(request: pytest.FixtureRequest) -> str:
    """The storage system whose thresholds apply to this test."""
    return _run(request).system_for(marker_arg(request.node, "storagescale_system"))


@pytest.fixture
def storage_thresholds(request: pytest.FixtureRequest, storage_system: str):
    """The thresholds file matched for this test's system and the storage version."""
    return _run(request).thresholds(storage_system)


@pytest.fixture
def storage_clients(request: pytest.FixtureRequest) -> int:
    """This step's concurrency, parametrized from the thresholds file's scan list."""
    param = getattr(request, "param", None)
    if param is None:
        raise pytest.UsageError(
            "storage_clients is parametrized only for tests marked "
            "@pytest.mark.storagescale_op('<op>')."
        )
    return param


class StorageLoad:
    """Runs load steps for one test; a step that breaks a rule fails the test."""

    def __init__(self, request: pytest.FixtureRequest, system: str) -> None:
        self._request = request
        self._run = _run(request)
        self._system = system
        self.outcomes: list[StepOutcome] = []

    def run(self, op: str | None = None, clients: int | None = None, *,
            check: bool = True, **overrides: Any) -> StepResult:
        """Run ``op`` (default: the test's ``storagescale_op`` marker) at ``clients``
        (default: the test's parametrized concurrency); return what it measured.

        ``overrides`` replace the thresholds file's values for this step
        (``duration=``, ``hang_timeout=``, ``warmup=``, per-op parameters such as
        ``file_size=``). With ``check=False`` the rules are recorded but not enforced.
        """
        node = self._request.node
        op = op or marker_arg(node, "storagescale_op")
        if op is None:
            raise pytest.UsageError(
                f"{node.nodeid}: storage_load.run() needs an op, or mark the test "
                f"@pytest.mark.storagescale_op('<op>')."
            )
        if clients is None:
            clients = node.callspec.params.get("storage_clients") if hasattr(
                node, "callspec") else None
            if clients is None:
                raise pytest.UsageError(f"{node.nodeid}: storage_load.run() needs clients=N.")
        outcome = self._run.run_load_step(
            test=node.nodeid, system=self._system, op=op, clients=clients, overrides=overrides,
        )
        self.outcomes.append(outcome)
        record = outcome.record
        # the report carries the step to whoever writes the table and the results:
        # this process, or the xdist controller (see plugin.pytest_runtest_logreport)
        node.user_properties.append(
            (STEP_PROPERTY, {"run": outcome.run_info, "step": record})
        )
        if record["verdict"] == "error":
            pytest.fail(
                f"{op} step at {clients} clients could not run: {record['error']}",
                pytrace=False,
            )
        if check and record["verdict"] == "fail":
            ts = outcome.thresholds
            lines = [
                f"{op} step at {clients} clients broke its thresholds "
                f"({ts.path}, {ts.reason or 'given file'}):",
                *format_violations(record["checks"], str(ts.path)),
            ]
            pytest.fail("\n".join(lines), pytrace=False)
        return outcome.result


@pytest.fixture
def storage_load(request: pytest.FixtureRequest, storage_system: str) -> StorageLoad:
    """Runs load steps (``storage_load.run()``) and judges them against the thresholds."""
    return StorageLoad(request, storage_system)
