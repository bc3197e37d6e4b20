"""suites/dcache's embedded endpoint and what does not apply to a door.

- Without ``--storage-endpoint`` the suite runs against the embedded dCache
  (``dcache``: a real release, its WebDAV, xrootd and SRM doors) when a distribution
  is available (the distribution cache, or ``--storage-embedded-version PATH``); else
  against the embedded WebDAV door that is not XRootD (Apache ``mod_dav``, X.509
  client certificates: ``webdav``), like a dCache WebDAV door, and the header says
  why. ``--storage-embedded gridftp`` runs it over ``gsiftp://`` (seed 004's GridFTP
  doors, through gfal2), ``--storage-embedded xrootd`` against XrdHttp and
  ``root://``.
- The functional checks of ``test_dcache_functional.py`` honour the thresholds file's
  ``[known_issues]`` as the conformance checks do (strict expected failures: Apache
  ``mod_dav`` offers no checksum, see ``thresholds/dcache/embedded-apache.toml``).
- The bad-login check of ``test_dcache_behaviour.py`` runs last (against a remote
  door its wrong passwords may get this host blocked for a while: dCache 11.2's
  request limiter).
- Vector-read checks are skipped, with the reason, on doors whose protocol has no
  vector read (GridFTP): gfal2 would send one partial read per chunk, which the
  partial-read checks already test.
"""

from __future__ import annotations

import os

import pytest

from pytest_storagescale import embedded_class, storage_view

from ..conformance.checks import ConformanceChecks, KnownIssues, VectorReadChecks
from . import seed_clients, streaming, tape

#: door scheme -> why a vector read does not apply to it
NO_VECTOR_READ = {
    "gsiftp": "GridFTP has no vector read request: gfal2 would send one partial read "
              "(ERET) per chunk, which test_partial_read already checks",
}


#: door scheme -> why a rename does not apply to it (the conformance check is skipped)
NO_RENAME = {
    "dcap": "the dcap protocol has no rename (gfal2's dcap plug-in answers "
            "EPROTONOSUPPORT); the other doors' rename checks run",
}


#: door scheme -> why a directory listing does not apply to it (its load steps that
#: list are skipped, saying so; the conformance checks list through the other doors)
NO_LISTING = {
    "dcap": "dcap's directory listing (libdcap's dc_opendir) listens for a call back on "
            "every interface and hangs on a process's second listing: the gfal2 driver "
            "does not send it (docs/servers.md, the dcap door)",
}
#: the load tests whose steps list a directory (their sections' operation is ``ls``)
LISTING_STEPS = ("test_namespace_scan", "test_namespace_open_loop",
                 "test_recovery_after_overload")


def pytest_storagescale_embedded(config: pytest.Config) -> str:
    """A real dCache when a distribution is available, else a WebDAV door with client
    certificates, as dCache's (``--storage-embedded`` chooses another)."""
    return "dcache" if _dcache_available(config) else "webdav"


def pytest_storagescale_operations() -> list:
    """The tape steps' operations, ``flush``, ``stage``, ``tape_write`` (``tape.py``), and the
    streaming steps' (``streaming.py``)."""
    return [*tape.OPERATIONS, *streaming.OPERATIONS]


def pytest_storagescale_metrics() -> dict[str, str]:
    """The streaming steps' per-client rates and their spread (``streaming.py``), the
    flushes beside the central-flushing step's writes (``tape.py``)."""
    return {**streaming.METRICS, **tape.METRICS}


def _dcache_available(config: pytest.Config) -> bool:
    """A dCache release in the distribution cache, or a tarball given by
    ``--storage-embedded-version``."""
    given = (config.getoption("storage_embedded_version", None)
             or os.environ.get("STORAGESCALE_EMBEDDED_VERSION")
             or config.getini("storage_embedded_version"))
    return bool(given or embedded_class("dcache").available_versions())


#: what the results and the summary say when the suite met no dCache
STAND_IN = ("suites/dcache ran against the embedded Apache WebDAV door (mod_dav), not a "
            "dCache: no dCache distribution in the cache; its verdict says nothing about "
            "dCache. Fill the cache with scripts/dcache-dist.sh (or make servers), or give "
            "--storage-embedded dcache --storage-embedded-version PATH, or "
            "--storage-endpoint of your door")


def _on_apache(config: pytest.Config) -> bool:
    view = storage_view(config)
    settings = view.settings if view is not None else None
    return not (settings is None or settings.endpoint is not None
                or settings.embedded != "webdav"
                or settings.source("embedded") != "the suite's conftest")


