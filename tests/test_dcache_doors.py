"""The drivers against a real dCache's doors (issue 24): the version over every door
(the WebDAV ``Server:`` header, the xrootd door's ``query config version``, the SRM
door's ``srmPing``), srm:// namespace and data requests through gfal2, the WebDAV door's
redirects to the pools (followed, counted, a PUT's headers as the pool takes them) and
dCache 11.2's request limiter waited out. Every check on the session's one dCache
(``embedded_dcache``, conftest.py, shared with test_dcache_server.py: a dCache takes a
minute to come up here): the newest release of the distribution cache unless
``STORAGESCALE_DCACHE_VERSION`` names another. The answers' parsing is checked on
canned answers too (the real doors' own, recorded)."""

from __future__ import annotations

import http.client
import os
import ssl
import time
import zlib
from pathlib import Path

import pytest

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.drivers.srm import read_ls_answer, read_ping_answer, soap_call
from pytest_storagescale.drivers.url import EndpointURL
from pytest_storagescale.drivers.version import (
    version_from_config_answer,
    version_from_server_header,
)
from pytest_storagescale.errors import StorageNotFound, UnsafePathError

#: dCache 11.2.5's srmPing answer, as its SRM door sent it
PING_ANSWER = (
    b'<?xml version="1.0" encoding="UTF-8"?><soapenv:Envelope xmlns:soapenv="http://schema'
    b's.xmlsoap.org/soap/envelope/" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xs'
    b'i="http://www.w3.org/2001/XMLSchema-instance"><soapenv:Body><ns1:srmPingResponse soa'
    b'penv:encodingStyle="http://schemas.xmlsoap.org/soap/encoding/" xmlns:ns1="http://srm'
    b'.lbl.gov/StorageResourceManager"><srmPingResponse xsi:type="ns1:srmPingResponse"><ve'
    b'rsionInfo xsi:type="xsd:string">v2.2</versionInfo><otherInfo xsi:type="ns1:ArrayOfT'
    b'ExtraInfo"><extraInfoArray xsi:type="ns1:TExtraInfo"><key xsi:type="xsd:string">bac'
    b'kend_version</key><value xsi:type="xsd:string">11.2.5</value></extraInfoArray><extra'
    b'InfoArray xsi:type="ns1:TExtraInfo"><key xsi:type="xsd:string">backend_type</key><va'
    b'lue xsi:type="xsd:string">dCache</value></extraInfoArray></otherInfo></srmPingRespon'
    b'se></ns1:srmPingResponse></soapenv:Body></soapenv:Envelope>')


@pytest.mark.parametrize(("answer", "version"), [
    ("dCache 11.2.5\n", "11.2.5"), ("dCache 10.2.25", "10.2.25"), ("v5.5.3\0", "5.5.3"),
    ("v6.2.1\n", "6.2.1"), ("5.6.0-rc1", "5.6.0-rc1"), ("no version here", None), ("", None)])
def test_the_xrootd_doors_config_answer_is_read(answer, version):
    """``query config version``: dCache's xrootd door answers ``dCache 11.2.5``, xrootd
    ``v5.5.3``; both give the bare version."""
    assert version_from_config_answer(answer) == version


def test_the_webdav_and_srm_doors_answers_are_read():
    assert version_from_server_header("dCache/11.2.5") == "11.2.5"
    ping = read_ping_answer(PING_ANSWER)
    assert ping.srm_version == "v2.2" and ping.backend_version == "11.2.5"
    assert ping.info["backend_type"] == "dCache"
    with pytest.raises(ValueError, match="no srmPingResponse"):
        read_ping_answer(b"<a><b/></a>")


LS_ANSWER = (
    b'<?xml version="1.0"?><e:Envelope xmlns:e="http://schemas.xmlsoap.org/soap/envelope/">'
    b'<e:Body><n:srmLsResponse xmlns:n="http://srm.lbl.gov/StorageResourceManager">'
    b'<srmLsResponse><returnStatus><statusCode>SRM_SUCCESS</statusCode></returnStatus>'
    b'<details><pathDetailArray><path>/area/d</path><status><statusCode>SRM_SUCCESS'
    b'</statusCode></status><arrayOfSubPaths><pathDetailArray><path>/area/d/a</path>'
    b'</pathDetailArray><pathDetailArray><path>/area/d/sub</path><arrayOfSubPaths/>'
    b'</pathDetailArray></arrayOfSubPaths></pathDetailArray></details></srmLsResponse>'
    b'</n:srmLsResponse></e:Body></e:Envelope>')


