"""Throwaway credentials for the embedded servers: a CA, a KDC and a token issuer.

What :class:`ThrowawayCA` makes, in a private folder given to it (keys 0400, owned by
the user of the server that reads them):

- ``ca/``: a CA folder usable as ``X509_CERT_DIR`` / ``SSLCACertificatePath`` /
  ``xrd.tlsca certdir`` / GSI ``-certdir``: ``<hash>.0`` (the CA certificate), a link
  ``<subject_hash_old>.0`` (older Globus and OpenSSL 0.9 clients), ``<hash>.signing_policy``
  (Globus GSI), an empty CRL ``<hash>.r0`` (GSI ``-crl:1``, mod_ssl). The CA's key is
  never written to disk: it lives in the :class:`ThrowawayCA` object.
- host certificates (:meth:`ThrowawayCA.issue_host`): ``CN=localhost``, SAN
  ``DNS:localhost, IP:127.0.0.1`` – for XrdHttp/davs and ``xrd.tls`` (ztn), XRootD GSI,
  Apache mod_ssl, the GridFTP server.
- user certificates (:meth:`ThrowawayCA.issue_user`): end-entity client certificates,
  for mod_ssl (which refuses RFC proxies) and the HTTP driver's ``x509_user_cert/key``.
- RFC 3820 proxies of a user certificate (:meth:`ThrowawayCA.make_proxy`): proxy
  certificate + its key + the user certificate in one file (``X509_USER_PROXY``), for
  XRootD GSI and GridFTP; also already expired ones (the tests of the expiry check).
- a grid-mapfile (:func:`write_grid_mapfile`): the user DN to a local account (GSI
  ``-gridmap``, GridFTP ``GRIDMAP``).

Also: :class:`KerberosRealm` (a private MIT KDC on a loopback port with keytabs for a
service and a user, and the user's credential cache) and :class:`TokenIssuer` (SciTokens
signed with a throwaway EC key, whose public key is pre-seeded into the key cache the
server's scitokens library reads). The checks of what a client is given (expiry,
:class:`CredentialError`) are beside the drivers, in
:mod:`pytest_storagescale.drivers.credentials`.

Keys and certificates are made with the ``cryptography`` library; the CA folder's hash
names come from the ``openssl`` command (OpenSSL's canonical name hash).
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
import secrets
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

from ..drivers.credentials import CredentialError, certificate_expiry  # noqa: F401 - the servers' import
from ..errors import EndpointError
from ..redact import register_secret

#: the organisation every throwaway DN is under (the CA's signing policy allows it)
ORGANISATION = "pytest-storagescale"
#: RFC 3820 proxyCertInfo and its "inherit all" policy language
PROXY_CERT_INFO = ObjectIdentifier("1.3.6.1.5.5.7.1.14")
#: DER of ProxyCertInfo { proxyPolicy { policyLanguage id-ppl-inheritAll } }
_PROXY_INHERIT_ALL = bytes.fromhex("300c300a06082b06010505071501")
_KEY_BITS = 2048


@dataclass(frozen=True)
class CertificateFiles:
    """A certificate and its key on disk."""

    cert: Path
    key: Path
    #: the subject in the slash form grid-mapfiles and GSI use (``/O=.../CN=...``)
    subject: str
    not_after: dt.datetime


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=_KEY_BITS)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def slash_subject(name: x509.Name) -> str:
    """``name`` as ``/O=org/CN=name`` (DER order: grid-mapfiles, GSI, signing policies)."""
    return "".join(f"/{attr.rfc4514_attribute_name}={attr.value!s}"  # type: ignore[str-bytes-safe]
                   for attr in name)  # a name's attributes are text


def hand_to(path: Path, user: str | None, mode: int | None = None) -> None:
    """Give ``path`` to ``user`` (when running as root and a user is named) and set
    ``mode``: servers refuse keys others can read, and read only files they own."""
    if mode is not None:
        path.chmod(mode)
    if user and os.geteuid() == 0:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _write(path: Path, data: bytes, mode: int, owner: str | None = None) -> Path:
    """``data`` into ``path`` with ``mode`` and ``owner`` from its first byte on: a new
    file beside it, made 0600 (never readable by another user, whatever the umask: a
    key written then chmod'ed was readable in between), given its mode and owner, then
    renamed over ``path`` (a link at ``path`` is replaced, never followed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            if owner and os.geteuid() == 0:
                entry = pwd.getpwnam(owner)
                os.fchown(stream.fileno(), entry.pw_uid, entry.pw_gid)
            os.fchmod(stream.fileno(), mode)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


def openssl_hashes(cert_path: Path) -> tuple[str, str]:
    """``(subject_hash, subject_hash_old)`` of a certificate, from the openssl command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise EndpointError("the throwaway CA needs the openssl command: "
                            "'sudo apt-get install openssl'.")
    done = subprocess.run(
        [openssl, "x509", "-noout", "-hash", "-subject_hash_old", "-in", str(cert_path)],
        capture_output=True, text=True, timeout=60,
    )
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2:
        raise EndpointError(f"openssl could not hash the throwaway CA {cert_path}: "
                            f"{done.stderr.strip()[-300:]}")
    return lines[0], lines[1]


class ThrowawayCA:
    """A certificate authority for one session; its key never leaves the process.

    ``directory`` is the private folder the CA folder (``<directory>/ca``) is made in;
    certificates go where the caller says. Certificates are valid for ``days``.
    """

    def __init__(self, directory: Path | str, *, days: int = 2) -> None:
        self.directory = Path(directory)
        self.days = days
        suffix = secrets.token_hex(3)
        self.name = x509.Name([
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANISATION),
            x509.NameAttribute(NameOID.COMMON_NAME, f"storagescale throwaway CA {suffix}"),
        ])
        self._key = _new_key()
        start = _now() - dt.timedelta(minutes=5)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(self.name).issuer_name(self.name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                           critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_dir = self.directory / "ca"
        self._write_ca_dir()

    @property
    def subject(self) -> str:
        return slash_subject(self.name)

    def _write_ca_dir(self) -> None:
        """``<hash>.0``, ``<hash_old>.0`` link, signing policies and empty CRLs."""
        self.ca_dir.mkdir(parents=True, exist_ok=True)
        self.ca_dir.chmod(0o755)
        pem = self.ca_dir / "storagescale-ca.pem"
        _write(pem, _cert_pem(self.certificate), 0o644)
        new_hash, old_hash = openssl_hashes(pem)
        pem.rename(self.ca_dir / f"{new_hash}.0")
        policy = (
            f"access_id_CA X509 '{self.subject}'\n"
            f"pos_rights globus CA:sign\n"
            f"cond_subjects globus '\"/O={ORGANISATION}/*\"'\n"
        ).encode()
        now = _now()
        crl = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.name)
            .last_update(now - dt.timedelta(minutes=5))
            .next_update(now + dt.timedelta(days=self.days))
            .sign(self._key, hashes.SHA256())
        ).public_bytes(serialization.Encoding.PEM)
        _write(self.ca_dir / f"{new_hash}.signing_policy", policy, 0o644)
        _write(self.ca_dir / f"{new_hash}.r0", crl, 0o644)
        if old_hash != new_hash:
            for ending in ("0", "signing_policy", "r0"):
                (self.ca_dir / f"{old_hash}.{ending}").symlink_to(f"{new_hash}.{ending}")

    def _issue(self, subject: x509.Name, key, *, issuer_name: x509.Name | None = None,
               signer=None, not_before: dt.datetime | None = None,
               not_after: dt.datetime | None = None,
               extensions: Iterable[tuple[x509.ExtensionType, bool]] = ()) -> x509.Certificate:
        start = not_before or (_now() - dt.timedelta(minutes=5))
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(issuer_name or self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(not_after or start + dt.timedelta(days=self.days))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signer or self._key, hashes.SHA256())

    def _end_entity_extensions(self, usage: ObjectIdentifier
                               ) -> list[tuple[x509.ExtensionType, bool]]:
        return [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.KeyUsage(digital_signature=True, content_commitment=False,
                           key_encipherment=True, data_encipherment=False,
                           key_agreement=False, key_cert_sign=False, crl_sign=False,
                           encipher_only=False, decipher_only=False), True),
            (x509.ExtendedKeyUsage([usage]), False),
            (x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
             False),
        ]

    def issue_host(self, cert: Path, key: Path, *, hostname: str = "localhost",
                   ips: Iterable[str] = ("127.0.0.1",), owner: str | None = None
                   ) -> CertificateFiles:
        """A host certificate ``CN=<hostname>`` with SAN ``DNS:<hostname>`` and ``ips``
        (server and client use: GridFTP and GSI servers also act as clients)."""
        private = _new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANISATION),
                             x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
        names = [x509.DNSName(hostname), *(x509.IPAddress(ip_address(ip)) for ip in ips)]
        extensions = self._end_entity_extensions(ExtendedKeyUsageOID.SERVER_AUTH)
        extensions[2] = (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        extensions.append((x509.SubjectAlternativeName(names), False))
        certificate = self._issue(subject, private, extensions=extensions)
        _write(cert, _cert_pem(certificate), 0o644, owner)
        _write(key, _key_pem(private), 0o400, owner)
        return CertificateFiles(cert, key, slash_subject(subject),
                                certificate.not_valid_after.replace(tzinfo=dt.UTC))

    def issue_user(self, cert: Path, key: Path, *, common_name: str = "storagescale user",
                   owner: str | None = None) -> CertificateFiles:
        """An end-entity client certificate ``/O=pytest-storagescale/CN=<common_name>``."""
        private = _new_key()
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANISATION),
                             x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        certificate = self._issue(
            subject, private,
            extensions=self._end_entity_extensions(ExtendedKeyUsageOID.CLIENT_AUTH))
        _write(cert, _cert_pem(certificate), 0o644, owner)
        _write(key, _key_pem(private), 0o400, owner)
        return CertificateFiles(cert, key, slash_subject(subject),
                                certificate.not_valid_after.replace(tzinfo=dt.UTC))

    def make_proxy(self, user: CertificateFiles, path: Path, *,
                   lifetime: dt.timedelta = dt.timedelta(hours=12),
                   expired: bool = False, owner: str | None = None) -> Path:
        """An RFC 3820 proxy of ``user`` (what ``grid-proxy-init -rfc`` makes): proxy
        certificate, its key and the user certificate in one 0400 file. ``expired``:
        one whose validity ended an hour ago (for the expiry checks)."""
        user_key = serialization.load_pem_private_key(user.key.read_bytes(), password=None)
        user_cert = x509.load_pem_x509_certificate(user.cert.read_bytes())
        private = _new_key()
        serial = x509.random_serial_number()
        subject = x509.Name([*user_cert.subject,
                             x509.NameAttribute(NameOID.COMMON_NAME, str(serial % 10**10))])
        if expired:
            not_before = _now() - dt.timedelta(hours=2)
            not_after = _now() - dt.timedelta(hours=1)
        else:
            not_before = _now() - dt.timedelta(minutes=5)
            not_after = min(not_before + lifetime,
                            user_cert.not_valid_after.replace(tzinfo=dt.UTC))
        proxy = self._issue(
            subject, private, issuer_name=user_cert.subject, signer=user_key,
            not_before=not_before, not_after=not_after,
            extensions=[
                (x509.KeyUsage(digital_signature=True, content_commitment=False,
                               key_encipherment=True, data_encipherment=False,
                               key_agreement=False, key_cert_sign=False, crl_sign=False,
                               encipher_only=False, decipher_only=False), True),
                (x509.UnrecognizedExtension(PROXY_CERT_INFO, _PROXY_INHERIT_ALL), True),
            ],
        )
        return _write(path, _cert_pem(proxy) + _key_pem(private) + _cert_pem(user_cert),
                      0o400, owner)


def write_grid_mapfile(path: Path, mapping: Mapping[str, str],
                       owner: str | None = None) -> Path:
    """A grid-mapfile: ``"<DN>" <account>`` per line (GSI ``-gridmap``, ``GRIDMAP``)."""
    text = "".join(f'"{subject}" {account}\n' for subject, account in mapping.items())
    return _write(path, text.encode(), 0o644, owner)


# -- Kerberos ---------------------------------------------------------------------------
KERBEROS_PACKAGES = "krb5-kdc krb5-admin-server krb5-user"
_KERBEROS_BINARIES = ("kdb5_util", "kadmin.local", "krb5kdc", "kinit")


def _tool(name: str) -> str:
    path = shutil.which(name) or next(
        (f"{folder}/{name}" for folder in ("/usr/sbin", "/sbin", "/usr/bin")
         if os.access(f"{folder}/{name}", os.X_OK)), None)
    if path is None:
        raise EndpointError(
            f"the embedded server's Kerberos login needs {name}, not found. Install MIT "
            f"Kerberos: 'sudo apt-get install {KERBEROS_PACKAGES}' (or run 'make setup').")
    return path


class KerberosRealm:
    """A throwaway MIT Kerberos realm: a ``krb5kdc`` on a free loopback port with a
    private database, ``krb5.conf`` and ``kdc.conf`` (``KRB5_CONFIG``,
    ``KRB5_KDC_PROFILE``), keytabs for ``service`` (e.g. ``xrootd/localhost``) and
    ``user``, and the user's credential cache (``kinit -k -t``). :meth:`stop` stops
    the KDC; the caller removes ``directory``."""

    def __init__(self, directory: Path | str, *, realm: str = "STORAGESCALE.TEST",
                 service: str = "xrootd/localhost", user: str = "ssuser",
                 service_owner: str | None = None, startup_timeout: float = 30.0) -> None:
        self.directory = Path(directory)
        self.realm = realm
        self.service = f"{service}@{realm}"
        self.user = f"{user}@{realm}"
        self.service_owner = service_owner
        self.startup_timeout = startup_timeout
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.krb5_config = self.directory / "krb5.conf"
        self.kdc_profile = self.directory / "kdc.conf"
        self.service_keytab = self.directory / "service.keytab"
        self.user_keytab = self.directory / "user.keytab"
        self.ccache = self.directory / "krb5cc_user"

    @property
    def environment(self) -> dict[str, str]:
        """What a process of this realm needs (the KDC tools, the server, a client)."""
        return {"KRB5_CONFIG": str(self.krb5_config), "KRB5_KDC_PROFILE": str(self.kdc_profile),
                "KRB5CCNAME": f"FILE:{self.ccache}"}

    def _write_profiles(self) -> None:
        d = self.directory
        self.krb5_config.write_text(
            f"[libdefaults]\n default_realm = {self.realm}\n dns_lookup_realm = false\n"
            f" dns_lookup_kdc = false\n rdns = false\n udp_preference_limit = 1\n"
            f" ticket_lifetime = 10h\n\n"
            f"[realms]\n {self.realm} = {{\n  kdc = 127.0.0.1:{self.port}\n }}\n")
        self.kdc_profile.write_text(
            f"[kdcdefaults]\n kdc_listen = 127.0.0.1:{self.port}\n"
            f" kdc_tcp_listen = 127.0.0.1:{self.port}\n\n"
            f"[realms]\n {self.realm} = {{\n  database_name = {d / 'principal'}\n"
            f"  key_stash_file = {d / 'stash'}\n  acl_file = {d / 'kadm5.acl'}\n"
            f"  max_life = 10h\n }}\n\n[logging]\n kdc = FILE:{d / 'kdc.log'}\n")
        self.krb5_config.chmod(0o644)

    def _run(self, *command: str) -> None:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=60,
                              env={**os.environ, **self.environment})
        if done.returncode != 0:
            raise EndpointError(
                f"setting up the throwaway Kerberos realm failed: {Path(command[0]).name} "
                f"{' '.join(command[1:3])}: {(done.stderr or done.stdout).strip()[-300:]}")

    def start(self) -> KerberosRealm:
        """Create the database and keytabs, start the KDC, get the user's ticket."""
        from .processes import free_port

        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._write_profiles()
        kadmin = _tool("kadmin.local")
        master = secrets.token_urlsafe(24)
        register_secret(master)  # the KDC database's password: in no message or log
        self._run(_tool("kdb5_util"), "create", "-s", "-r", self.realm, "-P", master)
        for principal, keytab in ((self.service, self.service_keytab),
                                  (self.user, self.user_keytab)):
            self._run(kadmin, "-r", self.realm, "-q", f"addprinc -randkey {principal}")
            self._run(kadmin, "-r", self.realm, "-q", f"ktadd -k {keytab} {principal}")
        hand_to(self.service_keytab, self.service_owner, 0o400)
        # the KDC needs no privilege (a port above 1024): it runs as the service's user
        # when the session is root, owning its database and log
        run_as = self.service_owner if os.geteuid() == 0 else None
        (self.directory / "kdc.log").touch()
        for path in self.directory.iterdir():
            if path.name.startswith(("principal", "stash", "kdc.log")):
                hand_to(path, run_as)
        output = (self.directory / "kdc.out").open("wb")
        identity: dict = {}
        if run_as:
            entry = pwd.getpwnam(run_as)
            identity = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        self.process = subprocess.Popen(
            [_tool("krb5kdc"), "-n", "-r", self.realm], cwd=self.directory,
            env={**os.environ, **self.environment}, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True, **identity)
        output.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        """``kinit`` until the KDC answers (it is the readiness probe)."""
        import time

        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        error = ""
        while time.monotonic() < deadline:
            try:
                code = self.process.wait(timeout=0.05)
                error = f"krb5kdc exited with code {code}"
                break
            except subprocess.TimeoutExpired:
                pass
            try:
                self.renew()
                return
            except EndpointError as exc:
                error = str(exc)
        self.stop()
        tail = "".join(
            (self.directory / name).read_text(errors="replace")[-600:]
            for name in ("kdc.out", "kdc.log") if (self.directory / name).exists()
        ) or "(no log)"
        raise EndpointError(f"the throwaway Kerberos KDC did not start: {error}. "
                            f"Log tail:\n{tail}")

    def renew(self, ccache: Path | None = None, *, lifetime: str = "") -> Path:
        """``kinit -k -t <user keytab>`` into ``ccache`` (default: the realm's);
        ``lifetime`` as kinit takes it (``10h``, ``2s``: a ticket that soon expires)."""
        target = ccache or self.ccache
        done = subprocess.run(
            [_tool("kinit"), "-k", "-t", str(self.user_keytab), "-c", f"FILE:{target}",
             *(["-l", lifetime] if lifetime else []), self.user],
            capture_output=True, text=True, timeout=30,
            env={**os.environ, **self.environment})
        if done.returncode != 0:
            raise EndpointError(f"kinit {self.user} failed: {done.stderr.strip()[-300:]}")
        return target

    def stop(self) -> None:
        """Stop the KDC (idempotent)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


# -- SciTokens --------------------------------------------------------------------------
SCITOKENS_PACKAGES = "libscitokens0 xrootd-scitokens-plugins"


class _SciTokensLibrary:
    """Debian's ``libSciTokens`` (scitokens-cpp) through ctypes: the library the
    server's ``libXrdAccSciTokens`` validates with mints the session's tokens."""

    def __init__(self) -> None:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("SciTokens") or "libSciTokens.so.0"
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            raise EndpointError(
                f"the embedded server's token login needs libSciTokens, not found. Install "
                f"it: 'sudo apt-get install {SCITOKENS_PACKAGES}' (or run 'make setup')."
            ) from None
        p, s, err = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)
        for function, arguments, result in (
            ("scitoken_key_create", [s, s, s, s, err], p),
            ("scitoken_key_destroy", [p], None),
            ("scitoken_create", [p], p),
            ("scitoken_destroy", [p], None),
            ("scitoken_set_claim_string", [p, s, s, err], ctypes.c_int),
            ("scitoken_set_lifetime", [p, ctypes.c_int], None),
            ("scitoken_serialize", [p, err, err], ctypes.c_int),
            ("scitoken_store_public_ec_key", [s, s, s, err], ctypes.c_int),
        ):
            getattr(lib, function).argtypes = arguments
            getattr(lib, function).restype = result
        self.lib = lib
        self.ctypes = ctypes

    def check(self, code: int, error, what: str) -> None:
        if code != 0:
            message = error.value.decode(errors="replace") if error.value else "no reason"
            raise EndpointError(f"libSciTokens could not {what}: {message}")


class TokenIssuer:
    """A throwaway SciTokens issuer: an EC P-256 key that signs tokens, and the
    server-side key cache that trusts it.

    scitokens-cpp fetches an issuer's keys over HTTPS with the system CA bundle only,
    so the public key is stored into the cache the server reads instead
    (``scitoken_store_public_ec_key`` under ``<cache_home>/scitokens``; the server runs
    with ``XDG_CACHE_HOME=<cache_home>``)."""

    def __init__(self, issuer: str = "https://localhost/storagescale-issuer", *,
                 audience: str = "storagescale", key_id: str = "storagescale-es256") -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self.issuer = issuer
        self.audience = audience
        self.key_id = key_id
        key = ec.generate_private_key(ec.SECP256R1())
        self._private_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption())
        self.public_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        self._library = _SciTokensLibrary()

    def trust_in(self, cache_home: Path, owner: str | None = None) -> None:
        """Store the issuer's public key in the key cache under ``cache_home`` (the
        ``XDG_CACHE_HOME`` of the server process), owned by ``owner``."""
        lib, ctypes = self._library.lib, self._library.ctypes
        cache_home.mkdir(parents=True, exist_ok=True)
        saved = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = str(cache_home)
        try:
            error = ctypes.c_char_p()
            code = lib.scitoken_store_public_ec_key(
                self.issuer.encode(), self.key_id.encode(), self.public_pem,
                ctypes.byref(error))
            self._library.check(code, error, "store the issuer's key in the key cache")
        finally:
            if saved is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = saved
        for path in [cache_home, *cache_home.rglob("*")]:
            hand_to(path, owner)

    def mint(self, *, subject: str = "ssuser", scope: str = "storage.read:/ "
             "storage.create:/ storage.modify:/", lifetime: int = 3600) -> str:
        """A signed WLCG-profile token (``storage.read/create/modify`` scopes under the
        server's ``base_path``); a negative ``lifetime``: one that has already expired."""
        lib, ctypes = self._library.lib, self._library.ctypes
        error = ctypes.c_char_p()
        key = lib.scitoken_key_create(self.key_id.encode(), b"ES256", self.public_pem,
                                      self._private_pem, ctypes.byref(error))
        if not key:
            self._library.check(1, error, "load the token signing key")
        token = lib.scitoken_create(key)
        try:
            for claim, value in (("iss", self.issuer), ("sub", subject),
                                 ("aud", self.audience), ("scope", scope),
                                 ("wlcg.ver", "1.0")):
                code = lib.scitoken_set_claim_string(token, claim.encode(), value.encode(),
                                                     ctypes.byref(error))
                self._library.check(code, error, f"set the token's {claim} claim")
            lib.scitoken_set_lifetime(token, lifetime)
            serialized = ctypes.c_char_p()
            code = lib.scitoken_serialize(token, ctypes.byref(serialized), ctypes.byref(error))
            self._library.check(code, error, "sign the token")
            register_secret(serialized.value.decode())  # never printed, in any output
            return serialized.value.decode()
        finally:
            lib.scitoken_destroy(token)
            lib.scitoken_key_destroy(key)


#: the WLCG scopes of the authorization checks' tokens (suites/conformance/authz.py)
READ_SCOPE = "storage.read:/"
WRITE_SCOPE = "storage.read:/ storage.create:/ storage.modify:/"
#: how long the checks' valid tokens last (a long run must not see them expire)
CHECK_TOKEN_LIFETIME = 12 * 3600


def authorization_tokens(issuer: TokenIssuer | None) -> dict[str, str]:
    """The tokens the authorization checks present, minted by ``issuer`` (none without
    one): ``readonly`` (:data:`READ_SCOPE`), ``write`` (:data:`WRITE_SCOPE`) and
    ``expired`` (write scopes, expired a minute ago). Secrets: never printed."""
    if issuer is None:
        return {}
    return {"readonly": issuer.mint(subject="ssreader", scope=READ_SCOPE,
                                    lifetime=CHECK_TOKEN_LIFETIME),
            "write": issuer.mint(subject="sswriter", scope=WRITE_SCOPE,
                                 lifetime=CHECK_TOKEN_LIFETIME),
            "expired": issuer.mint(subject="sswriter", scope=WRITE_SCOPE, lifetime=-60)}
