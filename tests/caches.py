"""Reading XCache's access records in tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from pytest_storagescale.servers.xcache import CacheAccess


def access_when(cache, done: Callable[[CacheAccess], bool],
                timeout: float = 60.0) -> CacheAccess:
    """The cache's access records once ``done(records)`` holds, or as they are at the
    deadline. XrdPfc writes a file's records (``.cinfo``) when it releases the file,
    which may be well after the client's close has returned: it defers the release of a
    file with I/O still active, and in one full test run (two xdist workers) no record
    was written within 15 s, though the blocks were on the cache's disk."""
    deadline = time.monotonic() + timeout
    while True:
        records = cache.access()
        if done(records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)