def test_an_srmls_answer_is_read():
    """The paths one level below the directory, the statuses, a queued request's token."""
    answer = read_ls_answer(LS_ANSWER)
    assert (answer.status, answer.entry_status) == ("SRM_SUCCESS", "SRM_SUCCESS")
    assert answer.paths == ["/area/d/a", "/area/d/sub"]
    queued = read_ls_answer(LS_ANSWER.replace(b"SRM_SUCCESS</statusCode></returnStatus>",
                                              b"SRM_REQUEST_QUEUED</statusCode></returnStatus>"
                                              b"<requestToken>-42</requestToken>"))
    assert (queued.status, queued.token) == ("SRM_REQUEST_QUEUED", "-42")
    with pytest.raises(ValueError, match="no srmLs answer"):
        read_ls_answer(PING_ANSWER)


# -- against a real dCache -------------------------------------------------------------


def test_a_real_dcache_through_every_driver(tmp_path, embedded_dcache):
    """The session's dCache: the version over each door, srm:// through gfal2, the
    WebDAV door's redirects to the pools, and (11.2) the request limiter's block waited
    out."""
    from pytest_storagescale.servers.dcache import TARBALL

    server = embedded_dcache
    match = TARBALL.fullmatch(Path(server.requested_version).name)
    expected = match.group(1) if match else server.requested_version
    _each_door_tells_the_version(server, expected)
    _srm_through_gfal2(server, tmp_path)
    _srm_listing_of_four_entries(server)
    _webdav_transfers_go_to_the_pools_counted(server)
    _xrootd_opens_go_to_the_pools_counted(server)
    if expected.startswith("11."):
        _a_client_blocked_by_the_limiter_waits_it_out(server)


def _options(server, *names: str) -> dict[str, str]:
    return {key: value for key, value in server.driver_options().items() if key in names}


def _each_door_tells_the_version(server, expected: str) -> None:
    """Each driver asks its door in its own protocol; every answer is the release."""
    options = _options(server, "ca_dir", "x509_proxy")
    for scheme, driver in (("davs", "http"), ("davs", "gfal2"), ("root", "xrootd"),
                           ("srm", "gfal2")):
        client = driver_spec(server.url_for(scheme), driver=driver,
                             options=options if scheme != "root" else {}).connect(
            "version", timeout=60)
        try:
            assert client.version() == expected, (scheme, driver)
        finally:
            client.close()


def _srm_through_gfal2(server, tmp_path: Path) -> None:
    """mkdir, put, stat, ls, get (to disk and read in memory), read, checksum, rename,
    delete and rmdir on srm://, as seed 000's lcg-* commands did; the SURL's path is
    guarded; a stat is never the client's cached answer."""
    from pytest_storagescale.servers.dcache import AREA

    root = f"{AREA}/srm-checks"
    client = driver_spec(server.url_for("srm"), driver="gfal2", writable_root=root,
                         options=_options(server, "ca_dir", "x509_proxy")).connect(
        "srm", timeout=60)
    data = os.urandom(100_000)
    try:
        client.mkdir(f"{root}/d")
        assert client.put(f"{root}/d/f", data) == len(data)
        assert client.stat(f"{root}/d/f").size == len(data)
        assert client.stat(f"{root}/d").is_dir
        assert client.ls(f"{root}/d") == ["f"]
        local = tmp_path / "copied"
        assert client.get(f"{root}/d/f", str(local)) == len(data)
        assert local.read_bytes() == data
        assert client.get(f"{root}/d/f") == len(data)  # twice: gfal2 2.21 crashed there
        assert client.read(f"{root}/d/f", 10, 20) == data[10:30]
        assert client.checksum(f"{root}/d/f") == f"{zlib.adler32(data):08x}"
        client.rename(f"{root}/d/f", f"{root}/d/g")
        assert client.ls(f"{root}/d") == ["g"]
        with pytest.raises(UnsafePathError):
            client.put(f"{AREA}/outside-the-root", b"x")
        # a stat is the server's answer each time (gfal2's SRM plugin kept the last one
        # for the next stat of the path): removed by another client, it is gone
        client.put(f"{root}/d/h", b"h")
        assert client.stat(f"{root}/d/h").size == 1
        other = driver_spec(server.url_for("davs"), driver="http", writable_root=root,
                            options=_options(server, "ca_dir")).connect("other", timeout=60)
        try:
            other.delete(f"{root}/d/h")
        finally:
            other.close()
        with pytest.raises(StorageNotFound):
            client.stat(f"{root}/d/h")
        client.delete(f"{root}/d/g")
        client.rmdir(f"{root}/d")
        client.rmdir(root)
    finally:
        client.close()


