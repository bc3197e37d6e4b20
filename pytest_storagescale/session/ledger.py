"""The step ledger: one load test at a time (:class:`EndpointLock`), and every
finished step in one place.

Each process appends its finished steps to the session's shared log
(``steps.jsonl`` in the shared folder, under an flock). That log is the one path a
step travels: the process that owns the results (a plain session, or the xdist
controller) reads what is new in it whenever a test report says a step finished,
and once more at the end (a worker that crashed after a step loses nothing), then
rewrites the results file (at once, or within a gap when steps end faster than it:
:meth:`.ResultsFile.write_soon`; a lost step at once). A scan's plot reads the same
log (any worker's steps).

A step is logged when it begins too (``begin``: its plan, a ``started`` line): one
whose process dies before it is logged as finished (an xdist worker killed mid-step)
is recorded by the owner as an ``error`` naming that process (:meth:`lose`: when
xdist reports the crashed worker, and at the end for any step left begun).
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO

from ..records import RunInfo, StepRecord, Verdict
from ..reporting.results import ResultsFile, json_text


def is_private_folder(path: Path) -> bool:
    """Whether ``path`` is a folder (not a link) of this user's that no other may open:
    the session's shared folder as :func:`private_folder` made it."""
    import os
    import stat

    try:
        info = path.lstat()
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            and not info.st_mode & 0o077)


def private_folder(path: Path) -> Path:
    """``path``, the session's shared folder (in the temporary folder, named by the run
    id), made this user's only (mode 0700): what the processes of the session hand
    each other there (the embedded server's URL with its password, minted tokens, the
    steps) is no other user's to read. A usage error when it is there already as
    something else (a link, another user's folder, one open to others)."""
    import stat

    from ..errors import StorageScaleUsageError

    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass  # made by another process of this session, or by someone else: looked at
    info = path.lstat()
    if not is_private_folder(path):
        raise StorageScaleUsageError(
            f"the session's shared folder {path} is there already and is not this user's "
            f"private folder (a link, another user's, or open to others: mode "
            f"{stat.filemode(info.st_mode)}, uid {info.st_uid}): another user may have "
            f"made it to read what the session's processes hand each other. Run again "
            f"(a new run id names a new folder), and look at who made {path}.")
    return path


