"""The embedded xrootd in a second release: XRootD 6.2.1, built from PyPI's source
distribution into the cache by scripts/build-xrootd6.sh (make test's set-up runs it).

It starts from the cache on its own libraries only, says 6.2.1 over root:// and over
davs:// (whose Server header no longer names the version: the listing page is asked),
logs in with a token (its SciTokens plug-in is the 6.2.1 one), serves WebDAV requests
and third-party copies (root:// and HTTP, to and from loopback),
and runs from a site's installation prefix too. A davs door that names no version
anywhere is "unknown" with how to state it, never a guess (a door in front of 5.5.3
that answers as 6.x does: no build needed). A release that is not offered, a folder
that is no installation, and 6.2.1 when it is not built are usage errors (exit 4)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hostile_http import HostileDoor, Reply

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.url import EndpointURL
from pytest_storagescale.drivers.version import detect_version, server_header_version
from pytest_storagescale.errors import StorageError
from pytest_storagescale.servers.family import start_embedded
from pytest_storagescale.servers.xrootd_releases import (
    BUILD_SCRIPT,
    BUILT_VERSION,
    MARKER,
    built_prefix,
    foreign_libraries,
)

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
NOT_BUILT = (f"XRootD {BUILT_VERSION} is not built on this machine: run "
             f"'bash {BUILD_SCRIPT}' (make setup runs it; 15-30 minutes, once per machine)")
SUITE = """
def test_endpoint(storage_endpoint, storage_thresholds):
    print("VERSION", storage_endpoint.version, storage_thresholds.path.name)
"""


def _built() -> Path:
    prefix = built_prefix()
    if prefix is None:
        pytest.skip(NOT_BUILT)
    return prefix


@pytest.fixture(scope="module")
def xrootd6():
    """The embedded xrootd at 6.2.1 (unix login), as --storage-embedded-version starts it."""
    _built()
    server = start_embedded("xrootd", "unix", BUILT_VERSION)
    yield server
    server.stop()


def test_the_built_release_runs_on_its_own_libraries(xrootd6):
    """From the cache (or, run as root, a copy of it in the server's folder: the user
    xrootd switches to cannot reach a cache under /root), and nothing of 5.5.3."""
    assert xrootd6.version == BUILT_VERSION
    own = xrootd6.release.lib_dir
    assert own == f"{_built()}/lib" or own == f"{xrootd6.directory}/release/lib"
    maps = Path(f"/proc/{xrootd6.pid}/maps").read_text()
    assert f"{own}/libXrdUtils.so" in maps
    assert f"{own}/libXrdHttp-6.so" in maps  # the davs door's plug-in, by its path
    assert foreign_libraries(xrootd6.pid, xrootd6.release) == []
    assert "libXrdUtils.so" not in maps.replace(f"{own}/libXrdUtils.so", "")


def test_the_version_is_detected_over_root_and_davs(xrootd6):
    root = driver_spec(xrootd6.url, driver="xrootd")
    assert detect_version(root) == BUILT_VERSION
    # XrdHttp 6 sends "Server: XRootD": the http driver and the gfal2 path (the header
    # read apart) both find the version on the listing page instead
    davs = driver_spec(xrootd6.https_url, driver="http", options={"ca_dir": xrootd6.ca_dir})
    assert detect_version(davs) == BUILT_VERSION
    endpoint = EndpointURL.parse(xrootd6.https_url)
    assert server_header_version(endpoint, ca_dir=xrootd6.ca_dir, timeout=10) == BUILT_VERSION


def test_a_davs_request_round_trips(xrootd6):
    spec = driver_spec(xrootd6.https_url + "/davs6", driver="http",
                       writable_root="/storagescale/davs6", options={"ca_dir": xrootd6.ca_dir})
    client = spec.connect("functional-davs6", timeout=20)
    try:
        client.put("/storagescale/davs6/f.bin", b"six" * 1000)
        assert client.get("/storagescale/davs6/f.bin") == 3000
        assert client.read("/storagescale/davs6/f.bin", 2997, 3) == b"six"
        assert client.stat("/storagescale/davs6/f.bin").size == 3000
    finally:
        client.remove_tree("/storagescale/davs6")
        client.close()


@pytest.mark.slow_server
def test_a_token_login_on_the_built_release():
    """ztn over TLS, authorised by the 6.2.1 libXrdAccSciTokens: the server is ready only
    once a client logged in with the token and was answered (the start's probe)."""
    _built()
    server = start_embedded("xrootd", "token", BUILT_VERSION)
    try:
        assert server.version == BUILT_VERSION
        config = (server.directory / "xrootd.cfg").read_text()
        assert f"{server.release.lib_dir}/libXrdAccSciTokens-6.so" in config
        assert foreign_libraries(server.pid, server.release) == []
    finally:
        server.stop()


def test_a_site_prefix_is_a_release_too(pytester):
    prefix = _built()
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-s", "-p", "no:cacheprovider",
                                f"--storage-thresholds={REPO / 'thresholds'}",
                                f"--storage-embedded-version={prefix}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*VERSION {BUILT_VERSION} 6.x.toml"])


@pytest.mark.slow_server
def test_third_party_copies_on_the_built_release(pytester):
    """root:// (ofs.tpc runs the release's xrdcp, which needs its libraries) and HTTP
    (refused to and from loopback since 5.9.3 unless 'tpc.allow local'), both ways,
    between the 6.2.1 storage and the suite's peer."""
    _built()
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "xrootd"), f"--storage-thresholds={REPO / 'thresholds'}",
        "-k", "tpc", "-p", "no:cacheprovider", "-v", "-rfE",
        f"--storage-embedded-version={BUILT_VERSION}")
    result.assert_outcomes(passed=4)


