"""The exception hierarchy.

Two families: :class:`StorageScaleUsageError` for bad input a person must fix
(options, thresholds files, endpoints) and :class:`StorageError` for what the
storage answered during an operation. Usage errors subclass ``pytest.UsageError``
so pytest prints them as one ``ERROR:`` paragraph, without a traceback.
"""

from __future__ import annotations

import signal

import pytest

from .redact import redact_text


class StorageScaleUsageError(pytest.UsageError):  # type: ignore[misc]  # final for mypy only
    """Bad input: the message names the value, what is valid and how to fix it."""


class ThresholdsError(StorageScaleUsageError):  # type: ignore[misc]
    """A thresholds file is malformed, or no file matches the storage version."""


class EndpointError(StorageScaleUsageError):  # type: ignore[misc]
    """The endpoint cannot be used: unreachable, refused, or not set up."""


class UnsafePathError(Exception):
    """A mutating operation targeted a path outside the run's own test area.

    This is a bug guard, not a storage answer: the plugin never writes, renames
    or deletes outside ``<endpoint path>/<run directory>``.
    """


class StorageError(Exception):
    """An operation failed on the storage.

    Carries what an operator needs: driver, endpoint, operation, path and the
    native status (XRootD status/code/errno, gfal2 GError code).
    """

    def __init__(
        self,
        message: str,
        *,
        driver: str,
        endpoint: str,
        operation: str,
        path: str,
        native_status: str = "",
        error_class: str = "error",
    ) -> None:
        # the message and status quote the server or the client library, which may
        # quote the request: no credential of the session, nor one that looks like it
        self.message = redact_text(message)
        self.driver = driver
        self.endpoint = redact_text(endpoint)
        self.operation = operation
        self.path = path
        self.native_status = redact_text(native_status)
        #: short class name used to group failures in results, e.g. ``timeout``
        self.error_class = error_class
        super().__init__(str(self))

    def __str__(self) -> str:
        status = f" [{self.native_status}]" if self.native_status else ""
        return (
            f"{self.driver} {self.operation} {self.endpoint}{self.path}: "
            f"{self.message}{status}"
        )


class StorageTimeout(StorageError):
    """The operation did not finish within its timeout."""


class StorageNotFound(StorageError):
    """The path does not exist."""


class StoragePermissionDenied(StorageError):
    """The storage refused the operation for this identity (credentials)."""


class StorageUnreachable(StorageError):
    """The endpoint could not be contacted (connection refused, DNS, TLS)."""


class BadAnswer(StorageError):
    """The storage's answer could not be read: malformed (a size that is no number, an
    unreadable date or checksum, broken XML) or longer than the driver reads for such a
    request (``error_class`` ``bad_answer``)."""


class RedirectRefused(StorageError):
    """The storage redirected a mutating request (PUT, DELETE, MKCOL, MOVE, COPY...)
    elsewhere than the same path on another server: refused, never followed
    (``error_class`` ``redirect_refused``)."""


class StorageThrottled(StorageError):
    """The storage asked the client to come back later (HTTP 429, or 503 with
    ``Retry-After``: dCache's WebDAV request limiter) for longer than the request's
    deadline allowed waiting (``error_class`` ``throttled``). A load step counts it as
    ``throttled``, not ``failed``: the storage protected itself, it did not fail."""


class StorageScaleWarning(UserWarning):
    """Something the run did not need for its verdict went wrong (a check's own clean-up
    failed; the run directory's removal at the end still covers it)."""


class StepOutcomeError(pytest.fail.Exception):  # type: ignore[name-defined]  # Failed
    """Base of the failures a load step raises in its test. They are pytest outcome
    exceptions (no traceback, one message); Allure's categories match them by class
    name, so rewording a message cannot move a failure to another category."""

    def __init__(self, message: str) -> None:
        super().__init__(message, pytrace=False)


class ThresholdViolation(StepOutcomeError):
    """A step broke a rule of its thresholds file."""


class HungClientsViolation(ThresholdViolation):
    """A step broke a rule on ``hung``: clients stopped getting answers."""


class StepError(StepOutcomeError):
    """A step could not give a verdict: it could not run, or measured nothing."""


class StorageCheckFailure(pytest.fail.Exception):  # type: ignore[name-defined]
    """A functional check found the storage's answer wrong (the conformance checks'
    failures: door, operation, path, what the storage did, what was expected). A
    pytest outcome (one paragraph, no traceback); Allure files it, by this class, with
    the storage errors."""

    def __init__(self, message: str) -> None:
        super().__init__(message, pytrace=False)


def exit_text(code: int) -> str:
    """How a process ended, from its exit status (``Popen.returncode``,
    ``Process.exitcode``): ``exit code 3``, ``killed by SIGSEGV``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
