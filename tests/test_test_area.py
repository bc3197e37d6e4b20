"""Nothing outside the test area, ever: links, the run directory, the test area itself,
stale run directories, and davs version detection's CA folder.

Against real POSIX directories (``file://``), the memory driver and the embedded
xrootd (whose data folder the test, running as root, can put links into)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from email.utils import formatdate
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import pytest

from pytest_storagescale.drivers.base import CreatedPaths
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.url import EndpointURL
from pytest_storagescale.drivers.version import server_header_version
from pytest_storagescale.errors import StorageError, StorageUnreachable
from pytest_storagescale.load.engine import cleanup_tree

#: the owner file every run directory carries (its name is part of the contract)
OWNER_FILE = ".storagescale-owner.json"

THRESHOLDS = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "0.3s"
warmup = "0s"
hang_timeout = "5s"

[ops.stat]
clients = [1]

[[ops.stat.expect]]
clients = "*"
rules = ["hung == 0"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()

def test_owner_file(storage_endpoint):
    client = storage_endpoint.client("ownercheck")
    assert ".storagescale-owner.json" in client.ls(storage_endpoint.run_dir)
"""


def _victim(folder: Path) -> Path:
    """A directory outside every run directory, with a file and a link target file."""
    folder.mkdir()
    (folder / "precious.txt").write_text("keep me")
    (folder / "sub").mkdir()
    (folder / "sub" / "deep.txt").write_text("keep me too")
    return folder


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def suite(pytester):
    def make(endpoint: str, *extra: str) -> list[str]:
        pytester.makepyfile(test_suite=SUITE)
        folder = pytester.path / "thr" / "xrootd"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "any.toml").write_text(THRESHOLDS)
        return [f"--storage-endpoint={endpoint}", "--storage-version=1.0",
                "--storage-thresholds=thr", "-p", "no:cacheprovider", *extra]
    return make


# -- links inside the run directory ------------------------------------------------------
def _recording(url: str, run: str, timeout: float = 5):
    """A client of ``url`` writing in ``run`` that records what it makes."""
    driver = driver_spec(url, writable_root=run).connect("cleanup", timeout=timeout)
    driver.created = CreatedPaths(run)
    return driver


def test_local_cleanup_leaves_links_and_their_targets(tmp_path):
    """What the run made goes; links a co-tenant put in are left, named, targets whole."""
    victim = _victim(tmp_path / "victim")
    area = tmp_path / "area"
    area.mkdir()
    run = f"{area}/storagescale-run-x"
    driver = _recording(f"file://{area}", run)
    driver.mkdir(run)
    driver.put(f"{run}/step/data.bin", b"x" * 10)
    os.symlink(victim, f"{run}/step/dir-link")
    os.symlink(victim / "precious.txt", f"{run}/step/file-link")
    os.symlink(victim, f"{run}/top-link")

    error = cleanup_tree(driver, run, created=driver.created)

    assert (victim / "precious.txt").read_text() == "keep me"
    assert (victim / "sub" / "deep.txt").exists()
    assert sorted(os.listdir(run)) == ["step", "top-link"]
    assert sorted(os.listdir(f"{run}/step")) == ["dir-link", "file-link"]
    assert error is not None and "step/dir-link (not made by this run: not entered)" in error
    assert "step/file-link (not made by this run)" in error
    assert "top-link (not made by this run, not removable with rmdir" in error


def test_local_cleanup_never_walks_through_a_linked_run_directory(tmp_path):
    """A run directory replaced by a link (after it was made) is not emptied: rmdir, which
    a link refuses as not a directory, is asked before any listing."""
    victim = _victim(tmp_path / "victim")
    area = tmp_path / "area"
    area.mkdir()
    run = f"{area}/storagescale-run-y"
    os.symlink(victim, run)
    driver = _recording(f"file://{area}", run)
    error = cleanup_tree(driver, run, created=driver.created)
    assert sorted(os.listdir(victim)) == ["precious.txt", "sub"]
    assert error is not None and "possibly a link to a directory outside" in error


def test_xrootd_cleanup_does_not_descend_into_a_server_side_link(embedded_xrootd, tmp_path):
    data = embedded_xrootd.directory / "data"
    run = "/storagescale/storagescale-run-link"
    driver = _recording(embedded_xrootd.url, run, timeout=10)
    driver.mkdir(run)
    driver.put(f"{run}/step/data.bin", b"x" * 10)
    # outside the run directory and writable by the server's user: deletable if followed
    victim = _server_owned(_victim(embedded_xrootd.directory / "victim"))
    os.symlink(victim, data / run.strip("/") / "step" / "dir-link")
    os.symlink(victim, data / run.strip("/") / "top-link")
    assert driver.stat(f"{run}/step/dir-link").is_dir  # the server follows it

    error = cleanup_tree(driver, run, created=driver.created)

    assert (victim / "precious.txt").read_text() == "keep me"
    assert (victim / "sub" / "deep.txt").exists()
    # the links cannot be removed over XRootD: said, naming them
    assert error is not None and "step/dir-link (not made by this run: not entered)" in error
    assert "top-link (not made by this run, not removable with rmdir: not entered" in error
    assert not (data / run.strip("/") / "step" / "data.bin").exists()
    (data / run.strip("/") / "step" / "dir-link").unlink()
    (data / run.strip("/") / "top-link").unlink()
    assert cleanup_tree(driver, run, created=driver.created) is None


