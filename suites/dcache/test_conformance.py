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
