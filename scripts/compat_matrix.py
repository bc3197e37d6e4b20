#!/usr/bin/env python3
"""Measure the compatibility matrix: each suite x each embedded server x each protocol.

Every combination is one real ``pytest suites/<suite> --storage-embedded KIND
--storage-embedded-protocol SCHEME [--storage-embedded-login LOGIN] --storage-scale
0.05`` run in a subprocess, bounded by ``--timeout``; its outcome comes from the run's
JUnit XML (passed, failed, errors, skipped, xfailed) and its exit code: 4 (a usage
error the plugin refuses, e.g. a protocol the server does not serve) is "n/a" with the
plugin's one-line reason. suites/gpfs needs a POSIX mount: it runs once against
``file://<tmpdir>`` and every embedded server is listed as not applicable to it.

    .venv/bin/python scripts/compat_matrix.py            # writes docs/compatibility.md
    .venv/bin/python scripts/compat_matrix.py --only xrootd --output -

``--clients`` measures another matrix instead: the embedded xrootd's client release x
server release (issue 34: clients upgrade apart from the servers). Each client release
(the process's XRootD bindings and tools: ``STORAGESCALE_XROOTD_CLIENT``) x each server
release (``--storage-embedded-version``) runs the authentication scans
(``suites/xrootd -k auth_rate``, one run per login: unix, gsi) and the conformance
checks (``suites/conformance``), each a real pytest run as above; the table gives the
measured logins/s per step and the checks' outcomes, and the client library the run
itself recorded (its results' client versions: a run whose bindings are not the
release asked for is said, never counted as it).

    .venv/bin/python scripts/compat_matrix.py --clients --output -
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_storagescale.redact import redact_url  # noqa: E402
from pytest_storagescale.servers.family import (  # noqa: E402 - after the path fix
    embedded_class,
    embedded_kinds,
)

#: suites run against every embedded server
EMBEDDED_SUITES = ("xrootd", "dcache", "ceph", "conformance")
#: suites that need a POSIX mount: run once against file://<tmpdir>
POSIX_SUITES = ("gpfs",)
#: the logins tried on the embedded xrootd's root:// door besides the default (unix)
XROOTD_ROOT_LOGINS = tuple(login for login in embedded_class("xrootd").logins
                           if login != "unix")
#: why an embedded server does not apply to a POSIX suite
POSIX_REASON = ("the suite measures a POSIX mount (dd oflag=direct/dsync): an embedded "
                "server has no file:// door (its drivers refuse direct writes as "
                "'unsupported')")
#: a line of pytest -q progress: one character per test, maybe a percentage
PROGRESS_LINE = re.compile(r"^[.FEsxX]+(\s+\[\s*\d+%\])?\s*$")
#: the exit code of a usage error (pytest.ExitCode.USAGE_ERROR)
USAGE_ERROR = 4
#: how long a run may take to stop after SIGINT before its process group is killed
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class Combination:
    """One cell of the matrix: a suite against a server over a protocol with a login."""

    suite: str
    server: str
    protocol: str
    login: str = ""
    endpoint: str = ""

    @property
    def login_shown(self) -> str:
        """The login the run used: the plugin's default (unix) unless named."""
        if self.suite in POSIX_SUITES:
            return "-"
        return self.login or "unix"

    @property
    def slug(self) -> str:
        parts = [self.suite, self.server, self.protocol, self.login or "default"]
        return "-".join(p.replace("/", "_").replace(":", "") for p in parts)

    def pytest_args(self) -> list[str]:
        if self.endpoint:
            return ["--storage-endpoint", self.endpoint]
        args = ["--storage-embedded", self.server, "--storage-embedded-protocol", self.protocol]
        return args + (["--storage-embedded-login", self.login] if self.login else [])


