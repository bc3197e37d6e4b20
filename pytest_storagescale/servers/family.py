"""The embedded servers as a family: real servers the session starts on loopback.

``--storage-embedded KIND`` picks one (a suite's ``conftest.py`` names the one that
fits it through the ``pytest_storagescale_embedded`` hook); without
``--storage-endpoint`` the session starts it on first use and stops it at the end.
Every member lives in a private temporary directory, listens on free loopback ports,
is probed for readiness (never slept for), runs unprivileged where the server
allows, and hands the drivers the throwaway credentials its logins need through
:meth:`EmbeddedServer.driver_options`. A missing package is one
:class:`~pytest_storagescale.errors.EndpointError` with the install command.

One registry: each server class declares its ``kind``, ``schemes`` and ``logins``, and
the lists the options check against (:func:`embedded_kinds`, :func:`embedded_protocols`,
:func:`embedded_logins`) are read from the registered classes, never kept by hand. The
built-in kinds are one line each in :data:`BUILTIN_SERVERS` (``module:Class``, imported
when the registry is first read: the modules import their heavy libraries, cryptography,
the XRootD bindings, psutil, only inside the functions that use them); a site or a
suite's ``conftest.py`` adds its own with :func:`register_server`.
"""

from __future__ import annotations

import abc
import re
import shutil
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from ..errors import EndpointError, StorageScaleUsageError
from ..registry import RegistrationError, Registry

if TYPE_CHECKING:
    from .processes import ServerProcess

#: the built-in servers, one registration line each ("module:Class"); the order is the
#: order of the kinds in help texts and error messages
BUILTIN_SERVERS = {
    "xrootd": "pytest_storagescale.servers.xrootd:EmbeddedXRootD",
    "ceph": "pytest_storagescale.servers.ceph:EmbeddedCephGateway",
    "cephfs": "pytest_storagescale.servers.cephfs:EmbeddedCephFS",
    "xcache": "pytest_storagescale.servers.xcache:EmbeddedXCache",
    "webdav": "pytest_storagescale.servers.apache:EmbeddedApacheWebDAV",
    "gridftp": "pytest_storagescale.servers.gridftp:EmbeddedGridFTP",
    "redirector": "pytest_storagescale.servers.redirector:EmbeddedXRootDCluster",
    "dcache": "pytest_storagescale.servers.dcache:EmbeddedDCache",
}
#: the kind started when neither the command line nor the suite names one
DEFAULT_KIND = "xrootd"
#: what a kind may be called: it names the server's directory (``storagescale-<kind>-*``)
KIND_PATTERN = re.compile(r"[a-z][a-z0-9_]*")


