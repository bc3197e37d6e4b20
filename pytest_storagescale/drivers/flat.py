"""Directories on a flat object namespace (driver option ``flat_namespace=true``).

An XRootD gateway over Ceph (``libXrdCeph``, RAL's Echo) stores objects in a pool:
``mkdir`` and ``rmdir`` succeed and store nothing, ``stat`` of a "directory" is *not
found*, and only the pool's root ``/`` can be listed (every object's full name).
XRootD 5.5.3 also lists each name without its last character (``ceph_posix_readdir``
copies one byte too few).

The plugin's run directory, owner file and clean-up need directories, so a driver
with this option treats a name prefix as a directory:

- ``stat`` of a path that is not an object: a directory when objects are named below it;
- ``ls``: the names below the prefix, from the pool's listing; a leaf name the
  gateway cut short is completed by ``stat`` (as listed, else with each character of
  :data:`NAME_CHARACTERS` appended);
- ``rmdir`` of a prefix with objects below it is refused as *not empty* (so the
  clean-up descends instead of believing the gateway);
- making the run directory exclusively checks that nothing is named below it.

Listing the pool is fine for the embedded gateway and a test pool; on a production
pool with millions of objects every such call lists them all: point the suite at a
small pool of its own.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from ..errors import StorageError, StorageNotFound
from .base import StatInfo

#: the option that switches it on, and the values that mean yes
OPTION = "flat_namespace"
TRUE_VALUES = ("1", "true", "yes", "on")
#: characters tried to complete a listed name the gateway cut short (the plugin's
#: own names end in one of these)
NAME_CHARACTERS = ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                   "._-+=~")
#: what ``stat`` answers for a name prefix with objects below it
DIRECTORY = StatInfo(size=0, is_dir=True, modified=None)


class ServerCalls(Protocol):
    """The driver's own requests this module builds on (no flat handling in them)."""

    def _server_stat(self, path: str) -> StatInfo: ...

    def _server_ls(self, path: str) -> list[str]: ...


def enabled(options) -> bool:
    return str(options.get(OPTION, "")).strip().lower() in TRUE_VALUES


def names_below(driver: ServerCalls, path: str) -> list[str]:
    """Every object below ``path/`` as the pool's listing names it, relative to
    ``path`` (a leaf possibly cut short by one character)."""
    prefix = path.strip("/") + "/"
    found = []
    for name in driver._server_ls("/"):
        name = name.lstrip("/")
        if name.startswith(prefix):  # "" when a one-character name was cut
            found.append(name[len(prefix):])
    return found


def stat(driver: ServerCalls, path: str) -> StatInfo:
    """The object's stat, else :data:`DIRECTORY` when objects are named below it."""
    try:
        return driver._server_stat(path)
    except StorageNotFound:
        if path.strip("/") and names_below(driver, path):
            return DIRECTORY
        raise


def listing(driver: ServerCalls, path: str) -> list[str]:
    """The server's listing, else the entries below the prefix: sub-prefixes and the
    objects' names (completed when cut short; dropped when no completion exists)."""
    try:
        return driver._server_ls(path)
    except StorageNotFound:
        below = names_below(driver, path) if path.strip("/") else []
        if not below:
            raise
    entries: set[str] = set()
    leaves: Counter[str] = Counter()
    for rest in below:
        child, slash, _ = rest.partition("/")
        if slash:
            entries.add(child)
        else:
            leaves[child] += 1
    for listed, count in leaves.items():
        entries.update(complete_names(driver, path, listed, count))
    return sorted(entries)


def complete_names(driver: ServerCalls, folder: str, listed: str, count: int) -> list[str]:
    """The whole names of the ``count`` objects listed as ``listed``: ``listed`` itself
    when it exists, and ``listed`` plus each character the gateway may have dropped
    (several names can be cut to the same text: ``file-00001``, ``file-00002``)."""
    found: list[str] = []
    for name in (listed, *(listed + extra for extra in NAME_CHARACTERS)):
        if len(found) == count:
            break
        if not name:
            continue
        try:
            if not driver._server_stat(f"{folder.rstrip('/')}/{name}").is_dir:
                found.append(name)
        except StorageNotFound:
            continue
    return found


def refuse_if_not_empty(driver: ServerCalls, path: str, *, name: str, server: str) -> None:
    """``rmdir`` of a prefix with objects below it: refused as not empty (the gateway
    itself answers success and removes nothing)."""
    if names_below(driver, path):
        raise StorageError("directory not empty: objects are named below this prefix",
                           driver=name, endpoint=server, operation="rmdir", path=path,
                           error_class="not_empty")


def refuse_if_taken(driver: ServerCalls, path: str, *, name: str, server: str) -> None:
    """Making the run directory exclusively: the parent must be a directory (a prefix
    with objects, or the root) and nothing may be named ``path`` or below it."""
    parent = path.rstrip("/").rpartition("/")[0] or "/"
    if parent != "/" and not stat(driver, parent).is_dir:
        raise StorageError("the parent is not a directory", driver=name, endpoint=server,
                           operation="mkdir", path=path, error_class="not_a_directory")
    try:
        stat(driver, path)
    except StorageNotFound:
        return
    raise StorageError("file exists", driver=name, endpoint=server, operation="mkdir",
                       path=path, error_class="exists")
