"""One pytest session against one storage endpoint, in three small parts:

- :class:`~.endpoint.EndpointUnderTest`: the URL or embedded server, the driver that
  speaks it, the storage version;
- :class:`~.area.RunArea`: this run's own directory on the storage;
- :class:`~.ledger.StepLedger`: the load lock, the shared step log, the results file.

:class:`StorageRun` holds them with the settings, the thresholds chosen per storage
system and the baseline. It starts nothing until a test needs it.

Under pytest-xdist there are three roles (:class:`Role`): a plain session does
everything; the controller owns the embedded server, the run directory's removal and
the results; each worker uses the controller's endpoint and run id (``shared``) and
holds the endpoint alone from a load test's first step to its end (its functional
checks hold it shared), so that load tests never overlap in time nor with checks.
"""

from __future__ import annotations

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
from importlib import metadata
from pathlib import Path
from typing import Any

from ..baseline import Baseline
from ..config import Settings
from ..errors import StorageScaleUsageError
from ..records import ClientInfo, RunInfo
from ..redact import redact_argv
from ..reporting.results import ResultsFile
from ..reporting.results import _unwritable as unwritable
from ..roles import Role, role_of
from ..thresholds import ThresholdSet, select_thresholds
from .area import RunArea
from .doors import Door, load_door
from .endpoint import ENDPOINT_FILE, EndpointUnderTest, load_door_names, main_door_name
from .ledger import StepLedger, is_private_folder, private_folder

__all__ = ["Door", "Role", "StorageRun", "EndpointUnderTest", "RunArea", "StepLedger",
           "role_of"]

DEFAULT_SYSTEM = "xrootd"
#: the ``workerinput`` key that carries the controller's run to an xdist worker
WORKER_INPUT_KEY = "storagescale"
#: in the shared folder: a deferred worker collected a storage test
STORAGE_COLLECTED = "storage-collected"


#: the run id's random bits, as hex digits: 64 bits, so another user cannot make the
#: next run's folder before it (a blocked name stops a run: area.py)
RUN_ID_RANDOM_HEX = 16


def make_run_id() -> str:
    """``storagescale-run-YYYYmmdd-HHMMSS-<16 hex digits>`` (the local time, 64 random
    bits)."""
    return (f"storagescale-run-{time.strftime('%Y%m%d-%H%M%S')}-"
            f"{secrets.token_hex(RUN_ID_RANDOM_HEX // 2)}")


def unwritable_file(path: Path | None) -> str | None:
    """Why the file ``path`` cannot be written (None: it can, or no path)."""
    return None if path is None else unwritable(path)


def unwritable_folder(path: Path | None) -> str | None:
    """Why files cannot be written into the folder ``path`` (made if missing)."""
    if path is None:
        return None
    try:
        if path.exists() and not path.is_dir():
            return f"{path} is a file, not a folder"
    except OSError as exc:
        return f"cannot look at {exc.filename or path} ({exc.strerror or exc})"
    return unwritable(path / "index.html")


