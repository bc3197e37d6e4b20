"""Checks of a client's credentials, before any load runs: the proxy, token or
Kerberos ticket a driver is given (or finds in its environment) is read, and one that is
missing or expired is a :class:`CredentialError` naming it and how to renew it
(:data:`RENEW`). The drivers use these; the throwaway credentials the embedded servers
make are in :mod:`pytest_storagescale.servers.credentials`."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import EndpointError


class CredentialError(EndpointError):  # type: ignore[misc]
    """A credential is missing, unreadable, wrong or expired: the message names it and
    how to renew it."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def certificate_expiry(path: Path | str) -> dt.datetime:
    """When the first certificate in a PEM file (a proxy's own) stops being valid."""
    from cryptography import x509

    certificate = x509.load_pem_x509_certificate(Path(path).read_bytes())
    return certificate.not_valid_after.replace(tzinfo=dt.UTC)


# -- checks of what a client is given ---------------------------------------------------
#: how each credential is renewed (named in every error about it)
RENEW = {
    "x509_proxy": "renew it with 'voms-proxy-init --voms <vo>' or 'grid-proxy-init' and "
                  "point the driver option x509_proxy (or X509_USER_PROXY) at it",
    "token": "get a new one from your token issuer (e.g. 'oidc-token <account>' or "
             "'htgettoken') and pass it as the driver option token (or BEARER_TOKEN)",
    "krb5ccname": "renew it with 'kinit <principal>' (or 'kinit -k -t <keytab> "
                  "<principal>') and point the driver option krb5ccname (or KRB5CCNAME) at "
                  "the cache",
}


@dataclass(frozen=True)
class CredentialState:
    """What the client will present for one protocol, as far as it can be read here."""

    option: str
    #: where it is (a path, a cache name; "" for a token given as a value: never shown)
    where: str
    #: when it stops being valid (None: not known)
    expires: dt.datetime | None = None


def _gsi_proxy(options: Mapping[str, str]) -> CredentialState:
    path = (options.get("x509_proxy") or os.environ.get("X509_USER_PROXY")
            or f"/tmp/x509up_u{os.geteuid()}")
    try:
        expires = certificate_expiry(path)
    except FileNotFoundError:
        raise CredentialError(
            f"x509_proxy {path}: no proxy there (XRootD's gsi login needs one): "
            f"{RENEW['x509_proxy']}.") from None
    except (OSError, ValueError) as exc:
        raise CredentialError(
            f"x509_proxy {path}: not a readable PEM proxy ({exc}): "
            f"{RENEW['x509_proxy']}.") from None
    return CredentialState("x509_proxy", path, expires)


def token_expiry(token: str) -> dt.datetime | None:
    """The ``exp`` claim of a JWT (read, not verified: the server verifies); None for a
    token that is not a JWT (a macaroon) or has no ``exp``."""
    import base64
    import json

    parts = token.strip().split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        return dt.datetime.fromtimestamp(int(payload["exp"]), dt.UTC)
    except (ValueError, KeyError, TypeError):
        return None


def _bearer_token(options: Mapping[str, str]) -> CredentialState:
    """The token as XRootD's ztn client finds it: option/BEARER_TOKEN, BEARER_TOKEN_FILE,
    ``$XDG_RUNTIME_DIR/bt_u<uid>``, ``/tmp/bt_u<uid>``."""
    token, where = options.get("token") or os.environ.get("BEARER_TOKEN", ""), ""
    if not token:
        uid = os.geteuid()
        for path in (os.environ.get("BEARER_TOKEN_FILE"),
                     f"{os.environ.get('XDG_RUNTIME_DIR', '/nonexistent')}/bt_u{uid}",
                     f"/tmp/bt_u{uid}"):
            if path and os.path.isfile(path):
                token, where = Path(path).read_text().strip(), f"(from {path})"
                break
    if not token:
        raise CredentialError(
            f"token: none given (XRootD's ztn login needs a bearer token: the driver "
            f"option token, BEARER_TOKEN, BEARER_TOKEN_FILE or /tmp/bt_u{os.geteuid()}): "
            f"{RENEW['token']}.")
    return CredentialState("token", where, token_expiry(token))


def _kerberos_cache(options: Mapping[str, str]) -> CredentialState:
    """The ticket cache; ``klist -s`` says whether it holds a valid ticket."""
    cache = options.get("krb5ccname") or os.environ.get("KRB5CCNAME") or ""
    klist = shutil.which("klist")
    if klist is not None:
        env = dict(os.environ)
        if options.get("krb5_config"):
            env["KRB5_CONFIG"] = options["krb5_config"]
        done = subprocess.run([klist, "-s", *(["-c", cache] if cache else [])], env=env,
                              capture_output=True, timeout=30)
        if done.returncode != 0:
            path = cache.removeprefix("FILE:")
            state = ("no ticket cache there" if path.startswith("/") and not os.path.exists(path)
                     else "no valid Kerberos ticket in it (expired? 'klist' shows it)")
            raise CredentialError(
                f"krb5ccname {cache or '(the default cache)'}: {state}: "
                f"{RENEW['krb5ccname']}.")
    return CredentialState("krb5ccname", cache or "the default cache")


#: XRootD security protocol -> the check of the credential it needs
_CHECKS = {"gsi": _gsi_proxy, "ztn": _bearer_token, "krb5": _kerberos_cache}
_OPTION_PROTOCOL = {"x509_proxy": "gsi", "token": "ztn"}


def check_credentials(options: Mapping[str, str], *, now: dt.datetime | None = None
                      ) -> list[CredentialState]:
    """Check each credential given (``x509_proxy``, ``token``) and the one a single
    forced protocol needs (``security_protocol`` or ``XrdSecPROTOCOL``: ``gsi`` a proxy,
    ``ztn`` a token, ``krb5`` a valid ticket): :class:`CredentialError` naming it when it
    is missing or expired. A list of protocols falls back from one to the next: only
    the credentials given are checked."""
    forced = [name.strip() for name in (options.get("security_protocol")
                                        or os.environ.get("XrdSecPROTOCOL", "")).split(",")
              if name.strip()]
    # a ticket cache is read only when krb5 is forced (klist cannot tell a cache that
    # is not used from one that is broken); a proxy or a token given is always checked
    wanted = {protocol for option, protocol in _OPTION_PROTOCOL.items()
              if options.get(option) and protocol != "krb5"}
    if len(forced) == 1 and forced[0] in _CHECKS:
        wanted.add(forced[0])
    moment = now or _now()
    states = [_CHECKS[protocol](options) for protocol in sorted(wanted)]
    for state in states:
        if state.expires is not None and state.expires <= moment:
            where = f" {state.where}" if state.where else ""
            raise CredentialError(
                f"{state.option}{where}: expired at {state.expires:%Y-%m-%d %H:%M:%S} UTC: "
                f"{RENEW[state.option]}.")
    return states
