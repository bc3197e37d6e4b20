"""dCache scalability suite (seeds 000_83dfecd93351ffe8.txt, FNAL, and
004_75948d28f7dedccc.txt, BNL).

Each test is one of the seeds' hand-run tests; concurrencies, durations and rules
come from ``thresholds/dcache/<version>.toml``:

- namespace scan: ``lcg-ls -b -D srmv2 $mytestdir`` in a tight loop per concurrency;
  and as offered rates (an open loop: requests at a fixed rate, whatever the door
  does, response times from each request's intended start; docs/open-loop.md);
- copy-out scan: ``lcg-cp`` of a 10 MB file to local disk (checksum verified),
  rate, MB/s and Mbit/s, failed, hung (stuck copies are abandoned and counted);
- recovery probe: after an overload, does the door come back by itself;
- transaction rate vs users (seed 004): copies of 450 short files, per minute;
- mixed readers and writers (seed 004): the throughput lost by mixing.

    pytest -n 8 suites/dcache --storage-endpoint davs://door:2880/pnfs/site/test/storagescale
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.storagescale_system("dcache")


@pytest.mark.storagescale_op("ls")
def test_namespace_scan(storage_load, storage_clients):
    """Seed 000, lcg-ls runs: succeeded (rate Hz), failed, hung per concurrency."""
    storage_load.run()


@pytest.mark.storagescale_op("ls_open")
def test_namespace_open_loop(storage_load, storage_arrival_rate):
    """Seed 000's namespace scan as offered rates: ls requests arrive at the rate
    whatever the door does (as grid jobs do); a stall shows as every request that
    waited for it (response time), dropped requests as the door falling behind."""
    storage_load.run()


@pytest.mark.storagescale_op("copyout")
def test_copy_out_scan(storage_load, storage_clients):
    """Seed 000, lcg-cp runs: a 10 MB file copied to local disk in a tight loop."""
    storage_load.run()


@pytest.mark.storagescale_op("transactions")
def test_transaction_rate_vs_users(storage_load, storage_clients):
    """Seed 004: 450 short files copied by 10, 50, 70 users; transactions per minute."""
    storage_load.run()


@pytest.mark.storagescale_op("mixed")
def test_mixing_readers_and_writers(storage_load, storage_clients):
    """Seed 004: readers alone, writers alone, both at once; mix_ratio is what mixing
    keeps of the separate throughput (BNL saw 50-80 % lost)."""
    storage_load.mixing()


@pytest.mark.storagescale_op("recovery")
def test_recovery_after_overload(storage_load):
    """Seed 000: after the overload, a low-concurrency probe must get back to a
    fraction of the rate before within a stated time ("did recover by itself")."""
    storage_load.recovery()
