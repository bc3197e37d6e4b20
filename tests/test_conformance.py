"""The conformance suite (suites/conformance) run through pytester: over both doors of
the embedded xrootd with the shipped known issues, and over a remote endpoint with a
named extra door whose server lacks the checksum plugin."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from plans import shipped_known_issues, xrootd_plan
from reruns import embedded_server_crashed, lost_xrdhttp_answer

from pytest_storagescale.servers.xrootd import EmbeddedXRootD

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "suites" / "conformance"
#: what the suite runs per door: 17 checks on each of the two doors
CHECKS_PER_DOOR = 17


def test_every_door_of_the_embedded_xrootd(pytester, tmp_path):
    """Both doors in the ids; the shipped known issues are XFAIL with their reason;
    a check listed as known to fail that passes fails as 'now passes'."""
    pretend = '"ls[root]" = "listed to show the strict mode: this check passes"\n'
    thresholds = xrootd_plan(tmp_path, shipped_known_issues() + pretend)
    args = (str(SUITE), f"--storage-thresholds={thresholds}", "-n", "2", "-p",
            "no:cacheprovider", "-rxXs", "-v")
    result = pytester.runpytest_subprocess(*args)
    if embedded_server_crashed(result) or lost_xrdhttp_answer(result, ("test_ls[root]",)):
        result = pytester.runpytest_subprocess(*args)
    # 4 shipped known issues; ls[root] passes although listed: XPASS(strict) -> failed;
    # persist_on_close is a skip on the davs door (kXR_posc is an XRootD open flag)
    result.assert_outcomes(passed=2 * CHECKS_PER_DOOR - 4 - 1 - 1, xfailed=4, failed=1,
                           skipped=1)
    out = result.stdout.str()
    for door in ("root", "davs"):
        for check in ("put_get_checksum", "cross_door_read", "readv_distinct", "stat_fields"):
            assert re.search(rf"PASSED \S*::test_{check}\[{door}\]", out), (check, door)
    for line in (  # each on its own: the summary's order is not the point
        "XFAIL*test_readv_repeated_chunk?root? - known issue of xrootd*5.x.toml [[]known_issues]"
        " 'readv_repeated_chunk[[]root]'*Invalid response*",
        "[[]XPASS(strict)] known issue*'ls[[]root]'*listed to show the strict mode: this "
        "check passes -- the storage now passes it: remove the entry from [[]known_issues]",
        "SKIPPED [[]1]*: not an XRootD door: persist-on-close is asked for with the XRootD "
        "open flag kXR_posc",
    ):
        result.stdout.fnmatch_lines([line])
    assert re.search(r"PASSED \S*::test_readv_repeated_chunk\[davs\]", out)  # multi-range GET
    # an XFAIL reads as the known issue it is: "now passes" only where one passed
    xfails = [line for line in result.stdout.lines if line.startswith("XFAIL")]
    assert len(xfails) == 4 and not any("passes" in line for line in xfails), xfails
    # every check's folder went with what its clients recorded making: nothing left, named
    assert "StorageScaleWarning" not in out and "could not remove" not in out, out


class NoChecksumXRootD(EmbeddedXRootD):
    """An xrootd without a checksum plugin (no ``xrootd.chksum``): a fault to catch."""

    def _write_config(self) -> Path:
        config = super()._write_config()
        lines = config.read_text().splitlines()
        config.write_text("\n".join(line for line in lines
                                    if not line.startswith("xrootd.chksum")) + "\n")
        return config


@pytest.fixture(scope="module")
def no_checksum_xrootd():
    with NoChecksumXRootD() as server:
        yield server


def test_a_functional_test_the_storage_fails_reads_as_one_paragraph(pytester, monkeypatch,
                                                                     no_checksum_xrootd):
    """A functional test that calls the driver itself (as suites/dcache's do): driver,
    endpoint, operation, path, native status and the test's line, no traceback through
    the plugin; a refused checksum hints at xrootd.chksum, another failure at nothing."""
    monkeypatch.setenv("COLUMNS", "400")  # the short summary's line is not cut
    pytester.makepyfile(test_functional="""
        def test_put_checksum(storage_client, storage_test_dir):
            storage_client.put(f"{storage_test_dir}/f", b"data")
            assert storage_client.checksum(f"{storage_test_dir}/f", "adler32")

        def test_stat_missing(storage_client, storage_test_dir):
            storage_client.stat(f"{storage_test_dir}/nothing-here")
    """)
    result = pytester.runpytest_subprocess(
        f"--storage-endpoint={no_checksum_xrootd.url}", "--storage-version=5.5.3",
        "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "E   xrootd driver, endpoint root://127.0.0.1:*: checksum /storagescale/*/f: the "
        "storage answered an error (xrootd_errno_3013): *[[]status=* errno=3013[]] (asked "
        "at test_functional.py:3). Hint: an xrootd computes checksums only with "
        "'xrootd.chksum adler32' in its configuration*",
        "E   xrootd driver, endpoint root://127.0.0.1:*: stat /storagescale/*/nothing-here: "
        "the storage answered an error (not_found): * (asked at test_functional.py:6).",
        "FAILED test_functional.py::test_put_checksum - StorageError: xrootd driver, *",
    ])
    out = result.stdout.str()
    assert "Traceback" not in out and "drivers/xrootd.py" not in out and "def _check" not in out
    # a missing file is not the checksum's fault (counted in the failures' own lines: on
    # CI, CI=true, pytest does not cut the short summary, which repeats each message)
    assert sum("Hint:" in line for line in result.stdout.lines
               if line.startswith("E   ")) == 1


def test_a_server_without_checksum_plugin_is_caught(pytester, tmp_path, no_checksum_xrootd):
    """--storage-endpoint plus a named door: both fail the checksum checks with the
    door, the operation, the path, the storage's answer and what was expected."""
    server = no_checksum_xrootd
    thresholds = xrootd_plan(tmp_path)
    result = pytester.runpytest_subprocess(
        str(SUITE), f"--storage-endpoint={server.url}",
        f"--storage-door=web={server.https_url}",
        f"--storage-driver-option=ca_dir={server.ca_dir}",
        f"--storage-thresholds={thresholds}", "-p", "no:cacheprovider",
        "-k", "put_get_checksum or missing_file", "-v",
    )
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        "*test_put_get_checksum?root? FAILED*",
        "*test_put_get_checksum?web? FAILED*",
        "*test_missing_file_error?root? PASSED*",
        "*test_missing_file_error?web? PASSED*",
    ])
    out = result.stdout.str()
    root_failure = re.search(r"root door \(root://127\.0\.0\.1:\d+//storagescale\): checksum "
                             r"adler32 /storagescale/storagescale-run-[^ ]+/conformance/"
                             r"test_put_get_checksum-root/file\.dat: the storage answered an "
                             r"error: (.*); expected success\.", out)
    assert root_failure, out[-3000:]
    assert "xrootd checksum" in root_failure.group(1)
    assert "(hint: an xrootd computes checksums only with 'xrootd.chksum adler32'" \
        in root_failure.group(1)
    # the HTTP door: the server refuses the digest the upload asks for (XrdHttp: 405)
    assert re.search(r"web door \(davs://127\.0\.0\.1:\d+/storagescale\): (put|checksum "
                     r"adler32) \S+/file\.dat: the storage answered an error: .+; expected "
                     r"success\.", out), out[-3000:]
