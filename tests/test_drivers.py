"""The driver registry, DriverSpec, login names and the memory driver (no server)."""

from __future__ import annotations

import pickle
import zlib

import pytest

from pytest_storagescale import Door
from pytest_storagescale.drivers import memory
from pytest_storagescale.drivers.base import Driver
from pytest_storagescale.drivers.grid import XRootDLogins
from pytest_storagescale.drivers.registry import (
    DRIVERS,
    driver_class,
    driver_names,
    driver_spec,
    known_schemes,
    register_driver,
)
from pytest_storagescale.errors import (
    EndpointError,
    StorageError,
    StorageNotFound,
    StorageScaleUsageError,
    StorageTimeout,
    UnsafePathError,
)


@pytest.fixture
def registry():
    """Undo the registrations a test makes."""
    with DRIVERS.kept():
        yield


@pytest.fixture
def store():
    yield
    memory.release_hangs()
    memory.clear_stores()


class ToyDriver(memory.MemoryDriver):
    """A registered-from-a-test driver speaking toy://."""

    name = "toy"
    schemes = ("toy",)


# -- registry -----------------------------------------------------------------------
def test_builtin_drivers_and_schemes():
    assert {"xrootd", "http", "gfal2", "local", "memory"} <= set(driver_names())
    assert {"root", "davs", "file", "memory", "srm", "gsiftp"} <= set(known_schemes())
    assert driver_spec("root://h:1094//data/t").name == "xrootd"
    assert driver_spec("root://h:1094//data/t", driver="gfal2").name == "gfal2"
    assert driver_spec("davs://h:2880/data/t").name == "http"
    assert driver_spec("davs://h:2880/data/t", driver="gfal2").name == "gfal2"
    assert driver_spec("file:///tmp/area").name == "local"
    assert driver_spec("memory://s/area").name == "memory"


def test_unknown_driver_names_the_known_ones():
    with pytest.raises(StorageScaleUsageError, match=r"unknown driver 'nope'\. Known drivers: "
                                                     r"xrootd, http, gfal2, local, memory"):
        driver_class("nope")


def test_lazy_driver_whose_import_fails_gives_the_install_hint(registry):
    register_driver("no_such_module_xyz:Driver", name="broken", schemes=("brk",),
                    install_hint="'pip install broken-client'")
    with pytest.raises(StorageScaleUsageError) as info:
        driver_spec("brk://host/area")
    message = str(info.value)
    assert message.startswith("the broken driver needs 'pip install broken-client'.")
    assert "No module named 'no_such_module_xyz'" in message


def test_a_class_registered_by_a_test_serves_its_scheme(registry, store):
    register_driver(ToyDriver)
    assert "toy" in driver_names() and "toy" in known_schemes()
    spec = driver_spec("toy://s/area", writable_root="/area")
    assert spec.driver_class is ToyDriver
    client = spec.client(0, timeout=5)
    client.put("/area/f", b"abc")
    assert client.stat("/area/f").size == 3
    register_driver(ToyDriver)  # the same class again (the registries' one rule): fine

    class OtherToy(ToyDriver):
        name = "toy"

    with pytest.raises(ValueError, match=r"driver 'toy' is already registered \(.*ToyDriver\)"):
        register_driver(OtherToy)
    register_driver(OtherToy, replace=True)
    assert driver_class("toy") is OtherToy


class ToyXRootD(memory.MemoryDriver):
    """A site's driver speaking XRootD under a scheme of its own."""

    name = "toyroot"
    schemes = ("toyroot",)
    protocol_family = "xrootd"

    @classmethod
    def parse_endpoint(cls, url: str):
        return Driver.parse_endpoint.__func__(cls, url)  # not the memory driver's own


@pytest.mark.parametrize(("url", "protocol", "create", "file_url"), [
    ("root://h:1094//a/area", "xrootd", "xrdfs root://h:1094 mkdir -p /a/area",
     "root://h:1094//a/f"),
    ("davs://h:8443/a/area", "http", "gfal-mkdir -p davs://h:8443/a/area",
     "davs://h:8443/a/f"),
    ("file:///a/area", "file", "mkdir -p /a/area", "file:///a/f"),
    ("memory://h/a/area", "", "create /a/area with the storage's own tools", "memory://h/a/f"),
    ("toyroot://h//a/area", "xrootd", "xrdfs toyroot://h mkdir -p /a/area",
     "toyroot://h//a/f"),
])
def test_the_protocol_rules_are_the_driver_classes(registry, url, protocol, create, file_url):
    """Which door speaks XRootD or HTTP, the area's create hint and XRootD's ``//path``
    are asked of the driver class, so a site's driver under its own scheme declares
    them (``protocol_family``) and the plugin and the suites follow."""
    register_driver(ToyXRootD)
    spec = driver_spec(url)
    cls, endpoint = spec.driver_class, spec.endpoint
    assert cls.protocol_of(endpoint.scheme) == protocol
    assert cls.is_xrootd(endpoint.scheme) == (protocol == "xrootd")
    assert cls.is_http(endpoint.scheme) == (protocol == "http")
    assert cls.create_command(endpoint) == create
    assert cls.url_of(endpoint, "/a/f") == file_url
    assert endpoint.display == cls.url_of(endpoint, "/a/area")
    door = Door("d", spec, "/a/area/run")  # what the suites ask
    assert (door.is_xrootd, door.is_http, door.url("/a/f")) == (
        protocol == "xrootd", protocol == "http", file_url)


