"""The HTTP/WebDAV driver class: each storage operation as WebDAV requests
(``PROPFIND``, ``MKCOL``, ``PUT``, ``GET`` with ranges, ``MOVE``, ``DELETE``, ``COPY``)
on its :class:`~._transport.Transport`, the answers read by :mod:`._webdav`, the
failures made by :class:`~._errors.ErrorMapper`. What the package does and guarantees
is said in :mod:`pytest_storagescale.drivers.http`."""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Mapping
from typing import ClassVar
from xml.etree import ElementTree

import pycurl

from ...errors import BadAnswer, StorageError, StorageNotFound, StorageScaleUsageError
from ..base import Driver, StatInfo
from ..url import HTTP_SCHEMES, HTTPS_SCHEMES
from ..version import (
    DEFAULT_CA_DIR,
    LISTING_READ,
    names_xrootd_without_version,
    unknown_xrootd_version,
    version_from_listing,
    version_from_server_header,
)
from . import _tpc, _webdav
from ._door import DoorServer
from ._errors import ErrorMapper, Malformed
from ._tpc import CopyOutcome
from ._transport import Body, Transport, login_of

_OK_STATUSES = frozenset(range(200, 300))
#: a PUT's own headers: no Content-Type (libcurl would send a form's; dCache's pool
#: answers any Content-* header it does not know with 501 "Content-Type is not
#: implemented")
_PUT_HEADERS = ("Content-Type:",)
#: and to a dCache door: on Expect: 100-continue it redirects the upload to its pool
#: before the body is sent; without, it takes the body and proxies it to the pool.
#: (libcurl asks for 100-continue itself above 1 MiB; below, XrdHttp 5.5 closed the
#: connection after such a PUT)
_DCACHE_PUT_HEADERS = (*_PUT_HEADERS, "Expect: 100-continue")
#: a stat answer up to this size is remembered by its bytes (the fast reading)
_REMEMBERED_ANSWER = 8192


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
        self._secure = secure
        self.ca_dir = (self.options.get("ca_dir") or os.environ.get("X509_CERT_DIR")
                       or DEFAULT_CA_DIR)
        #: adler32: verify transfers; none: never; auto: unless the door is XrdHttp
        self._checksum_mode = self.options.get("checksum", "auto").lower()
        self._verify = self._checksum_mode != "none"
        token = self._token() if secure else None
        auth = [f"Authorization: Bearer {token}"] if token else []
        self._propfind_headers = {
            # no body: all properties (RFC 4918), the request h2load and the bare loops send
            depth: [*auth, f"Depth: {depth}"]
            for depth in ("0", "1")}
        self._auth = auth
        certificate = self._certificate()
        self._errors = ErrorMapper(
            driver=self.name, endpoint=endpoint.server, timeout=self.timeout,
            ca_dir=self.ca_dir, certificate=certificate, secure=secure, token=token)
        self._transport = Transport(
            base=f"{'https' if secure else 'http'}://{endpoint.netloc_host}{port}", secure=secure,
            timeout=self.timeout, ca_dir=self.ca_dir, certificate=certificate,
            login=login_of(endpoint.url), client_id=self.client_id,
            connections=self.files_per_client, auth=auth, errors=self._errors,
            pause=self.pause)
        self._request = self._transport.request
        self._checksums: dict[int, tuple[bytes, str]] = {}
        self._checksums_lock = threading.Lock()

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

    @property
    def door(self) -> DoorServer:
        """What this client learned of its door (its ``Server`` header), on its first
        contact (:meth:`connect`) or its first request that read headers."""
        return self._transport.door

    @property
    def redirects(self) -> int:
        """Redirects this client followed (a dCache door sends each transfer to a
        pool)."""
        return self._transport.redirects

    @property
    def door_seconds(self) -> float:
        """Seconds this client's requests spent before their last server answered (the
        door's share of a redirected request's latency)."""
        return self._transport.door_seconds

    def _url(self, path: str) -> str:
        return self._transport.url(path)

    def _kwargs(self, operation: str, path: str, native: str) -> dict:
        return self._errors.kwargs(operation, path, native)

    def _status_error(self, answer: Body, operation: str, path: str) -> StorageError:
        return self._errors.status(answer.status, answer.data, operation, path)

    def _check(self, answer: Body, operation: str, path: str) -> Body:
        if answer.status not in _OK_STATUSES:
            raise self._status_error(answer, operation, path)
        return answer

    # -- namespace ----------------------------------------------------------------
    def _listing(self, path: str, operation: str) -> _webdav.Listing:
        """Directory ``path``'s entries (``PROPFIND Depth: 1``), read as the answer
        arrives."""
        listing = _webdav.Listing(path)
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
        return self._errors.bad_answer(why, operation, path, answer.status)

    def _stat(self, path: str) -> StatInfo:
        answer = self._request("PROPFIND", path, headers=self._propfind_headers["0"],
                               operation="stat")
        self._check_multistatus(answer, path, "stat")
        data = answer.data
        try:
            info = _webdav.one_entry(data) if len(data) <= _REMEMBERED_ANSWER else None
            entries = [] if info is not None else _webdav.multistatus(data)
        except (ElementTree.ParseError, Malformed) as exc:
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
            return _webdav.digest(answer.headers.get("digest", ""), algorithm)
        except Malformed as exc:
            raise self._bad_answer(str(exc), operation, path, answer) from None

    def connect(self) -> None:
        """Open this client's connection (TLS handshake, client certificate) with a
        ``HEAD`` of the test area; the connection stays with the handle. Its answer
        names the door (:attr:`door`), before a load client's clock starts."""
        path = self.endpoint.path
        self._check(self._request("HEAD", path, operation="login",
                                  want_headers=not self.door.known), "login", path)

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
        door = self.door
        if not door.known:
            return None
        # XrdHttp (xrootd 5.5): a checksum asked for right after an upload can crash the
        # server (xrootd/xrootd#2534), and after an overwrite within the same second it
        # announces the old file's adler32; verify there only when asked (adler32)
        return not door.is_xrdhttp

    def _put(self, path: str, data: bytes) -> int:
        """PUT the whole file (overwriting; a missing parent is made), then compare the
        adler32 the server gives with the data's."""
        headers = [*self._auth, *(_DCACHE_PUT_HEADERS if self.door.is_dcache
                                  else _PUT_HEADERS)]
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
            return sum(len(part) for part in _webdav.byteranges(answer.data, boundary.encode()))
        except Malformed as exc:
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
        return _tpc.copy(self._transport, path, path, [
            f"Source: {source.transfer_url(source_path)}", *source.transfer_headers()])

    def push(self, path: str, target: HTTPDriver, target_path: str) -> CopyOutcome:
        """Third-party copy of ``path`` on this client's server to ``target_path`` on
        ``target``'s server, which this server sends it to (``COPY`` with
        ``Destination:``). Guarded on the side written: ``target_path`` must be in
        ``target``'s ``writable_root`` (this server's file is only read)."""
        target._guard("third-party copy", target_path)
        target._made(target_path, "file")
        return _tpc.copy(self._transport, path, target_path, [
            f"Destination: {target.transfer_url(target_path)}", *target.transfer_headers()])

    def counters(self) -> dict[str, float]:
        return {"redirects": self.redirects, "door_seconds": self.door_seconds}

    def close(self) -> None:
        self._transport.close()
        with self._checksums_lock:
            self._checksums.clear()


