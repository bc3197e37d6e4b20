"""A hostile HTTPS door on loopback: a reverse proxy in front of a real WebDAV server
(the embedded xrootd's XrdHttp) that forwards every request but those its rule answers
itself (a redirect elsewhere, a malformed or endless answer), and records what it
received. Its certificate comes from the CA the real server's clients trust."""

from __future__ import annotations

import http.client
import http.server
import ssl
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

#: headers of one connection only, never forwarded
_HOP_BY_HOP = {"host", "connection", "keep-alive", "expect", "transfer-encoding",
               "content-length", "te", "upgrade"}
METHODS = ("GET", "HEAD", "PUT", "DELETE", "MKCOL", "MOVE", "COPY", "PROPFIND",
           "PROPPATCH", "OPTIONS")


class Request(NamedTuple):
    """What the door received."""

    method: str
    path: str
    #: header names in lower case
    headers: dict[str, str]
    body: bytes


class Reply(NamedTuple):
    """What the door answers itself: ``body`` bytes, or chunks sent as they are made
    (chunked; the sending stops when the client closes)."""

    status: int
    headers: dict[str, str]
    body: bytes | Iterable[bytes] = b""


Rule = Callable[[Request], "Reply | None"]


class HostileDoor:
    """The door: ``rule(request)`` answers a request (a :class:`Reply`) or lets it
    through to ``upstream`` (``https://host:port``, verified against ``ca_dir``).
    ``seen`` lists every request received, in order; ``port``: the port to listen on
    (0: any free one)."""

    def __init__(self, authority, folder: Path, upstream: str, ca_dir: str,
                 rule: Rule | None = None, port: int = 0) -> None:
        self.rule = rule or (lambda request: None)
        self.upstream = urlsplit(upstream)
        self.seen: list[Request] = []
        cert = authority.issue_host(folder / "door.pem", folder / "door.key",
                                    hostname="localhost", ips=("127.0.0.1",))
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(cert.cert, cert.key)
        self._client_context = ssl.create_default_context(capath=ca_dir)
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.door = self  # type: ignore[attr-defined]
        # the handshake in the request's thread, not in the one that accepts
        self._httpd.socket = server_context.wrap_socket(
            self._httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self._httpd.server_address[1]
        self.base = f"https://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """``path`` behind the door, as a davs:// endpoint."""
        return f"davs://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> HostileDoor:
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def requests(self, method: str) -> list[Request]:
        return [request for request in self.seen if request.method == method]

    def forward(self, request: Request) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """The upstream server's answer to ``request``."""
        upstream = self.upstream
        headers = {name: value for name, value in request.headers.items()
                   if name not in _HOP_BY_HOP}
        if "destination" in headers:  # MOVE, COPY: the upstream's own URL
            headers["destination"] = headers["destination"].replace(
                self.base, f"https://{upstream.netloc}")
        connection = http.client.HTTPSConnection(upstream.hostname, upstream.port,
                                                 context=self._client_context, timeout=60)
        try:
            connection.request(request.method, request.path, body=request.body,
                               headers=headers)
            answer = connection.getresponse()
            return answer.status, answer.reason, answer.getheaders(), answer.read()
        finally:
            connection.close()


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection to the door: each request answered by the rule or relayed."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def handle_one(self) -> None:
        door: HostileDoor = self.server.door  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        request = Request(self.command, self.path,
                          {k.lower(): v for k, v in self.headers.items()},
                          self.rfile.read(length) if length else b"")
        door.seen.append(request)
        reply = door.rule(request)
        if reply is None:
            self._relay(request, *door.forward(request))
        else:
            self._reply(reply)

    def _relay(self, request: Request, status: int, reason: str,
               headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response_only(status, reason)  # the upstream's Server header
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP or (
                    request.method == "HEAD" and name.lower() == "content-length"):
                self.send_header(name, value)
        if request.method != "HEAD":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reply(self, reply: Reply) -> None:
        self.send_response_only(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if isinstance(reply.body, bytes):
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            for chunk in reply.body:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        except (OSError, ssl.SSLError):
            pass  # the client stopped reading: what the test wants


for _method in METHODS:
    setattr(_Handler, f"do_{_method}", _Handler.handle_one)
