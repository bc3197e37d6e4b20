"""Seed 001's ioperf patterns as operations, and its ``ls`` under I/O with depth.

ioperf (BNL, 2013) did block I/O with 64 KiB blocks (8,192 doubles), files of 10,000
blocks (625 MB), 1,000 seeks per file after writing, and reported one rate per
pattern: fwrite 2.22, fread 33.09, putc 2.20, getc 3.79, seek 1.35 MB/s. Here each
pattern is an operation, one repetition one file pass, on a POSIX mount (``file://``):

- ``fwrite``: a new file of ``blocks`` blocks, one buffered write per block;
- ``fread``: the client's file read back, one buffered read per block;
- ``putc``: a new file written ``unit`` bytes per call through a stdio-like buffer
  (ioperf's ``putc``: the per-call cost, the client's CPU as much as the file system);
- ``getc``: the client's file read ``unit`` bytes per call through a buffer;
- ``seek``: ``seeks`` random seeks in the client's file, one block read at each.

A file is made through the driver (``put`` of an empty file: inside the run
directory only, recorded as made by the run) before it is opened, so the sandbox and
the clean-up's "only what the run made" hold as for every operation. ``blocks`` and
``seeks`` shrink with ``--storage-scale``; the block and the unit keep their size.

``ls_depth``: listers of the step's top directory (``/gpfs/scratch/``) and of the
level below (``starlib/``), ``ls -l`` style (a stat of each entry), while writers
fill a directory one level deeper still, as the seed's 14 s and 13 min were measured;
with two client hosts (the step's context: ``storage_load.run(context=hosts)``, the
areas of :func:`.crossnode.on_host_b`) the writers write through host B's mount while
the listers list through A's, as the seed's writers ran on other nodes.
"""

from __future__ import annotations

import io
import os
import random
import re

from pytest_storagescale import Operation, Param, StorageScaleUsageError

from . import crossnode


def _local(driver, name: str) -> None:
    if getattr(driver, "name", "") != "local":
        raise StorageScaleUsageError(
            f"{name}: the ioperf patterns read and write a POSIX mount; the endpoint's "
            f"driver is {getattr(driver, 'name', '?')}. Point the suite at the mount, e.g. "
            f"--storage-endpoint file:///gpfs/scratch/storagescale.")


class IoPerf(Operation):
    """The common parameters and files of the ioperf patterns."""

    parameters = {
        "block_size": Param("bytes", 65536, description="bytes per block (8,192 doubles)"),
        "blocks": Param("count", 10_000, description="blocks per file (one pass)"),
        "seeks": Param("count", 1000, description="random seeks per pass (seek)"),
        "unit": Param("bytes", 8, description="bytes per putc/getc call (a double)"),
    }
    #: a pattern that reads: each client's file is written by the set-up
    reads = False
    made_names = {r"ioperf-c\d{5}": "file"}

    def scaled_params(self, params, factor):
        scaled = super().scaled_params(params, factor)
        return {**scaled, "block_size": params["block_size"], "unit": params["unit"]}

    def prepare(self, driver, workdir, params, clients):
        _local(driver, self.name)
        context = super().prepare(driver, workdir, params, clients)
        if self.reads:
            block = os.urandom(params["block_size"])
            for client in range(clients):
                path = self.client_file(context, client)
                driver.put(path, b"")
                with open(path, "r+b") as handle:
                    for _ in range(params["blocks"]):
                        handle.write(block)
                made = getattr(driver, "created", None)  # its size, for the clean-up
                if made is not None:
                    made.add(path, "file", params["blocks"] * params["block_size"])
        return context

    @staticmethod
    def client_file(context: dict, client: int) -> str:
        return f"{context['workdir']}/ioperf-c{client:05d}"

    def new_file(self, driver, client: int, iteration: int, context: dict) -> str:
        path = f"{context['workdir']}/c{client:05d}-{iteration:07d}"
        driver.put(path, b"")  # inside the run directory only, recorded as made
        return path


class FWrite(IoPerf):
    name = "fwrite"

    def run(self, driver, client, iteration, context):
        block = b"\0" * context["block_size"]
        path = self.new_file(driver, client, iteration, context)
        if context.get("on_host_b"):  # made through A, written through B's mount
            path = crossnode.on_host_b(path, *context["on_host_b"])
        with open(path, "r+b") as handle:
            for _ in range(context["blocks"]):
                handle.write(block)
        return context["block_size"] * context["blocks"]


class FRead(IoPerf):
    name = "fread"
    reads = True

    def run(self, driver, client, iteration, context):
        size, done = context["block_size"], 0
        with open(self.client_file(context, client), "rb") as handle:
            while chunk := handle.read(size):
                done += len(chunk)
        return done


