"""A release tarball (a site's own, given by path) unpacked without writing outside its
folder: Python's ``tarfile``, each member checked as the ``data`` extraction filter of
Python 3.12 does (not in Debian's Python 3.11.2): no absolute name or ``..``, no link
leading out of the folder, no device or pipe, no setuid/setgid/sticky bit; owned by the
user who unpacks (root would take the tarball's owners), no group/other write bit.

A link is judged against the tarball's whole tree, not only what came before it: a link
whose target leaves the folder only once a later member exists (``a -> x/../..``, then
``x -> .``) is refused, at the option's check (:func:`first_problem`, every link and
every member's folder resolved through the tarball's final set of links, as the kernel
would) and at the unpack (:func:`unpack`: each member's path through the links on disk,
then every link of the finished tree with ``realpath``). A link to the folder it is in
or to one above it (``.``, ``..``, ``../..`` inside the tree) is refused too: no dCache
release holds one, and such a link turns a lexical path check into a wrong one.

A tarball is bounded (a gzip bomb): at most :data:`MAX_MEMBERS` members and
:func:`byte_bound` unpacked (:data:`MAX_BYTES`, and no more than :data:`MAX_RATIO` times
its compressed size: a release of jars barely compresses), judged from each member's
header before its data is read, so a bomb is refused at the header of its first large
member, before decompressing it. A refused tarball names its member; an unreadable or
truncated one says so.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import posixpath
import stat
import tarfile
from pathlib import Path

#: the mode bits a member may not carry
_SPECIAL_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX
#: the most members a release tarball may hold (dCache 10.2.25: 768, 11.2.5: 792)
MAX_MEMBERS = 20_000
#: the most bytes its members may hold unpacked (dCache 10.2.25: 192 MiB, 11.2.5: 187 MiB)
MAX_BYTES = 1 << 30
#: the most a tarball may grow when unpacked, times its compressed size (dCache 11.2.5:
#: 1.2; a gzip bomb: ~1000), and the bound below which the ratio is not applied
MAX_RATIO, RATIO_FLOOR = 20, 64 << 20
#: what a tarball's stream may hold beyond its members' data: headers (tarfile reads
#: a pax or GNU long-name header's data whole, before the member it describes is seen)
HEADER_ROOM = 32 << 20
#: links followed in one path before it counts as a loop (Linux's own limit)
MAX_LINK_HOPS = 40


def _clean(name: str) -> str:
    """A member's name as a relative path (``./a/b/`` -> ``a/b``)."""
    return posixpath.normpath(name.removeprefix("./")).removeprefix("./")


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
        if member.issym():
            here = _clean(os.path.dirname(name))
            if target == "." or here == target or here.startswith(target + "/"):
                return (f"is a link to the folder it is in or one above it (to "
                        f"{member.linkname!r})")
    elif not (member.isfile() or member.isdir()):
        return "is a device, pipe or other special file"
    if member.mode & _SPECIAL_BITS:
        return f"has a setuid, setgid or sticky bit (mode {member.mode:o})"
    return ""


def byte_bound(tarball: Path) -> int:
    """The most bytes ``tarball``'s members may hold: :data:`MAX_BYTES`, and at most
    :data:`MAX_RATIO` times its size (but not below :data:`RATIO_FLOOR`)."""
    return min(MAX_BYTES, max(RATIO_FLOOR, MAX_RATIO * os.path.getsize(tarball)))


class TooLarge(OSError):
    """The decompressed stream passed its bound."""


class _Bounded(io.RawIOBase):
    """A tarball's decompressed stream (gzip's reader, which decompresses as much as
    asked, not a whole compressed chunk) that raises :class:`TooLarge` past ``limit``
    bytes, whatever part of tarfile reads it."""

    def __init__(self, tarball: Path, limit: int) -> None:
        super().__init__()
        self.stream = gzip.open(tarball, "rb")
        self.limit, self.total = limit, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        data = self.stream.read(min(len(buffer), 1 << 20))
        self.total += len(data)
        if self.total > self.limit:
            raise TooLarge(f"it unpacks to more than {self.limit >> 20:,} MiB (a compression "
                           f"bomb, or not a release)")
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        self.stream.close()
        super().close()


@contextlib.contextmanager
def _members(tarball: Path, bound: int):
    """``tarball`` as a tarfile stream whose decompressed bytes are bounded."""
    with _Bounded(tarball, bound + HEADER_ROOM) as raw, \
            tarfile.open(fileobj=io.BufferedReader(raw), mode="r|") as archive:
        yield archive


