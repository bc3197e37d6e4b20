"""The embedded endpoint: a real ``xrootd`` server on free loopback ports.

Started when no ``--storage-endpoint`` is given (and by the plugin's own tests). It
listens on loopback only (``xrd.port`` binds every interface and XRootD has no
directive for the address: :mod:`.loopback` preloads a library that binds the
wildcard to loopback instead). It lives in a private temporary directory, runs as an
unprivileged user when the session is root (xrootd refuses to run as root), is ready
when it answers a ``query config version`` (probed, never slept for), and is stopped
and removed at the end.

Run as root, xrootd starts as root and drops to its user (``-R``) after it read its
configuration and loaded its program's libraries: the directory (0750, group the
user's), the configuration, the CA folder and a copied release stay root's; the user
owns only what the server writes (:data:`SERVER_WRITES`, the login's caches) and the
host key. The configuration is written as a new file renamed over the old one, never
through a link (:func:`.xrootd_releases.write_own_file`).

Logins (``--storage-embedded-login``): ``unix`` (no security protocol configured:
the login names the user), ``krb5`` (a throwaway MIT KDC; ``sec.protocol krb5`` with
a service keytab), ``gsi`` (``sec.protocol gsi`` with the throwaway CA, a host
certificate and a grid-mapfile; the client holds an RFC 3820 proxy and connects to
``localhost``, the host certificate's name) and ``token`` (``sec.protocol ztn`` over
TLS, authorised by ``libXrdAccSciTokens`` with a token signed by a throwaway issuer).
Every credential a client needs is in :meth:`EmbeddedXRootD.driver_options`; the
login's protocol is forced there too (``security_protocol``).

Third-party copy is on unless ``tpc=False`` (a server without TPC, a fault the
conformance suite catches): ``ofs.tpc`` for root:// (the destination server runs
``xrdcp --server`` to pull from the source) and XrdHttpTPC (``http.exthandler
xrdtpc``) for WebDAV ``COPY``, pull and push. XrdHttpTPC verifies the other server
against this server's CA folder, read at each copy (``XRDTPC_CADIR``): a peer issued
by another throwaway CA is trusted once :func:`trust_ca` put that CA in the folder.

Releases (``--storage-embedded-version``, :mod:`.xrootd_releases`): the installed one
(Debian's 5.5.3) by default, ``6.2.1`` from the cache ``scripts/build-xrootd6.sh``
fills, or a site's own installation prefix. The configuration follows the release
(:meth:`EmbeddedXRootD._release_config`): plug-ins by their full path in the prefix
(``libXrdHttp-6.so``), ``tpc.allow local`` from 5.9.3 on (HTTP TPC to or from a
loopback address is refused by default since), ``all.sitename`` from 6 on (XrdMacaroons
refuses to load without it); the server runs with ``LD_LIBRARY_PATH`` on the prefix's
library folder and is refused when its ``/proc/PID/maps`` shows an XRootD library from
elsewhere.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..drivers.grid import LOGIN_PROTOCOLS, credential_environment_kept
from ..drivers.url import HTTPS_SCHEMES
from ..errors import EndpointError, exit_text
from ..load.server_monitor import report_line
from ..redact import redact_url
from .family import EmbeddedServer
from .loopback import preloaded
from .orphans import server_directory
from .processes import free_port, log_tail, unprivileged_user
from .xrootd_releases import (
    XRootDRelease,
    check_requested,
    foreign_libraries,
    offered,
    release,
    write_own_file,
)

if TYPE_CHECKING:  # .credentials loads cryptography: imported where a server makes them
    from .credentials import CertificateFiles, KerberosRealm, ThrowawayCA, TokenIssuer

INSTALL_HINT = (
    "install the XRootD server: 'sudo apt-get install xrootd-server xrootd-server-plugins' "
    "(Debian/Ubuntu) or 'dnf install xrootd-server' (EL), or run 'make setup' in the "
    "pytest-storagescale checkout; or point the suite at a running server with "
    "--storage-endpoint root://host:1094//path."
)
#: the exported test area inside the embedded server
AREA = "/storagescale"
#: how long a root:// TPC rendezvous key is valid (default, most), and how many copies
#: run at once
TPC_TTL = (60, 300)
TPC_TRANSFERS = 16
#: what the server writes, the only folders of its directory its user owns when the
#: session is root: the directory itself, the configuration, the release's copy, the
#: CA folder and the credentials stay root's (xrootd starts as root, reads them and
#: runs the release's program and libraries before it drops to its user)
SERVER_WRITES = ("data", "admin", "run", "log")


def xrootd_binary() -> str:
    path = shutil.which("xrootd") or (
        "/usr/bin/xrootd" if os.access("/usr/bin/xrootd", os.X_OK) else None
    )
    if path is None:
        raise EndpointError(f"the embedded endpoint needs the xrootd binary, not found on PATH: "
                            f"{INSTALL_HINT}")
    return path


def xrootd_version(binary: str | None = None) -> str:
    """The server's version from ``xrootd -v`` (e.g. ``5.5.3``), without starting it."""
    result = subprocess.run(
        [binary or xrootd_binary(), "-v"], capture_output=True, text=True, timeout=30,
    )
    text = (result.stdout + result.stderr).strip().splitlines()
    return text[-1].strip().lstrip("v") if text else "unknown"


