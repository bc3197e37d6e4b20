"""What an http client knows of its door (dCache or not) is its own, learned on its
first contact: two doors in one process, one dCache-like and one XrdHttp, are kept
apart, and a door that another server replaces on the same port is learned anew (a
process-wide table keyed by ``host:port`` took the second for the first). Against a
stand-in dCache door (HTTPS on loopback, answering as ``dCache/9.2.4``) and a door in
front of the embedded xrootd's XrdHttp."""

from __future__ import annotations

import zlib

import pytest
from hostile_http import HostileDoor, Reply, Request

from pytest_storagescale.drivers.http import DoorServer, HTTPDriver
from pytest_storagescale.drivers.registry import driver_spec

pytestmark = pytest.mark.integration
DCACHE = "dCache/9.2.4"


class FakeDCache:
    """The rule of a door that answers every request itself as dCache would name
    itself: ``PUT`` keeps the body, ``HEAD`` gives its adler32 (``Digest``)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def __call__(self, request: Request) -> Reply:
        headers = {"Server": DCACHE}
        if request.method == "PUT":
            self.files[request.path] = request.body
            return Reply(201, headers)
        if request.method == "HEAD":
            data = self.files.get(request.path)
            if data is not None:
                headers["Digest"] = f"adler32={zlib.adler32(data):08x}"
            return Reply(200, headers)
        return Reply(405, headers)


@pytest.fixture
def doors(embedded_xrootd, tmp_path, request):
    """``open_door(rule, port)``: a door on loopback (``rule`` None: every request
    relayed to the embedded XrdHttp); ``client(door)``: a connected http client of the
    test's area behind it."""
    root = f"/storagescale/doors-{request.node.name[:40]}"
    real = driver_spec(embedded_xrootd.https_url, writable_root="/storagescale",
                       options={"ca_dir": embedded_xrootd.ca_dir}).connect("functional-real",
                                                                          timeout=30)
    real.mkdir(root)
    opened: list[HostileDoor] = []
    clients: list[HTTPDriver] = []

    def open_door(rule=None, port: int = 0) -> HostileDoor:
        folder = tmp_path / f"door{len(opened)}"
        folder.mkdir()
        door = HostileDoor(embedded_xrootd.authority, folder,
                           f"https://127.0.0.1:{embedded_xrootd.http_port}",
                           embedded_xrootd.ca_dir, rule, port=port).__enter__()
        opened.append(door)
        return door

    def client(door: HostileDoor) -> HTTPDriver:
        made = driver_spec(door.url(root), driver="http", writable_root=root,
                           options={"ca_dir": embedded_xrootd.ca_dir}).connect(
            "functional-doors", timeout=30)
        assert isinstance(made, HTTPDriver)
        clients.append(made)
        made.connect()  # the first contact, as a load client makes before the clock
        return made

    yield type("Doors", (), dict(open_door=staticmethod(open_door),
                                 client=staticmethod(client), root=root))
    for made in clients:
        made.close()
    for door in opened:
        door.__exit__(None, None, None)
    real.remove_tree(root)
    real.close()


def _put_headers(door: HostileDoor) -> list[dict[str, str]]:
    return [request.headers for request in door.requests("PUT")]


def test_two_doors_in_one_process_are_kept_apart(doors):
    """A dCache-like door and an XrdHttp door at once: each client knows its own from
    its first contact. The dCache one's PUT asks for 100-continue (its door redirects
    uploads to a pool) and is verified by a HEAD (checksum=auto); the XrdHttp one's
    PUT asks for neither (auto skips XrdHttp: xrootd/xrootd#2534)."""
    dcache_door, xrdhttp_door = doors.open_door(FakeDCache()), doors.open_door()
    dcache, xrdhttp = doors.client(dcache_door), doors.client(xrdhttp_door)
    assert dcache.door.server == DCACHE and dcache.door.is_dcache
    assert xrdhttp.door.is_xrdhttp and not xrdhttp.door.is_dcache
    for turn in range(2):  # interleaved: neither client's knowledge moves to the other
        assert dcache.put(f"{doors.root}/d{turn}", b"to the pool") == 11
        assert xrdhttp.put(f"{doors.root}/x{turn}", b"to xrdhttp") == 10
    assert [h.get("expect") for h in _put_headers(dcache_door)] == ["100-continue"] * 2
    assert [h.get("expect") for h in _put_headers(xrdhttp_door)] == [None, None]
    assert all("want-digest" in r.headers for r in dcache_door.requests("HEAD")[1:])
    assert len(dcache_door.requests("HEAD")) == 3  # connect, then one check per PUT
    assert not [r for r in xrdhttp_door.requests("HEAD") if "want-digest" in r.headers]


def test_a_door_replaced_on_the_same_port_is_learned_anew(doors):
    """A dCache-like door closes and an XrdHttp door opens on its port (as embedded
    servers of one pytest process do): the new door's client sends no dCache header.
    With one table of the process keyed by ``host:port``, it was taken for dCache."""
    first = doors.open_door(FakeDCache())
    before = doors.client(first)
    before.put(f"{doors.root}/f", b"one")
    assert _put_headers(first)[0].get("expect") == "100-continue"
    before.close()
    first.__exit__(None, None, None)
    second = doors.open_door(port=first.port)
    after = doors.client(second)
    assert after.endpoint.server == before.endpoint.server  # the same host:port
    after.put(f"{doors.root}/g", b"two")
    assert not after.door.is_dcache and after.door.is_xrdhttp
    assert _put_headers(second)[0].get("expect") is None


def test_the_first_answer_names_the_door():
    """A door is learned once: a later answer (a pool's, after a redirect) does not
    change it; an answer without a Server header makes a door that is known and is
    neither dCache nor XrdHttp."""
    door = DoorServer()
    assert not door.known and not door.is_dcache and not door.is_xrdhttp
    door.learn({"server": "dCache/11.2.0"})
    door.learn({"server": "XrootD/v5.5.3"})
    assert door.known and door.is_dcache and not door.is_xrdhttp
    anonymous = DoorServer()
    anonymous.learn({})
    assert anonymous.known and anonymous.server == ""
    assert not anonymous.is_dcache and not anonymous.is_xrdhttp
