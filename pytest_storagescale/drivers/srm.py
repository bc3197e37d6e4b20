"""An SRM door's version: its ``srmPing`` answer (SRM v2.2), read without gfal2.

gfal2's SRM plugin pings the door, but what it hands out of the answer is the
``backend_type`` only (the extended attribute ``srm.type``: ``dCache``); the
``backend_version`` beside it (``11.2.5``) is not offered, and no gfal2 request
asks for it. So :func:`srm_ping` sends the SOAP ``srmPing`` itself, as ``srm-ping``
(dCache's own client) does: over TLS verified against the grid CA folder, presenting
the user's X.509 proxy or certificate, to the door's service path
(``/srm/managerv2``). dCache's SRM port speaks ``httpg``: after the TLS handshake the
client sends one byte saying whether it delegates a credential (``0``: none), then
HTTP. A plain-TLS SRM port (dCache's ``srm.net.ssl-port``) is asked over HTTPS when
the ``httpg`` exchange gets no 200 (it reads the flag as the request's first byte and
answers 501). Seen against dCache 10.2.25 and 11.2.5:
``versionInfo`` ``v2.2``, ``backend_type`` ``dCache``, ``backend_version`` the
release.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from typing import NamedTuple
from xml.etree import ElementTree

from ..errors import (
    BadAnswer,
    StorageError,
    StorageNotFound,
    StoragePermissionDenied,
    StorageTimeout,
    StorageUnreachable,
)
from .url import EndpointURL
from .version import DEFAULT_CA_DIR
from .xmlsafe import fromstring as _fromstring

#: the service path of an SRM v2.2 endpoint when the URL names none (gfal2's default)
SERVICE_PATH = "/srm/managerv2"
#: the most of an answer read
ANSWER_LIMIT = 4 * 1024 * 1024
_PING = (b'<?xml version="1.0" encoding="UTF-8"?>'
         b'<SOAP-ENV:Envelope xmlns:SOAP-ENV="http://schemas.xmlsoap.org/soap/envelope/" '
         b'xmlns:srm="http://srm.lbl.gov/StorageResourceManager"><SOAP-ENV:Body>'
         b'<srm:srmPing><srmPingRequest></srmPingRequest></srm:srmPing>'
         b'</SOAP-ENV:Body></SOAP-ENV:Envelope>')


class PingAnswer(NamedTuple):
    """What ``srmPing`` answered."""

    #: the SRM protocol version (``v2.2``)
    srm_version: str
    #: ``otherInfo``'s key/value pairs (``backend_type``, ``backend_version``)
    info: dict[str, str]

    @property
    def backend_version(self) -> str | None:
        return self.info.get("backend_version")


def read_ping_answer(data: bytes) -> PingAnswer:
    """The ``srmPing`` answer in an HTTP answer's body (ValueError when unreadable)."""
    try:
        root = _fromstring(data)
    except ElementTree.ParseError as exc:
        raise ValueError(f"not XML: {exc}") from None
    version, info = "", {}
    for element in root.iter():
        tag = element.tag.rpartition("}")[2]
        if tag == "versionInfo":
            version = (element.text or "").strip()
        elif tag == "extraInfoArray":
            fields = {child.tag.rpartition("}")[2]: (child.text or "").strip()
                      for child in element}
            if fields.get("key"):
                info[fields["key"]] = fields.get("value", "")
    if not version and not info:
        raise ValueError("no srmPingResponse in the answer")
    return PingAnswer(version, info)


def _credential(x509_proxy: str | None) -> tuple[str, str] | None:
    """The certificate and key files to present: the proxy option, else
    ``$X509_USER_PROXY``, else ``$X509_USER_CERT``/``$X509_USER_KEY``, else the
    default proxy file ``/tmp/x509up_u<uid>`` (where gfal2 looks too)."""
    proxy = x509_proxy or os.environ.get("X509_USER_PROXY")
    if proxy:
        return proxy, proxy
    cert = os.environ.get("X509_USER_CERT")
    if cert:
        return cert, os.environ.get("X509_USER_KEY") or cert
    default = f"/tmp/x509up_u{os.getuid()}"  # noqa: S108 - the grid's default proxy path
    return (default, default) if os.path.exists(default) else None


