"""What went wrong, as the plugin's error types: a libcurl error code or an HTTP status
becomes a :class:`~pytest_storagescale.errors.StorageError` of the right class
(``timeout``, ``unreachable``, ``tls``, ``permission``, ``not_found``...), one
paragraph naming what to change when it is the client's set-up (its CA folder, its
certificate). Knows nothing of handles or requests: the transport and the driver
hand it a code, a status and an answer's bytes."""

from __future__ import annotations

from http import HTTPStatus

import pycurl

from ...errors import (
    BadAnswer,
    StorageError,
    StorageNotFound,
    StoragePermissionDenied,
    StorageTimeout,
    StorageUnreachable,
)
from ...redact import redact_text
from ..version import DEFAULT_CA_DIR

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
_TLS_CODES = _SERVER_CERT_CODES | _HANDSHAKE_CODES | _CLIENT_CERT_CODES
_TIMEOUT_STATUSES = {408, 504}
_PERMISSION_STATUSES = {401, 403}
_NOT_FOUND_STATUSES = {404, 410}


class Malformed(Exception):
    """A field of an answer that cannot be read; the driver raises it as BadAnswer."""


class ErrorMapper:
    """One client's errors: each names its driver, door, operation and path, and the
    native status (``HTTP 404 Not Found``, ``curl error 28``)."""

    __slots__ = ("driver", "endpoint", "timeout", "ca_dir", "certificate", "secure", "token")

    def __init__(self, *, driver: str, endpoint: str, timeout: float, ca_dir: str,
                 certificate: tuple[str | None, str | None], secure: bool,
                 token: str | None) -> None:
        self.driver = driver
        #: the door, as errors name it (``davs://host:port``)
        self.endpoint = endpoint
        self.timeout = timeout
        self.ca_dir = ca_dir
        #: the client certificate and key files (None: none configured)
        self.certificate = certificate
        self.secure = secure
        #: the bearer token sent (None: none), for a 403's "it expired at"
        self.token = token

    def kwargs(self, operation: str, path: str, native: str) -> dict:
        return dict(driver=self.driver, endpoint=self.endpoint, operation=operation,
                    path=path, native_status=native)

    def bad_answer(self, why: str, operation: str, path: str, status: int) -> BadAnswer:
        return BadAnswer(why, error_class="bad_answer",
                         **self.kwargs(operation, path, f"HTTP {status}"))

    def curl(self, exc: pycurl.error, operation: str, path: str,
             fresh: bool = False) -> StorageError:
        """A libcurl error; ``fresh``: it ended a request on a new connection."""
        code, message = exc.args[0], str(exc.args[1] if len(exc.args) > 1 else exc)
        kwargs = self.kwargs(operation, path, f"curl error {code}")
        if code in _TLS_CODES or fresh and self._refused_late(code, message):
            return self.tls(code, message, kwargs)
        if code in _TIMEOUT_CODES:
            return StorageTimeout(f"{message} (deadline {self.timeout:g} s)",
                                  error_class="timeout", **kwargs)
        if code in _UNREACHABLE_CODES:
            return StorageUnreachable(message, error_class="unreachable", **kwargs)
        return StorageError(message, error_class=f"curl_{code}", **kwargs)

    def _refused_late(self, code: int, message: str) -> bool:
        """A TLS 1.3 server refuses a client certificate after the client's side of
        the handshake: its alert ends the first request on the new connection (GnuTLS
        may instead fail the send: "getpeername() failed with errno 107")."""
        if code not in (pycurl.E_SEND_ERROR, pycurl.E_RECV_ERROR):
            return False
        return ("alert" in message.lower() or self.certificate[0] is not None
                or (self.secure and "getpeername" in message))

    def tls(self, code: int, message: str, kwargs: dict) -> StorageError:
        """One paragraph: what failed in the handshake and what to change."""
        cert, key = self.certificate
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

    def status(self, status: int, data: bytes, operation: str, path: str) -> StorageError:
        """An answer whose status is not a success; ``data``: its body (an error page)."""
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        kwargs = self.kwargs(operation, path, f"HTTP {status} {reason}".strip())
        text = " ".join(text_of(data).split())[:200] or reason or f"HTTP {status}"
        if status in _NOT_FOUND_STATUSES:
            return StorageNotFound(text, error_class="not_found", **kwargs)
        if status in _PERMISSION_STATUSES:
            from ..grid import token_expired_at  # a 403 does not say the token expired

            expired = token_expired_at(self.token) if self.token else ""
            return StoragePermissionDenied(
                text + (f"; the token sent expired at {expired}" if expired else ""),
                error_class="permission", **kwargs)
        if status in _TIMEOUT_STATUSES:
            return StorageTimeout(text, error_class="timeout", **kwargs)
        if status == 507:
            return StorageError(f"no space left: {text}", error_class="no_space", **kwargs)
        return StorageError(text, error_class=f"http_{status}", **kwargs)


def text_of(data: bytes) -> str:
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
