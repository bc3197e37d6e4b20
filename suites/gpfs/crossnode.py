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

Host B's path is the file's path under B's mount of the same test area (the hosts are
set by the suite's fixture, :func:`use_hosts`); the writer gets nothing but its file's
path, which the driver made inside the run directory first.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import subprocess
import sys
import time

from pytest_storagescale import Operation, Param, StorageScaleUsageError

#: (host A's test area, host B's test area, host A's network namespace or "")
_HOSTS: list[tuple[str, str, str]] = []
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


def use_hosts(area_a: str, area_b: str, netns_a: str = "") -> None:
    """Host A writes under ``area_a``, host B deletes under ``area_b`` (the same test
    area seen from two client hosts); ``netns_a``: A's network namespace for the
    writer (``nsenter --net=``), "" to run it here."""
    _HOSTS[:] = [(area_a, area_b, netns_a)]


def forget_hosts() -> None:
    _HOSTS.clear()


def outcome() -> dict[str, float]:
    """What the last repetition saw (taken: empty until the next one ran)."""
    seen = dict(_SEEN)
    _SEEN.clear()
    return seen


def has_hosts() -> bool:
    return bool(_HOSTS)


def on_host_b(path: str) -> str:
    """``path`` (under host A's test area) as host B sees it."""
    area_a, area_b, _ = _HOSTS[0]
    relative = os.path.relpath(path, area_a)
    if relative.startswith(".."):
        raise StorageScaleUsageError(f"{path} is not under host A's test "
                                     f"area {area_a}.")
    return os.path.join(area_b, relative)


class KilledWriter(Operation):
    """Host A's writer killed with SIGKILL mid-write; host B deletes what it left."""

    name = "killed_writer"
    parameters = {
        "sync": Param("flag", False, description="sync -f on host A before B deletes"),
        "give_up": Param("count", 120, description="seconds B keeps trying to delete"),
    }

    def scaled_params(self, params, factor):
        return dict(params)  # a deadline and a flag, not a workload

    def prepare(self, driver, workdir, params, clients):
        if not _HOSTS or getattr(driver, "name", "") != "local":
            raise StorageScaleUsageError(
                "killed_writer: needs two client hosts of one POSIX file system. Run the "
                "suite on the embedded CephFS (--storage-embedded cephfs), or give host "
                "B's mount of the same test area with --storage-gpfs-second-mount "
                "file:///mnt/on/host-b/storagescale.")
        return super().prepare(driver, workdir, params, clients)

    def run(self, driver, client, iteration, context):
        path = f"{context['workdir']}/c{client:05d}-{iteration:07d}"
        driver.put(path, b"")  # inside the run directory only, recorded as made
        netns = _HOSTS[0][2]
        command = [sys.executable, "-c", _WRITER, path]
        if netns:
            command = ["nsenter", f"--net={netns}", *command]
        writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            began = writer.stdout.readline() if writer.stdout else ""
            if not began:
                raise RuntimeError(f"the writer on host A ended before writing "
                                   f"(exit {writer.wait(timeout=30)})")
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=30)
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait(timeout=30)
        killed = time.monotonic()
        if context["sync"]:
            subprocess.run(["sync", "-f", os.path.dirname(path)], timeout=120, check=True)
        self._delete_from_b(on_host_b(path), context, killed)
        return 0

    def _delete_from_b(self, path: str, context: dict, killed: float) -> None:
        refusals, first = 0, 0
        deadline = killed + context["give_up"]
        while True:
            try:
                os.unlink(path)
            except FileNotFoundError:
                if refusals == 0:
                    raise  # host B does not see the file at all: the mapping is wrong
                break
            except OSError as exc:
                refusals += 1
                first = first or (exc.errno or -1)
                if time.monotonic() > deadline:
                    _SEEN.update(delete_s=math.inf, delete_refusals=refusals,
                                 delete_errno=first)
                    raise PermissionError(
                        exc.errno or errno.EACCES,
                        f"host B could not delete {path} within {context['give_up']} s "
                        f"({errno.errorcode.get(first, first)}, {refusals} refusals)") from None
                time.sleep(0.2)
                continue
            break
        _SEEN.update(delete_s=time.monotonic() - killed, delete_refusals=refusals,
                     delete_errno=first)


OPERATIONS = [KilledWriter()]
