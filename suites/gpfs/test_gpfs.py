"""GPFS (seed 001_02055b100a690bc7.txt, BNL 2013): a POSIX file system, tested
through its mount (``file:///gpfs/scratch/storagescale``) or a protocol door.

- ``dd`` sequential writes (``oflag=direct`` and ``oflag=dsync``, bs=64k) and reads,
  each repeated ``tries`` times for an error bar (BNL: 8.13 +/- 0.48, 6.37 +/- 0.58
  and 113.11 +/- 2.26 MB/s);
- ``ls`` of a directory while other clients write next to it (BNL: 14 s, and 13 min
  one level deeper);
- files left by a writer killed with SIGKILL can be deleted by another client (BNL
  once got "Permission denied" from another node), from the same host and from
  another host, with and without a ``sync`` on the writer's host first;
- ioperf's patterns (fwrite, fread, putc, getc, seek: 2.22, 33.09, 2.20, 3.79, 1.35
  MB/s with one thread), with one thread, one thread per core, and one thread per
  client host (``--storage-cluster`` with one worker per node);
- ``ls -l`` of the top and of a deeper level while writers work one level deeper
  still (BNL: 14 s and 13 min).

Without an endpoint the suite mounts the embedded CephFS on two client hosts
(``--storage-embedded cephfs``); on a real file system::

    pytest suites/gpfs --storage-endpoint file:///gpfs/scratch/storagescale \
        --storage-gpfs-second-mount file:///mnt/gpfs-from-b/scratch/storagescale
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time

import pytest

from pytest_storagescale import StorageNotFound

#: seed 001's ioperf patterns, each a section ``ioperf_<pattern>`` of the thresholds
IOPERF = [pytest.param(pattern, marks=pytest.mark.storagescale_op(f"ioperf_{pattern}"),
                       id=pattern) for pattern in ("fwrite", "fread", "putc", "getc", "seek")]

pytestmark = pytest.mark.storagescale_system("gpfs")


@pytest.mark.storagescale_op("dd_direct")
def test_sequential_write_direct(storage_load, storage_clients):
    """dd if=/dev/zero of=... bs=64k oflag=direct, repeated for an error bar."""
    storage_load.repeat()


@pytest.mark.storagescale_op("dd_dsync")
def test_sequential_write_dsync(storage_load, storage_clients):
    """dd if=/dev/zero of=... bs=64k oflag=dsync, repeated for an error bar."""
    storage_load.repeat()


@pytest.mark.storagescale_op("dd_read")
def test_sequential_read(storage_load, storage_clients):
    """dd of a whole file to /dev/null, repeated for an error bar."""
    storage_load.repeat()


@pytest.mark.storagescale_op("ls_under_io")
def test_ls_while_writing(storage_load, storage_clients):
    """Listers time ``ls`` of a directory while writers fill the one next to it."""
    storage_load.run()


@pytest.mark.storagescale_op("ls_depth")
def test_ls_at_depth_while_writing(storage_load, storage_clients, second_host_if_any):
    """``ls -l`` of the top and of the level below while writers (on host B when
    there is one) fill a directory one level deeper still."""
    storage_load.run(context=second_host_if_any)


@pytest.mark.parametrize("pattern", IOPERF)
def test_ioperf_single_thread(storage_load, pattern):
    """One ioperf thread: the pattern's rate over the section's passes."""
    storage_load.run(None, 1, label="1 thread")


@pytest.mark.parametrize("pattern", IOPERF)
def test_ioperf_thread_per_core(storage_load, pattern):
    """One ioperf thread per processor of this host, the aggregate rate."""
    cores = len(os.sched_getaffinity(0))
    storage_load.run(None, cores, label="1 thread per core")


@pytest.mark.parametrize("pattern", IOPERF)
def test_ioperf_thread_per_host(storage_load, host_cluster, pattern):
    """One ioperf thread on each client host (a Dask worker per node): the aggregate
    rate, and each host's in the step's per-host breakdown."""
    storage_load.run(None, host_cluster, label="1 thread per host")


@pytest.mark.parametrize("section, label", [
    pytest.param(section, label, marks=pytest.mark.storagescale_op(section), id=name)
    for section, label, name in [
        ("killed_writer", "no sync", "no-sync"),
        ("killed_writer_sync", "sync on A first", "sync"),
        ("killed_client", "B's client lost, A deletes", "client-lost")]])
def test_killed_writer_deleted_from_another_host(storage_load, two_hosts, section, label):
    """Host A's writer killed with SIGKILL mid-write, host B deletes its file (after
    ``sync -f`` on A, or not); or host B's client lost while B writes, host A deletes:
    deleted, refused with which errno, and how long until it went, measured and judged
    (``delete_s``). A file system with no ``killed_client`` section skips that one."""
    storage_load.run(section, 1, label=label, context=two_hosts)


# stdin: the run's pickled DriverSpec (driver, options with any credential, test
# area), so that no secret shows in the writer's command line; argv: the path prefix
_WRITER = """
import pickle, sys, time
spec = pickle.load(sys.stdin.buffer)
path = sys.argv[1]
driver = spec.connect("functional-killed", timeout=60)
block = b"x" * 4_000_000
for index in range(1000):  # bounded: about 4 GB at most, killed long before
    driver.put(f"{path}-{index}", block)
    time.sleep(0.05)
"""


def test_leftovers_of_a_killed_writer_can_be_deleted(storage_endpoint):
    """A writer killed with SIGKILL mid-run; another client removes what it left."""
    run = storage_endpoint
    leftover = run.path("killed-writer", "part")
    # the writer gets this run's picklable driver spec (URL, options, writable root)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, leftover], stdin=subprocess.PIPE)
    writer.stdin.write(pickle.dumps(run.driver_spec))
    writer.stdin.close()
    other = run.client("functional-other")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and writer.poll() is None:
            try:
                names = other.ls(run.path("killed-writer"))
            except StorageNotFound:
                names = []
            if len(names) >= 3:
                break
            try:
                writer.wait(timeout=0.2)  # the pause between looks; notices an early exit
            except subprocess.TimeoutExpired:
                pass
        assert writer.poll() is None, f"the writer ended by itself ({writer.returncode})"
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        names = other.ls(run.path("killed-writer"))
        assert names, "the killed writer left nothing to delete"
        for name in names:
            other.delete(run.path("killed-writer", name))
        assert other.ls(run.path("killed-writer")) == []
    finally:
        if writer.poll() is None:
            writer.kill()
        other.close()
