"""Shared fixtures of the plugin's own tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# pytester gives each inner run a HOME of its own: the xrootd driver's compiled client
# loop is found in (and built into) the real cache, not once per inner run
os.environ.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))

REPO = Path(__file__).resolve().parent.parent

# cryptography's Rust bindings (PyO3) load once per process: imported here, before any
# in-process pytester run, whose sys.modules snapshot would drop them, and a test of
# the same process starting a server after it failed with "PyO3 modules may only be
# initialized once per interpreter process"
try:
    import cryptography.x509  # noqa: F401
except ImportError:  # the servers' tests then skip, naming the extra
    pass

# numpy (under scipy.stats, the gate's statistics: gate.py) refuses to load twice in a
# process ("cannot load module more than once per process"): imported here, before any
# in-process pytester run, whose sys.modules snapshot would drop it, so that the second
# run compared with a baseline does not fail
import scipy.stats  # noqa: E402,F401

#: what client libraries read credentials from: a driver sets some of them for the
#: whole process (one identity per process), so each test gets them back as they were
CREDENTIAL_VARIABLES = ("X509_CERT_DIR", "X509_USER_PROXY", "X509_USER_CERT", "X509_USER_KEY",
                        "BEARER_TOKEN", "BEARER_TOKEN_FILE", "KRB5CCNAME", "KRB5_CONFIG",
                        "XrdSecPROTOCOL", "XrdSecGSISRVNAMES")


def _restored_credentials(patch: pytest.MonkeyPatch) -> None:
    """Have ``patch`` put the credential variables back as they are now."""
    import os

    for name in CREDENTIAL_VARIABLES:
        # setenv records the value to go back to (absent included), delenv keeps it absent
        was = os.environ.get(name)
        patch.setenv(name, was or "")
        if was is None:
            patch.delenv(name)


@pytest.fixture(autouse=True, scope="module")
def _credential_environment_restored_per_module():
    """A module's servers and drivers cannot hand their credentials to the next module."""
    with pytest.MonkeyPatch.context() as patch:
        _restored_credentials(patch)
        yield


@pytest.fixture(autouse=True)
def _credential_environment_restored(monkeypatch):
    """A test's drivers cannot hand their credentials to the next test's."""
    _restored_credentials(monkeypatch)
    yield


@pytest.fixture
def thresholds_dir(tmp_path: Path):
    """Write ``<system>/<name>.toml`` files under a fresh thresholds folder."""
    root = tmp_path / "thresholds"

    def write(text: str, *, system: str = "xrootd", name: str = "t.toml") -> Path:
        folder = root / system
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_text(text)
        return path

    write.root = root  # type: ignore[attr-defined]
    return write


#: fixtures that start a server: a test that uses one is an integration test, marked or
#: not, so that make check (-m "not integration and not slow_server") leaves it out
SERVER_FIXTURES = frozenset({"embedded_xrootd", "xrootd_area"})


#: the xdist group of every test that uses the session's dCache (``embedded_dcache``):
#: with ``--dist loadgroup`` (make test) they all run on one worker, so the run starts
#: that dCache once, not once per worker
DCACHE_GROUP = "embedded_dcache"


@pytest.hookimpl(tryfirst=True)  # before -m deselects, and before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if SERVER_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.integration)
        if "pytester" in fixtures:  # a pytest session of its own: seconds, not milliseconds
            item.add_marker(pytest.mark.plugin_session)
        if "embedded_dcache" in fixtures:
            item.add_marker(pytest.mark.slow_server)
            item.add_marker(pytest.mark.xdist_group(DCACHE_GROUP))
        _group_by_module_fixture(item)
    _long_modules_first(items)


