"""SIGTERM stops a run as Ctrl-C does, and an interrupted step keeps what it measured
(issue 31, items 7 and 8).

Each test runs pytest in a subprocess against a real xrootd (the embedded one, or one
this test starts and names as a remote endpoint), with the default executor (the
xrootd clients in one spawned process), waits until its 60 s step has measured, then
signals it the way ``timeout``, a CI runner or a terminal does. Bounds carry generous
slack: they prove a deadline, not this machine's speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faults import progress_conftest

from pytest_storagescale.servers.xrootd import EmbeddedXRootD

#: what a loaded 2-core machine may add to a bound
SLACK = 15.0

PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[ops.stat]
clients = [4]
duration = "60s"
hang_timeout = "30s"

[[ops.stat.expect]]
rules = ["failed == 0"]
"""

SUITE = """
from pathlib import Path

import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients, storage_embedded_server):
    if storage_embedded_server is not None:  # which server is this run's
        Path("server.pid").write_text(str(storage_embedded_server.pid))
    storage_load.run()

def test_after():
    pass
"""

#: a file appears once the step has measured a success
MARKING_CONFTEST = progress_conftest("""\
if state.succeeded > 0:
    Path("measuring").touch()""", imports="from pathlib import Path")


def _default_signals() -> None:
    """In the child before exec: SIGINT and SIGTERM handled by default and not
    blocked (an xdist worker running this test ignores SIGINT), in a process group of
    its own (a terminal's Ctrl-C goes to the group)."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    os.setpgrp()


def _start(folder: Path, *options: str) -> subprocess.Popen:
    (folder / "thr" / "xrootd").mkdir(parents=True)
    (folder / "thr" / "xrootd" / "t.toml").write_text(PLAN)
    (folder / "test_suite.py").write_text(SUITE)
    (folder / "conftest.py").write_text(MARKING_CONFTEST)
    command = [sys.executable, "-X", "faulthandler", "-m", "pytest", "test_suite.py",
               "-p", "no:cacheprovider", "--storage-version=5.5.3",
               "--storage-thresholds=thr", "--storage-results=r.json", *options]
    return subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=_default_signals)


def _wait_measuring(child: subprocess.Popen, folder: Path) -> None:
    deadline = time.monotonic() + 240  # the first step may build the compiled loop
    while (not (folder / "measuring").exists() and child.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.2)
    assert (folder / "measuring").exists(), "the step never measured a success"
    time.sleep(2.0)  # a few seconds of measurement to keep


def _signal_and_wait(child: subprocess.Popen, number: int, *, group: bool = False
                     ) -> tuple[str, float]:
    """Send ``number`` (to the process group: a terminal's Ctrl-C); the output and the
    seconds to the exit."""
    sent = time.monotonic()
    if group:
        os.killpg(child.pid, number)
    else:
        child.send_signal(number)
    try:
        output, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return output, time.monotonic() - sent


def _children(pid: int) -> dict[int, str]:
    """Every process below ``pid``: pid -> its command name."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm, rest = (entry / "stat").read_text().rsplit(")", 1)
        except (FileNotFoundError, ProcessLookupError):
            continue
        parents[int(entry.name)] = (int(rest.split()[1]), comm.partition("(")[2])
    below, found = {pid}, {}
    while True:
        new = {p: name for p, (parent, name) in parents.items()
               if parent in below and p not in below}
        if not new:
            return found
        below |= set(new)
        found.update(new)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _assert_interrupted(folder: Path, output: str, returncode: int, *,
                        serial: bool = True) -> dict:
    assert returncode == 2, output[-4000:]  # pytest's "interrupted"
    # the summary was written: the storagescale table with the step, the results file
    assert "storagescale: xrootd 5.5.3 at root://" in output, output[-4000:]
    assert any(line.startswith("stat ") and line.rstrip().endswith("interrupted")
               for line in output.splitlines()), output[-4000:]
    results = json.loads((folder / "r.json").read_text())
    [step] = results["steps"]
    assert step["verdict"] == "interrupted", step
    assert step["succeeded"] > 0 and 0.5 < step["duration_s"] < 58, step
    tests = {test["nodeid"]: test["outcome"] for test in results["tests"]}
    assert tests["test_suite.py::test_stat[c4]"] == "interrupted", tests
    if serial:  # (under xdist another worker runs it meanwhile)
        assert "test_suite.py::test_after" not in tests, tests
    return step


