"""Ceph behind XRootD gateways (seed 002_deb41a8fd3953f47.txt, RAL "Echo").

- hot file: N simultaneous copies of the *same* file against N copies of distinct
  files (RAL: 350 s each for 5 copies of one file, 19-31 s for 5 distinct replicas);
  ``hot_ratio`` = mean transfer time of the same file / of distinct files;
- read and readv latency at 1 and 64 concurrent jobs (the seed's ECDFs and medians:
  readv 0.049 s at 1 job, 1.65 s median / 3.72 s mean at 64 before the patch, 0.23 s
  after; reads 0.0001 s with XCache, 0.003 s without). The latency ECDFs are in the
  Allure attachments and the --storage-report page;
- each of them again through an XCache in front of the gateway (``*_xcache``
  sections): the files are written through the gateway, the clients read through
  the cache, as the seed compares "no changes" (XCache) with "patched, no xcache".

    pytest suites/ceph --storage-endpoint root://ceph-gw.example.org:1094//echo:test/storagescale \\
        --storage-ceph-xcache root://xcache.example.org:1094//echo:test/storagescale

Without --storage-endpoint the suite starts the embedded Ceph gateway (Ceph 16 with
memstore OSDs behind an XRootD libXrdCeph gateway, with an XCache door).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.storagescale_system("ceph")


def hot_file(storage_load, clients, distinct_section, same_section, doors=None):
    """The same file copied by every client at once, against one file per client
    (``doors``: the steps' XCache door, for the ``*_xcache`` sections)."""
    distinct = storage_load.run(distinct_section, clients, judge=False, doors=doors)

    def derive(same_file):
        baseline = distinct.total.latency_s["mean"]
        return {"hot_ratio": same_file.total.latency_s["mean"] / baseline}

    storage_load.run(same_section, clients, label="same file", derive=derive, doors=doors)


@pytest.mark.storagescale_op("hotfile")
def test_hot_file_against_distinct_files(storage_load, storage_clients):
    """The same file copied by every client at once, against one file per client."""
    hot_file(storage_load, storage_clients, "distinct", "hotfile")


@pytest.mark.storagescale_op("hotfile_xcache")
def test_hot_file_through_xcache(storage_load, storage_clients, xcache_door):
    """The hot file against distinct files, every copy read through the XCache."""
    hot_file(storage_load, storage_clients, "distinct_xcache", "hotfile_xcache", xcache_door)


@pytest.mark.storagescale_op("readv")
def test_readv_latency(storage_load, storage_clients):
    """Vector reads of a large file, back to back per client."""
    storage_load.run()


@pytest.mark.storagescale_op("readv_xcache")
def test_readv_latency_through_xcache(storage_load, storage_clients, xcache_door):
    """Vector reads of a large file through the XCache."""
    storage_load.run(doors=xcache_door)


@pytest.mark.storagescale_op("read")
def test_read_latency(storage_load, storage_clients):
    """Small reads at random offsets, back to back per client."""
    storage_load.run()


@pytest.mark.storagescale_op("read_xcache")
def test_read_latency_through_xcache(storage_load, storage_clients, xcache_door):
    """Small reads at random offsets through the XCache."""
    storage_load.run(doors=xcache_door)
