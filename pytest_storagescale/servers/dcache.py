"""The embedded dCache: a real dCache release, one domain on loopback, its namespace
(chimera) in a private PostgreSQL cluster, two pools, and three doors.

- WebDAV over HTTPS (``davs://localhost:<port>/storagescale``): a ``GET`` or ``PUT``
  is answered by a 307 to the pool that holds (or will hold) the data; users log in
  with user/password (the ``unix`` login) or an X.509 certificate or proxy of the
  session's throwaway CA (``gsi``).
- xrootd (``root://localhost:<port>//storagescale``): anonymous (the ``unix`` login),
  acting as the test user; ``gsi``: a second xrootd door that requires GSI.
- SRM (``srm://localhost:<port>/storagescale``, GSI), through gfal2.

The release comes from a distribution tarball, ``dcache-<version>.tar.gz`` as dCache
publishes it: ``--storage-embedded-version`` names one of the distribution cache
(:func:`distribution_dir`; the project's set-up fills it with
``scripts/dcache-dist.sh``) or gives the path of a tarball (the one a site is about to
deploy); the newest of the cache by default. Everything lives in the run's private
directory: the unpacked release, its configuration (``etc/dcache.conf``, a layout of one
domain, gPlazma's files), the grid-security folder, the pools, the PostgreSQL cluster
(:mod:`.postgres`) and the logs. The domain's JVM runs in the foreground as a child of
the session (what ``bin/dcache start`` runs under its restart loop; a service that
fails at start makes the domain exit instead of restarting quietly), its heap bounded
(:data:`HEAP`), every door, ZooKeeper and the database on loopback; ports are free
ones picked at start. Readiness is probed on each door, never slept for: a real
``PUT`` through the WebDAV door (the pools come up after the doors), a ``stat`` of
the test area over xrootd and over SRM. The version is the WebDAV door's own report
(its ``Server:`` header). A killed pytest leaves nothing behind: the JVMs and
PostgreSQL work in the recorded directory (:mod:`.orphans`), the JVMs' temporary files
(the SRM door's Jetty folder) too (``java.io.tmpdir``).

Another local user reads no secret of it and opens no ZooKeeper session: the release
folder is 0700 with no compiled configuration cache (``var/config/cache`` held the
database password), the files holding a password are 0600, and ZooKeeper runs in a JVM
of its own that requires a SASL login (:meth:`EmbeddedDCache._start_zookeeper`: dCache's
embedded ZooKeeper service cannot).
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..drivers.grid import LOGIN_PROTOCOLS, credential_environment_kept
from ..errors import EndpointError, StorageScaleUsageError
from ..redact import register_secret, register_url
from . import dcache_tape as tape_config
from .dcache_tape import TapeLibrary
from .family import EmbeddedServer, start_timeout_hint
from .oidc_issuer import SUBJECT as OIDC_SUBJECT
from .oidc_issuer import IssuerAccess, OidcIssuer
from .orphans import server_directory
from .postgres import PostgresCluster
from .postgres import check_installed as check_postgres
from .processes import ServerProcess, log_tail
from .site_paths import check_release_tarball
from .tarballs import first_problem
from .tarballs import unpack as unpack_release

if TYPE_CHECKING:  # .credentials loads cryptography: imported where a server makes them
    from .credentials import CertificateFiles, ThrowawayCA

#: the test area in the namespace
AREA = "/storagescale"
#: the test user: its name in gPlazma, uid and gid in the namespace
USER, UID, GID = "storagescale", 1000, 1000
#: the outside token issuer's name in gPlazma (``gplazma.oidc.provider!<name>``, the
#: ``@<name>`` of its subjects in the multi-mapfile)
OIDC_PROVIDER = "storagescale"
#: the JVM's heap and direct memory (``dcache.java.memory.*``)
HEAP, DIRECT_MEMORY = "768m", "512m"
#: the listening ports of the domain (then the pools' movers' ranges: WAN, LAN)
PORT_NAMES = ("webdav", "xrootd", "xrootd_gsi", "srm", "srm_tls", "zookeeper", "dcap", "ftp",
              "frontend", "admin", "prometheus")
#: the user of the Prometheus JMX exporter's basic authentication (11.1+: the JVM's
#: agent, ``dcache.enable.prometheus.exporter``; the run's password)
PROMETHEUS_USER = "prometheus"
#: the doors every embedded dCache has, by their URL scheme
BASE_DOORS = ("davs", "root", "srm")
#: the doors beside them (``extra_doors``), by their names: dcap with GSI
#: (``gsidcap://``: a plain door's anonymous user is nobody, who may not write into a
#: directory it made, :data:`DCAP_LOGIN`) and GridFTP (GSI)
EXTRA_DOORS = ("dcap", "gsiftp")
#: the extra doors a server has by default, and so the session's doors
#: (``--storage-load-doors all``, the conformance checks): both. dcap's folders' clean-up
#: lists through the xrootd door (session/endpoint.py with_listing_door); its data moves
#: in the gfal2 driver's movers, forked from one factory per client process (50 clients
#: that each started an interpreter at their logins hung there: drivers/dcap_mover.py);
#: the tape steps find it by its driver's scheme, gsidcap (docs/guarantees.md)
DEFAULT_EXTRA_DOORS = ("dcap", "gsiftp")
#: why the dcap door logs in with GSI (docs/servers.md)
DCAP_LOGIN = ("a plain dcap door's anonymous user (dcap.authz.anonymous-operations=FULL) is "
              "gPlazma's nobody: chimera gives a directory nobody makes its parent's owner "
              "and mode 755, so nobody may not write into it (Access denied); with GSI the "
              "session's proxy is mapped to the test user, as on WebDAV and GridFTP")
WAN_PORTS, LAN_PORTS = 100, 40
#: the databases dCache's services use (owned by the role ``dcache``)
DATABASES = ("chimera", "pinmanager", "srm")
#: what a kept state holds (:attr:`EmbeddedDCache.state_directory`)
STATE = ("postgres", "pools")
#: the one domain and the layout's name
DOMAIN, LAYOUT = "dCacheDomain", "storagescale"
#: how a tarball is named, and a release's version
TARBALL = re.compile(r"dcache-(\d+(?:\.\d+)+)\.tar\.gz")
#: the Debian packages it needs (java 17 to 21, PostgreSQL)
PACKAGES = ("openjdk-17-jre-headless", "postgresql")
#: the environment variable naming the distribution cache (else the user cache's)
DIST_VARIABLE = "STORAGESCALE_DCACHE_DIST"
#: the ZooKeeper login of the domain (SASL DIGEST-MD5; a session without it is refused)
ZOOKEEPER_USER = "dcache"
#: the ZooKeeper server's JVM options: SASL required of every session, no admin server
#: (Jetty on 8080), of the four-letter commands only ``ruok`` (its readiness probe)
_ZOOKEEPER_SERVER = (
    "-Xmx128m",
    "-Dzookeeper.authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider",
    "-Dzookeeper.enforce.auth.enabled=true",
    "-Dzookeeper.enforce.auth.schemes=sasl",
    "-Dzookeeper.admin.enableServer=false",
    "-Dzookeeper.4lw.commands.whitelist=ruok",
)
#: ZooKeeper's log: warnings and errors on its console (its own log file)
_ZOOKEEPER_LOGBACK = """<configuration>
  <appender name="console" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{ISO8601} %-5level %logger{36} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="console"/></root>
