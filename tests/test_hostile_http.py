"""The http driver against a hostile door (tests/hostile_http.py: a TLS proxy in front
of the embedded xrootd's XrdHttp): redirects of mutating requests only to the same
path, credentials only to the door, bounded answers, and malformed fields as counted
``bad_answer`` errors (names that are not UTF-8 on the xrootd and gfal2 drivers too);
through the plugin, the victim of a redirected DELETE survives and the run says so."""

from __future__ import annotations

import email.utils
import json
import os
import threading
import time
from pathlib import Path
from urllib.parse import quote

import psutil
import pytest
from hostile_http import HostileDoor, Reply, Request
from plans import one_step_plan

from pytest_storagescale.drivers.http import ANSWER_LIMIT, LISTING_LIMIT
from pytest_storagescale.drivers.http._transport import _redirect_refusal, _retry_after, _shown
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import (
    BadAnswer,
    RedirectRefused,
    StorageError,
    StorageNotFound,
    StorageThrottled,
)

pytestmark = pytest.mark.integration
TOKEN = "eyJhbGciOiJub25lIn0.hostile-door-secret-token"
MUTATING = {"PUT", "DELETE", "MKCOL", "MOVE", "COPY", "PROPPATCH"}


@pytest.fixture
def hostile(embedded_xrootd, tmp_path, request):
    """``open_door(rule)`` opens a hostile door in front of the embedded XrdHttp; the
    test's area ``root`` and an ``outside`` folder holding ``victim`` exist on the real
    server, written by ``real`` (a driver that may write anywhere in the test area)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[-50:]
    root, outside = f"/storagescale/hostile-{name}", f"/storagescale/outside-{name}"
    real = driver_spec(embedded_xrootd.https_url, writable_root="/storagescale",
                       options={"ca_dir": embedded_xrootd.ca_dir}).connect("functional-real",
                                                                          timeout=20)
    real.mkdir(root)
    real.put(f"{outside}/victim.dat", b"precious")
    doors: list[HostileDoor] = []

    def open_door(rule=None) -> HostileDoor:
        folder = tmp_path / f"door{len(doors)}"
        folder.mkdir()
        door = HostileDoor(embedded_xrootd.authority, folder,
                           f"https://127.0.0.1:{embedded_xrootd.http_port}",
                           embedded_xrootd.ca_dir, rule).__enter__()
        doors.append(door)
        return door

    def client(door: HostileDoor, driver: str = "auto", **options: str):
        spec = driver_spec(door.url(root), driver=driver, writable_root=root,
                           options={"ca_dir": embedded_xrootd.ca_dir, **options})
        return spec.connect("functional-hostile", timeout=20)

    yield type("Hostile", (), dict(open_door=staticmethod(open_door), real=real, root=root,
                                   victim=f"{outside}/victim.dat", client=staticmethod(client),
                                   embedded=embedded_xrootd))
    for door in doors:
        door.__exit__(None, None, None)
    real.remove_tree(root)
    real.remove_tree(outside)
    real.close()


def _inside(request: Request, root: str) -> bool:
    return request.path.startswith(quote(root) + "/")


# -- redirects ------------------------------------------------------------------------
OPERATIONS = {
    "DELETE": lambda driver, root: driver.delete(f"{root}/f"),
    "PUT": lambda driver, root: driver.put(f"{root}/g", b"new"),
    "MKCOL": lambda driver, root: driver.mkdir(f"{root}/d"),
    "MOVE": lambda driver, root: driver.rename(f"{root}/f", f"{root}/h"),
}
LOCATIONS = {
    "another path": lambda hostile, upstream: hostile.victim,
    "another server": lambda hostile, upstream: f"{upstream}{hostile.victim}",
    "encoded dots": lambda hostile, upstream: (
        f"{hostile.root}/f/%2e%2e/%2E%2E/{hostile.victim.rpartition('/')[0].rpartition('/')[2]}"
        f"/victim.dat"),
}


@pytest.mark.parametrize("driver", ["http", "gfal2"])
@pytest.mark.parametrize("where", list(LOCATIONS))
@pytest.mark.parametrize("method", list(OPERATIONS))
def test_a_mutating_request_redirected_elsewhere_is_refused_and_the_victim_survives(
        hostile, method, where, driver):
    """The issue's attack: a door answers a request inside the run directory with
    ``307 Location: <a victim outside>``; followed, the victim was deleted. gfal2's HTTP
    plugin follows every redirect (no setting stops it): the gfal2 driver makes its
    writes through the http driver, so they are refused the same way."""
    upstream = f"https://127.0.0.1:{hostile.embedded.http_port}"
    location = LOCATIONS[where](hostile, upstream)
    hostile.real.put(f"{hostile.root}/f", b"mine")
    door = hostile.open_door(lambda request: Reply(307, {"Location": location}) if (
        request.method == method and _inside(request, hostile.root)) else None)
    client = hostile.client(door, driver)
    try:
        assert client.name == driver and client.stat(f"{hostile.root}/f").size == 4
        with pytest.raises(RedirectRefused) as info:
            OPERATIONS[method](client, hostile.root)
    finally:
        client.close()
    error = info.value
    assert error.error_class == "redirect_refused" and error.native_status == "HTTP 307"
    assert f"redirected {method} to https://127.0.0.1:" in error.message
    assert "refused, not followed" in error.message
    assert hostile.real.read(hostile.victim, 0, 100) == b"precious"
    assert hostile.real.read(f"{hostile.root}/f", 0, 100) == b"mine"
    # nothing was sent to the Location: the door saw one request of that method
    assert len(door.requests(method)) == 1


@pytest.mark.parametrize("credential", ["token", "password"])
def test_a_same_path_redirect_is_followed_to_the_pool_without_the_doors_credentials(
        hostile, credential):
    """As a dCache door sends a transfer to a pool: PUT, MKCOL and DELETE are redirected
    to the same path on another port (a second door before the same server), and done
    there; a read goes anywhere. The token or password goes to the door only."""
    pool, door = _door_and_pool(hostile, ("PUT", "MKCOL", "DELETE", "GET"))
    if credential == "token":
        driver = hostile.client(door, token=TOKEN)
        sent = f"Bearer {TOKEN}"
    else:
        spec = driver_spec(door.url(hostile.root).replace("//", "//alice:s3cret@", 1),
                           writable_root=hostile.root,
                           options={"ca_dir": hostile.embedded.ca_dir})
        driver = spec.connect("functional-hostile", timeout=20)
        sent = "Basic YWxpY2U6czNjcmV0"
    data = b"payload" * 1000
    try:
        assert driver.put(f"{hostile.root}/f", data) == len(data)
        driver.mkdir(f"{hostile.root}/d/e")  # MKCOL 409 -> the parent first, each redirected
        assert driver.get(f"{hostile.root}/f") == len(data)
        driver.delete(f"{hostile.root}/f")
    finally:
        driver.close()
    _done_at_the_pool(hostile, pool, data, f"{hostile.root}/d/e")
    assert {r.method for r in pool.seen} >= {"PUT", "MKCOL", "GET", "DELETE"}
    assert all(r.headers.get("authorization") == sent for r in door.seen)


def _door_and_pool(hostile, methods: tuple[str, ...]):
    """A pool (a second door before the same server) and a door that redirects
    ``methods`` inside the test's area to the same path there."""
    pool = hostile.open_door()
    door = hostile.open_door(lambda request: Reply(307, {
        "Location": f"{pool.base}{request.path}?pool-ticket=1"}) if (
        request.method in methods and _inside(request, hostile.root)) else None)
    return pool, door


