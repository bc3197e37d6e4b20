"""Seed 001's killed writer, deleted from another node, as an operation.

One repetition: host A (the endpoint's own mount) starts a writer process that opens a
new file in the step's directory and writes 64 KiB blocks; once it has written, it is
killed with SIGKILL mid-write. With ``sync = true`` host A then runs ``sync -f`` on
its mount (the seed's "redo it with a sync in between"). Host B (another client of the
same file system) deletes the file: every refusal is counted with its errno, and the
attempts go on until the file is gone or ``give_up`` has passed. What was seen is kept
for the step's derived metrics (:func:`outcome`): ``delete_s`` (from the kill to the
deletion, infinite when never), ``delete_refusals`` and ``delete_errno`` (the first
refusal's errno, 0 when none): BNL once saw "Permission denied" (EACCES, 13).

With ``kill = "client"`` the node is lost instead: host B's writer is writing when
host B's file system client is killed with SIGKILL (the embedded CephFS's
``ceph-fuse``), then the writer; host A deletes the file, which waits for the MDS to
give up B's session and its capabilities; B's client is mounted again afterwards.

Host B's path is the file's path under B's mount of the same test area (the hosts are
set by the suite's fixture, :func:`use_hosts`); the writer gets nothing but its file's
path, which the driver made inside the run directory first. Every unlink runs in a
thread bounded by ``give_up`` (a lost client's capabilities can block it).
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
from collections.abc import Callable

from pytest_storagescale import Operation, Param, StorageScaleUsageError

#: (host A's test area, host B's test area, A's network namespace, B's) ("": here)
_HOSTS: list[tuple[str, str, str, str]] = []
#: (kill host B's client, mount it again): the embedded CephFS's, for kill = "client"
_CLIENT: list[tuple[Callable[[], None], Callable[[], None]]] = []
#: what the last repetition in this process saw
_SEEN: dict[str, float] = {}

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


def use_hosts(area_a: str, area_b: str, netns_a: str = "", netns_b: str = "", *,
              client: tuple[Callable[[], None], Callable[[], None]] | None = None) -> None:
    """Host A writes under ``area_a``, host B deletes under ``area_b`` (the same test
    area seen from two client hosts); ``netns_a``, ``netns_b``: their network
    namespaces for the writer (``nsenter --net=``), "" to run it here; ``client``: how
    to kill host B's file system client and mount it again (the ``kill = "client"``
    steps: B writes, B's client is lost, A deletes)."""
    _HOSTS[:] = [(area_a, area_b, netns_a, netns_b)]
    _CLIENT[:] = [client] if client is not None else []


def forget_hosts() -> None:
    _HOSTS.clear()
    _CLIENT.clear()


def outcome() -> dict[str, float]:
    """What the last repetition saw (taken: empty until the next one ran)."""
    seen = dict(_SEEN)
    _SEEN.clear()
    return seen


def has_hosts() -> bool:
    return bool(_HOSTS)


def on_host_b(path: str) -> str:
    """``path`` (under host A's test area) as host B sees it."""
    area_a, area_b = _HOSTS[0][:2]
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

    def prepare(self, driver, workdir, params, clients):
        if not _HOSTS or getattr(driver, "name", "") != "local":
            raise StorageScaleUsageError(
                "killed_writer: needs two client hosts of one POSIX file system. Run the "
                "suite on the embedded CephFS (--storage-embedded cephfs), or give host "
                "B's mount of the same test area with --storage-gpfs-second-mount "
                "file:///mnt/on/host-b/storagescale.")
        if params["kill"] == "client" and not _CLIENT:
            raise StorageScaleUsageError(
                "killed_writer with kill = \"client\": no way to kill a client host of "
                "this file system from here (the embedded CephFS has one). Leave the "
                "section out of the thresholds file for this storage.")
        return super().prepare(driver, workdir, params, clients)

    def run(self, driver, client, iteration, context):
        path = f"{context['workdir']}/c{client:05d}-{iteration:07d}"
        driver.put(path, b"")  # inside the run directory only, recorded as made
        lost = context["kill"] == "client"
        _, _, netns_a, netns_b = _HOSTS[0]
        writes, deletes = (on_host_b(path), path) if lost else (path, on_host_b(path))
        try:
            killed = self._write_and_kill(writes, netns_b if lost else netns_a, lost)
            if context["sync"]:
                subprocess.run(["sync", "-f", os.path.dirname(writes)], timeout=120,
                               check=True)
            self._delete(deletes, context, killed)
        finally:
            if lost:
                _CLIENT[0][1]()  # host B's client mounted again
        return 0

    @staticmethod
    def _write_and_kill(path: str, netns: str, lost: bool) -> float:
        """Start the writer, SIGKILL it (and first its host's client when ``lost``)
        once it writes; the time of the kill."""
        command = [sys.executable, "-c", _WRITER, path]
        if netns:
            command = ["nsenter", f"--net={netns}", *command]
        writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            began = writer.stdout.readline() if writer.stdout else ""
            if not began:
                raise RuntimeError(f"the writer ended before writing "
                                   f"(exit {writer.wait(timeout=30)})")
            if lost:
                _CLIENT[0][0]()
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
        if tries.is_alive():
            _SEEN.update(delete_s=math.inf, delete_refusals=0, delete_errno=0)
            raise TimeoutError(f"the delete of {path} did not return within "
                               f"{context['give_up'] + 10} s")
        if math.isinf(_SEEN.get("delete_s", math.inf)) and not _SEEN.get("delete_refusals"):
            raise FileNotFoundError(errno.ENOENT, f"the deleting host does not see {path}")
        if math.isinf(_SEEN.get("delete_s", math.inf)):
            raise PermissionError(
                errno.EACCES, f"{path} could not be deleted within {context['give_up']} s "
                f"({errno.errorcode.get(int(_SEEN.get('delete_errno', 0)), '?')}, "
                f"{int(_SEEN.get('delete_refusals', 0))} refusals)")

    @staticmethod
    def _delete_until_gone(path: str, context: dict, killed: float) -> None:
        refusals, first = 0, 0
        deadline = killed + context["give_up"]
        _SEEN.update(delete_s=math.inf, delete_refusals=0, delete_errno=0)
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
                _SEEN.update(delete_refusals=refusals, delete_errno=first)
                if time.monotonic() > deadline:
                    return
                time.sleep(0.2)
                continue
            break
        _SEEN.update(delete_s=time.monotonic() - killed, delete_refusals=refusals,
                     delete_errno=first)


OPERATIONS = [KilledWriter()]
