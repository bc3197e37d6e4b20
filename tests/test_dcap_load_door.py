"""dcap through the gfal2 driver with another door listing for it (issue 35): libdcap's
listing listens on every interface and hangs, so a dcap door's service connections
(set-up, clean-up) list through the storage's xrootd door (the same namespace) and
remove through dcap, only what the run made; a load client is refused a listing; and
libdcap's listening socket, which it opens in active mode too, is on loopback only (in
the clients' mover processes). On a lean dCache of
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
    same spec is refused the listing; and while the service connection uploads and the
    load client reads, every listening socket of this process and of the clients'
    movers is on loopback: libdcap's own (one per process that opened a file, bound to
    every interface in active mode too: drivers/dcap_mover.py) is seen, in a mover,
    bound to loopback by the preload library; before the movers it was '::' in this
    process."""
    import psutil

    from pytest_storagescale.drivers.base import CreatedPaths
    from pytest_storagescale.errors import StorageError, StorageNotFound
    from pytest_storagescale.load.engine import remove_created

    dcache = lean_dcache
    folder = f"/storagescale/dcap-list-{secrets.token_hex(4)}"
    spec = _dcap_spec(dcache, folder)
    assert spec.options["listing_door"] == dcache.url_for("root")
    service = spec.connect("cleanup", timeout=120)
    service.created = CreatedPaths(folder)
    data = secrets.token_bytes(20 * 1024 * 1024 + 3)
    listening: set[tuple[str, int]] = set()
    movers: set[int] = set()
    stop = threading.Event()

    clients = [service]

    def watch() -> None:
        me = psutil.Process()
        while not stop.is_set():
            mine = [pid for client in list(clients) if client._movers is not None
                    for pid in client._movers.pids()]
            for pid in (me.pid, *mine):
                try:
                    process = psutil.Process(pid)
                    # psutil before 6.0 (Debian's) has connections(), not net_connections()
                    sockets = (getattr(process, "net_connections", None)
                               or process.connections)(kind="inet")
                except psutil.Error:
                    continue  # ended meanwhile
                for conn in sockets:
                    if conn.status == psutil.CONN_LISTEN:
                        listening.add((conn.laddr.ip, conn.laddr.port))
                        if pid != me.pid:
                            movers.add(pid)
            stop.wait(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        service.mkdir(f"{folder}/sub")
        for name in ("a", "sub/b"):
            service.put(f"{folder}/{name}", data)
        assert service.ls(folder) == ["a", "sub"]
        load = spec.client(0, timeout=120)
        load.halted = threading.Event()
        clients.append(load)
        with pytest.raises(StorageError, match="a load client never lists"):
            load.ls(folder)
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
    # libdcap's listening socket (one per process that moved data) is seen, in a mover,
    # and on loopback only: before the movers it was on '::' in this process
    assert movers and listening, (movers, listening)
    import ipaddress

    wide = sorted((ip, port) for ip, port in listening
                  if not (getattr(ipaddress.ip_address(ip), "ipv4_mapped", None)
                          or ipaddress.ip_address(ip)).is_loopback)
    assert not wide, f"libdcap listened beyond loopback while moving data: {wide}"



def test_concurrent_dcap_uploads_all_arrive_whole(lean_dcache):
    """Many uploads at once through the dcap door (issue 35: 1 of 9 concurrent set-up
    uploads through one client, and 1 of 2 mixed writers' puts, failed with EIO on
    11.2.5): 12 at once through one service connection and 3 load clients with 4 each,
    every one arrives, the same bytes read back. On failure the domain log's lines of
    the test's time are in the message."""
    from concurrent.futures import ThreadPoolExecutor

    from pytest_storagescale.drivers.base import CreatedPaths
    from pytest_storagescale.errors import StorageError
    from pytest_storagescale.load.engine import remove_created

    dcache = lean_dcache
    folder = f"/storagescale/dcap-many-{secrets.token_hex(4)}"
    spec = _dcap_spec(dcache, folder)
    service = spec.connect("cleanup", timeout=180)
    service.created = CreatedPaths(folder)
    clients = [spec.client(index, timeout=180) for index in range(3)]
    log_size = dcache.log_path.stat().st_size if dcache.log_path.exists() else 0
    payloads = {f"{folder}/s{index:02d}": secrets.token_bytes(1024 * 1024 + 17 * index)
                for index in range(12)}
    payloads.update({f"{folder}/c{client}-{index}": secrets.token_bytes(512 * 1024 + index)
                     for client in range(3) for index in range(4)})
    failures: list[str] = []

    def put(path: str) -> None:
        name = path.rsplit("/", 1)[1]
        driver = service if name.startswith("s") else clients[int(name[1])]
        try:
            driver.put(path, payloads[path])
        except StorageError as exc:
            failures.append(f"{name}: {exc}")
        else:
            if driver is not service:
                service.created.add(path, "file", len(payloads[path]))

    try:
        service.mkdir(folder)
        with ThreadPoolExecutor(len(payloads)) as pool:
            list(pool.map(put, payloads))
        log = ""
        if failures and dcache.log_path.exists():
            with open(dcache.log_path, "rb") as stream:
                stream.seek(log_size)
                log = stream.read().decode(errors="replace")[-6000:]
        assert not failures, (failures, log)
        for path, data in payloads.items():
            assert service.read(path, 0, len(data) + 1) == data, path
    finally:
        for client in clients:
            client.close()
        remove_created(service, service.created, None)
        service.close()


def _dcap_spec(dcache, folder: str):
    """The dcap door's driver spec writing in ``folder``, listing through another door
    of the same namespace (the session's ``with_listing_door``)."""
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.session.endpoint import with_listing_door

    return with_listing_door(
        driver_spec(dcache.url_for("dcap"), options=dcache.driver_options(),
                    writable_root=folder),
        {door: dcache.url_for(door) for door in ("davs", "root", "dcap")})


def test_a_dcap_client_with_other_credentials_than_its_process_first_goes_through_movers(
        lean_dcache, tmp_path):
    """libdcap's GSI tunnel keeps the credentials its process presented first: a second
    embedded dCache (another CA) had every request of the pytest process refused with
    EIO ("control line [28] is down": the fresh-clone CI of 0fb45ef, this module after
    another dCache's dcap tests in the same worker; reproduced with two dCaches started
    one after the other in one process: the second's mkdir failed, in a process of its
    own it passed). A dcap client whose CA folder or proxy is not its process's first
    makes every request, the namespace's too, in its movers."""
    import shutil

    from pytest_storagescale.drivers.base import CreatedPaths
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.load.engine import remove_created
    from pytest_storagescale.session.endpoint import with_listing_door

    dcache = lean_dcache
    folder = f"/storagescale/dcap-apart-{secrets.token_hex(4)}"
    first = _dcap_spec(dcache, folder).connect("cleanup", timeout=120)
    # the same CA and proxy under other names: other credentials to the process (the
    # first dcap client of this process, this one or an earlier test's, had others)
    ca_copy = tmp_path / "ca"
    shutil.copytree(dcache.ca_dir, ca_copy)
    proxy_copy = tmp_path / "x509up"
    shutil.copy2(dcache.proxy, proxy_copy)
    proxy_copy.chmod(0o600)
    options = {**dcache.driver_options(), "ca_dir": str(ca_copy), "x509_proxy": str(proxy_copy)}

    spec = with_listing_door(
        driver_spec(dcache.url_for("dcap"), options=options, writable_root=folder),
        {door: dcache.url_for(door) for door in ("davs", "root", "dcap")})
    apart = spec.connect("cleanup", timeout=120)
    apart.created = CreatedPaths(folder)
    asked: list[str] = []
    moved = apart._movers.call

    def recorded(request, *args):
        asked.append(request)
        return moved(request, *args)

    apart._movers.call = recorded
    try:
        # (``first`` may be apart too: an earlier test's dCache may have been this
        # process's first; which credentials count as the same: test_dcap_mover.py)
        assert apart._apart
        apart.mkdir(f"{folder}/sub")
        apart.put(f"{folder}/sub/f", b"x" * 1000)
        assert apart.stat(f"{folder}/sub/f").size == 1000
        apart.delete(f"{folder}/sub/f")
        apart.created.forget(f"{folder}/sub/f")
        assert {"_mkdir", "_stat", "_delete", "_upload"} <= set(asked), asked
        assert first.stat(folder).is_dir
    finally:
        remove_created(apart, apart.created, None)
        apart.close()
        first.close()
