"""The loopback OIDC issuer (servers/oidc_issuer.py) alone, no dCache: what a server
fetching its documents over HTTPS sees (the discovery document, the JWKS, nothing
else), that its tokens verify against the published key with the WLCG profile's
claims and that the ones a server must refuse (expired, another audience, another
key) fail that check, the files it leaves (0600 key, no token) and the redaction of
its tokens in every spelling. On the embedded dCache: tests/test_dcache_tape.py."""

from __future__ import annotations

import http.client
import json
import ssl
import stat
from pathlib import Path

import jwt
import pytest

from pytest_storagescale.redact import redact_text
from pytest_storagescale.servers.credentials import ThrowawayCA
from pytest_storagescale.servers.oidc_issuer import (
    AUDIENCE,
    DISCOVERY,
    JWKS,
    OidcIssuer,
)


@pytest.fixture
def issuer(tmp_path: Path):
    authority = ThrowawayCA(tmp_path / "grid")
    running = OidcIssuer(tmp_path / "oidc", authority).start()
    try:
        yield running
    finally:
        running.stop()


def _get(issuer: OidcIssuer, path: str, method: str = "GET") -> tuple[int, dict]:
    """``path`` over HTTPS, the server's certificate checked against the session's CA
    by the name in the issuer's URL (as a JVM or an IAM client checks it)."""
    context = ssl.create_default_context(capath=str(issuer.authority.ca_dir))
    connection = http.client.HTTPSConnection("localhost", issuer.port, context=context,
                                             timeout=30)
    try:
        connection.request(method, path)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read(1 << 20) or b"{}")
    finally:
        connection.close()


def _public_key(issuer: OidcIssuer, kid: str):
    _, jwks = _get(issuer, JWKS)
    keys = {key["kid"]: key for key in jwks["keys"]}
    return jwt.algorithms.RSAAlgorithm.from_jwk(json.dumps(keys[kid]))


def test_the_issuer_serves_its_discovery_document_and_keys_on_loopback(issuer) -> None:
    assert issuer._server is not None and issuer._server.server_address[0] == "127.0.0.1"
    assert issuer.url == f"https://localhost:{issuer.port}/"
    status, discovery = _get(issuer, DISCOVERY)
    assert status == 200
    # what dCache's oidc plugin reads: iss must equal the configured URL, jwks_uri
    assert discovery["issuer"] == issuer.url
    assert discovery["jwks_uri"] == issuer.url + "jwks"
    status, jwks = _get(issuer, JWKS)
    assert status == 200 and [key["kty"] for key in jwks["keys"]] == ["RSA"]
    key = jwks["keys"][0]
    assert key["kid"] == issuer.key_id and key["alg"] == "RS256" and key["use"] == "sig"
    assert "d" not in key and "p" not in key  # the public half only
    assert _get(issuer, "/userinfo")[0] == 404
    assert _get(issuer, JWKS, method="POST")[0] == 405
    assert issuer.served[-4:] == [("GET", DISCOVERY, 200), ("GET", JWKS, 200),
                                  ("GET", "/userinfo", 404), ("POST", JWKS, 405)]


def test_a_client_that_does_not_trust_the_ca_is_refused_the_handshake(issuer) -> None:
    connection = http.client.HTTPSConnection("localhost", issuer.port, timeout=30,
                                             context=ssl.create_default_context())
    with pytest.raises(ssl.SSLCertVerificationError):
        connection.request("GET", DISCOVERY)
    connection.close()
    assert _get(issuer, DISCOVERY)[0] == 200  # the server still serves the next one


def test_a_token_carries_the_wlcg_profile_and_verifies_against_the_jwks(issuer) -> None:
    access = issuer.access
    token = access.mint("storage.stage:/tape storage.read:/tape")
    header = jwt.get_unverified_header(token)
    assert header["kid"] == issuer.key_id and header["alg"] == "RS256"
    claims = jwt.decode(token, _public_key(issuer, header["kid"]), algorithms=["RS256"],
                        audience=AUDIENCE, issuer=issuer.url)
    assert claims["wlcg.ver"] == "1.0" and claims["sub"] == "storagescale-user"
    assert claims["scope"] == "storage.stage:/tape storage.read:/tape"
    assert claims["wlcg.groups"] == ["/storagescale"]
    assert claims["nbf"] <= claims["iat"] + 0 < claims["exp"] and len(claims["jti"]) == 32
    assert 3500 <= claims["exp"] - claims["nbf"] <= 3700
    assert token not in repr(access) and access.key_file not in repr(access)


