"""What a dCache door does that a site notices after an upgrade: checks that provoke
the behaviours by which dCache releases differ (issue 24), each judged by the
version's thresholds file like every other check (a difference of a release is a
``[known_issues]`` entry of its file quoting the answer seen; the check then reports
XFAIL on that release and passes on the others).

- ``test_bad_logins_do_not_block_a_correct_client``: a few wrong-password requests
  (an expired password or proxy in a batch of jobs) must not lock a correctly
  logged-in client on the same host out. Measured: the answers to the bad logins,
  how many times the correct client was answered 429/503 and how long it was held.
  dCache 11.2's WebDAV request limiter (on by default) blocks an address for 10 s
  after more than 3 authentication errors in 20 s; 10.2 has none.
- ``test_prepare_stage``: a stage request (``kXR_prepare`` with the stage flag, what
  ``xrdfs prepare -s`` and FTS send before reading from tape) is accepted by the
  xrootd door. dCache 11.2's door answers it Unsupported; 10.2's accepts it.

Isolation: the bad logins block the address they come from. Against a door on
loopback (the embedded dCache) they, and the correct client, come from a loopback
address of their own (``127.0.0.2``), so no other check of the run is throttled;
against a remote door they come from this host, so the check waits until the door
serves its correct client again before it ends and runs last in its process (other
xdist workers' requests in those seconds are waited out and counted as
``throttled``, not ``failed``). Doors that do not take a password login (the Apache
and XrdHttp stand-ins' X.509) skip the check, saying why; so do doors of another
protocol.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import shutil
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

import pytest

from ..conformance import ConformanceChecks
from ..conformance.checks import Place, fail, payload

pytestmark = pytest.mark.storagescale_system("dcache")

#: wrong-password requests, each on a connection of its own (dCache counts one
#: connection's failed logins once); dCache 11.2 blocks after more than 3 in 20 s
BAD_LOGINS = 5
#: the most the correct client waits for the door to serve it again (s): dCache 11.2
#: blocks for 10 s
HOLD_LIMIT_S = 60.0
#: the wait between the correct client's tries when the door says no Retry-After (s)
RETRY_WAIT_S = 0.5
#: the answers by which a door tells a client to come back later
THROTTLED = frozenset({429, 503})
#: the loopback address the bad logins come from when the door is on loopback
OWN_LOOPBACK = "127.0.0.2"


@dataclass
class Held:
    """What the correct client met after the bad logins."""

    #: the status of each wrong-password request
    bad_logins: list[int] = field(default_factory=list)
    #: the correct client's throttled answers (429, or 503), and their Retry-After
    throttled: int = 0
    retry_after: set[str] = field(default_factory=set)
    #: from the correct client's first request to its answer (s)
    held_s: float = 0.0
    #: the status that ended the wait (0: none within HOLD_LIMIT_S)
    status: int = 0

    def describe(self) -> str:
        logins = (f"after {len(self.bad_logins)} wrong-password requests (answered "
                  f"{', '.join(map(str, self.bad_logins))}), the correct client's request")
        if not self.throttled:
            return (f"{logins} was answered {self.status or 'nothing'} at once, in "
                    f"{self.held_s:.1f} s, never throttled")
        said = (f"Retry-After {', '.join(sorted(self.retry_after))}" if self.retry_after
                else "no Retry-After")
        return (f"{logins} was answered HTTP 429/503 {self.throttled} time"
                f"{'' if self.throttled == 1 else 's'} ({said}) and held {self.held_s:.1f} s "
                f"before its answer {self.status or 'never came'}")


class HTTPDoorLogin:
    """Requests to an HTTP door with a chosen password, from a chosen source address."""

    def __init__(self, place: Place) -> None:
        endpoint = place.door.spec.endpoint
        parts = urlsplit(endpoint.url)
        self.host, self.port = endpoint.host, endpoint.port or 443
        self.user = unquote(parts.username or "")
        self.password = unquote(parts.password or "")
        self.secure = endpoint.scheme in ("davs", "https")
        ca_dir = place.door.spec.options.get("ca_dir")
        self.context = (ssl.create_default_context(capath=ca_dir or None)
                        if self.secure else None)
        self.path = quote(place.folder)
        self.timeout = place.door.timeout
        self.source = _own_loopback(self.host, self.port)

    def propfind(self, password: str) -> http.client.HTTPResponse:
        """A PROPFIND (depth 0) of the check's folder on a new connection: its status
        and headers (the body is not read, so a door cannot make it long)."""
        token = base64.b64encode(f"{self.user}:{password}".encode()).decode()
        source = (self.source, 0) if self.source else None
        if self.secure:
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                self.host, self.port, context=self.context, timeout=self.timeout,
                source_address=source)
        else:
            connection = http.client.HTTPConnection(self.host, self.port,
                                                    timeout=self.timeout,
                                                    source_address=source)
        try:
            connection.request("PROPFIND", self.path, headers={
                "Authorization": f"Basic {token}", "Depth": "0"})
            return connection.getresponse()
        finally:
            connection.close()

    def held(self) -> Held:
        """Bad logins, then the correct client's request sent until it is served."""
        seen = Held(bad_logins=[self.propfind("not-" + self.password).status
                                for _ in range(BAD_LOGINS)])
        started = time.monotonic()
        while time.monotonic() - started < HOLD_LIMIT_S:
            answer = self.propfind(self.password)
            if answer.status not in THROTTLED:
                seen.status = answer.status
                break
            seen.throttled += 1
            said = answer.getheader("Retry-After")
            if said:
                seen.retry_after.add(said)
            time.sleep(_seconds(said) or RETRY_WAIT_S)
        seen.held_s = time.monotonic() - started
        return seen


