"""Fixtures a suite uses: the endpoint, the thresholds, and the load-step runner."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest

from .drivers.base import Driver
from .errors import StorageScaleUsageError
from .load.stats import StepResult
from .reporting.allure_report import allure_dir, attach_step
from .reporting.plots import scans
from .reporting.progress import LiveProgress
from .reporting.table import format_violations
from .session import StorageRun
from .stash import storage_run_key
from .steps import StepOutcome, run_load_step

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
    def driver_name(self) -> str:
        """The registry name of the driver in use (``xrootd``, ``gfal2``, ``local``)."""
        return self._run.driver_name

    @property
    def driver_options(self) -> dict:
        """Options the drivers get (``ca_dir`` of the embedded endpoint's CA)."""
        return dict(self._run.driver_options)

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
    """The storage under test: ``--storage-endpoint``, or the embedded XRootD server.

    Its run directory exists when a test gets it; an endpoint that cannot be used
    (refused, read-only, wrong credentials) fails the test with one paragraph."""
    run = _run(request)
    _usable(run)
    return StorageEndpoint(run)


def _usable(run: StorageRun) -> None:
    """Fail the test in one paragraph when the run directory cannot be made."""
    try:
        run.ensure_run_dir()
    except StorageScaleUsageError as exc:
        pytest.fail(str(exc), pytrace=False)


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

    def _op(self, op: str | None) -> str:
        node = self._request.node
        op = op or marker_arg(node, "storagescale_op")
        if op is None:
            raise pytest.UsageError(
                f"{node.nodeid}: storage_load needs an op, or mark the test "
                f"@pytest.mark.storagescale_op('<op>')."
            )
        return op

    def _skip_without_section(self, op: str) -> None:
        """The thresholds file is the test plan: no section, no test."""
        thresholds = self._run.thresholds(self._system)
        if thresholds.op(op) is None:
            pytest.skip(f"{thresholds.path} has no [ops.{op}] section: this storage version "
                        f"is not tested for {op}")

    def _clients(self, clients: int | None) -> int:
        node = self._request.node
        if clients is None and hasattr(node, "callspec"):
            clients = node.callspec.params.get("storage_clients")
        if clients is None:
            raise pytest.UsageError(f"{node.nodeid}: storage_load needs clients=N.")
        return clients

    def run(self, op: str | None = None, clients: int | None = None, *,
            check: bool = True, label: str | None = None, judge=True, derive=None,
            side: str | None = None, **overrides: Any) -> StepResult:
        """Run section ``op`` of the thresholds file (default: the test's
        ``storagescale_op`` marker) at ``clients`` (default: the test's parametrized
        concurrency); return what it measured.

        ``overrides`` replace the file's values for this step (``duration=``,
        ``hang_timeout=``, ``warmup=``, per-op parameters such as ``file_size=``).
        With ``check=False`` a broken rule is recorded but does not fail the test.
        ``label``, ``judge``, ``derive`` and ``side``: see
        :func:`pytest_storagescale.steps.run_load_step`.
        """
        node = self._request.node
        op, clients = self._op(op), self._clients(clients)
        self._skip_without_section(op)
        _usable(self._run)
        progress = LiveProgress(self._request.config)
        try:
            outcome = run_load_step(
                self._run, test=node.nodeid, system=self._system, op=op, clients=clients,
                overrides=overrides, label=label, judge=judge, derive=derive, side=side,
                progress=progress if progress.enabled else None,
            )
        finally:
            progress.clear()
        self.outcomes.append(outcome)
        record = outcome.record
        if allure_dir(self._request.config) is not None:
            scan = scans([step for _, step in self._run.logged_steps()]).get(op, [])
            attach_step(record, outcome.run_info, scan)
        # the report carries the step to whoever writes the table and the results:
        # this process, or the xdist controller (see plugin.StepCollector)
        node.user_properties.append(
            (STEP_PROPERTY, {"run": outcome.run_info, "step": record})
        )
        what = f"{op} step{f' ({label})' if label else ''} at {clients} clients"
        if record["verdict"] == "error":
            pytest.fail(f"{what} could not run: {record['error']}", pytrace=False)
        if check and record["verdict"] == "fail":
            ts = outcome.thresholds
            lines = [
                f"{what} broke its thresholds ({ts.path}, {ts.reason or 'given file'}):",
                *format_violations(record["checks"], str(ts.path)),
            ]
            pytest.fail("\n".join(lines), pytrace=False)
        return outcome.result

    def mixing(self, op: str | None = None, clients: int | None = None) -> StepResult:
        """Seed 004's mixing test: readers alone, writers alone, then both at once.

        The mixed step gets ``mix_ratio`` = (readers + writers MB/s when mixed) /
        (readers alone + writers alone MB/s); the section's rules judge it
        (e.g. ``mix_ratio >= 0.5``)."""
        op, clients = self._op(op), self._clients(clients)
        alone = {
            side: self.run(op, clients, side=side, label="alone", judge=False)
            for side in ("readers", "writers")
        }
        separate = sum(result.total.mb_s for result in alone.values())

        def derive(mixed: StepResult) -> dict[str, float]:
            together = sum(side.mb_s for side in mixed.sides.values())
            return {"mix_ratio": together / separate if separate else float("nan")}

        return self.run(op, clients, label="mixed", derive=derive)

    def repeat(self, op: str | None = None, clients: int | None = None) -> StepResult:
        """Run the step ``tries`` times (the section's key), as seed 001 ran ``dd`` ten
        times for an error bar. The last try gets ``mb_s_mean``, ``mb_s_stddev``,
        ``rate_hz_mean`` and ``rate_hz_stddev`` over all tries and is judged."""
        op, clients = self._op(op), self._clients(clients)
        self._skip_without_section(op)
        tries = self._run.thresholds(self._system).op(op).tries
        results: list[StepResult] = []

        def derive(last: StepResult) -> dict[str, float]:
            every = [*results, last]
            return {
                "mb_s_mean": statistics.fmean(r.total.mb_s for r in every),
                "mb_s_stddev": statistics.pstdev(r.total.mb_s for r in every),
                "rate_hz_mean": statistics.fmean(r.total.rate_hz for r in every),
                "rate_hz_stddev": statistics.pstdev(r.total.rate_hz for r in every),
            }

        for attempt in range(1, tries + 1):
            last = attempt == tries
            result = self.run(op, clients, label=f"try {attempt}/{tries}", judge=last,
                              derive=derive if last else None)
            results.append(result)
        return result

    def recovery(self, op: str | None = None) -> StepResult:
        """Seed 000's recovery question: after an overload, does the storage come
        back by itself?

        Runs a probe at the section's first concurrency (the rate before), an
        overload step at ``overload_clients`` for ``overload_duration``, then probes
        again until the rate is back to ``recover_fraction`` of the rate before or
        ``recover_within`` has passed. The last probe gets ``recovery_s`` (seconds
        from the overload's end to the probe's end; infinite when it never
        recovered) and is judged by the section's rules (e.g. ``recovery_s <= 300``).
        """
        op = self._op(op)
        self._skip_without_section(op)
        plan = self._run.thresholds(self._system).op(op)
        if not plan.recovery:
            raise pytest.UsageError(
                f"{self._request.node.nodeid}: [ops.{op}] has no recovery probe settings "
                f"(overload_clients, overload_duration, recover_fraction, recover_within)."
            )
        settings, probe_clients = plan.recovery, plan.clients[0]
        before = self.run(op, probe_clients, label="before", judge=False)
        self.run(op, settings["overload_clients"], label="overload", judge=False,
                 duration=settings["overload_duration"])
        overload_end = time.time()
        target = before.total.rate_hz * settings["recover_fraction"]

        def recovered(result: StepResult) -> bool:
            return result.total.rate_hz >= target and result.total.failed == 0

        def decide(result: StepResult) -> bool:
            return recovered(result) or result.ended - overload_end >= settings["recover_within"]

        def derive(result: StepResult) -> dict[str, float]:
            return {"recovery_s": (result.ended - overload_end) if recovered(result)
                    else float("inf")}

        probe = 0
        while True:  # bounded: every probe takes time, and recover_within ends it
            probe += 1
            result = self.run(op, probe_clients, label=f"probe {probe}", judge=decide,
                              derive=derive)
            if self.outcomes[-1].record["verdict"] != "info":
                return result


@pytest.fixture
def storage_load(request: pytest.FixtureRequest, storage_system: str) -> StorageLoad:
    """Runs load steps (``storage_load.run()``) and judges them against the thresholds."""
    return StorageLoad(request, storage_system)
