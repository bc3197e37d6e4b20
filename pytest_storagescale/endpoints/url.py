"""Endpoint URLs: ``root://host:1094//eos/test/storagescale``, ``davs://host/path``, ``file:///dir``.

The URL's path is the *test area*. The plugin makes one directory per run under it
and never writes, renames or deletes outside that directory.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import EndpointError


@dataclass(frozen=True)
class EndpointURL:
    """A parsed endpoint: scheme, host, port, credentials-free display form, path."""

    url: str
    scheme: str
    host: str
    port: int | None
    path: str

    @classmethod
    def parse(cls, url: str) -> EndpointURL:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        from ..drivers.registry import known_schemes  # a site may register drivers

        if scheme not in known_schemes():
            raise EndpointError(
                f"--storage-endpoint: {url!r} has scheme {parts.scheme or '(none)'!r}. Known "
                f"schemes: {', '.join(s + '://' for s in known_schemes())}. Example: "
                f"root://host:1094//eos/test/storagescale."
            )
        path = parts.path
        if scheme in ("root", "xroot", "roots") and path.startswith("//"):
            path = path[1:]
        path = posixpath.normpath(path or "/")
        if scheme != "file" and not parts.hostname:
            raise EndpointError(
                f"--storage-endpoint: {url!r} has no host. Write e.g. "
                f"{scheme}://host:port//path/to/test/area."
            )
        if path in ("/", "//"):
            raise EndpointError(
                f"--storage-endpoint: {url!r} has no test-area path. The path is the folder "
                f"the plugin may write in (it makes a per-run directory there); give one, "
                f"e.g. {scheme}://{parts.netloc}//store/test/storagescale."
            )
        try:
            port = parts.port
        except ValueError:
            raise EndpointError(f"--storage-endpoint: {url!r} has an invalid port.") from None
        return cls(url=url, scheme=scheme, host=parts.hostname or "", port=port, path=path)

    @property
    def server(self) -> str:
        """``scheme://host:port`` without credentials."""
        port = f":{self.port}" if self.port else ""
        return f"{self.scheme}://{self.host}{port}"

    @property
    def display(self) -> str:
        """The URL without user or password, for headers, tables and results."""
        sep = "/" if self.scheme in ("root", "xroot", "roots") else ""
        return f"{self.server}{sep}{self.path}" if self.scheme != "file" else f"file://{self.path}"


def is_inside(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or below it (after normalising ``..``)."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")