def _done_at_the_pool(hostile, pool, data: bytes, directory: str) -> None:
    """``f`` was written (``data``) and deleted and ``directory`` made, all at the pool,
    which got no credential."""
    with pytest.raises(StorageNotFound):
        hostile.real.stat(f"{hostile.root}/f")
    assert hostile.real.stat(directory).is_dir
    assert [r.body for r in pool.requests("PUT")] == [data]
    assert all(r.path.endswith("?pool-ticket=1") for r in pool.seen)
    assert not [r for r in pool.seen if "authorization" in r.headers]


def test_gfal2_on_an_http_door_follows_a_same_path_redirect_to_the_pool(hostile):
    """PUT, MKCOL and DELETE of the gfal2 driver (made by the http driver) redirected to
    the same path on a second door (a dCache pool) are done there, the token sent to
    the door only; its reads stay with gfal2 (not redirected here: gfal2 would send
    the door's token to the pool)."""
    pool, door = _door_and_pool(hostile, ("PUT", "MKCOL", "DELETE"))
    driver = hostile.client(door, "gfal2", token=TOKEN)
    data = b"payload" * 1000
    try:
        assert driver.put(f"{hostile.root}/f", data) == len(data)
        driver.mkdir(f"{hostile.root}/d")
        assert driver.get(f"{hostile.root}/f") == len(data)  # gfal2's own read
        assert hostile.real.read(f"{hostile.root}/f", 0, len(data)) == data
        driver.delete(f"{hostile.root}/f")
    finally:
        driver.close()
    _done_at_the_pool(hostile, pool, data, f"{hostile.root}/d")
    assert {r.method for r in pool.seen} == {"PUT", "MKCOL", "DELETE"}
    assert door.requests("GET")


