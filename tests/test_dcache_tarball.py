"""A dCache tarball (a site's own, given by path) is unpacked by the run as root: a
hostile one (an absolute name, ``..``, a link leading out, a file written through such
a link, a device, a setuid bit) is refused naming its member, at the option's check
(exit 4) and at the unpack, and nothing is written outside the run's folder. No dCache
is started."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from pytest_storagescale.errors import EndpointError, StorageScaleUsageError
from pytest_storagescale.servers import tarballs
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
        # issue 31: a link that leaves only once a later member exists (the start then
        # wrote etc/dcache.conf, with the database password, outside the run's folder)
        "link out once a later link exists": [
            _member(f"{TOP}/etc", tarfile.SYMTYPE,
                    link=f"a/b/c/../../../../{outside.name}"),
            _member(f"{TOP}/a/b", tarfile.DIRTYPE, mode=0o755),
            _member(f"{TOP}/d", tarfile.DIRTYPE, mode=0o755),
            _member(f"{TOP}/a/b/c", tarfile.SYMTYPE, link="../../d")],
        "link to its own folder": [
            _member(f"{TOP}/etc", tarfile.SYMTYPE, link=f"x/x/../../../{outside.name}"),
            _member(f"{TOP}/x", tarfile.SYMTYPE, link=".")],
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


def _header_only(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """A gzip tar of ``members`` written header by header (a member's header may claim
    more data than follows: what a bomb's reader meets first)."""
    blob = b""
    for info, data in members:
        blob += info.tobuf(format=tarfile.GNU_FORMAT) + data
        blob += b"\0" * (-len(data) % tarfile.BLOCKSIZE)
    path.write_bytes(gzip.compress(blob))
    return path


def test_a_truncated_tarball_is_a_usage_error_wherever_its_program_is(pytester, tmp_path):
    """bin/dcache first, then the tarball cut in a member's data: one paragraph, exit 4
    (it was an INTERNALERROR: the program's search stopped at bin/dcache, the member
    check read on into the cut)."""
    whole = _tarball(tmp_path / "whole.tar.gz",
                     [_member(f"{TOP}/share/big.jar", data=os.urandom(256 * 1024))])
    tarball = tmp_path / "dcache-11.2.5.tar.gz"
    tarball.write_bytes(whole.read_bytes()[:150 * 1024])
    with pytest.raises(StorageScaleUsageError) as usage:
        EmbeddedDCache.check_version(str(tarball))
    assert str(usage.value).startswith(f"--storage-embedded-version {tarball}: not a dCache "
                                       f"distribution tarball: it cannot be read"), usage.value

    pytester.makeini("[pytest]\nstorage_embedded = dcache\n")
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           f"--storage-embedded-version={tarball}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and "not a dCache distribution tarball" in errors[0], (
        result.stderr.str())
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()


def test_a_member_claiming_more_than_the_bound_is_refused_from_its_header(tmp_path):
    """A bomb's member of 170 GB is refused at its header: its data is never read (here
    there is none, so reading it would report a truncated tarball instead)."""
    info, _ = _member(f"{TOP}/share/bomb")
    info.size = 170 * 10**9
    tarball = _header_only(tmp_path / "dcache-11.2.5.tar.gz", [
        _member(f"{TOP}/bin/dcache", data=b"#!/bin/sh\n", mode=0o755), (info, b"\0" * 512)])
    with pytest.raises(StorageScaleUsageError) as usage:
        EmbeddedDCache.check_version(str(tarball))
    # a tarball of 1 KB may hold 64 MiB (the floor of 20 times its size)
    assert (f"member {info.name!r} makes it hold more than 64 MiB unpacked, 20 times the "
            f"tarball's size") in str(usage.value), usage.value
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(EndpointError, match="more than 64 MiB unpacked"):
        EmbeddedDCache()._unpack(tarball, run / "dist")
    assert not (run / "dist").exists()  # a refused release is not left behind