def pytest_storagescale_stand_in(config: pytest.Config) -> str | None:
    """The run says, in its results and summary, that Apache stood in for dCache."""
    return STAND_IN if _on_apache(config) else None


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say why the suite's own server is the Apache door, not a dCache; say that the
    tape steps are left out on an embedded server without a tape."""
    other = _no_tape_server(config)
    lines = [f"storagescale: suites/dcache's tape steps (test_tape.py) deselected: the "
             f"embedded {other} has no tape (--storage-embedded dcache has)"] if other else []
    view = storage_view(config)
    if view is not None and not seed_clients.seed_doors(view.settings.load_doors or ()):
        lines.append(seed_clients.NO_SEED_DOOR)
    if not _on_apache(config):
        return lines
    return lines + [
        "storagescale: suites/dcache runs against the Apache WebDAV door: no dCache "
        "distribution (scripts/dcache-dist.sh fills the cache; --storage-embedded "
        "dcache --storage-embedded-version PATH gives a tarball)"]


#: checks that make a door block this host for a while (dCache 11.2's WebDAV limiter
#: after bad logins): run last in their process (test_dcache_behaviour.py)
RUN_LAST = ("test_bad_logins_do_not_block_a_correct_client",)


def _no_tape_server(config: pytest.Config) -> str | None:
    """The embedded server that has no tape (another kind than dcache), else None."""
    view = storage_view(config)
    settings = view.settings if view is not None else None
    if settings is None or settings.endpoint is not None or not settings.embedded:
        return None
    return None if settings.embedded == "dcache" else settings.embedded


def _deselect_tape(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tape steps (``test_tape.py``) need the embedded dCache's tape: on another
    embedded server they are deselected, and the header says so (against a remote
    endpoint they run and skip, saying why)."""
    if _no_tape_server(config) is None:
        return
    tape_items = [item for item in items if item.nodeid.split("::")[0].endswith("test_tape.py")]
    if tape_items:
        config.hook.pytest_deselected(items=tape_items)
        items[:] = [item for item in items if item not in tape_items]


def _deselect_seed_clients(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The checks through the seeds' own clients (``test_seed_clients.py``) run on the
    load doors ``DOOR+dccp`` and ``DOOR+globus-url-copy`` only: deselected on the others
    (with no such load door the header says so)."""
    other = [item for item in items
             if item.nodeid.split("::")[0].endswith(seed_clients.MODULE)
             and seed_clients.seed_tool(_load_door(item)) is None]
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = [item for item in items if item not in other]


def _load_door(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("storage_load_door") if callspec is not None else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the vector-read checks on doors without a vector read and the rename check
    on doors without a rename (dcap), saying why; move the checks that may get this
    host blocked to the end."""
    items.sort(key=lambda item: getattr(item, "originalname", "") in RUN_LAST)
    _deselect_tape(config, items)
    _deselect_seed_clients(config, items)
    for item in items:
        _skip_listing(config, item)
        cls = getattr(item, "cls", None)
        callspec = getattr(item, "callspec", None)
        if cls is None or callspec is None or not issubclass(cls, ConformanceChecks):
            continue
        door = callspec.params.get("door_name")
        scheme = _door_scheme(config, door)
        reason = None
        if item.originalname == "test_rename":
            reason = NO_RENAME.get(scheme.removeprefix("gsi"))
        elif issubclass(cls, VectorReadChecks) and item.originalname.startswith("test_readv_"):
            reason = NO_VECTOR_READ.get(scheme)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"{door} door: not applicable: {reason}"))


def _skip_listing(config: pytest.Config, item: pytest.Item) -> None:
    """A load test whose steps list through a door without a usable listing
    (:data:`NO_LISTING`) is skipped, saying why."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or getattr(item, "originalname", "") not in LISTING_STEPS:
        return
    door = callspec.params.get("storage_load_door")
    scheme = _door_scheme(config, door) if door else ""
    reason = NO_LISTING.get(scheme) or NO_LISTING.get(scheme.removeprefix("gsi"))
    if reason:
        item.add_marker(pytest.mark.skip(reason=f"{door} door: not applicable: {reason}"))


def _door_scheme(config: pytest.Config, door: str | None) -> str:
    """The scheme of a door: the embedded server's doors are named by their scheme, a
    remote one's ``--storage-door NAME=URL`` by the URL's; a load door ``DOOR+CLIENT``
    (the door through another client, e.g. ``dcap+dccp``) by its door's."""
    door = door.partition("+")[0] if door else door
    view = storage_view(config)
    doors = (view.settings.doors or {}) if view is not None else {}
    url = doors.get(door or "", "")
    return url.partition("://")[0].lower() if url else (door or "")


@pytest.fixture(autouse=True)
def _functional_known_issue(request: pytest.FixtureRequest) -> None:
    """A functional check named in ``[known_issues]`` runs as a strict expected failure
    (the conformance classes do this themselves)."""
    cls = getattr(request.node, "cls", None)
    if request.node.get_closest_marker("storagescale_op") is not None or (
            cls is not None and issubclass(cls, KnownIssues)):
        return
    system = request.node.get_closest_marker("storagescale_system")
    check = request.node.originalname.removeprefix("test_")
    # the suite's own file only: an embedded server's thresholds/<kind>/ issues name
    # conformance checks (XRootD's "overwrite" is about its cached adler32, which the
    # functional test_overwrite does not ask for)
    thresholds = storage_view(request.config).thresholds(
        system.args[0] if system else "dcache")
    reason = thresholds.known_issue(check)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            f"known issue of {thresholds.system} {', '.join(thresholds.versions)} "
            f"({thresholds.path} [known_issues] {check!r}): {reason}")))
