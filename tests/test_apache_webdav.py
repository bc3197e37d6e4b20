"""The embedded Apache mod_dav door (client certificates): started for real, used
through the http driver with the session's credentials, refusing a client without a
certificate, and suites/dcache run against it (its server without a dCache
distribution) with a shrunk plan."""

from __future__ import annotations

import json
import subprocess
import zlib
from pathlib import Path

import pytest

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import (
    EndpointError,
    StorageError,
    StorageNotFound,
    StorageUnreachable,
)
from pytest_storagescale.servers import apache, processes
from pytest_storagescale.servers.apache import EmbeddedApacheWebDAV
from pytest_storagescale.servers.family import embedded_class

pytestmark = [pytest.mark.slow_server, pytest.mark.integration]
REPO = Path(__file__).resolve().parent.parent
AREA = apache.AREA


@pytest.fixture(scope="module")
def door():
    with EmbeddedApacheWebDAV() as server:
        yield server


@pytest.fixture
def client(door):
    spec = driver_spec(door.url, options=door.driver_options(), writable_root=AREA)
    driver = spec.connect("apache-test", timeout=30)
    yield driver
    driver.close()


def test_registered_and_described(door):
    assert embedded_class("webdav") is EmbeddedApacheWebDAV
    assert door.version.startswith("apache-2.") and door.url.startswith("davs://127.0.0.1:")
    assert door.url_for("https").startswith("https://127.0.0.1:")
    assert "mod_dav" in door.describe() and "client certificate" in door.describe()
    # an end-entity certificate, not a proxy: mod_ssl refuses RFC 3820 proxies
    options = door.driver_options()
    assert set(options) == {"ca_dir", "x509_user_cert", "x509_user_key"}
    assert Path(options["ca_dir"]).is_dir()
    assert door.rss_bytes() > 1_000_000  # the parent and its workers, measured


def test_namespace_and_data_through_the_http_driver(client):
    folder = f"{AREA}/ops"
    data = bytes(range(256)) * 4000 + b"tail"
    assert client.put(f"{folder}/a.dat", data) == len(data)  # makes the missing parent
    info = client.stat(f"{folder}/a.dat")
    assert (info.size, info.is_dir) == (len(data), False)
    assert client.stat(folder).is_dir
    assert client.ls(folder) == ["a.dat"]
    assert client.get(f"{folder}/a.dat", None) == len(data)
    assert client.read(f"{folder}/a.dat", 1000, 16) == data[1000:1016]
    # a multi-range GET: Apache answers multipart/byteranges for distinct ranges
    assert client.readv(f"{folder}/a.dat", [(0, 10), (500_000, 100), (len(data) - 4, 4)]) == 114
    client.rename(f"{folder}/a.dat", f"{folder}/b.dat")
    assert client.ls(folder) == ["b.dat"]
    client.mkdir(f"{folder}/sub/deeper")
    with pytest.raises(StorageError) as refused:
        client.rmdir(f"{folder}/sub")
    assert refused.value.error_class == "not_empty"
    client.rmdir(f"{folder}/sub/deeper")  # a DELETE without stale Depth headers
    client.rmdir(f"{folder}/sub")
    client.delete(f"{folder}/b.dat")
    with pytest.raises(StorageNotFound):
        client.stat(f"{folder}/b.dat")
    client.rmdir(folder)
    assert "ops" not in client.ls(AREA)


def test_no_checksum_is_said_and_transfers_still_pass(client, tmp_path):
    """mod_dav offers no Digest: an explicit checksum says so; uploads and downloads
    are not failed by the driver's own adler32 checks (they stop asking)."""
    data = b"checksum me" * 1000
    client.put(f"{AREA}/c.dat", data)
    with pytest.raises(StorageError) as none:
        client.checksum(f"{AREA}/c.dat", "adler32")
    assert none.value.error_class == "checksum_type"
    assert "offers no adler32" in str(none.value)
    local = tmp_path / "copy"
    assert client.get(f"{AREA}/c.dat", str(local)) == len(data)
    assert zlib.adler32(local.read_bytes()) == zlib.adler32(data)
    client.delete(f"{AREA}/c.dat")


