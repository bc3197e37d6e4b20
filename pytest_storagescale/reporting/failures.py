"""A test failed by the storage's answer: one paragraph, not a traceback.

A functional test (``suites/dcache/test_dcache_functional.py``, a site's own) calls a
driver directly; when the storage refuses, the :class:`~..errors.StorageError` it
raises would print 40 lines of traceback through the driver's internals. The
storage's answer is the cause, so the failure reads as the conformance checks'
does: driver, endpoint, operation, path, the storage's answer with its native
status, the test's line that asked, and for a refused checksum what usually lacks.
The exception is kept (its class decides the Allure category); only the report's
text changes. ``--tb=long`` or ``--full-trace`` keep pytest's traceback.

A skip of a storage test is folded by file and reason, not by line
(:func:`fold_storage_skip`): the ten authorization checks that one missing login
skips are one ``SKIPPED [10]`` line of ``-rs``, not five.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ..errors import StorageError, StorageNotFound, StorageTimeout, StorageUnreachable
from ..redact import redact_text

#: what a refused checksum most often means, by the driver that asked
CHECKSUM_HINTS = {
    "xrootd": "an xrootd computes checksums only with 'xrootd.chksum adler32' in its "
              "configuration; without it the storage has no checksum support",
    "http": "the door sends no adler32 digest (RFC 3230 Want-Digest): an XrdHttp door "
            "needs 'xrootd.chksum adler32', a dCache door a checksum type for its pools; "
            "or the storage has no checksum support",
}
DEFAULT_CHECKSUM_HINT = ("the storage computes no adler32 checksum for this door (an "
                         "xrootd needs 'xrootd.chksum adler32' in its configuration), or "
                         "it has no checksum support")


def checksum_hint(exc: StorageError) -> str | None:
    """What a refused checksum (asked for, or an upload's digest) usually means, or
    None for any other failure (a timeout, a missing file: not the checksum's fault)."""
    if isinstance(exc, StorageTimeout | StorageNotFound | StorageUnreachable):
        return None
    said = f"{exc.operation} {exc.message}".lower()
    if "checksum" not in said and "chksum" not in said and "digest" not in said:
        return None
    return CHECKSUM_HINTS.get(exc.driver, DEFAULT_CHECKSUM_HINT)


def storage_failure_text(exc: StorageError, where: str) -> str:
    """``xrootd driver, endpoint root://door:1094: checksum /area/f: the storage
    answered an error: ... [status=1 code=400 errno=3013] (asked at test_x.py:39).
    Hint: ...``"""
    status = f" [{exc.native_status}]" if exc.native_status else ""
    did = ("gave no answer within the deadline" if isinstance(exc, StorageTimeout)
           else "answered an error")
    text = (f"{exc.driver} driver, endpoint {exc.endpoint}: {exc.operation} {exc.path}: "
            f"the storage {did} ({exc.error_class}): {exc.message}{status}"
            + (f" (asked at {where})" if where else "") + ".")
    hint = checksum_hint(exc)
    return redact_text(text + (f" Hint: {hint}." if hint else ""))


@dataclass(frozen=True)
class _Crash:
    """What pytest's short summary and JUnit read from a failure (``reprcrash``)."""

    path: str
    lineno: int
    message: str


class StorageFailureRepr:
    """A report's ``longrepr``: the paragraph, written as pytest writes a message."""

    def __init__(self, text: str, crash: _Crash) -> None:
        self.text = text
        self.reprcrash = crash

    def toterminal(self, tw) -> None:
        for line in self.text.splitlines():
            tw.line(f"E   {line}", red=True, bold=True)

    def __str__(self) -> str:
        return self.text


def _asked_at(item: pytest.Item, excinfo: pytest.ExceptionInfo) -> tuple[str, int]:
    """The test file's line that made the call (the last traceback entry in it)."""
    relative = item.location[0]
    for entry in reversed(excinfo.traceback):
        if entry.path == item.path:
            return relative, entry.lineno + 1
    return relative, 0


def shorten_storage_failure(item: pytest.Item, call: pytest.CallInfo,
                            report: pytest.TestReport) -> None:
    """Replace the traceback of a test (or fixture) that the storage's answer failed
    with :func:`storage_failure_text`, unless ``--tb=long``/``--full-trace`` asks for it."""
    excinfo = call.excinfo
    if not report.failed or excinfo is None or not isinstance(excinfo.value, StorageError):
        return
    option = item.config.option
    if getattr(option, "tbstyle", "auto") == "long" or getattr(option, "fulltrace", False):
        return
    path, line = _asked_at(item, excinfo)
    text = storage_failure_text(excinfo.value, f"{path}:{line}" if line else "")
    report.longrepr = StorageFailureRepr(text, _Crash(  # type: ignore[assignment]
        str(item.path), line, f"{type(excinfo.value).__name__}: {text}"))


def fold_storage_skip(item: pytest.Item, report: pytest.TestReport) -> None:
    """A skipped test that uses the storage: its skip's line dropped from the report, so
    pytest's summary counts the tests one reason skipped in a file on one line."""
    longrepr = report.longrepr
    if (not report.skipped or hasattr(report, "wasxfail")
            or not isinstance(longrepr, tuple) or len(longrepr) != 3):
        return
    if any(name.startswith("storage_") for name in getattr(item, "fixturenames", ())):
        path, _, reason = longrepr
        report.longrepr = (path, None, reason)  # type: ignore[assignment]  # no line

