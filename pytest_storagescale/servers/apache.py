"""The embedded WebDAV door that is not XRootD: Apache httpd with ``mod_dav`` over HTTPS,
clients authenticated by X.509 client certificates (what a dCache WebDAV door asks for).

``apache2 -f <private config> -DFOREGROUND`` runs as a child of the session in a new
session (its process group is the one :meth:`~.processes.ProcessGroup.stop`
signals), so every worker it forks is stopped with it. Everything lives in a private directory:
``httpd.conf``, ``ca/`` (the throwaway CA folder: hash links and CRL, read by
``SSLCACertificatePath``/``SSLCARevocationPath``), ``tls/`` (the host certificate and
its key, read by the root parent before it drops privileges), ``client/`` (the user's
end-entity certificate and key), ``data/storagescale`` (the test area, owned by the
user the workers run as: ``www-data`` when the session is root), ``lock/`` (the
``DavLockDB``), ``run/`` (pid file, mutexes, TLS session cache) and ``logs/``.

mod_ssl refuses RFC 3820 proxies (``proxy certificates not allowed``), so
:meth:`EmbeddedApacheWebDAV.driver_options` hands out the end-entity certificate and
key (``x509_user_cert``/``x509_user_key``). mod_dav offers no checksums (no RFC 3230
``Want-Digest``): the http driver's upload and download checks say "not offered" and
stop asking; an explicit ``checksum`` is an error (``checksum_type``).

Readiness is one real HTTPS ``PROPFIND`` of the test area with the client certificate,
through the http driver (probed, never slept for).
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EndpointError
from .family import EmbeddedServer
from .orphans import server_directory
from .processes import OneGroupServer, ProcessGroup, find_daemon, free_port, log_tail

if TYPE_CHECKING:  # .credentials loads cryptography: imported where a server makes them
    from .credentials import CertificateFiles, ThrowawayCA

#: the test area inside the door
AREA = "/storagescale"
#: where Debian keeps Apache's modules
MODULES_DIR = Path("/usr/lib/apache2/modules")
#: module name -> file: the event MPM, authorization, TLS and its session cache, WebDAV
MODULES = {
    "mpm_event_module": "mod_mpm_event.so",
    "authz_core_module": "mod_authz_core.so",
    "socache_shmcb_module": "mod_socache_shmcb.so",
    "ssl_module": "mod_ssl.so",
    "dav_module": "mod_dav.so",
    "dav_fs_module": "mod_dav_fs.so",
    "dav_lock_module": "mod_dav_lock.so",
}
#: the user Apache's workers run as when the session is root (Debian's)
WORKER_USER = "www-data"


def apache_binary() -> str:
    path = find_daemon("apache2")
    if path is None:
        raise EndpointError(
            "the embedded webdav endpoint needs apache2, not found on PATH. Install it: "
            "'sudo apt-get install apache2' (or run 'make setup' in the pytest-storagescale "
            "checkout); or point the suite at a running door with --storage-endpoint "
            "davs://host:port/path.")
    return path


def apache_version(binary: str | None = None) -> str:
    """``apache-2.4.71`` from ``apache2 -v`` ("Server version: Apache/2.4.71 (Debian)"):
    prefixed, so that no dCache release's thresholds file matches it."""
    done = subprocess.run([binary or apache_binary(), "-v"], capture_output=True, text=True,
                          timeout=30)
    match = re.search(r"Apache/(\d+(?:\.\d+)+)", done.stdout + done.stderr)
    return f"apache-{match.group(1)}" if match else "apache-unknown"