def _group_by_module_fixture(item: pytest.Item) -> None:
    """A test using a module- or class-scoped fixture of its own module (a server, a
    wheel, a cluster started once for the module's tests) joins the xdist group of that
    module, unless it is in a group already. Under ``--dist loadgroup`` an ungrouped
    test is a unit of its own and consecutive ones go to whichever worker asks first,
    so the module's tests were split over both workers and each worker set the fixture
    up (a second lean dCache for test_dcap_load_door.py, each login's servers of
    test_logins.py twice); grouped, the module's tests run on one worker, on one
    set-up."""
    if item.get_closest_marker("xdist_group") is not None:
        return
    module = item.getparent(pytest.Module)
    info = getattr(item, "_fixtureinfo", None)
    if module is None or info is None:
        return
    for name in getattr(item, "fixturenames", ()):
        definitions = info.name2fixturedefs.get(name)
        if not definitions:
            continue
        used = definitions[-1]  # the definition in effect for this test
        if used.scope in ("module", "class") and used.baseid.startswith(module.nodeid):
            item.add_marker(pytest.mark.xdist_group(f"module-{module.path.name}"))
            return


#: a test that runs a minute or more on the reference machine (a whole suite against a
#: real server, dCache starts of its own): its module is collected first
LONG = "long_running"


def _long_modules_first(items: list[pytest.Item]) -> None:
    """The modules holding a ``long_running`` test first, each in its own order (a
    module's fixtures stay together), then the others. Under ``-n 2 --dist loadgroup``
    the groups go first (xdist hands out the largest unit first), then the single tests
    in this order: the long ones start while the short ones are left to fill the end.
    In collection order, the suite runs of test_xrootd_integration.py (96 s) and
    test_reports.py (83 s) came near the end of the run and could leave one worker idle
    for their length while the other finished them."""
    long_modules = {item.path for item in items if item.get_closest_marker(LONG)}
    if long_modules:
        items.sort(key=lambda item: item.path not in long_modules)  # stable


@pytest.hookimpl(tryfirst=True)  # before xdist's worker sends the collected ids
def pytest_collection_finish(session: pytest.Session) -> None:
    """``--dist loadgroup`` under pytest 9: xdist 3.8 marks a test's group by appending
    ``@<group>`` to ``item._nodeid``, which pytest 9 no longer reads (a node's id is
    ``item._id``), so every group was scattered over the workers (measured: the two
    tests of ``embedded_dcache`` ran on both workers, two dCache starts). The suffix is
    put where pytest 9 reads it; with a pytest whose id xdist's suffix reaches there is
    nothing to do."""
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist workers
        return
    for item in session.items:
        groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                         for mark in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = type(item._id).parse(f"{item.nodeid}@{'_'.join(groups)}")


@pytest.fixture(scope="session")
def embedded_xrootd():
    """A real xrootd on loopback for the integration tests."""
    if shutil.which("xrootd") is None and not Path("/usr/bin/xrootd").exists():
        pytest.fail("xrootd is not installed: run 'make setup' (the tests need a real server)")
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    with EmbeddedXRootD() as server:
        yield server


@pytest.fixture(autouse=True)
def _embedded_xrootd_alive(request):
    """A test of the session's shared xrootd starts only while it runs: if it died, the
    test fails with its death note (which daemon, how, its last log lines) instead of a
    'connection refused' that hides why every later test of the worker fails too."""
    if "embedded_xrootd" not in request.fixturenames:
        return
    note = request.getfixturevalue("embedded_xrootd").exit_note()
    if note:
        pytest.fail(f"the tests' shared embedded xrootd is gone: {note}", pytrace=False)


@pytest.fixture
def xrootd_area(embedded_xrootd, request):
    """A per-test directory on the embedded xrootd, and a driver allowed to write there."""
    from pytest_storagescale.drivers.registry import driver_spec

    root = f"/storagescale/{request.node.name[:40]}"
    driver = driver_spec(embedded_xrootd.url, writable_root=root).connect(
        "functional-tests", timeout=10)
    driver.mkdir(root)
    yield root, driver
    driver.remove_tree(root)


