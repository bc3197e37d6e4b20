"""Authorization checks: what each credential may do, through every door.

With token logins (WLCG tokens, ``storage.read``/``storage.create``/``storage.modify``
scopes): a read-only token reads but cannot write, a write token writes, a client with
no credential cannot write, and an expired token is refused by the storage, the error
saying it expired (our XRootD driver refuses it before sending it; the HTTP driver adds
it to the server's 403).

Where the tokens come from:

- the embedded xrootd with ``--storage-embedded-login token``: the session's throwaway
  issuer (``EmbeddedXRootD.token_issuer``) mints them once
  (``EndpointUnderTest.authorization_tokens``; xdist workers get the controller's);
- a remote storage: ``--storage-token-readonly FILE`` and ``--storage-token-expired FILE``
  (ini ``storage_token_readonly``, ``storage_token_expired``; files, so no token is on a
  command line), the write token being the session's own ``--storage-driver-option
  token``. A check whose token is not given skips, naming the option.

Each credential is tried by a client in a process of its own (the XRootD client keeps
one identity per process, read from its environment), fed the request on stdin; a
token is never printed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_storagescale import DriverSpec, StorageScaleUsageError, driver_spec

from .checks import ConformanceChecks, Place, adler32_hex, expect_missing, fail, payload
from .doors import Door

#: driver options that carry an identity (dropped before one is given to a probe)
IDENTITY_OPTIONS = ("token", "x509_proxy", "x509_user_cert", "x509_user_key", "krb5ccname",
                    "security_protocol")
#: variables a probe's process must not inherit (it would log in as the session): the
#: grid clients' credentials (XRootD, gfal2, the WLCG bearer-token discovery)
IDENTITY_VARIABLES = ("X509_CERT_DIR", "X509_USER_PROXY", "X509_USER_CERT", "X509_USER_KEY",
                      "BEARER_TOKEN", "BEARER_TOKEN_FILE", "KRB5CCNAME", "KRB5_CONFIG",
                      "XrdSecPROTOCOL")
#: the WLCG token profile's scopes of the read-only and the write token
READ_SCOPE = "storage.read:/"
WRITE_SCOPE = "storage.read:/ storage.create:/ storage.modify:/"
RUN_HINT = ("run 'pytest suites/xrootd --storage-embedded-login token', or give a remote "
            "storage's tokens (--storage-token-readonly/-expired FILE, "
            "--storage-driver-option token=...)")

_PROBE = r"""
import json, pickle, sys, time, zlib
request = pickle.load(sys.stdin.buffer)
client = request["spec"].connect("functional-authz", timeout=request["timeout"])
outcomes = []
for operation, path, size in request["operations"]:
    started = time.monotonic()
    try:
        if operation == "put":
            value = client.put(path, request["data"][:size])
        elif operation == "read":
            got = client.read(path, 0, size)
            value = [len(got), f"{zlib.adler32(got):08x}"]
        else:
            value = client.stat(path).size
        outcome = {"ok": True, "value": value}
    except Exception as exc:  # reported to the check, which judges it
        outcome = {"ok": False, "type": type(exc).__name__, "message": str(exc),
                   "error_class": getattr(exc, "error_class", "")}
    outcome["seconds"] = time.monotonic() - started
    outcomes.append(outcome)
client.close()
print(json.dumps(outcomes), flush=True)
"""


@dataclass(frozen=True)
class Outcome:
    """What the storage answered one probe's operation."""

    ok: bool
    seconds: float
    value: object = None
    #: the exception's class (``StoragePermissionDenied``...) and text, when refused
    type: str = ""
    message: str = ""
    error_class: str = ""

    @property
    def refused(self) -> bool:
        """A permission refusal: the login (``auth``) or the operation (``permission``)."""
        return self.type == "StoragePermissionDenied"

    def said(self) -> str:
        if self.ok:
            return f"succeeded in {self.seconds:.2f} s"
        return f"answered {self.error_class or self.type}: {self.message}"


@dataclass(frozen=True)
class Credential:
    """One identity a probe presents: a token, or none (``token=""``)."""

    name: str
    token: str = ""

    def options(self, door: Door) -> dict[str, str]:
        """The door's options (CA folder...) with this identity only. XRootD doors
        force ``ztn`` for a token and ``unix`` (no credential) without one."""
        options = {k: v for k, v in door.spec.options.items() if k not in IDENTITY_OPTIONS}
        if self.token:
            options["token"] = self.token
        if door.is_xrootd:
            options["security_protocol"] = "ztn" if self.token else "unix"
        return {k: v for k, v in options.items() if k in door.spec.driver_class.option_names}


