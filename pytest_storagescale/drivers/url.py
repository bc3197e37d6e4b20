"""Endpoint URLs: ``root://host:1094//eos/test/storagescale``, ``davs://host/path``, ``file:///dir``.

The URL's path is the *test area*. The plugin makes one directory per run under it
and never writes, renames or deletes outside that directory.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

from ..errors import EndpointError
from ..redact import redact_url

#: the XRootD protocol's schemes (their URLs write an absolute path after a second /)
XROOTD_SCHEMES = ("root", "xroot", "roots")
#: HTTP and WebDAV
HTTP_SCHEMES = ("davs", "https", "dav", "http")
#: HTTP over TLS
HTTPS_SCHEMES = ("davs", "https")


@dataclass(frozen=True)
class EndpointURL:
    """A parsed endpoint: scheme, host, port, credentials-free display form, path."""

    url: str = field(repr=False)  # may hold credentials: shown only redacted
    scheme: str
    host: str
    port: int | None
    path: str
    #: XRootD's rule: the absolute path follows a second slash (``root://host//area``)
    xrootd: bool = False

    @classmethod
    def parse(cls, url: str, *, xrootd: bool | None = None) -> EndpointURL:
        """``url`` parsed; ``xrootd``: it follows XRootD's ``//path`` rule (None: as its
        scheme says; a driver class tells for its schemes, :meth:`Driver.is_xrootd`)."""
        shown = redact_url(url)  # errors name the URL, never its password
        parts = split_url(url)
        scheme = parts.scheme.lower()
        if scheme == "file":
            _check_file_url(parts, shown)
        path = parts.path
        xrootd = scheme in XROOTD_SCHEMES if xrootd is None else xrootd
        if xrootd and path.startswith("//"):
            path = path[1:]
        path = posixpath.normpath(path or "/")
        if scheme != "file" and not parts.hostname:
            raise EndpointError(
                f"--storage-endpoint: {shown!r} has no host. Write e.g. "
                f"{scheme}://host:port//path/to/test/area."
            )
        if path in ("/", "//"):
            raise EndpointError(
                f"--storage-endpoint: {shown!r} has no test-area path. The path is the folder "
                f"the plugin may write in (it makes a per-run directory there); give one, "
                f"e.g. {redact_url(scheme + '://' + parts.netloc)}//store/test/storagescale."
            )
        try:
            port = parts.port
        except ValueError:
            raise EndpointError(f"--storage-endpoint: {shown!r} has an invalid port.") from None
        return cls(url=url, scheme=scheme, host=parts.hostname or "", port=port, path=path,
                   xrootd=xrootd)

    @property
    def netloc_host(self) -> str:
        """The host as a URL writes it: an IPv6 address in brackets (``[fd00::1]``)."""
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def server(self) -> str:
        """``scheme://host:port`` without credentials."""
        port = f":{self.port}" if self.port else ""
        return f"{self.scheme}://{self.netloc_host}{port}"

    @property
    def display(self) -> str:
        """The URL without user or password, for headers, tables and results."""
        sep = "/" if self.xrootd else ""
        return f"{self.server}{sep}{self.path}" if self.scheme != "file" else f"file://{self.path}"


def split_url(url: str) -> SplitResult:
    """``urlsplit``, with a malformed host (``root://[::1//area``: an IPv6 address
    without its ``]``) as one paragraph instead of a ``ValueError``."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise EndpointError(
            f"--storage-endpoint: {redact_url(url)!r} cannot be read as a URL ({exc}). Write "
            f"scheme://host:port//path, an IPv6 host in brackets: root://[::1]:1094//data/area."
        ) from None
    return parts


def _check_file_url(parts: SplitResult, shown: str) -> None:
    """``file://relative/area`` names the host ``relative``, not a folder: refused."""
    if parts.netloc in ("", "localhost") and parts.path.startswith("/"):
        return
    host = f" ({parts.netloc!r} after file:// is read as a host name)" if parts.netloc else ""
    raise EndpointError(
        f"--storage-endpoint: {shown!r} is not an absolute file URL{host}. A file URL names "
        f"an absolute folder after three slashes: file:///abs/path/to/area (file://$PWD/area "
        f"for a folder here)."
    )


def is_inside(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or below it (after normalising ``..``)."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")
