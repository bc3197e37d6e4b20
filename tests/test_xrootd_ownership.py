"""The embedded xrootd run as root gives its user no way into root (issue 31).

xrootd starts as root and drops to an unprivileged user (``-R xrootd``): its program,
the libraries it loads before it drops and its configuration are root's. None of them
may be a file the server's user can change, nor lie in a folder that user can write
(it could put another file in its place), in the installed release (5.5.3) and in the
built 6.2.1, which a cache under ``/root`` keeps out of that user's reach, so the
server runs a copy. A restart writes the configuration again as root: a link the
server's user put at its place must not be followed (it cannot put one there).
Root only: without root there is no user to switch to."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from pytest_storagescale.servers.family import start_embedded
from pytest_storagescale.servers.processes import unprivileged_user
from pytest_storagescale.servers.xrootd_releases import BUILT_VERSION, built_prefix

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the server drops root's rights only when "
                                                 "started as root"),
]


@pytest.fixture(params=["installed", BUILT_VERSION])
def server(request):
    """The embedded xrootd (unix login) of the installed release, then of the built one
    (skipped when not built: test_xrootd6.py says how to build it)."""
    version = None if request.param == "installed" else request.param
    if version is not None and built_prefix() is None:
        pytest.skip(f"XRootD {BUILT_VERSION} is not built on this machine "
                    f"(bash scripts/build-xrootd6.sh)")
    started = start_embedded("xrootd", "unix", version)
    yield started
    started.stop()


def _user() -> tuple[int, int, set[int]]:
    entry = pwd.getpwnam(unprivileged_user() or "nobody")
    return entry.pw_uid, entry.pw_gid, {entry.pw_gid, *os.getgrouplist(entry.pw_name,
                                                                           entry.pw_gid)}


def _changeable(path: Path, uid: int, gids: set[int]) -> str:
    """Why the user ``uid`` (in ``gids``) could change ``path`` or what a process finds
    at that name ("" when it cannot): the file or a folder above it is that user's, or
    writable by a group of it or by everyone (a folder with the sticky bit, /tmp, keeps
    others' names: not counted above the file)."""
    chains = [[path, *path.parents], [path.resolve(), *path.resolve().parents]]
    for chain in chains:
        for index, each in enumerate(chain):
            info = each.lstat()
            if info.st_uid == uid:
                return f"{each} is owned by the server's user"
            sticky = index > 0 and info.st_mode & stat.S_ISVTX
            if info.st_mode & stat.S_IWGRP and info.st_gid in gids and not sticky:
                return f"{each} is writable by the server's user's group"
            if info.st_mode & stat.S_IWOTH and not sticky and not stat.S_ISLNK(info.st_mode):
                return f"{each} is writable by every user"
    return ""


def _root_files(pid: int) -> tuple[Path, list[Path]]:
    """The server's configuration, and what it executes and maps: ``/proc/PID/exe``,
    every file in ``/proc/PID/maps``."""
    arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    config = Path(os.fsdecode(arguments[arguments.index(b"-c") + 1]))
    mapped = {line.split(None, 5)[5].removesuffix(" (deleted)")
              for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
              if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith("/")}
    files = [Path(os.readlink(f"/proc/{pid}/exe")), *sorted(Path(p) for p in mapped)]
    return config, files


def test_nothing_root_runs_or_reads_is_the_server_users(server):
    uid, _, gids = _user()
    assert os.stat(f"/proc/{server.pid}").st_uid == uid  # it did drop to that user
    config, files = _root_files(server.pid)
    assert any("libXrd" in path.name for path in files)  # the maps were read
    if server.release.lib_dir is not None:  # 6.2.1 runs on its own libraries
        assert any(str(path).startswith(server.release.lib_dir) for path in files)
    problems = {str(path): why for path in [config, *files]
                if (why := _changeable(path, uid, gids))}
    assert problems == {}


def test_a_link_at_the_configuration_is_not_followed_on_restart(server, tmp_path):
    uid, gid, _ = _user()
    config, _ = _root_files(server.pid)
    outside = tmp_path / "outside.cfg"
    outside.write_text("untouched\n")
    planted = subprocess.run(["ln", "-sfn", str(outside), str(config)], user=uid, group=gid,
                             extra_groups=[], capture_output=True, text=True, timeout=30)
    assert planted.returncode != 0, "the server's user could replace the configuration"
    server.restart()
    assert outside.read_text() == "untouched\n"
    assert not config.is_symlink()
    assert "all.export" in config.read_text()


@pytest.mark.parametrize("kind", ["xcache", "redirector"])
def test_the_other_xrootd_kinds_read_and_run_nothing_of_their_user(kind):
    """The XCache door and every xrootd and cmsd of the redirector cluster: the same
    (the program is the system's; the configuration is read as root)."""
    uid, _, gids = _user()
    server = start_embedded(kind, "unix")
    try:
        pids = [watched.process.pid for watched in server.server_processes()]
        assert pids
        problems = {}
        for pid in pids:
            assert os.stat(f"/proc/{pid}").st_uid == uid
            config, files = _root_files(pid)
            problems.update({str(path): why for path in [config, *files]
                             if (why := _changeable(path, uid, gids))})
        assert problems == {}
    finally:
        server.stop()