@dataclass(frozen=True)
class AuthzTokens:
    """The tokens of the checks, and where they come from (for skip reasons)."""

    origin: str
    readonly: str = ""
    write: str = ""
    expired: str = ""
    #: why a token is not there: kind -> the option that gives it
    missing: dict[str, str] = dataclasses.field(default_factory=dict)

    def need(self, kind: str) -> Credential:
        token = getattr(self, kind)
        if not token:
            pytest.skip(f"the {kind} token is not given ({self.origin}): {self.missing[kind]}")
        return Credential(kind, token)


def read_token_file(path: str, option: str) -> str:
    """The token in ``path`` (its first non-empty line; the option's parser checked the
    file at the start of the run)."""
    try:
        return Path(path).read_text().split()[0]
    except (OSError, IndexError) as exc:
        pytest.fail(f"{option} {path}: the token file went away or was emptied during the "
                    f"run ({exc})", pytrace=False)


def session_tokens(settings, endpoint) -> AuthzTokens:
    """The embedded server's issuer mints them; else the remote storage's token files
    (``settings``: the ``storage_settings`` fixture, ``endpoint``: ``storage_endpoint``);
    skips naming the option when there are none."""
    if endpoint.is_embedded:
        login = settings.embedded_login
        if login != "token":
            pytest.skip(f"the authorization checks need token logins and the embedded "
                        f"server runs with the {login} login: {RUN_HINT}")
        tokens = endpoint.authorization_tokens()  # the controller's, under xdist
        if not tokens:
            pytest.skip(f"the embedded {endpoint.embedded_kind} has no token issuer to "
                        f"mint the checks' tokens: {RUN_HINT}")
        return AuthzTokens("minted by the embedded server's issuer", **tokens)
    found, missing = {}, {}
    for kind, option in (("readonly", "token_readonly"), ("expired", "token_expired")):
        path = getattr(settings, option)
        flag = f"--storage-{option.replace('_', '-')}"
        if path:
            found[kind] = read_token_file(path, flag)
        else:
            missing[kind] = (f"give it with {flag} FILE (ini storage_{option})")
    found["write"] = (settings.driver_options or {}).get("token", "")
    if not found["write"]:
        missing["write"] = ("the session's own token is the write token: give it with "
                            "--storage-driver-option token=...")
    return AuthzTokens("for the remote storage", missing=missing, **found)


def probe(door: Door, credential: Credential, operations: list[tuple[str, str, int]],
          data: bytes = b"", *, place: Place | None = None) -> list[Outcome]:
    """Run ``operations`` (``put``/``read``/``stat``, path, size) as ``credential`` through
    ``door``, in a process of its own; its options are not checked here (an expired
    token reaches the storage). A file it may write is recorded as ``place``'s."""
    if place is not None:
        for operation, path, size in operations:
            if operation == "put":
                place.made(path, size)
    spec = DriverSpec(door.spec.driver_class, door.spec.endpoint_url, door.spec.writable_root,
                      credential.options(door))
    request = pickle.dumps({"spec": spec, "timeout": door.timeout, "operations": operations,
                            "data": data})
    with tempfile.TemporaryDirectory(prefix="storagescale-authz-") as runtime:
        environment = {k: v for k, v in os.environ.items() if k not in IDENTITY_VARIABLES}
        # no token file of the user's ($XDG_RUNTIME_DIR/bt_u<uid>) is found by the probe
        environment["XDG_RUNTIME_DIR"] = runtime
        try:
            done = subprocess.run([sys.executable, "-c", _PROBE], input=request,
                                  capture_output=True, env=environment,
                                  timeout=door.timeout * (len(operations) + 1) + 30)
        except subprocess.TimeoutExpired:
            fail(door, f"{operations[0][0]} as the {credential.name} credential",
                 operations[0][1], f"did not answer within {door.timeout:.0f} s per operation",
                 "an answer")
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        fail(door, f"{operations[0][0]} as the {credential.name} credential", operations[0][1],
             f"stopped the client process (exit {done.returncode}: {' | '.join(tail)})",
             "an answer to every operation")
    return [Outcome(**answer) for answer in json.loads(lines[-1])]


def expect_refused(door: Door, operation: str, path: str, outcome: Outcome,
                   why: str, *, tls_refusal: bool = False) -> None:
    """``outcome`` is a permission refusal (with ``tls_refusal``, a TLS handshake the
    server broke off also is: a door that requires a client certificate); else fail
    saying what the storage did."""
    if outcome.refused or (tls_refusal and outcome.error_class == "tls"):
        return
    did = ("accepted it: " + outcome.said() if outcome.ok else
           f"did not refuse it as a permission error but {outcome.said()}")
    fail(door, operation, path, did, f"a permission error ({why})")