class _PastDeadline(Exception):
    """The exchange's deadline passed while the answer was still coming."""


def _exchange(endpoint: EndpointURL, context: ssl.SSLContext, path: str, body: bytes,
              timeout: float, httpg: bool) -> bytes:
    """One SOAP POST (``httpg``: after the delegation byte); the whole answer."""
    # Host: an IPv6 address in brackets (RFC 7230 5.4, the URI's form)
    request = (f"POST {path} HTTP/1.1\r\nHost: {endpoint.netloc_host}\r\n"
               f"Content-Type: text/xml; charset=utf-8\r\nSOAPAction: \"\"\r\n"
               f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    deadline = time.monotonic() + timeout  # the whole exchange's: a door sending a
    raw = None
    try:  # a connect or TLS handshake that outlasts the deadline is a timeout too
        raw = socket.create_connection((endpoint.host, endpoint.port or 8443),
                                       timeout=timeout)
        connection = context.wrap_socket(raw, server_hostname=endpoint.host)
    except TimeoutError:
        if raw is not None:
            raw.close()
        raise _PastDeadline(f"no connection and TLS handshake within {timeout:.3g} s"
                            ) from None
    with connection:
        if httpg:  # its own TLS record: the door reads the record as the flag
            connection.sendall(b"0")
        connection.sendall(request + body)
        answer = b""
        while len(answer) <= ANSWER_LIMIT:
            left = deadline - time.monotonic()  # byte at a time keeps no call forever
            if left <= 0:
                raise _PastDeadline(f"no whole answer within {timeout:.3g} s "
                                    f"({len(answer)} bytes came)")
            connection.settimeout(left)
            try:
                chunk = connection.recv(65536)
            except TimeoutError:
                raise _PastDeadline(f"no whole answer within {timeout:.3g} s "
                                    f"({len(answer)} bytes came)") from None
            if not chunk:
                break
            answer += chunk
    return answer


def soap_call(endpoint: EndpointURL, body: bytes, *, ca_dir: str | None = None,
              x509_proxy: str | None = None, timeout: float = 15,
              operation: str = "version", path: str | None = None) -> bytes:
    """POST the SOAP ``body`` to the SRM door of ``endpoint`` (``srm://host:port/...``)
    and return the answer's body (an HTTP 200's; else a StorageError naming
    ``operation``)."""
    kwargs = dict(driver="gfal2", endpoint=endpoint.server, operation=operation,
                  path=endpoint.path if path is None else path)
    ca_dir = ca_dir or os.environ.get("X509_CERT_DIR") or DEFAULT_CA_DIR
    path = SERVICE_PATH
    if "?SFN=" in endpoint.url:  # srm://host:port/srm/managerv2?SFN=/path
        path = endpoint.url.split("?SFN=", 1)[0].split(endpoint.server, 1)[-1] or path
    try:
        context = ssl.create_default_context(capath=ca_dir)
        credential = _credential(x509_proxy)
        if credential is not None:
            context.load_cert_chain(*credential)
        answer = _exchange(endpoint, context, path, body, timeout, httpg=True)
        if not answer.startswith(b"HTTP/1.1 200 "):
            # a plain-TLS SRM port reads the delegation byte as the request's first
            # (dCache: 501 Not Implemented): HTTPS there
            answer = _exchange(endpoint, context, path, body, timeout, httpg=False)
    except _PastDeadline as exc:
        raise StorageTimeout(f"the SRM door: {exc}", error_class="timeout",
                             **kwargs) from None
    except ssl.SSLError as exc:
        raise StorageUnreachable(
            f"TLS: {exc}. The SRM door's certificate is checked against the CA folder "
            f"{ca_dir} (driver option ca_dir, else $X509_CERT_DIR, else {DEFAULT_CA_DIR}) "
            f"and the door needs an X.509 proxy or certificate (driver option x509_proxy, "
            f"else $X509_USER_PROXY)", error_class="tls", **kwargs) from None
    except OSError as exc:
        raise StorageUnreachable(str(exc), error_class="unreachable", **kwargs) from None
    head, _, data = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    if " 200 " not in status + " ":
        raise StorageError(f"the SRM door answered {status[:100]!r}",
                           error_class="version" if operation == "version" else "srm",
                           **kwargs)
    return _unchunked(data) if b"chunked" in head.lower() else data


def srm_ping(endpoint: EndpointURL, *, ca_dir: str | None = None,
             x509_proxy: str | None = None, timeout: float = 15) -> PingAnswer:
    """Ping the SRM door of ``endpoint`` (``srm://host:port/...``)."""
    data = soap_call(endpoint, _PING, ca_dir=ca_dir, x509_proxy=x509_proxy, timeout=timeout)
    try:
        return read_ping_answer(data)
    except ValueError as exc:
        raise StorageError(f"unreadable srmPing answer: {exc}", error_class="version",
                           driver="gfal2", endpoint=endpoint.server, operation="version",
                           path=endpoint.path) from None


def _unchunked(body: bytes) -> bytes:
    """A chunked HTTP body's bytes."""
    out, position = b"", 0
    while True:
        end = body.find(b"\r\n", position)
        if end < 0:
            return out
        try:
            size = int(body[position:end].split(b";")[0], 16)
        except ValueError:
            return out
        if size == 0:
            return out
        out += body[end + 2:end + 2 + size]
        position = end + 2 + size + 2


# -- srmLs: a listing gfal2 2.21 cannot make -------------------------------------------
#: entries asked for per srmLs (dCache's srm.limits.ls.entries is 1000 by default)
LS_COUNT = 1000
_LS_PENDING = ("SRM_REQUEST_QUEUED", "SRM_REQUEST_INPROGRESS")
_LS_NOT_FOUND = ("SRM_INVALID_PATH",)
_LS_REFUSED = ("SRM_AUTHORIZATION_FAILURE", "SRM_AUTHENTICATION_FAILURE")


def _envelope(operation: str, inner: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><SOAP-ENV:Envelope xmlns:SOAP-ENV="ht'
            f'tp://schemas.xmlsoap.org/soap/envelope/" xmlns:srm="http://srm.lbl.gov/Stora'
            f'geResourceManager"><SOAP-ENV:Body><srm:{operation}><{operation}Request>'
            f'{inner}</{operation}Request></srm:{operation}></SOAP-ENV:Body>'
            f'</SOAP-ENV:Envelope>').encode()


def ls_request(surl: str, offset: int = 0, count: int = LS_COUNT) -> bytes:
    """The srmLs gfal2's readdir sends: one SURL, one level, a slice of the entries."""
    return _envelope("srmLs", (
        f"<arrayOfSURLs><urlArray>{_xml_text(surl)}</urlArray></arrayOfSURLs>"
        f"<fullDetailedList>false</fullDetailedList><numOfLevels>1</numOfLevels>"
        f"<offset>{offset}</offset><count>{count}</count>"))


def _xml_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class LsAnswer(NamedTuple):
    """What an srmLs (or srmStatusOfLsRequest) answered."""

    #: the request's status code (``SRM_SUCCESS``, ``SRM_REQUEST_QUEUED``...)
    status: str
    explanation: str
    #: the token to ask for the outcome of a queued request
    token: str
    #: the directory's own status code, and the paths below it
    entry_status: str
    paths: list[str]


def read_ls_answer(data: bytes) -> LsAnswer:
    """An srmLs or srmStatusOfLsRequest answer (ValueError when unreadable)."""
    try:
        root = _fromstring(data)
    except ElementTree.ParseError as exc:
        raise ValueError(f"not XML: {exc}") from None

    def tag(element: ElementTree.Element) -> str:
        return element.tag.rpartition("}")[2]

    response = next((e for e in root.iter() if tag(e).endswith("Response")
                     and tag(e).startswith(("srmLs", "srmStatusOfLs"))), None)
    if response is None:
        raise ValueError("no srmLs answer")
    status = explanation = token = entry_status = ""
    paths: list[str] = []
    for child in response.iter():
        name = tag(child)
        if name == "returnStatus" and not status:
            status = (child.findtext("statusCode") or "").strip()
            explanation = (child.findtext("explanation") or "").strip()
        elif name == "requestToken":
            token = (child.text or "").strip()
        elif name == "details":
            top = next((e for e in child if tag(e) == "pathDetailArray"), None)
            if top is not None:
                entry_status = (top.findtext("status/statusCode") or "").strip()
                for below in top.iter():
                    if tag(below) == "arrayOfSubPaths":
                        paths += [(e.findtext("path") or "").strip() for e in below
                                  if tag(e) == "pathDetailArray"]
    return LsAnswer(status, explanation, token, entry_status, paths)


def srm_ls(endpoint: EndpointURL, surl: str, path: str, *, ca_dir: str | None = None,
           x509_proxy: str | None = None, timeout: float = 60) -> list[str]:
    """The names in directory ``path`` (``surl``), by srmLs slices of
    :data:`LS_COUNT` (a queued request asked again for its outcome until ``timeout``)."""
    kwargs = dict(driver="gfal2", endpoint=endpoint.server, operation="ls", path=path)
    own = "/" + path.strip("/")
    names: list[str] = []
    deadline = time.monotonic() + timeout  # the whole listing's, every slice within it

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StorageTimeout(f"srmLs: the listing did not end within {timeout:g} s "
                                 f"({len(names)} names so far)", error_class="timeout",
                                 **kwargs)
        return remaining

    while True:
        answer = _ls_answer(endpoint, ls_request(surl, len(names)), kwargs, ca_dir,
                            x509_proxy, left())
        pause = 0.05
        while answer.status in _LS_PENDING and time.monotonic() < deadline:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 1.0)
            answer = _ls_answer(endpoint, _envelope("srmStatusOfLsRequest", (
                f"<requestToken>{_xml_text(answer.token)}</requestToken>")), kwargs, ca_dir,
                x509_proxy, left())
        _raise_for(answer, kwargs)
        found = [entry for entry in answer.paths if entry.rstrip("/") != own]
        names += [entry.rstrip("/").rpartition("/")[2] for entry in found]
        if len(found) < LS_COUNT:
            return sorted(names)


