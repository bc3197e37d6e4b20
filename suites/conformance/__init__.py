"""Functional conformance: what a storage upgrade must still do, over every door.

Shared checks as abstract test classes (:mod:`.checks`), run through each door of
the storage (:mod:`.doors`: the embedded server's ``root`` and ``davs`` doors, or
``--storage-endpoint`` plus ``--storage-door NAME=URL``). ``pytest suites/conformance``
runs them all; a system suite reuses them by subclassing (``suites/xrootd``,
``suites/dcache``). Checks known to fail on a storage version are listed in its
thresholds file's ``[known_issues]`` and run as strict expected failures.
"""

from .authz import AuthorizationChecks  # noqa: F401 - token and credential checks
from .checks import (
    AllChecks,
    ConformanceChecks,
    CrossDoorChecks,
    DataChecks,
    KnownIssues,
    NamespaceChecks,
    PersistOnCloseChecks,
    VectorReadChecks,
)
from .doors import Door
from .redirection import RedirectionChecks  # noqa: F401 - a redirector's checks
from .tpc import ThirdPartyCopyChecks

__all__ = [
    "AllChecks", "ConformanceChecks", "CrossDoorChecks", "DataChecks", "Door", "KnownIssues",
    "NamespaceChecks", "PersistOnCloseChecks", "ThirdPartyCopyChecks", "VectorReadChecks",
]
