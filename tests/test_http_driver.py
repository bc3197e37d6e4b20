"""The http driver (libcurl) against the embedded xrootd's davs:// door (XrdHttp):
every operation, checksums, one kept-alive connection per client, TLS and client
certificates, the token never shown, the careful rmdir, and a plugin run that picks
it by default."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import psutil
import pycurl
import pytest
from sockets import connection_ends

from pytest_storagescale.drivers.base import Driver
from pytest_storagescale.drivers.http import HTTPDriver, _webdav
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import (
    StorageError,
    StorageNotFound,
    StorageScaleUsageError,
    StorageTimeout,
    StorageUnreachable,
    UnsafePathError,
)

pytestmark = pytest.mark.integration
TOKEN = "eyJhbGciOiJub25lIn0.storagescale-secret-token-value"


@pytest.fixture
def area(embedded_xrootd, request):
    """A per-test directory on the davs:// door and a driver that may write in it."""
    root = f"/storagescale/http-{request.node.name[:40]}"
    spec = driver_spec(embedded_xrootd.https_url, writable_root=root,
                       options={"ca_dir": embedded_xrootd.ca_dir})
    driver = spec.connect("functional-http", timeout=20)
    driver.mkdir(root)
    yield root, driver, spec
    driver.remove_tree(root)
    driver.close()


@pytest.fixture
def checked(area, embedded_xrootd):
    """A driver of the same area that verifies checksums on this XrdHttp door too
    (``checksum=adler32``; few requests: xrootd 5.5's checksums under load crash it)."""
    root = area[0]
    driver = driver_spec(embedded_xrootd.https_url, writable_root=root, options={
        "ca_dir": embedded_xrootd.ca_dir, "checksum": "adler32"}).connect("functional-sum",
                                                                          timeout=20)
    yield root, driver
    driver.close()


def _payload(size: int) -> bytes:
    return os.urandom(size)  # binary, NUL bytes included


def _server_data(server, path: str) -> Path:
    return Path(server.directory) / "data" / path.lstrip("/")


# -- choice of driver -----------------------------------------------------------------
def test_http_doors_default_to_the_http_driver_and_gfal2_stays_selectable():
    for url in ("davs://h:2880/pnfs/t", "https://h/data/t", "http://h/data/t", "dav://h/d/t"):
        assert driver_spec(url).name == "http", url
    assert driver_spec("davs://h:2880/pnfs/t", driver="gfal2").name == "gfal2"
    assert driver_spec("root://h:1094//data/t").name == "xrootd"
    with pytest.raises(StorageScaleUsageError, match="cannot speak root://"):
        driver_spec("root://h:1094//data/t", driver="http")


def test_bad_option_values_are_usage_errors(tmp_path):
    with pytest.raises(StorageScaleUsageError, match=r"ca_dir=/no/such/ca: no such folder"):
        driver_spec("davs://h/d/t", options={"ca_dir": "/no/such/ca"})
    with pytest.raises(StorageScaleUsageError, match="x509_proxy=/no/proxy: not a readable"):
        driver_spec("davs://h/d/t", options={"x509_proxy": "/no/proxy"})
    with pytest.raises(StorageScaleUsageError, match="checksum=md5: valid values are auto"):
        driver_spec("davs://h/d/t", options={"checksum": "md5"})
    with pytest.raises(StorageScaleUsageError, match="Valid options: ca_dir, x509_proxy"):
        driver_spec("davs://h/d/t", options={"krb5ccname": "/tmp/krb"})


# -- every operation ------------------------------------------------------------------
def test_namespace_operations(area):
    root, driver, _ = area
    driver.mkdir(f"{root}/a/b/c")  # mkdir -p
    driver.mkdir(f"{root}/a/b/c")  # an existing directory is fine
    assert driver.stat(f"{root}/a/b/c").is_dir
    driver.put(f"{root}/a/f", b"abc")
    info = driver.stat(f"{root}/a/f")
    assert info.size == 3 and not info.is_dir and info.modified is not None
    assert driver.ls(f"{root}/a") == ["b", "f"]
    driver.put(f"{root}/a/g", b"old")
    driver.rename(f"{root}/a/f", f"{root}/a/g")  # Overwrite: T
    assert driver.ls(f"{root}/a") == ["b", "g"]
    assert driver.read(f"{root}/a/g", 0, 3) == b"abc"
    driver.delete(f"{root}/a/g")
    with pytest.raises(StorageNotFound) as info:
        driver.stat(f"{root}/a/g")
    error = info.value
    assert (error.driver, error.operation, error.path) == ("http", "stat", f"{root}/a/g")
    assert error.native_status == "HTTP 404 Not Found" and error.error_class == "not_found"
    with pytest.raises(StorageNotFound):
        driver.delete(f"{root}/a/g")
    with pytest.raises(UnsafePathError):
        driver.delete("/storagescale/other")