def test_xrootd_cleanup_never_deletes_through_a_link_to_a_file(embedded_xrootd):
    """Over XRootD a link to a file looks like the file, and the server's ``rm``
    deletes its target too: a file older than the run's owner file is not deleted."""
    data = embedded_xrootd.directory / "data"
    run = "/storagescale/storagescale-run-filelink"
    driver = _recording(embedded_xrootd.url, run, timeout=10)
    driver.mkdir(run, parents=False)
    driver.put(f"{run}/{OWNER_FILE}", b"{}")
    driver.put(f"{run}/step/data.bin", b"x" * 10)
    driver.put(f"{run}/step/file-link", b"x" * 7)  # a name the run wrote, 7 bytes ...
    victim = _server_owned(_victim(embedded_xrootd.directory / "victim-file"))
    hour_ago = time.time() - 3600
    os.utime(victim / "precious.txt", (hour_ago, hour_ago))
    link = data / run.strip("/") / "step" / "file-link"
    link.unlink()  # ... replaced by a link to an older file of that size
    os.symlink(victim / "precious.txt", link)
    info = driver.stat(f"{run}/step/file-link")
    assert not info.is_dir and info.size == len("keep me")  # looks like the file

    error = cleanup_tree(driver, run, created=driver.created)

    assert (victim / "precious.txt").read_text() == "keep me"
    assert error is not None and f"{run}/step/file-link" in error
    assert "older than this run" in error and "link to a file outside" in error
    assert not (data / run.strip("/") / "step" / "data.bin").exists()  # the run's own
    link.unlink()
    assert cleanup_tree(driver, run, created=driver.created) is None
    assert not (data / run.strip("/")).exists()
    assert (victim / "precious.txt").read_text() == "keep me"


def _server_owned(victim: Path) -> Path:
    """Make ``victim`` deletable by the server's user (when the test is root), so that
    only the plugin's care keeps it."""
    if os.geteuid() == 0:
        user = pwd.getpwnam("xrootd" if _has_user("xrootd") else "nobody")
        for path in [victim, *victim.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid)
    return victim


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


# -- the run directory is made exclusively ---------------------------------------------------
@pytest.mark.parametrize("kind", ["link", "directory"])
def test_local_run_directory_is_never_adopted(tmp_path, kind):
    victim = _victim(tmp_path / "victim")
    area = tmp_path / "area"
    area.mkdir()
    run = area / "storagescale-run-20990101-000000-abcd"
    if kind == "link":
        os.symlink(victim, run)
    else:
        run.mkdir()
    driver = driver_spec(f"file://{area}", writable_root=str(run)).connect("admin", timeout=5)
    with pytest.raises(StorageError, match="exists"):
        driver.mkdir(str(run), parents=False)
    assert sorted(os.listdir(victim)) == ["precious.txt", "sub"]


def test_memory_run_directory_is_made_exclusively():
    driver = driver_spec("memory://exclusive/area", writable_root="/area/run").connect(
        "admin", timeout=5)
    driver.put("/area/run/theirs.txt", b"theirs")
    with pytest.raises(StorageError, match="exists"):
        driver.mkdir("/area/run", parents=False)
    with pytest.raises(StorageError):  # the parent must exist
        driver.mkdir("/area/run/missing/deeper", parents=False)
    driver.mkdir("/area/run/new", parents=False)
    assert driver.ls("/area/run") == ["new", "theirs.txt"]


def test_xrootd_run_directory_is_made_exclusively(embedded_xrootd):
    victim = _victim(embedded_xrootd.directory / "victim-pre")
    run = "/storagescale/storagescale-run-20990101-000000-pre0"
    os.symlink(victim, embedded_xrootd.directory / "data" / run.strip("/"))
    driver = driver_spec(embedded_xrootd.url, writable_root=run).connect("admin", timeout=10)
    with pytest.raises(StorageError, match="exists"):
        driver.mkdir(run, parents=False)
    assert sorted(os.listdir(victim)) == ["precious.txt", "sub"]
    (embedded_xrootd.directory / "data" / run.strip("/")).unlink()


