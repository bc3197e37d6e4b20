"""The embedded GridFTP door (seed 004's GFTP doors): the Globus GridFTP server with
GSI, reached over ``gsiftp://`` through gfal2's gridftp plugin.

``globus-gridftp-server -p <port> -control-interface 127.0.0.1 -data-interface
127.0.0.1 -hostname localhost`` runs in its default daemon mode, not detached: a child
of the session in a new session, forking (and re-executing itself) for each
connection; :class:`~.processes.ProcessGroup` stops the daemon and every connection's
process. Its environment names the throwaway credentials: ``X509_CERT_DIR`` (the CA
folder with its signing policy and CRL), ``X509_USER_CERT``/``X509_USER_KEY`` (the
host certificate, ``CN=localhost``: clients connect to ``localhost``) and ``GRIDMAP``
(the user's DN mapped to a local account). A private ``-c`` configuration keeps
``/etc/gridftp.conf`` out. Data connections use ephemeral loopback ports (no
``GLOBUS_TCP_PORT_RANGE``: nothing filters loopback, and a fixed range would be shared
by parallel sessions).

**Accounts.** Run as root (the server then switches each connection to the mapped
account after the GSI handshake), the user's DN is mapped to the ``xrootd`` account
(installed with the XRootD server, which the plugin needs anyway), else ``nobody``;
no account is created. The test area is owned by that account. Run as another user,
the server can only serve as that user, and the DN is mapped to it.

GridFTP paths are absolute: the test area is
``gsiftp://localhost:<port>/<private dir>/data/storagescale``. Clients hold an RFC 3820
proxy of the user certificate (:meth:`EmbeddedGridFTP.driver_options`: ``x509_proxy``,
``ca_dir``). Readiness is a real ``stat`` of the test area through the gfal2 driver
with that proxy (which also loads gfal2's gridftp plugin early in the process, before
any step holds descriptors above ``FD_SETSIZE``).
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
from .processes import (
    OneGroupServer,
    ProcessGroup,
    find_daemon,
    free_port,
    log_tail,
    unprivileged_user,
)

if TYPE_CHECKING:  # .credentials loads cryptography: imported where a server makes them
    from .credentials import CertificateFiles, ThrowawayCA

#: the test area's folder inside the private directory's data folder
AREA_NAME = "storagescale"
SERVER = "globus-gridftp-server"
#: gfal2's gridftp plugin: without it gfal2 does not speak gsiftp://
GFAL2_PLUGIN = "libgfal_plugin_gridftp.so"
GFAL2_PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/gfal2-plugins", "/usr/lib/gfal2-plugins",
                     "/usr/lib64/gfal2-plugins", "/usr/lib/aarch64-linux-gnu/gfal2-plugins")
PACKAGES = ("globus-gridftp-server-progs", "globus-proxy-utils", "gfal2-plugin-gridftp",
            "python3-gfal2")


def gridftp_binary() -> str:
    path = find_daemon(SERVER)
    if path is None:
        raise EndpointError(
            f"the embedded gridftp endpoint needs {SERVER}, not found on PATH. Install it: "
            f"'sudo apt-get install {' '.join(PACKAGES)}' (or run 'make setup' in the "
            f"pytest-storagescale checkout); or point the suite at a running door with "
            f"--storage-endpoint gsiftp://host:2811/path.")
    return path


def gridftp_version(binary: str | None = None) -> str:
    """``gridftp-13.24`` from ``globus-gridftp-server -version``
    ("globus_gridftp_server: 13.24 (1653033972-1)"): prefixed, so that no dCache
    release's thresholds file matches it."""
    done = subprocess.run([binary or gridftp_binary(), "-version"], capture_output=True,
                          text=True, timeout=30)
    match = re.search(r"globus_gridftp_server:\s*(\d+(?:\.\d+)+)", done.stdout + done.stderr)
    return f"gridftp-{match.group(1)}" if match else "gridftp-unknown"