def test_the_same_path_rule_of_mutating_redirects():
    door, path = "https://door:2880", "/pnfs/area/run/f 1"
    for same in ("https://pool:20000/pnfs/area/run/f%201?dcache-http-uuid=1",
                 "https://door:2880/pnfs//area/run/f%201", "https://POOL/pnfs/area/run/f 1/"):
        assert _redirect_refusal(door, same, path) is None, same
    for location, why in [
            ("https://pool/pnfs/area/outside/victim.dat", "another path"),
            ("https://pool/pnfs/area/run/x/../f%201", "a path with a . or .. segment"),
            ("https://pool/pnfs/area/run/%2e%2e/run/f%201", "a path with a . or .. segment"),
            ("https://pool/pnfs/area/run/./f%201", "a path with a . or .. segment"),
            ("http://pool/pnfs/area/run/f%201", "not over TLS (the door is https)"),
            ("ftp://pool/pnfs/area/run/f%201", "not an http(s) URL"),
            ("https://[::1/pnfs/area/run/f%201", "not a URL")]:
        assert _redirect_refusal(door, location, path) == why, location
    assert _redirect_refusal("http://door", "http://pool/pnfs/area/run/f%201", path) is None
    assert _shown("https://u:p@pool:1/a/b?authz=secret") == "https://pool:1/a/b?..."


def test_a_read_may_be_redirected_anywhere(hostile):
    """Reads follow a redirect to another path (libcurl), as a namespace may send them."""
    door = hostile.open_door(lambda request: Reply(302, {"Location": hostile.victim}) if (
        request.method == "GET" and _inside(request, hostile.root)) else None)
    driver = hostile.client(door)
    try:
        assert driver.get(f"{hostile.root}/anything") == len(b"precious")
    finally:
        driver.close()


# -- bounded answers --------------------------------------------------------------------
MB = 1024 * 1024
RESPONSE = ("<D:response><D:href>{href}/entry-{i:06d}</D:href><D:propstat><D:prop>"
            "<D:getcontentlength>{length}</D:getcontentlength><D:resourcetype/>"
            "<D:getlastmodified>Tue, 15 Nov 2026 08:12:31 GMT</D:getlastmodified>"
            "</D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>")
HEAD = b'<?xml version="1.0" encoding="utf-8"?><D:multistatus xmlns:D="DAV:">'


