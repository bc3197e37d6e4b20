"""The shared functional checks (suites/conformance) over every door of the dCache
instance: --storage-endpoint plus --storage-door NAME=URL (e.g. root:// and davs://
doors on one namespace), or both doors of the embedded stand-in server."""

from __future__ import annotations

import os

import pytest

from ..conformance import AllChecks

pytestmark = pytest.mark.storagescale_system("dcache")


class TestDCacheConformance(AllChecks):
    """Namespace, data, vector reads, cross-door reads and persist-on-close."""

    #: the large-file check's size: STORAGESCALE_LARGE_MB, as the functional checks
    large_file_size = int(os.environ.get("STORAGESCALE_LARGE_MB", "64")) * 1024 * 1024

    @pytest.fixture(autouse=True)
    def _dcache_posc(self, storage_embedded_server) -> None:
        """Why a dCache door (the embedded one, or a site's: a remote endpoint) keeps a
        killed POSC upload, said when it does (XRootD's 'ofs.persist hold' is not its
        reason)."""
        if storage_embedded_server is None or storage_embedded_server.kind == "dcache":
            self.posc_keeps = (
                "dCache 10.2.25 and 11.2.5 put a POSC upload whose writer was killed in "
                "place whole: a stat finds nothing at once and the file 0.3 s later")
