"""Throwaway credentials for the embedded servers, and checks of a client's credentials.

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
server's scitokens library reads). Expiry checks for what a client is given
(:func:`check_credentials`) raise :class:`CredentialError` naming the credential and
how to renew it, before any load runs.

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

from ..errors import EndpointError

#: the organisation every throwaway DN is under (the CA's signing policy allows it)
ORGANISATION = "pytest-storagescale"
#: RFC 3820 proxyCertInfo and its "inherit all" policy language
PROXY_CERT_INFO = ObjectIdentifier("1.3.6.1.5.5.7.1.14")
#: DER of ProxyCertInfo { proxyPolicy { policyLanguage id-ppl-inheritAll } }
_PROXY_INHERIT_ALL = bytes.fromhex("300c300a06082b06010505071501")
_KEY_BITS = 2048


class CredentialError(EndpointError):
    """A credential is missing, unreadable, wrong or expired: the message names it and
    how to renew it."""


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
    return "".join(f"/{attr.rfc4514_attribute_name}={attr.value}" for attr in name)


def hand_to(path: Path, user: str | None, mode: int | None = None) -> None:
    """Give ``path`` to ``user`` (when running as root and a user is named) and set
    ``mode``: servers refuse keys others can read, and read only files they own."""
    if mode is not None:
        path.chmod(mode)
    if user and os.geteuid() == 0:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _write(path: Path, data: bytes, mode: int, owner: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.chmod(0o600)
    path.write_bytes(data)
    hand_to(path, owner, mode)
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


def certificate_expiry(path: Path | str) -> dt.datetime:
    """When the first certificate in a PEM file (a proxy's own) stops being valid."""
    certificate = x509.load_pem_x509_certificate(Path(path).read_bytes())
    return certificate.not_valid_after.replace(tzinfo=dt.UTC)
