"""dcap through the gfal2 driver with another door listing for it (issue 35): libdcap's
listing listens on every interface and hangs, so a dcap door's service connections
(set-up, clean-up) list through the storage's xrootd door (the same namespace) and
remove through dcap, only what the run made; a load client is refused a listing; and
libdcap runs in active mode (no listening socket while data moves). On a lean dCache of
this module (the newest release of the distribution cache, no tape, the dcap door: the
shared one's tape services did not come up within 300 s at load 35-47)."""

from __future__ import annotations

import secrets
import threading

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow_server]


@pytest.fixture(scope="module")
def lean_dcache(dcache_release):
    """A dCache with the dcap door and no tape, stopped after the module."""
    from pytest_storagescale.servers.dcache import EmbeddedDCache

    server = EmbeddedDCache(login="unix", tape=None, extra_doors=("dcap",),
                            startup_timeout=900)
    server.requested_version = dcache_release
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_a_dcap_client_lists_through_the_xrootd_door_and_moves_data_actively(
        lean_dcache):
    """A service connection of the dcap door (its set-up, its clean-up) lists through
    the xrootd door the session chose, and removes what it made; a load client of the
    same spec is refused the listing; and a dcap copy out (libdcap in active mode, set
    by the driver) leaves no socket of this process listening while it moves data
    (libdcap's passive mode listens on every interface for the pool's call)."""
    import psutil

    from pytest_storagescale.drivers.base import CreatedPaths
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.errors import StorageError, StorageNotFound
    from pytest_storagescale.load.engine import remove_created
    from pytest_storagescale.session.endpoint import with_listing_door

    dcache = lean_dcache
    folder = f"/storagescale/dcap-list-{secrets.token_hex(4)}"
    spec = with_listing_door(driver_spec(dcache.url_for("dcap"),
                                         options=dcache.driver_options(),
                                         writable_root=folder),
                             {door: dcache.url_for(door) for door in ("davs", "root", "dcap")})
    assert spec.options["listing_door"] == dcache.url_for("root")
    service = spec.connect("cleanup", timeout=120)
    service.created = CreatedPaths(folder)
    data = secrets.token_bytes(20 * 1024 * 1024 + 3)
    listening: set[tuple[str, int]] = set()
    stop = threading.Event()

    def watch() -> None:
        me = psutil.Process()
        while not stop.is_set():
            # psutil before 6.0 (Debian's) has connections(), not net_connections()
            sockets = getattr(me, "net_connections", None) or me.connections
            for conn in sockets(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    listening.add((conn.laddr.ip, conn.laddr.port))
            stop.wait(0.005)

    try:
        service.mkdir(f"{folder}/sub")
        for name in ("a", "sub/b"):
            service.put(f"{folder}/{name}", data)
        assert service.ls(folder) == ["a", "sub"]
        load = spec.client(0, timeout=120)
        load.halted = threading.Event()
        with pytest.raises(StorageError, match="a load client never lists"):
            load.ls(folder)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        for _ in range(3):
            assert load.get(f"{folder}/a", None) == len(data)
        stop.set()
        watcher.join(10)
        load.close()
        assert remove_created(service, service.created, None) is None
        with pytest.raises(StorageNotFound):
            service.stat(folder)
    finally:
        stop.set()
        service.close()
    if listening:  # a known defect, reported as such (never a pass), the rest asserted
        pytest.xfail(f"libdcap listened on {sorted(listening)} while moving data, with "
                     f"DCACHE_CLIENT_ACTIVE=1: found 2026-11-29 once this watch worked "
                     f"(psutil 5.9 has connections(), not net_connections()); the dcap "
                     f"load door is not in 'all' (docs/guarantees.md)")

