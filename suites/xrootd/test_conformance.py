"""The shared functional checks (suites/conformance) over every door of the XRootD
storage: the embedded xrootd's root:// and davs:// doors, or --storage-endpoint plus
--storage-door NAME=URL; and third-party copy with a second storage (a second embedded
xrootd, or --storage-tpc-peer URL). Known failures of a version: [known_issues] in its
thresholds file."""

from __future__ import annotations

import pytest

from ..conformance import AllChecks, ThirdPartyCopyChecks
from ..conformance.tpc import storage_tpc_peer  # noqa: F401 - the TPC peer fixture

pytestmark = pytest.mark.storagescale_system("xrootd")


class TestXRootDConformance(AllChecks, ThirdPartyCopyChecks):
    """Namespace, data, vector reads, cross-door reads, persist-on-close and
    third-party copy (root:// and HTTP, into the storage and out of it)."""
