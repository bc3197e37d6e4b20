"""The rerun rule for the embedded xrootd: a test that runs a whole suite through
pytester may run it again when the inner run's own summary says that server crashed
(SIGSEGV, SIGABRT or SIGBUS; never SIGKILL, which something sent). The rules for
third-party client faults stay beside their tests (``_gfal2_crashed`` and
``_only_data_connections_refused`` in test_gridftp.py, ``_lost_xrdhttp_answer`` in
test_xrootd_integration.py)."""

from __future__ import annotations

import re

#: the session's note for an embedded xrootd that died mid-run by a crash
_CRASHED = re.compile(r"the embedded xrootd \(pid \d+, port \d+\) died during the run "
                      r"\(killed by (SIGSEGV|SIGABRT|SIGBUS)\)")


def embedded_server_crashed(result) -> bool:
    """Whether the inner run's embedded xrootd crashed during it. In one CI run the
    conformance suite's xrootd 5.5.3 vanished right after ``test_overwrite[davs]`` (a
    burst of uploads and adler32 requests over XrdHttp, the pattern of its checksum-job
    crash, xrootd/xrootd#2534); not reproduced in 20 runs here. Such a run says so in
    its summary and goes again once."""
    return bool(_CRASHED.search(result.stdout.str()))
