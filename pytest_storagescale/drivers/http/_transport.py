"""One client's requests on libcurl easy handles (pycurl): the handles' settings (TLS
against the grid CA folder, the client certificate, the deadline), the answer's size
limit, the redirect rules (a read follows libcurl's, a mutating request only the
same path), throttled answers waited out within half the deadline, and what a client
learns of its door from the first answer it reads headers of (:class:`DoorServer`).

Every failure leaves as a :class:`~pytest_storagescale.errors.StorageError` made by the
client's :class:`~._errors.ErrorMapper`; what a request answered is a :class:`Body`."""

from __future__ import annotations

import email.utils
import functools
import time
import zlib
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import quote, unquote, urlsplit

import pycurl

from ...errors import BadAnswer, RedirectRefused, StorageError, StorageThrottled
from ._door import DoorServer
from ._errors import ErrorMapper

#: a redirect: a mutating request's is followed here, by the same-path rule
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: the methods that change the storage: redirected only to the same path
MUTATING_METHODS = frozenset({"PUT", "DELETE", "MKCOL", "MOVE", "COPY", "PROPPATCH",
                              "LOCK", "UNLOCK", "POST", "PATCH"})
_MAX_REDIRECTS = 5
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
_BUFFER = 512 * 1024


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


class _Call(NamedTuple):
    """One request as :meth:`Transport.request` was asked for it."""

    method: str
    path: str
    #: the request's headers (the client's ``Authorization`` when none were given)
    headers: list[str]
    body: bytes | None
    sink: Body | None
    #: the operation errors name (the method in lower case when none was given)
    operation: str
    limit: int


