"""Storage version detection, used to choose the thresholds file.

Each driver answers :meth:`~pytest_storagescale.drivers.base.Driver.version` in its
own protocol, through a ``version`` connection (:func:`detect_version`):

- ``xrootd`` on ``root://``: XRootD ``query config version`` (``v5.5.3``; dCache's
  xrootd door answers ``dCache 11.2.5``: :func:`version_from_config_answer`);
- ``gfal2`` on ``srm://``: the SRM door's ``srmPing`` (its ``backend_version``;
  :func:`~pytest_storagescale.drivers.srm.srm_ping`);
- ``gfal2`` on ``davs://``/``https://``: the door's ``Server:`` header (dCache's
  WebDAV door says ``dCache/9.2.4``, XrdHttp says ``XrootD/v5.5.3``), read with TLS
  verified against the CA directory (:func:`server_header_version`);
- ``gfal2`` on ``root://`` cannot ask; ``--storage-version`` gives the version.
"""

from __future__ import annotations

import http.client
import multiprocessing
import os
import re
import ssl
import traceback
from typing import TYPE_CHECKING

from .. import errors
from ..errors import (
    StorageError,
    StorageNotFound,
    StorageScaleUsageError,
    StorageTimeout,
    StorageUnreachable,
    exit_text,
)
from .url import HTTPS_SCHEMES, EndpointURL

if TYPE_CHECKING:
    from .spec import DriverSpec

#: the CA folder of grid hosts, where gfal2 and XRootD look by default
DEFAULT_CA_DIR = "/etc/grid-security/certificates"
_SERVER_RE = re.compile(r"(?:dcache|xrootd|eos)[/ -]v?(\d+(?:\.\d+)*(?:-\d+)?)", re.IGNORECASE)


def version_from_server_header(header: str) -> str | None:
    """``dCache/9.2.4`` -> ``9.2.4``; ``XrootD/v5.5.3`` -> ``5.5.3``; else None."""
    match = _SERVER_RE.search(header or "")
    return match.group(1) if match else None


#: XRootD's ``query config version`` answer: ``v5.5.3`` (xrootd), ``dCache 11.2.5``
#: (dCache's xrootd door), possibly with a trailing NUL or newline
_CONFIG_RE = re.compile(r"^\s*(?:[A-Za-z][\w.-]*\s+)?v?(\d+(?:\.\d+)*(?:[-.\w]*)?)\s*$")


def version_from_config_answer(answer: str) -> str | None:
    """``dCache 11.2.5`` -> ``11.2.5``; ``v5.5.3`` -> ``5.5.3``; else None."""
    match = _CONFIG_RE.match(answer.replace("\0", ""))
    return match.group(1) if match else None


def detect_version(spec: DriverSpec, *, timeout: float = 15) -> str:
    """The storage version, asked by the driver over its own ``version`` connection."""
    driver = spec.connect("version", timeout=timeout)
    try:
        return driver.version()
    finally:
        driver.close()


def first_contact(spec: DriverSpec, *, want_version: bool, timeout: float) -> str | None:
    """The session's first requests to an endpoint: log in, stat the test area and,
    when ``want_version``, ask the version (returned; else None). A test area that
    does not exist is not an error here (the run area says so, with its command).

    A driver whose requests go through a compiled client library
    (``Driver.native_library``) makes them in a short-lived spawned process: a server
    answering garbage may crash that library (XrdCl aborts on some malformed frames),
    and the crash becomes a :class:`StorageError` naming the endpoint and the signal,
    not the end of the session. Each request has a deadline of ``timeout`` + 2 s,
    kept even by a library that ignores its own timeout (the child is killed)."""
    if not spec.driver_class.native_library:
        return _contact(spec, want_version, timeout)
    spawn = multiprocessing.get_context("spawn")  # the XRootD client breaks after fork
    parent_end, child_end = spawn.Pipe(duplex=False)
    child = spawn.Process(target=_contact_main, name="storagescale-first-contact",
                          args=(spec, want_version, timeout, child_end), daemon=True)
    child.start()
    child_end.close()
    try:
        answer = _answer(parent_end, timeout)
    finally:
        parent_end.close()
        if child.is_alive():
            child.kill()
        child.join(5)
    return _outcome(answer, child.exitcode, spec, timeout)


