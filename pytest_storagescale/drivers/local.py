"""The reference driver: a local directory as storage (``file:///path``).

Fast and dependency-free; the plugin's unit tests use it to exercise the engine,
the thresholds and the reports. Behaviour against real storage is tested with the
XRootD and gfal2 drivers against real servers.
"""

from __future__ import annotations

import mmap
import os
import zlib

from ..errors import StorageError, StorageNotFound, StoragePermissionDenied
from .base import Driver, StatInfo


class LocalDriver(Driver):
    """A POSIX directory; every client shares the local file system."""

    name = "local"
    schemes = ("file",)

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
        return StatInfo(size=st.st_size, is_dir=os.path.isdir(path))

    def _ls(self, path: str) -> list[str]:
        return sorted(self._call("ls", path, os.listdir, path))

    def _mkdir(self, path: str) -> None:
        self._call("mkdir", path, os.makedirs, path, 0o755, True)

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
        return self._call("write", path, write)

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
