"""This run's own directory on the storage: the only place the plugin writes.

The test area (the endpoint's path) must exist; only the run directory is made in it,
exclusively (a path that already exists, a link included, is never adopted, so never
emptied), and marked at once with an owner file (host, pid, user, start). At the
first use the test area is read for run directories of killed runs (an owner file
whose process is gone, or older than :data:`STALE_AFTER`): they are named in the
summary, and removed with ``--storage-clean-stale``. At the end the run directory is
removed through a driver whose guard keeps every delete inside it and which never
deletes through a link, nor a file older than the owner file (on the storage's clock):
a server that follows a link to a file would delete its target with it."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from ..drivers.base import OWNER_FILE
from ..endpoints.url import HTTP_SCHEMES, XROOTD_SCHEMES
from ..errors import EndpointError, StorageError, StorageNotFound
from .endpoint import EndpointUnderTest

#: deadline of the set-up and clean-up requests when no hang timeout is set
SERVICE_TIMEOUT = 30.0
#: every run directory's name starts so
RUN_PREFIX = "storagescale-run-"
#: a run directory whose process cannot be checked (another host) is stale after this
STALE_AFTER = 3 * 24 * 3600.0
#: the largest owner file read
_OWNER_MAX_BYTES = 64 * 1024


def owner_record(run_id: str, pid: int, started: float) -> dict:
    """What the owner file says."""
    return {"plugin": "pytest-storagescale", "run_id": run_id, "host": socket.gethostname(),
            "pid": pid, "user": getpass.getuser(), "started": started}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def stale_reason(owner: dict, now: float) -> str | None:
    """Why the run that wrote ``owner`` is over (None: it may still run)."""
    try:
        pid, started, host = int(owner["pid"]), float(owner["started"]), str(owner["host"])
    except (KeyError, TypeError, ValueError):
        return None
    if host == socket.gethostname() and not pid_alive(pid):
        return f"pid {pid} on this host is gone"
    if now - started > STALE_AFTER:
        return f"started {(now - started) / 86400:.0f} days ago on {host}"
    return None


def create_command(endpoint) -> str:
    """The command that makes the test area, in the storage's own client."""
    url = endpoint.url
    if url.scheme in XROOTD_SCHEMES:
        return f"xrdfs {url.server} mkdir -p {url.path}"
    if url.scheme in HTTP_SCHEMES:
        return f"gfal-mkdir -p {url.display}"
    if url.scheme == "file":
        return f"mkdir -p {url.path}"
    return f"create {url.path} with the storage's own tools"


