"""Third-party copy checks (suites/conformance/tpc.py): they pass between two embedded
xrootd servers, catch a storage that offers no TPC (a failure saying so, not a
traceback), skip a remote storage without ``--storage-tpc-peer`` naming that option;
and the copies are guarded on the side they write."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import StorageError, UnsafePathError
from pytest_storagescale.servers.xrootd import EmbeddedXRootD

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
SUITE = REPO / "suites" / "xrootd"
CHECKS = ("tpc_root_pull", "tpc_root_push", "tpc_http_pull", "tpc_http_push")


def _run_checks(pytester, *args):
    return pytester.runpytest_subprocess(
        str(SUITE), f"--storage-thresholds={REPO / 'thresholds'}", "-k", "tpc",
        "-p", "no:cacheprovider", "-v", "-rfEs", *args)


@pytest.mark.slow_server
def test_tpc_checks_pass_between_two_embedded_xrootd(pytester):
    """The embedded storage and a second embedded xrootd (started by the suite's peer
    fixture): root:// and HTTP copies both ways arrive with their size and adler32."""
    result = _run_checks(pytester)
    result.assert_outcomes(passed=4)
    for check in CHECKS:
        result.stdout.fnmatch_lines([f"*::test_{check} PASSED*"])
    # the copies' targets were recorded as made: both sides' folders and the peer's run
    # directory went, nothing left and named
    out = result.stdout.str()
    assert "StorageScaleWarning" not in out and "could not remove" not in out, out


@pytest.fixture(scope="module")
def storage_without_tpc_and_peer():
    """A storage that offers no third-party copy, and a peer that does (whose CA the
    storage's CA folder holds: the clients verify both against one folder)."""
    with EmbeddedXRootD(tpc=False) as storage, EmbeddedXRootD() as peer:
        storage.trust(peer.ca_dir)
        peer.trust(storage.ca_dir)  # the peer's copies verify the storage (a pull from it)
        yield storage, peer


def _remote_args(storage: EmbeddedXRootD) -> list[str]:
    return [f"--storage-endpoint={storage.url}", f"--storage-door=davs={storage.https_url}",
            f"--storage-driver-option=ca_dir={storage.ca_dir}"]


@pytest.mark.slow_server
def test_a_storage_without_tpc_is_caught(pytester, storage_without_tpc_and_peer):
    """Each check fails in one paragraph: the door, the copy asked for, the path, that
    the storage does not offer third-party copy, and what was expected."""
    storage, peer = storage_without_tpc_and_peer
    result = _run_checks(pytester, *_remote_args(storage),
                         f"--storage-tpc-peer={peer.url}", f"--storage-tpc-peer={peer.https_url}")
    result.assert_outcomes(failed=4)
    out = result.stdout.str()
    assert "Traceback" not in out and "def run_copy" not in out, out[-3000:]
    expected = r"expected the file copied server to server \(third-party copy offered"
    root = r"root door \(root://127\.0\.0\.1:\d+//storagescale\): "
    assert re.search(root + r"third-party copy \(the storage pulls\) from root://\S+ to "
                     r"/storagescale/\S+/pulled\.dat: the storage does not offer third-party "
                     r"copy: .*(Destination does not support third-party-copy|tpc not "
                     r"supported).*; " + expected,
                     out), out[-4000:]
    assert re.search(root + r"third-party copy to root://\S+/pushed\.dat \(the peer pulls: "
                     r"root:// TPC is destination-driven\) of /storagescale/\S+/source\.dat: "
                     r"the storage does not offer third-party copy: .*Source does not support "
                     r"third-party-copy.*; " + expected, out), out[-4000:]
    davs = r"davs door \(davs://127\.0\.0\.1:\d+/storagescale\): COPY "
    for header, name in (("Source", "pulled"), ("Destination", "source")):
        assert re.search(davs + rf"\({header}: https://127\.0\.0\.1:\d+/\S+\) (to|of) "
                         rf"/storagescale/\S+/{name}\.dat: the storage does not offer "
                         rf"third-party copy: COPY refused: .*\[HTTP \d+.*; " + expected,
                         out), out[-4000:]


