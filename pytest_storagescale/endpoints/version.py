"""Storage version detection, used to choose the thresholds file.

- ``root://``: XRootD ``query config version`` (``5.5.3``);
- ``davs://``/``https://``: the door's ``Server:`` header (dCache's WebDAV door says
  ``dCache/9.2.4``, XrdHttp says ``XrootD/v5.5.3``), read with TLS verified against
  the CA directory.
"""

from __future__ import annotations

import http.client
import re
import ssl

from ..errors import StorageError, StorageUnreachable
from .url import EndpointURL

_SERVER_RE = re.compile(r"(?:dcache|xrootd|eos)[/ -]v?(\d+(?:\.\d+)*(?:-\d+)?)", re.IGNORECASE)


def version_from_server_header(header: str) -> str | None:
    """``dCache/9.2.4`` -> ``9.2.4``; ``XrootD/v5.5.3`` -> ``5.5.3``; else None."""
    match = _SERVER_RE.search(header or "")
    return match.group(1) if match else None


def detect_version(endpoint: EndpointURL, *, ca_dir: str | None = None,
                   timeout: float = 15) -> str:
    if endpoint.scheme in ("root", "xroot", "roots"):
        from ..drivers.xrootd import XRootDDriver

        return XRootDDriver(endpoint, client_id="ssversn", timeout=timeout).version()
    secure = endpoint.scheme in ("davs", "https")
    kwargs = dict(driver="http", endpoint=endpoint.server, operation="version",
                  path=endpoint.path)
    try:
        if secure:
            context = ssl.create_default_context(capath=ca_dir or "/etc/grid-security/certificates")
            connection = http.client.HTTPSConnection(
                endpoint.host, endpoint.port or 443, timeout=timeout, context=context)
        else:
            connection = http.client.HTTPConnection(endpoint.host, endpoint.port or 80,
                                                    timeout=timeout)
        connection.request("HEAD", endpoint.path + "/")
        response = connection.getresponse()
        server = response.getheader("Server", "")
        connection.close()
    except ssl.SSLError as exc:
        raise StorageUnreachable(f"TLS: {exc}", error_class="tls", **kwargs) from None
    except OSError as exc:
        raise StorageUnreachable(str(exc), error_class="unreachable", **kwargs) from None
    version = version_from_server_header(server)
    if version is None:
        raise StorageError(
            f"the Server header {server!r} names no version I can read", error_class="version",
            **kwargs,
        )
    return version