def _srm_listing_of_four_entries(server) -> None:
    """A directory of 4 entries: gfal2 2.21 (srm-ifce) fails the listing at once as
    "Communication error on send" (the door logs that the client disconnected before
    the answer was sent), while the door answers the same srmLs (one SURL, numOfLevels
    1) to a plain SOAP client with SRM_SUCCESS and the 4 names: the client's defect,
    not the storage's. The driver then lists with its own srmLs, so the listing
    works; the check says whether gfal2 itself still fails."""
    import gfal2

    from pytest_storagescale.servers.dcache import AREA

    root = f"{AREA}/srm-listing"
    options = _options(server, "ca_dir", "x509_proxy")
    client = driver_spec(server.url_for("srm"), driver="gfal2", writable_root=root,
                         options=options).connect("srm-ls", timeout=60)
    names = [f"entry{index}" for index in range(4)]
    try:
        for name in names:
            client.put(f"{root}/{name}", b"x")
        surl = f"{server.url_for('srm').rsplit(AREA, 1)[0]}{root}"
        body = soap_call(EndpointURL.parse(server.url_for("srm")), _srm_ls(surl),
                         ca_dir=options["ca_dir"], x509_proxy=options["x509_proxy"])
        assert body.count(b"SRM_SUCCESS") >= 1 and all(
            f"{root}/{name}".encode() in body for name in names), body[:2000]
        assert client.ls(root) == names
        try:
            client._context.listdir(client._url(root))
        except gfal2.GError as exc:
            assert "Communication error on send" in str(exc), exc
            assert client._own_srm_ls  # the driver listed by its own srmLs
            print(f"gfal2 still fails a 4-entry srm:// listing: {exc}")
        else:
            print("gfal2 lists a 4-entry directory over srm:// now")
        client.mkdir(f"{root}/sub")
        # a name with a space (written over WebDAV: gfal2 sends it raw in the SURL, which
        # dCache's SRM door refuses as a malformed URI); the driver's srmLs encodes it
        webdav = driver_spec(server.url_for("davs"), driver="http", writable_root=root,
                             options=_options(server, "ca_dir")).connect("space", timeout=60)
        try:
            webdav.put(f"{root}/sub/a b", b"x")
            for name in ("c", "d", "e"):
                webdav.put(f"{root}/sub/{name}", b"x")
            assert client.ls(f"{root}/sub") == ["a b", "c", "d", "e"]
            for name in ("a b", "c", "d", "e"):
                webdav.delete(f"{root}/sub/{name}")
        finally:
            webdav.close()
        assert client.ls(root) == [*names, "sub"]
        with pytest.raises(StorageNotFound):
            client.ls(f"{root}/missing")
        client.rmdir(f"{root}/sub")
        for name in names:
            client.delete(f"{root}/{name}")
        client.rmdir(root)
    finally:
        client.close()