class EmbeddedServer(abc.ABC):
    """One throwaway server (or a small set of them: Ceph and its gateway) on loopback.

    Subclasses set the class attributes and implement :meth:`start`, :meth:`stop`
    and :meth:`url_for`; ``start`` returns ``self`` once the server answers."""

    #: the name ``--storage-embedded`` takes
    kind: ClassVar[str] = ""
    #: what it is, a few words for ``--help`` ("" for none)
    summary: ClassVar[str] = ""
    #: the URL schemes it serves; the first is the default protocol
    schemes: ClassVar[tuple[str, ...]] = ()
    #: the logins it can require (``--storage-embedded-login``)
    logins: ClassVar[tuple[str, ...]] = ("unix",)
    #: Debian packages it needs (named in the install hint)
    packages: ClassVar[tuple[str, ...]] = ()
    #: binaries that must be on PATH (checked before anything starts)
    binaries: ClassVar[tuple[str, ...]] = ()

    #: the server software's version, known once started (chooses the thresholds file)
    version: str = ""
    #: the release ``--storage-embedded-version`` asked for, as :meth:`check_version`
    #: gave it back (None: the kind's default); set before :meth:`start`
    requested_version: str | None = None
    #: where to send the server's summary monitoring (``host:port``, the session's
    #: :class:`~.monitor.SummaryListener`; "" none); set before :meth:`start`, used by
    #: a kind that can report (:attr:`reports_summary`)
    report_to: str = ""
    #: it sends XRootD summary monitoring (``xrd.report``) to :attr:`report_to`
    reports_summary: ClassVar[bool] = False

    @property
    def ca_dir(self) -> str:
        """The throwaway CA folder clients verify TLS against ("" when the server has none)."""
        return ""

    def __init__(self, *, login: str = "unix") -> None:
        if login not in self.logins:
            raise EndpointError(
                f"--storage-embedded-login {login}: the embedded {self.kind} offers "
                f"{', '.join(self.logins)} logins. Pick one of those, or another server with "
                f"--storage-embedded."
            )
        self.login = login

    # -- what every member offers ----------------------------------------------------
    @classmethod
    def installed_version(cls) -> str:
        """The installed server's version without starting it ("" when only a running
        server can tell: the session then starts it to read :attr:`version`)."""
        return ""

    @classmethod
    def release_version(cls, requested: str) -> str:
        """The version a server of the release ``requested`` (a
        ``--storage-embedded-version`` value) will say, without starting it ("" when
        only a running server can tell)."""
        return ""

    @classmethod
    def check_installed(cls) -> None:
        """Raise one paragraph with the install command when a binary is missing."""
        missing = [name for name in cls.binaries if shutil.which(name) is None]
        if missing:
            raise EndpointError(
                f"the embedded {cls.kind} endpoint needs {', '.join(missing)}, not found on "
                f"PATH. Install it: 'sudo apt-get install {' '.join(cls.packages)}' (or run "
                f"'make setup' in the pytest-storagescale checkout); or point the suite at "
                f"a running server with --storage-endpoint URL."
            )

    @classmethod
    def available_versions(cls) -> tuple[str, ...]:
        """The releases ``--storage-embedded-version`` may name (empty: only the
        installed one, nothing to choose)."""
        return ()

    @classmethod
    def check_version(cls, requested: str) -> str:
        """``requested`` (a ``--storage-embedded-version`` value) as the server will use
        it; a usage error naming the releases it offers when it offers none such."""
        offered = cls.available_versions()
        if requested in offered:
            return requested
        raise StorageScaleUsageError(
            f"--storage-embedded-version {requested}: the embedded {cls.kind} "
            + (f"offers {', '.join(offered)}. Pick one of those, or leave the option out."
               if offered else
               "runs only the installed release. Leave the option out, or pick a server "
               "kind that has releases to choose from with --storage-embedded."))

    @abc.abstractmethod
    def start(self) -> EmbeddedServer:
        """Start and probe until it answers; :class:`EndpointError` when it does not."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every process and remove the private directory (idempotent)."""

    @abc.abstractmethod
    def url_for(self, scheme: str) -> str:
        """The test area's URL over ``scheme`` (one of :attr:`schemes`)."""

    def server_processes(self) -> list[ServerProcess]:
        """Its daemons, each watched for its end (:class:`~.processes.ServerProcess`);
        those it stopped on purpose are not listed or say nothing."""
        return []

    def server_pids(self) -> list[int]:
        """The pids of its running daemons (what they fork counts with them): the
        processes a step samples for the server's CPU, threads and connections."""
        return [process.pid for process in self.server_processes()
                if process.exit_status() is None]

    def exit_note(self) -> str:
        """Why the server is gone when one of its daemons died during the run: which,
        when, its exit status or signal, whether an orphan cleaner stopped it, and the
        last lines of its logs ("" while all run); asked just before the session
        stops it."""
        dead = [process for process in self.server_processes() if process.death()]
        if not dead:
            return ""
        from ..redact import redact_text
        from .orphans import stopped_by

        cleaner = stopped_by(getattr(self, "directory", None))
        return (f"the embedded {self.kind} lost a daemon during the run: "
                f"{'; '.join(process.death() for process in dead)}; every storage call it "
                f"served after that failed."
                + (f" {cleaner}" if cleaner else "")
                + " The last lines of its logs:\n"
                + redact_text("\n".join(process.log_tails() for process in dead)))

    def driver_options(self) -> dict[str, str]:
        """The driver options a client needs: CA folder, proxy, token, ccache...
        (values may be secrets: they are never printed)."""
        return {"ca_dir": self.ca_dir} if self.ca_dir else {}

    def describe(self) -> str:
        """One line for the pytest header."""
        return f"embedded {self.kind} ({self.login} login)"

    def __enter__(self) -> Self:
        return started(self)

    def __exit__(self, *exc_info) -> None:
        self.stop()


_Server = TypeVar("_Server", bound=EmbeddedServer)


def _check_server(cls: object) -> None:
    if not (isinstance(cls, type) and issubclass(cls, EmbeddedServer)):
        raise RegistrationError(
            f"register_server({cls!r}): not an EmbeddedServer subclass. Derive the server "
            f"class from pytest_storagescale.servers.family.EmbeddedServer.")
    if not KIND_PATTERN.fullmatch(cls.kind) or not cls.schemes or not cls.logins:
        raise RegistrationError(
            f"register_server({cls.__module__}.{cls.__qualname__}): kind {cls.kind!r}, "
            f"schemes {cls.schemes!r}, logins {cls.logins!r}. Set kind (lower-case letters, "
            f"digits, _), the URL schemes it serves (the first is the default) and its "
            f"logins (e.g. ('unix',)) on the class.")


#: kind -> its server class, in registration order, the built-ins first
#: (pytest_storagescale/registry.py)
SERVERS: Registry[type[EmbeddedServer]] = Registry(
    "server kind", adder="register_server", pattern=KIND_PATTERN.pattern, name_attr="kind",
    name_hint="Set kind on the class (lower-case letters, digits, _).", check=_check_server)
for _kind, _target in BUILTIN_SERVERS.items():
    SERVERS.add_lazy(_kind, _target, install_hint="a complete installation of "
                     "pytest-storagescale (reinstall it)")


