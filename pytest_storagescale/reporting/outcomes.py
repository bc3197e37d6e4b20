"""Every test's outcome, for the HTML report's verdict: load steps, functional tests
and conformance checks alike.

:class:`TestOutcomes` is a small plugin registered in the process that writes the
reports (the xdist controller gets the workers' test reports through the same
``pytest_runtest_logreport`` hook). It keeps, per test, the outcome pytest counts
(``failed``, ``error``, ``passed``, ``skipped``, ``xfailed``, ``xpassed``) and the
failure's cause: the exception's message (pytest's crash line), never the traceback.
The run's verdict is pytest's own exit status (:meth:`TestOutcomes.summary`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import pytest

#: the plugin's name in pytest's plugin manager
PLUGIN_NAME = "storagescale-test-outcomes"
#: failures first, then what did not run as asked, then the rest
ORDER = ("failed", "error", "interrupted", "xpassed", "skipped", "xfailed", "passed")
#: a cause is one paragraph: at most this many lines and characters
CAUSE_LINES, CAUSE_CHARS = 12, 2000
#: pytest's exit status, as the report's verdict
VERDICTS = {0: "PASSED", 1: "FAILED", 2: "INTERRUPTED", 3: "INTERNAL ERROR",
            4: "USAGE ERROR", 5: "NO TESTS RAN"}
#: ``pytest_storagescale.errors.StepError: ...`` -> ``StepError: ...``; pytest's own
#: ``Failed:`` of pytest.fail says nothing
_QUALIFIED = re.compile(r"^(?:Failed: )|^(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*: )")


@dataclass(frozen=True)
class TestOutcome:
    """One test: its node id, kind (``load``, ``conformance``, ``functional``),
    outcome and, unless it passed, why."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    nodeid: str
    kind: str
    outcome: str
    cause: str = ""


@dataclass(frozen=True)
class RunSummary:
    """What the report states first: the verdict, pytest's exit status, the counts,
    and every test, failures first."""

    verdict: str
    exit_status: int
    counts: dict[str, int]
    tests: list[TestOutcome]
    run_id: str
    started: float
    endpoint: str

    @property
    def counts_text(self) -> str:
        """``2 failed, 1 error, 30 passed``."""
        return ", ".join(f"{self.counts[name]} {name}" for name in ORDER
                         if self.counts.get(name)) or "no tests"


#: how a known issue's reason begins (a suite's ``[known_issues]`` entry: a strict
#: expected failure, see ``suites/conformance/checks.py``)
KNOWN_ISSUE = "known issue of "
#: what a known issue that passed adds to pytest's ``[XPASS(strict)] <reason>``: only
#: there, so an XFAIL's reason reads as the known issue it is
FIXED_NOTE = " -- the storage now passes it: remove the entry from [known_issues]"


def note_fixed_known_issue(report: pytest.TestReport) -> None:
    """A known issue the storage passed (pytest fails it as ``[XPASS(strict)] known
    issue of ...``) says it is fixed and what to do about its entry."""
    text = report.longrepr
    if (report.failed and isinstance(text, str)
            and text.startswith(f"[XPASS(strict)] {KNOWN_ISSUE}")
            and not text.endswith(FIXED_NOTE)):
        report.longrepr = text + FIXED_NOTE


def kind_of(report: pytest.TestReport) -> str:
    """``load`` (a ``storagescale_op`` test), ``conformance`` (a check of the
    conformance suite: its class or module says so) or ``functional``."""
    keywords = report.keywords
    if "storagescale_op" in keywords:
        return "load"
    if any("conformance" in str(name).lower() for name in keywords):
        return "conformance"
    return "functional"


def cause_of(report: pytest.TestReport) -> str:
    """The failure's (or skip's) message as one paragraph: pytest's crash line (the
    exception and its text), the ``E`` lines of a report without one, at most
    :data:`CAUSE_LINES` lines."""
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        text = crash.message
    else:
        text = str(longrepr)
        said = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
        text = "\n".join(said) if said else text
    lines = [line for line in _QUALIFIED.sub("", text.strip()).splitlines() if line.strip()]
    cause = "\n".join(lines[:CAUSE_LINES])
    if len(lines) > CAUSE_LINES or len(cause) > CAUSE_CHARS:
        cause = cause[:CAUSE_CHARS].rstrip() + " ..."
    return cause


def _outcome(report: pytest.TestReport) -> str:
    """The outcome pytest counts for one phase's report."""
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    return str(report.outcome)


class TestOutcomes:
    """The plugin: each test's outcome from its phases' reports (a failed phase wins
    over a passed one; the first failure's cause is kept)."""

    __test__ = False

    def __init__(self, run: Any) -> None:
        self.run = run  # the session's StorageRun: run id, start, endpoint
        self.tests: dict[str, TestOutcome] = {}
        #: tests whose set-up passed and whose call has not been reported: one still
        #: there at an interrupted session's end was stopped mid-test (Ctrl-C, SIGTERM)
        self._running: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = _outcome(report)
        known = self.tests.get(report.nodeid)
        if report.when == "setup" and outcome == "passed":
            self._running.add(report.nodeid)
        elif report.when == "call" or outcome != "passed":
            self._running.discard(report.nodeid)
        if outcome == "passed" and report.when != "call":
            if known is None:  # a passed set-up: the call says more
                self.tests[report.nodeid] = TestOutcome(report.nodeid, kind_of(report),
                                                        "passed")
            return
        if known is not None and known.outcome in ("failed", "error"):
            return  # a teardown error after a failure: the failure says why
        self.tests[report.nodeid] = TestOutcome(report.nodeid, kind_of(report), outcome,
                                                "" if outcome == "passed" else cause_of(report))

    def summary(self, exit_status: int) -> RunSummary:
        """The verdict (pytest's exit status: FAILED when a test failed or errored,
        whatever its kind) and every test, failures first."""
        if int(exit_status) == int(pytest.ExitCode.INTERRUPTED):
            for nodeid in self._running & set(self.tests):  # its call never ended
                self.tests[nodeid] = TestOutcome(
                    nodeid, self.tests[nodeid].kind, "interrupted",
                    "interrupted (Ctrl-C or SIGTERM) while it ran")
        tests = sorted(self.tests.values(),
                       key=lambda t: (ORDER.index(t.outcome) if t.outcome in ORDER
                                      else len(ORDER)))
        counts: dict[str, int] = {}
        for test in tests:
            counts[test.outcome] = counts.get(test.outcome, 0) + 1
        status = int(exit_status)
        verdict = VERDICTS.get(status, f"EXIT STATUS {status}")
        if status == 0 and (counts.get("failed") or counts.get("error")):
            verdict = "FAILED"  # never green beside a red test
        return RunSummary(verdict, status, counts, tests, self.run.run_id,
                          self.run.started or time.time(), self.run.endpoint.display)
