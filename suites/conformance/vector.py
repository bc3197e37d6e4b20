"""Vector reads that return the bytes of every chunk (the drivers' ``readv`` counts
bytes only, which is what a load step needs, not what a conformance check needs).

- XRootD doors: one ``kXR_readv`` request (``XRootD.client.File.vector_read``);
- HTTP doors: one ``GET`` with a multi-range ``Range`` header, the server's
  ``multipart/byteranges`` answer split back into chunks (XrdHttp, dCache and EOS
  answer so), TLS verified against the door's ``ca_dir``.
"""

from __future__ import annotations

import io
import os
import re
from urllib.parse import quote, unquote, urlsplit

from pytest_storagescale import StorageError

from .doors import Door

Chunks = list[tuple[int, int]]


def _error(door: Door, path: str, message: str, native: str = "") -> StorageError:
    return StorageError(message, driver="conformance", endpoint=door.spec.endpoint.server,
                        operation="readv", path=path, native_status=native,
                        error_class="readv")


def vector_read(door: Door, path: str, chunks: Chunks) -> list[bytes]:
    """The bytes the storage answers for each ``(offset, size)`` chunk, in order."""
    if door.is_xrootd:
        return _xrootd_readv(door, path, chunks)
    if door.is_http:
        return _http_readv(door, path, chunks)
    client = door.client("conformance-readv")
    try:
        return [client.read(path, offset, size) for offset, size in chunks]
    finally:
        client.close()


def _xrootd_readv(door: Door, path: str, chunks: Chunks) -> list[bytes]:
    from XRootD import client
    from XRootD.client.flags import OpenFlags

    door.client("conformance-env").close()  # puts the door's credentials in the environment
    timeout = max(1, int(door.timeout))
    handle = client.File()
    status, _ = handle.open(door.url(path), OpenFlags.READ,
                            timeout=timeout)
    if not status.ok:
        raise _error(door, path, f"open: {status.message.strip()}", f"errno={status.errno}")
    try:
        status, info = handle.vector_read(chunks, timeout=timeout)
        if not status.ok:
            raise _error(door, path, status.message.strip(),
                         f"status={status.status} code={status.code} errno={status.errno}")
        return [bytes(chunk.buffer) for chunk in info.chunks]
    finally:
        handle.close(timeout=timeout)


def _http_readv(door: Door, path: str, chunks: Chunks) -> list[bytes]:
    import pycurl

    endpoint = door.spec.endpoint
    scheme = "https" if endpoint.scheme in ("davs", "https") else "http"
    port = f":{endpoint.port}" if endpoint.port else ""
    url = f"{scheme}://{endpoint.host}{port}{quote(path, safe='/-._~')}"
    ranges = ",".join(f"{offset}-{offset + size - 1}" for offset, size in chunks)
    body, headers = io.BytesIO(), io.BytesIO()
    # the parts' headers and boundaries on top of the chunks: more is not read
    limit = sum(size for _, size in chunks) + 512 * len(chunks) + 65536

    def keep(data: bytes) -> int | None:
        if body.tell() + len(data) > limit:
            return 0  # libcurl ends the transfer (a write error)
        body.write(data)
        return None

    curl = pycurl.Curl()
    try:
        curl.setopt(pycurl.URL, url)
        curl.setopt(pycurl.HTTPHEADER, [f"Range: bytes={ranges}", *_auth(door)])
        curl.setopt(pycurl.WRITEFUNCTION, keep)
        curl.setopt(pycurl.HEADERFUNCTION, headers.write)
        curl.setopt(pycurl.TIMEOUT, max(1, int(door.timeout)))
        # a read may be redirected (a dCache door sends it to the pool that holds the
        # file), only where TLS still protects it; the door's login is not sent to
        # another host (libcurl drops USERPWD and a custom Authorization header there)
        curl.setopt(pycurl.FOLLOWLOCATION, 1)
        curl.setopt(pycurl.MAXREDIRS, 5)
        curl.setopt(pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTPS if scheme == "https"
                    else pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        login = urlsplit(endpoint.url)
        if login.username:
            curl.setopt(pycurl.USERNAME, unquote(login.username))
            curl.setopt(pycurl.PASSWORD, unquote(login.password or ""))
        ca_dir = door.spec.options.get("ca_dir") or os.environ.get("X509_CERT_DIR")
        if ca_dir:
            curl.setopt(pycurl.CAPATH, ca_dir)
        # the door's client certificate (a proxy, or a certificate and key: mod_ssl)
        cert = door.spec.options.get("x509_proxy") or door.spec.options.get("x509_user_cert")
        if cert:
            curl.setopt(pycurl.SSLCERT, cert)
            curl.setopt(pycurl.SSLKEY, door.spec.options.get("x509_user_key") or cert)
        curl.perform()
        code = curl.getinfo(pycurl.RESPONSE_CODE)
    except pycurl.error as exc:
        if body.tell() + 1 > limit or exc.args[0] == pycurl.E_WRITE_ERROR:
            raise _error(door, path, f"GET with Range: bytes={ranges}: the answer is "
                         f"longer than the {limit} bytes the ranges need: not read "
                         f"further") from None
        raise _error(door, path, f"GET with Range: bytes={ranges}: {exc.args[-1]}") from None
    finally:
        curl.close()
    if code != 206:
        raise _error(door, path, f"GET with Range: bytes={ranges} answered HTTP {code}, "
                     f"not 206 Partial Content", f"HTTP {code}")
    return _split_ranges(door, path, headers.getvalue(), body.getvalue(), chunks)


def _auth(door: Door) -> list[str]:
    token = door.spec.options.get("token")
    return [f"Authorization: Bearer {token}"] if token else []


def _split_ranges(door: Door, path: str, head: bytes, body: bytes,
                  chunks: Chunks) -> list[bytes]:
    """The chunks of a ``multipart/byteranges`` answer (one range: the body itself),
    split by hand: the parts are binary, with only their own lengths to trust."""
    content_type = ""
    for line in head.decode("latin-1").splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-type":
            content_type = value.strip()
    if len(chunks) == 1 and not content_type.startswith("multipart/"):
        return [body]
    boundary = re.search(r'boundary="?([^";]+)"?', content_type)
    if not content_type.startswith("multipart/byteranges") or not boundary:
        raise _error(door, path, f"a multi-range GET answered Content-Type {content_type!r}, "
                     f"not multipart/byteranges")
    delimiter = b"--" + boundary.group(1).encode()
    parts = []
    for part in body.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break  # the closing delimiter
        head_part, _, data = part.partition(b"\r\n\r\n")
        match = re.search(rb"(?i)content-range:\s*bytes (\d+)-(\d+)/", head_part)
        if not match:
            raise _error(door, path, "a part of the multi-range answer has no Content-Range")
        first, last = int(match.group(1)), int(match.group(2))
        parts.append(data[:last - first + 1])
    return parts