def test_sigterm_ends_the_run_as_ctrl_c_does(tmp_path):
    child = _start(tmp_path, "-p", "no:xdist")
    _wait_measuring(child, tmp_path)
    server = int((tmp_path / "server.pid").read_text())
    output, exited_s = _signal_and_wait(child, signal.SIGTERM)
    step = _assert_interrupted(tmp_path, output, child.returncode)
    assert "interrupted (SIGTERM) after" in step["error"], step
    assert exited_s < SLACK, f"pytest ended {exited_s:.1f} s after SIGTERM:\n{output}"
    assert not _alive(server), f"the embedded xrootd {server} was left running"


def test_sigterm_to_the_xdist_controller_stops_its_workers(tmp_path):
    child = _start(tmp_path, "-n", "2")
    _wait_measuring(child, tmp_path)
    below = _children(child.pid)  # the workers, their client processes, the server
    servers = [pid for pid, name in below.items() if name == "xrootd"]
    output, exited_s = _signal_and_wait(child, signal.SIGTERM)
    _assert_interrupted(tmp_path, output, child.returncode, serial=False)
    assert exited_s < SLACK + 10, f"pytest ended {exited_s:.1f} s after SIGTERM:\n{output}"
    assert servers, below
    deadline = time.monotonic() + 10  # multiprocessing's resource tracker ends at EOF
    while (left := {pid: name for pid, name in below.items() if _alive(pid)}) and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left running after the controller's exit: {left}"


@pytest.fixture
def remote():
    """An xrootd the run names with --storage-endpoint: a remote storage to it (the
    gfal2 driver is started in pytest's main thread at the first step, as against any
    remote storage; its import left every signal blocked there)."""
    with EmbeddedXRootD(https=False) as started:
        yield started


def test_ctrl_c_against_a_remote_endpoint_keeps_what_was_measured(tmp_path, remote):
    child = _start(tmp_path, "-p", "no:xdist", f"--storage-endpoint={remote.url}")
    _wait_measuring(child, tmp_path)
    output, exited_s = _signal_and_wait(child, signal.SIGINT, group=True)
    # before the fix: "interrupted (Ctrl-C) after 1e-06 s of measurement", 0 operations
    step = _assert_interrupted(tmp_path, output, child.returncode)
    assert "interrupted (Ctrl-C) after" in step["error"], step
    assert exited_s < SLACK, f"pytest ended {exited_s:.1f} s after Ctrl-C:\n{output}"


def test_sigterm_with_a_frozen_server_exits_within_seconds(tmp_path):
    child = _start(tmp_path, "-p", "no:xdist")
    _wait_measuring(child, tmp_path)
    server = int((tmp_path / "server.pid").read_text())
    os.kill(server, signal.SIGSTOP)  # every request in flight now waits
    try:
        output, exited_s = _signal_and_wait(child, signal.SIGTERM)
    finally:
        if _alive(server):
            os.kill(server, signal.SIGCONT)
    assert child.returncode == 2, output[-4000:]
    results = json.loads((tmp_path / "r.json").read_text())
    [step] = results["steps"]
    assert step["verdict"] == "interrupted" and step["succeeded"] > 0, step
    # the client processes' report (0.5 s), the server's last report (1 s), the probes
    # before the step's and the session's clean-up (1 s each), the server's stop: 4.7 s
    # measured; 86 s before (hang_timeout 30 s on each request, the server's 5 s grace)
    print(f"pytest exited {exited_s:.1f} s after SIGTERM with a frozen server")
    assert exited_s < 5 + SLACK, f"pytest ended {exited_s:.1f} s after SIGTERM:\n{output}"
    assert not _alive(server), f"the embedded xrootd {server} was left running"