def test_exclusive_mkdir_refuses_an_existing_path_and_a_missing_parent(area):
    root, driver, _ = area
    driver.mkdir(f"{root}/run", parents=False)
    with pytest.raises(StorageError) as info:
        driver.mkdir(f"{root}/run", parents=False)
    assert info.value.error_class == "exists"
    driver.put(f"{root}/file", b"x")
    with pytest.raises(StorageError) as info:
        driver.mkdir(f"{root}/file", parents=False)
    assert info.value.error_class == "exists"
    with pytest.raises(StorageNotFound):
        driver.mkdir(f"{root}/missing/run", parents=False)
    assert driver.ls(root) == ["file", "run"]


def test_put_get_read_readv_with_verified_checksums(checked, tmp_path):
    root, driver = checked
    data = _payload(3_000_000)
    path = f"{root}/deep/er/data.bin"  # the parents are made
    assert driver.put(path, data) == len(data)
    assert driver.checksum(path) == f"{zlib.adler32(data):08x}"
    assert driver.get(path) == len(data)
    local = tmp_path / "copy.bin"
    assert driver.get(path, str(local)) == len(data)
    assert local.read_bytes() == data
    assert driver.read(path, 1_000_000, 4096) == data[1_000_000:1_004_096]
    assert driver.read(path, len(data) - 10, 10) == data[-10:]
    assert driver.read(path, len(data) - 10, 100) == data[-10:]  # across the end: short
    assert driver.read(path, len(data), 10) == b""  # at the end: empty
    chunks = [(0, 10), (4096, 65536), (2_999_990, 10)]
    assert driver.readv(path, chunks) == 10 + 65536 + 10
    assert driver.readv(path, [(7, 5)]) == 5
    with pytest.raises(StorageError, match="offers no md5") as info:
        driver.checksum(path, "md5")  # the embedded server is configured for adler32 only
    assert info.value.error_class == "checksum_type"


def test_a_changed_file_is_a_checksum_mismatch_naming_both_values(checked, embedded_xrootd):
    """The server keeps a file's adler32 with the file (xattr) and trusts it while the
    modification time stays: bytes changed behind its back with the time put back
    make it announce the old adler32, and the download must notice."""
    root, driver = checked
    data = _payload(100_000)
    path = f"{root}/changed.bin"
    driver.put(path, data)  # its verification made the server compute the adler32
    on_disk = _server_data(embedded_xrootd, path)
    times = os.stat(on_disk)
    changed = bytes([data[0] ^ 0xFF]) + data[1:]
    with open(on_disk, "r+b") as stream:
        stream.write(changed[:1])
    os.utime(on_disk, ns=(times.st_atime_ns, times.st_mtime_ns))
    with pytest.raises(StorageError) as info:
        driver.get(path)
    error = info.value
    assert error.error_class == "checksum_mismatch" and error.operation == "get"
    assert f"the server has {zlib.adler32(data):08x}" in error.message
    assert f"the client received {zlib.adler32(changed):08x}" in error.message


def test_upload_comparison_refuses_another_files_answer(area):
    """The upload check with a real server answer: the Digest of another file."""
    root, driver, _ = area
    driver.put(f"{root}/one", b"one")
    answer = driver._request("HEAD", f"{root}/one", headers=["Want-Digest: adler32"],
                             want_headers=True)
    with pytest.raises(StorageError) as info:
        driver._compare(answer, f"{zlib.adler32(b'two'):08x}", "put", f"{root}/two")
    assert info.value.message == (f"adler32 mismatch: the server has {zlib.adler32(b'one'):08x}"
                                  f", the client sent {zlib.adler32(b'two'):08x}")
    driver._compare(answer, f"{zlib.adler32(b'one'):08x}", "put", f"{root}/one")