def register_server(cls: type[_Server]) -> type[_Server]:
    """Add a server kind: ``cls`` (an :class:`EmbeddedServer` subclass) declares its
    ``kind``, ``schemes`` and ``logins``; ``--storage-embedded <kind>`` starts it. Call it
    from a plugin or a suite's ``conftest.py`` (also usable as a class decorator).
    Registering the same class again (or its module imported again, as a conftest of
    an in-process pytester run) replaces it; another class under a kind already taken
    is a usage error."""
    SERVERS.add(cls)
    return cls


def embedded_servers() -> dict[str, type[EmbeddedServer]]:
    """Every registered kind and its class, the built-ins first (imported now)."""
    return {kind: SERVERS.get(kind) for kind in SERVERS.names()}


def embedded_kinds() -> tuple[str, ...]:
    """The names ``--storage-embedded`` takes."""
    return tuple(embedded_servers())


def embedded_protocols() -> tuple[str, ...]:
    """Every scheme some registered server serves (``--storage-embedded-protocol``)."""
    return _union(cls.schemes for cls in embedded_servers().values())


def embedded_logins() -> tuple[str, ...]:
    """Every login some registered server offers (``--storage-embedded-login``)."""
    return _union(cls.logins for cls in embedded_servers().values())


def embedded_help() -> str:
    """The registered kinds for ``--help``: ``xrootd (default), ceph (...), ...``."""
    return ", ".join(
        kind + (" (default)" if kind == DEFAULT_KIND else f" ({cls.summary})" if cls.summary
                else "")
        for kind, cls in embedded_servers().items())


def _union(groups) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for group in groups for name in group))


def embedded_class(kind: str) -> type[EmbeddedServer]:
    """The server class of ``kind``."""
    try:
        return embedded_servers()[kind]
    except KeyError:
        raise StorageScaleUsageError(
            f"--storage-embedded: unknown server {kind!r}. Valid values: "
            f"{', '.join(embedded_kinds())}."
        ) from None


def check_embedded_choice(kind: str, protocol: str | None, login: str) -> str:
    """The protocol to use on ``kind`` (its default when ``protocol`` is None); a usage
    error naming the valid values for a protocol or login it does not offer."""
    cls = embedded_class(kind)
    if protocol is not None and protocol not in cls.schemes:
        raise StorageScaleUsageError(
            f"--storage-embedded-protocol {protocol}: the embedded {kind} serves "
            f"{', '.join(cls.schemes)}. Pick one of those, or another server with "
            f"--storage-embedded."
        )
    if login not in cls.logins:
        offering = [other for other, server in embedded_servers().items()
                    if login in server.logins]
        raise StorageScaleUsageError(
            f"--storage-embedded-login {login}: the embedded {kind} offers "
            f"{', '.join(cls.logins)} logins. Pick one of those"
            + (f", or use --storage-embedded {' or '.join(offering)} (which offer {login})."
               if offering else ".")
        )
    return protocol or cls.schemes[0]


#: the option that gives an embedded server's start more time (``startup_timeout``)
START_TIMEOUT_OPTION = "--storage-embedded-start-timeout"


def start_timeout_hint(error: str) -> str:
    """What a start that ran out of time (``error`` begins ``within N s``) says of
    :data:`START_TIMEOUT_OPTION`; '' for another failure."""
    if not error.startswith("within"):
        return ""
    return (f"On a loaded machine give the start longer with {START_TIMEOUT_OPTION} "
            f"(ini storage_embedded_start_timeout), e.g. 15m. ")


def start_embedded(kind: str, login: str, version: str | None = None, *,
                   report_to: str = "", server_class: type[EmbeddedServer] | None = None,
                   options: dict[str, Any] | None = None) -> EmbeddedServer:
    """Check the installation, then start a ``kind`` server requiring ``login`` (of the
    release ``version`` when given, see :meth:`EmbeddedServer.check_version`; reporting
    its summary monitoring to ``report_to`` when it can). ``server_class`` (a subclass
    of the kind's, e.g. the dCache over several hosts) and ``options`` (its keyword
    arguments) when the run asked for one."""
    cls = server_class or embedded_class(kind)
    chosen = cls.check_version(version) if version else None
    cls.check_installed()
    try:
        server = cls(login=login, **(options or {}))
        server.requested_version = chosen
        server.report_to = report_to
        return started(server)
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.startswith("pytest_storagescale"):
            raise
        from ..drivers.registry import extra_hint

        raise StorageScaleUsageError(
            f"the embedded {kind} server needs {exc.name}, which is not installed in "
            f"this environment: install it with {extra_hint('servers')}, or point the "
            f"tests at a running server with --storage-endpoint URL."
        ) from None


def started(server: _Server) -> _Server:
    """``server.start()``, leaving the process's credential variables as they were: the
    readiness probe's driver sets them for the whole process, and the session's own
    drivers set what they need when they are made."""
    from ..drivers.grid import credential_environment_kept

    with credential_environment_kept():
        return server.start()  # type: ignore[return-value]  # start() gives the server
