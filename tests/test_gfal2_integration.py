"""gfal2 against the embedded xrootd's HTTPS/WebDAV (XrdHttp) and xroot ports."""

from __future__ import annotations

import zlib

import pytest

from pytest_storagescale.drivers.gfal2 import Gfal2Driver
from pytest_storagescale.drivers.registry import driver_name_for
from pytest_storagescale.endpoints.url import EndpointURL
from pytest_storagescale.endpoints.version import detect_version, version_from_server_header
from pytest_storagescale.errors import StorageNotFound, StorageUnreachable, UnsafePathError

pytestmark = pytest.mark.integration


@pytest.fixture(params=["davs", "root"])
def gfal(embedded_xrootd, request):
    name = request.node.originalname[:30]
    root = f"/storagescale/gfal-{request.param}-{name}"
    url = embedded_xrootd.url_for(request.param)
    driver = Gfal2Driver(EndpointURL.parse(url), client_id="ssgfal", timeout=20,
                         writable_root=root, options={"ca_dir": embedded_xrootd.ca_dir})
    driver.mkdir(root)
    yield root, driver
    driver.remove_tree(root)
    driver.close()


def test_copy_with_verified_checksum(gfal, tmp_path):
    root, driver = gfal
    data = bytes(range(256)) * 40_000
    driver.put(f"{root}/f.dat", data)
    assert driver.checksum(f"{root}/f.dat", "adler32") == f"{zlib.adler32(data):08x}"
    local = tmp_path / "out.dat"
    assert driver.copy_out(f"{root}/f.dat", str(local)) == len(data)
    assert local.read_bytes() == data


def test_namespace_operations(gfal):
    root, driver = gfal
    driver.mkdir(f"{root}/d")
    driver.put(f"{root}/d/a", b"abc")
    assert driver.ls(f"{root}/d") == ["a"]
    assert driver.stat(f"{root}/d/a").size == 3 and driver.stat(f"{root}/d").is_dir
    driver.rename(f"{root}/d/a", f"{root}/d/b")
    assert driver.read(f"{root}/d/b", 1, 2) == b"bc"
    driver.delete(f"{root}/d/b")
    with pytest.raises(StorageNotFound) as info:
        driver.stat(f"{root}/d/b")
    assert info.value.driver == "gfal2" and "GError code=2" in info.value.native_status
    with pytest.raises(UnsafePathError):
        driver.delete("/storagescale/other")


def test_wrong_ca_is_a_clear_tls_error(embedded_xrootd, tmp_path):
    other_ca = tmp_path / "empty-ca"
    other_ca.mkdir()
    driver = Gfal2Driver(EndpointURL.parse(embedded_xrootd.https_url), timeout=10,
                         writable_root="/storagescale/x", options={"ca_dir": str(other_ca)})
    try:
        with pytest.raises(StorageUnreachable) as info:
            driver.stat("/storagescale")
    finally:
        driver.close()
        # later drivers in this process set their own CA again
    assert info.value.error_class == "tls"
    message = str(info.value)
    assert "TLS verification failed" in message and str(other_ca) in message
    assert "X509_CERT_DIR" in message


def test_version_from_server_header(embedded_xrootd):
    assert detect_version(EndpointURL.parse(embedded_xrootd.https_url),
                          ca_dir=embedded_xrootd.ca_dir) == embedded_xrootd.version
    assert version_from_server_header("dCache/9.2.4") == "9.2.4"
    assert version_from_server_header("dCache/1.9.5-26") == "1.9.5-26"
    assert version_from_server_header("XrootD/v5.5.3") == "5.5.3"
    assert version_from_server_header("nginx/1.2") is None


def test_driver_can_be_forced_per_scheme():
    assert driver_name_for("root") == "xrootd"
    assert driver_name_for("root", "gfal2") == "gfal2"
    assert driver_name_for("davs") == "gfal2"
    assert driver_name_for("srm") == driver_name_for("gsiftp") == "gfal2"
    from pytest_storagescale.errors import StorageScaleUsageError

    with pytest.raises(StorageScaleUsageError, match="cannot speak davs://"):
        driver_name_for("davs", "xrootd")
