"""gfal2 against the embedded xrootd's HTTPS/WebDAV (XrdHttp) and xroot ports."""

from __future__ import annotations

import resource
import subprocess
import sys
import zlib

import pytest
from sockets import connection_ends

from pytest_storagescale.drivers.gfal2 import Gfal2Driver, new_context
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.version import detect_version, version_from_server_header
from pytest_storagescale.errors import (
    StorageError,
    StorageNotFound,
    StorageScaleUsageError,
    StorageUnreachable,
    UnsafePathError,
)

pytestmark = pytest.mark.integration


@pytest.fixture(params=["davs", "root"])
def gfal(embedded_xrootd, request):
    name = request.node.originalname[:30]
    root = f"/storagescale/gfal-{request.param}-{name}"
    url = embedded_xrootd.url_for(request.param)
    spec = driver_spec(url, driver="gfal2", writable_root=root,
                       options={"ca_dir": embedded_xrootd.ca_dir})
    driver = spec.connect("functional-gfal", timeout=20)
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
    driver = driver_spec(embedded_xrootd.https_url, driver="gfal2", writable_root="/storagescale/x",
                         options={"ca_dir": str(other_ca)}).connect("functional-ca", timeout=10)
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
    spec = driver_spec(embedded_xrootd.https_url, driver="gfal2",
                       options={"ca_dir": embedded_xrootd.ca_dir})
    assert spec.name == "gfal2"
    assert detect_version(spec) == embedded_xrootd.version
    assert version_from_server_header("dCache/9.2.4") == "9.2.4"
    assert version_from_server_header("dCache/1.9.5-26") == "1.9.5-26"
    assert version_from_server_header("XrootD/v5.5.3") == "5.5.3"
    assert version_from_server_header("nginx/1.2") is None


def test_driver_can_be_forced_per_scheme():
    assert driver_spec("root://h//data/t").name == "xrootd"
    assert driver_spec("root://h//data/t", driver="gfal2").name == "gfal2"
    assert driver_spec("davs://h/data/t").name == "http"
    assert driver_spec("davs://h/data/t", driver="gfal2").name == "gfal2"
    assert driver_spec("srm://h/data/t").name == driver_spec("gsiftp://h/data/t").name == "gfal2"
    with pytest.raises(StorageScaleUsageError, match="cannot speak davs://"):
        driver_spec("davs://h/data/t", driver="xrootd")


_VERSION_OVER_ROOT = """
import sys
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.version import detect_version
from pytest_storagescale.errors import StorageError
try:
    detect_version(driver_spec(sys.argv[1], driver="gfal2"))
except StorageError as exc:
    print(exc)
print("XRootD bindings imported:", "XRootD" in sys.modules)
"""


def test_gfal2_on_root_asks_no_version_and_never_imports_the_xrootd_bindings(embedded_xrootd):
    """--storage-driver gfal2 on root:// goes through gfal2 only; gfal2 cannot ask an
    xroot server for its version, so the message says how to give it."""
    done = subprocess.run([sys.executable, "-c", _VERSION_OVER_ROOT, embedded_xrootd.url],
                          capture_output=True, text=True, timeout=60, check=True)
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "XRootD bindings imported: False"
    assert "gfal2 cannot ask a root:// server for its version" in lines[0]
    assert "--storage-version VERSION skips the detection" in lines[0]
    assert "--storage-driver xrootd" in lines[0]


def test_gfal2_clients_on_root_have_their_own_connections(embedded_xrootd):
    """Each gfal2 client logs in under its own name on root://, so C clients are C
    connections (one name would share one connection among every context)."""
    Gfal2Driver.forget_connections()  # names no earlier test used
    spec = driver_spec(embedded_xrootd.url, driver="gfal2")
    before = connection_ends(embedded_xrootd.port)
    clients = [spec.client(index, timeout=20) for index in range(5)]
    try:
        for client in clients:
            assert client.stat("/storagescale").is_dir
        assert len(connection_ends(embedded_xrootd.port) - before) >= 5
    finally:
        for client in clients:
            client.close()