def test_a_precreated_run_directory_link_is_refused_by_the_plugin(pytester, suite, tmp_path,
                                                                    monkeypatch):
    victim = _victim(tmp_path / "victim")
    area = tmp_path / "area"
    area.mkdir()
    name = "storagescale-run-20990101-000000-beef"
    os.symlink(victim, area / name)
    monkeypatch.setattr("pytest_storagescale.session.make_run_id", lambda: name)
    result = pytester.runpytest(*suite(f"file://{area}"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # found once, before any test
    result.stderr.fnmatch_lines([f"ERROR: *this run's directory {area}/{name} already exists*"])
    assert sorted(os.listdir(victim)) == ["precious.txt", "sub"]
    assert os.path.islink(area / name)


# -- the test area must exist ------------------------------------------------------------
def test_a_missing_local_test_area_is_a_usage_error_and_is_not_made(pytester, suite,
                                                                     tmp_path):
    area = tmp_path / "typo" / "deeper" / "area"
    result = pytester.runpytest(*suite(f"file://{area}"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"ERROR: *the test area {area} does not exist*Create it first: mkdir -p {area}*"])
    assert not (tmp_path / "typo").exists()


def test_a_missing_xrootd_test_area_names_the_xrdfs_command(pytester, suite,
                                                            embedded_xrootd):
    url = embedded_xrootd.url + "/typo/deeper"
    result = pytester.runpytest(*suite(url))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"ERROR: *the test area /storagescale/typo/deeper does not exist*"
        f"xrdfs root://127.0.0.1:{embedded_xrootd.port} mkdir -p /storagescale/typo/deeper*"])
    assert not (embedded_xrootd.directory / "data" / "storagescale" / "typo").exists()


def test_the_run_directory_carries_an_owner_file(pytester, suite, tmp_path):
    area = tmp_path / "area"
    area.mkdir()
    result = pytester.runpytest(*suite(f"file://{area}"))
    result.assert_outcomes(passed=2)
    assert os.listdir(area) == []  # removed at the end


# -- stale run directories of killed runs ------------------------------------------------------
def _record(name: str, pid: int, *, host: str | None = None, sign: bool = False,
            started: float = 1.0e9, heartbeat: float | None = None) -> str:
    """An owner record as a killed run left it; ``sign``: with this user's proof (the
    key in the cache directory of the test's HOME)."""
    from pytest_storagescale.session.owner import signed

    record = {"plugin": "pytest-storagescale", "run_id": name,
              "host": host or socket.gethostname(), "pid": pid, "user": "someone",
              "started": started, "storage_started": started,
              "heartbeat": started if heartbeat is None else heartbeat}
    return json.dumps(signed(record) if sign else record)


def _killed_run(area: Path, name: str, pid: int, *, sign: bool = False) -> Path:
    run = area / name
    step = run / "stat-c1-main-001"
    step.mkdir(parents=True)
    (step / "stat-target").write_bytes(b"x")  # generated by the stat step: recognised
    (run / "step").mkdir()
    (run / "step" / "left.bin").write_bytes(b"x")
    (run / OWNER_FILE).write_text(_record(name, pid, sign=sign))
    return run


