"""The shared functional checks (suites/conformance) over every door of the dCache
instance: --storage-endpoint plus --storage-door NAME=URL (e.g. root:// and davs://
doors on one namespace), or both doors of the embedded stand-in server."""

from __future__ import annotations

import os

import pytest

from ..conformance import AllChecks

pytestmark = pytest.mark.storagescale_system("dcache")
#: how long a killed POSC upload may take to vanish from a dCache door (s)
DCACHE_POSC_WAIT_S = 60.0


class TestDCacheConformance(AllChecks):
    """Namespace, data, vector reads, cross-door reads and persist-on-close."""

    #: the large-file check's size: STORAGESCALE_LARGE_MB, as the functional checks
    large_file_size = int(os.environ.get("STORAGESCALE_LARGE_MB", "64")) * 1024 * 1024

    @pytest.fixture(autouse=True)
    def _dcache_posc_wait(self, storage_embedded_server) -> None:
        """A dCache door (the embedded one, or a site's: a remote endpoint) removes a
        killed POSC upload once its pool notices the writer is gone: at once on a quiet
        machine, after more than 10 s beside 7 other workers' scans (``-n 8``) or at
        load average 24. The check ends as soon as the file is gone; the stand-ins
        (xrootd, whose known issue keeps it 600 s) keep the shared 10 s."""
        if storage_embedded_server is None or storage_embedded_server.kind == "dcache":
            self.posc_wait_s = DCACHE_POSC_WAIT_S
            self.posc_keeps = ("a dCache door removes an upload whose writer died once "
                               "the pool's mover notices the connection is gone")
