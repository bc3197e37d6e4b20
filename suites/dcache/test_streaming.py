"""Streaming reads at scale (seed 004, BNL's Thumper tests) on every door that serves
bulk data (WebDAV redirected to the pools, xrootd, GridFTP; not SRM): many clients each
reading whole large files picked at random, one after another; then as many writers of
new files beside them. Each step gives the total MB/s and each client's own rate, with
their spread (``client_mb_s_min``/``_mean``/``_max``, ``client_mb_s_cv``:
``streaming.py``); sizes, concurrencies and rules come from
``thresholds/dcache/<version>.toml`` (``[ops.streaming]``, ``[ops.streaming_mixed]``).

    pytest suites/dcache/test_streaming.py --storage-embedded dcache --storage-load-doors all
"""

from __future__ import annotations

import pytest

from .streaming import client_spread

pytestmark = pytest.mark.storagescale_system("dcache")

#: doors that serve no bulk data (SRM hands out a transfer URL on another door)
NOT_BULK = {"srm": "the SRM door serves no data: a get is a copy through the transfer "
                   "URL it hands out on another door"}


@pytest.fixture(autouse=True)
def _bulk_door(storage_load_door):
    reason = NOT_BULK.get(storage_load_door or "")
    if reason:
        pytest.skip(f"{storage_load_door} door: not applicable: {reason}")


@pytest.mark.storagescale_op("streaming")
def test_streaming_reads(storage_load, storage_clients):
    """Thumper: each client reads whole random files sequentially; MB/s in total and
    per client, with the spread."""
    storage_load.run(derive=client_spread)


@pytest.mark.storagescale_op("streaming_mixed")
def test_streaming_reads_beside_writers(storage_load, storage_clients):
    """Thumper's mixed run: streaming readers beside as many writers of new files."""
    storage_load.run(derive=client_spread)
