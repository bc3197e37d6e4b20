"""The embedded endpoints as a family: real servers the session starts on loopback.

``--storage-embedded KIND`` picks one (a suite's ``conftest.py`` names the one that
fits it through the ``pytest_storagescale_embedded`` hook); without
``--storage-endpoint`` the session starts it on first use and stops it at the end.
Every member lives in a private temporary directory, listens on free loopback ports,
is probed for readiness (never slept for), runs unprivileged where the server
allows, and hands the drivers the throwaway credentials its logins need through
:meth:`EmbeddedServer.driver_options`. A missing package is one
:class:`~pytest_storagescale.errors.EndpointError` with the install command.

The registry holds ``module:Class`` strings, imported on first use (as fsspec's
registry does), so a session that never starts Ceph never imports its module.
"""

from __future__ import annotations

import abc
import importlib
import shutil
from typing import TYPE_CHECKING, ClassVar, Self, TypeVar

from ..errors import EndpointError, StorageScaleUsageError

if TYPE_CHECKING:
    from .processes import ServerProcess

#: kind -> "module:Class" of the server the session starts
EMBEDDED_SERVERS: dict[str, str] = {
    "xrootd": "pytest_storagescale.servers.xrootd:EmbeddedXRootD",
    "ceph": "pytest_storagescale.servers.ceph:EmbeddedCephGateway",
    "xcache": "pytest_storagescale.servers.xcache:EmbeddedXCache",
    "webdav": "pytest_storagescale.servers.apache:EmbeddedApacheWebDAV",
    "gridftp": "pytest_storagescale.servers.gridftp:EmbeddedGridFTP",
    "redirector": "pytest_storagescale.servers.redirector:EmbeddedXRootDCluster",
}
#: the kind started when neither the command line nor the suite names one
DEFAULT_KIND = "xrootd"
#: how a client logs in to an embedded server (``--storage-embedded-login``)
LOGINS = ("unix", "krb5", "gsi", "token")


class EmbeddedServer(abc.ABC):
    """One throwaway server (or a small set of them: Ceph and its gateway) on loopback.

    Subclasses set the class attributes and implement :meth:`start`, :meth:`stop`
    and :meth:`url_for`; ``start`` returns ``self`` once the server answers."""

    #: the name ``--storage-embedded`` takes
    kind: ClassVar[str] = ""
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
    #: the throwaway CA folder clients verify TLS against ("" when the server has none)
    ca_dir: str = ""

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


def embedded_kinds() -> tuple[str, ...]:
    return tuple(EMBEDDED_SERVERS)


def embedded_class(kind: str) -> type[EmbeddedServer]:
    """The server class of ``kind`` (imported now)."""
    try:
        target = EMBEDDED_SERVERS[kind]
    except KeyError:
        raise StorageScaleUsageError(
            f"--storage-embedded: unknown server {kind!r}. Valid values: "
            f"{', '.join(EMBEDDED_SERVERS)}."
        ) from None
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and not exc.name.startswith("pytest_storagescale"):
            from ..drivers.registry import extra_hint

            raise StorageScaleUsageError(
                f"the embedded {kind} server needs {exc.name}, which is not installed in "
                f"this environment: install it with {extra_hint('servers')}, or point the "
                f"tests at a running server with --storage-endpoint URL."
            ) from None
        raise EndpointError(
            f"the embedded {kind} endpoint is not available in this installation "
            f"({exc}). Update pytest-storagescale, or use --storage-embedded xrootd."
        ) from None
    return getattr(module, class_name)


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
        raise StorageScaleUsageError(
            f"--storage-embedded-login {login}: the embedded {kind} offers "
            f"{', '.join(cls.logins)} logins. Pick one of those, or use --storage-embedded "
            f"xrootd (unix, krb5, gsi, token)."
        )
    return protocol or cls.schemes[0]


def start_embedded(kind: str, login: str) -> EmbeddedServer:
    """Check the installation, then start a ``kind`` server requiring ``login``."""
    cls = embedded_class(kind)
    cls.check_installed()
    return started(cls(login=login))


_Server = TypeVar("_Server", bound=EmbeddedServer)


def started(server: _Server) -> _Server:
    """``server.start()``, leaving the process's credential variables as they were: the
    readiness probe's driver sets them for the whole process, and the session's own
    drivers set what they need when they are made."""
    from ..drivers.grid import credential_environment_kept

    with credential_environment_kept():
        return server.start()
