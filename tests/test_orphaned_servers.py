"""Embedded servers whose pytest process died (SIGKILL, a crash in a native library)
are stopped by the next server start on the host, and nothing else is: not a live
run's server (its owner in another process), not a process outside a recorded
directory or merely naming a similar path, not a process of the cleaner's own session,
not a file a link points to; a malformed record is ignored, not a traceback.

Each test works in a private temporary folder (``tempfile.tempdir`` and ``TMPDIR``), so
the other xdist worker's server starts, which clean the shared one, never see it."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from pytest_storagescale.servers import orphans
from pytest_storagescale.servers.orphans import server_directory, stop_orphaned_servers

REPO = Path(__file__).resolve().parent.parent

LEAVE_A_SERVER = """
import os
from pytest_storagescale.servers.xrootd import EmbeddedXRootD

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
    orphans.STOPPED_ORPHANS.clear()
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


def _registry() -> Path:
    """The registry where README says it is (the plugin's own answer, checked)."""
    folder = Path(tempfile.gettempdir()) / f"storagescale-servers-{os.getuid()}"
    assert orphans._registry() == folder
    return folder


def _orphan_it(directory: Path) -> None:
    """Make the record of ``directory`` name an owner that is gone (another start)."""
    path = _registry() / f"{directory.name}.json"
    record = json.loads(path.read_text())
    record["identity"] = "another-boot:1"
    path.write_text(json.dumps(record))


def _sleeper(cwd: Path, *, own_session: bool = True, args: tuple[str, ...] = ()
             ) -> subprocess.Popen:
    """A stand-in for a server process (servers start in a session of their own)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *args],
                            cwd=cwd, start_new_session=own_session)


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
    line = [text for text in result.outlines if "left by a dead run" in text]
    assert len(line) == 1, result.stdout.str()
    assert re.fullmatch(
        rf"storagescale: stopped an embedded server left by a dead run: {directory} "
        rf"\(its owner, pid \d+, is gone; killed ([\d, ]*\b{pid}\b[\d, ]*)\)", line[0])
    assert _gone(pid)
    assert not directory.exists()
    log = (_registry() / "stopped.log").read_text()  # traceable after the summary too
    assert re.search(rf"stopped {directory} \(its owner, pid \d+, is gone; killed "
                     rf"[\d, ]*\b{pid}\b", log), log


def test_only_orphans_are_stopped_and_nothing_outside_is_touched(private_tmp, tmp_path):
    """An orphan's directory (its record names an owner that is gone) with a server in a
    session of its own, a command of this test's session working there, and a link to
    a file outside; a live owner's directory, recorded by another running process; a
    process naming a path that only starts like the orphan's; a record of a directory
    outside the temporary folder. Only the orphan's server is killed and only its
    directory is removed, the link's target kept."""
    outside_file = tmp_path / "keep.txt"
    outside_file.write_text("not the plugin's")
    live_owner = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from pytest_storagescale.servers.orphans import server_directory\n"
         "print(server_directory('apache'), flush=True)\ntime.sleep(120)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    live = Path(live_owner.stdout.readline().strip())
    # after the live owner's own server start, which would have cleaned it
    orphan = server_directory("gridftp")
    (orphan / "link").symlink_to(outside_file)
    _orphan_it(orphan)
    elsewhere = tmp_path / "storagescale-xrootd-not-in-tmp"
    elsewhere.mkdir()
    (_registry() / f"{elsewhere.name}.json").write_text(json.dumps({
        "directory": str(elsewhere), "device": elsewhere.stat().st_dev,
        "inode": elsewhere.stat().st_ino, "pid": 999_999_999, "identity": "x:1",
        "namespace": os.stat("/proc/self/ns/pid").st_ino, "host": socket.gethostname()}))
    server = _sleeper(orphan)
    spared = [_sleeper(orphan, own_session=False), _sleeper(live), _sleeper(elsewhere),
              _sleeper(tmp_path, args=(f"{orphan}-other/file", f"/x{orphan}/file"))]
    try:
        assert live.parent == private_tmp and live.is_dir()
        stopped = stop_orphaned_servers()
        assert [(o.directory, o.killed) for o in stopped] == [(str(orphan), (server.pid,))]
        server.wait(timeout=10)  # reaped already by the stop (it is this test's child)
        assert _gone(server.pid)
        assert not orphan.exists() and outside_file.read_text() == "not the plugin's"
        for process in spared:
            assert process.poll() is None
        assert live.is_dir() and elsewhere.is_dir()
        assert stop_orphaned_servers() == []
        assert live_owner.poll() is None
    finally:
        for process in (server, *spared, live_owner):
            process.kill()
            process.wait()
        shutil.rmtree(live, ignore_errors=True)