def test_checksums_by_default_everywhere_but_on_xrdhttp(embedded_xrootd, checked):
    """``auto`` learns the door from its first answer: XrdHttp, so no Want-Digest (its
    checksums crash xrootd 5.5 under load); ``adler32`` verifies there too."""
    root, verifying = checked
    verifying.put(f"{root}/f", b"abc")
    assert verifying._verifying() is True
    auto = driver_spec(embedded_xrootd.https_url, writable_root=root, options={
        "ca_dir": embedded_xrootd.ca_dir}).connect("functional-auto", timeout=20)
    sent: list[bytes] = []
    try:
        auto.get(f"{root}/f")  # the first answer names the door
        assert auto._verifying() is False
        auto.stat(root)  # a request without a header callback: the handle keeps no callback
        handle = auto._transport.idle[0][0]
        handle.setopt(pycurl.VERBOSE, 1)
        handle.setopt(pycurl.DEBUGFUNCTION, lambda kind, text: sent.append(text) if kind == (
            pycurl.INFOTYPE_HEADER_OUT) else None)
        auto.put(f"{root}/g", b"xyz")
        auto.get(f"{root}/g")
    finally:
        auto.close()
    requests = b"".join(sent).decode()
    assert requests.count("PUT ") == 1 and requests.count("GET ") == 1
    assert "HEAD " not in requests and "Want-Digest" not in requests


def test_stat_reads_one_entry_answers_without_the_xml_parser(area, monkeypatch):
    """The fast reading of a stat answer agrees with the XML parser, which it spares."""
    root, driver, _ = area
    driver.put(f"{root}/f", b"12345")
    fast = (driver.stat(f"{root}/f"), driver.stat(root))
    parsed = []
    monkeypatch.setattr(_webdav, "multistatus", lambda data: parsed.append(data) or [])
    assert driver.stat(f"{root}/f") == fast[0] and not parsed  # stat needs no parser
    assert driver.ls(root) == ["f"] and not parsed  # a listing is parsed as it arrives
    monkeypatch.undo()
    answer = driver._request("PROPFIND", f"{root}/f", headers=driver._propfind_headers["0"])
    assert _webdav.multistatus(answer.data)[0][1] == fast[0] == _webdav.one_entry(answer.data)
    assert fast[0].size == 5 and not fast[0].is_dir and fast[1].is_dir


def test_stat_remembers_an_answer_by_its_bytes_never_a_stale_one(area):
    """A stat answer read before is not read again; a changed file is a new answer."""
    root, driver, _ = area
    driver.put(f"{root}/m", b"123")
    assert driver.stat(f"{root}/m").size == 3
    hits = _webdav.one_entry.cache_info().hits
    assert driver.stat(f"{root}/m").size == 3
    assert _webdav.one_entry.cache_info().hits == hits + 1
    driver.put(f"{root}/m", b"1234567")
    assert driver.stat(f"{root}/m").size == 7  # other bytes: read, not remembered


def test_digest_and_multipart_readers():
    assert _webdav.digest("adler32=0a1b2c3d", "ADLER32") == "0a1b2c3d"
    assert _webdav.digest("md5=1B2M2Y8AsgTpgAmY7PhCfg==, adler32=1", "adler32") == "00000001"
    assert _webdav.digest("md5=1B2M2Y8AsgTpgAmY7PhCfg==", "md5") == "d41d8cd98f00b204e9800998ecf8427e"
    assert _webdav.digest("", "adler32") is None
    # a part's bytes may hold the boundary: parts are cut by their Content-Range
    body = (b"\r\n--XY\r\nContent-range: bytes 0-5/100\r\n\r\n--XY--\r\n"
            b"--XY\r\nContent-Range: bytes 10-11/100\r\n\r\nab\r\n--XY--\r\n")
    assert _webdav.byteranges(body, b"XY") == [b"--XY--", b"ab"]


def test_version_from_the_server_header(embedded_xrootd):
    spec = driver_spec(embedded_xrootd.https_url, options={"ca_dir": embedded_xrootd.ca_dir})
    from pytest_storagescale.drivers.version import detect_version

    assert spec.name == "http" and detect_version(spec) == embedded_xrootd.version


