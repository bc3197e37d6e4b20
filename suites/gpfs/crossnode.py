"""Seed 001's killed writer, deleted from another node, as an operation.

One repetition: host A (the endpoint's own mount) starts a writer process that opens a
new file in the step's directory and writes 64 KiB blocks; once it has written, it is
killed with SIGKILL mid-write. With ``sync = true`` host A then runs ``sync -f`` on
its mount (the seed's "redo it with a sync in between"). Host B (another client of the
same file system) deletes the file: every refusal is counted with its errno, and the
attempts go on until the file is gone or ``give_up`` has passed. What was seen is the
operation's observation (:meth:`KilledWriter.observe`), which the judge puts into the
step's derived metrics: ``delete_s`` (from the kill to the deletion, infinite when
never), ``delete_refusals`` and ``delete_errno`` (the first refusal's errno, 0 when
none): BNL once saw "Permission denied" (EACCES, 13).

With ``kill = "client"`` the node is lost instead: host B's writer is writing when
host B's file system client is killed with SIGKILL (the embedded CephFS's
``ceph-fuse``), then the writer; host A deletes the file, which waits for the MDS to
give up B's session and its capabilities; B's client is mounted again afterwards.

Host B's path is the file's path under B's mount of the same test area. The hosts
come with the step (``storage_load.run(..., context=hosts)``: the step context's
``extra``, :func:`second_host`'s keys ``area_a``, ``area_b``, ``netns_a``, ``netns_b``
and ``client``); the writer gets nothing but its file's path, which the driver made
inside the run directory first. Every unlink runs in a thread bounded by ``give_up``
(a lost client's capabilities can block it). The step's set-up holds host B's client's
kill and remount (callables): the operation is ``in_process``, its clients threads of
pytest's process.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import subprocess
import sys
import threading
import time

from pytest_storagescale import Operation, Param, StorageScaleUsageError

# argv: the file; writes until killed (bounded: 64 GiB at most), says when it began
_WRITER = """
import os, sys
block = os.urandom(65536)
with open(sys.argv[1], "r+b", buffering=0) as handle:
    for count in range(1_000_000):
        handle.write(block)
        if count == 16:
            print("writing", flush=True)
