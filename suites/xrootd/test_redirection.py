"""Redirection through an XRootD redirector (suites/conformance/redirection.py): a file
written through the manager is located on a data server, read back identically
through the manager, and listed::

    pytest suites/xrootd/test_redirection.py --storage-embedded redirector
    pytest suites/xrootd/test_redirection.py --storage-endpoint root://redirector//area

On a door that is not a redirector (a standalone xrootd, davs://) each check is
skipped with the storage's answer that says why."""

from __future__ import annotations

import pytest

from ..conformance import RedirectionChecks

pytestmark = pytest.mark.storagescale_system("xrootd")


class TestXRootDRedirection(RedirectionChecks):
    """locate names a data server that has the file; read and ls through the manager."""
