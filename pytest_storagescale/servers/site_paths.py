"""Whether a release a site names by its path (``--storage-embedded-version PATH``: an
XRootD installation prefix, a dCache tarball) is this user's to run.

The embedded server runs that release's programs as the user running pytest (root in
CI): a file or folder of it that another user may change, or one of the folders above
it, would let that user run code as this one. :func:`others_control` says which and
why; the server kinds make it a usage error before anything runs."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def _owner(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return f"uid {uid}"


def _why(path: Path, info: os.stat_result, inside: bool) -> str:
    """Why another user may change ``path`` ("" none). ``inside``: a part of the
    release itself (no sticky-folder exception: anyone could add files to it)."""
    if info.st_uid not in (0, os.geteuid()):
        return f"{path} is owned by {_owner(info.st_uid)}"
    sticky = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX and not inside
    if info.st_mode & stat.S_IWOTH and not sticky:
        return f"{path} is writable by every user"
    if info.st_mode & stat.S_IWGRP and info.st_gid not in (0, os.getegid()) and not sticky:
        return f"{path} is writable by its group (gid {info.st_gid})"
    return ""


def others_control(*paths: Path) -> str:
    """Why another user than this one (or root) may change one of ``paths`` (each
    followed through its links) or a folder above it; "" when none may."""
    seen: set[Path] = set()
    for given in paths:
        try:
            target = given.resolve(strict=True)
        except (OSError, RuntimeError):
            continue  # what is missing is said by the caller's own checks
        for index, path in enumerate([target, *target.parents]):
            if path in seen:
                continue
            seen.add(path)
            try:
                info = path.stat()
            except OSError:
                continue
            if why := _why(path, info, inside=index == 0):
                return why
    return ""


def control_problem(option_value: str, paths: list[Path]) -> str:
    """The usage error's text when another user controls one of ``paths`` ("")."""
    why = others_control(*paths)
    if not why:
        return ""
    return (f"--storage-embedded-version {option_value}: {why}, so another user could "
            f"change the release this run executes as {_owner(os.geteuid())}. Give a copy "
            f"that only you (or root) can change: e.g. 'cp -a' it into a folder of yours, "
            f"or 'chmod go-w' and 'chown' the files and the folders above them.")


#: the most members read of a tarball looking for its program (a dCache tarball has
#: it among the first thousand)
TARBALL_MEMBERS = 100_000


def tarball_problem(tarball: Path, program: str) -> str:
    """Why ``tarball`` is no gzip tar with ``<top>/<program>`` in it ("" when it is);
    read as a stream up to that member, nothing unpacked."""
    import tarfile

    try:
        with tarfile.open(tarball, "r|gz") as archive:
            for count, member in enumerate(archive):
                top, _, rest = member.name.removeprefix("./").partition("/")
                if rest == program and top not in ("", "..") and member.isfile():
                    return ""
                if count >= TARBALL_MEMBERS:
                    break
    except (tarfile.TarError, OSError, EOFError) as exc:
        return f"it cannot be read as a gzip tar ({exc})"
    return f"it holds no <release folder>/{program}"


def check_release_tarball(option_value: str, tarball: Path, program: str, kind: str) -> None:
    """A usage error when ``tarball`` is no ``kind`` distribution (``program`` missing)
    or another user may change it."""
    from ..errors import StorageScaleUsageError

    if why := tarball_problem(tarball, program):
        raise StorageScaleUsageError(
            f"--storage-embedded-version {option_value}: not a {kind} distribution tarball: "
            f"{why}. Give the {kind} distribution's own tarball (as its project publishes "
            f"it, dcache-VERSION.tar.gz with {program} in its release folder), or a "
            f"release of the distribution cache.")
    if controlled := control_problem(option_value, [tarball]):
        raise StorageScaleUsageError(controlled)
