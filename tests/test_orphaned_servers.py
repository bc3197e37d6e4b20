"""Embedded servers whose pytest process died (SIGKILL, a crash in a native library)
are stopped by the next server start on the host, and nothing else is: not a live
run's server, not a process outside a recorded directory, not a file a link points to.

Each test works in a private temporary folder (``tempfile.tempdir`` and ``TMPDIR``), so
the other xdist worker's server starts, which clean the shared one, never see it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from pytest_storagescale.endpoints import processes
from pytest_storagescale.endpoints.processes import server_directory, stop_orphaned_servers

REPO = Path(__file__).resolve().parent.parent

LEAVE_A_SERVER = """
import os
from pytest_storagescale.endpoints.embedded import EmbeddedXRootD

server = EmbeddedXRootD(https=False).start()
print(server.process.pid, server.port, server.directory, flush=True)
os._exit(0)  # dies without stopping it, as a killed pytest would
"""


@pytest.fixture
def private_tmp(monkeypatch, tmp_path_factory):
    tmp_path_factory.getbasetemp()  # pytest's own temporary folders stay where they are
    folder = Path(tempfile.mkdtemp(prefix="ss-orphans-test-"))
    folder.chmod(0o755)  # an xrootd run as its unprivileged user (under root) passes
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    processes.STOPPED_ORPHANS.clear()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return False
    return True


def _sleeper(cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "120"], cwd=cwd)


def _record(registry_owner_pid: int, directory: Path, started: float) -> None:
    """A registry record as :func:`server_directory` writes it, with a chosen owner."""
    registry = Path(tempfile.gettempdir()) / f"storagescale-servers-{os.getuid()}"
    registry.mkdir(mode=0o700, exist_ok=True)
    (registry / f"{directory.name}.json").write_text(
        f'{{"directory": "{directory}", "pid": {registry_owner_pid}, '
        f'"started": {started}, "host": "{socket.gethostname()}"}}')


def test_a_server_left_by_a_dead_run_is_stopped_by_the_next_session(private_tmp, pytester):
    """A process starts the embedded xrootd and dies without stopping it: the server
    still answers. The next session's own server start stops it, removes its
    directory, and the summary names it."""
    left = subprocess.run([sys.executable, "-c", LEAVE_A_SERVER], capture_output=True,
                          text=True, timeout=120, cwd=REPO, check=True)
    pid, port, directory = left.stdout.split()
    pid, port, directory = int(pid), int(port), Path(directory)
    assert directory.parent == private_tmp and directory.is_dir()
    assert not _gone(pid) and _answers(port), "the orphan is not running: nothing to test"

    pytester.makepyfile(test_s="""
        def test_stat(storage_endpoint):
            storage_endpoint.client("after", timeout=10).stat(storage_endpoint.run_dir)
    """)
    result = pytester.runpytest(f"--storage-thresholds={REPO / 'thresholds'}",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"storagescale: stopped an embedded server that a dead run had left running: "
        f"{directory} (owner pid * gone; killed: *{pid}*)",
    ])
    assert _gone(pid)
    assert not directory.exists()
    assert not _answers(port)


def test_only_orphans_are_stopped_and_nothing_outside_is_touched(private_tmp, tmp_path):
    """Three recorded directories: one whose owner pid was handed to another process
    (a different start time: the owner is gone), one of a live owner, one outside the
    temporary folder. Only the first one's process is killed and only it is removed;
    a link inside it is removed, not followed; a process elsewhere lives on."""
    outside_file = tmp_path / "keep.txt"
    outside_file.write_text("not the plugin's")
    orphan = server_directory("gridftp")
    (orphan / "link").symlink_to(outside_file)
    live = server_directory("apache")  # recorded with this (running) process as owner
    elsewhere = tmp_path / "storagescale-xrootd-not-in-tmp"
    elsewhere.mkdir()
    _record(os.getpid(), orphan, started=1.0)  # this pid, but not this process's start
    _record(999_999_999, elsewhere, started=1.0)  # no such process, but not a server dir
    in_orphan, in_live, in_elsewhere, bystander = (
        _sleeper(orphan), _sleeper(live), _sleeper(elsewhere), _sleeper(tmp_path))
    try:
        stopped = stop_orphaned_servers()
        assert [(o.directory, o.killed) for o in stopped] == [(str(orphan), (in_orphan.pid,))]
        in_orphan.wait(timeout=10)  # reaped already by the stop (it is this test's child)
        assert _gone(in_orphan.pid)
        assert not orphan.exists() and outside_file.read_text() == "not the plugin's"
        for survivor in (in_live, in_elsewhere, bystander):
            assert survivor.poll() is None
        assert live.is_dir() and elsewhere.is_dir()
        assert stop_orphaned_servers() == []  # the live owner's server stays
    finally:
        for process in (in_orphan, in_live, in_elsewhere, bystander):
            process.kill()
            process.wait()
        shutil.rmtree(live, ignore_errors=True)


def test_a_registry_that_is_not_this_users_folder_is_ignored(private_tmp, tmp_path):
    """The registry path made a link to another folder (which a record there would
    name): its records are not read, nothing is killed."""
    elsewhere = tmp_path / "registry"
    elsewhere.mkdir()
    (private_tmp / f"storagescale-servers-{os.getuid()}").symlink_to(elsewhere)
    victim_dir = private_tmp / "storagescale-gridftp-planted"
    victim_dir.mkdir()
    (elsewhere / f"{victim_dir.name}.json").write_text(
        f'{{"directory": "{victim_dir}", "pid": 999999999, "started": 1.0, '
        f'"host": "{socket.gethostname()}"}}')
    victim = _sleeper(victim_dir)
    try:
        assert stop_orphaned_servers() == []
        assert victim.poll() is None and victim_dir.is_dir()
    finally:
        victim.kill()
        victim.wait()