def _bound_problem(member: tarfile.TarInfo, count: int, total: int, bound: int) -> str:
    """Why the tarball is too large once ``member`` (the ``count``-th, ``total`` bytes
    with it) is read ("" when it is not)."""
    if count > MAX_MEMBERS:
        return (f"makes it hold more than {MAX_MEMBERS:,} members (a dCache release has "
                f"about 800)")
    if total > bound:
        limit = (f"{MAX_RATIO} times the tarball's size" if bound < MAX_BYTES
                 else "the bound for a release")
        return (f"makes it hold more than {bound >> 20:,} MiB unpacked, {limit} (a dCache "
                f"release holds about 190 MiB in a 170 MB tarball): a compression bomb, or "
                f"not a release")
    return ""


def resolve(path: str, links: dict[str, str]) -> str | None:
    """``path`` (relative to the tree's root) with every link of ``links`` (a link's
    name -> its target, the tree's final links) followed as the kernel would; None when
    it leaves the root (or loops)."""
    pending = [part for part in path.split("/") if part]
    done: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                return None
            done.pop()
            continue
        candidate = "/".join([*done, part])
        if candidate in links:
            hops += 1
            target = links[candidate]
            if hops > MAX_LINK_HOPS or target.startswith("/"):
                return None
            pending = [piece for piece in target.split("/") if piece] + pending
            continue
        done.append(part)
    return "/".join(done)


def first_problem(tarball: Path) -> str:
    """``member 'NAME' WHY`` of the first member that may not be unpacked, ``it cannot
    be read ...`` when the tarball is broken or truncated, "" for neither: the tarball is
    read once as a stream, nothing unpacked, every member's header bounded
    (:data:`MAX_MEMBERS`, :data:`MAX_BYTES`) before its data is read; then every link
    and every member's folder resolved through the tree's final links."""
    members: dict[str, tarfile.TarInfo] = {}
    try:
        bound = byte_bound(tarball)
        with _members(tarball, bound) as archive:
            total = 0
            for count, member in enumerate(archive, start=1):
                total += max(member.size, 0)
                why = member_problem(member) or _bound_problem(member, count, total, bound)
                if why:
                    return f"member {member.name!r} {why}"
                members[_clean(member.name)] = member
    except TooLarge as exc:
        return str(exc)
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        return f"it cannot be read as a gzip tar ({exc})"
    links = {name: member.linkname for name, member in members.items() if member.issym()}
    for name, member in members.items():
        folder = posixpath.dirname(name)
        if folder and resolve(folder, links) is None:
            return (f"member {member.name!r} leads out of the release folder through a "
                    f"link of the tarball")
        if member.issym() and resolve(posixpath.join(folder, member.linkname),
                                      links) is None:
            return (f"member {member.name!r} is a link out of the release folder through "
                    f"another link of the tarball (to {member.linkname!r})")
        if member.islnk() and resolve(member.linkname, links) is None:
            return (f"member {member.name!r} is a hard link out of the release folder "
                    f"(to {member.linkname!r})")
    return ""


def _inside(path: str, folder: str) -> bool:
    real = os.path.realpath(path)
    return real == folder or real.startswith(folder + os.sep)


def unpack(tarball: Path, target: Path) -> str:
    """Unpack ``tarball`` into the folder ``target``; ``member 'NAME' WHY`` of the
    first member refused (what was unpacked before it stays, in ``target``: the
    caller removes it), why it cannot be read, or ""."""
    folder = os.path.realpath(target)
    try:
        why = _unpack(tarball, folder)
    except TooLarge as exc:
        return str(exc)
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        return f"it cannot be read as a gzip tar ({exc})"
    return why or _links_leaving(folder)


def _unpack(tarball: Path, folder: str) -> str:
    bound = byte_bound(tarball)
    with _members(tarball, bound) as archive:
        if hasattr(tarfile, "data_filter"):  # a Python that has it applies it too
            setattr(archive, "extraction_filter", tarfile.data_filter)  # noqa: B010
        total = 0
        for count, member in enumerate(archive, start=1):
            total += max(member.size, 0)
            why = member_problem(member) or _bound_problem(member, count, total, bound)
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


def _links_leaving(folder: str) -> str:
    """``member 'NAME' ...`` of a link of the unpacked tree that leads out of
    ``folder`` now that every member is there ("" when none does)."""
    for parent, folders, files in os.walk(folder):  # links to folders are not entered
        for entry in [*folders, *files]:
            path = os.path.join(parent, entry)
            if os.path.islink(path) and not _inside(path, folder):
                name = os.path.relpath(path, folder)
                return (f"member {name!r} is a link out of the release folder once the "
                        f"whole tarball is unpacked (to {os.readlink(path)!r})")
    return ""
