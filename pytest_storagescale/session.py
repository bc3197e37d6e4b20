"""Per-session state: the endpoint, its version, the thresholds, the results.

One :class:`StorageRun` lives in ``config.stash`` for the whole session. It starts
nothing until a test needs it: the embedded server starts on the first load step,
the version is detected when a suite is collected.
"""

from __future__ import annotations

import fcntl
import functools
import getpass
import json
import os
import platform
import secrets
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from .baseline import Baseline, rate_change, record_metric
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
    run_info: dict[str, Any]

    @property
    def verdict(self) -> str:
        return self.record["verdict"]


class StorageRun:
    """Everything one pytest session knows about the storage under test.

    Three roles: a plain session does everything; under pytest-xdist the controller
    owns the embedded server, the run directory's removal and the merged results,
    and each worker (``shared`` given) uses the controller's endpoint and run id and
    takes the load lock around every step, so that steps never overlap in time.
    """

    def __init__(self, settings: Settings, *, shared: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.shared = shared
        self.is_worker = shared is not None
        self.run_id = shared["run_id"] if shared else make_run_id()
        self.started = shared["started"] if shared else time.time()
        self.shared_dir = Path(shared["shared_dir"]) if shared else (
            Path(tempfile.gettempdir()) / self.run_id
        )
        self._embedded = None
        self._endpoint: EndpointURL | None = None
        self._version: str | None = None
        self._thresholds: dict[str, ThresholdSet] = {}
        self._run_dir_ready = False
        self._step_counter = 0
        self._connection_generation = 0
        self.steps: list[dict[str, Any]] = []
        self.collection_errors: list[str] = []
        self.cleanup_error: str | None = None
        self.report_page: Path | None = None
        self.results = ResultsFile(settings.results_path(), {})

    def shared_info(self) -> dict[str, Any]:
        """What a worker needs from the controller (sent in ``workerinput``)."""
        self.shared_dir.mkdir(parents=True, exist_ok=True)
        info = {"run_id": self.run_id, "started": self.started,
                "shared_dir": str(self.shared_dir), "endpoint_url": None, "ca_dir": None}
        if self.is_embedded:
            info["endpoint_url"] = self.endpoint.url  # starts the server, once
            info["ca_dir"] = self._embedded.ca_dir
        return info

    # -- the endpoint ----------------------------------------------------------
    @property
    def is_embedded(self) -> bool:
        return self.settings.endpoint is None

    @property
    def endpoint(self) -> EndpointURL:
        """The endpoint; the embedded server is started on first use."""
        if self._endpoint is None:
            if self.is_embedded and self.shared:
                self._endpoint = EndpointURL.parse(self.shared["endpoint_url"])
            elif self.is_embedded:
                from .endpoints.embedded import EmbeddedXRootD

                self._embedded = EmbeddedXRootD().start()
                scheme = self.settings.embedded_protocol
                self._endpoint = EndpointURL.parse(self._embedded.url_for(scheme))
            else:
                self._endpoint = EndpointURL.parse(self.settings.endpoint)
        return self._endpoint

    @property
    def driver_options(self) -> dict[str, Any]:
        if self.shared and self.shared.get("ca_dir"):
            return {"ca_dir": self.shared["ca_dir"]}
        if self._embedded is not None:
            return {"ca_dir": self._embedded.ca_dir}
        return {}

    @property
    def endpoint_display(self) -> str:
        if self._endpoint is not None:
            return self._endpoint.display
        if self.is_embedded:
            return (f"embedded xrootd ({self.settings.embedded_protocol}://127.0.0.1:"
                    f"<free port>//storagescale)")
        return EndpointURL.parse(self.settings.endpoint).display

    @property
    def embedded_server(self):
        """The :class:`EmbeddedXRootD` when this process runs one (else None)."""
        return self._embedded

    @property
    def driver_name(self) -> str:
        scheme = (self.settings.embedded_protocol if self.is_embedded
                  else EndpointURL.parse(self.settings.endpoint).scheme)
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
            # tells the controller that some worker made the directory
            self.shared_dir.mkdir(parents=True, exist_ok=True)
            (self.shared_dir / "run-dir-used").touch()
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
        return cls(self.endpoint, client_id=client_id, timeout=timeout, writable_root=root,
                   options=self.driver_options)

    @functools.cached_property
    def baseline(self) -> Baseline | None:
        """The earlier run to compare with (``--storage-baseline``), or None."""
        path = self.settings.baseline_path()
        return Baseline(path) if path is not None else None

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
            self.endpoint, client_id="ssversn", timeout=15, writable_root=None,
            options=self.driver_options,
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
            # what identifies the endpoint across runs (the embedded one's port changes)
            "endpoint_id": (f"embedded xrootd ({self.endpoint.scheme})" if self.is_embedded
                            else self.endpoint.display),
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

    def _connection_tag(self) -> str:
        """The login-name prefix of this step's clients. Client i of every step logs
        in as the same name, so a step reuses the connections of the last one instead
        of piling up idle ones (the XRootD client keeps them for minutes, and a
        process holding thousands is measurably slower); after a step with hung
        clients the prefix changes, so no step inherits a stuck connection."""
        return "c" + _base36(self._connection_generation).rjust(2, "0")

    def next_tag(self) -> str:
        self._step_counter += 1
        return _base36(self._step_counter).rjust(3, "0")

    def run_load_step(
        self, *, test: str, system: str, op: str, clients: int,
        overrides: dict[str, Any] | None = None, label: str | None = None,
        judge: bool | Callable[[StepResult], bool] = True,
        derive: Callable[[StepResult], dict[str, float]] | None = None,
        side: str | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> StepOutcome:
        """Run section ``op`` of the matched thresholds file at ``clients``, and judge
        it against the section's rules.

        ``label`` names the step's role in a multi-step test (``baseline``,
        ``overload``...); ``judge=False`` records a measurement without rules
        (verdict ``info``); ``derive`` adds metrics computed from the result and
        earlier steps (``mix_ratio``, ``recovery_s``) before the rules are checked;
        ``judge`` may decide from the result. ``side`` runs one side of a composite
        section alone (``readers`` of ``mixed``: its ``get`` with the section's
        parameters)."""
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
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        operation = op_plan.operation
        params = {**op_plan.params, **overrides}
        if side is not None:
            from .load.operations import OPERATIONS

            groups = {name: op for name, op, _ in OPERATIONS[operation].groups(clients)}
            if side not in groups:
                raise ThresholdsError(
                    f"{thresholds.path}: [ops.{op}] runs {operation}, which has no side "
                    f"{side!r}; sides: {', '.join(groups) or 'none'}."
                )
            operation = groups[side].name
            params = {k: v for k, v in params.items() if k in groups[side].param_names}
        plan = StepPlan(
            op=operation, clients=clients, duration=duration, warmup=warmup,
            hang_timeout=hang_timeout, endpoint_url=self.endpoint.url,
            driver=self.driver_name, workdir=f"{self.run_dir}/{op}-c{clients}-{worker}-{tag}",
            writable_root=self.run_dir, params=params, tag=self._connection_tag(),
            driver_options=self.driver_options, operations=op_plan.operations,
        )
        record: dict[str, Any] = {
            "step_id": f"{worker}-{tag}", "worker": worker, "label": label,
            "operation": operation, "operations_bound": op_plan.operations, "side": side,
            "test": test, "op": op, "clients": clients, "system": system,
            "duration_s": duration, "warmup_s": warmup, "hang_timeout_s": hang_timeout,
            "params": plan.params, "executor": settings.executor,
            "thresholds_file": str(thresholds.path), "started": time.time(),
        }
        result = None
        try:
            with self.load_lock():
                record["lock_acquired"] = time.time()
                result = run_step(plan, executor=settings.executor, progress=progress)
        except StorageError as exc:
            record.update(
                ended=time.time(), verdict="error", violations=[], error=str(exc),
                succeeded=0, failed=0, hung=0, rate_hz=0.0, mb_s=0.0, bytes=0,
                latency_s={}, errors={exc.error_class: 1}, checks=[],
            )
        else:
            if derive is not None:
                result.extra.update(derive(result))
            total = result.total
            if callable(judge):
                judge = judge(result)
            base = self.baseline.find(record) if self.baseline else None
            verdict = evaluate(
                op_plan.rules_for(clients) if judge else [], result.metric,
                baseline=(lambda name: record_metric(base, name)) if base else None,
            )
            record.update(
                started=result.started, ended=result.ended, **total.to_json(),
                verdict=verdict.verdict if judge else "info", violations=verdict.violations,
                derived=dict(result.extra),
                checks=[check.to_json() for check in verdict.checks],
                cleanup_error=result.cleanup_error,
            )
            if self.baseline is not None:
                record["baseline"] = {
                    "file": str(self.baseline.path), "version": self.baseline.version,
                    "matched": base is not None,
                    "rate_hz": record_metric(base, "rate_hz") if base else None,
                    "rate_change": rate_change(record, base),
                }
            record["clients"] = clients
            if len(result.sides) > 1:
                record["sides"] = {name: side.to_json() for name, side in result.sides.items()}
        run_info = self._run_info(system, thresholds)
        if result is None or result.total.hung:
            self._connection_generation += 1
        self._log_step({**record, "run_info": run_info})
        return StepOutcome(result, record, thresholds, run_info)

    def _log_step(self, record: dict[str, Any]) -> None:
        """Append the step to the session's shared log, which every worker can read
        (a scan's plot needs the steps other workers ran)."""
        with self.load_lock(), open(self.shared_dir / "steps.jsonl", "a") as log:
            log.write(json.dumps(record, default=str) + "\n")

    def logged_steps(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Every step of the session so far, from any worker: (run info, step)."""
        try:
            text = (self.shared_dir / "steps.jsonl").read_text()
        except FileNotFoundError:
            return []
        entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [(entry.pop("run_info"), entry) for entry in entries]

    @contextmanager
    def load_lock(self):
        """Hold the endpoint for one load step: one step at a time across all xdist
        workers of the session (an flock on a file in the session's shared folder)."""
        self.shared_dir.mkdir(parents=True, exist_ok=True)
        with open(self.shared_dir / "load.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def record_step(self, run_info: dict[str, Any], record: dict[str, Any]) -> None:
        """Add a finished step to the table and the results file (controller or
        single process); a step seen twice (call and teardown reports) counts once."""
        if any(step.get("step_id") == record.get("step_id") for step in self.steps):
            return
        if not self.results.run:
            self.results.run = run_info
        self.steps.append(record)
        self.steps.sort(key=lambda step: step.get("started", 0))
        self.results.steps = self.steps
        self.results.flush()

    # -- the end -----------------------------------------------------------------
    def finish(self) -> None:
        """Remove this run's directory and stop the embedded server (idempotent).

        A directory the storage refused to remove is kept in ``cleanup_error`` for
        the terminal summary."""
        if self.is_worker:
            return  # the controller removes the run directory once every worker is done
        try:
            if self._run_dir_ready or (self.shared_dir / "run-dir-used").exists():
                from .load.engine import cleanup_tree

                driver = self.driver("ssclean", timeout=30)
                try:
                    self.cleanup_error = cleanup_tree(driver, self.run_dir)
                finally:
                    driver.close()
                self._run_dir_ready = False
                (self.shared_dir / "run-dir-used").unlink(missing_ok=True)
        finally:
            if self._embedded is not None:
                self._embedded.stop()
                self._embedded = None
            shutil.rmtree(self.shared_dir, ignore_errors=True)


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, rest = divmod(number, 36)
        text = digits[rest] + text
        if not number:
            return text
