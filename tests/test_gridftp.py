"""The embedded GridFTP door (GSI): started for real, used through the gfal2 driver
over gsiftp:// with the session's proxy, refusing a proxy it cannot map or none at all
with a message naming the credential, and suites/dcache run over it with a shrunk plan."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.endpoints import processes
from pytest_storagescale.endpoints.credentials import certificate_expiry
from pytest_storagescale.endpoints.family import embedded_class
from pytest_storagescale.endpoints.gridftp import EmbeddedGridFTP
from pytest_storagescale.errors import EndpointError, StorageNotFound, StoragePermissionDenied

pytestmark = [pytest.mark.slow_server, pytest.mark.integration]
REPO = Path(__file__).resolve().parent.parent


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


def test_missing_binary_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(processes, "SBIN_PATH", str(tmp_path))
    with pytest.raises(EndpointError, match="apt-get install globus-gridftp-server-progs"):
        EmbeddedGridFTP.check_installed()


#: runs of the gsiftp suite when gfal2 crashed the previous one
GFAL2_CRASH_RUNS = 3


def _gfal2_crashed(outcome) -> bool:
    """Whether the run died inside the gfal2 client library (a segfault or an abort
    with ``drivers/gfal2.py`` on the stack).

    In whole ``make test`` runs beside ``stress-ng --cpu 4``, gfal2's GridFTP plugin
    crashed the suite's pytest process in 3 of 3 runs (partial reads in
    ``pread_bytes``, an abort in a load step's ``ls``; docs/compatibility.md); on a
    quiet machine it never did. The gfal2 driver no longer asks for partial reads over
    gsiftp:// (the crash of 11 in 30 short runs), but an abort on Globus's callback
    thread was seen once more since. This test is about the suite's outcomes, so such
    a run goes again, at most :data:`GFAL2_CRASH_RUNS` times in all."""
    err = outcome.stderr.str()
    # an abort on a Globus callback thread ("Assertion ! GLOBUS_I_FTP_CLIENT_BAD_MAGIC")
    # has no gfal2 frame on the Python stacks faulthandler prints
    return ("Fatal Python error: Segmentation fault" in err
            or "Fatal Python error: Aborted" in err) and (
                "drivers/gfal2.py" in err or "GLOBUS_" in err)


def _only_data_connections_refused(results: Path) -> bool:
    """Whether the run's only failures were GridFTP data connections the server did
    not accept (``errno_ECOMM``, "globus_xio: Unable to connect" to its data port):
    beside ``stress-ng --cpu 4`` one such failure in 85-200 operations was seen in 2
    of 5 whole ``make test`` runs, never on a quiet machine. The suite measures and
    reports it as it should; this test is about the suite's outcomes, so such a run
    goes again (within :data:`GFAL2_CRASH_RUNS`)."""
    try:
        steps = json.loads(results.read_text())["steps"]
    except (OSError, ValueError, KeyError):
        return False
    failed = [step for step in steps if step["failed"]]
    return bool(failed) and all(set(step["errors"]) == {"errno_ECOMM"} for step in failed)


def test_dcache_suite_over_gsiftp(pytester, monkeypatch):
    """`pytest suites/dcache --storage-embedded gridftp`: the functional and conformance
    checks over gsiftp:// (vector reads not applicable, said so) and every scan."""
    monkeypatch.setenv("STORAGESCALE_LARGE_MB", "4")
    results = pytester.path / "results.json"
    args = (str(REPO / "suites" / "dcache"), "--storage-embedded=gridftp",
            "--storage-scale=0.05", "--storage-clients=1", f"--storage-results={results}",
            "-p", "no:cacheprovider", "-rs")
    for _ in range(GFAL2_CRASH_RUNS):
        results.unlink(missing_ok=True)  # each run's own results, never the last one's
        outcome = pytester.runpytest_subprocess(*args)
        if not (_gfal2_crashed(outcome) or _only_data_connections_refused(results)):
            break
    outcome.assert_outcomes(passed=27, skipped=4)
    outcome.stdout.fnmatch_lines([
        "storagescale: dcache gridftp-* at gsiftp://localhost:*/storagescale *",
        "*thresholds: *dcache/embedded-gridftp.toml (matched version gridftp-*",
        "*gsiftp door: not applicable: GridFTP has no vector read request*",
    ])
    document = json.loads(results.read_text())
    assert document["run"]["version"].startswith("gridftp-")
    steps = document["steps"]
    assert {s["op"] for s in steps} == {"ls", "copyout", "transactions", "mixed", "recovery"}
    for step in steps:  # every step measured something, and nothing failed or hung
        assert step["succeeded"] > 0, step["op"]
        assert step["failed"] == 0 and step["hung"] == 0, (step["op"], step["errors"])
    assert all(s["verdict"] in ("pass", "info") for s in steps)
    copy = next(s for s in steps if s["op"] == "copyout")
    assert copy["bytes"] == copy["succeeded"] * 500_000  # 10 MB x 0.05, to local disk
