"""The embedded GridFTP door's own checks, run by ``tests/test_gridftp.py`` in a pytest
process of their own: they use gfal2's gridftp plugin in the process (the door's
readiness probe too), and that plugin now and then aborts the whole process on a
Globus callback thread (docs/compatibility.md). In an xdist worker that took the
worker and failed the run; in a process of its own the crash is seen and the checks
run again."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from pytest_storagescale.drivers.credentials import certificate_expiry
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import StorageNotFound, StoragePermissionDenied
from pytest_storagescale.servers.family import embedded_class
from pytest_storagescale.servers.gridftp import EmbeddedGridFTP


@pytest.fixture(scope="module")
def door():
    with EmbeddedGridFTP() as server:
        yield server


@pytest.fixture
def client(door):
    spec = driver_spec(door.url, options=door.driver_options(), writable_root=door.area)
    driver = spec.connect("gridftp-test", timeout=60)
    yield driver
    driver.close()


def test_registered_and_described(door):
    assert embedded_class("gridftp") is EmbeddedGridFTP
    assert door.version.startswith("gridftp-") and door.url.startswith("gsiftp://localhost:")
    assert door.url.endswith(f"{door.directory}/data/storagescale")  # absolute paths
    assert driver_spec(door.url).name == "gfal2"
    options = door.driver_options()
    assert set(options) == {"ca_dir", "x509_proxy"}
    # an RFC 3820 proxy (proxy certificate, its key, the user certificate), valid now
    assert Path(options["x509_proxy"]).read_text().count("BEGIN CERTIFICATE") == 2
    assert certificate_expiry(options["x509_proxy"]) > dt.datetime.now(dt.UTC)
    assert door.account in door.describe() and "GSI" in door.describe()
    assert door.rss_bytes() > 1_000_000


def test_namespace_and_data_through_gfal2(client, door, tmp_path):
    folder = f"{door.area}/ops"
    data = os.urandom(300_001)
    assert client.put(f"{folder}/a.dat", data) == len(data)  # adler32 checked both ends
    info = client.stat(f"{folder}/a.dat")
    assert (info.size, info.is_dir) == (len(data), False)
    assert client.stat(folder).is_dir
    assert client.ls(folder) == ["a.dat"]
    assert client.checksum(f"{folder}/a.dat", "adler32") == f"{zlib.adler32(data):08x}"
    local = tmp_path / "copy"
    assert client.get(f"{folder}/a.dat", str(local)) == len(data)
    assert local.read_bytes() == data
    assert client.read(f"{folder}/a.dat", 1000, 16) == data[1000:1016]
    client.rename(f"{folder}/a.dat", f"{folder}/b.dat")
    assert client.ls(folder) == ["b.dat"]
    client.delete(f"{folder}/b.dat")
    with pytest.raises(StorageNotFound):
        client.stat(f"{folder}/b.dat")
    client.rmdir(folder)
    assert "ops" not in client.ls(door.area)
    # the files belong to the account the DN is mapped to
    assert Path(door.area).stat().st_uid == Path(door.area).parent.stat().st_uid


def test_an_unmapped_proxy_is_refused_naming_it(door):
    """A proxy of a certificate the grid-mapfile does not map: the refusal names the
    credential and how to renew it."""
    directory = Path(door.directory)
    stranger = door.authority.issue_user(directory / "client" / "stranger.pem",
                                         directory / "client" / "stranger.key",
                                         common_name="stranger")
    proxy = door.authority.make_proxy(stranger, directory / "client" / "stranger-proxy")
    spec = driver_spec(door.url, options={"ca_dir": door.ca_dir, "x509_proxy": str(proxy)})
    driver = spec.connect("gridftp-stranger", timeout=60)
    try:
        with pytest.raises(StoragePermissionDenied) as refused:
            driver.stat(door.area)
    finally:
        driver.close()
    message = str(refused.value)
    assert refused.value.error_class == "auth"
    assert "login refused" in message and f"x509_proxy {proxy}" in message
    assert "Could not map /O=pytest-storagescale/CN=stranger" in message


_NO_PROXY = """
import sys
from pytest_storagescale.drivers.registry import driver_spec
driver = driver_spec(sys.argv[1], options={"ca_dir": sys.argv[2]}).connect("n", timeout=60)
try:
    driver.stat(sys.argv[3])
except Exception as exc:
    print(type(exc).__name__, exc.error_class, exc)
"""


def test_no_proxy_at_all_is_refused_naming_the_option(door, tmp_path):
    """In a process of its own (the proxy is the process's environment, one identity
    per process) with no proxy anywhere."""
    env = {key: value for key, value in os.environ.items() if key != "X509_USER_PROXY"}
    env["HOME"] = str(tmp_path)  # no ~/.globus credentials either
    done = subprocess.run([sys.executable, "-c", _NO_PROXY, door.url, door.ca_dir, door.area],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.startswith("StoragePermissionDenied auth"), done.stdout + done.stderr
    assert "no credential was given (driver options x509_proxy" in done.stdout