class Transport:
    """One client's connection to its door: idle easy handles (one per thread using
    the client at once), each kept alive with its TLS session; the redirects followed
    and the door's share of their time; what the door is (:attr:`door`)."""

    def __init__(self, *, base: str, secure: bool, timeout: float, ca_dir: str,
                 certificate: tuple[str | None, str | None],
                 login: tuple[str, str] | None, client_id: str, connections: int,
                 auth: list[str], errors: ErrorMapper,
                 pause: Callable[[float], bool]) -> None:
        #: ``https://host:port`` of the door
        self.base = base
        self.secure = secure
        self.timeout = timeout
        self._timeout_ms = max(1, int(timeout * 1000))
        self.ca_dir = ca_dir
        self.certificate = certificate
        #: the URL's ``user:password`` (basic authentication), sent to the door only
        self.login = login
        self.client_id = client_id
        self.connections = connections
        #: the headers of a request given none: the bearer token, when there is one
        self.auth = auth
        self.errors = errors
        self.pause = pause
        #: what this client learned of its door from its first answer with headers
        self.door = DoorServer()
        #: idle handles, each with what its settings are now
        self.idle: list[tuple[pycurl.Curl, _Settings]] = []
        self.closed = False
        #: the door throttled this client once: read Retry-After from every answer
        self.read_retry_after = False
        #: redirects this client followed (a dCache door sends each transfer to a pool),
        #: and the seconds its requests spent before their last server answered
        #: (the door's share of a redirected request's latency)
        self.redirects = 0
        self.door_seconds = 0.0

    def url(self, path: str) -> str:
        return self.base + _quoted(path)

    # -- handles --------------------------------------------------------------------
    def configure(self, handle: pycurl.Curl, login: bool = True) -> pycurl.Curl:
        """The handle's settings for every request; ``login``: with the URL's
        ``user:password`` (not for another server a request is redirected to)."""
        handle.setopt(pycurl.NOSIGNAL, 1)
        handle.setopt(pycurl.TIMEOUT_MS, self._timeout_ms)
        handle.setopt(pycurl.CONNECTTIMEOUT_MS, self._timeout_ms)
        handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
        handle.setopt(pycurl.MAXCONNECTS, self.connections)
        handle.setopt(pycurl.FOLLOWLOCATION, 1)
        handle.setopt(pycurl.MAXREDIRS, _MAX_REDIRECTS)
        handle.setopt(pycurl.POSTREDIR, pycurl.REDIR_POST_ALL)  # a PUT keeps its body
        # a read is redirected only where TLS still protects it (never https -> http)
        handle.setopt(pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTPS if self.secure
                      else pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        handle.setopt(pycurl.BUFFERSIZE, _BUFFER)
        handle.setopt(pycurl.USERAGENT, f"pytest-storagescale/{self.client_id}")
        if self.secure:
            self._configure_tls(handle, login)
        return handle

    def _configure_tls(self, handle: pycurl.Curl, login: bool) -> None:
        handle.setopt(pycurl.SSL_VERIFYPEER, 1)
        handle.setopt(pycurl.SSL_VERIFYHOST, 2)
        handle.setopt(pycurl.CAPATH, self.ca_dir)
        handle.unsetopt(pycurl.CAINFO)  # the grid CA folder only, not the system bundle
        cert, key = self.certificate
        if cert:
            handle.setopt(pycurl.SSLCERT, cert)
            handle.setopt(pycurl.SSLCERTTYPE, "PEM")
            handle.setopt(pycurl.SSLKEY, key or cert)
        if self.login and login:
            handle.setopt(pycurl.USERNAME, self.login[0])
            handle.setopt(pycurl.PASSWORD, self.login[1])

    def _take_handle(self, want_headers: bool) -> tuple[pycurl.Curl, _Settings]:
        """An idle handle (list.pop is atomic: threads sharing this client each get
        their own), else a new one."""
        try:
            handle, settings = self.idle.pop()
        except IndexError:
            return self.configure(pycurl.Curl()), _Settings()
        if settings.headed and not want_headers:
            # a header callback cannot be unset, and each header line would take the GIL
            # in the middle of the request: reset the settings (the connection and the
            # TLS session stay with the handle)
            handle.reset()
            self.configure(handle)
            settings = _Settings()
        return handle, settings

    def _give_back(self, handle: pycurl.Curl, settings: _Settings) -> None:
        if self.closed:
            handle.close()
        else:
            self.idle.append((handle, settings))

    def close(self) -> None:
        self.closed = True
        while self.idle:
            self.idle.pop()[0].close()

    # -- requests -------------------------------------------------------------------
    def request(self, method: str, path: str, *, headers: list[str] | None = None,
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
        call = _Call(method, path, headers if headers is not None else self.auth, body, sink,
                     operation or method.lower(), limit)
        read = want_headers or self.read_retry_after
        answer = self._send(call, read)
        sends = 1
        while answer.status in _THROTTLE_STATUSES:
            wait = self._throttle_wait(answer, read, began, sends, call)
            if wait is None:
                break  # a 503 without Retry-After: its status says it
            if self.pause(wait):  # the step stopped (Ctrl-C, its end): not sent again
                raise StorageThrottled(
                    f"the server throttled the request (HTTP {answer.status}) and the step "
                    f"stopped while it waited to send it again: not sent again",
                    error_class="throttled", **self.errors.kwargs(
                        call.operation, path, f"HTTP {answer.status}"))
            if sink is not None:
                sink.reset()
            read = True
            answer = self._send(call, read)
            sends += 1
        return answer

    def _throttle_wait(self, answer: Body, read: bool, began: float, sends: int,
                       call: _Call) -> float | None:
        """How long to wait before sending a throttled request again: its
        ``Retry-After`` (seconds or an HTTP date), else :data:`THROTTLE_WAIT` (a 429
        without one, or an answer whose headers were not read: this client reads them
        on every request from then on). None: a 503 without ``Retry-After`` (not
        throttling). :class:`~pytest_storagescale.errors.StorageThrottled` when the
        wait would end after :data:`THROTTLE_SHARE` of the request's deadline (for a
        load client, half its hang timeout) counted from its first send, or after
        :data:`THROTTLE_SENDS` sends."""
        self.read_retry_after = True
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
            **self.errors.kwargs(call.operation, call.path, f"HTTP {answer.status}"))

    def _send(self, call: _Call, want_headers: bool) -> Body:
        """One request sent once (:meth:`request`)."""
        answer = call.sink or Body(limit=call.limit)
        handle, settings = self._take_handle(want_headers)
        try:
            settings, refused = self._perform(handle, settings, call, answer, want_headers)
        except pycurl.error as exc:
            raise self._failed(handle, call, answer, exc) from None
        self._give_back(handle, settings)
        if refused is not None:
            raise refused
        return answer

    def _perform(self, handle: pycurl.Curl, settings: _Settings, call: _Call, answer: Body,
                 want_headers: bool) -> tuple[_Settings, StorageError | None]:
        """Send ``call`` on ``handle`` and read its answer into ``answer``; what the
        handle is set to after, and a mutating redirect's refusal (or None)."""
        self._set_request(handle, settings, call)
        handle.setopt(pycurl.WRITEFUNCTION, answer.writer)
        if want_headers:
            handle.setopt(pycurl.HEADERFUNCTION, answer.header)
            settings.headed = True
        handle.perform()
        answer.status = handle.getinfo(pycurl.RESPONSE_CODE)
        self._count_redirects(handle)
        refused = None
        if answer.status in _REDIRECT_STATUSES and call.method in MUTATING_METHODS:
            settings = _Settings()  # following sets the handle otherwise
            refused = self._follow(handle, call, answer, want_headers)
        if want_headers:
            self.door.learn(answer.headers)
        return settings, refused

    def _set_request(self, handle: pycurl.Curl, settings: _Settings, call: _Call) -> None:
        """Set the URL, method, headers and body of ``call``, unless the last request
        on the handle had these very objects (held by the settings, so no other object
        can have their id)."""
        if call.path != settings.path:
            handle.setopt(pycurl.URL, self.url(call.path))
            settings.path = call.path
        if (call.method != settings.method or call.headers is not settings.headers
                or call.body is not settings.body):
            _set_method(handle, call.method, call.headers, call.body)
            settings.method, settings.headers, settings.body = (call.method, call.headers,
                                                                call.body)

    def _failed(self, handle: pycurl.Curl, call: _Call, answer: Body,
                exc: pycurl.error) -> StorageError:
        """The error of a request libcurl ended with ``exc``; the handle is closed (its
        connection is in an unknown state)."""
        fresh = handle.getinfo(pycurl.NUM_CONNECTS) > 0  # failed on a new connection
        answer.status = answer.status or handle.getinfo(pycurl.RESPONSE_CODE)
        handle.close()
        if answer.overflow:
            return BadAnswer(
                f"the answer to {call.method} is {answer.too_long()}: not read further",
                error_class="bad_answer",
                **self.errors.kwargs(call.operation, call.path, f"HTTP {answer.status}"))
        return self.errors.curl(exc, call.operation, call.path, fresh)

    def _count_redirects(self, handle: pycurl.Curl) -> None:
        """Count the redirects libcurl followed for the request (a read's)."""
        followed = handle.getinfo(pycurl.REDIRECT_COUNT)
        if followed:
            self.redirects += followed
            self.door_seconds += handle.getinfo(pycurl.REDIRECT_TIME)

    def _follow(self, handle: pycurl.Curl, call: _Call, answer: Body,
                want_headers: bool) -> StorageError | None:
        """Follow the redirects of a mutating request (libcurl does not: it follows
        only reads), each only to the same path, on the door or another server (a
        dCache door sends a transfer to a pool). Another scheme, host or port gets
        neither the ``Authorization`` header nor ``user:password``. Returns the refusal
        (nothing was sent there), or None with ``answer`` the last server's; the
        handle is set for this client's requests again after."""
        try:
            for _ in range(_MAX_REDIRECTS):
                location = handle.getinfo(pycurl.REDIRECT_URL)
                if not location:
                    return None  # a redirect status without a Location: its status says it
                why = _redirect_refusal(self.base, location, call.path)
                if why is not None:
                    return self._refusal(
                        f"the server redirected {call.method} to {_shown(location)}, {why}: "
                        f"refused, not followed (a request that changes the storage is "
                        f"redirected only to the same path, on this or another server)",
                        call, answer)
                self._redirect(handle, call, answer, location, want_headers)
                if answer.status not in _REDIRECT_STATUSES:
                    return None
            return self._refusal(
                f"more than {_MAX_REDIRECTS} redirects (the last to "
                f"{_shown(handle.getinfo(pycurl.REDIRECT_URL) or '')}): not followed further",
                call, answer)
        finally:
            handle.reset()
            self.configure(handle)

    def _redirect(self, handle: pycurl.Curl, call: _Call, answer: Body, location: str,
                  want_headers: bool) -> None:
        """Send ``call`` again to ``location`` (checked by :func:`_redirect_refusal`),
        without the door's credentials when it is another server."""
        foreign = _origin(location) != _origin(self.base)
        self.redirects += 1
        self.door_seconds += handle.getinfo(pycurl.TOTAL_TIME)
        handle.reset()
        self.configure(handle, login=not foreign)
        handle.setopt(pycurl.URL, location)
        _set_method(handle, call.method, [
            line for line in call.headers if not (
                foreign and line.lower().startswith("authorization:"))], call.body)
        answer.reset()
        handle.setopt(pycurl.WRITEFUNCTION, answer.writer)
        if want_headers:
            handle.setopt(pycurl.HEADERFUNCTION, answer.header)
        handle.perform()
        answer.status = handle.getinfo(pycurl.RESPONSE_CODE)

    def _refusal(self, message: str, call: _Call, answer: Body) -> RedirectRefused:
        return RedirectRefused(message, error_class="redirect_refused", **self.errors.kwargs(
            call.operation, call.path, f"HTTP {answer.status}"))


def _set_method(handle: pycurl.Curl, method: str, headers: list[str],
                body: bytes | None) -> None:
    handle.setopt(pycurl.HTTPGET, 1)  # resets the method, upload and no-body
    # a mutating request's redirect is checked before it is followed (_follow)
    handle.setopt(pycurl.FOLLOWLOCATION, int(method not in MUTATING_METHODS))
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


@functools.lru_cache(maxsize=4096)
def _quoted(path: str) -> str:
    """A path as one URL path (spaces, brackets and the like escaped)."""
    return quote(path, safe="/-._~")


def login_of(url: str) -> tuple[str, str] | None:
    """The ``user:password`` of ``url`` (decoded), or None."""
    parts = urlsplit(url)
    if not parts.username:
        return None
    return unquote(parts.username), unquote(parts.password or "")


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
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # an IPv6 address, as a URL writes it
    return f"{parts.scheme}://{host}{port}{parts.path[:300]}{query}"