@pytest.mark.parametrize("made, refusal", [
    ({"lifetime": -60}, jwt.ExpiredSignatureError),
    ({"audience": "https://elsewhere.example"}, jwt.InvalidAudienceError),
    ({"key": "other"}, jwt.InvalidSignatureError),
])
def test_the_tokens_a_server_must_refuse_fail_the_check(issuer, made, refusal) -> None:
    """What dCache must refuse (tests/test_dcache_tape.py checks it does) fails the
    same check a good token passes: the check can fail."""
    token = issuer.access.mint("storage.stage:/tape", **made)
    with pytest.raises(refusal):
        jwt.decode(token, _public_key(issuer, issuer.key_id), algorithms=["RS256"],
                   audience=AUDIENCE, issuer=issuer.url)


def test_the_key_is_the_users_alone_and_no_token_is_written(issuer, tmp_path) -> None:
    token = issuer.access.mint("storage.read:/")
    assert stat.S_IMODE(issuer.directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(issuer.key_file.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in issuer.key_file.read_bytes()
    for path in issuer.directory.iterdir():
        assert token.encode() not in path.read_bytes(), path
    written = issuer.access.write_token(token, tmp_path / "bt")
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):  # never over a file that is there
        issuer.access.write_token(token, written)


def test_a_token_is_redacted_in_every_spelling(issuer) -> None:
    """Minted: registered at once, so a server quoting it bare, cut at its end (a
    message's length limit), percent-, HTML- or JSON-escaped shows none of it."""
    from html import escape
    from urllib.parse import quote

    token = issuer.access.mint("storage.stage:/tape")
    _, payload, signature = token.split(".")
    for text in (f"denied: {token}", f"token {quote(token, safe='')} refused",
                 escape(f"<p>{token}</p>"), json.dumps({"jwt": token}),
                 f"cut: {token[:-10]}", f"cut: {token[:200]}",
                 f"Authorization: Bearer {token}"):
        shown = redact_text(text)
        assert payload not in shown and signature[:20] not in shown, shown


def test_a_jwt_the_session_never_saw_is_redacted_by_its_shape() -> None:
    """A token from elsewhere (another process's, a server's log quoting a client's):
    nothing registered it, its shape (three base64url parts, the first two JSON
    objects: ``eyJ``) is enough."""
    foreign = ("eyJhbGciOiJSUzI1NiIsImtpZCI6Im90aGVyIn0.eyJzdWIiOiJzb21lb25lLWVsc2UiLCJ"
               "zY29wZSI6InN0b3JhZ2UucmVhZDovIn0.c2lnbmF0dXJlLW9mLWEtdG9rZW4tZnJvbS1lbHNld2hlcmU")
    for text in (f"Unable to process token {foreign}: untrusted issuer",
                 f'{{"token":"{foreign}"}}', f"cut {foreign[:90]}"):
        shown = redact_text(text)
        assert "eyJzdWIiOiJzb21lb25l" not in shown and "c2lnbmF0dXJl" not in shown, shown
    # what is no JWT stays: a dotted name, a base64 word alone
    assert redact_text("pytest_storagescale.servers.oidc_issuer") == (
        "pytest_storagescale.servers.oidc_issuer")
    assert redact_text("eyJhbGciOiJIUzI1NiJ9 alone") == "eyJhbGciOiJIUzI1NiJ9 alone"


def test_stop_closes_the_port_and_ends_the_thread(tmp_path: Path) -> None:
    """Nothing is left listening once the server that started it stops it (twice is
    harmless: the dCache's stop may run again after a failed start)."""
    import socket
    import threading

    issuer = OidcIssuer(tmp_path / "oidc", ThrowawayCA(tmp_path / "grid")).start()
    port = issuer.port
    socket.create_connection(("127.0.0.1", port), timeout=10).close()  # it listens
    issuer.stop()
    issuer.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10)
    assert not [thread for thread in threading.enumerate() if thread.name == "oidc-issuer"]
    assert issuer.served == [] and issuer.port == 0
