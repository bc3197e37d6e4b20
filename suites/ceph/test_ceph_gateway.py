"""Ceph behind XRootD gateways (seed 002_deb41a8fd3953f47.txt, RAL "Echo").

- hot file: N simultaneous copies of the *same* file against N copies of distinct
  files (RAL: 350 s each for 5 copies of one file, 19-31 s for 5 distinct replicas);
  ``hot_ratio`` = mean transfer time of the same file / of distinct files;
- read and readv latency at 1 and 64 concurrent jobs (the seed's ECDFs and medians:
  readv 0.049 s at 1 job, 1.65 s median / 3.72 s mean at 64 before the patch, 0.23 s
  after; reads 0.0001 s with XCache, 0.003 s without). The latency ECDFs are in the
  Allure attachments and the --storage-report page.

    pytest suites/ceph --storage-endpoint root://ceph-gw.example.org:1094//echo/test/storagescale
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.storagescale_system("ceph")


@pytest.mark.storagescale_op("hotfile")
def test_hot_file_against_distinct_files(storage_load, storage_clients):
    """The same file copied by every client at once, against one file per client."""
    distinct = storage_load.run("distinct", storage_clients, judge=False)

    def derive(same_file):
        baseline = distinct.total.latency_s["mean"]
        return {"hot_ratio": same_file.total.latency_s["mean"] / baseline}

    storage_load.run("hotfile", storage_clients, label="same file", derive=derive)


@pytest.mark.storagescale_op("readv")
def test_readv_latency(storage_load, storage_clients):
    """Vector reads of a large file, back to back per client."""
    storage_load.run()


@pytest.mark.storagescale_op("read")
def test_read_latency(storage_load, storage_clients):
    """Small reads at random offsets, back to back per client."""
    storage_load.run()