def test_an_owner_that_is_a_zombie_is_gone(private_tmp):
    """The owner died and nobody reaped it yet (a zombie still has its pid and start
    time): its servers are stopped all the same."""
    owner = subprocess.Popen(
        [sys.executable, "-c", "from pytest_storagescale.servers.orphans import "
         "server_directory\nprint(server_directory('xrootd'), flush=True)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    directory = Path(owner.stdout.readline().strip())
    deadline = time.monotonic() + 60
    while (psutil.Process(owner.pid).status() != psutil.STATUS_ZOMBIE
           and time.monotonic() < deadline):
        time.sleep(0.01)  # it exits right after printing; not reaped: a zombie
    assert psutil.Process(owner.pid).status() == psutil.STATUS_ZOMBIE
    server = _sleeper(directory)
    try:
        stopped = stop_orphaned_servers()
        assert [(o.directory, o.owner_pid, o.killed) for o in stopped] == [
            (str(directory), owner.pid, (server.pid,))]
        assert not directory.exists()
    finally:
        server.kill()
        server.wait()
        owner.wait()


def test_malformed_records_are_ignored(private_tmp):
    """Records a person or a crash could leave: wrong types, a negative or infinite
    pid, a NUL in the path, not JSON. No traceback, nothing stopped, the next server
    directory is made."""
    registry = _registry()
    registry.mkdir(mode=0o700, exist_ok=True)
    for number, text in enumerate([
        '{"directory": "/tmp/x", "pid": -1, "identity": "a", "device": 1, "inode": 1}',
        '{"directory": "/tmp/x", "pid": 1e400, "identity": "a", "device": 1, "inode": 1}',
        '{"directory": "/tmp/x\\u0000y", "pid": 5, "identity": "a", "device": 1, "inode": 1}',
        '{"directory": ["/tmp"], "pid": 5, "identity": "a", "device": 1, "inode": 1}',
        '{"pid": NaN}', "not json", "[]",
    ]):
        (registry / f"storagescale-xrootd-bad{number}.json").write_text(text)
    assert stop_orphaned_servers() == []
    shutil.rmtree(server_directory("xrootd"))


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


def _with_terminal(cwd: Path) -> subprocess.Popen:
    """A person's shell stand-in: a session leader with a controlling terminal."""
    import pty

    controller, terminal = pty.openpty()
    name = os.ttyname(terminal)
    os.close(terminal)

    def take_terminal() -> None:  # in the child: a session leader opening a tty owns it
        os.close(os.open(name, os.O_RDWR))

    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               cwd=cwd, start_new_session=True, preexec_fn=take_terminal)
    process.controller = controller  # kept open: the terminal lives while the test does
    return process


def test_a_live_runs_process_and_a_persons_shell_in_an_orphans_directory_are_spared(
        private_tmp):
    """In an orphan's directory: its server (killed); a process a live run started in a
    session of its own (a live owner's server that names or works in that path: its
    parent is the live owner, where an orphan's is whatever reaps orphans); and a shell
    with a controlling terminal that a person ``cd``-ed there (a session leader working
    in it: the session rule alone killed it). Only the server is killed."""
    live_owner = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         "from pytest_storagescale.servers.orphans import server_directory\n"
         "print(server_directory('apache'), flush=True)\n"
         "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
         " cwd=sys.stdin.readline().strip(), start_new_session=True)\n"
         "print(child.pid, flush=True)\ntime.sleep(120)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    live_owner.stdout.readline()  # its record is made (and its own start cleaned)
    orphan = server_directory("xrootd")
    _orphan_it(orphan)
    live_owner.stdin.write(f"{orphan}\n")
    live_owner.stdin.flush()
    live_child = int(live_owner.stdout.readline())
    shell = _with_terminal(orphan)
    server = _sleeper(orphan)
    try:
        tty_nr = Path(f"/proc/{shell.pid}/stat").read_text().rsplit(")", 1)[1].split()[4]
        assert tty_nr != "0", "no controlling terminal: nothing to test"
        stopped = stop_orphaned_servers()
        assert [(o.directory, o.killed) for o in stopped] == [(str(orphan), (server.pid,))]
        server.wait(timeout=10)
        assert shell.poll() is None and not _gone(live_child)
    finally:
        for process in (server, shell, live_owner):
            process.kill()
            process.wait()
        psutil.Process(live_child).kill() if not _gone(live_child) else None
        os.close(shell.controller)
    for directory in private_tmp.glob("storagescale-apache-*"):
        shutil.rmtree(directory, ignore_errors=True)


def test_a_server_whose_daemons_a_cleaner_stopped_says_who(private_tmp):
    """The note of a server whose directory was judged orphaned names the cleaner's
    stopped.log line beside the signal: a server killed by another run's cleaner is
    told apart from a crash."""
    from pytest_storagescale.servers.xcache import EmbeddedXCache

    server = EmbeddedXCache().start()
    try:
        for directory in (server.directory, server.origin.directory):
            _orphan_it(directory)  # their owner looks gone to the next cleaner
        stopped = stop_orphaned_servers()
        assert {o.directory for o in stopped} == {str(server.directory),
                                                  str(server.origin.directory)}
        server.proxy.process.wait(timeout=30)
        note = server.exit_note()
        assert "xcache (pid" in note and "killed by SIGKILL" in note, note
        assert re.search(rf"An orphan cleaner stopped its directory, judging its owner "
                         rf"gone \(stopped.log in .*\): .* pid {os.getpid()} stopped "
                         rf"{re.escape(str(server.directory))} \(", note), note
    finally:
        server.stop()