# -- a davs door that names no version ----------------------------------------------
LISTING = b"<html><body><p>Powered by XrdHTTP v6.2.1 (CERN IT-SDC)</p></body></html>"


@pytest.fixture
def door_as_six(embedded_xrootd, tmp_path):
    """``open(get_reply)``: a door in front of the embedded 5.5.3 XrdHttp that answers
    HEAD with ``Server: XRootD`` (as 6.x) and GET with ``get_reply``."""
    doors = []

    def open_door(get_reply: Reply) -> HostileDoor:
        def rule(request):
            if request.method == "HEAD":
                return Reply(200, {"Server": "XRootD"})
            return get_reply if request.method == "GET" else None

        door = HostileDoor(embedded_xrootd.authority, tmp_path,
                           f"https://127.0.0.1:{embedded_xrootd.http_port}",
                           embedded_xrootd.ca_dir, rule).__enter__()
        doors.append(door)
        return door

    yield open_door
    for door in doors:
        door.__exit__(None, None, None)


def test_a_bare_xrootd_server_header_asks_the_listing_page(door_as_six, embedded_xrootd):
    door = door_as_six(Reply(200, {"Server": "XRootD", "Content-Type": "text/html"}, LISTING))
    spec = driver_spec(door.url("/storagescale"), driver="http",
                       options={"ca_dir": embedded_xrootd.ca_dir})
    assert detect_version(spec) == "6.2.1"
    assert [request.method for request in door.seen] == ["HEAD", "GET"]


@pytest.mark.parametrize("get_reply, why", [
    (Reply(403, {"Server": "XRootD"}, b"listing denied"), "answered HTTP 403"),
    (Reply(200, {"Server": "XRootD"}, b"<html>no version here</html>"), "it names none"),
])
def test_a_version_named_nowhere_is_unknown_with_how_to_state_it(door_as_six, embedded_xrootd,
                                                                get_reply, why):
    door = door_as_six(get_reply)
    for driver in ("http", "gfal2_header"):
        with pytest.raises(StorageError) as caught:
            if driver == "http":
                detect_version(driver_spec(door.url("/storagescale"), driver="http",
                                           options={"ca_dir": embedded_xrootd.ca_dir}))
            else:
                server_header_version(EndpointURL.parse(door.url("/storagescale")),
                                      ca_dir=embedded_xrootd.ca_dir, timeout=10)
        message = str(caught.value)
        assert "the version of this XRootD is unknown" in message
        assert why in message and "--storage-version VERSION" in message
        assert "5.5.3" not in message  # the real server behind the door is never guessed


def test_a_session_against_such_a_door_stops_naming_how_to_state_the_version(
        door_as_six, embedded_xrootd, pytester):
    door = door_as_six(Reply(403, {"Server": "XRootD"}, b"listing denied"))
    pytester.makepyfile(test_suite=SUITE)
    args = ("-p", "no:cacheprovider", f"--storage-endpoint={door.url('/storagescale')}",
            f"--storage-driver-option=ca_dir={embedded_xrootd.ca_dir}")
    result = pytester.runpytest(*args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret != 0
    assert "the version of this XRootD is unknown" in out and "--storage-version" in out
    assert "Traceback" not in out
    # stated, the same door is used: the thresholds file of the version given
    result = pytester.runpytest("-s", *args, "--storage-version=6.2.1",
                                f"--storage-thresholds={REPO / 'thresholds'}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*VERSION 6.2.1 6.x.toml"])


# -- the cache: a build without its marker is none ---------------------------------------
def test_a_partial_build_is_not_used_and_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    script = [str(REPO / BUILD_SCRIPT)]
    prefix = Path(subprocess.run(["bash", *script, "--print-prefix"], capture_output=True,
                                 text=True, check=True).stdout.strip())
    assert prefix.parent == tmp_path / "pytest-storagescale"
    assert prefix.name.startswith(f"xrootd-{BUILT_VERSION}-")
    (prefix / "bin").mkdir(parents=True)  # a build stopped before its marker
    (prefix / "bin" / "xrootd").write_text("half")
    assert built_prefix() is None
    plan = subprocess.run(["bash", *script, "--dry-run"], capture_output=True, text=True,
                          check=True).stdout
    assert f"rm -rf {prefix} " in plan and " make -C " in plan  # thrown away, built again
    (prefix / MARKER).write_text(f"version={BUILT_VERSION}\n")
    assert built_prefix() == prefix
    done = subprocess.run(["bash", *script], capture_output=True, text=True, check=True)
    assert "already built" in done.stdout  # the marker: nothing to do


# -- usage errors -----------------------------------------------------------------------
@pytest.mark.parametrize("value, message", [
    ("9.9.9", "--storage-embedded-version 9.9.9: the embedded xrootd offers *6.2.1, or the "
              "path of an XRootD installation prefix*"),
    ("{empty}", "--storage-embedded-version {empty}: {empty} has no executable bin/xrootd*"),
])
def test_a_release_not_offered_is_a_usage_error(pytester, value, message):
    empty = pytester.mkdir("not-an-installation")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-p", "no:cacheprovider",
                                f"--storage-embedded-version={value.format(empty=empty)}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message.format(empty=empty)}"])
    assert "Traceback" not in result.stderr.str()


def test_the_built_release_missing_names_the_build_script(pytester, tmp_path):
    pytester.makepyfile(test_suite=SUITE)
    with pytest.MonkeyPatch.context() as patch:  # a cache that holds no build
        patch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
        result = pytester.runpytest("-p", "no:cacheprovider",
                                    f"--storage-embedded-version={BUILT_VERSION}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --storage-embedded-version {BUILT_VERSION}: XRootD "
                                 f"{BUILT_VERSION} is not built on this machine*{BUILD_SCRIPT}*"])