#: how long the child may take to start and import the client library
CONTACT_START_TIMEOUT = 60.0
#: the child's requests: login, version, stat
_CONTACT_REQUESTS = 3


def _answer(connection, timeout: float) -> tuple | None:
    """The child's answer, or None when it died or outlived its deadline."""
    try:
        if not connection.poll(CONTACT_START_TIMEOUT) or connection.recv() != "started":
            return None
        deadline = _CONTACT_REQUESTS * (timeout + 2)
        return connection.recv() if connection.poll(deadline) else ("deadline", deadline)
    except (EOFError, OSError):  # the child died (the pipe closed with it)
        return None


def _outcome(answer: tuple | None, exitcode: int | None, spec: DriverSpec,
             timeout: float) -> str | None:
    where = dict(driver=spec.name, endpoint=spec.endpoint.server, path=spec.endpoint.path)
    if answer is None:
        how = "did not start" if exitcode is None else exit_text(exitcode)
        raise StorageError(
            f"the {spec.name} client library crashed while talking to the server for the "
            f"first time ({how}, in a child process made for that). The server at "
            f"{spec.endpoint.server} may not speak this protocol, or answered something "
            f"the library cannot read", operation="first contact", error_class="crash",
            **where)
    kind, *rest = answer
    if kind == "ok":
        return rest[0]
    if kind == "deadline":
        raise StorageTimeout(f"no answer within {rest[0]:g} s (the request was abandoned)",
                             operation="first contact", error_class="deadline", **where)
    if kind == "usage":
        raise StorageScaleUsageError(rest[0])
    if kind == "storage":
        name, message, operation, path, status, error_class = rest
        cls = getattr(errors, name, StorageError)
        cls = cls if isinstance(cls, type) and issubclass(cls, StorageError) else StorageError
        raise cls(message, driver=spec.name, endpoint=spec.endpoint.server,
                  operation=operation, path=path, native_status=status,
                  error_class=error_class)
    raise RuntimeError(f"the first contact with the storage failed:\n{rest[0]}")


def _contact_main(spec: DriverSpec, want_version: bool, timeout: float, connection) -> None:
    """The child process of :func:`first_contact`: one answer on ``connection``."""
    connection.send("started")  # the client library is imported: the deadline starts
    try:
        connection.send(("ok", _contact(spec, want_version, timeout)))
    except StorageError as exc:
        connection.send(("storage", type(exc).__name__, exc.message, exc.operation,
                         exc.path, exc.native_status, exc.error_class))
    except StorageScaleUsageError as exc:
        connection.send(("usage", str(exc)))
    except Exception:  # noqa: BLE001 - a bug: the parent raises it with this traceback
        connection.send(("bug", traceback.format_exc()))
    finally:
        connection.close()
        os._exit(0)  # a hung request's thread, or the library's exit, must not matter


def _contact(spec: DriverSpec, want_version: bool, timeout: float) -> str | None:
    from .watch import RequestWatch, run_bounded

    driver = spec.connect("version", timeout=timeout)

    def requests() -> str | None:
        version = driver.version() if want_version else None
        try:
            driver.stat(spec.endpoint.path)
        except StorageNotFound:
            pass  # said by the run area, with the command that makes it
        return version

    try:
        return run_bounded(requests, RequestWatch(driver), timeout + 2, "first contact")
    finally:
        driver.close()