def test_gfal2_speaks_each_schemes_own_protocol():
    gfal2 = driver_class("gfal2")
    assert [gfal2.protocol_of(s) for s in ("roots", "https", "file", "srm")] == [
        "xrootd", "http", "file", "srm"]
    assert gfal2.create_command(driver_spec("root://h//area", driver="gfal2").endpoint) == (
        "xrdfs root://h mkdir -p /area")


def test_a_scheme_served_by_another_driver_needs_replace(registry):
    class Other(ToyDriver):
        name = "other"
        schemes = ("root",)

    with pytest.raises(ValueError, match="root"):
        register_driver(Other)
    register_driver(Other, replace=True)
    assert driver_spec("root://h//data/t").name == "other"


def test_unknown_scheme_is_one_paragraph():
    with pytest.raises(StorageScaleUsageError) as info:
        driver_spec("s3://user:secret@bucket/area")
    message = str(info.value)
    assert "no driver serves s3://" in message and "root://" in message
    assert "secret" not in message


def test_forced_driver_that_cannot_speak_the_scheme_names_the_fix():
    with pytest.raises(StorageScaleUsageError) as info:
        driver_spec("davs://h:2880/data/t", driver="xrootd")
    assert str(info.value) == (
        "--storage-driver xrootd cannot speak davs://: the xrootd driver speaks root://, "
        "xroot://, roots://. To fix it, use --storage-driver auto (davs:// is served by the "
        "http driver) or give an endpoint URL with one of those schemes."
    )
    assert "\n" not in str(info.value)


def test_unknown_driver_option_names_the_valid_keys():
    with pytest.raises(StorageScaleUsageError) as info:
        driver_spec("root://h//data/t", options={"proxy": "/tmp/x509up", "ca_dir": "/ca"})
    assert str(info.value) == (
        "driver option 'proxy' not known to the xrootd driver. Valid options: ca_dir, "
        "x509_proxy, token, krb5ccname, security_protocol, krb5_config, flat_namespace, "
        "client_loop."
    )


def test_a_bad_endpoint_is_reported_by_driver_spec():
    with pytest.raises(EndpointError, match="no test-area path"):
        driver_spec("memory://store")


# -- DriverSpec ---------------------------------------------------------------------------
def test_spec_pickles_and_builds_the_same_clients(store):
    spec = driver_spec("memory://p/area", writable_root="/area", options={"latency": "0"})
    copy = pickle.loads(pickle.dumps(spec))
    assert copy == spec and hash(copy) == hash(spec)
    assert copy.options["latency"] == "0" and copy.endpoint.path == "/area"
    assert copy.client(3, timeout=5).client_id == "client-3"


def test_repr_hides_url_credentials_and_secret_options():
    spec = driver_spec("root://alice:hunter2@h:1094//data/t", writable_root="/data/t",
                       options={"token": "eyJhbGciOi.secret", "krb5ccname": "/tmp/krb5cc_1"})
    text = repr(spec)
    assert "hunter2" not in text and "alice" not in text and "eyJhbGciOi" not in text
    assert "token=***" in text and "krb5ccname='/tmp/krb5cc_1'" in text
    assert "root://h:1094//data/t" in text and str(spec) == text


def test_connections_are_named_by_role(store):
    spec = driver_spec("memory://r/area")
    assert spec.connect("coordinator", timeout=5).client_id == "coordinator"
    assert spec.connect("functional-other", timeout=5).client_id == "functional-other"
    with pytest.raises(ValueError, match="needs a role name"):
        spec.connect("", timeout=5)


# -- XRootD login names ---------------------------------------------------------------------
class Logins(XRootDLogins):
    """The XRootD naming rule, without the XRootD bindings."""


def test_xrootd_client_names_fit_the_login_and_are_unique():
    names = [Logins.client_name(index) for index in range(5000)]
    assert all(len(name) <= 8 for name in names)
    assert len(set(names)) == 5000
    assert Logins.client_name(42).endswith("00042") and Logins.client_name(42)[0] == "c"
    assert len(Logins.client_name(36**5 - 1)) == 8
    assert Logins.client_name(100_000) != Logins.client_name(0)


def test_forgetting_connections_changes_every_client_name():
    before = {Logins.client_name(index) for index in range(100)}
    Logins.forget_connections()
    after = {Logins.client_name(index) for index in range(100)}
    assert not before & after
    # the XRootD drivers share the process's XRootD client, and so one generation
    other = type("Other", (XRootDLogins,), {})
    assert other.client_name(7) == Logins.client_name(7)