def gfal2_plugin_dirs() -> list[str]:
    """Where gfal2 looks for its plugins (``GFAL_PLUGIN_DIR`` first)."""
    return [*filter(None, [os.environ.get("GFAL_PLUGIN_DIR")]), *GFAL2_PLUGIN_DIRS]


class EmbeddedGridFTP(OneGroupServer, EmbeddedServer):
    """A Globus GridFTP server with GSI on ``gsiftp://localhost:<port>/<dir>/storagescale``.

    ``unix`` (the family's default) and ``gsi`` both name its one login: GSI with the
    user's RFC 3820 proxy."""

    kind = "gridftp"
    summary = "Globus GridFTP"
    schemes = ("gsiftp",)
    logins = ("unix", "gsi")
    packages = PACKAGES
    binaries = (SERVER,)

    def __init__(self, *, login: str = "unix", startup_timeout: float = 60.0) -> None:
        super().__init__(login=login)
        self.startup_timeout = startup_timeout
        self.directory: Path | None = None
        self.port = 0
        self.version = ""
        self.authority: ThrowawayCA | None = None
        self.host_certificate: CertificateFiles | None = None
        self.user_certificate: CertificateFiles | None = None
        self.proxy: Path | None = None
        #: the local account the user's DN is mapped to
        self.account = ""
        self.group: ProcessGroup | None = None
        #: seconds from start() to the first answered request
        self.start_seconds = 0.0

    @classmethod
    def check_installed(cls) -> None:
        gridftp_binary()
        if not any(os.path.exists(os.path.join(folder, GFAL2_PLUGIN))
                   for folder in gfal2_plugin_dirs()):
            raise EndpointError(
                f"the embedded gridftp endpoint is reached through gfal2's gridftp plugin "
                f"({GFAL2_PLUGIN}), not found in {', '.join(gfal2_plugin_dirs())}. Install "
                f"it: 'sudo apt-get install gfal2-plugin-gridftp'.")

    # -- where -----------------------------------------------------------------------
    @property
    def ca_dir(self) -> str:
        return str(self.directory / "ca") if self.directory is not None else ""

    @property
    def area(self) -> str:
        """The test area's absolute path (GridFTP paths are the server's own)."""
        assert self.directory is not None
        return str(self.directory / "data" / AREA_NAME)

    def url_for(self, scheme: str = "gsiftp") -> str:
        if scheme not in self.schemes:
            raise EndpointError(f"the embedded gridftp door serves gsiftp, not {scheme}://")
        return f"gsiftp://localhost:{self.port}{self.area}"

    @property
    def url(self) -> str:
        return self.url_for("gsiftp")

    def driver_options(self) -> dict[str, str]:
        """The CA folder and the user's proxy (secrets: never printed)."""
        options = super().driver_options()
        if self.proxy is not None:
            options["x509_proxy"] = str(self.proxy)
        return options

    def describe(self) -> str:
        return (f"embedded Globus GridFTP {self.version.removeprefix('gridftp-')} "
                f"(GSI proxy login, mapped to {self.account or 'a local account'})")

    @property
    def log_path(self) -> Path:
        assert self.directory is not None
        return self.directory / "gridftp.log"

    # -- start and stop ----------------------------------------------------------------
    def start(self) -> EmbeddedGridFTP:
        began = time.monotonic()
        self.check_installed()
        binary = gridftp_binary()
        self.version = gridftp_version(binary)
        self.directory = server_directory(self.kind)
        try:
            self._prepare()
        except Exception:
            self.stop()
            raise
        last_error = ""
        for _ in range(3):  # a port picked free can be taken before the server binds it
            self.port = free_port()
            self.group = ProcessGroup(self._command(binary), cwd=self.directory,
                                      env=self._environment(),
                                      output=self.directory / "console.log",
                                      name="globus-gridftp-server", log=self.log_path)
            last_error = self._wait_ready()
            if not last_error:
                self.start_seconds = time.monotonic() - began
                return self
            self.group.stop()
            if "in use" not in log_tail(self.log_path, 40).lower():
                break
        tail = log_tail(self.log_path)
        self.stop()
        raise EndpointError(f"the embedded GridFTP server did not start: {last_error}. "
                            f"Log tail:\n{tail}")

    def _prepare(self) -> None:
        """CA, host certificate, the user's certificate and proxy, the grid-mapfile and
        the test area owned by the mapped account."""
        d = self.directory
        assert d is not None
        d.chmod(0o711)  # connections switched to the mapped account reach data/ through it
        from .credentials import ThrowawayCA, write_grid_mapfile

        self.authority = ThrowawayCA(d)
        self.host_certificate = self.authority.issue_host(d / "tls" / "host.pem",
                                                          d / "tls" / "host.key")
        (d / "client").mkdir(mode=0o700)
        self.user_certificate = self.authority.issue_user(
            d / "client" / "usercert.pem", d / "client" / "userkey.pem")
        self.proxy = self.authority.make_proxy(self.user_certificate, d / "client" / "x509up")
        mapped = unprivileged_user()  # xrootd, else nobody; None: not root
        self.account = mapped or pwd.getpwuid(os.geteuid()).pw_name
        write_grid_mapfile(d / "grid-mapfile", {self.user_certificate.subject: self.account})
        (d / "data" / AREA_NAME).mkdir(parents=True)
        (d / "gridftp.conf").write_text("# private: keeps /etc/gridftp.conf out\n")
        if mapped is not None:
            entry = pwd.getpwnam(mapped)
            for path in (d / "data", d / "data" / AREA_NAME):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def _command(self, binary: str) -> list[str]:
        d = self.directory
        assert d is not None
        return [binary, "-c", str(d / "gridftp.conf"), "-p", str(self.port),
                "-control-interface", "127.0.0.1", "-data-interface", "127.0.0.1",
                "-hostname", "localhost", "-home-dir", str(d / "data"),
                "-l", str(self.log_path), "-log-level", "ERROR,WARN,INFO",
                "-disable-usage-stats"]

    def _environment(self) -> dict[str, str]:
        assert self.directory is not None and self.host_certificate is not None
        environment = {key: value for key, value in os.environ.items()
                       if key not in ("X509_USER_PROXY", "GLOBUS_TCP_PORT_RANGE")}
        return {**environment, "X509_CERT_DIR": self.ca_dir,
                "X509_USER_CERT": str(self.host_certificate.cert),
                "X509_USER_KEY": str(self.host_certificate.key),
                "GRIDMAP": str(self.directory / "grid-mapfile")}

    def _wait_ready(self) -> str:
        """A real ``stat`` of the test area over gsiftp with the user's proxy until one
        is answered; '' when ready, else why not."""
        from ..drivers.registry import driver_spec

        assert self.group is not None
        spec = driver_spec(self.url, driver="gfal2", options=self.driver_options())
        deadline = time.monotonic() + self.startup_timeout
        last = "no answer"
        while time.monotonic() < deadline:
            code = self.group.exited(wait=0.05)  # the pause between probes
            if code is not None:
                return f"{SERVER} exited with code {code}"
            try:  # the daemon listens before it answers: no GSI handshake before that
                with socket_to(self.port):
                    pass
            except OSError as exc:
                last = str(exc)
                continue
            probe = spec.connect("probe", timeout=15)
            try:
                if probe.stat(self.area).is_dir:
                    return ""
                last = f"{self.area} is not a directory"
            except Exception as exc:  # noqa: BLE001 - keep probing until the deadline
                last = str(exc)
            finally:
                probe.close()
        return f"no answer on port {self.port} within {self.startup_timeout:.0f} s ({last})"

    def stop(self) -> None:
        """Stop the daemon and every connection's process; remove the private
        directory (idempotent)."""
        if self.group is not None:
            self.group.stop()
            self.group = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None



def socket_to(port: int):
    """A TCP connection to ``127.0.0.1:port`` (a context manager)."""
    import socket

    return socket.create_connection(("127.0.0.1", port), timeout=1)