# -- the careful rmdir ----------------------------------------------------------------
def test_rmdir_refuses_a_directory_with_entries_and_deletes_nothing(area):
    root, driver, _ = area
    driver.put(f"{root}/d/f", b"1")
    driver.put(f"{root}/d/sub/g", b"2")
    with pytest.raises(StorageError) as info:
        driver.rmdir(f"{root}/d")
    assert info.value.error_class == "not_empty" and Driver._not_empty(info.value)
    assert driver.ls(f"{root}/d") == ["f", "sub"] and driver.ls(f"{root}/d/sub") == ["g"]
    with pytest.raises(StorageError) as info:
        driver.rmdir(f"{root}/d/f")  # a file is no directory
    assert info.value.error_class == "not_a_directory" and not Driver._not_empty(info.value)
    assert driver.remove_tree(f"{root}/d") == 4
    with pytest.raises(StorageNotFound):
        driver.stat(f"{root}/d")
    driver.mkdir(f"{root}/empty")
    driver.rmdir(f"{root}/empty")
    assert driver.ls(root) == []


# -- connections and TLS ----------------------------------------------------------------
def _local_ports(server_port: int) -> set[int]:
    """This process's established connections to the door, by local port."""
    process = psutil.Process()
    listing = getattr(process, "net_connections", process.connections)  # psutil < 6
    return {c.laddr.port for c in listing(kind="tcp")
            if c.raddr and c.raddr.port == server_port and c.status == psutil.CONN_ESTABLISHED}


def test_one_client_keeps_one_connection(area, embedded_xrootd):
    """50 requests on one connection. XrdHttp 5.5.3 now and then loses an answer over
    TLS (the request times out with 0 bytes received, and the driver rightly drops that
    connection; once in a full CI-like run here): then the test goes again once, with
    a new client."""
    try:
        _one_connection_for_50_requests(area, embedded_xrootd, "k")
    except StorageTimeout as exc:
        if "with 0 bytes received" not in str(exc):
            raise
        _one_connection_for_50_requests(area, embedded_xrootd, "again")


def _one_connection_for_50_requests(area, embedded_xrootd, name: str) -> None:
    root, _, spec = area
    before = _local_ports(embedded_xrootd.http_port)
    client = spec.client(0, timeout=20)
    try:
        client.put(f"{root}/{name}", b"keep")
        mine = _local_ports(embedded_xrootd.http_port) - before
        assert len(mine) == 1
        for index in range(10):
            client.stat(f"{root}/{name}")
            client.ls(root)
            client.get(f"{root}/{name}")
            # new names: xrootd keeps a file's adler32 by its whole-second modification
            # time, and announces the old one after an overwrite within the same second
            client.put(f"{root}/{name}{index}", b"again")
            client.checksum(f"{root}/{name}{index}")
        assert _local_ports(embedded_xrootd.http_port) - before == mine
    finally:
        client.close()
    assert not _local_ports(embedded_xrootd.http_port) - before


def test_threads_sharing_the_session_driver_get_handles_of_their_own(area, embedded_xrootd):
    """The set-up uploads in parallel through one driver: each thread at a time gets a
    handle (and connection) of its own, given back for the next request."""
    from concurrent.futures import ThreadPoolExecutor

    root, driver, _ = area
    before = _local_ports(embedded_xrootd.http_port)
    with ThreadPoolExecutor(8) as pool:
        sizes = list(pool.map(lambda i: driver.put(f"{root}/p{i:03d}", b"x" * i), range(64)))
    assert sizes == list(range(64))
    assert driver.ls(root) == [f"p{i:03d}" for i in range(64)]
    assert 1 <= len(_local_ports(embedded_xrootd.http_port) - before) <= 8


def test_a_new_connection_resumes_the_tls_session(area):
    """After the server closed the connection, the next one offers the saved session."""
    root, _, spec = area
    client = spec.client(1, timeout=20)
    try:
        client.stat(root)
        handle = client._transport.idle[0][0]
        log: list[bytes] = []
        handle.setopt(pycurl.VERBOSE, 1)
        handle.setopt(pycurl.DEBUGFUNCTION, lambda kind, text: log.append(text))
        client._request("HEAD", root, headers=["Connection: close"])
        client.stat(root)
    finally:
        client.close()
    text = b"".join(log).decode(errors="replace")
    assert "Closing connection" in text and "SSL re-using session ID" in text


def test_wrong_ca_folder_is_one_tls_paragraph(embedded_xrootd, tmp_path):
    other = tmp_path / "other-ca"
    other.mkdir()
    driver = driver_spec(embedded_xrootd.https_url, options={"ca_dir": str(other)}).connect(
        "functional-ca", timeout=10)
    with pytest.raises(StorageUnreachable) as info:
        driver.stat("/storagescale")
    driver.close()
    error = info.value
    assert error.error_class == "tls" and "\n" not in str(error)
    assert error.message.startswith("TLS verification failed: ")
    assert f"CA folder {other} (driver option ca_dir" in error.message
    assert "never switched off" in error.message