def _seconds(retry_after: str | None) -> float:
    """A Retry-After in seconds (an HTTP date or nonsense: the default wait)."""
    try:
        return min(float(retry_after or 0), HOLD_LIMIT_S / 4)
    except ValueError:
        return 0.0


def _own_loopback(host: str, port: int) -> str | None:
    """``OWN_LOOPBACK`` when the door is on loopback and a connection from it reaches
    the door (the bad logins then block that address only), else None (this host's)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port, socket.AF_INET)}
    except OSError:
        return None
    if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        return None
    try:
        socket.create_connection((next(iter(addresses)), port), timeout=10,
                                 source_address=(OWN_LOOPBACK, 0)).close()
    except OSError:
        return None
    return OWN_LOOPBACK


class TestDCacheBehaviour(ConformanceChecks):
    """Checks that provoke what dCache releases do differently, over every door."""

    def test_bad_logins_do_not_block_a_correct_client(self, place: Place,
                                                       record_property) -> None:
        """Wrong passwords from a host (one job's expired credentials) must not lock a
        correct client of the same host out: it is served at once, not answered 429.
        The figures go to the JUnit XML too (``bad_logins``, ``throttled``,
        ``held_s``)."""
        if not place.door.is_http:
            # one reason for every door it skips (the test id names the door): one line
            pytest.skip("not a WebDAV door: bad logins are sent as HTTP Basic logins")
        door = HTTPDoorLogin(place)
        if not door.password:
            pytest.skip(f"{place.door.name} door: it takes no password login here (its "
                        f"URL carries no user:password), so no login can be wrong")
        seen = door.held()
        where = (f"from {door.source} (a loopback address of the check's own)"
                 if door.source else "from this host")
        print(f"{place.door.name} door, {where}: {seen.describe()}")
        record_property("bad_logins", " ".join(map(str, seen.bad_logins)))
        record_property("throttled", seen.throttled)
        record_property("held_s", round(seen.held_s, 2))
        if seen.status == 0 or seen.status >= 400:
            fail(place.door, "PROPFIND with the right password", place.folder,
                 f"{seen.describe()} ({HOLD_LIMIT_S:.0f} s at most)",
                 "an answer to the correct client")
        if seen.throttled:
            fail(place.door, "PROPFIND with the right password", place.folder,
                 f"throttled it: {seen.describe()}", "the correct client served at once "
                 "(bad logins of another client do not block it)")

    def test_prepare_stage(self, place: Place, record_property) -> None:
        """A stage request (kXR_prepare with the stage flag: ``xrdfs prepare -s``, what
        FTS sends before a read from tape) for a file on disk is accepted."""
        if not place.door.is_xrootd:
            pytest.skip("not an XRootD door: kXR_prepare is an XRootD request")
        xrdfs = shutil.which("xrdfs")
        if xrdfs is None:
            pytest.skip("xrdfs (XRootD's client) is not on PATH: install xrootd-client")
        path = place.put("staged.dat", payload(1000))
        url = urlsplit(place.door.url(path))
        try:  # XRootD's own client: the Python bindings 5.5 abort the process on an answer
            done = subprocess.run([xrdfs, f"{url.scheme}://{url.netloc}", "prepare", "-s",
                                   path], capture_output=True, text=True,
                                  timeout=place.door.timeout)
        except subprocess.TimeoutExpired:
            fail(place.door, "prepare -s (kXR_prepare, stage)", path,
                 f"gave no answer within {place.door.timeout:.0f} s", "a request id")
        said = " ".join((done.stdout + done.stderr).replace("\0", " ").split())
        print(f"{place.door.name} door: xrdfs prepare -s: exit {done.returncode}: {said}")
        record_property("prepare_answer", f"exit {done.returncode}: {said}")
        if done.returncode != 0:
            fail(place.door, "prepare -s (kXR_prepare, stage)", path,
                 f"answered {said!r} (xrdfs exit {done.returncode})",
                 "the stage request accepted (a request id)")
