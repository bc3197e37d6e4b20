"""Per-session state: the endpoint, its version, the thresholds, the results.

One :class:`StorageRun` lives in ``config.stash`` for the whole session. It starts
nothing until a test needs it: the embedded server starts on the first load step,
the version is detected when a suite is collected.
"""

from __future__ import annotations

import getpass
import platform
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from .config import Settings
from .drivers.base import Driver
from .drivers.registry import driver_class, driver_name_for
from .endpoints.url import EndpointURL
from .errors import EndpointError, StorageError, ThresholdsError
from .load.engine import StepPlan, run_step
from .load.stats import StepResult
from .reporting.results import ResultsFile
from .thresholds import ThresholdSet, evaluate, select_thresholds

DEFAULT_SYSTEM = "xrootd"


def make_run_id() -> str:
    return f"storagescale-run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def _package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def client_versions() -> dict[str, str]:
    names = ("pytest-storagescale", "pytest", "xrootd", "hdrhistogram", "pytest-xdist")
    versions = {name: v for name in names if (v := _package_version(name))}
    versions["python"] = platform.python_version()
    return versions


@dataclass
class StepOutcome:
    """A finished step as the test sees it."""

    result: StepResult | None
    record: dict[str, Any]
    thresholds: ThresholdSet

    @property
    def verdict(self) -> str:
        return self.record["verdict"]


