"""``python -m pytest_storagescale.servers.serve KIND`` (issue 31, item 19): one embedded
server started once and kept until SIGTERM, the suites pointed at it as at one's own
door through the env file it writes. With the embedded xrootd (seconds to start); the
same module serves the embedded dCache (docs/servers.md, measured there)."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "pytest_storagescale.servers.serve"]


def _read_env(path: Path) -> dict[str, str]:
    """The settings of the env file, as a shell that sources it would have them."""
    done = subprocess.run(["sh", "-c", f". {path} && env -0"], capture_output=True,
                          check=True, timeout=30)
    pairs = (item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    return {name: value for name, value in pairs if name.startswith("STORAGESCALE_")}


def _lines_until(process: subprocess.Popen, last: str, limit: float = 120.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if last in line:
            return lines
    raise AssertionError(f"no {last!r} within {limit} s: {lines}")


def test_a_served_xrootd_is_one_door_the_suites_reach_until_sigterm(pytester):
    # started with SIGINT and SIGTERM blocked, as a process spawned by a thread that made
    # a gfal2 context inherits them (CI: it ignored SIGTERM for 60 s, then was killed)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        process = subprocess.Popen([*COMMAND, "xrootd"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        said = _lines_until(process, "Ctrl-C or SIGTERM stops it.")
        [env_line] = [line for line in said if line.startswith("settings")]
        env = Path(env_line.rsplit(" ", 1)[1])
        assert stat.S_IMODE(env.stat().st_mode) == 0o600
        assert stat.S_IMODE(env.parent.stat().st_mode) == 0o700
        settings = _read_env(env)
        endpoint = settings["STORAGESCALE_ENDPOINT"]
        assert endpoint.startswith("root://") and "root=" in settings["STORAGESCALE_DOORS"]
        assert endpoint in said[0] or endpoint.replace("root://", "") in said[0], said
        port = int(re.search(r":(\d+)/", endpoint).group(1))
        # a run pointed at it, as docs/servers.md says: its settings from the env file
        result = subprocess.run(
            [sys.executable, "-m", "pytest", str(REPO / "suites" / "conformance"),
             "-p", "no:cacheprovider", "-q", "-k", "put_get_checksum"],
            env={**os.environ, **settings}, cwd=pytester.path, capture_output=True,
            text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"storagescale: endpoint {endpoint}" in result.stdout, result.stdout
        assert re.search(r"\b2 passed\b", result.stdout), result.stdout  # root and davs
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not env.exists() and not env.parent.exists()
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))  # the server went with it


@pytest.mark.parametrize(("argv", "message"), [
    (["nope"], "argument kind: invalid choice: 'nope'"),
    (["xrootd", "--version", "0.1"], "0.1"),
])
def test_bad_input_is_one_paragraph_and_exit_4(argv, message):
    done = subprocess.run([*COMMAND, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stderr.startswith("ERROR: ") and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