class EmbeddedApacheWebDAV(OneGroupServer, EmbeddedServer):
    """Apache ``mod_dav`` serving ``davs://127.0.0.1:<port>/storagescale`` to clients
    holding a certificate of the session's throwaway CA.

    ``unix`` (the family's default) and ``gsi`` both name its one login: an X.509
    end-entity client certificate (``SSLVerifyClient require``)."""

    kind = "webdav"
    summary = "Apache mod_dav"
    schemes = ("davs", "https")
    logins = ("unix", "gsi")
    packages = ("apache2",)
    binaries = ("apache2",)

    def __init__(self, *, login: str = "unix", startup_timeout: float = 60.0,
                 threads_per_child: int = 25, server_limit: int = 16) -> None:
        super().__init__(login=login)
        self.startup_timeout = startup_timeout
        self.threads_per_child = threads_per_child
        self.server_limit = server_limit
        self.binary = ""
        self.directory: Path | None = None
        self.port = 0
        self.version = ""
        self.authority: ThrowawayCA | None = None
        self.host_certificate: CertificateFiles | None = None
        self.user_certificate: CertificateFiles | None = None
        self.group: ProcessGroup | None = None
        #: seconds from start() to the first answered request
        self.start_seconds = 0.0

    @classmethod
    def check_installed(cls) -> None:
        apache_binary()  # /usr/sbin is not on every user's PATH
        missing = [name for name in MODULES.values() if not (MODULES_DIR / name).exists()]
        if missing:
            raise EndpointError(
                f"the embedded webdav endpoint needs the Apache modules {', '.join(missing)} "
                f"in {MODULES_DIR}: 'sudo apt-get install apache2'.")

    # -- where -----------------------------------------------------------------------
    @property
    def ca_dir(self) -> str:
        return str(self.directory / "ca") if self.directory is not None else ""

    @property
    def data_dir(self) -> Path:
        assert self.directory is not None
        return self.directory / "data"

    def url_for(self, scheme: str = "davs") -> str:
        if scheme not in self.schemes:
            raise EndpointError(f"the embedded webdav door serves {', '.join(self.schemes)}, "
                                f"not {scheme}://")
        return f"{scheme}://127.0.0.1:{self.port}{AREA}"

    @property
    def url(self) -> str:
        return self.url_for(self.schemes[0])

    def driver_options(self) -> dict[str, str]:
        """The CA folder and the end-entity certificate and key (mod_ssl takes no
        proxies)."""
        options = super().driver_options()
        if self.user_certificate is not None:
            options.update(x509_user_cert=str(self.user_certificate.cert),
                           x509_user_key=str(self.user_certificate.key))
        return options

    def describe(self) -> str:
        return (f"embedded Apache httpd {self.version.removeprefix('apache-')} mod_dav "
                f"(X.509 client certificate login)")

    @property
    def log_path(self) -> Path:
        assert self.directory is not None
        return self.directory / "logs" / "error.log"

    # -- start and stop ----------------------------------------------------------------
    def start(self) -> EmbeddedApacheWebDAV:
        began = time.monotonic()
        self.check_installed()
        self.binary = apache_binary()
        self.version = apache_version(self.binary)
        self.directory = server_directory(self.kind)
        try:
            self._prepare()
        except Exception:
            self.stop()
            raise
        last_error = ""
        for _ in range(3):  # a port picked free can be taken before Apache binds it
            self.port = free_port()
            config = self._write_config()
            self.group = ProcessGroup([self.binary, "-f", str(config), "-DFOREGROUND"],
                                      cwd=self.directory, env=self._environment(),
                                      output=self.directory / "logs" / "console.log",
                                      name="apache", log=self.log_path)
            last_error = self._wait_ready()
            if not last_error:
                self.start_seconds = time.monotonic() - began
                return self
            self.group.stop()
            if "Address already in use" not in log_tail(self.log_path, 40):
                break
        tail = log_tail(self.log_path)
        self.stop()
        raise EndpointError(f"the embedded Apache WebDAV door did not start: {last_error}. "
                            f"Log tail:\n{tail}")

    def _prepare(self) -> None:
        """CA, host and user certificates, the test area and the folders Apache writes."""
        d = self.directory
        assert d is not None
        d.chmod(0o711)  # the workers look CA certificates and CRLs up in ca/ when verifying
        for sub in ("run", "logs", "lock", "data"):
            (d / sub).mkdir()
        (d / "data" / AREA.strip("/")).mkdir()
        from .credentials import ThrowawayCA

        self.authority = ThrowawayCA(d)
        # read by the root parent before it drops privileges: stays the session's
        self.host_certificate = self.authority.issue_host(d / "tls" / "host.pem",
                                                          d / "tls" / "host.key")
        (d / "client").mkdir(mode=0o700)
        self.user_certificate = self.authority.issue_user(
            d / "client" / "usercert.pem", d / "client" / "userkey.pem")
        worker = self._worker_user()
        if worker is not None:
            entry = pwd.getpwnam(worker)
            for top in (d / "data", d / "lock"):
                for path in (top, *top.rglob("*")):
                    os.chown(path, entry.pw_uid, entry.pw_gid)

    @staticmethod
    def _worker_user() -> str | None:
        """``www-data`` when the session is root (Apache refuses to serve as root)."""
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(WORKER_USER)
        except KeyError:
            raise EndpointError(
                f"running as root, and no '{WORKER_USER}' user exists for Apache's workers "
                f"(the apache2 package makes it): 'sudo apt-get install apache2'.") from None
        return WORKER_USER

    def _environment(self) -> dict[str, str]:
        # Debian's apache2 reads APACHE_* only from its envvars file, which -f skips
        return {**os.environ, "LANG": "C"}

    def _write_config(self) -> Path:
        d = self.directory
        assert d is not None and self.host_certificate is not None
        worker = self._worker_user()
        lines = [
            f"ServerRoot {d}",
            f"Listen 127.0.0.1:{self.port}",
            "ServerName localhost",
            f"PidFile {d / 'run' / 'httpd.pid'}",
            f"ErrorLog {d / 'logs' / 'error.log'}",
            "LogLevel warn",
            f"Mutex file:{d / 'run'} default",
            *(f"LoadModule {name} {MODULES_DIR / file}" for name, file in MODULES.items()),
            *([f"User {worker}", f"Group {worker}"] if worker else []),
            # many load clients, each on its own kept-alive connection
            "StartServers 2",
            f"ServerLimit {self.server_limit}",
            f"ThreadsPerChild {self.threads_per_child}",
            f"MaxRequestWorkers {self.server_limit * self.threads_per_child}",
            "KeepAlive On",
            "MaxKeepAliveRequests 0",
            "KeepAliveTimeout 60",
            "Timeout 120",
            f"DocumentRoot {d / 'data'}",
            f"DavLockDB {d / 'lock' / 'DavLock'}",
            "SSLEngine on",
            f"SSLCertificateFile {self.host_certificate.cert}",
            f"SSLCertificateKeyFile {self.host_certificate.key}",
            f"SSLCACertificatePath {d / 'ca'}",
            f"SSLCARevocationPath {d / 'ca'}",
            "SSLCARevocationCheck chain",
            "SSLVerifyClient require",
            "SSLVerifyDepth 10",
            f"SSLSessionCache shmcb:{d / 'run' / 'ssl_scache'}(512000)",
            "<Directory />",
            "  Require all denied",
            "</Directory>",
            f"<Directory {d / 'data'}>",
            "  Dav On",
            "  Require ssl-verify-client",
            "</Directory>",
            "",
        ]
        config = d / "httpd.conf"
        config.write_text("\n".join(lines))
        return config

    def _wait_ready(self) -> str:
        """A real HTTPS request with the client certificate until one is answered;
        '' when ready, else why not."""
        from ..drivers.registry import driver_spec

        assert self.group is not None
        spec = driver_spec(self.url, driver="http", options=self.driver_options())
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            code = self.group.exited(wait=0.05)  # the pause between probes
            if code is not None:
                return f"apache2 exited with code {code}"
            probe = spec.connect("probe", timeout=5)
            try:
                if probe.stat(AREA).is_dir:
                    return ""
                last = f"{AREA} is not a directory"
            except Exception as exc:  # noqa: BLE001 - keep probing until the deadline
                last = str(exc)
            finally:
                probe.close()
        return f"no answer on port {self.port} within {self.startup_timeout:.0f} s ({last})"

    def stop(self) -> None:
        """Stop Apache and its workers and remove the private directory (idempotent)."""
        if self.group is not None:
            self.group.stop()
            self.group = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

