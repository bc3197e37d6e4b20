"""Choosing an embedded server: ``--storage-embedded``, its protocols and logins, and
the default a suite's conftest names."""

from __future__ import annotations

import os

import pytest

from pytest_storagescale.errors import EndpointError, StorageScaleUsageError
from pytest_storagescale.servers.family import (
    EmbeddedServer,
    check_embedded_choice,
    embedded_class,
    embedded_kinds,
)

SUITE = """
def test_endpoint(storage_endpoint):
    print("URL", storage_endpoint.url.split(":")[0], storage_endpoint.driver_name)
"""


def test_every_registered_server_is_an_embedded_server():
    for kind in embedded_kinds():
        cls = embedded_class(kind)
        assert issubclass(cls, EmbeddedServer) and cls.kind == kind and cls.schemes


def test_unknown_kind_protocol_and_login_are_usage_errors():
    with pytest.raises(StorageScaleUsageError, match="unknown server 'minio'.*xrootd"):
        embedded_class("minio")
    with pytest.raises(StorageScaleUsageError, match="gsiftp.*serves root, davs"):
        check_embedded_choice("xrootd", "gsiftp", "unix")
    assert check_embedded_choice("xrootd", None, "unix") == "root"


def test_missing_binary_names_the_install_command(monkeypatch):
    class Absent(EmbeddedServer):
        kind = "absent"
        schemes = ("root",)
        packages = ("absent-server",)
        binaries = ("storagescale-no-such-binary",)

    with pytest.raises(EndpointError, match="apt-get install absent-server"):
        Absent.check_installed()


@pytest.mark.parametrize("args, message", [
    (["--storage-embedded", "minio"], "--storage-embedded: unknown value 'minio'"),
    (["--storage-embedded-login", "ntlm"], "--storage-embedded-login: unknown value 'ntlm'"),
    (["--storage-embedded-protocol", "gsiftp"], "the embedded xrootd serves root, davs"),
    (["--storage-embedded", "webdav", "--storage-embedded-version", "9.9"],
     "--storage-embedded-version 9.9: the embedded webdav runs only the installed release"),
])
def test_bad_choices_stop_before_any_test(pytester, args, message):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(*args, "-p", "no:cacheprovider")
    assert result.ret != 0
    assert message in result.stdout.str() + result.stderr.str()
    assert "Traceback" not in result.stderr.str()


def test_suite_conftest_names_its_server_and_the_option_wins(pytester):
    pytester.makeconftest("""
def pytest_storagescale_embedded(config):
    return "xrootd"
""")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-s", "-p", "no:cacheprovider",
                                "--storage-embedded-protocol", "davs")
    result.assert_outcomes(passed=1)
    assert "storage_embedded: xrootd (from the suite's conftest)" in result.stdout.str()
    result.stdout.fnmatch_lines(["*URL davs *"])


def test_suites_that_disagree_must_be_told_which(pytester):
    for name, kind in (("a", "xrootd"), ("b", "ceph")):
        folder = pytester.mkpydir(name)
        (folder / "conftest.py").write_text(
            f"def pytest_storagescale_embedded(config):\n    return {kind!r}\n")
        (folder / "test_x.py").write_text(SUITE)
    result = pytester.runpytest("a", "b", "-p", "no:cacheprovider")
    assert result.ret != 0
    assert "want different embedded servers (ceph, xrootd)" in (
        result.stdout.str() + result.stderr.str())


def test_starting_a_server_leaves_the_credential_environment_as_it_was(monkeypatch):
    """A readiness probe's driver sets credential variables for the whole process;
    starting a server (``with``, or the session's start) puts them back."""
    import os

    monkeypatch.delenv("X509_USER_PROXY", raising=False)

    class Probing(EmbeddedServer):
        kind = "probing"
        schemes = ("root",)

        def start(self):
            os.environ["X509_USER_PROXY"] = "/tmp/probe-proxy"  # what a probe's driver does
            return self

        def stop(self):
            pass

        def url_for(self, scheme):
            return "root://127.0.0.1:1//area"

    with Probing() as server:
        assert isinstance(server, Probing)
        assert "X509_USER_PROXY" not in os.environ
    # every member goes through that start: none replaces the base's __enter__
    for kind in embedded_kinds():
        cls = embedded_class(kind)
        assert cls.__enter__ is EmbeddedServer.__enter__, kind


