"""XRootD scalability suite (seed 003_b9e7cdb63bd75fe8.txt, CERN xrootd tests).

What the seed measured by hand, as steps whose concurrencies and rules come from
``thresholds/xrootd/<version>.toml``:

- namespace: ``stat`` and ``ls`` rates at each concurrency;
- small files: N clients writing 1 MB files (``put``), then reading them (``get``),
  as files/s with the transfer-time distribution (mean, p50, p99 in the results);
- mixed: readers and writers at once, each side's throughput reported.

Run it against your server::

    pytest suites/xrootd --storage-endpoint root://host:1094//store/test/storagescale
"""

from __future__ import annotations

import zlib

import pytest

pytestmark = pytest.mark.storagescale_system("xrootd")


def test_round_trip_with_checksum(storage_client, storage_test_dir):
    """A 1 MB file written and read back is intact, and the server's adler32 agrees."""
    data = bytes(range(256)) * 4096
    path = f"{storage_test_dir}/round-trip.dat"
    assert storage_client.put(path, data) == len(data)
    assert storage_client.stat(path).size == len(data)
    assert storage_client.read(path, 0, len(data)) == data
    assert storage_client.checksum(path, "adler32") == f"{zlib.adler32(data):08x}"


@pytest.mark.storagescale_op("stat")
def test_stat_scan(storage_load, storage_clients):
    """stat of one file, back to back, by each client."""
    storage_load.run()


@pytest.mark.storagescale_op("ls")
def test_ls_scan(storage_load, storage_clients):
    """Listing of a small directory, back to back, by each client."""
    storage_load.run()


@pytest.mark.storagescale_op("put")
def test_small_file_writes(storage_load, storage_clients):
    """N clients writing new 1 MB files: files/s and transfer times (seed: writerate.jpg)."""
    storage_load.run()


@pytest.mark.storagescale_op("get")
def test_small_file_reads(storage_load, storage_clients):
    """N clients reading 1 MB files: files/s and transfer times (seed: readratex.jpg)."""
    storage_load.run()


@pytest.mark.storagescale_op("mixed")
def test_mixed_readers_and_writers(storage_load, storage_clients):
    """Readers and writers at once; each side's throughput (seed: read-write-rw-xrootd.jpg)."""
    storage_load.run()