def server_header_version(endpoint: EndpointURL, *, ca_dir: str | None = None,
                          x509_proxy: str | None = None, token: str | None = None,
                          timeout: float = 15) -> str:
    """The version in an HTTP door's ``Server`` header (a ``HEAD`` of the test area),
    presenting the proxy certificate or the bearer token when given."""
    secure = endpoint.scheme in HTTPS_SCHEMES
    kwargs = dict(driver="http", endpoint=endpoint.server, operation="version",
                  path=endpoint.path)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # where gfal2 (davix) looks too: the option, else $X509_CERT_DIR, else the grid default
    ca_dir = ca_dir or os.environ.get("X509_CERT_DIR") or DEFAULT_CA_DIR
    try:
        if secure:
            context = ssl.create_default_context(capath=ca_dir)
            if x509_proxy:
                context.load_cert_chain(x509_proxy)  # a proxy file holds cert, key and chain
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                endpoint.host, endpoint.port or 443, timeout=timeout, context=context)
        else:
            connection = http.client.HTTPConnection(endpoint.host, endpoint.port or 80,
                                                    timeout=timeout)
        connection.request("HEAD", endpoint.path + "/", headers=headers)
        response = connection.getresponse()
        server = response.getheader("Server", "")
        response.read()
        # XRootD 6 names no version there: its listing page, on the same connection
        page, why = (listing_page(connection, endpoint.path, headers)
                     if names_xrootd_without_version(server) else (b"", ""))
        connection.close()
    except ssl.SSLError as exc:
        raise StorageUnreachable(
            f"TLS: {exc}. The server's certificate is checked against the CA folder "
            f"{ca_dir} (driver option ca_dir, else $X509_CERT_DIR, else {DEFAULT_CA_DIR}); "
            f"install the CA there or point ca_dir at the folder holding it",
            error_class="tls", **kwargs) from None
    except OSError as exc:
        raise StorageUnreachable(str(exc), error_class="unreachable", **kwargs) from None
    version = version_from_server_header(server) or version_from_listing(page)
    if version is None:
        raise StorageError(
            unknown_xrootd_version(server, why or "it names none") if why or page else
            f"the Server header {server!r} names no version I can read", error_class="version",
            **kwargs,
        )
    return version


# -- XRootD 6: a Server header without the version ---------------------------------
#: XrdHttp since XRootD 6 sends ``Server: XRootD``, the product without its version
_BARE_XROOTD = re.compile(r"\s*xrootd\s*", re.IGNORECASE)
#: XrdHttp's listing page (a GET of a folder) ends "Powered by XrdHTTP v6.2.1 (CERN IT-SDC)"
_LISTING_RE = re.compile(rb"Powered by XrdHTTP v?(\d+(?:\.\d+)+)", re.IGNORECASE)
#: the most of a listing page read for the version (a larger folder: version unknown)
LISTING_READ = 1024 * 1024


def names_xrootd_without_version(header: str) -> bool:
    """Whether a ``Server`` header is XRootD's with no version (``XRootD``, 6.x)."""
    return bool(_BARE_XROOTD.fullmatch(header or ""))


def version_from_listing(page: bytes) -> str | None:
    """The version on XrdHttp's listing page (``Powered by XrdHTTP v6.2.1``), else None."""
    match = _LISTING_RE.search(page or b"")
    return match.group(1).decode() if match else None


def unknown_xrootd_version(header: str, why: str) -> str:
    """Why an XrdHttp door's version stays unknown, and how to state it."""
    return (f"the version of this XRootD is unknown: its Server header {header!r} names "
            f"none (XrdHttp sends none since XRootD 6) and its listing page, asked instead, "
            f"did not say it ({why}). The version chooses the thresholds file; state it "
            f"with --storage-version VERSION (e.g. 6.2.1), or test the server's root:// "
            f"door, whose 'query config version' answers it")


def listing_page(connection: http.client.HTTPConnection, path: str,
                 headers: dict[str, str]) -> tuple[bytes, str]:
    """A ``GET`` of folder ``path`` on an open connection to an XrdHttp door: its listing
    page (up to :data:`LISTING_READ` bytes) and "", or b"" and why there is none."""
    try:
        connection.request("GET", path.rstrip("/") + "/",
                           headers={**headers, "Accept": "text/html"})
        response = connection.getresponse()
        page = response.read(LISTING_READ + 1)
    except (OSError, http.client.HTTPException) as exc:
        return b"", f"GET {path}/: {exc}"
    if response.status != 200:
        return b"", f"GET {path}/ answered HTTP {response.status} {response.reason}"
    if len(page) > LISTING_READ:
        return b"", f"GET {path}/: a listing longer than {LISTING_READ:,} bytes"
    return page, ""