def _sleeper(tmp_path, name: str):
    from pytest_storagescale.servers.processes import ProcessGroup

    return ProcessGroup(["sleep", "300"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                        output=tmp_path / f"{name}.log")


def test_a_stopped_group_never_signals_the_process_that_got_its_pid_again(tmp_path):
    """Stopping a server whose leader is already gone must not SIGKILL the process
    group of that number: with pid_max 32,768 the number is soon another server's (a
    test's embedded xrootd leads a session of its own; one vanished mid-run in CI)."""
    gone = _sleeper(tmp_path, "gone")
    gone.stop()
    assert gone.exited() is not None
    other = _sleeper(tmp_path, "other")
    try:
        gone.process.pid = other.pid  # what a recycled pid looks like to the old handle
        gone.stop()
        assert other.exited(wait=0.5) is None, "the other server's group was killed"
    finally:
        other.stop()
    assert other.exited() is not None


def test_a_group_stop_kills_what_the_leader_left_behind(tmp_path):
    """A worker the leader forked outlives a SIGTERMed leader; stop() kills it too."""
    import psutil

    from pytest_storagescale.servers.processes import ProcessGroup, _running_members

    group = ProcessGroup(["sh", "-c", "sleep 300 & echo $! > child.pid; wait"],
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                         output=tmp_path / "leader.log")
    pid_file = tmp_path / "child.pid"
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        group.exited(wait=0.05)
    child = psutil.Process(int(pid_file.read_text()))
    group.stop(grace=2)
    # stop() returns once no member of the group runs (a fresh clone's run once saw an
    # Apache worker still running right after the stop of a loaded machine)
    assert _running_members(group.pid) == []
    _, alive = psutil.wait_procs([child], timeout=5)
    assert all(process.status() == psutil.STATUS_ZOMBIE for process in alive), alive


@pytest.mark.slow_server
@pytest.mark.parametrize("kind, daemon", [
    ("xcache", "xcache"),
    ("webdav", "apache"),
    ("gridftp", "globus-gridftp-server"),
    ("redirector", "data server 2's cmsd"),
])
def test_a_daemon_that_dies_mid_run_is_named_with_its_signal_and_log(kind, daemon):
    """Every member says which of its daemons died, when, how (the signal) and the
    last lines of its logs; nothing while they run, nothing once it stopped them. Only
    the embedded xrootd said so before: a Ceph gateway and its XCache that vanished
    mid-run on a busy machine left no word."""
    import os
    import re
    import signal

    from pytest_storagescale.servers.family import start_embedded

    server = start_embedded(kind, "unix")
    try:
        assert server.exit_note() == ""
        names = [process.name for process in server.server_processes()]
        assert daemon in names, names
        victim = next(p for p in server.server_processes() if p.name == daemon)
        os.kill(victim.pid, signal.SIGKILL)
        victim.process.wait(timeout=60)
        note = server.exit_note()
        assert note.startswith(f"the embedded {kind} lost a daemon during the run: "), note
        assert re.search(rf"{re.escape(daemon)} \(pid {victim.pid}\) ended at "
                         r"\d\d:\d\d:\d\d UTC, \d+ s after it started: killed by SIGKILL",
                         note), note
        assert f"The last lines of its logs:\n--- {daemon}: " in note, note
        assert not [name for name in names if name != daemon and f"{name} (pid" in note]
    finally:
        server.stop()
    assert server.exit_note() == ""


def test_a_dead_leader_keeps_its_groups_number_until_stop_kills_the_group(tmp_path):
    """A leader that exited is not reaped by asking whether it exited: a zombie keeps
    its pid, and so its group's number, from being handed to another process (another
    xdist worker's server, which would lead a group of that number) until stop() has
    killed what it left behind. Reaping it first left a window in which the stop's
    SIGKILL to the group could reach the process that got the number."""
    import psutil

    from pytest_storagescale.servers.processes import ProcessGroup, _running_members

    group = ProcessGroup(["sh", "-c", "sleep 300 & echo $! > child.pid; exit 3"],
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                         output=tmp_path / "leader.log", name="leader")
    assert group.exited(wait=60) == 3
    child = psutil.Process(int((tmp_path / "child.pid").read_text()))
    assert psutil.Process(group.pid).status() == psutil.STATUS_ZOMBIE  # not reaped
    assert child.is_running() and os.getpgid(child.pid) == group.pid
    group.stop(grace=2)
    assert _running_members(group.pid) == []
    assert not psutil.pid_exists(group.pid) or psutil.Process(group.pid).ppid() != os.getpid()
    _, alive = psutil.wait_procs([child], timeout=5)
    assert all(process.status() == psutil.STATUS_ZOMBIE for process in alive), alive
    assert group.watched.death() == ""  # stopped by its server: not a death


TINY_KIND = '''
import shutil
import tempfile
from pathlib import Path

from pytest_storagescale.servers.family import EmbeddedServer, register_server
from pytest_storagescale.servers.orphans import server_directory


@register_server
class TinyServer(EmbeddedServer):
    """A server kind of this suite's own: a folder served over file://."""

    kind = "tiny"
    schemes = ("file",)
    logins = ("unix",)
    directory = None

    def start(self):
        self.directory = server_directory(self.kind)
        (self.directory / "area").mkdir()
        self.version = "0.1"
        return self

    def stop(self):
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def url_for(self, scheme):
        return f"file://{self.directory}/area"
'''


def test_a_conftest_adds_a_server_kind_with_one_registration(pytester):
    """A new kind is one class and one ``register_server`` line: the options take its
    name, its scheme and its login from the class, and the session starts and stops
    it like a built-in one (its directory named by its kind)."""
    pytester.makeconftest(TINY_KIND)
    pytester.makepyfile(test_suite=SUITE + """
def test_it_is_the_tiny_server(storage_endpoint):
    assert "/storagescale-tiny-" in storage_endpoint.url
""")
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider",
                                           "--storage-embedded", "tiny")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*URL file local*"])
    # the lists the options check are read from the registered classes
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--storage-embedded",
                                           "tiny", "--storage-embedded-protocol", "root")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "the embedded tiny serves file" in result.stdout.str() + result.stderr.str()


