"""The JSON results file (``--storage-results``).

Rewritten atomically as steps finish, so a run killed half-way keeps the steps it
finished (:meth:`ResultsFile.write_soon`: at once, or within
:data:`MIN_REWRITE_GAP_S` seconds when steps end faster than that)::

    {"format": 2,
     "run": {"endpoint", "system", "version", "thresholds_file", "started", "client", ...},
     "steps": [{"test", "op", "operation", "clients", "duration_s", "started", "ended",
                "succeeded", "failed", "hung", "rate_hz", "mb_s", "latency_s": {...},
                "errors", "verdict", "violations", "checks", ...}],
     "verdict": "FAILED", "tests": [{"nodeid", "kind", "outcome", "cause"}]}

(``verdict``, ``tests`` and, with a baseline, ``behaviour_gate`` are written when the
session ends, whether or not a load step ran: a run of checks alone writes them too.)
(:meth:`RunInfo.to_json` and :meth:`StepRecord.to_json` define the keys.) NaN
(nothing measured) and infinity (never recovered) are written as ``null``: strict
JSON readers refuse them.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import StorageScaleUsageError
from ..records import FORMAT, RunInfo, StepRecord
from ..redact import SECRETS, redact_text

#: a results, baseline or acceptance file larger than this is refused, not read: a
#: results file of a long run is a few MB (its steps' timelines and histograms)
MAX_INPUT_BYTES = 64 * 1024 * 1024


class InputFileError(Exception):
    """An input file (results, baseline, acceptance) that cannot be read as one: why,
    in words (the caller names the file and the option)."""


def read_input_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit``: a FIFO, a device
    (``/dev/zero``), a folder or a socket is refused without blocking (opened
    non-blocking, then ``fstat``), a larger file is refused after reading ``limit + 1``
    bytes (``limit``: :data:`MAX_INPUT_BYTES`). Raises :class:`InputFileError` saying
    why."""
    limit = MAX_INPUT_BYTES if limit is None else limit
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputFileError(f"cannot read it ({exc.strerror or exc})") from None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else
                    "a named pipe (FIFO)" if stat.S_ISFIFO(info.st_mode) else
                    "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise InputFileError(f"it is {kind}, not a regular file")
        if info.st_size > limit:
            raise InputFileError(f"it holds {info.st_size} bytes, more than the "
                                 f"{limit // (1024 * 1024)} MiB read from such a file")
        chunks, size = [], 0
        while size <= limit:  # a file that grows while read stops at limit + 1 bytes
            chunk = os.read(handle, min(1024 * 1024, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputFileError(f"it holds more than the {limit // (1024 * 1024)} MiB "
                                 f"read from such a file")
        return b"".join(chunks)
    except OSError as exc:
        raise InputFileError(f"cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(handle)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):  # causes and examples quote servers: no credential
        return redact_text(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def json_text(document: dict[str, Any], *, indent: int | None = 1) -> str:
    """``document`` as strict JSON (NaN and infinity as null)."""
    return json.dumps(_clean(document), indent=indent, allow_nan=False, default=str)


def write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` through a temporary file and a rename, so a
    reader (or a run killed mid-write) never sees half a file."""
    write_text_atomic(path, json_text(document))


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` and a newline to ``path`` as :func:`write_json_atomic` does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
            stream.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written, or None. Creates (and removes) at most one
    temporary file, in the nearest folder of ``path`` that exists."""
    try:
        if path.is_dir():
            return f"{path} is a directory"
        folder = path.parent
        while not folder.exists():
            folder = folder.parent
    except OSError as exc:  # e.g. a folder on the way that we may not search
        return f"cannot look at {exc.filename or path} ({exc.strerror or exc})"
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    try:
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.")
    except OSError as exc:
        return f"cannot create a file in {folder} ({exc.strerror or exc})"
    os.close(handle)
    os.unlink(temporary)
    return None


#: while steps come in, the results file is written at once unless its last writing
#: was less than this long ago (seconds); then it is written when that gap has passed
MIN_REWRITE_GAP_S = 2.0
#: ... or, for a file that takes long to write, less than this many times as long as
#: that writing took: writing it costs at most about a tenth of the session's time
REWRITE_GAP_FACTOR = 10


class ResultsFile:
    """The run's results document at ``path`` (None: no results file).

    Rewritten whole (a temporary file and a rename: never half a file) as steps finish
    (:meth:`write_soon`), at most once per gap (:data:`MIN_REWRITE_GAP_S`, longer for a
    file that takes long to write), a pending writing done by a timer when the gap has
    passed; at once by :meth:`write` and :meth:`finish`. Each step's text is made once
    (per generation of the secrets registry, whose redaction it carries): the steps
    the ledger holds are read from the step log and never changed. Before, every
    finished step serialized the whole growing file: a session of N steps wrote N
    times, quadratic in its steps (249 s of a 358 s run with big timelines)."""

    def __init__(self, path: Path | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        #: written at the session's end: the run's verdict (pytest's exit status, as
        #: the HTML report states it) and every test's outcome, so that
        #: ``storagescale compare`` names the conformance checks that changed
        self.verdict: str | None = None
        self.tests: list[dict[str, str]] = []
        #: the behaviour gate's verdict against the baseline (None: no baseline)
        self.gate: dict[str, Any] | None = None
        #: how many times the file was written (the tests count them)
        self.writes = 0
        self._clock = clock
        self._lock = threading.Lock()  # the timer's writing and the session's
        self._written_at: float | None = None
        self._gap = MIN_REWRITE_GAP_S
        self._pending: tuple[RunInfo, list[StepRecord]] | None = None
        self._timer: threading.Timer | None = None
        #: id(step) -> (the step, the secrets' generation, its text in the document)
        self._texts: dict[int, tuple[StepRecord, int, str]] = {}

    def check_writable(self) -> None:
        """Fail at session start, not after the first 20-minute step, when the file
        cannot be written."""
        if self.path is None:
            return
        reason = _unwritable(self.path)
        if reason is not None:
            raise StorageScaleUsageError(
                f"--storage-results {self.path}: the results file cannot be written there: "
                f"{reason}. Pass --storage-results (or the storage_results ini key) a file "
                f"in a folder you can write, e.g. --storage-results=results/storage.json."
            )

    def document(self, run: RunInfo, steps: list[StepRecord]) -> dict[str, Any]:
        document = {"format": FORMAT, "run": run.to_json(),
                    "steps": [step.to_json() for step in steps]}
        if self.verdict is not None:
            document.update(verdict=self.verdict, tests=self.tests)
        if self.gate is not None:
            document["behaviour_gate"] = self.gate
        return document

    def text(self, run: RunInfo, steps: list[StepRecord]) -> str:
        """``json_text(self.document(run, steps))``, each step's part made once."""
        parts = []
        for key, value in self.document(run, []).items():
            if key == "steps":
                items = ",\n  ".join(self._step_text(step) for step in steps)
                value_text = f"[\n  {items}\n ]" if steps else "[]"
            else:
                value_text = _nested(json.dumps(_clean(value), indent=1, allow_nan=False,
                                                default=str), 1)
            parts.append(f"{json.dumps(key)}: {value_text}")
        return "{\n " + ",\n ".join(parts) + "\n}"

    def _step_text(self, step: StepRecord) -> str:
        generation = SECRETS.generation
        cached = self._texts.get(id(step))
        if cached is not None and cached[0] is step and cached[1] == generation:
            return cached[2]
        text = _nested(json_text(step.to_json()), 2)
        self._texts[id(step)] = (step, generation, text)
        return text

    def finish(self, run: RunInfo, steps: list[StepRecord], verdict: str,
               tests: list[dict[str, str]], gate: dict[str, Any] | None = None) -> None:
        """Write the file once more at the session's end (load steps or none: a run of
        checks alone is the next run's baseline), with the run's ``verdict``, every
        test's outcome (``{"nodeid", "kind", "outcome", "cause"}``) and the behaviour
        gate's verdict (``behaviour_gate``: :meth:`.behaviour.BehaviourGate.to_json`)."""
        with self._lock:
            self.verdict, self.tests, self.gate = verdict, tests, gate
            self._write(run, steps)

    def write(self, run: RunInfo, steps: list[StepRecord]) -> None:
        """Replace the file with ``run`` and every step so far, now (nothing without a
        path); a writing pending is done by this one."""
        with self._lock:
            self._write(run, steps)

    def write_soon(self, run: RunInfo, steps: list[StepRecord]) -> None:
        """:meth:`write` at once unless the file was written less than a gap ago; then
        by a timer when the gap has passed (or by a writing before it), with what is
        the latest by then."""
        if self.path is None:
            return
        with self._lock:
            self._pending = (run, list(steps))
            wait = (0.0 if self._written_at is None else
                    self._written_at + self._gap - self._clock())
            if wait <= 0:
                self._write(run, steps)
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._write_pending)
                self._timer.name = "storagescale-results"
                self._timer.start()

    def _write_pending(self) -> None:
        with self._lock:
            if self._timer is threading.current_thread():
                self._timer = None
            if self._pending is None:
                return
            try:
                self._write(*self._pending)
            except OSError:  # still pending: the session's next writing says why
                pass

    def _write(self, run: RunInfo, steps: list[StepRecord]) -> None:
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()
            self._timer = None
        if self.path is None:
            self._pending = None
            return
        self._pending = (run, list(steps))
        started = self._clock()
        write_text_atomic(self.path, self.text(run, steps))
        self._pending = None
        self.writes += 1
        self._written_at = self._clock()
        self._gap = max(MIN_REWRITE_GAP_S,
                        REWRITE_GAP_FACTOR * (self._written_at - started))


def _nested(text: str, depth: int) -> str:
    """JSON ``text`` (made with ``indent=1``) as it reads ``depth`` levels down in a
    document made with ``indent=1``: a newline in it is structure (one inside a string
    is escaped)."""
    return text.replace("\n", "\n" + " " * depth)
