"""The JSON results file (``--storage-results``).

Rewritten atomically after every step, so a run killed half-way keeps every step
it finished::

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
from pathlib import Path
from typing import Any

from ..errors import StorageScaleUsageError
from ..records import FORMAT, RunInfo, StepRecord
from ..redact import redact_text

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
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(json_text(document))
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


class ResultsFile:
    """The run's results document at ``path`` (None: no results file)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        #: written at the session's end: the run's verdict (pytest's exit status, as
        #: the HTML report states it) and every test's outcome, so that
        #: ``storagescale compare`` names the conformance checks that changed
        self.verdict: str | None = None
        self.tests: list[dict[str, str]] = []
        #: the behaviour gate's verdict against the baseline (None: no baseline)
        self.gate: dict[str, Any] | None = None

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

    def finish(self, run: RunInfo, steps: list[StepRecord], verdict: str,
               tests: list[dict[str, str]], gate: dict[str, Any] | None = None) -> None:
        """Write the file once more at the session's end (load steps or none: a run of
        checks alone is the next run's baseline), with the run's ``verdict``, every
        test's outcome (``{"nodeid", "kind", "outcome", "cause"}``) and the behaviour
        gate's verdict (``behaviour_gate``: :meth:`.behaviour.BehaviourGate.to_json`)."""
        self.verdict, self.tests, self.gate = verdict, tests, gate
        self.write(run, steps)

    def write(self, run: RunInfo, steps: list[StepRecord]) -> None:
        """Replace the file with ``run`` and every step so far (nothing without a path)."""
        if self.path is not None:
            write_json_atomic(self.path, self.document(run, steps))