def client_versions() -> dict[str, str]:
    versions = {}
    for name in ("pytest-storagescale", "pytest", "xrootd", "hdrhistogram", "pytest-xdist"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    versions["python"] = platform.python_version()
    return versions


class StorageRun:
    """Everything one pytest session knows about the storage under test."""

    def __init__(self, settings: Settings, *, role: Role = Role.SINGLE,
                 shared: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self.role = role
        self.run_id = shared["run_id"] if shared else make_run_id()
        self.started = shared["started"] if shared else time.time()
        self.shared_dir = Path(shared["shared_dir"]) if shared else (
            Path(tempfile.gettempdir()) / self.run_id)
        self.endpoint = EndpointUnderTest(settings, shared)
        self.ledger = StepLedger(self.shared_dir, ResultsFile(settings.results_path()))
        self.area = RunArea(self.endpoint, self.run_id, self.shared_dir / "run-dir-used",
                            self.ledger.lock, owner_pid=(shared or {}).get("owner_pid"),
                            started=self.started)
        self._thresholds: dict[str, ThresholdSet] = {}
        self.collection_errors: list[str] = []
        self.cleanup_error: str | None = None
        self.report_page: Path | None = None
        #: set by a suite that ran against a stand-in for its system (RunInfo.stand_in)
        self.stand_in = ""
        #: a suite's own options (``pytest_storagescale_options``), resolved as the
        #: plugin's: name -> value and source
        self.suite_options: dict[str, Any] = {}

    @property
    def is_worker(self) -> bool:
        return self.role is Role.WORKER

    @property
    def owns_results(self) -> bool:
        return self.role is not Role.WORKER

    def shared_info(self, *, deferred: bool = False) -> dict[str, Any]:
        """What a worker needs from the controller (sent in ``workerinput``).
        ``deferred``: the controller does not use the storage yet (no storage setting):
        the endpoint follows through the shared folder if a worker collects a storage
        test (:meth:`note_storage_collected`, :meth:`hand_endpoint`); nothing is made or
        started now."""
        run = {"run_id": self.run_id, "started": self.started,
               "shared_dir": str(self.shared_dir), "owner_pid": self.area.owner_pid}
        if deferred:
            return {**run, "deferred": True}
        private_folder(self.shared_dir)
        return {**run, **self.endpoint.shared_info()}

    @property
    def deferred(self) -> bool:
        """An xdist worker whose controller hands the endpoint only once used."""
        return self.endpoint.deferred

    def note_storage_collected(self) -> None:
        """A deferred worker collected a storage test: tell the controller (a file in the
        shared folder, read when xdist says the worker's collection finished)."""
        private_folder(self.shared_dir)
        (self.shared_dir / STORAGE_COLLECTED).touch()

    def storage_collected(self) -> bool:
        """The controller: has a worker collected a storage test?"""
        return (self.shared_dir / STORAGE_COLLECTED).exists()

    def hand_endpoint(self) -> None:
        """The controller, storage used once a worker collected a storage test: the
        endpoint (the embedded server started now) for the workers, in the shared folder
        before xdist schedules any test (:meth:`EndpointUnderTest.from_controller`)."""
        info = json.dumps(self.endpoint.shared_info())
        partial = self.shared_dir / f"{ENDPOINT_FILE}.partial"
        partial.write_text(info)
        partial.replace(self.shared_dir / ENDPOINT_FILE)  # whole or absent

    def check_endpoint(self) -> None:
        """Before any test: the endpoint's first contact (login, the test area, the
        version) and this run's directory. What makes the storage unusable (a test area
        that does not exist, a server that speaks another protocol, a client library
        that crashed on its answer) is one usage error here, said once, instead of a
        failure repeated by every test that needs the storage."""
        self.endpoint.first_contact()
        self.area.ensure()
        for name in self.load_doors:  # --storage-load-doors: each door's area, now too
            self.door(name)

    def check_outputs(self) -> None:
        """Refuse, before any load, an output path that cannot be written: the results
        and pytest-benchmark files, the HTML report's folder (one paragraph each)."""
        self.ledger.results.check_writable()
        settings = self.settings
        for flag, path, reason, what, example in (
            ("--storage-benchmark-json", settings.benchmark_json_path(),
             unwritable_file(settings.benchmark_json_path()),
             "the pytest-benchmark JSON file", "a file, e.g. results/benchmark.json"),
            ("--storage-report", settings.report_path(),
             unwritable_folder(settings.report_path()),
             "the HTML report's folder", "a folder (made if missing), e.g. report"),
        ):
            if reason is not None:
                raise StorageScaleUsageError(
                    f"{flag} {path}: {what} cannot be written there: {reason}. Give {flag} "
                    f"{example}, in a place you can write."
                )

    @functools.cached_property
    def baseline(self) -> Baseline | None:
        """The earlier run(s) to compare with (``--storage-baseline``), or None."""
        paths = self.settings.baseline_paths()
        return Baseline(paths, main_door=self.main_door) if paths else None

    # -- doors -----------------------------------------------------------------------
    @property
    def main_door(self) -> str:
        """The endpoint's own door (``root``, ``davs``...): the load steps' default."""
        return main_door_name(self.endpoint)

    @functools.cached_property
    def load_doors(self) -> tuple[str, ...]:
        """The doors the load steps run over (``--storage-load-doors``), checked."""
        return load_door_names(self.endpoint)

    def door(self, name: str | None = None) -> Door:
        """The door ``name`` (default: the main one) guarded to this run's directory
        on it; the run directory exists when it returns."""
        return load_door(self, name)

    # -- thresholds ----------------------------------------------------------------
    def system_for(self, marker_system: str | None) -> str:
        return self.settings.system or marker_system or DEFAULT_SYSTEM

    def thresholds(self, system: str) -> ThresholdSet:
        """The thresholds file for ``system`` at the endpoint's version, at the plan scale."""
        if system not in self._thresholds:
            chosen = select_thresholds(self.settings.thresholds_path(), system,
                                       self.endpoint.version)
            self._thresholds[system] = chosen.scaled(self.settings.scale)
        return self._thresholds[system]

    def resolved_thresholds(self) -> dict[str, ThresholdSet]:
        """The thresholds files chosen so far, by storage system."""
        return dict(self._thresholds)

    def run_info(self, system: str, thresholds: ThresholdSet) -> RunInfo:
        endpoint = self.endpoint
        return RunInfo(
            endpoint=endpoint.display, endpoint_id=endpoint.identity,
            embedded=endpoint.is_embedded, system=system, version=endpoint.version,
            version_source=endpoint.version_source, thresholds_file=str(thresholds.path),
            thresholds_reason=thresholds.reason, run_id=self.run_id, started=self.started,
            executor=self.settings.executor, driver=endpoint.driver_name,
            client=ClientInfo(host=socket.gethostname(), user=getpass.getuser(),
                              versions=client_versions(),
                              argv=redact_argv(sys.argv[1:])),
            scale=self.settings.scale, driver_options=endpoint.option_names,
            door=self.main_door, stand_in=self.stand_in,
        )

    # -- the end -------------------------------------------------------------------
    def finish(self) -> None:
        """Remove this run's directory and stop the embedded server (idempotent); a
        directory the storage refused to remove is kept in ``cleanup_error``."""
        if self.is_worker:
            self.area.stop_heartbeat()
            return  # the controller removes the run directory once every worker is done
        try:
            self.cleanup_error = self.area.remove() or self.cleanup_error
        finally:
            self.endpoint.stop()
            if is_private_folder(self.shared_dir):  # never one someone else put there
                shutil.rmtree(self.shared_dir, ignore_errors=True)
