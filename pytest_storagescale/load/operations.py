"""The operations a load step repeats: stat, ls, mkdir, put, get, read, readv, delete,
and ``mixed`` (readers and writers at once).

An operation is described by plain data so that spawned worker processes can
rebuild it: ``OPERATIONS[name]`` plus the step's parameters and the context that
:meth:`Operation.prepare` returned. ``prepare`` runs once per step, untimed (it
creates the files a step reads); :meth:`Operation.run` is one timed repetition by
one client and returns the bytes it moved.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from ..config import parse_byte_size
from ..drivers.base import Driver
from ..errors import StorageScaleUsageError


@functools.lru_cache(maxsize=8)
def payload(size: int) -> bytes:
    """Incompressible data of ``size`` bytes, made once per process and size."""
    return os.urandom(size)


class Operation:
    """One kind of request a client repeats back to back."""

    name: ClassVar[str] = ""
    #: per-op keys allowed in ``[ops.<name>]`` and their defaults
    defaults: ClassVar[dict[str, Any]] = {}
    #: sides of a composite step (``mixed``); empty for a plain operation
    sides: ClassVar[tuple[str, ...]] = ()
    #: valid values of string parameters
    choices: ClassVar[dict[str, tuple[str, ...]]] = {}

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(self.defaults)

    def parse_params(self, table: dict[str, Any], *, where: str) -> dict[str, Any]:
        params = dict(self.defaults)
        for key, value in table.items():
            default = self.defaults[key]
            if key.endswith("size"):
                params[key] = parse_byte_size(value, what=f"{where}.{key}")
            elif isinstance(default, bool):
                if not isinstance(value, bool):
                    raise StorageScaleUsageError(f"{where}.{key}: must be true or false.")
                params[key] = value
            elif isinstance(default, int):
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise StorageScaleUsageError(
                        f"{where}.{key}: {value!r} must be a positive whole number."
                    )
                params[key] = value
            elif isinstance(default, str):
                if value not in self.choices[key]:
                    raise StorageScaleUsageError(
                        f"{where}.{key}: unknown value {value!r}. Valid values: "
                        f"{', '.join(self.choices[key])}."
                    )
                params[key] = value
        self.check_params(params, where=where)
        return params

    def check_params(self, params: dict[str, Any], *, where: str) -> None:
        """Reject parameter combinations the operation cannot run with."""

    def groups(self, clients: int) -> list[tuple[str, Operation, int]]:
        """The sides of a step at ``clients``: (side name, operation, client count)."""
        return [(self.name, self, clients)]

    def prepare(self, driver: Driver, workdir: str, params: dict, clients: int) -> dict:
        """Create what the step reads (untimed); return a picklable context."""
        driver.mkdir(workdir)
        return {"workdir": workdir, **params}

    def cleanup(self, context: dict) -> None:
        """Remove local leftovers of the step (the remote workdir is removed by the caller)."""

    def before(self, driver: Driver, client: int, iteration: int, context: dict) -> None:
        """Untimed set-up of one repetition (e.g. the file ``delete`` removes)."""

    def run(self, driver: Driver, client: int, iteration: int, context: dict) -> int:
        raise NotImplementedError


def _sample_file(driver: Driver, path: str, size: int) -> None:
    driver.put(path, payload(size) if size else b"")


def _sample_files(driver: Driver, paths: list[str], size: int, parallel: int = 16) -> None:
    """Create many sample files with ``parallel`` uploads in flight (untimed set-up)."""
    with ThreadPoolExecutor(parallel, thread_name_prefix="storagescale-prepare") as pool:
        list(pool.map(lambda path: _sample_file(driver, path, size), paths))


class Stat(Operation):
    """``stat`` of one existing file."""

    name = "stat"
    defaults = {"file_size": 1024}

    def prepare(self, driver, workdir, params, clients):
        context = super().prepare(driver, workdir, params, clients)
        context["target"] = f"{workdir}/stat-target"
        _sample_file(driver, context["target"], params["file_size"])
        return context

    def run(self, driver, client, iteration, context):
        driver.stat(context["target"])
        return 0


class List(Operation):
    """``ls`` of a directory with ``entries`` files (the seeds' ``lcg-ls`` of a test dir)."""

    name = "ls"
    defaults = {"entries": 10}

    def prepare(self, driver, workdir, params, clients):
        context = super().prepare(driver, workdir, params, clients)
        context["target"] = f"{workdir}/ls-dir"
        driver.mkdir(context["target"])
        _sample_files(driver, [f"{context['target']}/entry-{i:05d}"
                               for i in range(params["entries"])], 0)
        return context

    def run(self, driver, client, iteration, context):
        names = driver.ls(context["target"])
        if len(names) != context["entries"]:
            raise ValueError(f"ls returned {len(names)} entries, expected {context['entries']}")
        return 0


class MakeDir(Operation):
    """``mkdir`` of a new directory per repetition."""

    name = "mkdir"

    def run(self, driver, client, iteration, context):
        driver.mkdir(f"{context['workdir']}/c{client:05d}-{iteration:07d}")
        return 0


class Put(Operation):
    """Write a new ``file_size`` file per repetition (xrdcp / lcg-cp to the storage)."""

    name = "put"
    defaults = {"file_size": 1_000_000}

    def run(self, driver, client, iteration, context):
        path = f"{context['workdir']}/c{client:05d}-{iteration:07d}"
        return driver.put(path, payload(context["file_size"]))


class Get(Operation):
    """Read a whole file. Client ``c`` at repetition ``r`` reads file
    ``(c + r * clients) % files``, so the clients walk through all files; ``files = 1``
    is the hot-file case. ``to_disk = true`` copies to local disk like ``lcg-cp``."""

    name = "get"
    defaults = {"file_size": 1_000_000, "files": 10, "to_disk": False}

    def prepare(self, driver, workdir, params, clients):
        context = super().prepare(driver, workdir, params, clients)
        _sample_files(driver, [f"{workdir}/file-{i:05d}" for i in range(params["files"])],
                      params["file_size"])
        context["clients"] = clients
        if params["to_disk"]:
            context["local_dir"] = tempfile.mkdtemp(prefix="storagescale-get-")
        return context

    def cleanup(self, context):
        if context.get("local_dir"):
            shutil.rmtree(context["local_dir"], ignore_errors=True)

    def run(self, driver, client, iteration, context):
        index = (client + iteration * context["clients"]) % context["files"]
        source = f"{context['workdir']}/file-{index:05d}"
        local = (
            os.path.join(context["local_dir"], f"c{client:05d}") if context.get("local_dir")
            else None
        )
        moved = driver.get(source, local)
        if moved != context["file_size"]:
            raise ValueError(f"get {source}: {moved} bytes, expected {context['file_size']}")
        return moved


class Read(Operation):
    """Open, read ``read_size`` bytes at a random offset, close."""

    name = "read"
    defaults = {"file_size": 10_000_000, "read_size": 65536}

    def prepare(self, driver, workdir, params, clients):
        context = super().prepare(driver, workdir, params, clients)
        context["target"] = f"{workdir}/read-target"
        _sample_file(driver, context["target"], params["file_size"])
        return context

    def run(self, driver, client, iteration, context):
        size = context["read_size"]
        rng = random.Random(client * 1_000_003 + iteration)
        offset = rng.randrange(0, max(1, context["file_size"] - size))
        return len(driver.read(context["target"], offset, size))


class ReadV(Read):
    """Open, one vector read of ``chunks`` x ``chunk_size`` at random offsets, close.

    The chunks are distinct, non-overlapping and sorted, as an application's read-ahead
    asks for them (XRootD 5.5.3 answers a vector read naming the same chunk twice
    with "Invalid response", which would be measured as a storage failure)."""

    name = "readv"
    defaults = {"file_size": 10_000_000, "chunks": 16, "chunk_size": 4096}

    def check_params(self, params, *, where):
        if params["file_size"] // max(params["chunk_size"], 1) < params["chunks"]:
            raise StorageScaleUsageError(
                f"{where}: {params['chunks']} chunks of {params['chunk_size']} bytes do not "
                f"fit in a {params['file_size']}-byte file; raise file_size or lower chunks."
            )

    def run(self, driver, client, iteration, context):
        size = context["chunk_size"]
        rng = random.Random(client * 1_000_003 + iteration)
        slots = sorted(rng.sample(range(context["file_size"] // size), context["chunks"]))
        return driver.readv(context["target"], [(slot * size, size) for slot in slots])


class Delete(Operation):
    """Delete a file (created untimed just before)."""

    name = "delete"

    def before(self, driver, client, iteration, context):
        driver.put(self._path(client, iteration, context), b"")

    def _path(self, client, iteration, context):
        return f"{context['workdir']}/c{client:05d}-{iteration:07d}"

    def run(self, driver, client, iteration, context):
        driver.delete(self._path(client, iteration, context))
        return 0


class Write(Operation):
    """Sequential write of a new ``file_size`` file in ``block_size`` blocks, like
    ``dd if=/dev/zero of=... bs=64k oflag=direct|dsync`` (seed 001). ``sync`` other
    than ``none`` needs a POSIX mount (``file://``)."""

    name = "write"
    defaults = {"file_size": 100_000_000, "block_size": 65536, "sync": "none"}
    choices = {"sync": ("none", "dsync", "direct")}

    def check_params(self, params, *, where):
        if params["sync"] == "direct" and params["block_size"] % 4096:
            raise StorageScaleUsageError(
                f"{where}: direct I/O needs block_size in multiples of 4096 bytes, not "
                f"{params['block_size']}."
            )

    def run(self, driver, client, iteration, context):
        path = f"{context['workdir']}/c{client:05d}-{iteration:07d}"
        return driver.write_sequential(path, payload(context["file_size"]),
                                       context["block_size"], context["sync"])


class Composite(Operation):
    """Several operations at once, ``clients`` on each side (``side_ops``: side ->
    operation); the section's parameters go to every side that knows them."""

    side_ops: ClassVar[dict[str, str]] = {}

    @property
    def sides(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.side_ops)

    def groups(self, clients):
        return [(side, OPERATIONS[op], clients) for side, op in self.side_ops.items()]

    def _side_params(self, operation: Operation, params: dict) -> dict:
        return {**operation.defaults,
                **{k: v for k, v in params.items() if k in operation.param_names}}

    def prepare(self, driver, workdir, params, clients):
        super().prepare(driver, workdir, params, clients)
        context = {"workdir": workdir}
        for side, operation, _ in self.groups(clients):
            context[side] = operation.prepare(
                driver, f"{workdir}/{side}", self._side_params(operation, params), clients
            )
        return context

    def cleanup(self, context):
        for side, operation, _ in self.groups(1):
            operation.cleanup(context[side])


class Mixed(Composite):
    """Readers (``get``) and writers (``put``) at once, ``clients`` on each side."""

    name = "mixed"
    side_ops = {"readers": "get", "writers": "put"}
    defaults = {"file_size": 1_000_000, "files": 10}


class ListUnderWrites(Composite):
    """Listers (``ls`` of a directory) while writers (``put``) fill a sibling one:
    seed 001's ``ls`` taking minutes while I/O runs."""

    name = "ls_under_io"
    side_ops = {"listers": "ls", "writers": "put"}
    defaults = {"file_size": 10_000_000, "entries": 100}


OPERATIONS: dict[str, Operation] = {
    op.name: op for op in (Stat(), List(), MakeDir(), Put(), Get(), Read(), ReadV(), Delete(),
                           Write(), Mixed(), ListUnderWrites())
}