def test_xrootd_role_names_fit_the_login():
    roles = ["admin", "version", "cleanup", "coordinator", "probe", "functional-other",
             "ssfunc", "functional-a-much-longer-name", "functional"]
    names = [Logins.role_name(role) for role in roles]
    assert names[:7] == ["ssadmin", "ssversn", "ssclean", "sscoord", "ssprobe", "other",
                         "ssfunc"]
    assert all(len(name) <= 8 for name in names) and len(set(names)) == len(names)
    assert not set(names) & {Logins.client_name(index) for index in range(100)}


# -- the memory driver ------------------------------------------------------------------------
def test_memory_driver_namespace_and_data(store, tmp_path):
    driver = driver_spec("memory://m/area", writable_root="/area").connect(
        "functional-test", timeout=5)
    data = bytes(range(256)) * 10
    assert driver.put("/area/d/f", data) == len(data)
    assert driver.ls("/area/d") == ["f"] and driver.stat("/area/d").is_dir
    assert driver.read("/area/d/f", 10, 5) == data[10:15]
    assert driver.readv("/area/d/f", [(0, 4), (100, 6)]) == 10
    assert driver.get("/area/d/f", str(tmp_path / "copy")) == len(data)
    assert (tmp_path / "copy").read_bytes() == data
    assert driver.checksum("/area/d/f") == f"{zlib.adler32(data):08x}"
    driver.rename("/area/d/f", "/area/d/g")
    with pytest.raises(StorageError, match="directory not empty"):
        driver.rmdir("/area/d")
    assert driver.remove_tree("/area/d") == 2
    with pytest.raises(StorageNotFound) as info:
        driver.stat("/area/d")
    assert (info.value.driver, info.value.endpoint) == ("memory", "memory://m")
    with pytest.raises(UnsafePathError):
        driver.put("/elsewhere", b"x")
    assert driver.version() == "memory"


def test_memory_stores_are_per_url_host(store):
    one = driver_spec("memory://one/area", writable_root="/area").connect("admin", timeout=5)
    two = driver_spec("memory://two/area", writable_root="/area").connect("admin", timeout=5)
    one.put("/area/f", b"x")
    with pytest.raises(StorageNotFound):
        two.stat("/area/f")


def test_memory_failures_hit_every_nth_request_of_a_load_client(store):
    spec = driver_spec("memory://f/area", writable_root="/area",
                       options={"fail_every": "3", "fault_operations": "stat"})
    admin = spec.connect("admin", timeout=5)
    admin.put("/area/f", b"x")
    client = spec.client(0, timeout=5)
    outcomes = []
    for _ in range(6):
        try:
            client.stat("/area/f")
            outcomes.append("ok")
        except StorageError as exc:
            outcomes.append(exc.error_class)
    assert outcomes == ["ok", "ok", "injected", "ok", "ok", "injected"]
    client.put("/area/g", b"y")  # not a faulty request
    for _ in range(6):
        admin.stat("/area/f")  # a service connection never fails


def test_memory_hang_blocks_until_released(store):
    import threading

    spec = driver_spec("memory://h/area", writable_root="/area",
                       options={"hang_after": "1", "fault_operations": "put"})
    client = spec.client(0, timeout=60)
    client.put("/area/a", b"x")
    errors = []

    def hang():
        try:
            client.put("/area/b", b"x")
        except StorageTimeout as exc:
            errors.append(exc)

    thread = threading.Thread(target=hang, daemon=True)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive()  # request number 1 blocks
    while not memory.release_hangs():  # until it is registered as hanging
        thread.join(0.01)
    thread.join(10)
    assert not thread.is_alive() and errors[0].error_class == "timeout"
    assert "released" in str(errors[0])


def test_memory_hang_ends_at_the_driver_timeout(store):
    client = driver_spec("memory://t/area", options={"hang_after": "0"}).client(0, timeout=0.05)
    with pytest.raises(StorageTimeout, match="no answer within 0.05 s"):
        client.stat("/area")


@pytest.mark.parametrize("options, message", [
    ({"latency": "fast"}, "memory driver option latency='fast': must be a number of seconds"),
    ({"fail_every": "-1"}, "memory driver option fail_every='-1': must be a whole number"),
    ({"fault_operations": "stat,copy"}, "unknown request copy. Valid: stat, ls"),
])
def test_memory_options_are_checked(options, message):
    with pytest.raises(StorageScaleUsageError, match=message):
        driver_spec("memory://o/area", options=options)


def test_every_driver_class_declares_ca_dir():
    for name in driver_names():
        try:
            cls = driver_class(name)
        except StorageScaleUsageError:
            continue  # a client library this machine lacks
        assert issubclass(cls, Driver) and "ca_dir" in cls.option_names


def test_the_driver_of_a_scheme_is_found_without_a_url():
    """The header asks which driver serves the endpoint's scheme before the embedded
    server runs: the registry answers from the scheme alone (no made-up URL)."""
    from pytest_storagescale.drivers.registry import scheme_driver
    from pytest_storagescale.errors import StorageScaleUsageError

    assert scheme_driver("root").name == "xrootd"
    assert scheme_driver("davs").name == "http"
    with pytest.raises(StorageScaleUsageError, match="no driver serves nosuch://"):
        scheme_driver("nosuch")