@dataclass
class Counts:
    """Test outcomes read from one run's JUnit XML."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    xfailed: int = 0
    #: "test id: message" of the first failure or error ("" when none)
    first_failure: str = ""


@dataclass
class Result:
    """What one combination gave: outcome, counts, wall time and why (when not pass)."""

    combination: Combination
    outcome: str
    counts: Counts = field(default_factory=Counts)
    wall_s: float = 0.0
    load_1m: float = 0.0
    version: str = ""
    reason: str = ""


def combinations(only: str | None) -> list[Combination]:
    """Every combination to run (or list as n/a), suites in order."""
    chosen = [s for s in EMBEDDED_SUITES + POSIX_SUITES if only in (None, s)]
    found: list[Combination] = []
    for suite in chosen:
        if suite in POSIX_SUITES:
            found.append(Combination(suite, "file://", "file"))
            continue
        for kind in embedded_kinds():
            for scheme in embedded_class(kind).schemes:
                found.append(Combination(suite, kind, scheme))
                if kind == "xrootd" and scheme == "root":
                    found += [Combination(suite, kind, scheme, login)
                              for login in XROOTD_ROOT_LOGINS]
    return found


def read_junit(path: Path) -> Counts:
    """Count the test cases of a JUnit XML file by outcome (xfail is a skip of type
    ``pytest.xfail``)."""
    counts = Counts()
    for case in ET.parse(path).iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
        tags = {child.tag: child for child in case}
        bad = tags.get("failure") if "failure" in tags else tags.get("error")
        if bad is not None:
            counts.failed += bad.tag == "failure"
            counts.errors += bad.tag == "error"
            if not counts.first_failure:
                counts.first_failure = f"{test_id}: {failure_reason(bad)}"
        elif "skipped" in tags:
            kind = tags["skipped"].get("type", "")
            counts.xfailed += kind == "pytest.xfail"
            counts.skipped += kind != "pytest.xfail"
        else:
            counts.passed += 1
    return counts


def failure_reason(element: ET.Element) -> str:
    """A failure's first line without the exception's module, plus the thresholds
    table's violated rows (the part that says why)."""
    head = one_line(element.get("message", ""), limit=1000)
    exc, sep, rest = head.partition(": ")
    if sep and " " not in exc:
        head = f"{exc.rsplit('.', 1)[-1]}: {rest}"
    violated = [_violated_row(ln) for ln in (element.text or "").splitlines()
                if ln.rstrip().endswith("VIOLATED")]
    return one_line(" ".join([head, *violated[:2]]), limit=400)


def _violated_row(line: str) -> str:
    """``metric observed limit rule file VIOLATED`` as ``metric = observed (limit)``."""
    words = line.split()
    if len(words) < 4:
        return " ".join(words)
    return f"{words[0]} = {words[1]} (limit {words[2]} {words[3]})"


def progress_counts(output: str) -> Counts:
    """Outcomes so far from pytest's ``-q`` progress characters (for a run killed
    before it wrote its JUnit XML)."""
    counts = Counts()
    for line in output.splitlines():
        if PROGRESS_LINE.match(line):
            marks = line.split()[0]
            counts.passed += marks.count(".") + marks.count("X")
            counts.failed += marks.count("F")
            counts.errors += marks.count("E")
            counts.skipped += marks.count("s")
            counts.xfailed += marks.count("x")
    return counts


def one_line(text: str, limit: int = 240) -> str:
    """The first non-empty line of ``text``, credentials redacted, at most ``limit``."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = redact_url(line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def usage_reason(output: str) -> str:
    """The plugin's ``ERROR: ...`` paragraph of a refused run, as one line."""
    for line in output.splitlines():
        if line.startswith("ERROR:"):
            return one_line(line.removeprefix("ERROR:"))
    return one_line(output.strip().splitlines()[-1] if output.strip() else "")


def run_bounded(argv: list[str], log: Path, timeout: float) -> int | None:
    """Run ``argv`` with its output in ``log``; the exit code, None on timeout. Then
    SIGINT lets pytest stop its servers; after a grace, every process the run started
    (servers run in sessions of their own, so a process group would miss them) is
    terminated, then killed."""
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_run(proc)
            return None


def stop_run(proc: subprocess.Popen) -> None:
    """Interrupt a run, then end what is left of it and of its descendants."""
    try:
        started = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
    left = [p for p in started if p.is_running()]
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(left, timeout=10)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    proc.wait()


def timeout_reason(results_json: Path, timeout: float) -> str:
    """How far a run that timed out got, from the steps its JSON results recorded."""
    try:
        steps = json.loads(results_json.read_text())["steps"]
    except (OSError, ValueError, KeyError):
        steps = []
    if not steps:
        return f"no result within {timeout:.0f} s (no step recorded)"
    last = steps[-1]
    return (f"no result within {timeout:.0f} s: {len(steps)} steps recorded, the last "
            f"{last.get('test', '?')} ({last.get('duration_s') or 0:.0f}-s steps, "
            f"thresholds {shown_path(str(last.get('thresholds_file', '?')))})")


