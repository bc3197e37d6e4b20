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
import platform
import secrets
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from .baseline import Baseline
from .config import Settings
from .drivers.base import Driver
from .drivers.registry import driver_class, driver_name_for
from .endpoints.url import EndpointURL
from .errors import EndpointError, StorageError
from .load.stats import StepResult
from .reporting.results import ResultsFile
from .thresholds import ThresholdSet, select_thresholds

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
        self._unusable_reason: str | None = None
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
        if self._unusable_reason is not None:
            raise EndpointError(self._unusable_reason)  # asked once, answered for all
        if not self._run_dir_ready:
            driver = self.driver("ssadmin", writable_root=path)
            try:
                driver.mkdir(path)
            except StorageError as exc:
                self._unusable_reason = self._unusable(exc)
                raise EndpointError(self._unusable_reason) from None
            finally:
                driver.close()
            self._run_dir_ready = True
            # tells the controller that some worker made the directory
            self.shared_dir.mkdir(parents=True, exist_ok=True)
            (self.shared_dir / "run-dir-used").touch()
        return path

    def ensure_run_dir(self) -> str:
        """Make this run's directory now (raises EndpointError when it cannot be)."""
        return self.run_dir

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
        if self.is_embedded:
            return "detected from the xrootd binary"
        return f"detected from {EndpointURL.parse(self.settings.endpoint).server}"

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

    def resolved_thresholds(self) -> dict[str, ThresholdSet]:
        """The thresholds files chosen so far, by storage system."""
        return dict(self._thresholds)

    def thresholds(self, system: str) -> ThresholdSet:
        if system not in self._thresholds:
            self._thresholds[system] = select_thresholds(
                self.settings.thresholds_path(), system, self.version
            )
        return self._thresholds[system]

    # -- steps -------------------------------------------------------------------
    def run_info(self, system: str, thresholds: ThresholdSet) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint.display,
            # what identifies the endpoint across runs (the embedded one's port changes)
            "endpoint_id": (f"embedded xrootd ({self.endpoint.scheme})" if self.is_embedded
                            else self.endpoint.display),
            "embedded": self.is_embedded,
            "system": system,
            "version": self.version,
            "version_source": self.version_source,
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

    def connection_tag(self) -> str:
        """The login-name prefix of this step's clients. Client i of every step logs
        in as the same name, so a step reuses the connections of the last one instead
        of piling up idle ones (the XRootD client keeps them for minutes, and a
        process holding thousands is measurably slower); after a step with hung
        clients the prefix changes, so no step inherits a stuck connection."""
        return "c" + _base36(self._connection_generation).rjust(2, "0")

    def step_finished(self, result: StepResult | None) -> None:
        """After a step that hung (or could not run), the next one logs in afresh."""
        if result is None or result.total.hung:
            self._connection_generation += 1

    def next_tag(self) -> str:
        self._step_counter += 1
        return _base36(self._step_counter).rjust(3, "0")

    def log_step(self, record: dict[str, Any]) -> None:
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
