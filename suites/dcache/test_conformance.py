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
    #: a dCache door removes a killed POSC upload once its pool notices the writer is
    #: gone: within 10 s on a quiet machine, later beside 7 other workers' scans (seen
    #: under -n 8 and at load average 24); the check ends as soon as the file is gone
    posc_wait_s = 60.0
    posc_keeps = ("a dCache door removes an upload whose writer died once the pool's "
                  "mover notices the connection is gone")
