"""A dCache tarball (a site's own, given by path) is unpacked by the run as root: a
hostile one (an absolute name, ``..``, a link leading out, a file written through such
a link, a device, a setuid bit) is refused naming its member, at the option's check
(exit 4) and at the unpack, and nothing is written outside the run's folder. No dCache
is started."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from pytest_storagescale.errors import EndpointError, StorageScaleUsageError
from pytest_storagescale.servers.dcache import EmbeddedDCache
from pytest_storagescale.servers.tarballs import unpack

TOP = "dcache-11.2.5"


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"planted\n",
            link: str = "", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def _hostile(outside: Path) -> dict[str, list]:
    """Per case: the hostile members after a release's ``bin/dcache``."""
    return {
        "absolute name": [_member(str(outside / "absolute"))],
        "parent folder": [_member(f"{TOP}/../../{outside.name}/dotdot")],
        "link out": [_member(f"{TOP}/out", tarfile.SYMTYPE, link=str(outside))],
        "relative link out": [_member(f"{TOP}/up", tarfile.SYMTYPE,
                                      link=f"../../{outside.name}")],
        "file through a link": [
            _member(f"{TOP}/a", tarfile.SYMTYPE, link="b"),
            _member(f"{TOP}/b", tarfile.SYMTYPE, link=f"../../{outside.name}"),
            _member(f"{TOP}/a/through")],
        "hard link out": [_member(f"{TOP}/hard", tarfile.LNKTYPE, link="/etc/passwd")],
        "device": [_member(f"{TOP}/mem", tarfile.CHRTYPE)],
        "setuid": [_member(f"{TOP}/bin/helper", mode=0o4755)],
    }


def _tarball(path: Path, members: list) -> Path:
    release = [_member(f"{TOP}/bin/dcache", data=b"#!/bin/sh\n", mode=0o755)]
    with tarfile.open(path, "w:gz") as archive:
        for info, data in release + members:
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


CASES = list(_hostile(Path("/x")))


@pytest.fixture
def place(tmp_path):
    """``(tarball folder, run folder, outside folder)``: the run folder two levels
    below the tarball's (as a release unpacks into ``<run>/dist``)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    return tmp_path, run, outside


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_dcache_tarball_is_refused_naming_its_member(place, case):
    folder, run, outside = place
    members = _hostile(outside)[case]
    tarball = _tarball(folder / "dcache-11.2.5.tar.gz", members)

    with pytest.raises(StorageScaleUsageError) as usage:
        EmbeddedDCache.check_version(str(tarball))
    assert any(f"member {info.name!r}" in str(usage.value) for info, _ in members), (
        usage.value)
    assert str(usage.value).startswith(f"--storage-embedded-version {tarball}: ")

    server = EmbeddedDCache()
    with pytest.raises(EndpointError) as start:
        server._unpack(tarball, run / "dist")
    assert "member " in str(start.value) and "outside the run's folder" in str(start.value)
    assert list(outside.iterdir()) == []
    passwd = Path("/etc/passwd").stat().st_ino
    for path in (run / "dist").rglob("*"):  # what was unpacked before the refusal
        info = path.lstat()
        assert info.st_ino != passwd, path
        assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), path
        assert stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode) or (
            stat.S_ISLNK(info.st_mode)), path
        if stat.S_ISLNK(info.st_mode):
            assert os.path.realpath(path).startswith(str(run / "dist")), path


def test_a_release_tarball_unpacks_owned_by_the_user(place):
    """A tarball's owners are not taken over (root would): the unpacking user's, and
    no group/other write bit."""
    folder, run, _ = place
    info, data = _member(f"{TOP}/share/lib/x.jar", mode=0o666)
    info.uid, info.gid, info.uname, info.gname = 4321, 4321, "nobody", "nogroup"
    tarball = _tarball(folder / "dcache-11.2.5.tar.gz", [(info, data)])
    assert EmbeddedDCache.check_version(str(tarball)) == str(tarball)
    target = run / "dist"
    target.mkdir()
    assert unpack(tarball, target) == ""
    jar = (target / TOP / "share" / "lib" / "x.jar").stat()
    assert (jar.st_uid, jar.st_gid) == (os.getuid(), os.getgid())
    assert not jar.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