def test_unreachable_door_is_an_unreachable_error(embedded_xrootd):
    from pytest_storagescale.servers.processes import free_port

    driver = driver_spec(f"davs://127.0.0.1:{free_port()}/storagescale").connect(
        "functional-down", timeout=5)
    with pytest.raises(StorageUnreachable) as info:
        driver.stat("/storagescale")
    assert info.value.error_class == "unreachable"


# -- credentials ---------------------------------------------------------------------
def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def grid_identity(embedded_xrootd, tmp_path_factory):
    """A user certificate from a CA the door trusts, its RFC 3820 proxy (certificate,
    key and chain in one file), and a certificate from a CA it does not trust."""
    folder = tmp_path_factory.mktemp("identity")

    def ca(name: str) -> Path:
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                 str(folder / f"{name}.key"), "-out", str(folder / f"{name}.pem"), "-days", "1",
                 "-subj", f"/CN={name}")
        return folder / f"{name}.pem"

    def certificate(name: str, subject: str, issuer: str, extensions: str) -> None:
        (folder / f"{name}.cnf").write_text(extensions)
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout",
                 str(folder / f"{name}.key"), "-out", str(folder / f"{name}.csr"),
                 "-subj", subject)
        _openssl("x509", "-req", "-in", str(folder / f"{name}.csr"), "-CA",
                 str(folder / f"{issuer}.pem"), "-CAkey", str(folder / f"{issuer}.key"),
                 "-set_serial", str(abs(hash(name)) % 10**9), "-out",
                 str(folder / f"{name}.pem"), "-days", "1", "-extfile",
                 str(folder / f"{name}.cnf"))

    user_ext = ("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=clientAuth\n")
    trusted = ca("storagescale-test-users-ca")
    ca("untrusted-ca")
    certificate("user", "/DC=org/DC=storagescale/CN=Alice Tester",
                "storagescale-test-users-ca", user_ext)
    certificate("proxy", "/DC=org/DC=storagescale/CN=Alice Tester/CN=123456789", "user",
                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,"
                "keyEncipherment\nproxyCertInfo=critical,language:id-ppl-inheritAll\n")
    certificate("mallory", "/CN=Mallory", "untrusted-ca", user_ext)
    proxy = folder / "x509up"
    proxy.write_bytes(b"".join((folder / n).read_bytes()
                               for n in ("proxy.pem", "proxy.key", "user.pem")))
    proxy.chmod(0o600)
    # the door trusts the users' CA (a hashed CA folder, read at each handshake)
    shutil.copy(trusted, Path(embedded_xrootd.ca_dir) / trusted.name)
    _openssl("rehash", embedded_xrootd.ca_dir)
    done = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", str(folder / "user.pem")],
                          capture_output=True, text=True, check=True, timeout=60)
    yield {"folder": folder, "proxy": proxy, "user_hash": done.stdout.strip()}


def _logins(server) -> str:
    return server.log_path.read_text(errors="replace")


@pytest.mark.parametrize("credential", ["proxy", "certificate"])
def test_client_certificate_and_proxy_identify_the_user(embedded_xrootd, grid_identity,
                                                        credential):
    """XrdHttp verifies a client certificate against its CA folder and logs the user in
    by the hash of the user's subject (a proxy's too)."""
    folder = grid_identity["folder"]
    options = ({"x509_proxy": str(grid_identity["proxy"])} if credential == "proxy" else
               {"x509_user_cert": str(folder / "user.pem"),
                "x509_user_key": str(folder / "user.key")})
    login = f"login as {grid_identity['user_hash']}.0"
    seen = _logins(embedded_xrootd).count(login)
    driver = driver_spec(embedded_xrootd.https_url, options={
        "ca_dir": embedded_xrootd.ca_dir, **options}).connect("functional-x509", timeout=20)
    try:
        assert driver.stat("/storagescale").is_dir
    finally:
        driver.close()
    assert _logins(embedded_xrootd).count(login) > seen


