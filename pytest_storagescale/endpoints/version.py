"""Storage version detection, used to choose the thresholds file.

Each driver answers :meth:`~pytest_storagescale.drivers.base.Driver.version` in its
own protocol, through a ``version`` connection (:func:`detect_version`):

- ``xrootd`` on ``root://``: XRootD ``query config version`` (``5.5.3``);
- ``gfal2`` on ``davs://``/``https://``: the door's ``Server:`` header (dCache's
  WebDAV door says ``dCache/9.2.4``, XrdHttp says ``XrootD/v5.5.3``), read with TLS
  verified against the CA directory (:func:`server_header_version`);
- ``gfal2`` on ``root://`` cannot ask; ``--storage-version`` gives the version.
"""

from __future__ import annotations

import http.client
import os
import re
import ssl
from typing import TYPE_CHECKING

from ..errors import StorageError, StorageUnreachable
from .url import HTTPS_SCHEMES, EndpointURL

if TYPE_CHECKING:
    from ..drivers.spec import DriverSpec

#: the CA folder of grid hosts, where gfal2 and XRootD look by default
DEFAULT_CA_DIR = "/etc/grid-security/certificates"
_SERVER_RE = re.compile(r"(?:dcache|xrootd|eos)[/ -]v?(\d+(?:\.\d+)*(?:-\d+)?)", re.IGNORECASE)


def version_from_server_header(header: str) -> str | None:
    """``dCache/9.2.4`` -> ``9.2.4``; ``XrootD/v5.5.3`` -> ``5.5.3``; else None."""
    match = _SERVER_RE.search(header or "")
    return match.group(1) if match else None


def detect_version(spec: DriverSpec, *, timeout: float = 15) -> str:
    """The storage version, asked by the driver over its own ``version`` connection."""
    driver = spec.connect("version", timeout=timeout)
    try:
        return driver.version()
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
            connection = http.client.HTTPSConnection(
                endpoint.host, endpoint.port or 443, timeout=timeout, context=context)
        else:
            connection = http.client.HTTPConnection(endpoint.host, endpoint.port or 80,
                                                    timeout=timeout)
        connection.request("HEAD", endpoint.path + "/", headers=headers)
        response = connection.getresponse()
        server = response.getheader("Server", "")
        connection.close()
    except ssl.SSLError as exc:
        raise StorageUnreachable(
            f"TLS: {exc}. The server's certificate is checked against the CA folder "
            f"{ca_dir} (driver option ca_dir, else $X509_CERT_DIR, else {DEFAULT_CA_DIR}); "
            f"install the CA there or point ca_dir at the folder holding it",
            error_class="tls", **kwargs) from None
    except OSError as exc:
        raise StorageUnreachable(str(exc), error_class="unreachable", **kwargs) from None
    version = version_from_server_header(server)
    if version is None:
        raise StorageError(
            f"the Server header {server!r} names no version I can read", error_class="version",
            **kwargs,
        )
    return version