class StorageRun:
    """Everything one pytest session knows about the storage under test."""

    def __init__(self, settings: Settings, *, run_id: str | None = None) -> None:
        self.settings = settings
        self.run_id = run_id or make_run_id()
        self.started = time.time()
        self._embedded = None
        self._endpoint: EndpointURL | None = None
        self._version: str | None = None
        self._thresholds: dict[str, ThresholdSet] = {}
        self._run_dir_ready = False
        self._step_counter = 0
        self.steps: list[dict[str, Any]] = []
        self.collection_errors: list[str] = []
        self.cleanup_error: str | None = None
        self.results = ResultsFile(settings.results_path(), {})

    # -- the endpoint ----------------------------------------------------------
    @property
    def is_embedded(self) -> bool:
        return self.settings.endpoint is None

    @property
    def endpoint(self) -> EndpointURL:
        """The endpoint; the embedded server is started on first use."""
        if self._endpoint is None:
            if self.is_embedded:
                from .endpoints.embedded import EmbeddedXRootD

                self._embedded = EmbeddedXRootD().start()
                self._endpoint = EndpointURL.parse(self._embedded.url)
            else:
                self._endpoint = EndpointURL.parse(self.settings.endpoint)
        return self._endpoint

    @property
    def endpoint_display(self) -> str:
        if self._endpoint is not None:
            return self._endpoint.display
        if self.is_embedded:
            return "embedded xrootd (root://127.0.0.1:<free port>//storagescale)"
        return EndpointURL.parse(self.settings.endpoint).display

    @property
    def embedded_server(self):
        """The :class:`EmbeddedXRootD` when this session runs one (else None)."""
        return self._embedded

    @property
    def driver_name(self) -> str:
        scheme = "root" if self.is_embedded else EndpointURL.parse(self.settings.endpoint).scheme
        return driver_name_for(scheme, self.settings.driver)

    @property
    def run_dir(self) -> str:
        """This run's own directory under the test area; created on first use."""
        path = f"{self.endpoint.path.rstrip('/')}/{self.run_id}"
        if not self._run_dir_ready:
            driver = self.driver("ssadmin", writable_root=path)
            try:
                driver.mkdir(path)
            except StorageError as exc:
                raise EndpointError(self._unusable(exc)) from None
            finally:
                driver.close()
            self._run_dir_ready = True
        return path

    def _unusable(self, exc: StorageError) -> str:
        return (
            f"--storage-endpoint {self.endpoint.display}: cannot use the storage: {exc}. "
            f"Check the host, port and path, that the test area exists and is writable by "
            f"this identity (credentials, proxy, token)."
        )

    def driver(self, client_id: str = "sstest", *, timeout: float = 60.0,
               writable_root: str | None = None) -> Driver:
        """A new client of the endpoint that may write only inside this run's directory."""
        cls = driver_class(self.driver_name)
        root = writable_root if writable_root is not None else self.run_dir
        return cls(self.endpoint, client_id=client_id, timeout=timeout, writable_root=root)

    # -- version and thresholds --------------------------------------------------
    @property
    def version(self) -> str:
        if self._version is None:
            self._version = self.settings.version or self._detect_version()
        return self._version

    @property
    def version_source(self) -> str:
        if self.settings.version:
            return f"from {self.settings.source('version')}"
        return "detected from the xrootd binary" if self.is_embedded else "detected"

    def _detect_version(self) -> str:
        if self.is_embedded:
            from .endpoints.embedded import xrootd_version

            return xrootd_version()
        driver = driver_class(self.driver_name)(
            self.endpoint, client_id="ssversn", timeout=15, writable_root=None
        )
        try:
            return driver.version()
        except StorageError as exc:
            raise EndpointError(
                f"{self._unusable(exc)} (The version is detected to choose the thresholds "
                f"file; --storage-version VERSION skips the detection.)"
            ) from None
        finally:
            driver.close()

    def system_for(self, marker_system: str | None) -> str:
        return self.settings.system or marker_system or DEFAULT_SYSTEM

    def thresholds(self, system: str) -> ThresholdSet:
        if system not in self._thresholds:
            self._thresholds[system] = select_thresholds(
                self.settings.thresholds_path(), system, self.version
            )
        return self._thresholds[system]

    # -- steps -------------------------------------------------------------------
    def _run_info(self, system: str, thresholds: ThresholdSet) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint.display,
            "embedded": self.is_embedded,
            "system": system,
            "version": self.version,
            "thresholds_file": str(thresholds.path),
            "thresholds_reason": thresholds.reason,
            "run_id": self.run_id,
            "started": self.started,
            "executor": self.settings.executor,
            "driver": self.driver_name,
            "client": {
                "host": socket.gethostname(), "user": getpass.getuser(),
                "versions": client_versions(), "argv": sys.argv[1:],
            },
        }

    def next_tag(self) -> str:
        self._step_counter += 1
        return _base36(self._step_counter).rjust(3, "0")

    def run_load_step(self, *, test: str, system: str, op: str, clients: int,
                      overrides: dict[str, Any] | None = None) -> StepOutcome:
        """Run ``op`` at ``clients`` with the plan of the matched thresholds file,
        record it in the results and judge it against the file's rules."""
        thresholds = self.thresholds(system)
        op_plan = thresholds.op(op)
        if op_plan is None:
            raise ThresholdsError(
                f"{thresholds.path}: no [ops.{op}] section; the suite asked for a {op} step. "
                f"Add [ops.{op}] with clients = [...] to the file."
            )
        overrides = dict(overrides or {})
        settings = self.settings
        duration = overrides.pop("duration", None) or settings.duration or op_plan.duration
        hang_timeout = (
            overrides.pop("hang_timeout", None) or settings.hang_timeout or op_plan.hang_timeout
        )
        warmup = overrides.pop("warmup", op_plan.warmup)
        tag = self.next_tag()
        plan = StepPlan(
            op=op, clients=clients, duration=duration, warmup=warmup,
            hang_timeout=hang_timeout, endpoint_url=self.endpoint.url,
            driver=self.driver_name, workdir=f"{self.run_dir}/{op}-c{clients}-{tag}",
            writable_root=self.run_dir, params={**op_plan.params, **overrides}, tag=tag,
        )
        if not self.results.run:
            self.results.run = self._run_info(system, thresholds)
        record: dict[str, Any] = {
            "test": test, "op": op, "clients": clients, "system": system,
            "duration_s": duration, "warmup_s": warmup, "hang_timeout_s": hang_timeout,
            "params": plan.params, "executor": settings.executor,
            "thresholds_file": str(thresholds.path), "started": time.time(),
        }
        result = None
        try:
            result = run_step(plan, executor=settings.executor)
        except StorageError as exc:
            record.update(
                ended=time.time(), verdict="error", violations=[], error=str(exc),
                succeeded=0, failed=0, hung=0, rate_hz=0.0, mb_s=0.0, bytes=0,
                latency_s={}, errors={exc.error_class: 1}, checks=[],
            )
        else:
            total = result.total
            verdict = evaluate(op_plan.rules_for(clients), result.metric)
            record.update(
                started=result.started, ended=result.ended, **total.to_json(),
                verdict=verdict.verdict, violations=verdict.violations,
                checks=[
                    {"rule": r.text, "metric": r.metric, "comparison": r.comparison,
                     "limit": r.limit, "observed": observed, "passed": ok}
                    for r, observed, ok in verdict.checks
                ],
                cleanup_error=result.cleanup_error,
            )
            record["clients"] = clients
            if len(result.sides) > 1:
                record["sides"] = {name: side.to_json() for name, side in result.sides.items()}
        self.steps.append(record)
        self.results.add(record)
        return StepOutcome(result, record, thresholds)

    # -- the end -----------------------------------------------------------------
    def finish(self) -> None:
        """Remove this run's directory and stop the embedded server (idempotent).

        A directory the storage refused to remove is kept in ``cleanup_error`` for
        the terminal summary."""
        try:
            if self._run_dir_ready:
                from .load.engine import cleanup_tree

                driver = self.driver("ssclean", timeout=30)
                try:
                    self.cleanup_error = cleanup_tree(driver, self.run_dir)
                finally:
                    driver.close()
                self._run_dir_ready = False
        finally:
            if self._embedded is not None:
                self._embedded.stop()
                self._embedded = None


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, rest = divmod(number, 36)
        text = digits[rest] + text
        if not number:
            return text