def shown_path(path: str) -> str:
    """``path`` relative to the checkout when it is inside it."""
    try:
        return str(Path(path).relative_to(ROOT))
    except ValueError:
        return path


def run_version(results_json: Path) -> str:
    """The storage version the run recorded in its JSON results ("" when absent)."""
    try:
        return str(json.loads(results_json.read_text())["run"].get("version") or "")
    except (OSError, ValueError, KeyError):
        return ""


def run_combination(combo: Combination, workdir: Path, scale: float,
                    timeout: float) -> Result:
    """Run one combination's suite and classify it."""
    stem = workdir / combo.slug
    junit, results, log = (stem.with_suffix(s) for s in (".xml", ".json", ".log"))
    argv = [sys.executable, "-m", "pytest", f"suites/{combo.suite}", *combo.pytest_args(),
            "--storage-scale", str(scale), "-p", "no:cacheprovider", "-q",
            "--storage-results", str(results), "--junitxml", str(junit)]
    for stale in (junit, results):
        stale.unlink(missing_ok=True)
    load_1m = os.getloadavg()[0]
    started = time.monotonic()
    code = run_bounded(argv, log, timeout)
    result = Result(combo, "fail", wall_s=time.monotonic() - started, load_1m=load_1m,
                    version=run_version(results))
    output = log.read_text(errors="replace")
    if code == USAGE_ERROR:
        result.outcome, result.reason = "n/a", usage_reason(output)
        return result
    if junit.exists():  # also written when a timed-out run stopped in its grace
        result.counts = read_junit(junit)
    elif code is None:
        result.counts = progress_counts(output)
    first = result.counts.first_failure
    if code is None:
        result.outcome = "timeout"
        result.reason = timeout_reason(results, timeout) + (f"; first failure {first}"
                                                            if first else "")
    elif code == 0 and junit.exists() and not (result.counts.failed or result.counts.errors):
        result.outcome = "pass"
    else:
        result.reason = first or f"exit {code}: {usage_reason(output)}"
    return result


