"""Every functional check over every door of the storage under test::

    pytest suites/conformance                       # the embedded xrootd: root and davs
    pytest suites/conformance --storage-endpoint root://host//area \
        --storage-door davs=davs://host:2880/area   # a remote storage's doors
"""

from __future__ import annotations

from .checks import AllChecks


class TestConformance(AllChecks):
    """The shared checks, under the storage system the session names (default xrootd)."""
