"""HTTP/WebDAV driver (libcurl through pycurl) for ``davs://``, ``https://``, ``dav://``
and ``http://`` doors: dCache's WebDAV door, XrdHttp, EOS, Apache mod_dav.

Chosen by measurement (docs/benchmarks.md, "HTTP clients"): a libcurl easy handle
per client releases the GIL for the whole request, costs a fraction of the CPU of
the pure-Python clients per request, and keeps up with h2load on the same door.

**One client, one connection.** A driver instance is one client: one easy handle
with its own connection, kept alive between requests, and its own TLS session cache,
so a connection the server closed is made again with a resumed TLS session. When
the session's own connections are used from several threads at once (the set-up
uploads in parallel) each thread gets a handle of its own.

**TLS** is always verified: against the grid CA folder (a hashed directory) of the
driver option ``ca_dir``, else ``$X509_CERT_DIR``, else
``/etc/grid-security/certificates`` -- never switched off. **Credentials**: an RFC
3820 proxy or a plain certificate in one PEM file (``x509_proxy``, else
``$X509_USER_PROXY``), or a certificate and key in two files (``x509_user_cert``
and ``x509_user_key``, else ``$X509_USER_CERT``/``$X509_USER_KEY``); a bearer token
(``token``, else ``$BEARER_TOKEN``, else the file ``$BEARER_TOKEN_FILE``), sent as
``Authorization: Bearer`` and never shown; or ``user:password@`` in the URL (basic
authentication). Over plain ``http://`` no credential is sent (a ``token`` option
there is a usage error).

**Every request has a deadline** (the driver's timeout, connection included).
**Checksums**: downloads ask for ``Want-Digest: adler32`` and compare the server's
``Digest`` with the adler32 of the bytes received; uploads compare the adler32 of
the data with the one the server gives after the upload (a ``HEAD``), as gfal2 and
``gfal-copy -K`` do; a mismatch is an error naming both values, and a server that
offers no adler32 is not asked again by that client. Driver option ``checksum``:
``auto`` (the default) verifies on every door except XrdHttp (known from its
``Server`` header), where xrootd 5.5 crashes when checksums are asked for right
after uploads under load (xrootd/xrootd#2534) and announces a stale adler32 after an
overwrite within the same second; ``adler32`` verifies there too; ``none`` never.

**Deleting is careful**: a WebDAV ``DELETE`` of a collection is recursive on most
servers, and the plugin's clean-up relies on ``rmdir`` refusing a directory that has
entries. So :meth:`HTTPDriver._rmdir` lists the directory first (``PROPFIND Depth:
1``) and refuses one with entries (``not_empty``, as every driver does); only an
empty one is deleted. The window between the listing and the ``DELETE`` is a race:
an entry another client creates in it meanwhile is deleted with it (only inside the
run's own directory: every mutating call is guarded). A file is deleted with
``Depth: 0``, which a server such as Apache refuses for a collection.

**Redirects**: a read (``GET``, ``HEAD``, ``PROPFIND``) follows a redirect anywhere the
TLS trust allows (libcurl, at most 5; only to ``https://`` from an ``https`` door). A
mutating request (``PUT``, ``DELETE``, ``MKCOL``, ``MOVE``, ``COPY``, ``PROPPATCH``...)
follows one only to the same path (decoded, no ``.`` or ``..`` segment) on another
server, as a dCache door sends a client to its pool; anything else is refused, never
followed (:class:`~pytest_storagescale.errors.RedirectRefused`, ``redirect_refused``,
naming the ``Location``). Credentials go to the door only: on a redirect to another
scheme, host or port neither the ``Authorization`` header (token) nor ``user:password``
is sent (libcurl's own rule for reads: ``UNRESTRICTED_AUTH`` is never set; the same rule
here for mutating requests); the client certificate is presented to whichever server
the TLS trust accepts. Each followed redirect is counted (:attr:`HTTPDriver.redirects`,
with the door's share of the time in :attr:`HTTPDriver.door_seconds`). A ``PUT`` sends
no ``Content-Type`` (dCache's pool refuses one with 501) and, to a dCache door,
``Expect: 100-continue``, on which the door redirects the upload to its pool.

**Throttling**: a 429, or a 503 with ``Retry-After``, is waited out (``Retry-After``,
else 1 s) and the request sent again, while the waits end within half its deadline
(at most 20 sends); past that it is
:class:`~pytest_storagescale.errors.StorageThrottled` (``throttled``), which a load
step counts as ``throttled``, not ``failed`` (docs/drivers.md).

**Answers are bounded**: a metadata answer (a stat, the answer to a mutating request,
an error page) is read up to :data:`ANSWER_LIMIT` (4 MiB), a listing (``PROPFIND
Depth: 1``) and a third-party copy's markers up to :data:`LISTING_LIMIT` (64 MiB);
a longer answer is aborted as ``bad_answer``. A listing is parsed as it arrives (an
incremental XML parser), keeping each entry's name and kind, never the answer. Every
field read from an answer (sizes, dates, checksums, byte ranges) is checked: a
malformed one is ``bad_answer`` (:class:`~pytest_storagescale.errors.BadAnswer`).

**Third-party copy** (HTTP TPC, WebDAV ``COPY``; XrdHttpTPC, dCache, EOS):
:meth:`HTTPDriver.pull` sends ``COPY`` to the destination with a ``Source:`` header,
:meth:`HTTPDriver.push` sends it to the source with a ``Destination:`` header; the
other server's credential (a bearer token) is forwarded in
``TransferHeaderAuthorization`` and ``Credential: none`` asks for no delegation. The
server answers at once and streams performance markers while it copies; the copy's
outcome is the body's last line (``success: ...``, ``failure: ...``), not the status
code. The whole ``COPY`` has the driver's deadline.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import functools
import os
import re
import threading
import time
import zlib
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, ClassVar, NamedTuple
from urllib.parse import quote, unquote, urlsplit
from xml.etree import ElementTree

import pycurl

from ..errors import (
    BadAnswer,
    RedirectRefused,
    StorageError,
    StorageNotFound,
    StoragePermissionDenied,
    StorageScaleUsageError,
    StorageThrottled,
    StorageTimeout,
    StorageUnreachable,
)
from ..redact import redact_text
from . import xmlsafe
from .base import Driver, StatInfo
from .url import HTTP_SCHEMES, HTTPS_SCHEMES
from .version import (
    DEFAULT_CA_DIR,
    LISTING_READ,
    names_xrootd_without_version,
    unknown_xrootd_version,
    version_from_listing,
    version_from_server_header,
)

_DAV = "{DAV:}"
_TIMEOUT_CODES = {pycurl.E_OPERATION_TIMEDOUT}
_UNREACHABLE_CODES = {
    pycurl.E_COULDNT_CONNECT, pycurl.E_COULDNT_RESOLVE_HOST, pycurl.E_GOT_NOTHING,
    pycurl.E_RECV_ERROR, pycurl.E_SEND_ERROR, pycurl.E_COULDNT_RESOLVE_PROXY,
}
#: the server's certificate did not verify against the CA folder
_SERVER_CERT_CODES = {
    pycurl.E_PEER_FAILED_VERIFICATION, pycurl.E_SSL_CACERT, pycurl.E_SSL_CACERT_BADFILE,
    pycurl.E_SSL_ISSUER_ERROR, pycurl.E_SSL_CRL_BADFILE, pycurl.E_SSL_PEER_CERTIFICATE,
    pycurl.E_SSL_INVALIDCERTSTATUS,
}
#: the handshake failed otherwise (the server refused the client's certificate...)
_HANDSHAKE_CODES = {pycurl.E_SSL_CONNECT_ERROR, pycurl.E_SSL_CIPHER}
_CLIENT_CERT_CODES = {pycurl.E_SSL_CERTPROBLEM, pycurl.E_SSL_ENGINE_SETFAILED}
_TIMEOUT_STATUSES = {408, 504}
_PERMISSION_STATUSES = {401, 403}
_NOT_FOUND_STATUSES = {404, 410}
_OK_STATUSES = frozenset(range(200, 300))
#: a redirect: a mutating request's is followed here, by the same-path rule
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: the methods that change the storage: redirected only to the same path
_MUTATING_METHODS = frozenset({"PUT", "DELETE", "MKCOL", "MOVE", "COPY", "PROPPATCH",
                               "LOCK", "UNLOCK", "POST", "PATCH"})
_MAX_REDIRECTS = 5
#: a PUT's own headers: no Content-Type (libcurl would send a form's; dCache's pool
#: answers any Content-* header it does not know with 501 "Content-Type is not
#: implemented")
_PUT_HEADERS = ("Content-Type:",)
#: and to a dCache door: on Expect: 100-continue it redirects the upload to its pool
#: before the body is sent; without, it takes the body and proxies it to the pool.
#: (libcurl asks for 100-continue itself above 1 MiB; below, XrdHttp 5.5 closed the
#: connection after such a PUT)
_DCACHE_PUT_HEADERS = (*_PUT_HEADERS, "Expect: 100-continue")
#: the statuses by which a server tells a client to come back later: 429 Too Many
#: Requests (RFC 6585; dCache 11.2's WebDAV request limiter), 503 with ``Retry-After``
_THROTTLE_STATUSES = frozenset({429, 503})
#: the wait before a throttled request is sent again when no Retry-After was read (s)
THROTTLE_WAIT = 1.0
#: the share of a request's deadline (the driver's timeout, a load client's hang
#: timeout plus a margin) its waits on throttled answers may end within
THROTTLE_SHARE = 0.5
#: the most sends of one throttled request
THROTTLE_SENDS = 20
#: the most a metadata answer (a stat, a mutating request's answer, an error page) may
#: hold; a longer one is aborted as bad_answer
ANSWER_LIMIT = 4 * 1024 * 1024
#: the most a listing (read as it arrives) or a third-party copy's markers may hold
LISTING_LIMIT = 64 * 1024 * 1024
#: a stat answer up to this size is remembered by its bytes (the fast reading)
_REMEMBERED_ANSWER = 8192
#: a size or byte offset: ASCII digits that fit 64 bits
_NUMBER = re.compile(r"[0-9]{1,19}")
_HEX_VALUE = re.compile(r"[0-9a-f]{1,128}")
#: checksum algorithms whose Digest value is hex (RFC 3230 registry); others are base64
_HEX_DIGESTS = {"adler32", "crc32c", "unixcksum"}
_BUFFER = 512 * 1024
#: the Server header of each door (``davs://host:port``) this process has seen answer
_DOOR_SERVERS: dict[str, str] = {}
#: the fast reading of a one-entry 207 answer (stat): any namespace prefix
_TAG = rb"<(?:[\w.-]+:)?"
_LENGTH = re.compile(_TAG + rb"getcontentlength(?:\s[^>]*)?(?<!/)>([^<]*)<")
_MODIFIED = re.compile(_TAG + rb"getlastmodified(?:\s[^>]*)?(?<!/)>([^<]*)<")
_COLLECTION = re.compile(_TAG + rb"resourcetype[^>/]*>\s*" + _TAG + rb"collection\b")


#: a COPY answered with one of these: the server has no third-party copy; or with 400
#: and one of the words (XrdHttp without XrdHttpTPC: 400 "Request unknown")
_NO_TPC_STATUSES = {405, 501}
_NO_TPC_WORDS = ("request unknown", "not supported", "not allowed", "unknown method")
#: what the last line of a COPY answer starts with when the copy did not succeed
_TPC_FAILURES = ("failure", "failed", "aborted")
_STRIPE_BYTES = re.compile(r"Stripe Bytes Transferred:\s*(\S+)", re.IGNORECASE)


class CopyOutcome(NamedTuple):
    """What a ``COPY`` (HTTP third-party copy) answered."""

    #: HTTP status of the answer
    status: int
    #: the body's last line: ``success: Created``
    outcome: str
    #: performance markers the server sent while copying
    markers: int
    #: bytes the last marker reported (None: no marker)
    bytes_reported: int | None


class _Settings:
    """What a handle is set to now: a request like the last one sets nothing again."""

    __slots__ = ("path", "method", "headers", "body", "headed")

    def __init__(self) -> None:
        #: the handle's URL is the driver's door and this path
        self.path: str | None = None
        self.method: str | None = None
        self.headers: list[str] | None = None
        self.body: bytes | None = None
        #: a header callback is set (it cannot be unset: only a reset removes it)
        self.headed = False


class Body:
    """What a request answered: status, headers asked for, body or its size."""

    __slots__ = ("status", "headers", "chunks", "counted", "adler32", "keep", "digest",
                 "writer", "limit", "overflow")

    def __init__(self, keep: bool = True, digest: bool = False, limit: int = 0) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        #: bytes :meth:`write` received (a body only kept is counted when asked)
        self.counted = 0
        self.adler32 = 1
        self.keep = keep
        self.digest = digest
        #: the most the body may hold (0: no limit); more aborts the transfer
        self.limit = limit
        #: the body was longer than the limit (the transfer was aborted)
        self.overflow = False
        #: what libcurl hands the body to: the list's own append (no Python frame per
        #: chunk) when the body is only kept
        self.writer = (self.bounded if limit else
                       self.chunks.append if keep and not digest else self.write)

    def bounded(self, chunk: bytes) -> int | None:
        """Keep ``chunk`` while the body stays within its limit; else abort (a write
        callback's 0 ends libcurl's transfer with CURLE_WRITE_ERROR)."""
        self.counted += len(chunk)
        if self.counted > self.limit:
            self.overflow = True
            return 0
        self.chunks.append(chunk)
        return None

    def reset(self) -> None:
        """Forget the body received (a redirect's), for the next answer."""
        self.chunks.clear()
        self.counted = 0
        self.adler32 = 1

    def write(self, chunk: bytes) -> None:
        self.counted += len(chunk)
        if self.digest:
            self.adler32 = zlib.adler32(chunk, self.adler32)
        if self.keep:
            self.chunks.append(chunk)

    def header(self, line: bytes) -> None:
        name, sep, value = line.decode("latin-1").partition(":")
        if sep:
            self.headers[name.strip().lower()] = value.strip()
        elif line.startswith(b"HTTP/"):  # a new answer (after 100 Continue, a redirect)
            self.headers.clear()

    def too_long(self) -> str:
        """What the answer exceeded, once :attr:`overflow`."""
        return f"longer than {self.limit:,} bytes, the most read for such a request"

    @property
    def size(self) -> int:
        """Bytes received."""
        return (sum(map(len, self.chunks)) if self.keep and not self.digest and not self.limit
                else self.counted)

    @property
    def data(self) -> bytes:
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Listing(Body):
    """A ``PROPFIND Depth: 1`` answer of directory ``own`` read as it arrives: an
    incremental XML parser reads each ``response`` and drops it, keeping the entry's
    name (``own``'s own entry: whether it is a directory), so a listing costs its
    names, not its answer. The first bytes are kept for an error
    page's words; the whole answer is bounded by ``limit``, one entry by
    :data:`ANSWER_LIMIT` (the parser holds an entry whole until it ends)."""

    __slots__ = ("parser", "own", "own_is_dir", "names", "root", "failure", "entry_began")

    #: what is kept of the answer's bytes (an error page's words)
    HEAD = 2000

    def __init__(self, own: str, limit: int = LISTING_LIMIT) -> None:
        super().__init__(limit=limit)
        # start and end events: read_events gives Elements (typeshed: or namespace pairs)
        self.parser: Any = xmlsafe.PullParser()
        self.own = "/" + own.strip("/")
        self.own_is_dir = False
        #: the names of the entries but ``own``'s, in the answer's order
        self.names: list[str] = []
        self.root: ElementTree.Element | None = None
        #: why the answer could not be read (None: it could, so far)
        self.failure: str | None = None
        #: bytes received when the last entry ended
        self.entry_began = 0
        self.writer = self.feed

    def reset(self) -> None:
        """Forget what was read (a throttled answer's page), for the next answer."""
        super().reset()
        self.parser = xmlsafe.PullParser()
        self.own_is_dir = False
        self.names = []
        self.root = None
        self.failure = None
        self.entry_began = 0

    def too_long(self) -> str:
        if self.counted - self.entry_began > ANSWER_LIMIT:
            return f"with an entry longer than {ANSWER_LIMIT:,} bytes, the most read for one"
        return super().too_long()

    def feed(self, chunk: bytes) -> int | None:
        self.counted += len(chunk)
        if self.counted > self.limit or self.counted - self.entry_began > ANSWER_LIMIT:
            self.overflow = True
            return 0
        if self.counted - len(chunk) < self.HEAD:
            self.chunks.append(chunk[:self.HEAD])
        if self.failure is None:
            try:
                self.parser.feed(chunk)
                self._read_events()
            except (ElementTree.ParseError, _Malformed) as exc:
                self.failure = str(exc)
        return None

    def _read_events(self) -> None:
        for event, element in self.parser.read_events():
            if event == "start":
                if self.root is None:
                    self.root = element
            elif element.tag == f"{_DAV}response":
                href, info = _entry(element)
                href = href.rstrip("/")
                if href in (self.own, ""):
                    self.own_is_dir = self.own_is_dir or info.is_dir
                else:
                    self.names.append(href.rpartition("/")[2])
                self.entry_began = self.counted
                element.clear()
                root = self.root
                if root is not None and len(root) and root[-1] is element:
                    del root[-1]  # the answer's element is gone: memory stays flat

    def finish(self) -> str | None:
        """After the transfer: why the answer could not be read, or None."""
        if self.failure is None:
            try:
                self.parser.close()
                self._read_events()
            except (ElementTree.ParseError, _Malformed) as exc:
                self.failure = str(exc)
        return self.failure


class HTTPDriver(Driver):
    """One HTTP/WebDAV client: one kept-alive connection (libcurl easy handle)."""

    name = "http"
    schemes = HTTP_SCHEMES
    protocol_family = "http"
    option_names = ("ca_dir", "x509_proxy", "x509_user_cert", "x509_user_key", "token",
                    "checksum")
    secret_options = ("token",)
    #: the door's connection, and one to a data server the door redirects to
    files_per_client = 2
    #: nothing goes into the environment: every setting is the handle's own
    option_environment: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        ca_dir = options.get("ca_dir")
        if ca_dir and not os.path.isdir(ca_dir):
            raise StorageScaleUsageError(
                f"--storage-driver-option ca_dir={ca_dir}: no such folder. It is the grid CA "
                f"folder (hashed, like {DEFAULT_CA_DIR}) the server's certificate is "
                f"checked against.")
        for key in ("x509_proxy", "x509_user_cert", "x509_user_key"):
            path = options.get(key)
            if path and not os.access(path, os.R_OK):
                raise StorageScaleUsageError(
                    f"--storage-driver-option {key}={path}: not a readable file. Give the "
                    f"PEM file (a proxy holds certificate, key and chain in one file).")
        if options.get("checksum", "auto").lower() not in ("auto", "adler32", "none"):
            raise StorageScaleUsageError(
                f"--storage-driver-option checksum={options['checksum']}: valid values are "
                f"auto (verify uploads and downloads, except on XrdHttp doors: the default), "
                f"adler32 (verify on every door) and none.")

    def __init__(self, endpoint, **kwargs) -> None:
        super().__init__(endpoint, **kwargs)
        secure = endpoint.scheme in HTTPS_SCHEMES
        if not secure and self.options.get("token"):
            raise StorageScaleUsageError(
                f"--storage-driver-option token: a token is never sent over "
                f"{endpoint.scheme}:// (in clear text). Use davs:// or https:// for "
                f"{endpoint.host}.")
        port = f":{endpoint.port}" if endpoint.port else ""
        self._base = f"{'https' if secure else 'http'}://{endpoint.host}{port}"
        self._secure = secure
        self._timeout_ms = max(1, int(self.timeout * 1000))
        self.ca_dir = (self.options.get("ca_dir") or os.environ.get("X509_CERT_DIR")
                       or DEFAULT_CA_DIR)
        #: adler32: verify transfers; none: never; auto: unless the door is XrdHttp
        self._checksum_mode = self.options.get("checksum", "auto").lower()
        self._verify = self._checksum_mode != "none"
        auth = [f"Authorization: Bearer {token}"] if secure and (token := self._token()) else []
        self._propfind_headers = {
            # no body: all properties (RFC 4918), the request h2load and the bare loops send
            depth: [*auth, f"Depth: {depth}"]
            for depth in ("0", "1")}
        self._auth = auth
        #: idle handles, each with what its settings are now
        self._idle: list[tuple[pycurl.Curl, _Settings]] = []
        self._closed = False
        self._checksums: dict[int, tuple[bytes, str]] = {}
        self._checksums_lock = threading.Lock()
        #: the door throttled this client once: read Retry-After from every answer
        self._read_retry_after = False
        #: redirects this client followed (a dCache door sends each transfer to a pool),
        #: and the seconds its requests spent before their last server answered
        #: (the door's share of a redirected request's latency)
        self.redirects = 0
        self.door_seconds = 0.0

    def __repr__(self) -> str:
        return f"<HTTPDriver {self.endpoint.display} client {self.client_id}>"

    # -- credentials and handles -------------------------------------------------
    def _token(self) -> str | None:
        token = self.options.get("token") or os.environ.get("BEARER_TOKEN")
        if not token and os.environ.get("BEARER_TOKEN_FILE"):
            try:
                with open(os.environ["BEARER_TOKEN_FILE"]) as stream:
                    token = stream.read()
            except OSError:
                token = None
        return token.strip() if token else None

    def _certificate(self) -> tuple[str | None, str | None]:
        """The client certificate and key files, when one is configured."""
        options = self.options
        if options.get("x509_proxy"):
            return options["x509_proxy"], options["x509_proxy"]
        if options.get("x509_user_cert"):
            return options["x509_user_cert"], options.get("x509_user_key")
        if os.environ.get("X509_USER_PROXY"):
            return os.environ["X509_USER_PROXY"], os.environ["X509_USER_PROXY"]
        return os.environ.get("X509_USER_CERT"), os.environ.get("X509_USER_KEY")

    def _new_handle(self) -> pycurl.Curl:
        return self._configure(pycurl.Curl())

    def _configure(self, handle: pycurl.Curl, login: bool = True) -> pycurl.Curl:
        """The handle's settings for every request; ``login``: with the URL's
        ``user:password`` (not for another server a request is redirected to)."""
        handle.setopt(pycurl.NOSIGNAL, 1)
        handle.setopt(pycurl.TIMEOUT_MS, self._timeout_ms)
        handle.setopt(pycurl.CONNECTTIMEOUT_MS, self._timeout_ms)
        handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        handle.setopt(pycurl.MAXCONNECTS, self.files_per_client)
        handle.setopt(pycurl.FOLLOWLOCATION, 1)
        handle.setopt(pycurl.MAXREDIRS, 5)
        handle.setopt(pycurl.POSTREDIR, pycurl.REDIR_POST_ALL)  # a PUT keeps its body
        # a read is redirected only where TLS still protects it (never https -> http)
        handle.setopt(pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTPS if self._secure
                      else pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        handle.setopt(pycurl.BUFFERSIZE, _BUFFER)
        handle.setopt(pycurl.USERAGENT, f"pytest-storagescale/{self.client_id}")
        if self._secure:
            handle.setopt(pycurl.SSL_VERIFYPEER, 1)
            handle.setopt(pycurl.SSL_VERIFYHOST, 2)
            handle.setopt(pycurl.CAPATH, self.ca_dir)
            handle.unsetopt(pycurl.CAINFO)  # the grid CA folder only, not the system bundle
            cert, key = self._certificate()
            if cert:
                handle.setopt(pycurl.SSLCERT, cert)
                handle.setopt(pycurl.SSLCERTTYPE, "PEM")
                handle.setopt(pycurl.SSLKEY, key or cert)
            parts = urlsplit(self.endpoint.url)
            if parts.username and login:
                handle.setopt(pycurl.USERNAME, unquote(parts.username))
                handle.setopt(pycurl.PASSWORD, unquote(parts.password or ""))
        return handle

    def _url(self, path: str) -> str:
        return self._base + _quoted(path)

    def _request(self, method: str, path: str, *, headers: list[str] | None = None,
                 body: bytes | None = None, sink: Body | None = None,
                 want_headers: bool = False, operation: str = "",
                 limit: int = ANSWER_LIMIT) -> Body:
        """One request on this client's connection, within the deadline; its answer
        read up to ``limit`` bytes (0: no limit) unless ``sink`` says otherwise. A
        mutating request's redirect is followed only to the same path
        (:meth:`_follow`). A throttled answer (429, or 503 with ``Retry-After``) is
        waited out and the request sent again, within :meth:`_throttle_wait`'s bound;
        past it the request ends as :class:`~pytest_storagescale.errors.StorageThrottled`."""
        began = time.monotonic()
        read = want_headers or self._read_retry_after
        answer = self._send(method, path, headers, body, sink, read, operation, limit)
        sends = 1
        while answer.status in _THROTTLE_STATUSES:
            wait = self._throttle_wait(answer, read, began, sends, operation or method.lower(),
                                       path)
            if wait is None:
                break  # a 503 without Retry-After: its status says it
            if self.pause(wait):  # the step stopped (Ctrl-C, its end): not sent again
                raise StorageThrottled(
                    f"the server throttled the request (HTTP {answer.status}) and the step "
                    f"stopped while it waited to send it again: not sent again",
                    error_class="throttled", **self._kwargs(operation or method.lower(),
                                                            path, f"HTTP {answer.status}"))
            if sink is not None:
                sink.reset()
            read = True
            answer = self._send(method, path, headers, body, sink, read, operation, limit)
            sends += 1
        return answer

    def _throttle_wait(self, answer: Body, read: bool, began: float, sends: int,
                       operation: str, path: str) -> float | None:
        """How long to wait before sending a throttled request again: its
        ``Retry-After`` (seconds or an HTTP date), else :data:`THROTTLE_WAIT` (a 429
        without one, or an answer whose headers were not read: this client reads them
        on every request from then on). None: a 503 without ``Retry-After`` (not
        throttling). :class:`~pytest_storagescale.errors.StorageThrottled` when the
        wait would end after :data:`THROTTLE_SHARE` of the request's deadline (for a
        load client, half its hang timeout) counted from its first send, or after
        :data:`THROTTLE_SENDS` sends."""
        self._read_retry_after = True
        value = answer.headers.get("retry-after") if read else None
        if read and value is None and answer.status == 503:
            return None
        wait = _retry_after(value) if value is not None else None
        wait = THROTTLE_WAIT if wait is None else wait
        left = began + self.timeout * THROTTLE_SHARE - time.monotonic()
        if wait <= left and sends < THROTTLE_SENDS:
            return wait
        said = (f"Retry-After {value.strip()[:40]!r}" if value is not None
                else "no Retry-After")
        why = (f"waiting {wait:g} s more would pass {THROTTLE_SHARE:.0%} of its "
               f"{self.timeout:g} s deadline" if sends < THROTTLE_SENDS
               else f"sent {THROTTLE_SENDS} times")
        raise StorageThrottled(
            f"the server throttled the request (HTTP {answer.status}, {said}) {sends} "
            f"time{'s' if sends > 1 else ''}; {why}: given up, counted as throttled",
            error_class="throttled",
            **self._kwargs(operation, path, f"HTTP {answer.status}"))

    def _send(self, method: str, path: str, headers: list[str] | None, body: bytes | None,
              sink: Body | None, want_headers: bool, operation: str, limit: int) -> Body:
        """One request sent once (:meth:`_request`)."""
        answer = sink or Body(limit=limit)
        refused: StorageError | None = None
        try:  # list.pop is atomic: threads sharing this driver each get their own handle
            handle, settings = self._idle.pop()
        except IndexError:
            handle, settings = self._new_handle(), _Settings()
        if settings.headed and not want_headers:
            # a header callback cannot be unset, and each header line would take the GIL
            # in the middle of the request: reset the settings (the connection and the
            # TLS session stay with the handle)
            handle.reset()
            self._configure(handle)
            settings = _Settings()
        try:
            if path != settings.path:
                handle.setopt(pycurl.URL, self._url(path))
                settings.path = path
            sent = headers if headers is not None else self._auth
            # the request's settings, unless the last request on the handle had these
            # very objects (held by the settings, so no other object can have their id)
            if (method != settings.method or sent is not settings.headers
                    or body is not settings.body):
                self._set_method(handle, method, sent, body)
                settings.method, settings.headers, settings.body = method, sent, body
            handle.setopt(pycurl.WRITEFUNCTION, answer.writer)
            if want_headers:
                handle.setopt(pycurl.HEADERFUNCTION, answer.header)
                settings.headed = True
            handle.perform()
            answer.status = handle.getinfo(pycurl.RESPONSE_CODE)
            self._count_redirects(handle)
            if answer.status in _REDIRECT_STATUSES and method in _MUTATING_METHODS:
                settings = _Settings()  # following sets the handle otherwise
                refused = self._follow(handle, method, path, sent, body, answer,
                                       want_headers, operation or method.lower())
            if want_headers and self.endpoint.server not in _DOOR_SERVERS:
                _DOOR_SERVERS[self.endpoint.server] = answer.headers.get("server", "")
        except pycurl.error as exc:
            fresh = handle.getinfo(pycurl.NUM_CONNECTS) > 0  # failed on a new connection
            answer.status = answer.status or handle.getinfo(pycurl.RESPONSE_CODE)
            handle.close()  # its connection is in an unknown state
            if answer.overflow:
                raise self._too_long(answer, method, operation or method.lower(),
                                     path) from None
            raise self._curl_error(exc, operation or method.lower(), path, fresh) from None
        if self._closed:
            handle.close()
        else:
            self._idle.append((handle, settings))
        if refused is not None:
            raise refused
        return answer

    def _count_redirects(self, handle: pycurl.Curl) -> None:
        """Count the redirects libcurl followed for the request (a read's)."""
        followed = handle.getinfo(pycurl.REDIRECT_COUNT)
        if followed:
            self.redirects += followed
            self.door_seconds += handle.getinfo(pycurl.REDIRECT_TIME)

    def _follow(self, handle: pycurl.Curl, method: str, path: str, headers: list[str],
                body: bytes | None, answer: Body, want_headers: bool,
                operation: str) -> StorageError | None:
        """Follow the redirects of a mutating request (libcurl does not: it follows
        only reads), each only to the same path, on the door or another server (a
        dCache door sends a transfer to a pool). Another scheme, host or port gets
        neither the ``Authorization`` header nor ``user:password``. Returns the refusal
        (nothing was sent there), or None with ``answer`` the last server's; the
        handle is set for this driver's requests again after."""
        try:
            for _ in range(_MAX_REDIRECTS):
                location = handle.getinfo(pycurl.REDIRECT_URL)
                if not location:
                    return None  # a redirect status without a Location: its status says it
                why = _redirect_refusal(self._base, location, path)
                if why is not None:
                    return RedirectRefused(
                        f"the server redirected {method} to {_shown(location)}, {why}: "
                        f"refused, not followed (a request that changes the storage is "
                        f"redirected only to the same path, on this or another server)",
                        error_class="redirect_refused",
                        **self._kwargs(operation, path, f"HTTP {answer.status}"))
                foreign = _origin(location) != _origin(self._base)
                self.redirects += 1
                self.door_seconds += handle.getinfo(pycurl.TOTAL_TIME)
                handle.reset()
                self._configure(handle, login=not foreign)
                handle.setopt(pycurl.URL, location)
                self._set_method(handle, method, [
                    line for line in headers if not (
                        foreign and line.lower().startswith("authorization:"))], body)
                answer.reset()
                handle.setopt(pycurl.WRITEFUNCTION, answer.writer)
                if want_headers:
                    handle.setopt(pycurl.HEADERFUNCTION, answer.header)
                handle.perform()
                answer.status = handle.getinfo(pycurl.RESPONSE_CODE)
                if answer.status not in _REDIRECT_STATUSES:
                    return None
            return RedirectRefused(
                f"more than {_MAX_REDIRECTS} redirects (the last to "
                f"{_shown(handle.getinfo(pycurl.REDIRECT_URL) or '')}): not followed further",
                error_class="redirect_refused",
                **self._kwargs(operation, path, f"HTTP {answer.status}"))
        finally:
            handle.reset()
            self._configure(handle)

    def _too_long(self, answer: Body, method: str, operation: str, path: str) -> BadAnswer:
        return BadAnswer(
            f"the answer to {method} is {answer.too_long()}: not read further",
            error_class="bad_answer",
            **self._kwargs(operation, path, f"HTTP {answer.status}"))

    @staticmethod
    def _set_method(handle: pycurl.Curl, method: str, headers: list[str],
                    body: bytes | None) -> None:
        handle.setopt(pycurl.HTTPGET, 1)  # resets the method, upload and no-body
        # a mutating request's redirect is checked before it is followed (_follow)
        handle.setopt(pycurl.FOLLOWLOCATION, int(method not in _MUTATING_METHODS))
        if method == "HEAD":
            handle.setopt(pycurl.NOBODY, 1)
        elif body is not None:
            handle.setopt(pycurl.POSTFIELDS, body)
        if method in ("GET", "HEAD"):
            handle.unsetopt(pycurl.CUSTOMREQUEST)
        else:
            handle.setopt(pycurl.CUSTOMREQUEST, method)
        if headers:
            handle.setopt(pycurl.HTTPHEADER, headers)
        else:  # pycurl ignores an empty list: the last request's headers would stay
            handle.unsetopt(pycurl.HTTPHEADER)

    # -- errors -------------------------------------------------------------------
    def _kwargs(self, operation: str, path: str, native: str) -> dict:
        return dict(driver=self.name, endpoint=self.endpoint.server, operation=operation,
                    path=path, native_status=native)

    def _curl_error(self, exc: pycurl.error, operation: str, path: str,
                    fresh: bool = False) -> StorageError:
        code, message = exc.args[0], str(exc.args[1] if len(exc.args) > 1 else exc)
        kwargs = self._kwargs(operation, path, f"curl error {code}")
        # a TLS 1.3 server refuses a client certificate after the client's side of the
        # handshake: its alert ends the first request on the new connection
        # (GnuTLS may instead fail the send: "getpeername() failed with errno 107")
        refused = fresh and code in (pycurl.E_SEND_ERROR, pycurl.E_RECV_ERROR) and (
            "alert" in message.lower() or self._certificate()[0] is not None
            or (self._secure and "getpeername" in message))
        if code in _SERVER_CERT_CODES | _HANDSHAKE_CODES | _CLIENT_CERT_CODES or refused:
            return self._tls_error(code, message, kwargs)
        if code in _TIMEOUT_CODES:
            return StorageTimeout(f"{message} (deadline {self.timeout:g} s)",
                                  error_class="timeout", **kwargs)
        if code in _UNREACHABLE_CODES:
            return StorageUnreachable(message, error_class="unreachable", **kwargs)
        return StorageError(message, error_class=f"curl_{code}", **kwargs)

    def _tls_error(self, code: int, message: str, kwargs: dict) -> StorageError:
        """One paragraph: what failed in the handshake and what to change."""
        cert, key = self._certificate()
        message = message.strip().rstrip(".")
        server_side = (
            f"The server's certificate is checked against the CA folder {self.ca_dir} "
            f"(driver option ca_dir, else $X509_CERT_DIR, else {DEFAULT_CA_DIR}), never "
            f"switched off: install the server's CA there (a hashed folder: openssl rehash "
            f"FOLDER) or point ca_dir at the folder holding it")
        if code in _CLIENT_CERT_CODES or "key or certificate file" in message:
            return StoragePermissionDenied(
                f"the client certificate {cert} (key {key or cert}) cannot be used: {message}. "
                f"Give a PEM proxy (driver option x509_proxy: certificate, key and chain in "
                f"one file) or x509_user_cert and x509_user_key", error_class="tls_client",
                **kwargs)
        if code in _SERVER_CERT_CODES:
            return StorageUnreachable(f"TLS verification failed: {message}. {server_side}",
                                      error_class="tls", **kwargs)
        refused = (f"Either the server refused the client certificate {cert} (its CA is not "
                   f"in the server's CA folder, it expired, or the server takes no proxies), "
                   f"or the server's certificate did not verify. " if cert else
                   "No client certificate was given, and the server may require one: the "
                   "driver option x509_proxy (a PEM proxy or certificate and key in one file; "
                   "else $X509_USER_PROXY), or x509_user_cert and x509_user_key (servers that "
                   "take no proxies, such as Apache mod_ssl). ")
        return StorageUnreachable(f"TLS handshake failed: {message}. {refused}{server_side}",
                                  error_class="tls", **kwargs)

    def _status_error(self, answer: Body, operation: str, path: str) -> StorageError:
        status = answer.status
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        kwargs = self._kwargs(operation, path, f"HTTP {status} {reason}".strip())
        text = " ".join(_text_of(answer.data).split())[:200] or reason or f"HTTP {status}"
        if status in _NOT_FOUND_STATUSES:
            return StorageNotFound(text, error_class="not_found", **kwargs)
        if status in _PERMISSION_STATUSES:
            from .grid import token_expired_at  # a 403 does not say the token expired

            expired = token_expired_at(self._token()) if self._auth else ""
            return StoragePermissionDenied(
                text + (f"; the token sent expired at {expired}" if expired else ""),
                error_class="permission", **kwargs)
        if status in _TIMEOUT_STATUSES:
            return StorageTimeout(text, error_class="timeout", **kwargs)
        if status == 507:
            return StorageError(f"no space left: {text}", error_class="no_space", **kwargs)
        return StorageError(text, error_class=f"http_{status}", **kwargs)

    def _check(self, answer: Body, operation: str, path: str) -> Body:
        if answer.status not in _OK_STATUSES:
            raise self._status_error(answer, operation, path)
        return answer

    # -- namespace ----------------------------------------------------------------
    def _listing(self, path: str, operation: str) -> _Listing:
        """Directory ``path``'s entries (``PROPFIND Depth: 1``), read as the answer
        arrives."""
        listing = _Listing(path)
        self._request("PROPFIND", path, headers=self._propfind_headers["1"], sink=listing,
                      operation=operation)
        self._check_multistatus(listing, path, operation)
        failure = listing.finish()
        if failure is not None:
            raise self._bad_answer(f"unreadable PROPFIND answer: {failure}", operation, path,
                                   listing)
        return listing

    def _check_multistatus(self, answer: Body, path: str, operation: str) -> None:
        if answer.status == 207:
            return
        if answer.status in _OK_STATUSES:
            raise StorageError(
                f"the server answered PROPFIND with HTTP {answer.status}, not a WebDAV "
                f"207 Multi-Status: is this a WebDAV door?",
                error_class="not_webdav", **self._kwargs(operation, path, "HTTP "
                                                         f"{answer.status}"))
        raise self._status_error(answer, operation, path)

    def _bad_answer(self, why: str, operation: str, path: str, answer: Body) -> BadAnswer:
        return BadAnswer(why, error_class="bad_answer",
                         **self._kwargs(operation, path, f"HTTP {answer.status}"))

    def _stat(self, path: str) -> StatInfo:
        answer = self._request("PROPFIND", path, headers=self._propfind_headers["0"],
                               operation="stat")
        self._check_multistatus(answer, path, "stat")
        data = answer.data
        try:
            info = _one_entry(data) if len(data) <= _REMEMBERED_ANSWER else None
            entries = [] if info is not None else _multistatus(data)
        except (ElementTree.ParseError, _Malformed) as exc:
            raise self._bad_answer(f"unreadable PROPFIND answer: {exc}", "stat", path,
                                   answer) from None
        if info is not None:
            return info
        if not entries:
            raise self._bad_answer("the PROPFIND answer names no entry", "stat", path, answer)
        return entries[0][1]

    def _entries(self, path: str, operation: str) -> list[str]:
        """The names in directory ``path`` (``Depth: 1``, its own entry left out)."""
        return sorted(self._listing(path, operation).names)

    def _ls(self, path: str) -> list[str]:
        return self._entries(path, "ls")

    def _mkdir(self, path: str) -> None:
        """``mkdir -p``: MKCOL, its parents first when the server answers 409 Conflict
        (XrdHttp makes the parents itself and accepts an existing directory)."""
        answer = self._request("MKCOL", path, operation="mkdir")
        if answer.status in _OK_STATUSES:
            return
        if answer.status == 405:  # it exists: fine when it is a directory
            if self._stat(path).is_dir:
                return
            raise StorageError("exists and is not a directory", error_class="not_a_directory",
                               **self._kwargs("mkdir", path, "HTTP 405"))
        parent = path.rstrip("/").rpartition("/")[0]
        if answer.status == 409 and parent not in ("", path):
            self._mkdir(parent)
            self._check(self._request("MKCOL", path, operation="mkdir"), "mkdir", path)
            return
        raise self._status_error(answer, "mkdir", path)

    def _mkdir_exclusive(self, path: str) -> None:
        """The parent must be a directory and ``path`` must not exist (PROPFIND both):
        XrdHttp's MKCOL accepts an existing path and makes missing parents, so the
        check before it is what makes it exclusive there; a server that answers 405
        for an existing path is refused as ``exists`` too."""
        parent = path.rstrip("/").rpartition("/")[0] or "/"
        if not self._stat(parent).is_dir:
            raise StorageError("the parent is not a directory", error_class="not_a_directory",
                               **self._kwargs("mkdir", path, ""))
        try:
            self._stat(path)
        except StorageNotFound:
            answer = self._request("MKCOL", path, operation="mkdir")
            if answer.status == 405:
                raise StorageError("file exists", error_class="exists",
                                   **self._kwargs("mkdir", path, "HTTP 405")) from None
            self._check(answer, "mkdir", path)
            return
        raise StorageError("file exists", error_class="exists",
                           **self._kwargs("mkdir", path, ""))

    def _delete(self, path: str) -> None:
        # Depth: 0 -- a server that follows RFC 4918 refuses it for a collection
        self._check(self._request("DELETE", path, headers=[*self._auth, "Depth: 0"],
                                  operation="delete"), "delete", path)

    def _rmdir(self, path: str) -> None:
        """Delete an empty directory; refuse a file and a directory with entries."""
        listing = self._listing(path, "rmdir")
        if not listing.own_is_dir:
            raise StorageError("not a directory", error_class="not_a_directory",
                               **self._kwargs("rmdir", path, ""))
        inside = listing.names
        if inside:
            raise StorageError(
                f"directory not empty ({len(inside)} entries): not deleted (a WebDAV DELETE "
                f"would remove them all)", error_class="not_empty",
                **self._kwargs("rmdir", path, "PROPFIND Depth 1"))
        self._check(self._request("DELETE", path, operation="rmdir"), "rmdir", path)

    def _rename(self, source: str, target: str) -> None:
        headers = [*self._auth, f"Destination: {self._url(target)}", "Overwrite: T"]
        self._check(self._request("MOVE", source, headers=headers, operation="rename"),
                    "rename", source)

    def _checksum(self, path: str, algorithm: str) -> str:
        answer = self._check(self._request(
            "HEAD", path, headers=[*self._auth, f"Want-Digest: {algorithm.lower()}"],
            want_headers=True, operation="checksum"), "checksum", path)
        value = self._digest_of(answer, algorithm, "checksum", path)
        if value is None:
            raise StorageError(
                f"the server offers no {algorithm} checksum (its Digest header: "
                f"{answer.headers.get('digest', 'none')!r})", error_class="checksum_type",
                **self._kwargs("checksum", path, f"HTTP {answer.status}"))
        return value

    def _digest_of(self, answer: Body, algorithm: str, operation: str,
                   path: str) -> str | None:
        try:
            return _digest(answer.headers.get("digest", ""), algorithm)
        except _Malformed as exc:
            raise self._bad_answer(str(exc), operation, path, answer) from None

    def connect(self) -> None:
        """Open this client's connection (TLS handshake, client certificate) with a
        ``HEAD`` of the test area; the connection stays with the handle."""
        path = self.endpoint.path
        self._check(self._request("HEAD", path, operation="login"), "login", path)

    def _version(self) -> str:
        """The door's ``Server`` header (``dCache/9.2.4``, ``XrootD/v5.5.3``); an XRootD
        6 door names none there, its listing page is asked (:meth:`_listing_version`)."""
        path = self.endpoint.path
        answer = self._check(self._request("HEAD", path, want_headers=True,
                                           operation="version"), "version", path)
        server = answer.headers.get("server", "")
        version = version_from_server_header(server)
        if version is None and names_xrootd_without_version(server):
            return self._listing_version(path, server)
        if version is None:
            raise StorageError(f"the Server header {server!r} names no version I can read; "
                               f"give it: --storage-version VERSION", error_class="version",
                               **self._kwargs("version", path, f"HTTP {answer.status}"))
        return version

    def _listing_version(self, path: str, server: str) -> str:
        """The version on XrdHttp's listing page of the test area ("Powered by XrdHTTP
        v6.2.1"); a :class:`StorageError` saying it is unknown, and how to state it,
        when the page is refused, too long or names none: never a guess."""
        why = "it names none"
        try:
            answer = self._request("GET", path.rstrip("/") + "/",
                                   headers=[*self._auth, "Accept: text/html"],
                                   operation="version", limit=LISTING_READ)
            version = version_from_listing(answer.data) if answer.status == 200 else None
            if answer.status != 200:
                why = f"GET {path}/ answered HTTP {answer.status}"
        except StorageError as exc:
            version, why = None, f"GET {path}/: {exc.message}"
        if version is None:
            raise StorageError(unknown_xrootd_version(server, why), error_class="version",
                               **self._kwargs("version", path, "unknown version"))
        return version

    # -- data ---------------------------------------------------------------------
    def _verifying(self) -> bool | None:
        """Whether transfers are verified; None: not known before the door's first
        answer names its server (``auto``)."""
        if not self._verify or self._checksum_mode == "adler32":
            return self._verify
        server = _DOOR_SERVERS.get(self.endpoint.server)
        if server is None:
            return None
        # XrdHttp (xrootd 5.5): a checksum asked for right after an upload can crash the
        # server (xrootd/xrootd#2534), and after an overwrite within the same second it
        # announces the old file's adler32; verify there only when asked (adler32)
        return not server.lower().startswith("xrootd")

    def _put(self, path: str, data: bytes) -> int:
        """PUT the whole file (overwriting; a missing parent is made), then compare the
        adler32 the server gives with the data's."""
        dcache = _DOOR_SERVERS.get(self.endpoint.server, "").lower().startswith("dcache")
        headers = [*self._auth, *(_DCACHE_PUT_HEADERS if dcache else _PUT_HEADERS)]
        learn = self._verifying() is None
        answer = self._request("PUT", path, headers=headers, body=data, operation="put",
                               want_headers=learn)
        if answer.status == 409:  # the parent is missing (Apache, dCache)
            self._mkdir(path.rstrip("/").rpartition("/")[0] or "/")
            answer = self._request("PUT", path, headers=headers, body=data, operation="put")
        self._check(answer, "put", path)
        if self._verifying():
            check = self._request("HEAD", path, headers=[*self._auth, "Want-Digest: adler32"],
                                  want_headers=True, operation="put")
            self._check(check, "put", path)
            self._compare(check, self._adler32_of(data), "put", path)
        return len(data)

    def _adler32_of(self, data: bytes) -> str:
        """adler32 of ``data``, computed once per data object (steps upload one
        payload over and over)."""
        with self._checksums_lock:
            known = self._checksums.get(id(data))
            if known is None or known[0] is not data:
                if len(self._checksums) > 8:
                    self._checksums.clear()
                known = self._checksums[id(data)] = (data, f"{zlib.adler32(data):08x}")
            return known[1]

    def _compare(self, answer: Body, local: str, operation: str, path: str) -> None:
        """Refuse a transfer whose adler32 differs from the server's; a server that
        offers none is not asked again by this client."""
        remote = self._digest_of(answer, "adler32", operation, path)
        if remote is None:
            self._verify = False
            return
        if remote != local:
            raise StorageError(
                f"adler32 mismatch: the server has {remote}, the client "
                f"{'sent' if operation == 'put' else 'received'} {local}",
                error_class="checksum_mismatch",
                **self._kwargs(operation, path, f"HTTP {answer.status}"))

    def _get(self, path: str, local_path: str | None) -> int:
        verify = self._verifying()  # None: the first answer names the door
        headers = [*self._auth, "Want-Digest: adler32"] if verify else self._auth
        sink = Body(keep=bool(local_path), digest=bool(verify))
        answer = self._check(self._request("GET", path, headers=headers, sink=sink,
                                           want_headers=verify is not False, operation="get"),
                             "get", path)
        if verify:
            self._compare(answer, f"{answer.adler32:08x}", "get", path)
        if local_path:
            with open(local_path, "wb") as stream:
                for chunk in answer.chunks:
                    stream.write(chunk)
        return answer.size

    def _range(self, path: str, ranges: list[tuple[int, int]], operation: str) -> Body:
        spec = ",".join(f"{offset}-{offset + size - 1}" for offset, size in ranges)
        return self._check(self._request(
            "GET", path, headers=[*self._auth, f"Range: bytes={spec}"], want_headers=True,
            operation=operation, limit=0), operation, path)

    def _read(self, path: str, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``: fewer across the end of the file, none after it."""
        if size <= 0:
            return b""
        try:
            answer = self._range(path, [(offset, size)], "read")
        except StorageError as exc:
            if exc.error_class == "http_416":  # Range Not Satisfiable: at or after the end
                return b""
            if exc.native_status != f"curl error {pycurl.E_PARTIAL_FILE}":
                raise
            # XrdHttp (5.5) announces the whole range across the end, sends nothing and
            # closes: ask again for the bytes there are
            end = self._stat(path).size
            if offset >= end:
                return b""
            answer = self._range(path, [(offset, min(size, end - offset))], "read")
        data = answer.data
        return data if answer.status == 206 else data[offset:offset + size]

    def _readv(self, path: str, chunks: list[tuple[int, int]]) -> int:
        """All chunks in one request (a multi-range GET: XrdHttp turns it into a readv);
        returns the bytes of the chunks received."""
        chunks = [(offset, size) for offset, size in chunks if size > 0]
        if not chunks:
            return 0
        answer = self._range(path, chunks, "readv")
        if answer.status != 206:  # the whole file: cut the chunks out
            data = answer.data
            return sum(len(data[offset:offset + size]) for offset, size in chunks)
        kind = answer.headers.get("content-type", "")
        if not kind.lower().startswith("multipart/byteranges"):
            return answer.size
        boundary = kind.partition("boundary=")[2].strip().strip('"')
        try:
            return sum(len(part) for part in _byteranges(answer.data, boundary.encode()))
        except _Malformed as exc:
            raise self._bad_answer(str(exc), "readv", path, answer) from None

    # -- third-party copy ---------------------------------------------------------------
    def transfer_url(self, path: str) -> str:
        """``path`` as the URL another server uses to reach it (``https://``)."""
        return self._url(path)

    def transfer_headers(self) -> list[str]:
        """What a server copying from or to this client's server must send: its bearer
        token (``TransferHeaderAuthorization``), when this client has one."""
        token = self._token() if self._secure else None
        return [f"TransferHeaderAuthorization: Bearer {token}"] if token else []

    def pull(self, path: str, source: HTTPDriver, source_path: str) -> CopyOutcome:
        """Third-party copy to ``path`` on this client's server, which fetches
        ``source_path`` from ``source``'s server (``COPY`` with ``Source:``). Guarded:
        ``path`` must be in this client's ``writable_root``. Its directory must exist
        (XrdHttpTPC makes no parents)."""
        self._guard("third-party copy", path)
        self._made(path, "file")  # the run's, whole or partial (size unknown here)
        return self._copy(path, path, [f"Source: {source.transfer_url(source_path)}",
                                       *source.transfer_headers()])

    def push(self, path: str, target: HTTPDriver, target_path: str) -> CopyOutcome:
        """Third-party copy of ``path`` on this client's server to ``target_path`` on
        ``target``'s server, which this server sends it to (``COPY`` with
        ``Destination:``). Guarded on the side written: ``target_path`` must be in
        ``target``'s ``writable_root`` (this server's file is only read)."""
        target._guard("third-party copy", target_path)
        target._made(target_path, "file")
        return self._copy(path, target_path, [
            f"Destination: {target.transfer_url(target_path)}", *target.transfer_headers()])

    def _copy(self, path: str, written: str, headers: list[str]) -> CopyOutcome:
        """``COPY path`` with ``headers``; an error unless its last line says success."""
        answer = self._request("COPY", path, operation="third-party copy", headers=[
            *self._auth, *headers, "Overwrite: T", "Credential: none"], limit=LISTING_LIMIT)
        reason = " ".join(_text_of(answer.data).split())[:200]
        if answer.status in _NO_TPC_STATUSES or answer.status == 400 and any(
                words in reason.lower() for words in _NO_TPC_WORDS):
            raise StorageError(
                f"COPY refused: {reason or 'no third-party copy'}",
                error_class="tpc_not_supported",
                **self._kwargs("third-party copy", written, f"HTTP {answer.status}"))
        self._check(answer, "third-party copy", written)
        text = answer.data.decode("utf-8", "replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        last = lines[-1] if lines else ""
        sizes = _STRIPE_BYTES.findall(text)
        try:
            reported = _number(sizes[-1], "Stripe Bytes Transferred") if sizes else None
        except _Malformed as exc:
            raise self._bad_answer(str(exc), "third-party copy", written, answer) from None
        outcome = CopyOutcome(answer.status, last, text.count("Perf Marker"), reported)
        if last.lower().startswith("success"):
            return outcome
        why = (f"the copy ended with {last!r}" if last.lower().startswith(_TPC_FAILURES)
               else f"the answer ended without a 'success' line (last line {last!r:.200})")
        raise StorageError(why, error_class="tpc_failed", **self._kwargs(
            "third-party copy", written, f"HTTP {answer.status}"))

    def counters(self) -> dict[str, float]:
        return {"redirects": self.redirects, "door_seconds": self.door_seconds}

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop()[0].close()
        with self._checksums_lock:
            self._checksums.clear()


# -- answers --------------------------------------------------------------------------
class _Malformed(Exception):
    """A field of an answer that cannot be read; the driver raises it as BadAnswer."""


def _number(text: str | bytes, what: str) -> int:
    """A size or offset: ASCII digits that fit 64 bits (not a Unicode digit, not 5,000
    digits); else :class:`_Malformed` naming ``what``."""
    value = text.strip()
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not _NUMBER.fullmatch(value):
        raise _Malformed(f"{what} {value[:40]!r}{'...' if len(value) > 40 else ''} is not a "
                         f"number of bytes")
    return int(value)


def _multistatus(data: bytes) -> list[tuple[str, StatInfo]]:
    """``(href path, StatInfo)`` of each response of a 207 answer, in its order."""
    return [_entry(response)
            for response in xmlsafe.fromstring(data).iter(f"{_DAV}response")]


def _entry(response: ElementTree.Element) -> tuple[str, StatInfo]:
    """``(href path, StatInfo)`` of one ``response`` element of a 207 answer."""
    try:
        href = unquote(urlsplit(response.findtext(f"{_DAV}href", "")).path)
    except ValueError as exc:  # urlsplit: "Invalid IPv6 URL"
        raise _Malformed(f"href: {exc}") from None
    size, is_dir, modified = 0, False, None
    for propstat in response.iter(f"{_DAV}propstat"):
        if " 200" not in (propstat.findtext(f"{_DAV}status") or " 200"):
            continue
        for prop in propstat.iter(f"{_DAV}prop"):
            length = prop.findtext(f"{_DAV}getcontentlength")
            size = _number(length, "getcontentlength") if length and length.strip() else size
            kind = prop.find(f"{_DAV}resourcetype")
            is_dir = is_dir or (kind is not None and kind.find(f"{_DAV}collection")
                                is not None)
            modified = _http_date(prop.findtext(f"{_DAV}getlastmodified")) or modified
    return href, StatInfo(size=0 if is_dir else size, is_dir=is_dir, modified=modified)


@functools.lru_cache(maxsize=1024)
def _one_entry(data: bytes) -> StatInfo | None:
    """A 207 answer of one entry whose properties all came back 200, read without an
    XML parser (a tenth of its CPU: ``stat`` is the load's most frequent request);
    None for anything else, which the XML parser reads. Remembered by the answer's
    bytes (its path, size and time): a load stats the same files over and over, and
    an answer read before costs a hash of its bytes, not 10 µs of reading."""
    # one response element (its opening and closing tag), every status line a 200: a
    # path that happens to hold these words only sends the answer to the XML parser
    statuses = data.count(b"status>") - data.count(b"multistatus>")
    if data.count(b"response") != 2 or statuses != 2 * data.count(b" 200 "):
        return None
    if b"<!" in data:
        return None  # a declaration (DOCTYPE) or CDATA: the parser reads (refuses) it
    is_dir = _COLLECTION.search(data) is not None
    length = _LENGTH.search(data)
    modified = _MODIFIED.search(data)
    if length and b"&" in length.group(1) or modified and b"&" in modified.group(1):
        return None  # an XML reference (&#49;): the parser reads it
    size = _number(length.group(1), "getcontentlength") if length and length.group(
        1).strip() and not is_dir else 0
    return StatInfo(size=size, is_dir=is_dir,
                    modified=_http_date(modified.group(1).decode("latin-1")) if modified
                    else None)


@functools.lru_cache(maxsize=4096)
def _quoted(path: str) -> str:
    """A path as one URL path (spaces, brackets and the like escaped)."""
    return quote(path, safe="/-._~")


@functools.lru_cache(maxsize=4096)
def _http_date(text: str | None) -> float | None:
    """An HTTP date (``getlastmodified``); None when absent, :class:`_Malformed` when
    unreadable (clean-up compares files' times: a time it cannot read is no time)."""
    if not text or not text.strip():
        return None
    try:
        return email.utils.parsedate_to_datetime(text.strip()).timestamp()
    except (TypeError, ValueError, OverflowError, IndexError):
        shown = text.strip()
        raise _Malformed(f"getlastmodified {shown[:60]!r}{'...' if len(shown) > 60 else ''} "
                         f"is not an HTTP date") from None


def _redirect_refusal(base: str, location: str, path: str) -> str | None:
    """Why a mutating request to ``path`` on ``base`` may not follow ``location``;
    None: the same path (decoded, no ``.`` or ``..`` segment), on this or another
    server, over TLS when the door is."""
    try:
        target = urlsplit(location)
    except ValueError:
        return "not a URL"
    if target.scheme not in ("http", "https") or not target.hostname:
        return "not an http(s) URL"
    if urlsplit(base).scheme == "https" and target.scheme != "https":
        return "not over TLS (the door is https)"
    segments = unquote(target.path).split("/")
    if "." in segments or ".." in segments:
        return "a path with a . or .. segment"
    if [part for part in segments if part] != [part for part in path.split("/") if part]:
        return "another path"
    return None


def _retry_after(value: str) -> float | None:
    """A ``Retry-After`` value in seconds: delay-seconds or an HTTP date (RFC 9110
    10.2.3); None when unreadable."""
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value[:9])
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return max(0.0, when - time.time())


def _origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port: where credentials may go (libcurl's rule)."""
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def _shown(location: str) -> str:
    """A Location as shown in a message: without user:password and query (a pool's
    URL may carry a one-time token there)."""
    try:
        parts = urlsplit(location)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return repr(location[:200])
    query = "?..." if parts.query else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path[:300]}{query}"


def _digest(header: str, algorithm: str) -> str | None:
    """The value of ``algorithm`` in a ``Digest`` header, as lower-case hex
    (``adler32=0a1b2c3d, md5=...``); None when it is not there."""
    for item in header.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or name.strip().lower() != algorithm.lower():
            continue
        value = value.strip()
        if name.strip().lower() in _HEX_DIGESTS:
            if not _HEX_VALUE.fullmatch(value.lower()):
                raise _Malformed(f"the Digest {name.strip()}={value[:40]!r} is not hex")
            return value.lower().rjust(8, "0")
        try:
            return base64.b64decode(value, validate=True).hex()
        except (binascii.Error, ValueError):
            return value.lower()
    return None


def _byteranges(data: bytes, boundary: bytes) -> list[bytes]:
    """The parts of a ``multipart/byteranges`` body, each cut by the length its
    ``Content-Range`` gives (a part's bytes may contain the boundary)."""
    parts: list[bytes] = []
    position, marker = 0, b"--" + boundary
    while True:
        start = data.find(marker, position)
        if start < 0 or data.startswith(b"--", start + len(marker)):
            return parts
        head_end = data.find(b"\r\n\r\n", start)
        if head_end < 0:
            return parts
        first, last = _content_range(data[start:head_end])
        body = head_end + 4
        parts.append(data[body:body + last - first + 1])
        position = body + last - first + 1


def _content_range(head: bytes) -> tuple[int, int]:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-range":
            first, _, rest = value.strip().partition(b" ")[2].partition(b"-")
            return (_number(first, "Content-Range"),
                    _number(rest.partition(b"/")[0], "Content-Range"))
    raise _Malformed("a multipart/byteranges part without Content-Range")


def _text_of(data: bytes) -> str:
    """An error page's words, without markup nor credentials (redacted before any cut:
    a page may quote the request's ``Authorization`` header)."""
    text = data[:2000].decode("utf-8", "replace")
    out, inside = [], False
    for char in text:
        if char == "<":
            inside = True
        elif char == ">":
            inside = False
            out.append(" ")
        elif not inside:
            out.append(char)
    return redact_text("".join(out))