"""


def on_host_b(path: str, area_a: str, area_b: str) -> str:
    """``path`` (under host A's test area ``area_a``) as host B sees it (under
    ``area_b``, the same test area through B's mount)."""
    relative = os.path.relpath(path, area_a)
    if relative.startswith(".."):
        raise StorageScaleUsageError(f"{path} is not under host A's test "
                                     f"area {area_a}.")
    return os.path.join(area_b, relative)


class KilledWriter(Operation):
    """Host A's writer killed with SIGKILL mid-write; host B deletes what it left. With
    ``kill = "client"`` the roles turn: host B's writer loses its host's file system
    client (SIGKILL to B's ``ceph-fuse``: the node lost), and host A deletes."""

    name = "killed_writer"
    in_process = True  # host B's client's kill and remount: callables of this process
    parameters = {
        "sync": Param("flag", False, description="sync -f on the writer's host first"),
        "kill": Param("choice", "writer", ("writer", "client"),
                      description="what is killed: the writer process, or its host's client"),
        "give_up": Param("count", 120, description="seconds the deleter keeps trying"),
    }

    def check_params(self, params, *, where):
        if params["kill"] == "client" and params["sync"]:
            raise StorageScaleUsageError(
                f"{where}: sync = true with kill = \"client\": a lost client cannot sync. "
                f"Leave sync out of that section.")

    def scaled_params(self, params, factor):
        return dict(params)  # a deadline, a flag and a choice: not a workload

    def prepare(self, driver, workdir, params, clients, step=None):
        hosts = dict(step.extra) if step is not None else {}
        if "area_b" not in hosts or getattr(driver, "name", "") != "local":
            raise StorageScaleUsageError(
                "killed_writer: needs two client hosts of one POSIX file system. Run the "
                "suite on the embedded CephFS (--storage-embedded cephfs), or give host "
                "B's mount of the same test area with --storage-gpfs-second-mount "
                "file:///mnt/on/host-b/storagescale.")
        if params["kill"] == "client" and not hosts.get("client"):
            raise StorageScaleUsageError(
                "killed_writer with kill = \"client\": no way to kill a client host of "
                "this file system from here (the embedded CephFS has one). Leave the "
                "section out of the thresholds file for this storage.")
        context = super().prepare(driver, workdir, params, clients)
        context.update(area_a=hosts["area_a"], area_b=hosts["area_b"],
                       netns_a=hosts.get("netns_a", ""), netns_b=hosts.get("netns_b", ""),
                       client=hosts.get("client"), seen={})
        return context

    def observe(self, context):
        """What the last repetition in this process saw (the step's derived metrics)."""
        return dict(context["seen"])

    def run(self, driver, client, iteration, context):
        path = f"{context['workdir']}/c{client:05d}-{iteration:07d}"
        driver.put(path, b"")  # inside the run directory only, recorded as made
        lost = context["kill"] == "client"
        on_b = on_host_b(path, context["area_a"], context["area_b"])
        writes, deletes = (on_b, path) if lost else (path, on_b)
        try:
            killed = self._write_and_kill(writes, context["netns_b" if lost else "netns_a"],
                                          context["client"] if lost else None)
            if context["sync"]:
                subprocess.run(["sync", "-f", os.path.dirname(writes)], timeout=120,
                               check=True)
            self._delete(deletes, context, killed)
        finally:
            if lost:
                context["client"][1]()  # host B's client mounted again
        return 0

    @staticmethod
    def _write_and_kill(path: str, netns: str, client) -> float:
        """Start the writer, SIGKILL it (and first its host's client, when ``client``
        gives its kill and remount) once it writes; the time of the kill."""
        command = [sys.executable, "-c", _WRITER, path]
        if netns:
            command = ["nsenter", f"--net={netns}", *command]
        writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            began = writer.stdout.readline() if writer.stdout else ""
            if not began:
                raise RuntimeError(f"the writer ended before writing "
                                   f"(exit {writer.wait(timeout=30)})")
            if client is not None:
                client[0]()
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=30)
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait(timeout=30)
        return time.monotonic()

    def _delete(self, path: str, context: dict, killed: float) -> None:
        """Delete ``path`` until it is gone, in a thread of its own: an ``unlink`` may
        block (a lost client's capabilities), bounded by ``give_up``."""
        tries = threading.Thread(target=self._delete_until_gone,
                                 args=(path, context, killed), daemon=True)
        tries.start()
        tries.join(context["give_up"] + 10)
        seen = context["seen"]
        if tries.is_alive():
            seen.update(delete_s=math.inf, delete_refusals=0, delete_errno=0)
            raise TimeoutError(f"the delete of {path} did not return within "
                               f"{context['give_up'] + 10} s")
        if math.isinf(seen.get("delete_s", math.inf)) and not seen.get("delete_refusals"):
            raise FileNotFoundError(errno.ENOENT, f"the deleting host does not see {path}")
        if math.isinf(seen.get("delete_s", math.inf)):
            raise PermissionError(
                errno.EACCES, f"{path} could not be deleted within {context['give_up']} s "
                f"({errno.errorcode.get(int(seen.get('delete_errno', 0)), '?')}, "
                f"{int(seen.get('delete_refusals', 0))} refusals)")

    @staticmethod
    def _delete_until_gone(path: str, context: dict, killed: float) -> None:
        refusals, first = 0, 0
        deadline = killed + context["give_up"]
        seen = context["seen"]
        seen.update(delete_s=math.inf, delete_refusals=0, delete_errno=0)
        while True:
            try:
                os.unlink(path)
            except FileNotFoundError:
                if refusals == 0:
                    return  # not seen at all: delete_s stays infinite, the step fails
                break
            except OSError as exc:
                refusals += 1
                first = first or (exc.errno or -1)
                seen.update(delete_refusals=refusals, delete_errno=first)
                if time.monotonic() > deadline:
                    return
                time.sleep(0.2)
                continue
            break
        seen.update(delete_s=time.monotonic() - killed, delete_refusals=refusals,
                     delete_errno=first)


OPERATIONS = [KilledWriter()]