def test_stale_run_directories_are_listed_then_removed_on_request(pytester, suite, tmp_path,
                                                                 monkeypatch):
    # a temporary directory of this test's own (the inner runs are in-process): the other
    # xdist worker's sessions clean the shared one too, and may take lcl0 first
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    area = tmp_path / "area"
    area.mkdir()
    dead = _dead_pid()
    stale = _killed_run(area, "storagescale-run-20200101-000000-dead", dead, sign=True)
    shutil.rmtree(stale / "step")  # all of it made by the run
    forged = _killed_run(area, "storagescale-run-20200101-000000-frgd", dead)
    unmarked = area / "storagescale-run-20200101-000000-nomark"
    unmarked.mkdir()
    # a link named like a run, to a folder with this user's owner file: never followed
    victim = _victim(tmp_path / "victim")
    (victim / OWNER_FILE).write_text((stale / OWNER_FILE).read_text())
    os.symlink(victim, area / "storagescale-run-20200101-000000-link")
    # a local shared folder of a killed run on this host
    local = Path(tempfile.gettempdir()) / "storagescale-run-20200101-000000-lcl0"
    local.mkdir(exist_ok=True)
    (local / OWNER_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": dead}))

    listed = pytester.runpytest(*suite(f"file://{area}"))
    listed.assert_outcomes(passed=2)
    listed.stdout.fnmatch_lines([
        "storagescale: 1 stale run directory in file://*area from killed runs: "
        "storagescale-run-20200101-000000-dead (pid * on this host is gone); remove them with "
        "--storage-clean-stale (1 local folder(s) of dead runs removed from *)",
        "storagescale: left alone in file://*area: "
        "storagescale-run-20200101-000000-frgd (someone else's: *), "
        "storagescale-run-20200101-000000-link (someone else's: *), "
        "storagescale-run-20200101-000000-nomark (unmarked: no owner file, named * days ago*)"])
    assert stale.exists() and not local.exists()

    cleaned = pytester.runpytest(*suite(f"file://{area}", "--storage-clean-stale"))
    cleaned.assert_outcomes(passed=2)
    cleaned.stdout.fnmatch_lines(["storagescale: removed 1 of 1 stale run directories*",
                                  "storagescale: left alone in *"])
    assert sorted(os.listdir(area)) == ["storagescale-run-20200101-000000-frgd",
                                        "storagescale-run-20200101-000000-link",
                                        "storagescale-run-20200101-000000-nomark"]
    assert sorted(os.listdir(forged / "step")) == ["left.bin"]
    assert sorted(os.listdir(victim)) == [OWNER_FILE, "precious.txt", "sub"]


def test_clean_stale_ini_value_is_checked(pytester, suite, tmp_path):
    area = tmp_path / "area"
    area.mkdir()
    pytester.makeini("[pytest]\nstorage_clean_stale = maybe\n")
    result = pytester.runpytest(*suite(f"file://{area}"))
    result.stderr.fnmatch_lines(["ERROR: storage_clean_stale: 'maybe' is not a yes/no value*"])


# -- davs version detection and its CA folder -----------------------------------------------
def test_davs_version_detection_uses_x509_cert_dir(embedded_xrootd, monkeypatch, tmp_path):
    endpoint = EndpointURL.parse(embedded_xrootd.https_url)
    monkeypatch.setenv("X509_CERT_DIR", embedded_xrootd.ca_dir)
    assert server_header_version(endpoint, timeout=10) == embedded_xrootd.version

    empty = tmp_path / "no-ca-here"
    empty.mkdir()
    monkeypatch.setenv("X509_CERT_DIR", str(empty))
    with pytest.raises(StorageUnreachable, match=f"CA folder {empty}"):
        server_header_version(endpoint, timeout=10)


_WHERE = dict(driver="xrootd", endpoint="127.0.0.1:1094", operation="rmdir", path="/x")


@pytest.mark.parametrize("refusal", [
    StorageError("[FATAL] Redirect limit has been reached", error_class="xrootd_306",
                 **_WHERE),
    StorageUnreachable("connection refused", error_class="unreachable", **_WHERE),
], ids=["redirect-limit", "unreachable"])
def test_a_refused_rmdir_is_said_as_it_is_not_as_a_link(monkeypatch, refusal):
    """An rmdir that bounced between redirectors (a cmsd manager) or found no server is
    reported with the storage's answer, not as "may be a link" (which only a directory
    that will not go as one suggests)."""
    from pytest_storagescale.drivers import memory

    monkeypatch.setattr(memory, "_STORES", {})  # this test's store is forgotten afterwards
    run = "/area/storagescale-run-y"
    driver = driver_spec("memory://refusing/area", writable_root=run).connect(
        "cleanup", timeout=5)
    driver.mkdir(f"{run}/step")

    def refuse(path):
        raise refusal

    monkeypatch.setattr(driver, "_rmdir", refuse)
    with pytest.raises(type(refusal)) as raised:
        driver.remove_tree(f"{run}/step")
    assert raised.value is refusal and "link" not in str(raised.value)
    error = cleanup_tree(driver, f"{run}/step", created=CreatedPaths(f"{run}/step"))
    assert refusal.message in error and "link" not in error


# -- the attacks of a co-tenant over file://, root:// and davs:// -------------------------
class Area:
    """A test area reachable over one protocol, and the same folder on this host's disk
    (the embedded xrootd's data folder for root:// and davs://)."""

    def __init__(self, url: str, local: Path, args: list[str], outside: Path) -> None:
        self.url, self.local, self.args, self.outside = url, local, args, outside

    def victim(self, name: str) -> Path:
        """A folder outside the area, deletable by the server's user."""
        return _server_owned(_victim(self.outside / name))


@pytest.fixture(params=["file", "root", "davs"])
def attack_area(request, tmp_path) -> Area:
    if request.param == "file":
        (tmp_path / "area").mkdir()
        return Area(f"file://{tmp_path / 'area'}", tmp_path / "area", [], tmp_path)
    server = request.getfixturevalue("embedded_xrootd")
    path = f"/storagescale/attack-{request.param}-{os.urandom(4).hex()}"
    admin = driver_spec(server.url, writable_root=path).connect("attack-setup", timeout=10)
    admin.mkdir(path)
    admin.close()
    local = server.directory / "data" / path.strip("/")
    outside = server.directory / f"outside-{local.name}"
    outside.mkdir()
    if request.param == "root":
        return Area(f"{server.url.rsplit('/', 1)[0]}/{path}", local, [], outside)
    return Area(server.https_url.rsplit("/storagescale", 1)[0] + path, local,
                [f"--storage-driver-option=ca_dir={server.ca_dir}"], outside)


def _backdate(*paths: Path, seconds: float = 3600) -> None:
    when = time.time() - seconds
    for path in paths:
        os.utime(path, (when, when), follow_symlinks=False)


def test_clean_stale_never_deletes_through_links(pytester, suite, attack_area, monkeypatch,
                                                 tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    area, dead = attack_area.local, _dead_pid()
    # a forged stale directory (backdated owner file, this host, a dead pid) holding a
    # link to a file outside the area
    file_victim = attack_area.victim("file-victim")
    _backdate(file_victim / "precious.txt")
    forged = area / "storagescale-run-20200101-000000-frgd"
    forged.mkdir()
    (forged / OWNER_FILE).write_text(_record(forged.name, dead))
    os.symlink(file_victim / "precious.txt", forged / "victim-link")
    _backdate(forged / OWNER_FILE, seconds=5 * 86400)
    # a link named like a run directory, to a directory holding an owner file
    dir_victim = attack_area.victim("dir-victim")
    (dir_victim / OWNER_FILE).write_text(_record("storagescale-run-20200101-000000-link", dead))
    os.symlink(dir_victim, area / "storagescale-run-20200101-000000-link")
    # this user's own killed run, where a co-tenant put a link under a name the stat
    # step makes: an old file where the run wrote a new one is not deleted
    own = area / "storagescale-run-20200101-000000-ownd"
    (own / "stat-c1-main-001").mkdir(parents=True)
    (own / OWNER_FILE).write_text(_record(own.name, dead, sign=True, started=time.time() - 60))
    os.symlink(file_victim / "precious.txt", own / "stat-c1-main-001" / "stat-target")
    _server_owned(area)

    result = pytester.runpytest(*suite(attack_area.url, "--storage-clean-stale",
                                       *attack_area.args))

    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "storagescale: removed 0 of 1 stale run directories * storagescale-run-20200101-"
        "000000-ownd (pid * on this host is gone)*; not removed: *stat-target (older than "
        "this run, possibly a link to a file outside the test area: not deleted)*",
        "storagescale: left alone in *: storagescale-run-20200101-000000-frgd (someone "
        "else's: *), storagescale-run-20200101-000000-link (someone else's: *)"])
    assert (file_victim / "precious.txt").read_text() == "keep me"
    assert sorted(os.listdir(dir_victim)) == [OWNER_FILE, "precious.txt", "sub"]
    assert sorted(os.listdir(forged)) == [OWNER_FILE, "victim-link"]
    assert os.path.islink(own / "stat-c1-main-001" / "stat-target")


