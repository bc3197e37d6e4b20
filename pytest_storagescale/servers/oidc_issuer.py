"""A throwaway OpenID Connect issuer on loopback: what a WLCG site's token issuer (an
INDIGO IAM, a CILogon) is to its dCache, for the tests and the suites to log in with a
WLCG-profile JWT that dCache checks itself.

What an :class:`OidcIssuer` is, in a private folder of the run (0700):

- an HTTPS server on ``127.0.0.1`` (a free port, a thread of the process that starts
  it), its host certificate from the session's :class:`~.credentials.ThrowawayCA`
  (``CN=localhost``, SAN ``DNS:localhost, IP:127.0.0.1``), serving two documents and
  nothing else: the discovery document ``/.well-known/openid-configuration``
  (``issuer``, ``jwks_uri``) and the JWKS ``/jwks`` (the public half of its RSA key,
  ``kid`` named). Every other path or method is a 404/405; what was asked is recorded
  (:attr:`OidcIssuer.served`, bounded), so a test sees that the server fetched the keys;
- an RSA key made for the run (2048 bits), its private half written 0600 in the
  folder (``signing-key.pem``) so that any process of the session (an xdist worker, a
  load step's client) mints tokens through the picklable :class:`IssuerAccess`
  without the key crossing a pipe;
- a Java trust store (``truststore.jks``, the CA's certificate only) for a JVM that
  fetches the documents with Java's own trust (dCache's gPlazma ``oidc`` plugin does:
  ``-Djavax.net.ssl.trustStore``), made with the JRE's ``keytool``.

Tokens (:meth:`IssuerAccess.mint`) are RS256 JWTs of the WLCG common JWT profile
(``wlcg.ver`` 1.0, ``iss``, ``sub``, ``aud``, ``scope`` with ``storage.*`` paths,
``wlcg.groups``, ``iat``/``nbf``/``exp``, ``jti``), signed with PyJWT; each is
registered as a secret the moment it exists (never printed, in any spelling) and kept
in memory only (:meth:`IssuerAccess.write_token` writes one 0600 when a client needs a
file). ``lifetime`` below zero makes one already expired; ``key="other"`` one signed by
a key the issuer never published (what a forged token is).
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EndpointError, StorageScaleUsageError
from ..redact import register_secret

if TYPE_CHECKING:  # .credentials loads cryptography: imported where an issuer starts
    from .credentials import ThrowawayCA

#: the WLCG common JWT profile's version claim
WLCG_VERSION = "1.0"
#: the discovery document's and the JWKS's paths
DISCOVERY = "/.well-known/openid-configuration"
JWKS = "/jwks"
#: the audience a token is minted for unless told otherwise (the server's
#: ``gplazma.oidc.audience-targets``)
AUDIENCE = "storagescale-dcache"
#: the subject of the session's tokens (the server maps it to its test user)
SUBJECT = "storagescale-user"
#: the group every token names (``wlcg.groups``)
GROUP = "/storagescale"
#: the signing algorithm (RS256: what every WLCG issuer signs with, and what dCache
#: 10.2 reads: its JWKS parser knows RSA keys only, EC from 11.2)
ALGORITHM = "RS256"
#: the most requests :attr:`OidcIssuer.served` keeps
SERVED_KEPT = 1000
#: a request's socket deadline (s): a client that stalls is dropped
REQUEST_TIMEOUT_S = 30
#: how long keytool may take (a JVM's start on a loaded machine)
KEYTOOL_TIMEOUT_S = 300


def _jwt() -> Any:
    """PyJWT, or a usage error naming the extra (imported where a token is minted)."""
    try:
        import jwt
    except ImportError:
        raise StorageScaleUsageError(
            "the embedded token issuer signs its JWTs with PyJWT, not installed: "
            "pip install 'pytest-storagescale[servers]' (Debian: python3-jwt)") from None
    return jwt


@dataclass(frozen=True)
class IssuerAccess:
    """How to mint tokens of a running :class:`OidcIssuer` (picklable: the issuer's URL,
    its key file's path, the key's id, the audience; never the key itself)."""

    issuer: str
    key_file: str
    key_id: str
    audience: str = AUDIENCE

    def __repr__(self) -> str:
        return f"IssuerAccess(issuer={self.issuer!r})"

    def mint(self, scope: str, *, subject: str = SUBJECT, lifetime: int = 3600,
             audience: str | None = None, groups: tuple[str, ...] = (GROUP,),
             key: str = "issuer") -> str:
        """A signed WLCG-profile access token: ``scope`` (``storage.stage:/tape
        storage.read:/tape``: paths under the server's prefix), ``lifetime`` seconds
        (below zero: expired that long ago), for ``audience`` (default the server's);
        ``key="other"``: signed by a key the issuer never published, with the
        issuer's key id (a forgery). Registered as a secret before it is returned."""
        jwt = _jwt()
        from cryptography.hazmat.primitives import serialization

        if key == "issuer":
            signing = serialization.load_pem_private_key(Path(self.key_file).read_bytes(),
                                                         password=None)
        elif key == "other":
            from cryptography.hazmat.primitives.asymmetric import rsa

            signing = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        else:
            raise ValueError(f"key={key!r}: give 'issuer' or 'other'")
        now = int(time.time())
        claims = {"wlcg.ver": WLCG_VERSION, "iss": self.issuer, "sub": subject,
                  "aud": self.audience if audience is None else audience, "scope": scope,
                  "wlcg.groups": list(groups), "iat": min(now, now + lifetime) - 60,
                  "nbf": min(now, now + lifetime) - 60, "exp": now + lifetime,
                  "jti": secrets.token_hex(16), "client_id": "storagescale"}
        token = jwt.encode(claims, signing, algorithm=ALGORITHM,
                           headers={"kid": self.key_id, "typ": "JWT"})
        token = token if isinstance(token, str) else token.decode()
        register_secret(token)  # never shown, in any output of this process
        return token

    def write_token(self, token: str, path: Path) -> Path:
        """``token`` in a new file only this user may read (a ``BEARER_TOKEN_FILE``)."""
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as stream:
            stream.write(token + "\n")
        return path


class _Handler(BaseHTTPRequestHandler):
    """The two documents; a 404 or 405 for anything else. No body is read."""

    server: _IssuerServer
    timeout = REQUEST_TIMEOUT_S
    server_version = "storagescale-oidc-issuer"
    sys_version = ""

    def setup(self) -> None:
        self.request.do_handshake()  # in this thread: a silent client holds only it
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        document = self.server.documents.get(path)
        if document is None:
            self._answer(404, {"error": "not_found"})
        else:
            self._answer(200, document)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(405, {"error": "method_not_allowed"})

    do_POST = do_PUT = do_DELETE = do_HEAD  # noqa: N815

    def _answer(self, status: int, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.server.record(self.command, self.path, status)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - its signature
        """Nothing on stderr: what was served is in :attr:`OidcIssuer.served`."""


class _IssuerServer(ThreadingHTTPServer):
    daemon_threads = True
    #: at most this many connections wait to be accepted
    request_queue_size = 64

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.context = context
        self.documents: dict[str, dict[str, Any]] = {}
        self.served: collections.deque[tuple[str, str, int]] = collections.deque(
            maxlen=SERVED_KEPT)
        self.lock = threading.Lock()

    def get_request(self):  # type: ignore[no-untyped-def]
        """The connection in TLS, its handshake in the handler's thread (a client that
        never speaks cannot hold the accepting one)."""
        connection, address = self.socket.accept()
        connection.settimeout(REQUEST_TIMEOUT_S)
        return self.context.wrap_socket(connection, server_side=True,
                                        do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or spoke no TLS: dropped, nothing printed."""

    def record(self, method: str, path: str, status: int) -> None:
        with self.lock:
            self.served.append((method, path[:200], status))


class OidcIssuer:
    """A loopback OIDC issuer of WLCG-profile JWTs (see the module's doc)."""

    def __init__(self, directory: Path, authority: ThrowawayCA, *,
                 audience: str = AUDIENCE) -> None:
        #: the issuer's private folder (made by :meth:`start`, removed with the run's)
        self.directory = Path(directory)
        self.authority = authority
        self.audience = audience
        self.key_id = f"storagescale-{secrets.token_hex(4)}"
        self._server: _IssuerServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""
        #: the Java trust store of the CA (``truststore.jks``), once made
        self.trust_store: Path | None = None

    def __repr__(self) -> str:
        return f"OidcIssuer(url={self.url!r})"

    @property
    def key_file(self) -> Path:
        return self.directory / "signing-key.pem"

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server is not None else 0

    @property
    def access(self) -> IssuerAccess:
        if not self.url:
            raise EndpointError("the token issuer is not running (OidcIssuer.start())")
        return IssuerAccess(self.url, str(self.key_file), self.key_id, self.audience)

    @property
    def served(self) -> list[tuple[str, str, int]]:
        """What was asked so far: (method, path, status), the last :data:`SERVED_KEPT`."""
        if self._server is None:
            return []
        with self._server.lock:
            return list(self._server.served)

    def start(self) -> OidcIssuer:
        """The folder, the key, the host certificate, the server's thread."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        jwt = _jwt()
        self.directory.mkdir(mode=0o700)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        descriptor = os.open(self.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(pem)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        public.update({"kid": self.key_id, "use": "sig", "alg": ALGORITHM})
        host = self.authority.issue_host(self.directory / "hostcert.pem",
                                         self.directory / "hostkey.pem")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(host.cert), str(host.key))
        server = _IssuerServer(context)
        self.url = f"https://localhost:{server.server_address[1]}/"
        server.documents = {
            DISCOVERY: {"issuer": self.url, "jwks_uri": self.url + JWKS.lstrip("/"),
                        "id_token_signing_alg_values_supported": [ALGORITHM],
                        "response_types_supported": ["token"],
                        "subject_types_supported": ["public"],
                        "scopes_supported": ["openid", "wlcg", "wlcg.groups",
                                             "storage.read:/", "storage.create:/",
                                             "storage.modify:/", "storage.stage:/"],
                        "claims_supported": ["sub", "iss", "aud", "exp", "scope",
                                             "wlcg.ver", "wlcg.groups"]},
            JWKS: {"keys": [public]},
        }
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={
            "poll_interval": 0.5}, name="oidc-issuer", daemon=True)
        self._thread.start()
        return self

    def java_trust_store(self) -> Path:
        """``truststore.jks``: the CA's certificate as a Java trust store (what a JVM
        given ``-Djavax.net.ssl.trustStore`` trusts, and nothing else); made once with
        the JRE's keytool (the store's password, needed to write it, is a random one
        passed in keytool's environment: the JVM reads the store without one)."""
        if self.trust_store is not None:
            return self.trust_store
        keytool = shutil.which("keytool")
        java = shutil.which("java")
        if keytool is None and java is not None:
            sibling = Path(java).resolve().parent / "keytool"
            keytool = str(sibling) if sibling.exists() else None
        if keytool is None:
            raise EndpointError("the token issuer's Java trust store needs keytool (the "
                                "JRE's): 'sudo apt-get install openjdk-17-jre-headless'")
        from cryptography.hazmat.primitives.serialization import Encoding

        ca = self.directory / "ca.pem"
        ca.write_bytes(self.authority.certificate.public_bytes(Encoding.PEM))
        store = self.directory / "truststore.jks"
        environment = {**os.environ, "STORAGESCALE_STORE_PASS": secrets.token_urlsafe(16)}
        done = subprocess.run(
            [keytool, "-importcert", "-noprompt", "-alias", "storagescale-ca", "-file",
             str(ca), "-keystore", str(store), "-storetype", "JKS",
             "-storepass:env", "STORAGESCALE_STORE_PASS"],
            capture_output=True, text=True, timeout=KEYTOOL_TIMEOUT_S, env=environment,
            stdin=subprocess.DEVNULL)
        if done.returncode != 0 or not store.is_file():
            raise EndpointError(f"keytool could not make the token issuer's trust store "
                                f"(exit {done.returncode}): "
                                f"{(done.stderr + done.stdout).strip()[-300:]}")
        self.trust_store = store
        return store

    def stop(self) -> None:
        """End the server's thread and close its socket (idempotent); the folder goes
        with the run's."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
