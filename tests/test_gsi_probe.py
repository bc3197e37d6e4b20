"""The XRootD client's gsi plug-in takes its CA folder and proxy once per process: two
embedded xrootd servers with the gsi login, each with a throwaway CA of its own,
started one after the other in one process, both start (the readiness probe runs in
a process of its own; in this process the second's failed with "No protocols left to
try", as a CI run's gsi logins did after the dCache checks' gsi stat)."""

from __future__ import annotations

import pytest

from pytest_storagescale.servers.xrootd import EmbeddedXRootD

pytestmark = pytest.mark.integration


def test_two_gsi_servers_in_one_process_both_start():
    versions = []
    for _ in range(2):
        with EmbeddedXRootD(login="gsi") as server:
            versions.append(server.version)
    assert len(versions) == 2 and all(versions), versions