SWAP_SUITE = """
import os, shutil

def test_swap_the_run_directory(storage_endpoint):
    local = {local!r} + storage_endpoint.run_dir[len({area!r}):]
    os.rename(local, local + "-away")
    shutil.copy(local + "-away/.storagescale-owner.json", {victim!r})  # even with its proof
    os.symlink({victim!r}, local)
"""


def _attack(pytester, attack_area: Area, suite: str, victim_name: str):
    """Run ``suite`` on the area, its ``{local}``, ``{area}`` and ``{victim}`` filled in
    (the area on this host's disk, as the endpoint names it, a new victim folder
    outside): the run's result and the victim."""
    victim = attack_area.victim(victim_name)
    _server_owned(attack_area.local)
    area = EndpointURL.parse(attack_area.url).path if not attack_area.url.startswith(
        "file://") else str(attack_area.local)
    pytester.makepyfile(test_attack=suite.format(local=str(attack_area.local), area=area,
                                                 victim=str(victim)))
    return pytester.runpytest(f"--storage-endpoint={attack_area.url}", "-p",
                              "no:cacheprovider", *attack_area.args), victim


def test_a_run_directory_swapped_for_a_link_is_not_emptied(pytester, attack_area):
    result, victim = _attack(pytester, attack_area, SWAP_SUITE, "swap-victim")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "storagescale: could not remove this run's directory *: * not removed: it holds 2 "
        "entries this run did not make or cannot recognise, left untouched: *precious.txt "
        "(not made by this run); *sub (not made by this run, not removable with rmdir: not "
        "entered*"] if attack_area.url.startswith("davs") else [  # listed through the link
        "storagescale: could not remove this run's directory *: *storagescale-run-* not "
        "removed: made as a directory, not removable as one (*), possibly a link to a "
        "directory outside: not entered. Check it by hand*"])  # rmdir: "not a directory"
    assert sorted(os.listdir(victim)) == [OWNER_FILE, "precious.txt", "sub"]
    assert (victim / "sub" / "deep.txt").read_text() == "keep me too"


# -- heartbeats and marks --------------------------------------------------------------
def test_a_run_on_another_host_is_stale_by_its_heartbeat_not_its_start(tmp_path, monkeypatch):
    from pytest_storagescale.session.area import RunArea

    monkeypatch.setenv("HOME", str(tmp_path))
    area = tmp_path / "area"
    area.mkdir()
    driver = driver_spec(f"file://{area}").connect("reader", timeout=5)
    four_days_ago = time.time() - 4 * 86400
    for name, heartbeat in (("storagescale-run-20200101-000000-live", time.time() - 60),
                            ("storagescale-run-20200101-000000-gone", time.time() - 7 * 3600)):
        (area / name).mkdir()
        (area / name / OWNER_FILE).write_text(_record(
            name, 1, host="another-host", sign=True, started=four_days_ago,
            heartbeat=heartbeat))
    live = RunArea._stale_one(driver, f"{area}/storagescale-run-20200101-000000-live",
                              "storagescale-run-20200101-000000-live", time.time())
    gone = RunArea._stale_one(driver, f"{area}/storagescale-run-20200101-000000-gone",
                              "storagescale-run-20200101-000000-gone", time.time())
    assert live is None  # started 4 days ago, but alive
    assert gone is not None and gone.removable
    assert gone.reason == "no heartbeat for 7 h from another-host"


HEARTBEAT_SUITE = """
import json, threading
from pytest_storagescale.session.owner import verified
from pytest_storagescale.stash import storage_run_key

def test_heartbeat(storage_endpoint, request):
    assert "storagescale-heartbeat" in [t.name for t in threading.enumerate()]
    area = request.config.stash[storage_run_key].area
    client = storage_endpoint.client("reader")
    owner = storage_endpoint.run_dir + "/.storagescale-owner.json"
    first = json.loads(client.read(owner, 0, 65536))
    area.beat()
    second = json.loads(client.read(owner, 0, 65536))
    assert verified(first) and verified(second)
    assert second["heartbeat"] > first["heartbeat"]
    assert second["storage_started"] == first["storage_started"] is not None
"""