def test_a_tarball_may_grow_twenty_times_its_size(tmp_path):
    """The unpacked bound is at most 20 times the tarball's size (dCache's: 1.2), so a
    bomb's first large member is refused at its header, before its data is
    decompressed; a release's size stays within it."""
    assert tarballs.byte_bound(_tarball(tmp_path / "small.tar.gz", [])) == 64 << 20
    big = tmp_path / "big.tar.gz"
    with open(big, "wb") as stream:
        stream.truncate(10 << 20)  # only its size counts here
    assert tarballs.byte_bound(big) == 200 << 20
    stream_path = tmp_path / "huge.tar.gz"
    with open(stream_path, "wb") as stream:
        stream.truncate(170 << 20)  # a dCache tarball's size: the 1 GiB bound applies
    assert tarballs.byte_bound(stream_path) == tarballs.MAX_BYTES
    zeros = _tarball(tmp_path / "dcache-11.2.5.tar.gz",
                     [_member(f"{TOP}/share/zero", data=bytes(80 << 20))])
    assert zeros.stat().st_size < 1 << 20
    with pytest.raises(StorageScaleUsageError, match=r"member '.*/zero' makes it hold more "
                                                     r"than 64 MiB unpacked, 20 times"):
        EmbeddedDCache.check_version(str(zeros))


def test_a_compression_bomb_stops_at_the_bound_not_at_its_end(monkeypatch, tmp_path):
    """Members of zeros past the bytes bound (lowered here to 4 MiB) and past the
    members bound (lowered to 50): the check stops at the first member over it, at
    the option's check and at the unpack, and nothing past the bound is written."""
    monkeypatch.setattr(tarballs, "MAX_BYTES", 4 << 20)
    zeros = [_member(f"{TOP}/share/zero{index}", data=bytes(1 << 20)) for index in range(8)]
    tarball = _tarball(tmp_path / "dcache-11.2.5.tar.gz", zeros)
    with pytest.raises(StorageScaleUsageError, match=r"member '.*/zero3' makes it hold "
                                                     r"more than 4 MiB unpacked"):
        EmbeddedDCache.check_version(str(tarball))
    target = tmp_path / "dist"
    target.mkdir()
    assert "zero3' makes it hold more than 4 MiB" in unpack(tarball, target)
    assert not (target / TOP / "share" / "zero3").exists()
    assert sum(path.stat().st_size for path in target.rglob("*") if path.is_file()) <= 4 << 20

    monkeypatch.setattr(tarballs, "MAX_MEMBERS", 50)
    (tmp_path / "many").mkdir()
    many = _tarball(tmp_path / "many" / "dcache-11.2.5.tar.gz",
                    [_member(f"{TOP}/share/f{index}", data=b"") for index in range(60)])
    with pytest.raises(StorageScaleUsageError, match=r"member '.*/f49' makes it hold more "
                                                     r"than 50 members"):
        EmbeddedDCache.check_version(str(many))


def test_links_are_followed_through_the_whole_tarball():
    """The resolver the option's check uses: links of the final tree followed as the
    kernel would, a later link counting for an earlier path."""
    links = {"top/a/b/c": "../../d", "top/loop": "loop2", "top/loop2": "loop"}
    assert tarballs.resolve("top/a/b/c/x", links) == "top/d/x"
    assert tarballs.resolve("top/a/b/c/../..", links) == ""  # c/.. is top, not top/a/b
    assert tarballs.resolve("top/a/b/c/../../..", links) is None
    assert tarballs.resolve("top/loop/x", links) is None  # a loop: refused
    assert tarballs.resolve("top/abs", {"top/abs": "/etc"}) is None


def test_a_header_too_large_stops_the_stream_at_the_bound(monkeypatch, tmp_path):
    """tarfile reads a pax header's data whole before the member it describes is
    seen: the decompressed stream itself is bounded (bound lowered here to 1 MiB of
    data and 1 MiB of headers), so an 8 MiB pax header stops at 2 MiB, at the option's
    check and at the unpack."""
    monkeypatch.setattr(tarballs, "RATIO_FLOOR", 1 << 20)
    monkeypatch.setattr(tarballs, "HEADER_ROOM", 1 << 20)
    pax, _ = _member(f"{TOP}/share/x", kind=tarfile.XHDTYPE)
    pax.size = 8 << 20
    tarball = _header_only(tmp_path / "dcache-11.2.5.tar.gz", [
        _member(f"{TOP}/bin/dcache", data=b"#!/bin/sh\n", mode=0o755),
        (pax, b"1" * (8 << 20)), _member(f"{TOP}/share/x")])
    with pytest.raises(StorageScaleUsageError, match=r"not a dCache distribution tarball: "
                                                     r"it unpacks to more than 2 MiB"):
        EmbeddedDCache.check_version(str(tarball))
    target = tmp_path / "dist"
    target.mkdir()
    assert unpack(tarball, target).startswith("it unpacks to more than 2 MiB")