def test_a_kind_taken_or_a_class_without_its_declarations_is_refused():
    from pytest_storagescale.servers.family import register_server

    class Again(EmbeddedServer):
        kind = "xrootd"
        schemes = ("root",)

    with pytest.raises(StorageScaleUsageError, match="'xrootd' is already .*EmbeddedXRootD"):
        register_server(Again)

    class Nameless(EmbeddedServer):
        schemes = ("root",)

    with pytest.raises(StorageScaleUsageError, match="kind ''.*Set kind"):
        register_server(Nameless)
    assert "" not in embedded_kinds() and embedded_class("xrootd") is not Again


def test_the_lists_of_kinds_protocols_and_logins_load_no_heavy_library():
    """The option checks read every server class; none of the server modules imports
    cryptography, the XRootD bindings or psutil until a server starts, and loading the
    plugin loads neither cryptography nor the XRootD bindings."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from pytest_storagescale.servers.family import embedded_logins, embedded_protocols\n"
            "print(embedded_protocols(), embedded_logins())\n"
            "heavy = ('cryptography', 'XRootD', 'psutil')\n"
            "print(sorted(name for name in heavy if name in sys.modules))\n"
            "import pytest_storagescale.plugin\n"
            "print(sorted(name for name in heavy[:2] if name in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    protocols, by_servers, by_plugin = done.stdout.splitlines()
    assert protocols == ("('root', 'davs', 'file', 'https', 'gsiftp', 'srm', 'dcap') "
                         "('unix', 'krb5', 'gsi', 'token')")
    assert (by_servers, by_plugin) == ("[]", "[]"), done.stdout


def test_a_kind_tells_its_installed_version_without_starting_only_when_it_can():
    """The thresholds file is chosen by the version: the embedded xrootd's comes from
    its binary, through its class, before any server runs; a kind that cannot tell
    says "" (the session starts it and reads its version)."""
    from pytest_storagescale.servers.xrootd import xrootd_version

    assert embedded_class("xrootd").installed_version() == xrootd_version() != ""
    assert EmbeddedServer.installed_version() == ""


def test_the_help_names_every_registered_kind(pytester):
    """--storage-embedded's help is read from the classes: a kind cannot be left out
    (the redirector was, when the help was written by hand)."""
    result = pytester.runpytest("--help", "-p", "no:cacheprovider")
    text = " ".join(result.stdout.str().split())
    assert "redirector (an XRootD cluster: a cmsd manager and two data servers)" in text
    assert all(f" {kind} (" in text for kind in embedded_kinds())