class AuthorizationChecks(ConformanceChecks):
    """What a read-only, a write, a missing and an expired credential may do."""

    #: bytes of the files written and read
    authz_file_size = 100_000

    @pytest.fixture
    def authz_tokens(self, storage_settings, storage_endpoint) -> AuthzTokens:
        return session_tokens(storage_settings, storage_endpoint)

    def test_read_only_token_reads(self, authz_tokens: AuthzTokens, place: Place) -> None:
        """A token with only ``storage.read:/`` reads a file the session wrote."""
        reader = authz_tokens.need("readonly")
        data = payload(self.authz_file_size, seed=21)
        path = place.put("readable.dat", data)
        (outcome,) = probe(place.door, reader, [("read", path, len(data))])
        if not outcome.ok:
            fail(place.door, "read as the read-only token", path, outcome.said(),
                 f"the file's {len(data)} bytes (the token has {READ_SCOPE})")
        size, checksum = outcome.value
        if (size, checksum) != (len(data), adler32_hex(data)):
            fail(place.door, "read as the read-only token", path, f"gave {size} bytes with "
                 f"adler32 {checksum}", f"{len(data)} bytes with adler32 {adler32_hex(data)}")

    def test_read_only_token_cannot_write(self, authz_tokens: AuthzTokens,
                                          place: Place) -> None:
        """A write with a read-only token is refused as a permission error, and no file
        is left."""
        reader = authz_tokens.need("readonly")
        path = place.path("forbidden.dat")
        (outcome,) = probe(place.door, reader, [("put", path, 1000)], payload(1000),
                           place=place)
        expect_refused(place.door, "put as the read-only token", path, outcome,
                       f"the token's only scope is {READ_SCOPE}")
        expect_missing(place.door, place.client, path, "the write was refused")

    def test_write_token_writes(self, authz_tokens: AuthzTokens, place: Place) -> None:
        """A token with ``storage.create``/``storage.modify`` writes, and the bytes are
        there for the session's own client."""
        writer = authz_tokens.need("write")
        data = payload(self.authz_file_size, seed=22)
        path = place.path("written.dat")
        (outcome,) = probe(place.door, writer, [("put", path, len(data))], data, place=place)
        if not outcome.ok:
            fail(place.door, "put as the write token", path, outcome.said(),
                 f"success (the token has {WRITE_SCOPE})")
        got = place.read_all(place.client, place.door, path)
        if got != data:
            fail(place.door, "read", path, f"gave {len(got)} bytes that differ from the "
                 f"ones the write token wrote", f"the {len(data)} bytes written")

    def test_missing_credential_is_refused(self, authz_tokens: AuthzTokens,
                                           place: Place) -> None:
        """A client with no credential cannot write: the login, the TLS handshake (a door
        that requires a client certificate; the session's clients pass it with the same
        CA folder) or the write is refused."""
        if not any(place.door.spec.options.get(option) for option in IDENTITY_OPTIONS):
            pytest.skip(f"{place.door.name} door: the session itself gives no credential "
                        f"(driver options {', '.join(IDENTITY_OPTIONS)}), so whether a client "
                        f"without one may write is the storage's policy, not checked here")
        nobody = Credential("no")
        path = place.path("anonymous.dat")
        (outcome,) = probe(place.door, nobody, [("put", path, 1000)], payload(1000),
                           place=place)
        expect_refused(place.door, "put with no credential", path, outcome,
                       "no token was presented" + (", only the unix identity"
                                                   if place.door.is_xrootd else ""),
                       tls_refusal=True)
        expect_missing(place.door, place.client, path, "the write was refused")

    def test_expired_token_is_refused(self, authz_tokens: AuthzTokens, place: Place) -> None:
        """The storage refuses an expired token (sent anyway), and what the user sees
        says it expired: our driver's check before any request (XRootD drivers), else
        the refusal's message (a server answers only "Auth failed" or 403)."""
        expired = authz_tokens.need("expired")
        door, path = place.door, place.path("expired.dat")
        (outcome,) = probe(door, expired, [("put", path, 1000)], payload(1000), place=place)
        expect_refused(door, "put as an expired token", path, outcome,
                       "the token has expired")
        expect_missing(door, place.client, path, "the write was refused")
        try:
            driver_spec(door.spec.endpoint_url, driver=door.spec.name,
                        options=expired.options(door))
        except StorageScaleUsageError as exc:
            said = str(exc)
        else:  # the driver sends it: its error says why the storage refused it
            said = outcome.message
        if "expired" not in said:
            fail(door, "put as an expired token", path, f"was refused, and the error says "
                 f"{said!r}", "an error saying the token expired (checked by the driver "
                 "before the request, or added to the storage's refusal)")


__all__ = ["AuthorizationChecks", "AuthzTokens", "Credential", "Outcome", "probe"]