class PutC(IoPerf):
    name = "putc"

    def run(self, driver, client, iteration, context):
        unit = b"\0" * context["unit"]
        calls = context["block_size"] * context["blocks"] // context["unit"]
        path = self.new_file(driver, client, iteration, context)
        with open(path, "r+b", buffering=io.DEFAULT_BUFFER_SIZE) as handle:
            write = handle.write
            for _ in range(calls):
                write(unit)
        return calls * context["unit"]


class GetC(IoPerf):
    name = "getc"
    reads = True

    def run(self, driver, client, iteration, context):
        unit, done = context["unit"], 0
        with open(self.client_file(context, client), "rb",
                     buffering=io.DEFAULT_BUFFER_SIZE) as handle:
            read = handle.read
            while chunk := read(unit):
                done += len(chunk)
        return done


class Seek(IoPerf):
    name = "seek"
    reads = True

    def run(self, driver, client, iteration, context):
        size, blocks = context["block_size"], context["blocks"]
        chooser = random.Random(client * 1_000_003 + iteration)
        done = 0
        with open(self.client_file(context, client), "rb", buffering=0) as handle:
            for _ in range(context["seeks"]):
                handle.seek(chooser.randrange(blocks) * size)
                done += len(handle.read(size))
        return done


class LongList(Operation):
    """``ls -l`` of a directory: the names, then a stat of each (what ``ls -alrt``
    does, and what waits for a writer's tokens or capabilities)."""

    name = "ls_long"
    made_names = {r"entry-\d{5}": "file"}
    parameters = {"entries": Param("count", 100, description="files in the listed directory")}

    def prepare(self, driver, workdir, params, clients):
        context = super().prepare(driver, workdir, params, clients)
        for index in range(params["entries"]):
            driver.put(f"{workdir}/entry-{index:05d}", b"")
        context["target"] = workdir
        return context

    def run(self, driver, client, iteration, context):
        names = driver.ls(context["target"])
        if len(names) < context["entries"]:
            raise ValueError(f"ls returned {len(names)} entries, expected at least "
                             f"{context['entries']}")
        for name in names:
            driver.stat(f"{context['target']}/{name}")
        return 0


class ListAtDepth(Operation):
    """Listers of the top (``top``) and of the level below (``deeper``) while writers
    (``fwrite``) fill a directory one level deeper still: ``<step>/`` holds ``entries``
    files and ``starlib/``, which holds ``entries`` files and ``io/``."""

    name = "ls_depth"
    sides = ("top", "deeper", "writers")
    parameters = {
        "entries": Param("count", 100, description="files in each listed directory"),
        "block_size": Param("bytes", 65536, description="the writers' block"),
        "blocks": Param("count", 1600, description="blocks per file written (100 MB)"),
    }
    made_names = {"starlib": "dir", "io": "dir"}

    def scaled_params(self, params, factor):
        return {**super().scaled_params(params, factor), "block_size": params["block_size"]}

    def groups(self, clients):
        return [("top", LISTER, clients), ("deeper", LISTER, clients),
                ("writers", WRITER, clients)]

    def prepare(self, driver, workdir, params, clients, step=None):
        _local(driver, self.name)
        driver.mkdir(workdir)
        listed = {"entries": params["entries"]}
        hosts = step.extra if step is not None else {}
        areas = (hosts["area_a"], hosts["area_b"]) if "area_b" in hosts else None
        written = {**WRITER.defaults, "block_size": params["block_size"],
                   "blocks": params["blocks"], "on_host_b": areas}
        return {
            "workdir": workdir,
            # the deeper level first: the top then lists it as one of its entries
            "deeper": LISTER.prepare(driver, f"{workdir}/starlib", listed, clients),
            "top": LISTER.prepare(driver, workdir, listed, clients),
            "writers": WRITER.prepare(driver, f"{workdir}/starlib/io", written, clients),
        }

    def cleanup(self, context):
        """The writers' files, two levels below the step's directory, where the
        engine's clean-up does not look for generated names: only the names the
        writers give (``c<client>-<iteration>``), then their directory."""
        folder = context["writers"]["workdir"]
        if not folder.startswith(f"{context['workdir']}/"):
            return
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for name in names:
            if re.fullmatch(r"c\d{5}-\d{7}", name):
                try:
                    os.unlink(os.path.join(folder, name))
                except OSError:
                    continue
        try:
            os.rmdir(folder)
        except OSError:
            pass  # something else is in it: the engine's clean-up names it


LISTER, WRITER = LongList(), FWrite()
OPERATIONS = [WRITER, FRead(), PutC(), GetC(), Seek(), LISTER, ListAtDepth()]