def test_a_live_run_renews_its_heartbeat(pytester, tmp_path):
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_heartbeat=HEARTBEAT_SUITE)
    result = pytester.runpytest(f"--storage-endpoint=file://{area}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    from pytest_storagescale.session.owner import key_path

    assert key_path().stat().st_mode & 0o777 == 0o600


# -- every area written to must exist: doors and third-party-copy peers ------------------------
def test_a_door_whose_area_does_not_exist_is_refused_and_not_made(pytester, suite,
                                                                  embedded_xrootd):
    data = embedded_xrootd.directory / "data"
    door = embedded_xrootd.https_url.rsplit("/storagescale", 1)[0] + "/typo2/deep"
    result = pytester.runpytest(*suite(embedded_xrootd.url, f"--storage-door=davs={door}",
                                       "--storage-load-doors=all",
                                       f"--storage-driver-option=ca_dir={embedded_xrootd.ca_dir}"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # once, before any test
    result.stderr.fnmatch_lines([
        f"ERROR: --storage-door davs {door}: the test area /typo2/deep does not exist. The plugin "
        f"makes only its run directory inside an existing test area*Create it first: "
        f"gfal-mkdir -p {door}*"])
    assert not (data / "typo2").exists()


PEER_SUITE = """
from storagescale_suites.conformance.tpc import storage_tpc_peer  # noqa: F401

def test_peer(storage_tpc_peer):
    assert storage_tpc_peer.doors
"""


def test_a_tpc_peer_whose_area_does_not_exist_is_refused_and_not_made(pytester,
                                                                      embedded_xrootd):
    data = embedded_xrootd.directory / "data"
    pytester.makepyfile(test_peer=PEER_SUITE)
    result = pytester.runpytest(f"--storage-endpoint={embedded_xrootd.url}",
                                f"--storage-tpc-peer=root://127.0.0.1:{embedded_xrootd.port}//typo3/x",
                                "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([
        "*--storage-tpc-peer root://*//typo3/x: the test area /typo3/x does not exist*"
        "Create it first: xrdfs root://* mkdir -p /typo3/x*"])
    assert not (data / "typo3").exists()


# -- the final clean-up: errors and Ctrl-C are said, never raised --------------------------
FREEZE_CONFTEST = """
import os, signal, threading
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    os.kill({pid}, signal.SIGSTOP)  # the storage freezes before the final clean-up
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # then Ctrl-C
"""


def _sigint_by_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_ctrl_c_in_the_final_clean_up_of_a_frozen_storage_says_what_it_left(pytester, suite):
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    with EmbeddedXRootD() as server:
        args = suite(server.url)
        pytester.makeconftest(FREEZE_CONFTEST.format(pid=server.pid))
        try:
            child = subprocess.run(
                [sys.executable, "-m", "pytest", *args, "--storage-hang-timeout=60s"],
                cwd=pytester.path, capture_output=True, text=True, timeout=120,
                preexec_fn=_sigint_by_default)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        left = list((server.directory / "data" / "storagescale").glob("storagescale-run-*"))
    output = child.stdout + child.stderr
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert (f"could not remove this run's directory {left[0].name}: interrupted (Ctrl-C) "
            f"during the clean-up: /storagescale/{left[0].name} is left on") in output, output
    assert "2 passed" in output and child.returncode == pytest.ExitCode.INTERRUPTED


class _DotDotDAV(http.server.BaseHTTPRequestHandler):
    """A small WebDAV server over a local folder (plain HTTP), hostile in one way: its
    listing of a run directory has a ``..`` entry."""

    protocol_version = "HTTP/1.1"
    root: Path
    dotdot = True

    def log_message(self, *args) -> None:
        pass

    def _local(self) -> Path:
        return Path(str(self.root) + unquote(urlsplit(self.path).path))

    def _answer(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for name, value in {"Server": "Hostile/1.0", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_HEAD(self) -> None:
        self._answer(200 if self._local().exists() else 404)

    def do_GET(self) -> None:
        local = self._local()
        if not local.is_file():
            return self._answer(404)
        data = local.read_bytes()
        wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
        if wanted:
            first, last = int(wanted[1]), int(wanted[2])
            return self._answer(206, data[first:last + 1], **{
                "Content-Range": f"bytes {first}-{min(last, len(data) - 1)}/{len(data)}"})
        self._answer(200, data)

    def do_PUT(self) -> None:
        data, local = self._body(), self._local()
        if not local.parent.is_dir():
            return self._answer(409)
        local.write_bytes(data)
        self._answer(201)

    def do_MKCOL(self) -> None:
        local = self._local()
        self._answer(405 if local.exists() else 409 if not local.parent.is_dir() else 201)
        if not local.exists() and local.parent.is_dir():
            local.mkdir()

    def do_DELETE(self) -> None:
        local = self._local()
        if local.is_dir():
            local.rmdir()
        elif local.exists():
            local.unlink()
        else:
            return self._answer(404)
        self._answer(204)

    def do_PROPFIND(self) -> None:
        self._body()
        local, path = self._local(), unquote(urlsplit(self.path).path).rstrip("/")
        if not local.exists():
            return self._answer(404)
        entries = [(path, local)]
        if self.headers.get("Depth") == "1" and local.is_dir():
            entries += [(f"{path}/{child.name}", child) for child in sorted(local.iterdir())]
            if self.dotdot and local.name.startswith("storagescale-run-"):
                entries.append((f"{path}/..", local / OWNER_FILE))
        self._answer(207, _multistatus(entries), **{"Content-Type": "application/xml"})


def _multistatus(entries: list[tuple[str, Path]]) -> bytes:
    responses = []
    for href, local in entries:
        info = local.stat()
        kind = "<D:collection/>" if local.is_dir() else ""
        responses.append(
            f"<D:response><D:href>{quote(href)}</D:href><D:propstat><D:prop>"
            f"<D:resourcetype>{kind}</D:resourcetype>"
            f"<D:getcontentlength>{0 if local.is_dir() else info.st_size}</D:getcontentlength>"
            f"<D:getlastmodified>{formatdate(info.st_mtime, usegmt=True)}</D:getlastmodified>"
            f"</D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>")
    return (f'<?xml version="1.0"?><D:multistatus xmlns:D="DAV:">{"".join(responses)}'
            f"</D:multistatus>").encode()


def test_a_dotdot_entry_in_the_run_directory_is_said_not_raised(pytester, suite, tmp_path):
    area = tmp_path / "area"
    area.mkdir()
    with _dav_server(_DotDotDAV, tmp_path) as url:
        result = pytester.runpytest(*suite(f"{url}/area", "--storage-driver-option=checksum=none"))
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "storagescale: could not remove this run's directory storagescale-run-*: "
        "*/area/storagescale-run-* not removed: it holds 1 entry this run did not make or "
        "cannot recognise, left untouched: */area/storagescale-run-*/.. (not a name inside "
        "the directory: refused)*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert [path.name for path in area.iterdir()] == [
        path.name for path in area.glob("storagescale-run-*")]


class _RefusingOwnerFiles(_DotDotDAV):
    """A WebDAV door that refuses to store owner files (as a quota or an ACL would)."""

    dotdot = False

    def do_PUT(self) -> None:
        if self.path.endswith(OWNER_FILE):
            self._body()
            return self._answer(403)
        super().do_PUT()


@contextlib.contextmanager
def _dav_server(handler: type, root: Path):
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Handler", (handler,), {"root": root}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_run_directory_whose_owner_file_is_refused_is_removed_at_once(pytester, suite,
                                                                        tmp_path):
    area = tmp_path / "area"
    area.mkdir()
    with _dav_server(_RefusingOwnerFiles, tmp_path) as url:
        result = pytester.runpytest(*suite(f"{url}/area", "--storage-driver-option=checksum=none"))
    output = result.stdout.str() + result.stderr.str()
    assert "was made but its owner file was refused" in output, output
    assert "403" in output and "it was removed again (rmdir)" in output
    assert os.listdir(area) == []


def test_step_clean_up_removes_only_what_the_step_made(attack_area):
    """A put step's directory after a co-tenant's visit: the set-up's files and the
    clients' generated names go; a planted file, a link under a generated name and a
    link to a directory stay, named, and nothing outside is touched."""
    from pytest_storagescale.load.engine import step_generated

    victim = attack_area.victim("step-victim")
    _backdate(victim / "precious.txt")
    url = EndpointURL.parse(attack_area.url)
    run = f"{url.path.rstrip('/')}/storagescale-run-20990101-000000-step"
    workdir = f"{run}/put-c2-main-001"
    options = dict(arg.split("=", 1)[1].split("=", 1) for arg in attack_area.args)
    driver = driver_spec(attack_area.url, writable_root=run, options=options).connect(
        "coordinator", timeout=10)
    driver.mkdir(run, parents=False)
    driver.put(f"{run}/{OWNER_FILE}", b"{}")
    driver.created = CreatedPaths(workdir, step_generated)
    driver.mkdir(workdir)  # the set-up, recorded
    driver.put(f"{workdir}/stat-target", b"x" * 10)
    created, driver.created = driver.created, None
    driver.put(f"{workdir}/c00001-0000007", b"y" * 5)  # as a load client: not recorded
    local = attack_area.local / run.rsplit("/", 1)[1] / "put-c2-main-001"
    (local / "notes.txt").write_text("a co-tenant's")
    os.symlink(victim / "precious.txt", local / "c00001-0000008")  # a generated name
    os.symlink(victim, local / "ls-dir")  # a generated directory name
    _server_owned(attack_area.local)

    error = cleanup_tree(driver, workdir, created=created)

    assert (victim / "precious.txt").read_text() == "keep me"
    assert (victim / "sub" / "deep.txt").read_text() == "keep me too"
    assert sorted(os.listdir(local)) == ["c00001-0000008", "ls-dir", "notes.txt"]
    assert error is not None and "notes.txt (not made by this run)" in error
    assert "c00001-0000008 (older than this run" in error
    if attack_area.url.startswith("davs"):  # a PROPFIND lists through the link ...
        assert "ls-dir/precious.txt (not made by this run)" in error  # ... nothing taken
        assert "ls-dir/sub (not made by this run: not entered)" in error  # not even rmdir
    else:  # rmdir, asked first, answers "not a directory": never listed
        assert re.search(r"ls-dir \(made as a directory, not removable as one \(.*not a "
                         r"directory.*\), possibly a link to a directory outside: not "
                         r"entered\)", error, re.IGNORECASE), error


def test_an_unusable_key_leaves_the_record_unprovable_not_the_run_broken(tmp_path,
                                                                        monkeypatch):
    from pytest_storagescale.session import owner

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    record = owner.owner_record("storagescale-run-x", os.getpid(), time.time())
    assert owner.verified(owner.signed(record))
    owner.key_path().chmod(0o644)  # readable by others: not used
    assert owner.PROOF not in owner.signed(record)
    assert not owner.verified(owner.signed(record))


def test_a_run_without_a_usable_key_still_removes_its_own_directory(pytester, suite, tmp_path,
                                                                   monkeypatch):
    not_a_folder = tmp_path / "cache-is-a-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_folder))
    area = tmp_path / "area"
    area.mkdir()
    result = pytester.runpytest(*suite(f"file://{area}"))
    result.assert_outcomes(passed=2)
    assert os.listdir(area) == []


def test_an_emptied_folder_of_a_test_goes_with_rmdir_and_the_run_directory_with_it(
        pytester, tmp_path):
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_dir="""
        def test_dir(storage_test_dir, storage_client):
            storage_client.put(storage_test_dir + "/x", b"1")
    """)
    result = pytester.runpytest(f"--storage-endpoint=file://{area}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert os.listdir(area) == []  # <run>/functional/ was left empty by the fixture


FUNCTIONAL_LINK_SUITE = """
import os, time

def test_functional(storage_test_dir, storage_client, storage_endpoint):
    storage_client.put(storage_test_dir + "/mine.dat", b"12345")
    storage_client.put(storage_test_dir + "/made/deep.dat", b"1")  # its parent made by put
    other = storage_endpoint.client("functional-other")  # another client of the test's
    other.put(storage_test_dir + "/other.dat", b"22")
    other.close()
    local = {local!r} + storage_test_dir[len({area!r}):]
    now = time.time()  # the victim's files changed after the run started
    for name in ("precious.txt", "sub/deep.txt"):
        os.utime({victim!r} + "/" + name, (now, now))
    os.symlink({victim!r} + "/precious.txt", local + "/file-link")  # a co-tenant's links
    os.symlink({victim!r}, local + "/link-dir")
"""


def test_a_link_planted_in_a_functional_tests_folder_is_left_and_named(pytester,
                                                                      attack_area):
    """storage_test_dir's removal takes what the test's clients made (the put's parent
    too) and leaves a co-tenant's links to a directory and to a file outside, named,
    with their targets whole, though changed after the run started."""
    result, victim = _attack(pytester, attack_area, FUNCTIONAL_LINK_SUITE,
                             "functional-victim")

    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "*StorageScaleWarning: clean-up: */functional/test_functional not removed: it holds "
        "2 entries this run did not make or cannot recognise, left untouched: *file-link (not "
        "made by this run); *link-dir (not made by this run, not removable with rmdir: not "
        "entered*"])
    assert (victim / "precious.txt").read_text() == "keep me"
    assert (victim / "sub" / "deep.txt").read_text() == "keep me too"
    (run,) = (path for path in attack_area.local.iterdir() if path.name.startswith(
        "storagescale-run-"))
    assert sorted(os.listdir(run / "functional" / "test_functional")) == [
        "file-link", "link-dir"]


