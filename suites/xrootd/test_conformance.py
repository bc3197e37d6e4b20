"""The shared functional checks (suites/conformance) over every door of the XRootD
storage: the embedded xrootd's root:// and davs:// doors, or --storage-endpoint plus
--storage-door NAME=URL. Known failures of a version: [known_issues] in its
thresholds file."""

from __future__ import annotations

import pytest

from ..conformance import AllChecks
from ..conformance.fixtures import storage_doors  # noqa: F401 - the doors fixture

pytestmark = pytest.mark.storagescale_system("xrootd")


class TestXRootDConformance(AllChecks):
    """Namespace, data, vector reads, cross-door reads and persist-on-close."""