@dataclass(frozen=True)
class StaleRun:
    """A run directory left by a killed run."""

    path: str
    reason: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class RunArea:
    """``<endpoint path>/<run id>``. ``marker`` is a file in the session's shared folder
    that says some process (an xdist worker) made the directory; ``lock`` serialises
    the making across the session's processes. ``owner_pid`` is the session's main
    process (the xdist controller), whose death makes the directory stale."""

    def __init__(self, endpoint: EndpointUnderTest, run_id: str, marker: Path,
                 lock: Callable[[], AbstractContextManager], *, owner_pid: int | None = None,
                 started: float | None = None) -> None:
        self.endpoint = endpoint
        self._lock = lock
        self.run_id = run_id
        self.marker = marker
        self.owner_pid = owner_pid or os.getpid()
        self.started = started or time.time()
        self._ready = False
        self._unusable: str | None = None
        #: the summary line about stale run directories (None: none found)
        self.stale_note: str | None = None

    @property
    def path(self) -> str:
        return f"{self.endpoint.url.path.rstrip('/')}/{self.run_id}"

    @property
    def timeout(self) -> float:
        return self.endpoint.settings.hang_timeout or SERVICE_TIMEOUT

    @property
    def _note_file(self) -> Path:
        return self.marker.parent / "stale-run-dirs.txt"

    def ensure(self) -> str:
        """Make the directory once; raise :class:`EndpointError` (one paragraph, asked
        once and answered for every test) when the storage refuses."""
        if self._unusable is not None:
            raise EndpointError(self._unusable)
        if not self._ready:
            with self._lock():
                if not self.marker.exists():
                    self._create()
        self._ready = True
        return self.path

    def _create(self) -> None:
        driver = self.endpoint.driver_spec(self.path).connect("admin", timeout=self.timeout)
        try:
            self._require_test_area(driver)
            self._refuse_existing(driver)
            driver.mkdir(self.path, parents=False)  # exclusive: an existing path fails
            record = owner_record(self.run_id, self.owner_pid, self.started)
            driver.put(f"{self.path}/{OWNER_FILE}", json.dumps(record).encode())
            stale = self._find_stale(driver)
        except StorageError as exc:
            self._unusable = self.endpoint.unusable(exc)
            raise EndpointError(self._unusable) from None
        finally:
            driver.close()
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        (self.marker.parent / OWNER_FILE).write_text(json.dumps(record))
        self.marker.touch()
        removed_local = remove_stale_local_folders(self.marker.parent)
        note = self._stale_text(stale, removed_local)
        if note:
            self._note_file.write_text(note)

    def _require_test_area(self, driver) -> None:
        area = self.endpoint.url.path
        try:
            if driver.stat(area).is_dir:
                return
            what = "is not a directory"
        except StorageNotFound:
            what = "does not exist"
        self._unusable = (
            f"--storage-endpoint {self.endpoint.display}: the test area {area} {what}. The "
            f"plugin makes only its run directory inside an existing test area, never the "
            f"area or its parents (a typo would leave them behind). Create it first: "
            f"{create_command(self.endpoint)}"
        )
        raise EndpointError(self._unusable)

    def _refuse_existing(self, driver) -> None:
        try:
            driver.stat(self.path)
        except StorageNotFound:
            return
        self._unusable = (
            f"{self.endpoint.display}: this run's directory {self.path} already exists. The "
            f"plugin only uses (and deletes) a directory it made itself; remove it by hand or "
            f"rerun (each run picks a new name)."
        )
        raise EndpointError(self._unusable)

    # -- run directories of killed runs ------------------------------------------------
    def _find_stale(self, driver) -> list[StaleRun]:
        area = self.endpoint.url.path.rstrip("/")
        now = time.time()
        stale = []
        try:
            names = driver.ls(area)
        except StorageError:  # the run can go on; only the summary line is missing
            return []
        for name in names:
            if not name.startswith(RUN_PREFIX) or name == self.run_id:
                continue
            owner = read_owner(driver, f"{area}/{name}")
            reason = stale_reason(owner, now) if owner is not None else None
            if reason:
                stale.append(StaleRun(f"{area}/{name}", reason))
        return stale

    def _stale_text(self, stale: list[StaleRun], removed_local: int) -> str | None:
        local = (f" ({removed_local} local folder(s) of dead runs removed from "
                 f"{tempfile.gettempdir()})" if removed_local else "")
        if not stale:
            return f"storagescale: {local.strip(' ()')}" if removed_local else None
        area = self.endpoint.display
        listed = ", ".join(f"{run.name} ({run.reason})" for run in stale)
        if not self.endpoint.settings.clean_stale:
            return (f"storagescale: {len(stale)} stale run director"
                    f"{'y' if len(stale) == 1 else 'ies'} in {area} from killed runs: "
                    f"{listed}; remove them with --storage-clean-stale{local}")
        failed = [f"{run.name}: {error}" for run in stale
                  if (error := self._remove_stale(run)) is not None]
        text = (f"storagescale: removed {len(stale) - len(failed)} of {len(stale)} stale run "
                f"directories in {area} from killed runs: {listed}{local}")
        return text + (f"; not removed: {'; '.join(failed)}" if failed else "")

    def _remove_stale(self, run: StaleRun) -> str | None:
        return self._clean_tree(run.path)

    def _clean_tree(self, path: str) -> str | None:
        """Remove ``path`` through a client that may write only below it; the
        storage's refusal as text."""
        from ..load.engine import cleanup_tree

        try:
            driver = self.endpoint.driver_spec(path).connect("cleanup", timeout=self.timeout)
        except StorageError as exc:
            return str(exc)
        try:
            return cleanup_tree(driver, path)
        finally:
            driver.close()

    # -- the end -------------------------------------------------------------------
    @property
    def used(self) -> bool:
        return self._ready or self.marker.exists()

    def remove(self) -> str | None:
        """Remove the directory and what is in it; the storage's refusal as text."""
        if self._note_file.exists():
            self.stale_note = self._note_file.read_text()
        if not self.used:
            return None
        try:
            return self._clean_tree(self.path)
        finally:
            self._ready = False
            self.marker.unlink(missing_ok=True)


def read_owner(driver, run_dir: str) -> dict | None:
    """The owner file of ``run_dir`` (None: none, or not one of ours)."""
    try:
        data = driver.read(f"{run_dir}/{OWNER_FILE}", 0, _OWNER_MAX_BYTES)
        owner = json.loads(data)
    except (StorageError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def remove_stale_local_folders(own: Path) -> int:
    """Remove this user's ``storagescale-run-*`` folders in the temporary directory whose
    owner file names a process of this host that is gone; return how many."""
    removed = 0
    hostname = socket.gethostname()
    for folder in Path(tempfile.gettempdir()).glob(f"{RUN_PREFIX}*"):
        try:
            info = folder.lstat()
            if (folder == own or not stat.S_ISDIR(info.st_mode)
                    or info.st_uid != os.getuid()):
                continue
            owner = json.loads((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if (isinstance(owner, dict) and owner.get("host") == hostname
                and isinstance(owner.get("pid"), int) and not pid_alive(owner["pid"])):
            shutil.rmtree(folder, ignore_errors=True)  # never follows links
            removed += 1
    return removed