def test_a_client_records_what_it_makes_with_the_parents_a_put_makes(tmp_path):
    """Every put, mkdir, sequential write and rename of a client with a recorder is
    recorded with the size written, and so are the directories between the recorder's
    root and the path; a folder's view sees only those records."""
    run = f"{tmp_path}/storagescale-run-r"
    driver = _recording(f"file://{tmp_path}", run)
    driver.mkdir(f"{run}/t/made")
    driver.put(f"{run}/t/a/b/f.dat", b"12345")
    driver.write_sequential(f"{run}/t/w.dat", b"x" * 10, 4, "none")
    driver.rename(f"{run}/t/a/b/f.dat", f"{run}/t/g.dat")
    view = driver.created.below(f"{run}/t")
    assert [view.kind(f"{run}/t/{name}") for name in ("made", "a", "a/b", "f.dat")] == [
        "dir", "dir", "dir", None]
    assert (view.kind(f"{run}/t/g.dat"), view.sizes[f"{run}/t/g.dat"]) == ("file", 5)
    assert view.sizes[f"{run}/t/w.dat"] == 8  # the whole blocks written
    assert view.kind(run) is None and view.kind(f"{run}/other") is None
    os.symlink(tmp_path, f"{run}/t/planted")
    error = cleanup_tree(driver, f"{run}/t", created=view)
    assert sorted(os.listdir(f"{run}/t")) == ["planted"]
    assert error is not None and "planted (not made by this run" in error