def trust_ca(ca_dir: str | Path, other_ca_dir: str | Path) -> int:
    """Put the CA of ``other_ca_dir`` (a hashed folder: ``<hash>.0`` certificates, their
    signing policies and CRLs) into ``ca_dir``, so that the server and the clients that
    verify against ``ca_dir`` trust certificates it issued (a TPC peer's host
    certificate). Returns the files copied; existing files are kept."""
    target, copied = Path(ca_dir), 0
    for source in sorted(Path(other_ca_dir).iterdir()):
        destination = target / source.name
        if not source.is_file() or destination.exists():
            continue
        shutil.copyfile(source, destination)
        destination.chmod(0o644)
        copied += 1
    return copied


_PROBE = """
import sys, json
from pytest_storagescale.drivers.registry import driver_spec
url, options = json.loads(sys.stdin.read())
probe = driver_spec(url, driver="xrootd", options=options).connect("probe", timeout=5)
try:
    probe.version()
except Exception as exc:
    print(exc)
"""


def _probe_apart(url: str, options: dict[str, str]) -> str:
    """One version request from a process of its own: "" when answered, else why not
    (the options, a token among them, go through stdin, never the command line)."""
    import json
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], input=json.dumps([url, options]),
                              capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "the probe got no answer within 30 s"
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["the probe process failed"])[-1]
    return done.stdout.strip()


#: how long a start may take before the server is given up (seconds): a start takes
#: about a second, but on a machine at load 13-20 (a shared CI runner) 30 s was not
#: enough (issue 31 #15); a server that exits is said at once, whatever this is
START_TIMEOUT = 120.0