def test_a_certificate_the_door_does_not_trust_is_refused(embedded_xrootd, grid_identity):
    folder = grid_identity["folder"]
    driver = driver_spec(embedded_xrootd.https_url, options={
        "ca_dir": embedded_xrootd.ca_dir, "x509_user_cert": str(folder / "mallory.pem"),
        "x509_user_key": str(folder / "mallory.key")}).connect("functional-bad", timeout=20)
    with pytest.raises(StorageUnreachable) as info:
        driver.stat("/storagescale")
    assert info.value.error_class == "tls"
    assert f"refused the client certificate {folder / 'mallory.pem'}" in info.value.message
    driver = driver_spec(embedded_xrootd.https_url, options={
        "ca_dir": embedded_xrootd.ca_dir, "x509_user_cert": str(folder / "mallory.key")}
    ).connect("functional-bad", timeout=20)
    with pytest.raises(StorageError) as info:  # a key is no certificate
        driver.stat("/storagescale")
    assert info.value.error_class == "tls_client"
    assert f"the client certificate {folder / 'mallory.key'}" in info.value.message


def test_the_token_is_sent_as_bearer_and_never_shown(area, embedded_xrootd):
    root, _, _ = area
    spec = driver_spec(embedded_xrootd.https_url, writable_root=root,
                       options={"ca_dir": embedded_xrootd.ca_dir, "token": TOKEN})
    client = spec.client(0, timeout=20)
    log: list[bytes] = []
    try:
        client.stat(root)
        handle = client._transport.idle[0][0]
        handle.setopt(pycurl.VERBOSE, 1)
        handle.setopt(pycurl.DEBUGFUNCTION,
                      lambda kind, text: log.append(text) if kind == pycurl.INFOTYPE_HEADER_OUT
                      else None)
        client.put(f"{root}/t", b"t")
        with pytest.raises(StorageNotFound) as info:
            client.stat(f"{root}/missing")
        shown = " ".join([repr(spec), repr(client), str(info.value), repr(info.value)])
    finally:
        client.close()
    sent = b"".join(log).decode()
    assert f"Authorization: Bearer {TOKEN}\r\n" in sent
    assert TOKEN not in shown and "token=***" in repr(spec)


def test_a_token_is_never_sent_in_clear():
    with pytest.raises(StorageScaleUsageError) as info:
        HTTPDriver(driver_spec("http://127.0.0.1:1/area").endpoint, options={"token": TOKEN})
    assert "never sent over http://" in str(info.value) and TOKEN not in str(info.value)


# -- through the plugin ----------------------------------------------------------------
SUITE = """
import pytest

def test_driver(storage_endpoint):
    print("DRIVER", storage_endpoint.driver_name)

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()

@pytest.mark.storagescale_op("put")
def test_put(storage_load, storage_clients):
    storage_load.run()
"""
PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "1s"
warmup = "0s"
hang_timeout = "30s"

[ops.stat]
clients = [3]
[[ops.stat.expect]]
clients = "*"
rules = ["succeeded > 0", "failed == 0"]

[ops.put]
clients = [2]
file_size = 100000
[[ops.put.expect]]
clients = "*"
rules = ["succeeded > 0", "failed == 0"]
"""


def test_a_davs_run_uses_the_http_driver_and_never_shows_the_token(pytester, thresholds_dir):
    thresholds_dir(PLAN)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "-s", "-p", "no:cacheprovider", "--storage-embedded-protocol", "davs",
        f"--storage-thresholds={thresholds_dir.root}", "--storage-results=results.json",
        f"--storage-driver-option=token={TOKEN}", timeout=300)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*DRIVER http*", "stat*3*pass", "put*2*pass"])
    document = json.loads((pytester.path / "results.json").read_text())
    assert document["run"]["driver"] == "http"
    assert "token" in document["run"]["driver_options"]
    assert {s["op"]: s["failed"] for s in document["steps"]} == {"stat": 0, "put": 0}
    assert all(s["succeeded"] > 0 for s in document["steps"])
    everything = result.stdout.str() + result.stderr.str() + json.dumps(document)
    assert TOKEN not in everything


def test_connect_opens_the_clients_connection_before_any_request(area, embedded_xrootd):
    """The engine logs every client in before the step's clock: over davs:// that is
    the TLS connection, which the client's requests then reuse."""
    root, _, spec = area
    driver = spec.client(3, timeout=20)
    try:
        before = connection_ends(embedded_xrootd.http_port)
        driver.connect()
        opened = connection_ends(embedded_xrootd.http_port) - before
        assert len(opened) == 1
        assert driver.stat(root).is_dir
        # the same one: no other new connection, and this one still open
        now = connection_ends(embedded_xrootd.http_port)
        assert now - before == opened
    finally:
        driver.close()
