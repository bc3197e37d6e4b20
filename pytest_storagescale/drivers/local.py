"""The reference driver: a local directory as storage (``file:///path``).

Fast and dependency-free; the plugin's unit tests use it to exercise the engine,
the thresholds and the reports. Behaviour against real storage is tested with the
XRootD and gfal2 drivers against real servers.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat as stat_module
import zlib

from ..errors import StorageError, StorageNotFound, StoragePermissionDenied
from .base import Driver, StatInfo

#: open a directory, never through a link (a link fails with ELOOP)
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class LocalDriver(Driver):
    """A POSIX directory; every client shares the local file system."""

    name = "local"
    files_per_client = 1
    native_library = False
    schemes = ("file",)
    protocol_family = "file"

    def _fail(self, exc: OSError, operation: str, path: str):
        kwargs = dict(
            driver=self.name, endpoint="file://", operation=operation, path=path,
            native_status=f"errno={exc.errno}",
        )
        if isinstance(exc, FileNotFoundError):
            return StorageNotFound(exc.strerror or str(exc), error_class="not_found", **kwargs)
        if isinstance(exc, PermissionError):
            return StoragePermissionDenied(exc.strerror or str(exc), error_class="permission",
                                           **kwargs)
        return StorageError(exc.strerror or str(exc), error_class=f"errno_{exc.errno}", **kwargs)

    def _call(self, operation: str, path: str, function, *args):
        try:
            return function(*args)
        except OSError as exc:
            raise self._fail(exc, operation, path) from None

    def _stat(self, path: str) -> StatInfo:
        st = self._call("stat", path, os.stat, path)
        return StatInfo(size=st.st_size, is_dir=os.path.isdir(path), modified=st.st_mtime)

    def _ls(self, path: str) -> list[str]:
        return sorted(self._call("ls", path, os.listdir, path))

    def _mkdir(self, path: str) -> None:
        self._call("mkdir", path, os.makedirs, path, 0o755, True)

    def _mkdir_exclusive(self, path: str) -> None:
        # one system call: fails on anything already there, a link included
        self._call("mkdir", path, os.mkdir, path, 0o755)

    def remove_tree(self, path: str, *, not_before: float | None = None) -> int:
        """Delete ``path`` and what is below it, never following a link: every entry
        is removed relative to its parent's open descriptor, a directory is opened
        with ``O_NOFOLLOW`` and must be the one ``lstat`` saw (device and inode), so
        a link swapped in during the walk is removed itself, not what it points to.
        ``not_before`` is not needed here: unlinking a link never touches its target."""
        self._guard("delete", path)
        parent, _, name = os.path.normpath(path).rpartition("/")
        try:
            parent_fd = self._open_parent(parent or "/")
        except FileNotFoundError:
            return 0
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return 0  # reached only through a link: not in the run directory
            raise self._fail(exc, "delete", path) from None
        try:
            return self._remove_at(parent_fd, name, path)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise self._fail(exc, "delete", path) from None
        finally:
            os.close(parent_fd)

    def _open_parent(self, parent: str) -> int:
        """The parent directory, walked down from the run directory without following
        a link (the test area above it is the user's and is opened as given)."""
        root = os.path.normpath(self.writable_root or "/")
        if parent != root and not parent.startswith(root + "/"):
            return os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        base, _, root_name = root.rpartition("/")
        area_fd = os.open(base or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            descriptor = os.open(root_name, _DIRECTORY_FLAGS, dir_fd=area_fd)
        finally:
            os.close(area_fd)
        for name in filter(None, parent[len(root) + 1:].split("/")):
            try:
                child = os.open(name, _DIRECTORY_FLAGS, dir_fd=descriptor)
            finally:
                os.close(descriptor)
            descriptor = child
        return descriptor

    def _remove_at(self, parent_fd: int, name: str, path: str) -> int:
        seen = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat_module.S_ISDIR(seen.st_mode):
            os.unlink(name, dir_fd=parent_fd)  # a link is removed, not its target
            return 1
        try:
            descriptor = os.open(name, _DIRECTORY_FLAGS, dir_fd=parent_fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            os.unlink(name, dir_fd=parent_fd)  # became a link after the lstat
            return 1
        removed = 0
        try:
            opened = os.fstat(descriptor)
            if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
                raise StorageError(
                    "replaced while being removed; not followed", driver=self.name,
                    endpoint="file://", operation="delete", path=path,
                    error_class="not_removed")
            with os.scandir(descriptor) as entries:
                names = [entry.name for entry in entries]
            for child in names:
                removed += self._remove_at(descriptor, child, f"{path}/{child}")
        finally:
            os.close(descriptor)
        os.rmdir(name, dir_fd=parent_fd)
        return removed + 1

    def _put(self, path: str, data: bytes) -> int:
        def write() -> int:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                return handle.write(data)
        return self._call("put", path, write)

    def write_sequential(self, path: str, data: bytes, block_size: int, sync: str) -> int:
        """dd-like: ``dsync`` opens with O_DSYNC, ``direct`` with O_DIRECT (through a
        page-aligned buffer, whole blocks)."""
        self._guard("put", path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        flags |= {"none": 0, "dsync": os.O_DSYNC, "direct": os.O_DIRECT}[sync]

        def write() -> int:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            descriptor = os.open(path, flags, 0o644)
            buffer = mmap.mmap(-1, block_size)  # page-aligned, as O_DIRECT needs
            written = 0
            try:
                for offset in range(0, len(data) - len(data) % block_size, block_size):
                    buffer[:] = data[offset:offset + block_size]
                    written += os.write(descriptor, buffer)
            finally:
                buffer.close()
                os.close(descriptor)
            return written
        written = self._call("write", path, write)
        self._made(path, "file", written)
        return written

    def _get(self, path: str, local_path: str | None) -> int:
        def copy() -> int:
            total = 0
            with open(path, "rb") as source:
                sink = open(local_path, "wb") if local_path else None
                try:
                    while chunk := source.read(8 * 1024 * 1024):
                        total += len(chunk)
                        if sink:
                            sink.write(chunk)
                finally:
                    if sink:
                        sink.close()
            return total
        return self._call("get", path, copy)

    def _read(self, path: str, offset: int, size: int) -> bytes:
        def read() -> bytes:
            with open(path, "rb") as handle:
                return os.pread(handle.fileno(), size, offset)
        return self._call("read", path, read)

    def _readv(self, path: str, chunks: list[tuple[int, int]]) -> int:
        def readv() -> int:
            with open(path, "rb") as handle:
                return sum(len(os.pread(handle.fileno(), s, o)) for o, s in chunks)
        return self._call("readv", path, readv)

    def _delete(self, path: str) -> None:
        self._call("delete", path, os.unlink, path)

    def _rmdir(self, path: str) -> None:
        self._call("rmdir", path, os.rmdir, path)

    def _rename(self, source: str, target: str) -> None:
        self._call("rename", source, os.rename, source, target)

    def _checksum(self, path: str, algorithm: str) -> str:
        if algorithm.lower() != "adler32":
            raise StorageError(
                f"checksum {algorithm} not supported (adler32 is)", driver=self.name,
                endpoint="file://", operation="checksum", path=path,
                error_class="checksum_type",
            )

        def adler32() -> str:
            value = 1
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    value = zlib.adler32(chunk, value)
            return f"{value:08x}"
        return self._call("checksum", path, adler32)

    def _version(self) -> str:
        return "local"