@pytest.fixture(scope="session")
def dcache_release() -> str:
    """The dCache release the tests that start one use: $STORAGESCALE_DCACHE_VERSION (a
    release of the distribution cache or a tarball's path), else the cache's newest; a
    failure naming what is missing when there is none (make setup fills the cache)."""
    from pytest_storagescale.servers.dcache import (
        EmbeddedDCache,
        cached_releases,
        no_distribution_text,
    )

    requested = os.environ.get("STORAGESCALE_DCACHE_VERSION", "")
    if requested:
        return EmbeddedDCache.check_version(requested)
    releases = cached_releases()
    if not releases:
        pytest.fail(no_distribution_text() + " (run 'make setup')")
    return list(releases)[-1]


@pytest.fixture(scope="session")
def embedded_dcache(dcache_release):
    """The session's one real dCache (``dcache_release``; the unix login, plus the GSI
    xrootd door, so every login is there) for every test that checks its doors: a
    dCache takes a minute to come up here. A test that asks for it is put in the xdist
    group ``embedded_dcache`` (and marked ``slow_server``), so under ``--dist loadgroup``
    one worker runs them all on one start. It is stopped after the last test that uses
    it (``pytest_runtest_teardown`` below), else at the session's end; the stop must
    leave no JVM, no PostgreSQL process and no directory (an error at teardown
    otherwise). It has a tape behind its pools (``TAPE``: tests/test_dcache_tape.py)
    and the dcap and GridFTP doors, so that no test of them starts a dCache of its own."""
    from dcache_checks import stop_leaves_no_jvm_and_no_postgres

    from pytest_storagescale.servers.dcache import EmbeddedDCache

    server = EmbeddedDCache(login="unix", gsi_xrootd=True, tape=TAPE,
                            extra_doors=("dcap", "gsiftp"))
    server.requested_version = dcache_release
    server.start()
    _SHARED_DCACHE.append(server)
    library = str(server.directory / "tape") if server.directory else ""
    try:
        yield server
    finally:
        _SHARED_DCACHE.remove(server)
        if server.process is None:  # stopped already (and checked then)
            server.stop()
        else:
            stop_leaves_no_jvm_and_no_postgres(server)
        # nor a tape request of its library (the HSM script dCache's pools ran)
        assert library and not _running_with(library)


def _running_with(text: str) -> list[int]:
    """The processes whose command line names ``text``."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(text in part for part in process.info["cmdline"] or ()):
            found.append(process.pid)
    return found


def _tape_library():
    from pytest_storagescale.servers.dcache_tape import TapeLibrary

    return TapeLibrary(drives=2, mount_s=1.0, per_file_s=0.1, flush_after_s=1)


#: the shared dCache's tape: two drives, a second to mount, a tenth per file, flushed a
#: second after the write
TAPE = _tape_library()


#: the session's dCache while it runs (``embedded_dcache``)
_SHARED_DCACHE: list = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the session's dCache after the last test that uses it, not at the session's
    end: under ``--dist loadgroup`` its group runs first (xdist runs the largest work
    unit first), and the idle JVM and PostgreSQL held ~0.9 GB for the rest of the run.
    The last one is known without xdist (the session's items) and under loadgroup (the
    group reaches its worker as one unit, so the next test is not one of it); under
    another ``--dist`` it stays until the session's end."""
    uses = "embedded_dcache"
    if not _SHARED_DCACHE or uses not in getattr(item, "fixturenames", ()):
        return
    if nextitem is not None and uses in getattr(nextitem, "fixturenames", ()):
        return
    if hasattr(item.config, "workerinput"):
        if not getattr(item.config.option, "loadgroup", False):
            return
    else:
        later = item.session.items[item.session.items.index(item) + 1:]
        if any(uses in getattr(other, "fixturenames", ()) for other in later):
            return
    from dcache_checks import stop_leaves_no_jvm_and_no_postgres

    stop_leaves_no_jvm_and_no_postgres(_SHARED_DCACHE[0])