def not_applicable(suite: str) -> list[Result]:
    """Rows for the embedded servers a POSIX suite does not run against."""
    return [Result(Combination(suite, kind, ", ".join(embedded_class(kind).schemes)),
                   "n/a", reason=POSIX_REASON)
            for kind in embedded_kinds()]


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(results: list[Result], header: RunHeader) -> str:
    """The matrix as Markdown: a table, then each failure's reason."""
    lines = [
        "# Compatibility matrix",
        "",
        f"Measured {header.date} on `{header.host}` (commit `{header.commit}`), "
        f"`--storage-scale {header.scale}`, each run bounded to {header.timeout:.0f} s; "
        f"load average at start {header.load}, {header.cpus} CPUs (a shared machine: "
        f"other jobs ran alongside). Total wall time {header.total_s / 60:.1f} min. "
        "Regenerate with `.venv/bin/python scripts/compat_matrix.py`.",
        "",
        "Outcome: **pass** = no failures and no errors; **fail**; **n/a** = not applicable "
        "(refused as a usage error, or the suite needs a POSIX mount); **timeout** = "
        "interrupted at the time bound (its counts are the tests finished by then). "
        "xfailed = known issues of the thresholds file (strict expected failures). "
        "Load = 1-minute load average when the run started.",
        "",
        "| suite | server | protocol | login | outcome | passed | failed | errors | skipped "
        "| xfailed | wall | load | version |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        c, n = r.combination, r.counts
        ran = r.outcome in ("pass", "fail", "timeout")
        counts = ([str(v) for v in (n.passed, n.failed, n.errors, n.skipped, n.xfailed)]
                  if ran else ["-"] * 5)
        wall = f"{r.wall_s:.0f} s" if r.wall_s else "-"
        load = f"{r.load_1m:.1f}" if r.wall_s else "-"
        lines.append("| " + " | ".join(cell(x) for x in (
            c.suite, c.server, c.protocol, c.login_shown, f"**{r.outcome}**",
            *counts, wall, load, r.version or "-")) + " |")
    lines += reasons_section(results)
    return "\n".join(lines) + "\n"


def reasons_section(results: list[Result]) -> list[str]:
    """One line per combination that did not pass: its first failure or refusal."""
    out: list[str] = []
    for title, wanted in (("Failures", ("fail", "timeout")), ("Not applicable", ("n/a",))):
        rows = [r for r in results if r.outcome in wanted]
        if not rows:
            continue
        out += ["", f"## {title}", ""]
        grouped: dict[tuple[str, str], list[str]] = {}
        for r in rows:
            c = r.combination
            who = f"{c.server} {c.protocol}" + (f" ({c.login})" if c.login else "")
            grouped.setdefault((c.suite, r.reason), []).append(who)
        out += [f"- {suite} x {'; '.join(whos)}: {reason}"
                for (suite, reason), whos in grouped.items()]
    return out


@dataclass(frozen=True)
class RunHeader:
    """When, where and how the matrix was measured."""

    date: str
    host: str
    commit: str
    load: str
    cpus: int
    scale: float
    timeout: float
    total_s: float = 0.0


def git_commit() -> str:
    """The checkout's short commit, with ``+dirty`` when tracked files changed."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=30).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=EMBEDDED_SUITES + POSIX_SUITES,
                        help="run one suite's rows only")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one run may take (default 300)")
    parser.add_argument("--scale", type=float, default=0.05,
                        help="--storage-scale of every run (default 0.05)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "compatibility.md"),
                        help="Markdown file to write ('-': print only)")
    parser.add_argument("--keep-logs", metavar="DIR",
                        help="keep every run's log, JUnit XML and JSON results in DIR")
    parser.add_argument("--clients", action="store_true",
                        help="measure the embedded xrootd's client release x server release "
                        "matrix instead (authentication scans and conformance checks)")
    parser.add_argument("--releases", default="5.5.3,6.2.1",
                        help="with --clients: the releases, each as client and as server "
                        "(default 5.5.3,6.2.1)")
    parser.add_argument("--check", choices=("auth", "conformance"),
                        help="with --clients: run one check's cells only")
    parser.add_argument("--client", metavar="RELEASE",
                        help="with --clients: run one client release's cells only (with "
                        "--keep-logs DIR: the other cells an earlier run kept in DIR are "
                        "shown as measured then)")
    parser.add_argument("--from-logs", metavar="DIR",
                        help="run nothing: render the runs a --keep-logs DIR holds (an "
                        "interrupted matrix); combinations without a log are 'not run'")
    return parser.parse_args(argv)


def from_logs(args: argparse.Namespace, workdir: Path) -> tuple[list[Result], RunHeader]:
    """The results an earlier ``--keep-logs`` run left in ``workdir``."""
    results: list[Result] = []
    logs = sorted(workdir.glob("*.log"), key=lambda p: p.stat().st_mtime)
    for combo in combinations(args.only):
        stem = workdir / combo.slug
        junit, log = stem.with_suffix(".xml"), stem.with_suffix(".log")
        if not log.exists():
            results.append(Result(combo, "not run", reason="the matrix run was stopped first"))
            continue
        output = log.read_text(errors="replace")
        result = Result(combo, "fail", version=run_version(stem.with_suffix(".json")))
        if junit.exists():
            result.counts = read_junit(junit)
            failed = result.counts.failed or result.counts.errors
            result.outcome = "fail" if failed else "pass"
            result.reason = result.counts.first_failure
        elif "ERROR:" in output and not PROGRESS_LINE.search(output):
            result.outcome, result.reason = "n/a", usage_reason(output)
        else:
            result.counts = progress_counts(output)
            result.outcome = "timeout"
            result.reason = "no JUnit XML: stopped at the time bound or with the matrix run"
        results.append(result)
    first, last = (logs[0].stat().st_mtime, logs[-1].stat().st_mtime) if logs else (0, 0)
    header = RunHeader(
        date=datetime.datetime.fromtimestamp(first, datetime.UTC).strftime(
            "%Y-%m-%d %H:%M UTC") + " (rendered from kept logs)",
        host=os.uname().nodename, commit=git_commit(), load="not recorded",
        cpus=os.cpu_count() or 0, scale=args.scale, timeout=args.timeout,
        total_s=last - first)
    return results, header


def measure(args: argparse.Namespace, workdir: Path) -> tuple[list[Result], RunHeader]:
    """Run every combination in order, printing one progress line per run."""
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    header = RunHeader(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        host=os.uname().nodename, commit=git_commit(), load=load,
        cpus=os.cpu_count() or 0, scale=args.scale, timeout=args.timeout)
    started = time.monotonic()
    results: list[Result] = []
    for combo in combinations(args.only):
        if combo.suite in POSIX_SUITES:
            area = workdir / f"{combo.suite}-area"
            area.mkdir(exist_ok=True)
            combo = Combination(combo.suite, combo.server, combo.protocol,
                                endpoint=area.as_uri())
        result = run_combination(combo, workdir, args.scale, args.timeout)
        results.append(result)
        print(f"{combo.slug}: {result.outcome} in {result.wall_s:.0f} s "
              f"(load {result.load_1m:.1f}) {result.reason}", file=sys.stderr, flush=True)
        if combo.suite in POSIX_SUITES:
            results += not_applicable(combo.suite)
    total = time.monotonic() - started
    return results, RunHeader(**{**header.__dict__, "total_s": total})


# -- the client x server release matrix (--clients) --------------------------------------

#: the logins of the authentication scans in the client x server matrix
CLIENT_MATRIX_LOGINS = ("unix", "gsi")
#: each authentication step's length in the client x server matrix (the plans differ:
#: 5.x.toml's auth_gsi 10 s, 6.x.toml's 100 s; one length measures every cell alike)
CLIENT_MATRIX_STEP_S = 10.0


@dataclass(frozen=True)
class ReleaseCell:
    """One run of the client x server matrix: a check against a server release with a
    client release ("" for either: the installed one)."""

    client: str
    server: str
    check: str  # "auth" or "conformance"
    login: str = "unix"

    @property
    def slug(self) -> str:
        # no dot: the files' suffixes (.json, .xml) replace what follows the last one
        return "-".join(("clients", self.client or "installed", self.server or "installed",
                         self.check, self.login)).replace(".", "_")

    def argv(self, results: Path, junit: Path, scale: float) -> list[str]:
        suite, chosen = (("suites/xrootd", ["-k", f"auth_rate_{self.login}",
                                            "--storage-duration", f"{CLIENT_MATRIX_STEP_S:g}"])
                         if self.check == "auth" else ("suites/conformance", []))
        return [sys.executable, "-m", "pytest", suite, *chosen, "--storage-embedded", "xrootd",
                *(["--storage-embedded-login", self.login] if self.login != "unix" else []),
                *(["--storage-embedded-version", self.server] if self.server else []),
                "--storage-scale", str(scale), "-p", "no:cacheprovider", "-q",
                "--storage-results", str(results), "--junitxml", str(junit)]

    def environment(self) -> dict[str, str]:
        from pytest_storagescale.servers.xrootd_releases import CLIENT_VARIABLE

        env = {k: v for k, v in os.environ.items() if k != CLIENT_VARIABLE}
        return {**env, CLIENT_VARIABLE: self.client} if self.client else env


@dataclass
class ReleaseResult:
    """What one client x server run gave: outcome, counts, the steps' rates, and the
    client and server versions the run recorded."""

    cell: ReleaseCell
    outcome: str
    counts: Counts = field(default_factory=Counts)
    #: (clients, logins/s, p99 s, failed, hung) per authentication step
    steps: list[tuple[int, float, float, int, int]] = field(default_factory=list)
    client_version: str = ""
    server_version: str = ""
    wall_s: float = 0.0
    load_1m: float = 0.0
    reason: str = ""


def release_cells(clients: list[str], servers: list[str]) -> list[ReleaseCell]:
    """Every run of the client x server matrix: per server, per client, the
    authentication scans (one per login), then the conformance checks."""
    return [ReleaseCell(client, server, check, login)
            for server in servers for client in clients
            for check, login in [*(("auth", login) for login in CLIENT_MATRIX_LOGINS),
                                 ("conformance", "unix")]]


def read_release_results(path: Path) -> tuple[str, str, list[tuple[int, float, float, int, int]]]:
    """The client library (``xrootd`` of the run's client versions), the server version
    and each load step's (clients, rate, p99, failed, hung) from a run's JSON results."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return "", "", []
    run = data.get("run") or {}
    client = str(((run.get("client") or {}).get("versions") or {}).get("xrootd") or "")
    steps = [(int(step.get("clients") or 0), float(step.get("rate_hz") or 0.0),
              float((step.get("latency_s") or {}).get("p99") or 0.0),
              int(step.get("failed") or 0),
              int(step.get("hung") or 0))
             for step in data.get("steps") or [] if "rate_hz" in step]
    return client, str(run.get("version") or ""), steps


def run_release_cell(cell: ReleaseCell, workdir: Path, scale: float,
                     timeout: float) -> ReleaseResult:
    """Run one client x server cell and classify it (as :func:`run_combination`)."""
    stem = workdir / cell.slug
    junit, results, log = (stem.with_suffix(s) for s in (".xml", ".json", ".log"))
    for stale in (junit, results):
        stale.unlink(missing_ok=True)
    load_1m, started = os.getloadavg()[0], time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(cell.argv(results, junit, scale), cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=cell.environment())
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_run(proc)
            code = None
    client, server, steps = read_release_results(results)
    result = ReleaseResult(cell, "fail", wall_s=time.monotonic() - started, load_1m=load_1m,
                           client_version=client, server_version=server, steps=steps)
    output = log.read_text(errors="replace")
    if code == USAGE_ERROR:
        result.outcome, result.reason = "n/a", usage_reason(output)
        return result
    if junit.exists():
        result.counts = read_junit(junit)
    wanted = cell.client or installed_client()
    if code is None:
        result.outcome = "timeout"
        result.reason = timeout_reason(results, timeout)
    elif client and client != wanted:
        result.reason = f"the run's client library was xrootd {client}, not {wanted}"
    elif code == 0 and junit.exists() and not (result.counts.failed or result.counts.errors):
        result.outcome = "pass"
    else:
        result.reason = result.counts.first_failure or f"exit {code}: {usage_reason(output)}"
    stem.with_suffix(".cell.json").write_text(json.dumps({
        "outcome": result.outcome, "reason": result.reason, "wall_s": result.wall_s,
        "load_1m": result.load_1m}))
    return result


def kept_release_result(cell: ReleaseCell, workdir: Path) -> ReleaseResult | None:
    """A cell an earlier ``--clients --keep-logs DIR`` run measured (None: not run)."""
    stem = workdir / cell.slug
    try:
        kept = json.loads(stem.with_suffix(".cell.json").read_text())
    except (OSError, ValueError):
        return None
    client, server, steps = read_release_results(stem.with_suffix(".json"))
    junit = stem.with_suffix(".xml")
    return ReleaseResult(cell, str(kept["outcome"]),
                         read_junit(junit) if junit.exists() else Counts(), steps, client,
                         server, float(kept["wall_s"]), float(kept["load_1m"]),
                         str(kept["reason"]))


def installed_client() -> str:
    """The installed XRootD bindings' version (the client of a run without the variable)."""
    from pytest_storagescale.servers.xrootd_releases import installed_client_version

    return installed_client_version() or "installed"


def render_releases(results: list[ReleaseResult], header: RunHeader) -> str:
    """The client x server matrix as Markdown: the logins/s table, the conformance
    table, then each failure's reason."""
    lines = [
        "# XRootD client release x server release",
        "",
        f"Measured {header.date} on `{header.host}` (commit `{header.commit}`), the "
        f"embedded xrootd, authentication steps of {CLIENT_MATRIX_STEP_S:g} s "
        f"(`--storage-duration`), `--storage-scale {header.scale}`, each run bounded to "
        f"{header.timeout:.0f} s; load average at start {header.load}, {header.cpus} CPUs "
        f"(a shared machine). Total wall time {header.total_s / 60:.1f} min. Regenerate "
        "with `.venv/bin/python scripts/compat_matrix.py --clients`. Client: the XRootD "
        "library the run recorded (`STORAGESCALE_XROOTD_CLIENT`); server: the embedded "
        "xrootd's version.",
        "",
        "| check | client | server | clients | logins/s | p99 | failed | hung | outcome |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        if r.cell.check != "auth":
            continue
        who = [f"auth {r.cell.login}", r.client_version or r.cell.client or "-",
               r.server_version or r.cell.server or "-"]
        rows = r.steps or [(0, 0.0, 0.0, 0, 0)]
        for clients, rate, p99, failed, hung in rows:
            measured = ([str(clients), f"{rate:.2f}", f"{p99:.2f} s", str(failed), str(hung)]
                        if r.steps else ["-"] * 5)
            lines.append("| " + " | ".join(cell(x) for x in (
                *who, *measured, f"**{r.outcome}**")) + " |")
    lines += ["", "| check | client | server | passed | failed | errors | skipped | xfailed "
              "| wall | outcome |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if r.cell.check != "conformance":
            continue
        n = r.counts
        lines.append("| " + " | ".join(cell(x) for x in (
            "conformance", r.client_version or r.cell.client or "-",
            r.server_version or r.cell.server or "-",
            *(str(v) for v in (n.passed, n.failed, n.errors, n.skipped, n.xfailed)),
            f"{r.wall_s:.0f} s", f"**{r.outcome}**")) + " |")
    bad = [r for r in results if r.outcome != "pass"]
    if bad:
        lines += ["", "## Not passed", ""]
        lines += [f"- {r.cell.check} {r.cell.login} client {r.client_version or r.cell.client} "
                  f"x server {r.server_version or r.cell.server}: {r.outcome}: {r.reason}"
                  for r in bad]
    return "\n".join(lines) + "\n"


def measure_releases(args: argparse.Namespace,
                     workdir: Path) -> tuple[list[ReleaseResult], RunHeader]:
    """Run every cell of the client x server matrix, one progress line per run."""
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    header = RunHeader(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        host=os.uname().nodename, commit=git_commit(), load=load,
        cpus=os.cpu_count() or 0, scale=args.scale, timeout=args.timeout)
    started = time.monotonic()
    releases = [r.strip() for r in args.releases.split(",")]
    installed = installed_client()
    # a client release by its name ("": the installed bindings, no variable set); a
    # server release as --storage-embedded-version takes it (the installed one by name)
    clients = [("" if r == installed else r) for r in releases]
    results = []
    for cell_ in release_cells(clients, releases):
        if (args.check and cell_.check != args.check) or (
                args.client and cell_.client != ("" if args.client == installed
                                                 else args.client)):
            kept = kept_release_result(cell_, workdir)
            if kept is not None:  # measured by an earlier run into the same folder
                results.append(kept)
            continue
        if args.from_logs:
            kept = kept_release_result(cell_, workdir)
            results.append(kept or ReleaseResult(cell_, "not run",
                                                 reason="not in the kept logs"))
            continue
        result = run_release_cell(cell_, workdir, args.scale, args.timeout)
        results.append(result)
        rates = ", ".join(f"{c}: {rate:.2f}/s" for c, rate, *_ in result.steps)
        print(f"{cell_.slug}: {result.outcome} in {result.wall_s:.0f} s (load "
              f"{result.load_1m:.1f}; client {result.client_version}, server "
              f"{result.server_version}) {rates} {result.reason}", file=sys.stderr, flush=True)
    total = time.monotonic() - started
    return results, RunHeader(**{**header.__dict__, "total_s": total})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.clients:
        if args.from_logs:
            found, header = measure_releases(args, Path(args.from_logs))
        elif args.keep_logs:
            Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
            found, header = measure_releases(args, Path(args.keep_logs))
        else:
            with tempfile.TemporaryDirectory(prefix="compat-clients-") as tmp:
                found, header = measure_releases(args, Path(tmp))
        text = render_releases(found, header)
        print(text)
        if args.output not in ("-", str(ROOT / "docs" / "compatibility.md")):
            Path(args.output).write_text(text)
        # 1 when a cell measured nothing: an authentication run without a step, a run
        # refused or stopped at the time bound
        unmeasured = [r for r in found if r.outcome in ("n/a", "timeout")
                      or (r.cell.check == "auth" and not r.steps)]
        return 1 if unmeasured else 0
    if args.from_logs:
        results, header = from_logs(args, Path(args.from_logs))
    elif args.keep_logs:
        Path(args.keep_logs).mkdir(parents=True, exist_ok=True)
        results, header = measure(args, Path(args.keep_logs))
    else:
        with tempfile.TemporaryDirectory(prefix="compat-matrix-") as tmp:
            results, header = measure(args, Path(tmp))
    text = render(results, header)
    print(text)
    if args.output != "-":
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