def test_a_client_without_a_certificate_is_refused(door):
    spec = driver_spec(door.url, options={"ca_dir": door.ca_dir})
    stranger = spec.connect("no-certificate", timeout=30)
    try:
        with pytest.raises(StorageUnreachable) as refused:
            stranger.stat(AREA)
    finally:
        stranger.close()
    message = str(refused.value)
    assert refused.value.error_class == "tls"
    assert "No client certificate was given" in message
    assert "x509_user_cert" in message and "x509_proxy" in message


def test_missing_binary_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(processes, "SBIN_PATH", str(tmp_path))
    with pytest.raises(EndpointError, match="apt-get install apache2"):
        EmbeddedApacheWebDAV.check_installed()


def test_stop_leaves_no_process_and_no_directory():
    server = EmbeddedApacheWebDAV().start()
    directory, pid = server.directory, server.group.pid
    assert directory is not None and directory.is_dir()
    server.stop()
    server.stop()  # idempotent
    assert not directory.exists()
    ps = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True)
    alive = [line for line in ps.stdout.splitlines()
             if str(directory) in line and " Z" not in line]
    assert alive == [], f"processes of the stopped Apache (leader {pid}): {alive}"


def test_dcache_suite_runs_against_the_apache_door(pytester, monkeypatch):
    """`pytest suites/dcache --storage-embedded webdav` starts the Apache door (the
    suite's own server when no dCache distribution is available), runs the functional
    and conformance checks and every scan with the shipped plan, shrunk."""
    monkeypatch.setenv("STORAGESCALE_LARGE_MB", "4")
    results = pytester.path / "results.json"
    outcome = pytester.runpytest_subprocess(
        str(REPO / "suites" / "dcache"), "--storage-embedded=webdav",
        "--storage-scale=0.05", "--storage-clients=1",
        f"--storage-results={results}", "-p", "no:cacheprovider", "-rsx",
    )
    # what mod_dav does not do is stated: 17 checks need a checksum or get merged
    # ranges (strict XFAIL with the thresholds file's reason), POSC is XRootD's
    # + ls_open's 2 rates; suites/dcache/test_dcache_behaviour.py's 2 checks skip on
    # both doors (no password login, no xrootd door); the streaming steps' 2 skip (the
    # Apache door's thresholds file has no [ops.streaming] / [ops.streaming_mixed])
    outcome.assert_outcomes(passed=29 + 2, skipped=2 + 4 + 2, xfailed=17)
    outcome.stdout.fnmatch_lines([
        "storagescale: dcache apache-2.4.* at davs://127.0.0.1:*",
        "*thresholds: *dcache/embedded-apache.toml (matched version apache-2.4.* with "
        "pattern 'apache-2.4.[*]'); plan scale 0.05",
        "*XFAIL*test_readv_overlapping*merges overlapping ranges*",
        "*XFAIL*test_large_file*Apache mod_dav offers no checksum*",
    ])
    document = json.loads(results.read_text())
    assert document["run"]["system"] == "dcache"
    assert document["run"]["version"].startswith("apache-2.4.")
    steps = document["steps"]
    assert {s["op"] for s in steps} == {"ls", "ls_open", "copyout", "transactions", "mixed",
                                        "recovery"}
    for step in steps:  # every step measured something, and nothing failed or hung
        assert step["succeeded"] > 0, step["op"]
        assert step["failed"] == 0 and step["hung"] == 0, (step["op"], step["errors"])
    assert all(s["verdict"] in ("pass", "info") for s in steps)
    copy = next(s for s in steps if s["op"] == "copyout")
    assert copy["bytes"] == copy["succeeded"] * 500_000  # 10 MB x 0.05, to local disk