class EndpointLock:
    """Who may use the endpoint now, across the session's processes: an flock on
    ``load.lock`` in the shared folder, exclusive for a load test (all its steps:
    a recovery test's overload and probe, a mixed test's three steps, with nothing
    of the session's between or beside them) and shared for functional checks
    (they run together, never during a load test's steps).

    Re-entrant within the process: a hold inside a hold costs nothing, a shared hold
    becomes exclusive for an exclusive one inside it and shared again after it.
    Writers are not starved: both kinds pass a turnstile (``turnstile.lock``,
    exclusive, held only while waiting for ``load.lock``), so a load test waiting
    for the checks in progress keeps new checks out until it had its turn. A
    process never waits for the turnstile while it holds ``load.lock`` (a shared
    hold is released before it asks for an exclusive one), so two holders cannot
    wait for each other."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._handle: IO[str] | None = None
        #: the holds of this process, innermost last: True for an exclusive one
        self._holds: list[bool] = []

    @property
    def mode(self) -> str | None:
        """``exclusive``, ``shared`` or None (not held by this process)."""
        if not self._holds:
            return None
        return "exclusive" if any(self._holds) else "shared"

    @contextmanager
    def hold(self, *, exclusive: bool) -> Iterator[None]:
        before = self.mode
        wanted = "exclusive" if exclusive or before == "exclusive" else "shared"
        if wanted != before:
            self._take(wanted)
        self._holds.append(wanted == "exclusive")
        try:
            yield
        finally:
            self._holds.pop()
            if self.mode != wanted:
                self._give_back(self.mode)

    def _take(self, mode: str) -> None:
        if self._handle is None:
            private_folder(self.folder)
            self._handle = open(self.folder / "load.lock", "w")  # noqa: SIM115 - held
        else:  # shared -> exclusive: let go first (no waiting while holding it)
            fcntl.flock(self._handle, fcntl.LOCK_UN)
        with open(self.folder / "turnstile.lock", "w") as turnstile:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            try:
                fcntl.flock(self._handle,
                            fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH)
            finally:
                fcntl.flock(turnstile, fcntl.LOCK_UN)

    def _give_back(self, mode: str | None) -> None:
        assert self._handle is not None
        if mode == "shared":  # exclusive -> shared: a downgrade waits for no one
            fcntl.flock(self._handle, fcntl.LOCK_SH)
            return
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None


class StepLedger:
    """The session's shared step log, its lock and (for the owner) the results."""

    def __init__(self, shared_dir: Path, results: ResultsFile) -> None:
        self.shared_dir = shared_dir
        self.results = results
        self.run: RunInfo | None = None
        self.steps: list[StepRecord] = []
        self._seen: set[str] = set()
        #: steps begun and not finished yet (owner): step id -> what the log said
        self._begun: dict[str, tuple[RunInfo, StepRecord]] = {}
        self._read_offset = 0
        self._counter = 0

    @property
    def log_path(self) -> Path:
        return self.shared_dir / "steps.jsonl"

    def lock(self) -> AbstractContextManager[None]:
        """Hold the endpoint alone: one load test at a time across all xdist workers
        of the session, and no functional check of theirs meanwhile (re-entrant in
        this process: a test's steps inside it take it again for free)."""
        return self.endpoint_lock.hold(exclusive=True)

    def shared(self) -> AbstractContextManager[None]:
        """Hold the endpoint with the other functional checks: no load step of the
        session runs meanwhile (re-entrant; inside :meth:`lock`, nothing more)."""
        return self.endpoint_lock.hold(exclusive=False)

    @functools.cached_property
    def endpoint_lock(self) -> EndpointLock:
        return EndpointLock(self.shared_dir)

    def settle(self, seconds: float) -> None:
        """Owner: wait up to ``seconds`` for the steps begun elsewhere (an xdist worker
        stopping after SIGTERM or Ctrl-C) to be logged as finished, with what they
        measured, before :meth:`lose` records the rest as lost."""
        deadline = time.monotonic() + seconds
        self.sync()
        while self._begun and time.monotonic() < deadline:
            time.sleep(0.1)
            self.sync()

    @contextmanager
    def _flock(self, name: str) -> Iterator[None]:
        private_folder(self.shared_dir)
        with open(self.shared_dir / name, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def next_step_id(self, worker: str) -> str:
        self._counter += 1
        return f"{worker}-{self._counter:03d}"

    def begin(self, run: RunInfo, step: StepRecord) -> None:
        """Log that a step begins (its plan known): should its process die before
        :meth:`append`, the owner records it as an error (:meth:`lose`)."""
        self._write({"run_info": run.to_json(), "step": step.to_json(), "started": True})

    def append(self, run: RunInfo, step: StepRecord) -> None:
        """Log a finished step for whoever owns the results."""
        self._write({"run_info": run.to_json(), "step": step.to_json()})

    def _write(self, entry: dict) -> None:
        # strict JSON, as the results file: NaN and infinity are written as null
        line = json_text(entry, indent=None)
        with self._flock("log.lock"), open(self.log_path, "a") as log:
            log.write(line + "\n")

    def logged(self) -> list[tuple[RunInfo, StepRecord]]:
        """Every finished step of the session so far, from any process."""
        return [(run, step) for run, step, begun in self._entries(0)[0] if not begun]

    def _entries(self, offset: int) -> tuple[list[tuple[RunInfo, StepRecord, bool]], int]:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                data = log.read()
        except FileNotFoundError:
            return [], offset
        complete = data[: data.rfind(b"\n") + 1]  # a line being written waits
        entries = []
        for line in complete.decode().splitlines():
            if line.strip():
                entry = json.loads(line)
                entries.append((RunInfo.from_json(entry["run_info"]),
                                StepRecord.from_json(entry["step"]),
                                bool(entry.get("started"))))
        return entries, offset + len(complete)

    def sync(self) -> list[StepRecord]:
        """Take the new steps of the log into the results (owner only); return them."""
        entries, self._read_offset = self._entries(self._read_offset)
        new = []
        for run, step, begun in entries:
            if step.step_id in self._seen:
                continue
            if begun:
                self._begun[step.step_id] = (run, step)
                continue
            self._begun.pop(step.step_id, None)
            self._seen.add(step.step_id)
            self.run = self.run or run
            new.append(step)
        return self._take(new)

    def _take(self, new: list[StepRecord], *, at_once: bool = False) -> list[StepRecord]:
        """``new`` into the steps and the results file: written within a gap of the
        last writing (the session's end writes it whole), or ``at_once``."""
        if new:
            self.steps = sorted([*self.steps, *new], key=lambda step: step.started)
            if self.run is not None:  # set with the first step
                if at_once:
                    self.results.write(self.run, self.steps)
                else:
                    self.results.write_soon(self.run, self.steps)
        return new

    def lose(self, worker: str | None, why: str, verdict: Verdict = Verdict.ERROR
             ) -> list[StepRecord]:
        """Steps begun and never finished (by ``worker``; None: by any process) are
        recorded with ``verdict`` (an error) saying ``why`` (owner only, after what is
        new is read)."""
        self.sync()
        lost = []
        for step_id, (run, step) in list(self._begun.items()):
            if worker is not None and step.worker != worker:
                continue
            del self._begun[step_id]
            self._seen.add(step_id)
            self.run = self.run or run
            lost.append(dataclasses.replace(step, verdict=verdict, ended=time.time(),
                                            error=why.format(worker=step.worker)))
        return self._take(lost, at_once=True)
