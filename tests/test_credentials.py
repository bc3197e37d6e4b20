"""Throwaway credentials (servers/credentials.py) and the checks of a client's
credentials before any load: checked with the grid tools themselves (openssl,
grid-proxy-info), a real KDC, and libSciTokens."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509

from pytest_storagescale.drivers.credentials import (
    CredentialError,
    check_credentials,
    token_expiry,
)
from pytest_storagescale.drivers.grid import login_refusal, session_login
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.servers.credentials import (
    KerberosRealm,
    ThrowawayCA,
    TokenIssuer,
    write_grid_mapfile,
)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run 'make setup' (scripts/bootstrap.sh)")
    return path


def _run(*command: str, env: dict | None = None) -> str:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def identity(tmp_path_factory):
    """A CA, a host certificate, a user certificate and a proxy of it."""
    folder = tmp_path_factory.mktemp("credentials")
    ca = ThrowawayCA(folder)
    host = ca.issue_host(folder / "tls" / "host.pem", folder / "tls" / "host.key")
    user = ca.issue_user(folder / "user" / "usercert.pem", folder / "user" / "userkey.pem")
    proxy = ca.make_proxy(user, folder / "user" / "x509up")
    expired = ca.make_proxy(user, folder / "user" / "x509up-expired", expired=True)
    return {"folder": folder, "ca": ca, "host": host, "user": user, "proxy": proxy,
            "expired": expired}


def test_the_ca_folder_is_what_x509_cert_dir_readers_expect(identity):
    ca: ThrowawayCA = identity["ca"]
    names = {path.name for path in ca.ca_dir.iterdir()}
    certificates = [name for name in names if name.endswith(".0")]
    new_hash = _run(_tool("openssl"), "x509", "-noout", "-hash", "-in",
                    str(ca.ca_dir / certificates[0])).strip()
    old_hash = _run("openssl", "x509", "-noout", "-subject_hash_old", "-in",
                    str(ca.ca_dir / certificates[0])).strip()
    assert {f"{new_hash}.0", f"{new_hash}.signing_policy", f"{new_hash}.r0",
            f"{old_hash}.0", f"{old_hash}.signing_policy", f"{old_hash}.r0"} == names
    assert (ca.ca_dir / f"{old_hash}.0").is_symlink()
    policy = (ca.ca_dir / f"{new_hash}.signing_policy").read_text()
    assert f"access_id_CA X509 '{ca.subject}'" in policy and "CA:sign" in policy
    # the CRL is the CA's, and empty
    _run("openssl", "crl", "-in", str(ca.ca_dir / f"{new_hash}.r0"), "-CApath", str(ca.ca_dir),
         "-noout")
    crl = x509.load_pem_x509_crl((ca.ca_dir / f"{new_hash}.r0").read_bytes())
    assert len(list(crl)) == 0


def test_host_and_user_certificates_verify_against_the_ca(identity):
    ca, host, user = identity["ca"], identity["host"], identity["user"]
    for files in (host, user):
        assert "OK" in _run("openssl", "verify", "-CApath", str(ca.ca_dir), str(files.cert))
        assert stat.S_IMODE(files.key.stat().st_mode) == 0o400
    cert = x509.load_pem_x509_certificate(host.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert host.subject.endswith("/CN=localhost")
    # an end-entity user certificate (mod_ssl refuses proxies): no CA, client use
    user_cert = x509.load_pem_x509_certificate(user.cert.read_bytes())
    assert not user_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_the_proxy_is_an_rfc3820_proxy_of_the_user(identity):
    ca, user, proxy = identity["ca"], identity["user"], identity["proxy"]
    assert stat.S_IMODE(proxy.stat().st_mode) == 0o400
    text = proxy.read_text()
    assert text.count("BEGIN CERTIFICATE") == 2 and text.count("PRIVATE KEY-----") == 2
    assert "OK" in _run("openssl", "verify", "-allow_proxy_certs", "-CApath", str(ca.ca_dir),
                        "-untrusted", str(user.cert), str(proxy))
    info = _run(_tool("grid-proxy-info"), "-f", str(proxy), env={"X509_CERT_DIR": str(ca.ca_dir)})
    assert "RFC 3820 compliant impersonation proxy" in info
    assert f"identity : {user.subject}" in info
    # an expired one is refused by OpenSSL too: the check below is not our invention
    done = subprocess.run(["openssl", "verify", "-allow_proxy_certs", "-CApath",
                           str(ca.ca_dir), "-untrusted", str(user.cert), str(identity["expired"])],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "expired" in done.stdout + done.stderr


def test_grid_mapfile_maps_the_user_dn(identity, tmp_path):
    path = write_grid_mapfile(tmp_path / "grid-mapfile", {identity["user"].subject: "ssuser"})
    assert path.read_text() == '"/O=pytest-storagescale/CN=storagescale user" ssuser\n'


@pytest.mark.skipif(os.geteuid() != 0, reason="handing keys to another user needs root")
def test_keys_are_handed_to_the_server_user(identity, tmp_path):
    host = identity["ca"].issue_host(tmp_path / "h.pem", tmp_path / "h.key", owner="xrootd")
    owner = pwd.getpwuid(host.key.stat().st_uid).pw_name
    assert owner == "xrootd" and stat.S_IMODE(host.key.stat().st_mode) == 0o400


def test_a_key_is_never_on_disk_readable_by_another_user(tmp_path, monkeypatch):
    """Issue 31: the host key was written (umask's 0644) and then chmod'ed; an inotify
    watcher read it in between. Every change of a file's mode, owner or name is
    watched here with the umask at 0: no file holding a private key may have a group
    or other bit at any of those moments, nor at the end; a link where a key goes is
    replaced, never written through."""
    seen: list[str] = []

    def keys_private(why: str) -> None:
        for path in tmp_path.rglob("*"):
            if path.is_symlink() or not path.is_file():
                continue
            mode = stat.S_IMODE(path.lstat().st_mode)
            if b"PRIVATE KEY" in path.read_bytes() and mode & 0o077:
                seen.append(f"{path.name} {mode:o} at {why}")

    def watched(name: str):
        real = getattr(os, name)

        def call(*args, **kwargs):
            keys_private(name)
            return real(*args, **kwargs)
        return call

    for name in ("chmod", "fchmod", "chown", "fchown", "replace", "rename"):
        monkeypatch.setattr(os, name, watched(name))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not a key\n")
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "host.key").symlink_to(elsewhere)
    previous = os.umask(0)
    try:
        ca = ThrowawayCA(tmp_path / "ca")
        host = ca.issue_host(tmp_path / "tls" / "host.pem", tmp_path / "tls" / "host.key")
        user = ca.issue_user(tmp_path / "user" / "cert.pem", tmp_path / "user" / "key.pem")
        ca.make_proxy(user, tmp_path / "user" / "x509up")
    finally:
        os.umask(previous)
    keys_private("the end")
    assert seen == []
    assert elsewhere.read_text() == "not a key\n" and not host.key.is_symlink()
    assert stat.S_IMODE(host.key.stat().st_mode) == 0o400
    assert [path.name for path in tmp_path.rglob("*.partial")] == []


# -- the checks before the load --------------------------------------------------------------
def test_an_expired_proxy_is_one_error_naming_it_and_how_to_renew(identity):
    expired = identity["expired"]
    with pytest.raises(CredentialError) as info:
        check_credentials({"x509_proxy": str(expired)})
    message = str(info.value)
    assert message.startswith(f"x509_proxy {expired}: expired at ")
    assert "voms-proxy-init" in message and "grid-proxy-init" in message and "\n" not in message
    # a valid one passes, and says when it ends
    (state,) = check_credentials({"x509_proxy": str(identity["proxy"]),
                                  "security_protocol": "gsi"})
    assert state.option == "x509_proxy" and state.expires > state.expires.now(state.expires.tzinfo)


def test_a_forced_protocol_without_its_credential_is_refused(tmp_path, monkeypatch):
    for name in ("X509_USER_PROXY", "BEARER_TOKEN", "BEARER_TOKEN_FILE", "XrdSecPROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(CredentialError, match=f"x509_proxy {tmp_path}/none: no proxy there"):
        check_credentials({"security_protocol": "gsi", "x509_proxy": str(tmp_path / "none")})
    if not Path(f"/tmp/bt_u{os.geteuid()}").exists():
        with pytest.raises(CredentialError, match="token: none given"):
            check_credentials({"security_protocol": "ztn"})
    # a list of protocols falls back from one to the next: nothing to refuse up front
    assert check_credentials({"security_protocol": "krb5,gsi,unix"}) == []


def test_the_driver_checks_credentials_when_its_options_are_read(identity):
    """driver_spec is what the session calls before any test: the check runs there."""
    with pytest.raises(CredentialError, match="expired at"):
        driver_spec("root://localhost:1094//area", driver="xrootd",
                    options={"x509_proxy": str(identity["expired"])})


def test_tokens_expiry_is_read_and_the_token_never_shown():
    issuer = TokenIssuer()
    token, expired = issuer.mint(), issuer.mint(lifetime=-60)
    assert token_expiry(token) > token_expiry(expired)
    (state,) = check_credentials({"token": token})
    assert state.option == "token" and token not in repr(state)
    with pytest.raises(CredentialError) as info:
        check_credentials({"token": expired})
    assert str(info.value).startswith("token: expired at ") and expired not in str(info.value)
    # a token that is not a JWT (a macaroon) has no readable expiry: not refused here
    assert token_expiry("MDAxY2xvY2F0aW9uIE9wdGlvbmFs") is None
    check_credentials({"token": "MDAxY2xvY2F0aW9uIE9wdGlvbmFs"})


def test_a_refused_login_names_the_protocol_and_credential_never_the_token(monkeypatch):
    for name in ("X509_USER_PROXY", "BEARER_TOKEN", "KRB5CCNAME", "XrdSecPROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    text = login_refusal("[FATAL] Auth failed", {"security_protocol": "gsi",
                                                 "x509_proxy": "/tmp/p"})
    assert "with gsi failed using x509_proxy /tmp/p" in text and "grid-proxy-init" in text
    text = login_refusal("[FATAL] Auth failed", {"token": "eyJ.secret.value"})
    assert "using token." in text and "secret" not in text and "oidc-token" in text
    assert "no credential was given" in login_refusal("[FATAL] Auth failed", {})


def test_the_session_login_comes_from_the_forced_protocol(monkeypatch):
    monkeypatch.delenv("XrdSecPROTOCOL", raising=False)
    assert session_login({}, embedded=True) == "unix"
    assert session_login({}, embedded=False) is None
    assert session_login({"security_protocol": "ztn"}, embedded=False) == "token"
    assert session_login({"security_protocol": "krb5"}, embedded=True) == "krb5"
    assert session_login({"security_protocol": "krb5,unix"}, embedded=False) is None


@pytest.mark.slow_server
def test_a_kerberos_realm_gives_tickets_and_a_short_one_is_reported_expired(tmp_path):
    realm = KerberosRealm(tmp_path / "krb").start()
    try:
        options = {"security_protocol": "krb5", "krb5ccname": f"FILE:{realm.ccache}",
                   "krb5_config": str(realm.krb5_config)}
        check_credentials(options)
        listing = _run(_tool("klist"), "-k", str(realm.service_keytab))
        assert "xrootd/localhost@STORAGESCALE.TEST" in listing
        short = realm.renew(tmp_path / "short", lifetime="2s")
        options["krb5ccname"] = f"FILE:{short}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the ticket's own 2 s, then klist says so
            try:
                check_credentials(options)
            except CredentialError as exc:
                assert f"krb5ccname FILE:{short}: no valid Kerberos ticket" in str(exc)
                assert "kinit" in str(exc)
                break
            time.sleep(0.2)
        else:
            pytest.fail("a 2 s ticket was still valid after 30 s")
        options["krb5ccname"] = f"FILE:{tmp_path}/missing"
        with pytest.raises(CredentialError, match="no ticket cache there"):
            check_credentials(options)
    finally:
        realm.stop()
    assert realm.process is not None and realm.process.poll() is not None
    realm.stop()  # idempotent
