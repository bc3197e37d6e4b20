"""This run's own directory on the storage: the only place the plugin writes.

The test area (the endpoint's path) must exist; only the run directory is made in it,
exclusively (a path that already exists, a link included, is never adopted, so never
emptied), and marked at once with an owner record (:mod:`.owner`: host, pid, user,
start, a heartbeat renewed every few minutes, and an HMAC only this user can make).
A directory that cannot be marked is removed again at once (``rmdir``), or named.

At the first use the test area is read for run directories of killed runs: one whose
record proves it is this user's and whose run is over (its process gone on this
host, its heartbeat old on another) is named in the summary and removed with
``--storage-clean-stale``; one whose record proves nothing is someone else's, and one
without a record is unmarked: both are named and never touched.

Clean-up (a step's directory, this run's directory at the end, a stale one) removes
only what the run made (:func:`~pytest_storagescale.load.engine.remove_created`): the
directories it made, the files it wrote or its operations' generated names, with
the size written and not older than the run on the storage's clock, bottom-up,
directories with ``rmdir``; a directory is entered only after its owner record was
checked (a run directory swapped for a link is not this run's). Anything else is
left and named; a clean-up error or Ctrl-C is said in the summary, never raised."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from ..drivers.base import OWNER_FILE, CreatedPaths
from ..errors import EndpointError, StorageError, StorageNotFound
from . import owner as records
from .endpoint import EndpointUnderTest
from .owner import owner_record, pid_alive, signed, stale_reason, verified

__all__ = ["RunArea", "StaleRun", "owner_record",
           "pid_alive", "read_owner", "stale_reason"]

#: deadline of the set-up and clean-up requests when no hang timeout is set
SERVICE_TIMEOUT = 30.0
#: every run directory's name starts so
RUN_PREFIX = "storagescale-run-"
#: a run directory without an owner record is named (never removed) after this age
UNMARKED_AFTER = 24 * 3600.0
#: the largest owner file read
_OWNER_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class StaleRun:
    """A run directory of the test area that is not this run's: left by a killed run
    of this user (``owner``: its verified record, removable), or someone else's or
    unmarked (``owner`` None: named, never touched)."""

    path: str
    reason: str
    owner: dict | None = None

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def removable(self) -> bool:
        return self.owner is not None


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
        #: this run's owner record (signed), once the directory is made or first used
        self.record: dict | None = None
        self._heartbeat: threading.Event | None = None
        #: door name -> why it cannot be written through (None: checked, usable)
        self.door_checks: dict[str, str | None] = {}
        #: Ctrl-C ended the clean-up at the end (the summary says what is left)
        self.cleanup_interrupted = False
        #: the session was stopped (Ctrl-C, SIGTERM): the clean-up at the end first asks
        #: the storage for an answer within INTERRUPT_PROBE (a frozen one is left)
        self.session_interrupted = False

    @property
    def path(self) -> str:
        return f"{self.endpoint.url.path.rstrip('/')}/{self.run_id}"

    @property
    def owner_path(self) -> str:
        return f"{self.path}/{OWNER_FILE}"

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
            self._start_heartbeat()
        self._ready = True
        return self.path

    def _create(self) -> None:
        driver = self.endpoint.driver_spec(self.path).connect("admin", timeout=self.timeout)
        try:
            self._require_test_area(driver)
            self._refuse_existing(driver)
            driver.mkdir(self.path, parents=False)  # exclusive: an existing path fails
            self._mark(driver)
            stale = self._find_stale(driver)
        except StorageError as exc:
            self._unusable = self._unusable or self.endpoint.unusable(exc)
            raise EndpointError(self._unusable) from None
        finally:
            driver.close()
        from .ledger import private_folder

        private_folder(self.marker.parent)  # the session's shared folder
        (self.marker.parent / OWNER_FILE).write_text(json.dumps(self.record))
        self.marker.touch()
        removed_local = remove_stale_local_folders(self.marker.parent)
        note = self._stale_text(stale, removed_local)
        if note:
            self._note_file.write_text(note)

    def _mark(self, driver) -> None:
        """Write the owner record, then again with the time the storage gave the file
        (the run's start on the storage's clock). Refused: the directory is removed
        again at once (it is empty), or named in the paragraph."""
        record = owner_record(self.run_id, self.owner_pid, self.started)
        try:
            driver.put(self.owner_path, json.dumps(signed(record)).encode())
            record["storage_started"] = driver.stat(self.owner_path).modified
            driver.put(self.owner_path, json.dumps(signed(record)).encode())
        except StorageError as exc:
            try:
                driver.delete(self.owner_path)
            except StorageError:
                pass
            try:
                driver.rmdir(self.path)  # never more than rmdir: it may not be empty
                fate = "it was removed again (rmdir)"
            except StorageError as removal:
                fate = (f"it could not be removed again ({removal.message}): remove "
                        f"{self.path} by hand")
            self._unusable = (
                f"{self.endpoint.display}: this run's directory {self.path} was made but its "
                f"owner file was refused ({exc}); {fate}. The plugin writes nowhere it "
                f"cannot mark as its own: free space or grant write access in the test "
                f"area, and rerun.")
            raise EndpointError(self._unusable) from None
        self.record = signed(record)

    # -- the heartbeat -------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        """Renew the owner record's heartbeat every :data:`.owner.HEARTBEAT_EVERY`
        (a daemon thread of each process that uses the directory)."""
        if self._heartbeat is not None:
            return
        self._heartbeat = threading.Event()
        stop = self._heartbeat
        thread = threading.Thread(target=self._beat_until, args=(stop,), daemon=True,
                                  name="storagescale-heartbeat")
        thread.start()

    def _beat_until(self, stop: threading.Event) -> None:
        while not stop.wait(records.HEARTBEAT_EVERY):
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - a missed renewal; the next one may pass
                continue

    def stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.set()

    def beat(self) -> None:
        """Write the owner record with a new heartbeat (only into this run's own,
        existing directory, whose record it checks first)."""
        driver = self.endpoint.driver_spec(self.path).connect("admin", timeout=self.timeout)
        try:
            current = read_owner(driver, self.path)
            if not (current is not None and (verified(current) or current == self.record)
                    and current.get("run_id") == self.run_id):
                return  # gone, or not ours any more: never written into
            record = {**current, "heartbeat": time.time()}
            driver.put(self.owner_path, json.dumps(signed(record)).encode())
            self.record = signed(record)
        finally:
            driver.close()

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
            f"{type(driver).create_command(self.endpoint.url)}"
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
        try:
            names = driver.ls(area)
        except StorageError:  # the run can go on; only the summary line is missing
            return []
        found = (self._stale_one(driver, f"{area}/{name}", name, now) for name in names
                 if name.startswith(RUN_PREFIX) and name != self.run_id)
        return [run for run in found if run is not None]

    @staticmethod
    def _stale_one(driver, path: str, name: str, now: float) -> StaleRun | None:
        owner = read_owner(driver, path)
        if owner is None:
            made = name_time(name)
            if made is None or now - made <= UNMARKED_AFTER:
                return None
            return StaleRun(path, f"unmarked: no owner file, named {(now - made) / 86400:.0f} "
                                  f"days ago; never removed by the plugin")
        if not (verified(owner) and owner.get("run_id") == name):
            return StaleRun(path, "someone else's: its owner file carries no proof of this "
                                  "user; never removed by the plugin")
        reason = stale_reason(owner, now)
        return StaleRun(path, reason, owner) if reason else None

    def _stale_text(self, stale: list[StaleRun], removed_local: int) -> str | None:
        local = (f" ({removed_local} local folder(s) of dead runs removed from "
                 f"{tempfile.gettempdir()})" if removed_local else "")
        ours = [run for run in stale if run.removable]
        lines = [self._ours_text(ours, local) if ours else (
            f"storagescale: {local.strip(' ()')}" if removed_local else "")]
        others = [run for run in stale if not run.removable]
        if others:
            lines.append(
                f"storagescale: left alone in {self.endpoint.display}: "
                + ", ".join(f"{run.name} ({run.reason})" for run in others))
        return "\n".join(line for line in lines if line) or None

    def _ours_text(self, stale: list[StaleRun], local: str) -> str:
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
        return self._clean_tree(run.path, run.name)

    def _clean_tree(self, path: str, run_id: str) -> str | None:
        """Remove what a run made in ``path`` through a client that may write only
        below it, once its owner record is checked again (this user's, this run id;
        no file older than the run's start on the storage's clock, which it names);
        the storage's refusal or what was left, as text."""
        from ..drivers.watch import DeadlineExceeded, RequestWatch, run_bounded
        from ..load.engine import INTERRUPT_PROBE, remove_created, run_generated

        try:
            driver = self.endpoint.driver_spec(path).connect("cleanup", timeout=self.timeout)
        except StorageError as exc:
            return str(exc)
        watch = RequestWatch(driver)
        if self.session_interrupted and path == self.path:
            try:  # any answer will do; none within seconds: the exit must not wait
                run_bounded(lambda: _exists(driver, path), watch, INTERRUPT_PROBE, "probe")
            except DeadlineExceeded:
                driver.close()
                return (f"the storage did not answer within {INTERRUPT_PROBE:g} s after the "
                        f"session was stopped: {path} is left on {self.endpoint.display} "
                        f"with its owner file; a later run on this host with "
                        f"--storage-clean-stale removes it, or remove it by hand")
            except StorageError:
                pass  # an answer: the clean-up below says what it could not remove

        def remove() -> str | None:
            owner = read_owner(driver, path)
            if owner is None and not _exists(driver, path):
                return None
            # this user's proof, or (no key to sign with) the very record this run wrote
            ours = owner is not None and (
                verified(owner) or (path == self.path and owner == self.record))
            if owner is None or not ours or owner.get("run_id") != run_id:
                return (f"{path} not removed: its owner file is not this run's (missing, "
                        f"changed, or the directory was replaced, e.g. by a link); nothing "
                        f"in it was deleted. Check it and remove it by hand")
            owner_file = f"{path}/{OWNER_FILE}"
            created = CreatedPaths(path, run_generated, owner=owner_file)
            created.add(owner_file, "file")
            return remove_created(driver, created, owner.get("storage_started"))

        try:
            return run_bounded(remove, watch, self.timeout + 2.0, "clean-up")
        except Exception as exc:  # noqa: BLE001 - said in the summary, never raised
            return f"{path} not removed: {exc}"
        finally:
            driver.close()

    # -- the end -------------------------------------------------------------------
    @property
    def used(self) -> bool:
        return self._ready or self.marker.exists()

    def remove(self) -> str | None:
        """Remove the directory and what the run made in it; what was refused or left
        as text (never raised; Ctrl-C ends it at once and says what is left)."""
        self.stop_heartbeat()
        if self._note_file.exists():
            self.stale_note = self._note_file.read_text()
        if not self.used:
            return None
        try:
            return self._clean_tree(self.path, self.run_id)
        except KeyboardInterrupt:
            self.cleanup_interrupted = True
            return (f"interrupted (Ctrl-C) during the clean-up: {self.path} is left on "
                    f"{self.endpoint.display} with its owner file; a later run on this host "
                    f"with --storage-clean-stale removes it, or remove it by hand")
        finally:
            self._ready = False
            self.marker.unlink(missing_ok=True)


def _exists(driver, path: str) -> bool:
    try:
        driver.stat(path)
    except StorageNotFound:
        return False
    return True


def name_time(name: str) -> float | None:
    """When a run directory named ``storagescale-run-YYYYmmdd-HHMMSS-...`` was named
    (seconds since the epoch), None for another name."""
    try:
        # named with the local time (make_run_id)
        return time.mktime(time.strptime(name[len(RUN_PREFIX):][:15], "%Y%m%d-%H%M%S"))
    except ValueError:
        return None


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
