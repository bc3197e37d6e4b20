"""A release tarball (a site's own, given by path) unpacked without writing outside its
folder: Python's ``tarfile``, each member checked as the ``data`` extraction filter of
Python 3.12 does (not in Debian's Python 3.11.2): no absolute name or ``..``, no link
leading out of the folder (on disk, through links unpacked before it), no device or
pipe, no setuid/setgid/sticky bit; owned by the user who unpacks (root would take the
tarball's owners), no group/other write bit. A refused tarball names its member."""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

#: the mode bits a member may not carry
_SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX


def member_problem(member: tarfile.TarInfo) -> str:
    """Why ``member`` may not be unpacked, read from its header alone ("" when it may)."""
    name = member.name
    if name.startswith("/") or os.path.isabs(name):
        return "has an absolute name"
    if ".." in Path(name).parts:
        return "names a parent folder (..)"
    if member.issym() or member.islnk():
        base = os.path.dirname(name) if member.issym() else ""
        target = os.path.normpath(os.path.join(base, member.linkname))
        if os.path.isabs(member.linkname) or target == ".." or target.startswith("../"):
            return f"is a link out of the release folder (to {member.linkname!r})"
    elif not (member.isfile() or member.isdir()):
        return "is a device, pipe or other special file"
    if member.mode & _SPECIAL_BITS:
        return f"has a setuid, setgid or sticky bit (mode {member.mode:o})"
    return ""


def first_problem(tarball: Path) -> str:
    """``member 'NAME' WHY`` of the first member that may not be unpacked ("" for none);
    the whole tarball is read as a stream, nothing unpacked (a second for dCache's)."""
    with tarfile.open(tarball, "r|gz") as archive:
        for member in archive:
            if why := member_problem(member):
                return f"member {member.name!r} {why}"
    return ""


def _inside(path: str, folder: str) -> bool:
    real = os.path.realpath(path)
    return real == folder or real.startswith(folder + os.sep)


def unpack(tarball: Path, target: Path) -> str:
    """Unpack ``tarball`` into the folder ``target``; ``member 'NAME' WHY`` of the
    first member refused (what was unpacked before it stays, in ``target``), why it
    cannot be read, or ""."""
    folder = os.path.realpath(target)
    try:
        return _unpack(tarball, folder)
    except (tarfile.TarError, OSError, EOFError) as exc:
        return f"it cannot be read as a gzip tar ({exc})"


def _unpack(tarball: Path, folder: str) -> str:
    with tarfile.open(tarball, "r|gz") as archive:
        if hasattr(tarfile, "data_filter"):  # a Python that has it applies it too
            setattr(archive, "extraction_filter", tarfile.data_filter)  # noqa: B010
        for member in archive:
            why = member_problem(member)
            if not why and not _inside(os.path.join(folder, member.name), folder):
                why = "leads out of the release folder through a link unpacked before it"
            if not why and member.issym() and not _inside(os.path.join(
                    folder, os.path.dirname(member.name), member.linkname), folder):
                why = f"is a link out of the release folder (to {member.linkname!r})"
            if not why and member.islnk() and not _inside(
                    os.path.join(folder, member.linkname), folder):
                why = f"is a hard link out of the release folder (to {member.linkname!r})"
            if why:
                return f"member {member.name!r} {why}"
            member.uid, member.gid, member.uname, member.gname = (
                os.getuid(), os.getgid(), "", "")
            member.mode &= ~(stat.S_IWGRP | stat.S_IWOTH)
            archive.extract(member, folder)
    return ""