def _ls_answer(endpoint: EndpointURL, body: bytes, kwargs: dict, ca_dir: str | None,
               x509_proxy: str | None, timeout: float) -> LsAnswer:
    data = soap_call(endpoint, body, ca_dir=ca_dir, x509_proxy=x509_proxy, timeout=timeout,
                     operation="ls", path=kwargs["path"])
    try:
        return read_ls_answer(data)
    except ValueError as exc:
        raise BadAnswer(f"unreadable srmLs answer: {exc}", error_class="bad_answer",
                        **kwargs) from None


def _raise_for(answer: LsAnswer, kwargs: dict) -> None:
    """Nothing for a successful listing; else the error its status says."""
    codes = (answer.status, answer.entry_status)
    why = f"srmLs: {answer.status} {answer.explanation}".strip()
    if any(code in _LS_NOT_FOUND for code in codes):
        raise StorageNotFound(why, error_class="not_found", **kwargs)
    if any(code in _LS_REFUSED for code in codes):
        raise StoragePermissionDenied(why, error_class="permission", **kwargs)
    if answer.status in _LS_PENDING:
        raise StorageTimeout(f"{why}: still pending at the deadline", error_class="timeout",
                             **kwargs)
    if answer.status != "SRM_SUCCESS":
        raise StorageError(why, error_class="srm", **kwargs)