def _endless_listing(href: str, total: int):
    """A 207 answer of ``total`` bytes of entries, made as it is sent."""
    block = "".join(RESPONSE.format(href=href, i=i, length=i) for i in range(2000)).encode()
    yield HEAD
    for _ in range(total // len(block)):
        yield block
    yield b"</D:multistatus>"


def _one_endless_entry(href: str, total: int):
    yield HEAD + f"<D:response><D:href>{href}</D:href><D:propstat><D:prop>".encode()
    yield b"<D:displayname>"
    block = b"x" * MB
    for _ in range(total // MB):
        yield block


class PeakRSS:
    """This process's highest RSS while the block runs, sampled every 5 ms."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = self.start = self.process.memory_info().rss
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRSS:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.start) / MB


@pytest.mark.parametrize("answer", ["entries", "one entry"])
def test_a_400_mb_listing_is_a_bad_answer_and_memory_stays_flat(hostile, answer):
    """The issue's 400 MB PROPFIND answer took 3 GB for one client. A listing is read
    as it arrives and aborted at LISTING_LIMIT; one entry at ANSWER_LIMIT."""
    make = _endless_listing if answer == "entries" else _one_endless_entry
    door = hostile.open_door(lambda request: Reply(207, {
        "Content-Type": "application/xml"}, make(quote(hostile.root), 400 * MB)) if (
        request.method == "PROPFIND") else None)
    driver = hostile.client(door)
    try:
        with PeakRSS() as rss, pytest.raises(BadAnswer) as info:
            driver.ls(hostile.root)
        with pytest.raises(BadAnswer) as stat:
            driver.stat(hostile.root)
    finally:
        driver.close()
    limit = LISTING_LIMIT if answer == "entries" else ANSWER_LIMIT
    assert info.value.error_class == "bad_answer" and info.value.operation == "ls"
    assert f"longer than {limit:,} bytes" in info.value.message
    assert rss.growth_mb < 100, f"RSS grew by {rss.growth_mb:.0f} MB"
    assert stat.value.error_class == "bad_answer"
    assert f"longer than {ANSWER_LIMIT:,} bytes" in stat.value.message


# -- malformed fields -------------------------------------------------------------------
ONE = ('<?xml version="1.0" encoding="utf-8"?><D:multistatus xmlns:D="DAV:"><D:response>'
       "<D:href>{href}</D:href><D:propstat><D:prop>{props}<D:resourcetype/></D:prop>"
       "<D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response></D:multistatus>")
MALFORMED = {
    "5000 digits": "<D:getcontentlength>" + "7" * 5000 + "</D:getcontentlength>",
    "arabic digits": "<D:getcontentlength>\u0661\u0662\u0663</D:getcontentlength>",
    "superscript": "<D:getcontentlength>\u00b2</D:getcontentlength>",
    "negative": "<D:getcontentlength>-1</D:getcontentlength>",
    "character reference": "<D:getcontentlength>&#1633;</D:getcontentlength>",
    "date": "<D:getlastmodified>the day before yesterday</D:getlastmodified>",
}


@pytest.mark.parametrize("field", list(MALFORMED))
def test_a_malformed_field_is_a_bad_answer(hostile, field):
    """Each used to be a raw ValueError (or, for a date, silently no time)."""
    door = hostile.open_door(lambda request: Reply(207, {"Content-Type": "application/xml"},
                                                   ONE.format(href=request.path,
                                                              props=MALFORMED[field]).encode())
                             if request.method == "PROPFIND" else None)
    for error in _stat_and_ls_refused(hostile, door):
        assert "getlastmodified" in error.message or "getcontentlength" in error.message
        assert len(error.message) < 300


def _stat_and_ls_refused(hostile, door: HostileDoor) -> list[BadAnswer]:
    """The bad answers of a stat and a listing through ``door``."""
    driver = hostile.client(door)
    errors = []
    try:
        for call in (lambda: driver.stat(f"{hostile.root}/f"), lambda: driver.ls(hostile.root)):
            with pytest.raises(BadAnswer) as info:
                call()
            assert info.value.error_class == "bad_answer"
            errors.append(info.value)
    finally:
        driver.close()
    return errors


def test_a_malformed_checksum_is_a_bad_answer(hostile):
    door = hostile.open_door(lambda request: Reply(200, {"Digest": "adler32=not-hex!"}) if (
        request.method == "HEAD" and _inside(request, hostile.root)) else None)
    driver = hostile.client(door, checksum="adler32")
    try:
        with pytest.raises(BadAnswer) as info:
            driver.checksum(f"{hostile.root}/f")
    finally:
        driver.close()
    assert "the Digest adler32='not-hex!' is not hex" in info.value.message


@pytest.mark.parametrize("driver", ["http", "xrootd", "gfal2"])
def test_a_name_that_is_not_utf8_in_a_listing_is_a_bad_answer_on_every_driver(
        embedded_xrootd, driver):
    """A file named with bytes that are not UTF-8, made on the server's side: XrdHttp
    sends them raw (XML that is not well-formed), and pyxrootd and gfal2's bindings
    failed to decode them (a SystemError, a raw UnicodeDecodeError)."""
    root = f"/storagescale/not-utf8-{driver}"
    url = embedded_xrootd.https_url if driver == "http" else embedded_xrootd.url
    client = driver_spec(url, driver="auto" if driver != "gfal2" else "gfal2",
                         writable_root=root, options={"ca_dir": embedded_xrootd.ca_dir} if (
                             driver == "http") else {}).connect("functional-utf8", timeout=20)
    client.mkdir(root)
    folder = os.fsencode(Path(embedded_xrootd.directory) / "data" / root.lstrip("/"))
    odd = os.path.join(folder, b"bad-\xff\xfe-name")
    Path(os.fsdecode(odd)).write_bytes(b"x")
    try:
        with pytest.raises(BadAnswer) as info:
            client.ls(root)
    finally:
        os.unlink(odd)
        client.remove_tree(root)
        client.close()
    assert info.value.error_class == "bad_answer" and info.value.operation == "ls"


# -- through the plugin -----------------------------------------------------------------
SUITE = """
import pytest

@pytest.mark.storagescale_op("{op}")
def test_{op}(storage_load, storage_clients):
    storage_load.run()
"""


def _run(pytester, thresholds_dir, door, hostile, op: str, *options: str,
         plan: str | None = None):
    thresholds_dir(plan or one_step_plan(op))
    pytester.makepyfile(test_suite=SUITE.format(op=op))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--storage-endpoint={door.url(hostile.root)}",
        f"--storage-driver-option=ca_dir={hostile.embedded.ca_dir}",
        f"--storage-thresholds={thresholds_dir.root}", "--storage-results=results.json",
        *options, timeout=300)
    [step] = json.loads((pytester.path / "results.json").read_text())["steps"]
    return result, step


@pytest.mark.parametrize("driver", ["http", "gfal2"])
def test_a_run_whose_deletes_are_redirected_outside_keeps_the_victim_and_says_so(
        pytester, thresholds_dir, hostile, driver):
    """The issue's run: every DELETE inside the run's area is answered ``307 Location:
    <victim>``. The victim survives; the step counts the refusals, the run fails and
    names the Location. With ``--storage-driver gfal2`` (whose HTTP plugin followed the
    redirect and deleted the victim) too, and its header says how it writes."""
    door = hostile.open_door(lambda request: Reply(307, {"Location": hostile.victim}) if (
        request.method == "DELETE" and _inside(request, hostile.root)) else None)
    result, step = _run(pytester, thresholds_dir, door, hostile, "delete",
                        f"--storage-driver={driver}", "-v")
    output = result.stdout.str() + result.stderr.str()
    assert hostile.real.read(hostile.victim, 0, 100) == b"precious"
    assert not [r for r in door.seen if r.path == quote(hostile.victim)]
    assert step["failed"] > 0 and set(step["errors"]) == {"redirect_refused"}, step
    result.assert_outcomes(failed=1)
    assert "redirect_refused" in output and f"{hostile.victim}" in output
    header = "through the http driver (libcurl), which follows its redirects only"
    assert (header in output) == (driver == "gfal2")


def test_a_malformed_size_is_a_counted_bad_answer_and_the_step_is_recorded(
        pytester, thresholds_dir, hostile):
    """The issue's run: the stat target's getcontentlength has 5,000 digits. The step is
    in the table and the JSON with its bad_answer errors; no traceback."""
    def rule(request: Request) -> Reply | None:
        if request.method == "PROPFIND" and request.path.endswith("/stat-target"):
            return Reply(207, {"Content-Type": "application/xml"}, ONE.format(
                href=request.path, props=MALFORMED["5000 digits"]).encode())
        return None

    door = hostile.open_door(rule)
    result, step = _run(pytester, thresholds_dir, door, hostile, "stat")
    assert step["op"] == "stat" and step["failed"] > 0, (step, result.stdout.str())
    assert set(step["errors"]) == {"bad_answer"}, step
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*stat*1*fail*", "*bad_answer*"])
    output = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in output, output


# -- throttling -----------------------------------------------------------------------
def _throttle_first(path_end: str, count: int, retry_after: str | None = "1"):
    """A rule answering the first ``count`` requests of each method for a path ending
    ``path_end`` with 429 (and ``Retry-After`` when given), then letting them through."""
    answered: list[str] = []
    headers = {"Retry-After": retry_after} if retry_after is not None else {}

    def rule(request: Request) -> Reply | None:
        if request.path.endswith(path_end) and answered.count(request.method) < count:
            answered.append(request.method)
            return Reply(429, headers, b"" if request.method == "HEAD" else b"Too many")
        return None

    return rule


def test_a_throttled_request_is_sent_again_after_its_retry_after(hostile):
    """A 429 with ``Retry-After: 1`` (dCache 11.2's WebDAV request limiter) to a PUT and
    a stat, and one without Retry-After to a read: the client waits and sends the same
    request again; each succeeds, the door saw each twice."""
    hostile.real.put(f"{hostile.root}/d/f", b"x")
    door = hostile.open_door(_throttle_first("/d/f", 1))
    client = hostile.client(door, "http")
    try:
        client.put(f"{hostile.root}/d/f", b"new")
        assert client.stat(f"{hostile.root}/d/f").size == 3
    finally:
        client.close()
    [first, second] = [r for r in door.seen if r.method == "PUT"]
    assert first.body == second.body == b"new"
    assert len([r for r in door.seen if r.method == "PROPFIND"]) == 2
    reader = hostile.open_door(_throttle_first("/d/f", 1, retry_after=None))
    client = hostile.client(reader, "http")
    try:
        assert client.read(f"{hostile.root}/d/f", 0, 10) == b"new"
    finally:
        client.close()
    assert len([r for r in reader.seen if r.method == "GET"]) == 2


def test_a_throttled_request_is_not_sent_again_once_the_step_stopped(hostile):
    """The step stops (Ctrl-C, or its window's end) while a client waits out a
    ``Retry-After: 5`` to send its request again: the wait ends at once and the
    request is not sent again (no load after the stop), counted as throttled."""
    stopped = threading.Event()
    throttle = _throttle_first("/f", 100, retry_after="5")

    def rule(request: Request) -> Reply | None:
        reply = throttle(request)
        if reply is not None:
            stopped.set()  # Ctrl-C while the client reads this 429
        return reply

    door = hostile.open_door(rule)
    client = hostile.client(door, "http")
    client.halted = stopped  # as the engine hands a load client its step's stop
    try:
        with pytest.raises(StorageThrottled, match="the step stopped while it waited"):
            client.stat(f"{hostile.root}/f")
    finally:
        client.close()
    assert len([r for r in door.seen if r.method == "PROPFIND"]) == 1


def test_a_wait_longer_than_the_deadline_allows_is_throttled_not_failed(hostile):
    """``Retry-After: 3600`` is more than the request's deadline allows waiting: the
    request ends at once as ``throttled`` (StorageThrottled), sent once; a 503 without
    Retry-After stays an ordinary failure."""
    door = hostile.open_door(_throttle_first("/f", 100, retry_after="3600"))
    client = hostile.client(door, "http")
    try:
        with pytest.raises(StorageThrottled) as info:
            client.stat(f"{hostile.root}/f")
    finally:
        client.close()
    assert info.value.error_class == "throttled" and "3600" in info.value.message
    assert len(door.seen) == 1 + 1  # the login's HEAD, the stat once
    unavailable = hostile.open_door(lambda request: Reply(503, {}, b"down") if
                                    request.method == "PROPFIND" else None)
    client = hostile.client(unavailable, "http")
    try:
        with pytest.raises(StorageError) as failed:
            client.stat(f"{hostile.root}/f")
    finally:
        client.close()
    assert failed.value.error_class == "http_503"


def test_a_throttled_step_counts_throttled_not_failed_and_a_rule_can_name_it(
        pytester, thresholds_dir, hostile):
    """Through the engine: every stat of the load's client answered 429 ``Retry-After:
    3600`` (the run's own set-up and clean-up are not throttled). The step
    counts them as ``throttled`` (JSON, table), ``failed`` stays 0, and the rule
    ``throttled == 0`` fails the test naming what was observed."""
    door = hostile.open_door(lambda request: Reply(429, {"Retry-After": "3600"}, b"") if (
        request.method == "PROPFIND" and request.path.endswith("/stat-target")
        and request.headers.get("user-agent", "").endswith("/client0")) else None)
    # the first answer's headers are not read (THROTTLE_WAIT, 1 s): a step longer than that
    result, step = _run(pytester, thresholds_dir, door, hostile, "stat", "--storage-driver=http",
                        plan=one_step_plan("stat", rules=("failed == 0", "throttled == 0"),
                                           duration="3s"))
    assert step["throttled"] > 0 and step["failed"] == 0, step
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"throttled*{step['throttled']}*throttled == 0*VIOLATED",
                                 "*failed*hung*throttled*p50*verdict",
                                 f"stat*0*{step['throttled']}*fail"])
    result.stdout.no_fnmatch_line("failed*failed == 0*VIOLATED")


def test_a_steps_redirects_are_counted_and_a_rule_can_name_them(
        pytester, thresholds_dir, hostile):
    """Through the engine: every GET of the load is redirected to a pool (a second door
    before the same server), as a dCache door does. The step's JSON counts the
    redirects and the door's mean share of their latency, the table shows the count,
    and the rule ``redirects == 0`` fails naming it."""
    _, door = _door_and_pool(hostile, ("GET",))
    result, step = _run(pytester, thresholds_dir, door, hostile, "get", "--storage-driver=http",
                        plan=one_step_plan("get", rules=("failed == 0", "redirects == 0")))
    assert step["failed"] == 0 and step["redirects"] >= step["succeeded"] > 0, step
    assert step["door_latency_s"] > 0
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["redirects*redirects == 0*VIOLATED",
                                 "*failed*hung*redirects*p50*verdict"])


def test_gfal2_reads_waits_out_a_429_too(hostile):
    """gfal2 (davix) fails a 429 at once ("Result HTTP 429"): the gfal2 driver sends
    the read again after THROTTLE_WAIT, as the http driver does; an endless 429 ends as
    ``throttled``, not as an EIO failure."""
    hostile.real.put(f"{hostile.root}/f", b"x")
    door = hostile.open_door(_throttle_first("/f", 2))
    client = hostile.client(door, "gfal2")
    try:
        assert client.stat(f"{hostile.root}/f").size == 1
    finally:
        client.close()
    assert len([r for r in door.seen if r.path.endswith("/f")]) == 3
    endless = hostile.open_door(_throttle_first("/f", 1000))
    spec = driver_spec(endless.url(hostile.root), driver="gfal2", writable_root=hostile.root,
                       options={"ca_dir": hostile.embedded.ca_dir})
    client = spec.connect("functional-hostile", timeout=4)  # waits within 2 s
    try:
        with pytest.raises(StorageThrottled) as info:
            client.stat(f"{hostile.root}/f")
    finally:
        client.close()
    assert info.value.error_class == "throttled" and "429" in info.value.message


def test_a_retry_after_is_read_as_seconds_or_a_date():
    """RFC 9110 10.2.3: delay-seconds or an HTTP date (a date in the past: no wait);
    anything else is unreadable (the driver then waits THROTTLE_WAIT)."""
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    assert _retry_after("3600") == 3600.0 and _retry_after(" 0 ") == 0.0
    assert 100 < _retry_after(later) <= 120
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert _retry_after("soon") is None and _retry_after("-5") is None


# -- document types ---------------------------------------------------------------------
#: a PROPFIND answer declaring entities: one that renames the entry (expat reads it
#: unless refused), and a billion laughs (expat 2.5 stops it by its own limit)
LAUGHS = "".join(f'<!ENTITY l{n} "{f"&l{n - 1};" * 10}">' for n in range(1, 10))
DECLARING = {
    "entity": '<!DOCTYPE D:multistatus [<!ENTITY name "planted">]>',
    "billion laughs": f'<!DOCTYPE D:multistatus [<!ENTITY l0 "lol">{LAUGHS}]>',
}


@pytest.mark.parametrize("declaration", list(DECLARING))
def test_an_answer_declaring_a_document_type_is_a_bad_answer(hostile, declaration):
    """A server's XML answer with a DOCTYPE (entity declarations) is refused before
    any declaration is read: the stat and the listing are a bad answer naming the door."""
    last = "&l9;" if declaration == "billion laughs" else "&name;"

    def answer(request: Request) -> Reply | None:
        if request.method != "PROPFIND":
            return None
        head, _, rest = ONE.partition("<D:multistatus")
        href = f"{request.path.rstrip('/')}/{last}"
        body = head + DECLARING[declaration] + "<D:multistatus" + rest.format(
            href=href, props="<D:getcontentlength>5</D:getcontentlength>")
        return Reply(207, {"Content-Type": "application/xml"}, body.encode())

    door = hostile.open_door(answer)
    for error in _stat_and_ls_refused(hostile, door):
        assert "declares a document type" in error.message
        assert f"127.0.0.1:{door.port}" in str(error)