def test_a_remote_storage_without_a_peer_skips_naming_the_option(
        pytester, storage_without_tpc_and_peer):
    """No --storage-tpc-peer for a remote storage: every check skips, saying how to
    name a peer (never a silent skip)."""
    storage, _ = storage_without_tpc_and_peer
    result = _run_checks(pytester, *_remote_args(storage))
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(["SKIPPED*third-party copy needs a second storage: name its "
                                 "writable area with --storage-tpc-peer URL (ini "
                                 "storage_tpc_peer)*"])


def test_a_peer_url_of_another_protocol_is_one_paragraph(pytester,
                                                         storage_without_tpc_and_peer):
    """A --storage-tpc-peer the checks cannot use fails them naming the value and the
    fix, without a traceback."""
    storage, _ = storage_without_tpc_and_peer
    result = _run_checks(pytester, *_remote_args(storage),
                         "--storage-tpc-peer=gsiftp://peer/area")
    result.assert_outcomes(errors=4)
    result.stdout.fnmatch_lines(["*--storage-tpc-peer 'gsiftp://peer/area': not the URL of a "
                                 "writable area over root:// or HTTP(S)*"])
    assert "Traceback" not in result.stdout.str()


def test_an_http_copy_that_fails_after_201_is_an_error(storage_without_tpc_and_peer):
    """XrdHttpTPC answers 201 at once and reports the copy's failure in the body's last
    line: that line is the error, the status code is not the outcome."""
    storage, peer = storage_without_tpc_and_peer
    options = {"ca_dir": storage.ca_dir}
    source = driver_spec(storage.https_url, options=options,
                         writable_root="/storagescale/run").connect("tpcsrc", timeout=30)
    target = driver_spec(peer.https_url, options=options,
                         writable_root="/storagescale/run").connect("tpcdst", timeout=30)
    target.mkdir("/storagescale/run")
    with pytest.raises(StorageError) as refused:
        target.pull("/storagescale/run/copy.dat", source, "/storagescale/missing.dat")
    assert refused.value.error_class == "tpc_failed"
    assert refused.value.native_status == "HTTP 201"
    assert re.match(r"the copy ended with 'failure: Remote side failed with status code 404",
                    refused.value.message), refused.value.message
    source.put("/storagescale/run/source.dat", b"tpc" * 1000)
    done = target.pull("/storagescale/run/copy.dat", source, "/storagescale/run/source.dat")
    assert done.outcome.startswith("success") and done.status == 201
    assert target.stat("/storagescale/run/copy.dat").size == 3000
    target.remove_tree("/storagescale/run")
    source.remove_tree("/storagescale/run")


@pytest.mark.parametrize("scheme", ["root", "davs"])
def test_a_copy_is_guarded_on_the_side_it_writes(scheme):
    """The destination's run directory bounds a copy: a pull into the storage outside
    its run directory, and an HTTP push to a peer path outside the peer's, are refused
    before any request is sent (port 1: nothing listens there)."""
    url = f"{scheme}://127.0.0.1:1/area" if scheme == "davs" else "root://127.0.0.1:1//area"
    storage = driver_spec(url, writable_root="/area/run").connect("guard", timeout=2)
    peer = driver_spec(url, writable_root="/area/peer-run").connect("guard", timeout=2)
    with pytest.raises(UnsafePathError, match="refusing third-party copy of '/area/elsewhere"):
        storage.pull("/area/elsewhere/f", peer, "/area/peer-run/f")
    if scheme == "davs":  # the push writes on the peer: the peer's guard applies
        with pytest.raises(UnsafePathError, match="third-party copy of '/area/run/f'.*"
                                                  "/area/peer-run"):
            storage.push("/area/peer-run/f", peer, "/area/run/f")