def test_gfal2_on_root_version_error_is_a_storage_error(embedded_xrootd):
    with pytest.raises(StorageError) as info:
        driver_spec(embedded_xrootd.url, driver="gfal2").connect("version", timeout=5).version()
    assert info.value.error_class == "version" and info.value.driver == "gfal2"


_LATE_GFAL2 = """
import os, resource, sys
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan

area = sys.argv[1]
# a first step, of any driver: as a suite's first root:// step would be
run_step(StepPlan(get_operation("stat"), 2, 0.2, 0.0, 5.0,
                  driver_spec("memory://early/area", writable_root="/area"), "/area/s"))
# what a step of 1,000 XRootD clients leaves: descriptors above 1024
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
assert max(held) > 1024, max(held)
driver = driver_spec("file://" + area, driver="gfal2", writable_root=area).connect("late", timeout=10)
print("stat", driver.stat(area).size >= 0)
"""


def _needs_globus_and_descriptors() -> None:
    if not any("gridftp" in name for name in new_context().get_plugin_names()):
        pytest.skip("gfal2's gridftp plugin (Globus), whose start this is about, is not "
                    "installed")
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1200:
        pytest.skip("this machine's hard limit on open files is below 1,200")


def test_gfal2_starts_after_a_process_holds_a_thousand_descriptors(tmp_path):
    """gfal2's Globus plugins abort the process (SIGABRT, "bit out of range 0 -
    FD_SETSIZE") when first started in a process holding descriptors above 1024. The
    first step of a process starts them, so a gfal2 step after a step of 1,000 XRootD
    clients in the same pytest process works."""
    _needs_globus_and_descriptors()
    done = subprocess.run([sys.executable, "-c", _LATE_GFAL2, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "stat True" in done.stdout


_GRIDFTP_NEAR_1024 = """
import os, resource
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import StorageError

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
spec = driver_spec("gsiftp://127.0.0.1:1/grid/area", writable_root="/grid/area")
driver = spec.connect("made-early", timeout=5)  # a GridFTP client opens no socket yet
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1000)]
for attempt in (lambda: spec.connect("made-late", timeout=5),
                lambda: driver.stat("/grid/area/file")):
    try:
        attempt()
    except StorageError as exc:
        print("refused:", exc.error_class, exc)
"""


def test_a_gridftp_client_near_descriptor_1024_is_refused_not_aborted():
    """Globus waits with select(): a GridFTP socket numbered 1024 or above would abort
    the process, so a gsiftp:// client made there, or a request of one made before,
    is refused with the fix instead."""
    _needs_globus_and_descriptors()
    done = subprocess.run([sys.executable, "-c", _GRIDFTP_NEAR_1024],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    login, stat = done.stdout.splitlines()
    assert login.startswith("refused: client_limit gfal2 login "), login
    # a client made before: its first request opens the sockets, and is refused
    assert stat.startswith("refused: client_limit gfal2 stat "), stat
    assert "/grid/area/file" in stat
    for refusal in (login, stat):
        assert "cannot make another request in this process" in refusal
        assert "next descriptor would be number 10" in refusal  # 1000 held, a few more
        assert "in a pytest run of their own" in refusal


def test_a_gfal2_context_leaves_the_signal_mask_as_it_was():
    """The first gfal2 context of a process blocks every asynchronous signal in the
    calling thread (its Globus plugins), and every process spawned from that thread
    inherits the mask and ignores SIGTERM. Importing the driver (which makes the first
    context) leaves the mask as it was; gfal2's own call, in a fresh process, does not."""
    program = ("import signal, sys\n"
               "{}\n"
               "print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ())))\n")
    masks = {}
    for name, line in (("driver", "import pytest_storagescale.drivers.gfal2"),
                       ("gfal2", "import gfal2; gfal2.creat_context()")):
        done = subprocess.run([sys.executable, "-c", program.format(line)],
                              capture_output=True, text=True, timeout=120, check=True)
        masks[name] = done.stdout.strip()
    assert masks["driver"] == "[]", masks
    assert "Signals.SIGTERM" in masks["gfal2"], masks  # else new_context() can go
