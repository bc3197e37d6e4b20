"""Authorization over every door of the XRootD storage (suites/conformance/authz.py):
a read-only token reads but cannot write, a write token writes, no credential and an
expired token are refused. They need token logins::

    pytest suites/xrootd --storage-embedded-login token            # the embedded xrootd
    pytest suites/xrootd --storage-endpoint root://host//area \\
        --storage-driver-option token=... \\
        --storage-token-readonly FILE --storage-token-expired FILE   # a remote storage

Under any other login they skip, saying which option runs them.
"""

from __future__ import annotations

import pytest

from ..conformance.authz import AuthorizationChecks

pytestmark = pytest.mark.storagescale_system("xrootd")


class TestXRootDAuthorization(AuthorizationChecks):
    """Read-only, write, missing and expired credentials, over root:// (ztn) and
    davs:// (Authorization: Bearer)."""