class EmbeddedXRootD(EmbeddedServer):
    """A throwaway xrootd serving ``root://127.0.0.1:<port>//storagescale``.

    ``extra_config`` lines are appended to the configuration (e.g. the throttle
    plugin); ``tpc=False`` leaves third-party copy out (root:// and HTTP). Use as a
    context manager or call :meth:`start` / :meth:`stop`.
    """

    kind = "xrootd"
    reports_summary = True
    schemes = ("root", "davs")
    logins = ("unix", "krb5", "gsi", "token")
    packages = ("xrootd-server", "xrootd-server-plugins")
    binaries = ("xrootd",)

    @classmethod
    def installed_version(cls) -> str:
        """``xrootd -v``: known without starting it."""
        return xrootd_version()

    @classmethod
    def available_versions(cls) -> tuple[str, ...]:
        """The installed release (the default) and 6.2.1 (built into the cache)."""
        return offered(cls.installed_version())

    @classmethod
    def check_version(cls, requested: str) -> str:
        """A release by name (6.2.1: built, else the build command) or an installation
        prefix (made absolute): :func:`.xrootd_releases.check_requested`."""
        return check_requested(requested, cls.installed_version())

    @classmethod
    def release_version(cls, requested: str) -> str:
        """The version a server of ``requested`` (a checked value) will say, without
        starting it: its ``xrootd -v``."""
        return release(check_requested(requested, cls.installed_version())).version

    def __init__(self, *, extra_config: str = "", startup_timeout: float = START_TIMEOUT,
                 https: bool = True, login: str = "unix", tpc: bool = True,
                 data_directory: Path | None = None) -> None:
        super().__init__(login=login)
        #: a data directory kept across servers (an upgrade in place: one release
        #: writes, the next one serves the same files); given to the server's user,
        #: never removed by stop(). None: ``data/`` in the server's own directory
        self.kept_data = data_directory
        self.extra_config = extra_config
        self.https = https
        #: third-party copy offered (ofs.tpc, and XrdHttpTPC on the davs door)
        self.tpc = tpc
        self.http_port = 0
        self.startup_timeout = startup_timeout
        self.binary = xrootd_binary()
        #: the installation it runs (chosen by :attr:`requested_version` at start)
        self.release: XRootDRelease | None = None
        self.directory: Path | None = None
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.version = ""
        #: the session's throwaway CA and host certificate (made by start())
        self.authority: ThrowawayCA | None = None
        self.host_certificate: CertificateFiles | None = None
        #: the login's credentials: a Kerberos realm, a user certificate and its
        #: proxy, a token (made by start() for that login only)
        self.realm: KerberosRealm | None = None
        self.user_certificate: CertificateFiles | None = None
        self.proxy: Path | None = None
        self.token_issuer: TokenIssuer | None = None
        self.token = ""
        #: environment of the xrootd process (KRB5_CONFIG, XDG_CACHE_HOME...)
        self._server_environment: dict[str, str] = {}
        self._security_config: list[str] = []

    @property
    def host(self) -> str:
        """``localhost`` for GSI (the name in the host certificate the client checks),
        else ``127.0.0.1``."""
        return "localhost" if self.login == "gsi" else "127.0.0.1"

    @property
    def listen_address(self) -> str:
        """Where it listens: loopback (servers/loopback.c)."""
        return "127.0.0.1"

    @property
    def tls(self) -> bool:
        """Whether the server has a host certificate (``xrd.tls``): for davs, gsi, ztn."""
        return self.https or self.login in ("gsi", "token")

    @property
    def url(self) -> str:
        """The test area's URL."""
        return f"root://{self.host}:{self.port}/{AREA}"

    @property
    def https_url(self) -> str:
        """The test area over HTTPS/WebDAV (XrdHttp), verified against :attr:`ca_dir`."""
        return f"davs://127.0.0.1:{self.http_port}{AREA}"

    def url_for(self, scheme: str) -> str:
        return self.https_url if scheme in HTTPS_SCHEMES else self.url

    @property
    def ca_dir(self) -> str:
        """The throwaway CA (hashed directory, as X509_CERT_DIR expects)."""
        return str(self.directory / "ca") if self.directory is not None and self.tls else ""

    @property
    def client_directory(self) -> Path:
        """The client's credentials (proxy, user certificate, ticket cache): owned by the
        session's user, not the server's."""
        assert self.directory is not None
        return self.directory / "client"

    def driver_options(self) -> dict[str, str]:
        """CA folder and, per login, the forced protocol and the client's credential."""
        options = super().driver_options()
        if self.login == "krb5" and self.realm is not None:
            options.update(krb5_config=str(self.realm.krb5_config),
                           krb5ccname=f"FILE:{self.realm.ccache}")
        elif self.login == "gsi" and self.proxy is not None:
            options.update(x509_proxy=str(self.proxy))
        elif self.login == "token" and self.token:
            options.update(token=self.token)
        if self.login != "unix":
            options["security_protocol"] = LOGIN_PROTOCOLS[self.login]
        return options

    def describe(self) -> str:
        return f"embedded xrootd {self.version} ({self.login} login)"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def server_pids(self) -> list[int]:
        """The xrootd process while it runs."""
        return [self.process.pid] if self.process is not None and self.process.poll() is None \
            else []

    @property
    def log_path(self) -> Path:
        assert self.directory is not None
        return self.directory / "log" / "xrootd.log"

    def _write_config(self) -> Path:
        """``xrootd.cfg`` in the server's folder, root's (a link is replaced, never
        followed: :func:`.xrootd_releases.write_own_file`)."""
        assert self.directory is not None
        d = self.directory
        config = d / "xrootd.cfg"
        write_own_file(
            config,
            "\n".join([
                "all.export /",
                f"xrd.port {self.port}",
                f"oss.localroot {self.kept_data or d / 'data'}",
                f"all.adminpath {d / 'admin'}",
                f"all.pidpath {d / 'run'}",
                "xrootd.chksum adler32",
                *self._release_config(),
                # enough threads for 1000+ clients blocked in requests
                "xrd.sched mint 16 maxt 4096 avlt 256 idle 60",
                *(self._https_config() if self.tls else []),
                *self._tpc_config(),
                # the security framework only when a login needs it: unix is no protocol
                *([f"xrootd.seclib {self._plugin('libXrdSec')}", *self._security_config]
                  if self._security_config else []),
                *([report_line(self.report_to)] if self.report_to else []),
                self.extra_config,
                "",
            ]),
        )
        return config

    def _https_config(self) -> list[str]:
        d = self.directory
        assert d is not None
        return [
            f"xrd.tls {d / 'tls' / 'host.pem'} {d / 'tls' / 'host.key'}",
            f"xrd.tlsca certdir {d / 'ca'}",
            *([f"xrd.protocol XrdHttp:{self.http_port} {self._plugin('libXrdHttp')}"]
              if self.https else []),
        ]

    def _plugin(self, name: str) -> str:
        """The name a directive gives plug-in ``name`` in this release."""
        return self.release.plugin(name) if self.release is not None else f"{name}.so"

    def _release_config(self) -> list[str]:
        """What differs between releases: ``all.sitename`` (6: XrdMacaroons needs it)
        and ``tpc.allow local`` (5.9.3: HTTP TPC to or from loopback is refused
        without it)."""
        if self.release is None:
            return []
        return [*(["all.sitename storagescale"] if self.release.at_least(6) else []),
                *(["tpc.allow local"] if self.tpc and self.https
                  and self.release.at_least(5, 9, 3) else [])]

    def _tpc_config(self) -> list[str]:
        """Third-party copy: ``ofs.tpc`` (root://: this server pulls with ``xrdcp`` when
        it is the destination, and checks the rendezvous key when it is the source) and
        XrdHttpTPC for ``COPY`` on the davs door."""
        if not self.tpc:
            return []
        xrdcp = (self.release.program("xrdcp", self.directory)
                 if self.release is not None and self.directory is not None
                 else shutil.which("xrdcp") or "xrdcp")
        return [
            # autorm: a failed copy leaves no partial file; pgm must come last
            f"ofs.tpc autorm ttl {TPC_TTL[0]} {TPC_TTL[1]} xfr {TPC_TRANSFERS} "
            f"pgm {xrdcp} --server",
            *([f"http.exthandler xrdtpc {self._plugin('libXrdHttpTPC')}"] if self.https else []),
        ]

    def _environment(self) -> dict[str, str]:
        """The xrootd process's environment: the login's variables and, with HTTP TPC,
        the CA folder its copies verify the other server against (read at each copy, so
        a CA added by :func:`trust_ca` counts at once; without it XrdHttpTPC reads a
        copy made at start)."""
        tpc = {"XRDTPC_CADIR": str(self.directory / "ca")} if (
            self.tpc and self.https and self.directory is not None) else {}
        own = self.release.environment() if self.release is not None else {}
        return preloaded({**os.environ, **self._server_environment, **tpc, **own})

    def trust(self, other_ca_dir: str | Path) -> None:
        """Trust the CA of ``other_ca_dir`` (a TPC peer's): :func:`trust_ca`."""
        if self.ca_dir:
            trust_ca(self.ca_dir, other_ca_dir)

    def share_ca(self, ca_dir: str | Path) -> None:
        """Put this server's CA into ``ca_dir`` (a storage's, or its clients'), which
        then trusts this server's certificate (a TPC peer's): :func:`trust_ca`."""
        if self.ca_dir:
            trust_ca(ca_dir, self.ca_dir)

    def _prepare_login(self, user: str | None) -> None:
        """Make the login's credentials; set the security lines of the configuration
        and the server's environment."""
        assert self.directory is not None
        d, client = self.directory, self.client_directory
        client.mkdir(mode=0o700)
        from .credentials import KerberosRealm, write_grid_mapfile

        if self.login == "krb5":
            self.realm = KerberosRealm(d / "kerberos", service_owner=user).start()
            self._server_environment = {"KRB5_CONFIG": str(self.realm.krb5_config),
                                        "KRB5RCACHEDIR": str(d / "rcache")}
            (d / "rcache").mkdir()
            self._security_config = [
                f"sec.protocol krb5 {self.realm.service_keytab} {self.realm.service}"]
        elif self.login == "gsi":
            assert self.authority is not None and self.host_certificate is not None
            self.user_certificate = self.authority.issue_user(
                client / "usercert.pem", client / "userkey.pem")
            self.proxy = self.authority.make_proxy(self.user_certificate, client / "x509up")
            mapfile = write_grid_mapfile(d / "grid-mapfile",
                                         {self.user_certificate.subject: "ssuser"})
            self._security_config = [
                f"sec.protocol gsi -certdir:{d / 'ca'} -cert:{self.host_certificate.cert} "
                f"-key:{self.host_certificate.key} -gridmap:{mapfile} -gmapopt:2 -crl:1 "
                f"-dlgpxy:0"]
        elif self.login == "token":
            self._prepare_token()

    def _prepare_token(self) -> None:
        """A throwaway issuer trusted by the server's key cache, and a token from it;
        ``ztn`` authenticates, ``libXrdAccSciTokens`` authorises by the token's scopes."""
        assert self.directory is not None
        from .credentials import TokenIssuer

        d = self.directory
        self.token_issuer = TokenIssuer()
        self.token_issuer.trust_in(d / "cache")  # handed to the server's user with d
        self.token = self.token_issuer.mint()
        self._server_environment = {"XDG_CACHE_HOME": str(d / "cache")}
        (d / "scitokens.cfg").write_text(
            f"[Global]\naudience = {self.token_issuer.audience}\n\n"
            f"[Issuer storagescale]\nissuer = {self.token_issuer.issuer}\n"
            f"base_path = {AREA}\n")
        (d / "authdb").write_text("# every right comes from the token's scopes\n")
        self._security_config = [
            "sec.protocol ztn",
            "ofs.authorize 1",
            f"acc.authdb {d / 'authdb'}",
            f"ofs.authlib ++ {self._plugin('libXrdAccSciTokens')} config={d / 'scitokens.cfg'}",
            # the davs door: the bearer token of the Authorization header authorises too
            *(["http.header2cgi Authorization authz"] if self.https else []),
        ]

    def _make_certificates(self) -> None:
        """A throwaway CA (``ca/``) and a host certificate for localhost/127.0.0.1
        (``tls/host.pem``, ``tls/host.key`` 0400): :mod:`.credentials`."""
        from .credentials import ThrowawayCA

        assert self.directory is not None
        self.authority = ThrowawayCA(self.directory)
        self.host_certificate = self.authority.issue_host(
            self.directory / "tls" / "host.pem", self.directory / "tls" / "host.key")

    def start(self) -> EmbeddedXRootD:
        self.release = release(self.requested_version)
        self.binary, self.version = self.release.binary, self.release.version
        self.directory = server_directory(self.kind)
        user = unprivileged_user()
        entry = pwd.getpwnam(user) if user else None
        if entry is not None:  # root's folder, which the server's user enters and reads
            os.chown(self.directory, -1, entry.pw_gid)
            self.directory.chmod(0o750)
        for sub in SERVER_WRITES:
            (self.directory / sub).mkdir()
        data = self.kept_data or self.directory / "data"
        (data / AREA.strip("/")).mkdir(exist_ok=self.kept_data is not None)
        if self.tls:
            self._make_certificates()
        if user:  # the release's files within the reach of the user it runs as, root's
            self.release = self.release.copied_to(self.directory / "release")
            self.binary = self.release.binary
        try:
            self._prepare_login(user)
        except Exception:
            self.stop()
            raise
        if entry is not None:
            self._hand_writable(entry)
        last_error = ""
        for _ in range(3):  # a port picked free can be taken before xrootd binds it
            self.port = free_port()
            self.http_port = free_port() if self.https else 0
            self._launch(user)
            last_error = self._wait_ready() or self._foreign_libraries()
            if not last_error:
                return self
            self._terminate()
        tail = self._log_tail()
        self.stop()
        raise EndpointError(f"the embedded xrootd did not start: {last_error}. Log tail:\n{tail}")

    def _hand_writable(self, entry: pwd.struct_passwd) -> None:
        """Give the server's user what it writes (:data:`SERVER_WRITES`, the login's
        caches, a kept data folder) and the host key it reads; the rest stays root's.
        Links are given, never followed (a kept data folder is the user's already)."""
        assert self.directory is not None
        mine = [self.directory / sub for sub in (*SERVER_WRITES, "rcache", "cache")]
        for top in [*mine, *([self.kept_data] if self.kept_data else [])]:
            if not top.exists():
                continue
            for path in [top, *top.rglob("*")]:
                os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
        if self.host_certificate is not None:
            os.chown(self.host_certificate.key, entry.pw_uid, entry.pw_gid,
                     follow_symlinks=False)

    def _launch(self, user: str | None) -> None:
        """Start xrootd on this server's ports and files (as ``user`` when root), in its
        ``run/`` folder (it writes a ``.lock`` in its working directory)."""
        assert self.directory is not None
        command = [self.binary, "-c", str(self._write_config()), "-l", str(self.log_path)]
        if user:
            command += ["-R", user]
        self.process = subprocess.Popen(
            command, cwd=self.directory / "run", stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True,
            env=self._environment(),
        )

    def _wait_ready(self) -> str:
        """Probe until the server answers; return '' when ready, else why not. The
        probe's credentials are in the environment only while it runs: the process
        that started the server keeps its own client identity."""
        with credential_environment_kept():
            return self._probe_until_ready()

    def _probe_until_ready(self) -> str:
        from ..drivers.registry import driver_spec

        spec = driver_spec(self.url, driver="xrootd", options=self.driver_options())
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            try:
                # wait() is the pause between probes, and notices an early exit
                code = self.process.wait(timeout=0.05)
                return f"xrootd exited with code {code}"
            except subprocess.TimeoutExpired:
                pass
            try:
                for port in (self.port, self.http_port):
                    if port:
                        with socket.create_connection((self.listen_address, port),
                                                      timeout=1):
                            pass
            except OSError:
                continue
            if self.login in ("token", "gsi"):
                # ztn is TLS, and the XRootD client makes its TLS context (CA folder
                # included) once per process; its gsi plug-in reads its CA folder and
                # proxy once per process too (a second gsi server's probe here failed
                # with "No protocols left to try"): a probe here would pin this server's
                # throwaway CA for every later server of the process, so it runs apart
                last = _probe_apart(self.url, dict(self.driver_options()))
                if not last:
                    return ""
                continue
            probe = spec.connect("probe", timeout=5)
            try:
                probe.version()
                return ""
            except Exception as exc:  # noqa: BLE001 - keep probing until the deadline
                last = str(exc)
                continue
            finally:
                probe.close()
        return f"no answer on port {self.port} within {self.startup_timeout:.0f} s" + (
            f" ({last})" if "last" in locals() else ""
        )

    def _foreign_libraries(self) -> str:
        """Why the running server is not the release it should be: XRootD libraries
        mapped from outside its prefix ("" when none)."""
        if self.release is None or self.process is None:
            return ""
        foreign = foreign_libraries(self.process.pid, self.release)
        return (f"xrootd {self.version} from {self.release.lib_dir} loaded libraries of "
                f"another XRootD: {', '.join(foreign)}" if foreign else "")

    def _log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log_path, lines) if self.directory is not None else "(no log)"

    def restart(self, down_for: float = 0.0) -> None:
        """Kill the server, keep it down for ``down_for`` seconds, and start it again on
        the same ports with the same files (a storage restart, for the tests). Killed,
        not asked to stop: the outage starts now, not after a shutdown that a loaded
        machine may stretch over seconds (SIGTERM is given up to 5 s)."""
        assert self.directory is not None, "restart() of a server that is not running"
        if self.process is not None and self.process.poll() is None:
            self._signal(signal.SIGKILL)
            self.process.wait(timeout=30)
        if down_for > 0:
            threading.Event().wait(down_for)  # the outage itself, not a wait for the server
        self._launch(unprivileged_user())
        error = self._wait_ready()
        if error:
            raise EndpointError(f"the embedded xrootd did not restart on port {self.port}: "
                                f"{error}. Log tail:\n{self._log_tail()}")

    def freeze(self) -> None:
        """SIGSTOP the server: it keeps its connections but answers nothing."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, number: signal.Signals) -> None:
        """Signal the server while it runs; once it exited its pid may be another
        process's (pids are recycled), so nothing is sent."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, number)

    def exit_note(self) -> str:
        if self.process is None or self.directory is None:
            return ""
        code = self.process.poll()
        if code is None:
            return ""
        return (f"the embedded xrootd (pid {self.process.pid}, port {self.port}) died during "
                f"the run ({exit_text(code)}): every storage call after that met a closed "
                f"port. The last lines of its log:\n{redact_url(self._log_tail())}")

    def _terminate(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self._signal(signal.SIGCONT)  # a frozen server cannot exit
            self.process.terminate()
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """Stop the server (and the login's KDC) and remove its directory."""
        self._terminate()
        if self.realm is not None:
            self.realm.stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