</configuration>
"""
#: what runs the domain in the foreground (sourced from the release's own scripts)
_RUN_DOMAIN = """#!/bin/sh
# The dCache domain $2 of the release in $1, in the foreground: what bin/dcache start
# runs under its restart daemon (share/lib/services-daemon.sh, domainStart).
set -e
umask 077
DCACHE_HOME=$1
DCACHE_CLASSPATH=${DCACHE_HOME}/share/classes/*
DCACHE_DEFAULTS=${DCACHE_HOME}/share/defaults
DCACHE_CACHED_CONFIG=${DCACHE_HOME}/var/config/cache
. "${DCACHE_HOME}/share/lib/loadConfig.sh"
classpath="$(printClassPath "$2")"
JAVA_OPTIONS="$(getProperty dcache.java.options "$2")"
cd "$DCACHE_HOME"
CLASSPATH="$classpath" exec "$JAVA" ${JAVA_OPTIONS} "-Ddcache.home=$DCACHE_HOME" \\
    "-Ddcache.paths.defaults=$DCACHE_DEFAULTS" org.dcache.boot.BootLoader start "$2"
"""


#: each door's listening port (:attr:`EmbeddedDCache.ports`): its readiness probe runs
#: once the port takes a connection. The probes of the GSI xrootd door and the extra
#: doors start a Python process each (gfal2, the XRootD client: ~0.3 s of CPU), which
#: every half-second round of a start took from the JVMs starting beside them. The
#: tape's frontend is probed as it is (in process, over HTTPS)
_DOOR_PORTS = {"davs": "webdav", "root": "xrootd", "srm": "srm", "root-gsi": "xrootd_gsi",
               "dcap": "dcap", "gsiftp": "ftp"}

#: a stat of the test area through gfal2, in a process of its own (the extra doors' probe)
_STAT_APART = """
import json, sys
from pytest_storagescale.drivers.registry import driver_spec
url, area, options = json.loads(sys.stdin.read())
client = driver_spec(url, driver="gfal2", options=options).connect("probe", timeout=30)
if not client.stat(area).is_dir:
    sys.exit(area + " is not a directory")
"""


def zookeeper_wait_s(startup_timeout: float) -> float:
    """How long of a start's deadline ZooKeeper may take to answer (s): 120 s of the
    default 300, 0.4 of a longer one (``--storage-embedded-start-timeout``: the
    option its failure names gives it longer too)."""
    return min(startup_timeout, max(120.0, startup_timeout * 0.4))


def distribution_dir() -> Path:
    """Where the dCache tarballs are: ``$STORAGESCALE_DCACHE_DIST``, else
    ``$XDG_CACHE_HOME/pytest-storagescale/dcache`` (``~/.cache`` by default)."""
    if os.environ.get(DIST_VARIABLE):
        return Path(os.environ[DIST_VARIABLE])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-storagescale" / "dcache"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def cached_releases() -> dict[str, Path]:
    """version -> tarball of the distribution cache, oldest first."""
    try:
        entries = list(distribution_dir().iterdir())
    except OSError:
        return {}
    found = {match.group(1): entry for entry in entries
             if (match := TARBALL.fullmatch(entry.name)) and entry.is_file()}
    return {version: found[version] for version in sorted(found, key=_version_key)}


def no_distribution_text() -> str:
    """The paragraph a run without any dCache distribution gets."""
    return (f"the embedded dcache needs a dCache distribution, and there is none: no "
            f"dcache-<version>.tar.gz in {distribution_dir()}. Give the tarball of the "
            f"release to test with --storage-embedded-version PATH (a dcache-VERSION.tar.gz "
            f"as dcache.org publishes it), or fill the cache: 'scripts/dcache-dist.sh' in the "
            f"pytest-storagescale checkout (run by 'make setup'; it assembles the releases "
            f"of the shared dcache folder); or point the suite at a running dCache with "
            f"--storage-endpoint URL.")


def _java_release() -> int:
    """The major version of ``java`` on PATH (0: none or unreadable)."""
    java = shutil.which("java")
    if java is None:
        return 0
    done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)', done.stderr + done.stdout)
    return int(match.group(1)) if match else 0


class EmbeddedDCache(EmbeddedServer):
    """A throwaway dCache on loopback (see the module's doc)."""

    kind = "dcache"
    summary = "a real dCache release: WebDAV, xrootd, SRM, dcap and GridFTP doors"
    schemes = (*BASE_DOORS, *DEFAULT_EXTRA_DOORS)
    logins = ("unix", "gsi")
    packages = PACKAGES
    binaries = ("java",)
    #: the tape a server has unless told otherwise (``tape=None``: none)
    default_tape: TapeLibrary | None = TapeLibrary()

    def __init__(self, *, login: str = "unix", startup_timeout: float = 300.0,
                 gsi_xrootd: bool | None = None, state_directory: Path | None = None,
                 extra_doors: tuple[str, ...] = DEFAULT_EXTRA_DOORS,
                 tape: TapeLibrary | None | str = "default",
                 oidc_issuer: bool | None = None) -> None:
        super().__init__(login=login)
        #: an outside OIDC token issuer the server trusts (:mod:`.oidc_issuer`: HTTPS on
        #: loopback, WLCG-profile JWTs; gPlazma's ``oidc`` plugin with ``-profile=wlcg``):
        #: None, with the tape (the Tape REST API's token login); True or False
        self.oidc_issuer_wanted = oidc_issuer
        self.oidc_issuer: OidcIssuer | None = None
        #: the tape behind both pools (:mod:`.dcache_tape`: an HSM script emulating a
        #: tape library in the run's folder, the tape-backed directory, the frontend
        #: with the WLCG Tape REST API, bulk, cleaner-hsm, the admin door); None: none;
        #: by default :attr:`default_tape` (what ``--storage-embedded dcache`` starts)
        if tape is not None and not isinstance(tape, TapeLibrary) and tape != "default":
            raise ValueError(f"tape={tape!r}: give a TapeLibrary, or None for no tape")
        self.tape: TapeLibrary | None = (self.default_tape if isinstance(tape, str)
                                         else tape)
        unknown = [door for door in extra_doors if door not in EXTRA_DOORS]
        if unknown:
            raise ValueError(f"no such extra door of the embedded dCache: {unknown[0]!r} "
                             f"(known: {', '.join(EXTRA_DOORS)})")
        #: the doors beside WebDAV, xrootd and SRM (:data:`EXTRA_DOORS`)
        self.extra_doors = tuple(extra_doors)
        #: the state kept across servers (an upgrade in place: one release writes, the
        #: next one starts on the same database and pools): ``postgres/`` (the
        #: PostgreSQL cluster) and ``pools/`` of this folder, moved into the server's
        #: own directory while it runs and back by stop(), never removed. None: a
        #: throwaway state
        self.state_directory = state_directory
        #: whether this start found a kept state (then no chimera set-up, and the
        #: release's own schema update migrates it)
        self.state_kept = False
        self._state_taken = False
        #: per database, the Liquibase change sets recorded (``databasechangelog``)
        #: before and after ``bin/dcache database update`` of this start
        self.changesets: dict[str, tuple[int, int]] = {}
        self.startup_timeout = startup_timeout
        #: the doors' host in their URLs, and where ZooKeeper listens (the layout over
        #: several hosts, :mod:`.dcache_hosts`, gives the network's addresses)
        self.door_host = "localhost"
        self.zookeeper_listen = "127.0.0.1"
        #: a second xrootd door that requires GSI (always with the gsi login)
        self.gsi_xrootd = login == "gsi" if gsi_xrootd is None else gsi_xrootd
        self.directory: Path | None = None
        self.home: Path | None = None
        self.tarball: Path | None = None
        self.database: PostgresCluster | None = None
        self.process: subprocess.Popen | None = None
        self.watched: ServerProcess | None = None
        self.ports: dict[str, int] = {}
        #: the first port of this server's block while it runs (:data:`HELD_BLOCKS`)
        self.port_block = 0
        self.password = ""
        #: the embedded ZooKeeper's SASL password (a registered secret)
        self.zookeeper_password = ""
        #: ZooKeeper's own JVM (dCache's embedded one takes no login: see _start_zookeeper)
        self.zookeeper: subprocess.Popen | None = None
        self.zookeeper_watched: ServerProcess | None = None
        self.authority: ThrowawayCA | None = None
        self.host_certificate: CertificateFiles | None = None
        self.user_certificate: CertificateFiles | None = None
        self.proxy: Path | None = None
        #: seconds from start() to every door ready, and per door from the JVM's start
        self.start_seconds = 0.0
        #: the tape's flush timer while dCache holds it (:class:`.dcache_tape.HoldBridge`)
        self.hold_bridge: tape_config.HoldBridge | None = None
        self.door_seconds: dict[str, float] = {}
        self.setup_seconds = 0.0

    # -- the releases ----------------------------------------------------------------
    @classmethod
    def available_versions(cls) -> tuple[str, ...]:
        """The releases of the distribution cache, oldest first."""
        return tuple(cached_releases())

    @classmethod
    def check_version(cls, requested: str) -> str:
        """A release of the cache, or the path of a ``dcache-VERSION.tar.gz`` (given
        back absolute)."""
        if requested in cached_releases():
            return requested
        path = Path(requested).expanduser()
        if TARBALL.fullmatch(path.name) and path.is_file():
            # read whole first, bounded (a compression bomb stops at its first header
            # past the bound), so the search for bin/dcache below reads a bounded tarball
            problem = first_problem(path.resolve())
            if problem.startswith("member "):
                raise StorageScaleUsageError(
                    f"--storage-embedded-version {requested}: the tarball's {problem}, which "
                    f"could write outside the run's folder or fill its disk when unpacked "
                    f"(no dCache release holds one). Give dCache's own tarball, or a release "
                    f"of the distribution cache.")
            if problem:  # broken or truncated, wherever its bin/dcache is
                raise StorageScaleUsageError(
                    f"--storage-embedded-version {requested}: not a dCache distribution "
                    f"tarball: {problem[-300:]}. Give the dCache distribution's own tarball "
                    f"(dcache-VERSION.tar.gz as dcache.org publishes it, complete), or a "
                    f"release of the distribution cache.")
            check_release_tarball(requested, path.resolve(), "bin/dcache", "dCache")
            return str(path.resolve())
        offered = cls.available_versions()
        raise StorageScaleUsageError(
            f"--storage-embedded-version {requested}: "
            + ("no such file, and not a release of the distribution cache"
               if "/" in requested or requested.endswith(".gz")
               else "not a release of the distribution cache")
            + (f" ({distribution_dir()} offers {', '.join(offered)}). Name one of those, or"
               if offered else f" ({distribution_dir()} holds none: 'scripts/dcache-dist.sh' "
               f"fills it where the shared dcache folder exists). Or")
            + " give the path of a dcache-VERSION.tar.gz (the distribution tarball as "
              "dcache.org publishes it).")

    @classmethod
    def check_installed(cls) -> None:
        """java 17-21 and PostgreSQL, and a distribution to start."""
        release = _java_release()
        if not 17 <= release <= 21:
            raise EndpointError(
                "the embedded dcache needs java 17 to 21 ("
                + (f"java {release} is on PATH" if release else "none is on PATH")
                + f"). Install it: 'sudo apt-get install {PACKAGES[0]}' (or run 'make setup' "
                  "in the pytest-storagescale checkout).")
        check_postgres("the embedded dcache")

    def _choose_tarball(self) -> Path:
        requested = self.requested_version
        releases = cached_releases()
        if requested and requested in releases:
            return releases[requested]
        if requested:
            return Path(requested)
        if not releases:
            raise StorageScaleUsageError(no_distribution_text())
        return list(releases.values())[-1]

    # -- where -----------------------------------------------------------------------
    @property
    def ca_dir(self) -> str:
        return str(self.directory / "grid-security" / "certificates") if self.directory else ""

    def url_for(self, scheme: str) -> str:
        if scheme in ("davs", "https"):
            credentials = f"{USER}:{self.password}@" if self.login == "unix" else ""
            return f"{scheme}://{credentials}{self.door_host}:{self.ports['webdav']}{AREA}"
        if scheme in ("root", "roots"):
            door = "xrootd_gsi" if self.login == "gsi" else "xrootd"
            return f"root://{self.door_host}:{self.ports[door]}/{AREA}"
        if scheme == "srm":
            return f"srm://{self.door_host}:{self.ports['srm']}{AREA}"
        if scheme == "dcap" and "dcap" in self.extra_doors:
            return f"gsidcap://{self.door_host}:{self.ports['dcap']}{AREA}"
        if scheme == "gsiftp" and "gsiftp" in self.extra_doors:
            return f"gsiftp://{self.door_host}:{self.ports['ftp']}{AREA}"
        raise EndpointError(f"the embedded dcache serves "
                            f"{', '.join((*BASE_DOORS, *self.extra_doors))}, "
                            f"not {scheme}://")

    @property
    def url(self) -> str:
        return self.url_for(self.schemes[0])

    def driver_options(self) -> dict[str, str]:
        """The CA folder and the session user's proxy: the SRM door knows only X.509
        (with the ``unix`` login the WebDAV door gets the password in the URL and
        maps the certificate to the same user; the xrootd door is anonymous); with
        ``gsi`` the xrootd client is told to use GSI."""
        options = super().driver_options()
        if self.proxy is not None:
            options["x509_proxy"] = str(self.proxy)
        if self.login == "gsi":
            options["security_protocol"] = LOGIN_PROTOCOLS["gsi"]
        return options

    def describe(self) -> str:
        database = self.database.version if self.database is not None else ""
        doors = ["WebDAV", "xrootd", "SRM", *(
            {"dcap": "dcap", "gsiftp": "GridFTP"}[door] for door in self.extra_doors)]
        return (f"embedded dCache {self.version} ({self.login} login: "
                f"{', '.join(doors[:-1])} and {doors[-1]} doors, chimera in PostgreSQL "
                f"{database}"
                + (f"; {self.tape.describe()} behind both pools" if self.tape else "") + ")")

    @property
    def prometheus_url(self) -> str:
        """The JVM's Prometheus JMX exporter (``http://127.0.0.1:<port>/metrics``, basic
        authentication: :data:`PROMETHEUS_USER` and the run's password), "" when the
        release ships none (10.2.25: no ``jmx_prometheus_javaagent`` jar, no option)."""
        if self.home is None or not self._prometheus_jar():
            return ""
        return f"http://127.0.0.1:{self.ports['prometheus']}/metrics"

    def _prometheus_jar(self) -> Path | None:
        assert self.home is not None
        return next(iter(sorted((self.home / "share" / "classes").glob(
            "jmx_prometheus_javaagent-*.jar"))), None)

    def _prometheus_lines(self) -> list[str]:
        """``dcache.conf`` lines enabling the release's Prometheus JMX exporter on
        loopback, with the release's own rules and ours after them (the SRM door's
        requests by type, :data:`~..load.dcache_exporter.SRM_RULES`) and basic
        authentication (the run's password as a salted SHA-256: the file holds no
        secret; another local user reads no counter), when the release ships the agent."""
        import hashlib
        import secrets

        from ..load.dcache_exporter import with_rules

        assert self.home is not None and self.directory is not None
        shipped = self.home / "etc" / "prometheus_exporter_config.yaml"
        if not self._prometheus_jar() or not shipped.is_file():
            return []
        # the agent compares the digest as Java's BigInteger.toString(16) spells it,
        # without leading zeros (jmx_exporter's MessageDigestAuthenticator): a digest
        # beginning with 0 (1 start in 16) refused the right password (CI, 2026-11-29).
        # A salt whose digest begins otherwise reads the same in either spelling
        while True:
            salt = secrets.token_hex(16)
            digest = hashlib.sha256(f"{salt}:{self.password}".encode()).hexdigest()
            if not digest.startswith("0"):
                break
        config = self.directory / "prometheus-exporter.yaml"
        config.write_text("httpServer:\n  authentication:\n    basic:\n"
                          f"      username: {PROMETHEUS_USER}\n"
                          f"      passwordHash: {digest}\n      algorithm: SHA-256\n"
                          f"      salt: {salt}\n" + with_rules(shipped.read_text()))
        config.chmod(0o600)
        return ["dcache.enable.prometheus.exporter=true",
                f"dcache.enable.prometheus.exporter.endpoint=127.0.0.1:{self.ports['prometheus']}",
                f"dcache.enable.prometheus.exporter.config={config}"]

    @property
    def billing_directory(self) -> Path | None:
        """Where the billing service writes its records (``dcache.paths.billing``)."""
        return self.home / "var" / "billing" if self.home is not None else None

    @property
    def log_path(self) -> Path:
        assert self.home is not None
        return self.home / "var" / "log" / f"{DOMAIN}.log"

    def server_processes(self) -> list[ServerProcess]:
        watched = [self.watched] if self.watched is not None else []
        if self.zookeeper_watched is not None:
            watched.append(self.zookeeper_watched)
        if self.database is not None and self.database.watched is not None:
            watched.append(self.database.watched)
        return watched

    def rss_bytes(self) -> int:
        """Resident memory of the JVM (the JVM alone: :meth:`database_rss_bytes`)."""
        import psutil

        try:
            return psutil.Process(self.process.pid).memory_info().rss if self.process else 0
        except psutil.Error:
            return 0

    def zookeeper_rss_bytes(self) -> int:
        """Resident memory of ZooKeeper's JVM."""
        import psutil

        try:
            return psutil.Process(self.zookeeper.pid).memory_info().rss if self.zookeeper else 0
        except psutil.Error:
            return 0

    def database_rss_bytes(self) -> int:
        return self.database.rss_bytes() if self.database is not None else 0

    # -- start -------------------------------------------------------------------------
    def start(self) -> EmbeddedDCache:
        began = time.monotonic()
        self.tarball = self._choose_tarball()
        self.directory = server_directory(self.kind)
        try:
            self.directory.chmod(0o711)  # the database's user goes through to its folder
            self._prepare()
            self.setup_seconds = time.monotonic() - began
            self._launch()
            error = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        if error:
            tail = log_tail(self.log_path, 25) if self.home else "(no log)"
            self.stop()
            raise EndpointError(f"the embedded dCache did not start: {error}. "
                                f"{start_timeout_hint(error)}Log tail "
                                f"({DOMAIN}.log):\n{tail}")
        self.start_seconds = time.monotonic() - began
        self._bridge_hold()
        return self

    def _bridge_hold(self) -> None:
        """dCache holds each pool's flush timer for 5 minutes after its start (the
        first flush after a start waited 206-293 s): the tape's :class:`HoldBridge`
        asks the pools to flush every trigger interval until the hold ends."""
        if (self.tape is not None and self.directory is not None
                and self.tape.flush_after_s <= tape_config.BRIDGE_MAX_AFTER_S):
            self.hold_bridge = tape_config.HoldBridge(
                self.tape_control, self.tape.flush_after_s).start()

    def _prepare(self) -> None:
        """Unpack, credentials, database, configuration, pools, schema, test area."""
        assert self.directory is not None and self.tarball is not None
        d = self.directory
        self.home = self._unpack(self.tarball, d / "dist")
        self._make_credentials()
        self._start_oidc_issuer()
        self._take_state()
        self.database = PostgresCluster(d / "postgres").start()
        if self.state_kept:
            self.database.rotate_password("dcache")
        else:
            self.database.create_databases("dcache", self._databases())
        before = self._changesets()
        # one block below the ephemeral ports: a port picked free among those can be
        # a client connection's before the JVM binds it (thousands of connections
        # come and go on a loaded machine)
        size = len(PORT_NAMES) + WAN_PORTS + LAN_PORTS
        base = free_port_block(size)
        HELD_BLOCKS[base] = size  # a second dCache of this process picks around it
        self.port_block = base
        self.ports = {name: base + index for index, name in enumerate(PORT_NAMES)}
        self.ports["wan"] = base + len(PORT_NAMES)
        self.ports["lan"] = self.ports["wan"] + WAN_PORTS
        self._write_configuration()
        self._dcache("database", "update")  # on a kept state: the release's migration
        after = self._changesets()
        self.changesets = {name: (before.get(name, 0), after.get(name, 0)) for name in after}
        if not self.state_kept:
            self._dcache_chimera()
        # both tools had the database password on their command lines (dCache's
        # database.sh and bin/chimera pass it to java as an argument, which ps shows
        # every local user): the domain gets a new one, the old one's sessions end
        self.database.rotate_password("dcache")
        self._set_database_password(self.database.password)

    def _take_state(self) -> None:
        """A kept state's ``postgres/`` and ``pools/`` moved into the server's directory
        (where the orphan reaper finds what runs on them); a state folder without them
        is a new one, filled by stop()."""
        if self.state_directory is None:
            return
        assert self.directory is not None
        state = self.state_directory
        if not state.is_dir():
            raise EndpointError(f"the embedded dCache's state folder {state} does not "
                                f"exist: create it (empty for a new state).")
        held = [name for name in STATE if (state / name).exists()]
        if held and len(held) != len(STATE):
            raise EndpointError(
                f"the embedded dCache's state folder {state} holds {held[0]}/ but not "
                f"{[name for name in STATE if name not in held][0]}/: a state is both (the "
                f"database and the pools that one dCache wrote). Give the whole state, or an "
                f"empty folder for a new one.")
        for name in held:
            try:
                (state / name).rename(self.directory / name)
            except OSError as exc:
                self._give_state_back()
                raise EndpointError(
                    f"the embedded dCache's state {state / name} could not be moved into the "
                    f"server's folder {self.directory} ({exc.strerror}): the state folder "
                    f"must be on the same file system as {self.directory.parent}.") from None
            self._state_taken = True
        self.state_kept = bool(held)

    def _give_state_back(self) -> None:
        """``postgres/`` and ``pools/`` back into the state folder (by stop(), once
        nothing runs on them): a kept state always, a new one once its dCache started."""
        if self.state_directory is None or self.directory is None or not (
                self._state_taken or self.start_seconds):
            return
        for name in STATE:
            if (self.directory / name).exists() and not (self.state_directory / name).exists():
                (self.directory / name).rename(self.state_directory / name)
        self._state_taken = False

    def _databases(self) -> tuple[str, ...]:
        """The databases of this server's services (the tape's bulk service has one)."""
        return (*DATABASES, *((tape_config.DATABASE,) if self.tape is not None else ()))

    @property
    def tape_access(self) -> tape_config.TapeAccess:
        """How to reach the running tape (picklable: a load step's context)."""
        if self.tape is None or self.directory is None:
            raise EndpointError("this embedded dCache has no tape (EmbeddedDCache(tape=...))")
        return tape_config.TapeAccess.of(self, AREA, USER)

    @property
    def tape_control(self) -> tape_config.TapeControl:
        """The running tape's controls (locality, eviction, the stage interfaces)."""
        return self.tape_access.control()

    def _changesets(self) -> dict[str, int]:
        """Per database, the Liquibase change sets it records (0: no table yet)."""
        assert self.database is not None
        counts = {}
        for name in DATABASES:
            table = self.database.sql(
                "SELECT to_regclass('public.databasechangelog') IS NOT NULL;", database=name)
            counts[name] = int(self.database.sql(
                "SELECT count(*) FROM public.databasechangelog;", database=name).strip()
                ) if table.strip() == "t" else 0
        return counts

    def _unpack(self, tarball: Path, target: Path) -> Path:
        target.mkdir(mode=0o700)  # the release's var/config/cache holds the db password
        refused = unpack_release(tarball, target)  # no member written outside target
        if refused:  # nothing of it is used, nor left behind: no link out stays
            shutil.rmtree(target, ignore_errors=True)
        if refused.startswith("member "):
            raise EndpointError(
                f"the dCache distribution {tarball} was not unpacked: its {refused}, which "
                f"could write outside the run's folder or fill its disk (no dCache release "
                f"holds one). Give "
                f"dCache's own tarball with --storage-embedded-version PATH.")
        tops = [] if refused else [entry for entry in target.iterdir() if entry.is_dir()]
        if refused or len(tops) != 1 or not (tops[0] / "bin" / "dcache").exists():
            raise EndpointError(
                f"the dCache distribution {tarball} could not be unpacked as a dCache release "
                f"({refused[-300:] or 'no bin/dcache in it'}): it is broken or "
                f"partial. Delete it and run 'scripts/dcache-dist.sh' again, or give another "
                f"tarball with --storage-embedded-version PATH.")
        home = tops[0]
        services = home / "share" / "lib" / "services.sh"  # the packages make this link
        if not services.exists():
            services.symlink_to("services-daemon.sh")
        return home

    def _make_credentials(self) -> None:
        """Throwaway CA, host certificate, the user's certificate and proxy, in the
        grid-security folder dCache reads (``dcache.paths.grid-security``)."""
        from .credentials import ThrowawayCA

        assert self.directory is not None
        grid = self.directory / "grid-security"
        grid.mkdir()
        self.authority = ThrowawayCA(grid)
        (grid / "ca").rename(grid / "certificates")
        self.host_certificate = self.authority.issue_host(grid / "hostcert.pem",
                                                          grid / "hostkey.pem")
        (grid / "vomsdir").mkdir()  # the xrootd door refuses to start without it
        client = self.directory / "client"
        client.mkdir(mode=0o700)
        self.user_certificate = self.authority.issue_user(client / "usercert.pem",
                                                          client / "userkey.pem")
        self.proxy = self.authority.make_proxy(self.user_certificate, client / "x509up")
        (grid / "storage-authzdb").write_text(
            f"version 2.1\nauthorize {USER} read-write {UID} {GID} / / /\n")
        self.password = secrets.token_urlsafe(12)
        # never printed from now on (a start-up error's log tail, a door's echo), in
        # any spelling: as written, URL-escaped, and as HTTP basic sends it
        register_url(f"https://{USER}:{self.password}@localhost/")

    @property
    def oidc_access(self) -> IssuerAccess | None:
        """How to mint the trusted issuer's tokens (picklable); None without one."""
        return self.oidc_issuer.access if self.oidc_issuer is not None else None

    def _start_oidc_issuer(self) -> None:
        """The outside token issuer (``<run>/oidc``), with the tape unless told: its
        HTTPS server on loopback and the Java trust store of the session's CA (gPlazma's
        ``oidc`` plugin fetches the issuer's documents with the JVM's own trust)."""
        wanted = self.oidc_issuer_wanted
        if not (self.tape is not None if wanted is None else wanted):
            return
        assert self.directory is not None and self.authority is not None
        self.oidc_issuer = OidcIssuer(self.directory / "oidc", self.authority).start()
        self.oidc_issuer.java_trust_store()

    def _oidc_lines(self) -> list[str]:
        """``dcache.conf`` lines trusting the issuer: the provider with the WLCG profile,
        its scopes' paths under the test area, the audience it mints for."""
        if self.oidc_issuer is None:
            return []
        return [f"gplazma.oidc.provider!{OIDC_PROVIDER}={self.oidc_issuer.url} "
                f"-profile=wlcg -prefix={AREA}",
                f"gplazma.oidc.audience-targets={self.oidc_issuer.audience}"]

    def _write_configuration(self) -> None:
        assert self.home is not None and self.directory is not None
        assert self.database is not None and self.user_certificate is not None
        d, etc, p = self.directory, self.home / "etc", self.ports
        wan, lan = p["wan"], p["lan"]
        conf = etc / "dcache.conf"  # the database's password: for this user only
        conf.touch(mode=0o600)
        conf.chmod(0o600)
        tmp = d / "tmp"  # the JVM's java.io.tmpdir (the SRM door's Jetty folder): the run's
        tmp.mkdir(mode=0o700)
        jaas = self._write_zookeeper_login()
        # the JVM's own trust (gPlazma's oidc plugin fetching the issuer's documents):
        # the session's CA only
        trust = (f" -Djavax.net.ssl.trustStore={self.oidc_issuer.trust_store}"
                 f" -Djavax.net.ssl.trustStoreType=JKS"
                 if self.oidc_issuer is not None and self.oidc_issuer.trust_store else "")
        conf.write_text("\n".join([
            f"dcache.layout={LAYOUT}",
            f"dcache.paths.grid-security={d / 'grid-security'}",
            "dcache.broker.scheme=none",
            "dcache.enable.space-reservation=false",
            f"dcache.java.memory.heap={HEAP}",
            f"dcache.java.memory.direct={DIRECT_MEMORY}",
            # no compiled copy of the configuration (var/config/cache held the
            # database password 19 times, 0644): each tool compiles it afresh
            "dcache.config.cache=false",
            # the domain's ZooKeeper client logs in (a later -D wins over dCache's
            # own -Dzookeeper.sasl.client=false); the JVM's temporary files are the run's
            f"dcache.java.options.extra=-Djava.io.tmpdir={tmp} -Dzookeeper.sasl.client=true"
            f"{trust}",
            f"dcache.authn.jaas.config={jaas}",
            "dcache.net.listen=127.0.0.1",
            f"dcache.net.wan.port.min={wan}",
            f"dcache.net.wan.port.max={wan + WAN_PORTS - 1}",
            f"dcache.net.lan.port.min={lan}",
            f"dcache.net.lan.port.max={lan + LAN_PORTS - 1}",
            f"dcache.zookeeper.connection={self.zookeeper_listen}:{p['zookeeper']}",
            f"dcache.db.host=127.0.0.1:{self.database.port}",
            f"dcache.db.password={self.database.password}",  # the file: 0600 below
            "dcache.default-access-latency=ONLINE",
            "dcache.default-retention-policy=REPLICA",
            # the throwaway CA publishes a CRL; IF_VALID still takes a certificate
            # when a CRL is out of date (the trial found REQUIRE refusing clients)
            "dcache.authn.crl-mode=IF_VALID",
            # billing's records as JSON lines (load/dcache_billing.py reads them: the
            # transfers dCache counted beside the clients' counts)
            "billing.format.json=true",
            *(tape_config.conf_lines() if self.tape is not None else ()),
            *self._prometheus_lines(),
            *self._oidc_lines(),
            "",
        ]))
        layout = [
            f"[{DOMAIN}]",
            *(f"[{DOMAIN}/{service}]" for service in (
                "pnfsmanager", "cleaner-disk", "poolmanager", "billing", "gplazma",
                "pinmanager")),
            f"[{DOMAIN}/srmmanager]", "srmmanager.net.host=localhost",
            f"[{DOMAIN}/transfermanagers]",
            f"[{DOMAIN}/srm]", "srm.loginbroker.address=localhost",
            f"srm.net.port={p['srm']}", f"srm.net.ssl-port={p['srm_tls']}",
            f"[{DOMAIN}/webdav]", f"webdav.net.port={p['webdav']}",
            "webdav.authn.protocol=https", "webdav.authn.basic=true",
            f"[{DOMAIN}/xrootd]", f"xrootd.net.port={p['xrootd']}",
            "xrootd.plugins=gplazma:none",
            "xrootd.authz.anonymous-operations=FULL",
            f"xrootd.authz.user={UID}:{GID}",
            f"xrootd.authz.write-paths={AREA}",
            *([f"[{DOMAIN}/xrootd]", "xrootd.cell.name=xrootd-gsi",
               f"xrootd.net.port={p['xrootd_gsi']}", "xrootd.plugins=gplazma:gsi",
               f"xrootd.authz.write-paths={AREA}"] if self.gsi_xrootd else []),
            # dcap with GSI (gsidcap): the user's proxy, mapped to the test user as on
            # WebDAV (a plain door's anonymous user is nobody: see DCAP_LOGIN)
            *([f"[{DOMAIN}/dcap]", "dcap.authn.protocol=gsi", f"dcap.net.port={p['dcap']}"]
              if "dcap" in self.extra_doors else []),
            # GridFTP with GSI: the user's certificate or proxy, mapped as on WebDAV
            *([f"[{DOMAIN}/ftp]", "ftp.authn.protocol=gsi", f"ftp.net.port={p['ftp']}"]
              if "gsiftp" in self.extra_doors else []),
        ]
        for name in ("pool1", "pool2"):
            pool = d / "pools" / name
            (pool / "data").mkdir(parents=True, exist_ok=self.state_kept)
            layout += [f"[{DOMAIN}/pool]", f"pool.name={name}", f"pool.path={pool}",
                       "pool.wait-for-files=${pool.path}/data"]
        if self.tape is not None:  # the HSM script on both pools, the tape's services
            self._write_tape(layout)
        (etc / "layouts" / f"{LAYOUT}.conf").write_text("\n".join(layout) + "\n")
        (etc / "gplazma.conf").write_text(
            "auth    optional    x509\n"
            "auth    optional    htpasswd\n"
            + ("auth    optional    oidc\n" if self.oidc_issuer is not None else "")
            + "map     optional    multimap\n"
            "map     requisite   authzdb\n"
            "session requisite   authzdb\n")
        # the issuer's subject is the test user (a token of another subject maps to no
        # one: authzdb refuses it)
        (etc / "multi-mapfile").write_text(
            f'dn:"{self.user_certificate.subject}" username:{USER}\n'
            + (f"oidc:{OIDC_SUBJECT}@{OIDC_PROVIDER} username:{USER}\n"
               if self.oidc_issuer is not None else ""))
        write_private(etc / "htpasswd", f"{USER}:{apr1_hash(self.password)}\n")
        (d / "run-domain.sh").write_text(_RUN_DOMAIN)

    def _write_tape(self, layout: list[str]) -> None:
        """The tape library's folder, each pool's ``setup`` (the HSM, the tape class's
        flush queue), PoolManager's setup (staging allowed), the services' sections."""
        assert self.tape is not None and self.directory is not None and self.home is not None
        folder = self.directory / "tape"
        tape_config.prepare(folder)
        pools = ("pool1", "pool2")
        for name in pools:
            (self.directory / "pools" / name / "setup").write_text(
                tape_config.pool_setup(self.tape, folder, "storagescale"))
        config = self.home / "var" / "config"
        config.mkdir(parents=True, exist_ok=True)
        (config / "poolmanager.conf").write_text(tape_config.poolmanager_conf(pools))
        layout += tape_config.layout_lines(DOMAIN, self.ports, folder)

    def _write_zookeeper_login(self) -> Path:
        """The JAAS file (0600) of the embedded ZooKeeper's one SASL user, read by its
        server side and by the domain's client: no session without it (any local user
        reaches the loopback port)."""
        assert self.directory is not None
        secret = secrets.token_urlsafe(18)  # letters, digits, - and _: no quoting
        register_secret(secret)
        self.zookeeper_password = secret
        return write_private(self.directory / "zookeeper.jaas", (
            "Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
            f'  user_{ZOOKEEPER_USER}="{secret}";\n}};\n'
            "Client {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
            f'  username="{ZOOKEEPER_USER}"\n  password="{secret}";\n}};\n'))

    def _dcache(self, *arguments: str, stdin: str | None = None, timeout: float = 300) -> str:
        """``bin/dcache`` (or another of the release's commands) with the session's
        java; an EndpointError with its output when it fails."""
        assert self.home is not None
        command = arguments if arguments[0].startswith("bin/") else ("bin/dcache", *arguments)
        try:
            done = subprocess.run([str(self.home / command[0]), *command[1:]], input=stdin,
                                  capture_output=True, text=True, timeout=timeout,
                                  cwd=self.home, env=self._environment(), umask=0o077)
        except subprocess.TimeoutExpired as exc:  # killed by run(); its output so far
            said = b"".join(part if isinstance(part, bytes) else (part or "").encode()
                            for part in (exc.stderr, exc.output)).decode(errors="replace")
            raise EndpointError(
                f"the embedded dCache's set-up: '{' '.join(command)}' did not end within "
                f"{timeout:g} s and was stopped (a JVM tool; seen under a load average "
                f"above 40 on 2 cores): run it on a less busy machine; its output so far: "
                f"{said.strip()[-800:] or '(none)'}") from None
        if done.returncode != 0:
            raise EndpointError(
                f"the embedded dCache's set-up: '{' '.join(command)}' failed "
                f"({done.returncode}): {(done.stderr + done.stdout).strip()[-800:]}")
        return done.stdout

    def _set_database_password(self, password: str) -> None:
        assert self.home is not None
        conf = self.home / "etc" / "dcache.conf"  # 0600, written by this run
        lines = [f"dcache.db.password={password}" if line.startswith("dcache.db.password=")
                 else line for line in conf.read_text().splitlines()]
        conf.write_text("\n".join(lines) + "\n")

    def _dcache_chimera(self) -> None:
        """The test area, owned by the test user, writable by every door's user, with
        the tags that route its files to the pools."""
        self._dcache("bin/chimera", "-e", "-", stdin="\n".join([
            f"mkdir {AREA}",
            f"chown {UID}:{GID} {AREA}",
            f"chmod 777 {AREA}",
            f'writetag {AREA} sGroup "default"',
            f'writetag {AREA} OSMTemplate "StoreName storagescale"',
            *(tape_config.chimera_lines(AREA, UID, GID) if self.tape is not None else ()),
            "",
        ]))

    def _environment(self) -> dict[str, str]:
        assert self.home is not None
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(("X509_", "DCACHE_"))}
        from .loopback import preloaded  # the pools' movers bind *: loopback.c binds 127.0.0.1

        # a UTF-8 locale, as a site's: under C the JVM's path encoding is ASCII, and the
        # WebDAV door answered a PUT of a UTF-8 name with 500 "Malformed input or input
        # contains unmappable characters" (10.2.25: the in-place upgrade's tree)
        return preloaded({**environment, "DCACHE_HOME": str(self.home), "LC_ALL": "C.UTF-8"})

    def _start_zookeeper(self) -> None:
        """ZooKeeper in a JVM of its own, from the release's jar, requiring a SASL login
        of every session (the JAAS file's ``Server`` section). dCache's embedded
        ZooKeeper service cannot: its ``ZooKeeperCell`` overrides ``configureSaslLogin``
        with nothing ("Use a non-embedded ZooKeeper if you want security", read at the
        11.2 source), and its nodes have the open ACL, so any local user reaching its
        loopback port could create and delete nodes under /dcache. Returns once it
        answers ``ruok``."""
        assert self.directory is not None and self.home is not None
        folder = self.directory / "zookeeper"
        folder.mkdir(mode=0o700)
        (folder / "logback.xml").write_text(_ZOOKEEPER_LOGBACK)
        port = self.ports["zookeeper"]
        (folder / "zoo.cfg").write_text("\n".join([
            "tickTime=2000", f"dataDir={folder / 'data'}", f"clientPort={port}",
            f"clientPortAddress={self.zookeeper_listen}", "maxClientCnxns=100", ""]))
        java = shutil.which("java") or "java"
        log = folder / "zookeeper.log"
        with open(log, "ab") as stream:
            self.zookeeper = subprocess.Popen(
                [java, *_ZOOKEEPER_SERVER, f"-Djava.io.tmpdir={self.directory / 'tmp'}",
                 f"-Djava.security.auth.login.config={self.directory / 'zookeeper.jaas'}",
                 f"-Dlogback.configurationFile={folder / 'logback.xml'}",
                 "-cp", str(self.home / "share" / "classes" / "*"),
                 "org.apache.zookeeper.server.ZooKeeperServerMain", str(folder / "zoo.cfg")],
                cwd=folder, stdout=stream, stderr=subprocess.STDOUT, start_new_session=True,
                env=self._environment(), umask=0o077)
        self.zookeeper_watched = ServerProcess("ZooKeeper", self.zookeeper, (log,))
        wait = zookeeper_wait_s(self.startup_timeout)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                code = self.zookeeper.wait(timeout=0.5)  # the pause between probes
                raise EndpointError(f"the embedded dCache's ZooKeeper exited with code {code}. "
                                    f"Log tail:\n{log_tail(log, 20)}")
            except subprocess.TimeoutExpired:
                pass
            if _ruok(port, self.zookeeper_listen):
                return
        waited = f"within {wait:.0f} s"
        raise EndpointError(f"the embedded dCache's ZooKeeper did not answer on "
                            f"{self.zookeeper_listen}:{port} {waited}. "
                            f"{start_timeout_hint(waited)}Log tail:\n{log_tail(log, 20)}")

    def _launch(self) -> None:
        assert self.directory is not None and self.home is not None
        self._start_zookeeper()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                ["/bin/sh", str(self.directory / "run-domain.sh"), str(self.home), DOMAIN],
                cwd=self.home, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=self._environment(), umask=0o077)
        self.watched = ServerProcess("dCache domain JVM", self.process, (self.log_path,))

    # -- readiness -------------------------------------------------------------------
    def _wait_ready(self) -> str:
        """Probe every door until each answered ('' then), else why not."""
        with credential_environment_kept():
            return self._probe_doors()

    def _probe_doors(self) -> str:
        assert self.process is not None
        launched = time.monotonic()
        deadline = launched + self.startup_timeout
        probes: dict[str, Callable[[], None]] = {
            "davs": self._probe_webdav, "root": self._probe_xrootd, "srm": self._probe_srm,
            **({"root-gsi": self._probe_gsi_xrootd} if self.gsi_xrootd else {}),
            **{door: functools.partial(self._probe_extra, door) for door in self.extra_doors},
            **({"tape": self._probe_tape} if self.tape is not None else {})}
        last: dict[str, str] = dict.fromkeys(probes, "not probed yet")
        while probes and time.monotonic() < deadline:
            try:
                code = self.process.wait(timeout=0.5)  # the pause between rounds
                return f"its JVM exited with code {code}"
            except subprocess.TimeoutExpired:
                pass
            for door, probe in list(probes.items()):
                port = self.ports.get(_DOOR_PORTS.get(door, ""))
                if port and not _listening(self.door_host, port):
                    last[door] = f"nothing listens on its port {port} yet"
                    continue  # the probe (a Python process for some) once it listens
                try:
                    probe()
                except Exception as exc:  # noqa: BLE001 - keep probing until the deadline
                    last[door] = str(exc)[-300:]
                    continue
                self.door_seconds[door] = time.monotonic() - launched
                del probes[door]
        if not probes:
            return ""
        return (f"within {self.startup_timeout:.0f} s, "
                + "; ".join(f"the {door} door did not answer ({last[door]})" for door in probes))

    def _client(self, scheme: str, driver: str):
        from ..drivers.registry import driver_spec

        options = {key: value for key, value in self.driver_options().items()
                   if driver != "http" or key != "security_protocol"}
        return driver_spec(self.url_for(scheme), driver=driver, options=options,
                           writable_root=AREA).connect("probe", timeout=10)

    def _probe_webdav(self) -> None:
        """A real PUT (answered by a pool: the pools come up after the doors), read
        back, and the version from the door's ``Server:`` header."""
        client = self._client("davs", "http")
        try:
            name = f"{AREA}/.storagescale-ready-{os.getpid()}"
            data = b"storagescale readiness probe\n"
            client.put(name, data)
            if client.read(name, 0, len(data)) != data:
                raise EndpointError("the probe file read back differs")
            client.delete(name)
        finally:
            client.close()
        self.version = self._door_version()

    def _door_version(self) -> str:
        """The release in the WebDAV door's ``Server:`` header (``dCache/11.2.5``), from
        a request that logs in: an anonymous one counts as an authentication error,
        of which the 11.2 door's request limiter tolerates 3 in 20 s per client."""
        import base64
        import http.client
        import ssl

        from ..drivers.version import version_from_server_header

        context = ssl.create_default_context(capath=self.ca_dir)
        connection = http.client.HTTPSConnection(self.door_host.strip("[]"), self.ports["webdav"],
                                                 context=context, timeout=10)
        secret = base64.b64encode(f"{USER}:{self.password}".encode()).decode()
        try:
            connection.request("PROPFIND", AREA, headers={
                "Authorization": f"Basic {secret}", "Depth": "0"})
            response = connection.getresponse()
            response.read()
        finally:
            connection.close()
        header = response.getheader("Server") or ""
        version = version_from_server_header(header)
        if not version:
            raise EndpointError(f"the WebDAV door's Server header {header!r} names no version")
        return version

    def _probe_xrootd(self) -> None:
        client = self._client("root", "xrootd")
        try:
            if not client.stat(AREA).is_dir:
                raise EndpointError(f"{AREA} is not a directory")
        finally:
            client.close()

    def _probe_gsi_xrootd(self) -> None:
        """The GSI door, from a process of its own: the XRootD client takes one
        security protocol per process (``XrdSecPROTOCOL``), and the anonymous door
        offers none."""
        from .xrootd import _probe_apart

        options = {**self.driver_options(), "security_protocol": LOGIN_PROTOCOLS["gsi"]}
        error = _probe_apart(f"root://{self.door_host}:{self.ports['xrootd_gsi']}/{AREA}", options)
        if error:
            raise EndpointError(error)

    def _probe_extra(self, door: str) -> None:
        """A ``stat`` of the test area through the door, from a process of its own (a
        gfal2 context's plug-ins stay loaded in the process that made it)."""
        import json
        import sys

        try:
            done = subprocess.run(
                [sys.executable, "-c", _STAT_APART], capture_output=True, text=True,
                input=json.dumps([self.url_for(door), AREA, self.driver_options()]),
                timeout=60)
        except subprocess.TimeoutExpired:
            raise EndpointError("the probe got no answer within 60 s") from None
        if done.returncode != 0:
            raise EndpointError((done.stderr.strip().splitlines()
                                 or ["the probe process failed"])[-1])

    def _probe_tape(self) -> None:
        """The frontend lists the tape-backed directory (the pools read their HSM from
        their ``setup`` at start). The admin door, slower to come up (it was the last
        door, 295 s after the JVM's start at load 20-30, and not up within 300 s at
        load 38), is waited for by its first use (:meth:`TapeControl.admin`)."""
        control = self.tape_control
        if control.attributes(control.area).get("fileType") != "DIR":
            raise EndpointError(f"the frontend does not list {control.area} as a directory")

    def _probe_srm(self) -> None:
        client = self._client("srm", "gfal2")
        try:
            if not client.stat(AREA).is_dir:
                raise EndpointError(f"{AREA} is not a directory")
        finally:
            client.close()

    # -- stop --------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the JVM (SIGTERM: dCache's own shutdown, then SIGKILL to its group)
        and PostgreSQL, and remove the private directory (idempotent)."""
        if self.hold_bridge is not None:  # its ssh session first: the door goes next
            self.hold_bridge.stop()
            self.hold_bridge = None
        process = self.process
        if self.watched is not None:
            self.watched.stopping()
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                try:  # not reaped: the group's number is still the JVM's
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                process.wait(timeout=10)
        self.process = None
        if self.zookeeper_watched is not None:
            self.zookeeper_watched.stopping()
        if self.zookeeper is not None:
            _end(self.zookeeper)
            self.zookeeper = None
        if self.database is not None:
            self.database.stop()
            self.database = None
        if self.oidc_issuer is not None:  # after the JVM: nothing asks it any more
            self.oidc_issuer.stop()
            self.oidc_issuer = None
        self._give_state_back()
        HELD_BLOCKS.pop(self.port_block, None)
        self.port_block = 0
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


#: where the domain's ports are picked: below Linux's ephemeral ports (32768+), which
#: the clients' connections (and their TIME_WAIT) take
MOVER_PORTS = (10000, 32000)
#: the port blocks of the embedded dCaches this process runs (first port -> size):
#: their movers' ranges hold no socket until a transfer, so a free-looking block can
#: be a running dCache's; a second dCache (a paired comparison's side B beside side A,
#: ``--storage-compare-with``) is given ports outside them
HELD_BLOCKS: dict[int, int] = {}


def free_port_block(size: int, held: dict[int, int] | None = None) -> int:
    """The first of ``size`` consecutive ports that no socket holds now and no block
    of ``held`` (default :data:`HELD_BLOCKS`: this process's running dCaches) covers
    (the pools' movers take theirs from ranges; the JVM binds with SO_REUSEADDR, as
    this check does, so a connection in TIME_WAIT does not count)."""
    import socket

    low, high = MOVER_PORTS
    taken = sorted((HELD_BLOCKS if held is None else held).items())
    bases = [base for base in range(low, high - size)
             if not any(base < start + length and start < base + size
                        for start, length in taken)]
    for _ in range(min(50, len(bases))):
        base = bases[secrets.randbelow(len(bases))]
        sockets = []
        try:
            for port in range(base, base + size):
                probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(probe)
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for probe in sockets:
                probe.close()
    raise EndpointError(f"no {size} consecutive free ports on 127.0.0.1 between "
                        f"{low} and {high} for the dCache domain and its pools' movers")


def _listening(host: str, port: int) -> bool:
    """Whether ``host:port`` takes a TCP connection (a door's cell listens)."""
    import socket

    try:
        with socket.create_connection((host.strip("[]"), port), timeout=5):
            return True
    except OSError:
        return False


def _ruok(port: int, host: str = "127.0.0.1") -> bool:
    """ZooKeeper answers ``imok`` to ``ruok`` on ``port``."""
    import socket

    try:
        with socket.create_connection((host, port), timeout=5) as probe:
            probe.sendall(b"ruok")
            return probe.recv(16) == b"imok"
    except OSError:
        return False


def _end(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL to its process group (a session leader: the group is its)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def write_private(path: Path, text: str) -> Path:
    """``text`` into the new file ``path``, 0600 from its creation (a secret's file)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)
    return path


def apr1_hash(password: str) -> str:
    """The Apache ``$apr1$`` hash of ``password`` (gPlazma's htpasswd plugin reads
    it), from ``openssl passwd`` (the password through stdin, never the command line)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise EndpointError("the embedded dcache needs the openssl command: "
                            "'sudo apt-get install openssl'.")
    done = subprocess.run([openssl, "passwd", "-apr1", "-stdin"], input=password + "\n",
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0 or not done.stdout.startswith("$apr1$"):
        raise EndpointError(f"openssl passwd -apr1 failed: {done.stderr.strip()[-200:]}")
    return done.stdout.strip()