def _srm_ls(surl: str) -> bytes:
    """The srmLs request gfal2's readdir sends: one SURL, one level."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?><SOAP-ENV:Envelope xmlns:SOAP-ENV="http://sc'
        'hemas.xmlsoap.org/soap/envelope/" xmlns:srm="http://srm.lbl.gov/StorageResourceMa'
        f'nager"><SOAP-ENV:Body><srm:srmLs><srmLsRequest><arrayOfSURLs><urlArray>{surl}'
        '</urlArray></arrayOfSURLs><fullDetailedList>false</fullDetailedList><numOfLevels>'
        '1</numOfLevels></srmLsRequest></srm:srmLs></SOAP-ENV:Body></SOAP-ENV:Envelope>'
    ).encode()


def _webdav_transfers_go_to_the_pools_counted(server) -> None:
    """Through the http driver: once the door is known as dCache, a PUT asks for 100-
    continue and is redirected to a pool (sent no Content-Type, which the pool refuses
    with 501), a GET too; each redirect is counted with the door's share of the time;
    a 3 MB upload (libcurl's own 100-continue) lands whole."""
    from pytest_storagescale.servers.dcache import AREA

    root = f"{AREA}/redirects"
    client = driver_spec(server.url_for("davs"), driver="http", writable_root=root,
                         options=_options(server, "ca_dir")).connect("redirects", timeout=60)
    try:
        client.put(f"{root}/first", b"the door learns its Server header")
        before = client.redirects
        client.put(f"{root}/small", b"small")
        assert client.redirects == before + 1  # the PUT, to the pool
        assert client.get(f"{root}/small") == 5
        assert client.redirects == before + 2
        assert client.door_seconds > 0
        big = os.urandom(3_000_000)
        client.put(f"{root}/big", big)
        assert client.read(f"{root}/big", 2_999_990, 10) == big[-10:]
        for name in ("first", "small", "big"):
            client.delete(f"{root}/{name}")
        client.rmdir(root)
    finally:
        client.close()


def _xrootd_opens_go_to_the_pools_counted(server) -> None:
    """Through the xrootd driver: the door redirects each open (put, get, read) to a
    pool's mover, counted once from XrdCl's host list; a stat is the door's own answer
    (none); the compiled loop's gets count theirs, its stats none."""
    from pytest_storagescale.drivers.base import RequestWalk
    from pytest_storagescale.servers.dcache import AREA

    root = f"{AREA}/root-redirects"
    client = driver_spec(server.url_for("root"), driver="xrootd", writable_root=root
                         ).connect("rootredir", timeout=60)
    try:
        client.put(f"{root}/f", b"x" * 1000)
        assert client.redirects == 1
        assert client.get(f"{root}/f") == 1000 and client.read(f"{root}/f", 0, 4) == b"xxxx"
        assert client.stat(f"{root}/f").size == 1000
        assert client.redirects == 3
        for kind, size in (("get", 1000), ("stat", None)):
            loop = client.compiled_loop(RequestWalk(kind, (f"{root}/f",), 0, 1, size))
            try:
                made = loop.run(0, 2, time.perf_counter() + 60)
            finally:
                loop.close()
            assert len(made) == 2 and all(o.error is None for o in made), made
        assert client.counters() == {"redirects": 5}  # the two compiled gets'
        client.delete(f"{root}/f")
        client.rmdir(root)
    finally:
        client.close()


def _a_client_blocked_by_the_limiter_waits_it_out(server) -> None:
    """dCache 11.2 answers 429 (no Retry-After) for ~10 s to a client address with more
    than 3 authentication errors in 20 s: the http driver waits and sends again, and
    its request succeeds within the deadline instead of failing."""
    from pytest_storagescale.servers.dcache import AREA

    statuses = [_wrong_password(server) for _ in range(5)]
    assert 429 in statuses, statuses
    client = driver_spec(server.url_for("davs"), driver="http",
                         options=_options(server, "ca_dir")).connect("limited", timeout=60)
    try:
        assert client.stat(AREA).is_dir
        assert client._transport.read_retry_after  # it was throttled, and waited
    finally:
        client.close()


def _wrong_password(server) -> int:
    """One PROPFIND with a wrong password on a connection of its own (dCache counts a
    connection's failed logins once)."""
    context = ssl.create_default_context(capath=server.ca_dir)
    connection = http.client.HTTPSConnection("localhost", server.ports["webdav"],
                                             context=context, timeout=30)
    try:
        import base64

        token = base64.b64encode(b"storagescale:wrong").decode()
        connection.request("PROPFIND", "/", headers={"Authorization": f"Basic {token}",
                                                      "Depth": "0"})
        return connection.getresponse().status
    finally:
        connection.close()
