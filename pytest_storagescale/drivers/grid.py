"""What the grid client libraries (XRootD, gfal2) share: credentials read from the
environment, and XRootD login names.

Login names matter to the drivers that log in over the XRootD protocol (the
``xrootd`` driver, and ``gfal2`` on ``root://``): the XRootD client multiplexes
every request for the same ``user@host:port`` over one connection, so the user
name decides which clients share a connection. The login request carries 8 bytes
of user name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..errors import StorageError, StorageNotFound, StorageTimeout
from .url import HTTP_SCHEMES, XROOTD_SCHEMES  # noqa: F401 - the drivers' import

#: driver option -> the environment variable the client libraries read it from:
#: the CA folder, a GSI proxy, a bearer token (XRootD's ztn plugin and gfal2's HTTP
#: plugin read BEARER_TOKEN), a Kerberos cache, XRootD's security protocols (forced:
#: ``krb5``, ``gsi``, ``ztn``, ``unix`` or a comma list) and the Kerberos
#: configuration (a realm that is not in /etc/krb5.conf)
CREDENTIAL_ENVIRONMENT = {
    "ca_dir": "X509_CERT_DIR", "x509_proxy": "X509_USER_PROXY", "token": "BEARER_TOKEN",
    "krb5ccname": "KRB5CCNAME", "security_protocol": "XrdSecPROTOCOL",
    "krb5_config": "KRB5_CONFIG",
}
SECRET_OPTIONS = ("token",)
#: the XRootD client's settings (read when the library starts, by the ``xrootd`` driver
#: and gfal2's xroot plugin alike; a value the user set wins): a timeout fires within
#: 1 s of when it should (default resolution 15 s); a connection is tried once for at
#: most 10 s (the defaults wait 17 s for an endpoint that is not XRootD); and a
#: connection that broke is tried again 1 s later, not after 30 minutes (the default
#: stream error window), so clients recover from a storage restart as a new client would
XROOTD_CLIENT_DEFAULTS = {
    "TimeoutResolution": 1, "ConnectionRetry": 1, "ConnectionWindow": 10,
    "StreamErrorWindow": 1,
}
#: event loops (XrdCl's ParallelEvtLoop; 5.5's default is 1: one thread then reads every
#: connection of the process, and its timeout list, ``Poller::TmoAdd``, linear, grows
#: with them) in a process that runs a step alone (the pytest process, a cluster host),
#: and in each process of a sharded step (the processes executor: 25 of them at 5,000
#: clients), measured on a 2-core host (docs/benchmarks.md, "XrdCl event loops"; single
#: rounds): 200 clients in one process, 1 / 4 / 8 loops: 16.3-24.9k / 27.2-32.4k /
#: 34.0-36.2k stat/s; 5,000 clients in 25 processes, 4 rounds each: 1 loop 13.2-16.1k
#: (mean 14.7k), 4 loops 15.7-19.5k (mean 17.4k), 8 loops 11.6-19.9k (mean 14.1k). The
#: pytest process keeps XrdCl's 1: with 8 there, a stat through the embedded redirector
#: expired once in a whole ``make test`` run (not understood); shard processes run load
#: clients only. Not put in the environment: a shard process must tell them from a
#: user's XRD_PARALLELEVTLOOP
XROOTD_EVENT_LOOPS = 1
XROOTD_SHARD_EVENT_LOOPS = 4
XROOTD_USER_EVENT_LOOPS = "XRD_PARALLELEVTLOOP" in os.environ
#: the settings the user chose through XRD_<NAME>: left alone
XROOTD_USER_SETTINGS = frozenset(
    name for name in XROOTD_CLIENT_DEFAULTS if f"XRD_{name.upper()}" in os.environ)


def configure_xrootd_client() -> None:
    """Put the XRootD client's settings into this process's environment (read by the
    processes it starts: ``xrdcp``, gfal2's xroot plugin, shard processes) and into its
    library (where installed): the defaults above, unless the user set XRD_<NAME> (the
    library may have started before, with gfal2), and the event loops, which count only
    before its first request. Called when storage is used (the plugin, once a storage
    setting is given or a test needing the storage is collected: before an embedded
    redirector, an XCache or a suite makes a request) and when the xrootd driver is
    imported; never at import, so a pytest run without storage leaves all alone."""
    for name, value in XROOTD_CLIENT_DEFAULTS.items():
        os.environ.setdefault(f"XRD_{name.upper()}", str(value))
    settings = {name: value for name, value in XROOTD_CLIENT_DEFAULTS.items()
                if name not in XROOTD_USER_SETTINGS}
    _put_xrootd_settings(settings, XROOTD_EVENT_LOOPS)


def configure_xrootd_shard() -> None:
    """In each process of a sharded step: :data:`XROOTD_SHARD_EVENT_LOOPS` event loops
    for the process's XRootD client library, whichever driver drives it (the xrootd
    driver, or gfal2's root:// plugin: both use the one libXrdCl of the process),
    unless the user chose a count; without the XRootD Python bindings, XrdCl's own."""
    _put_xrootd_settings({}, XROOTD_SHARD_EVENT_LOOPS)


def _put_xrootd_settings(settings: dict[str, int], event_loops: int) -> None:
    """``settings`` and ``event_loops`` (unless the user set XRD_PARALLELEVTLOOP) into
    the process's XRootD client library, through its Python bindings where installed."""
    try:
        from XRootD import client
    except ImportError:
        return
    for name, value in settings.items():
        client.EnvPutInt(name, value)
    if not XROOTD_USER_EVENT_LOOPS:
        client.EnvPutInt("ParallelEvtLoop", event_loops)


LOGIN_NAME_LENGTH = 8
#: a credential check is repeated when the same options come back later than this
CREDENTIAL_CHECK_INTERVAL = 60.0
_checked: dict[tuple[tuple[str, str], ...], float] = {}
_ROLE_NAMES = {"admin": "ssadmin", "version": "ssversn", "cleanup": "ssclean",
               "coordinator": "sscoord", "probe": "ssprobe"}


@contextlib.contextmanager
def credential_environment_kept() -> Iterator[None]:
    """Put the credential variables (:data:`CREDENTIAL_ENVIRONMENT`) back as they were
    when the block ends (a driver made inside it sets them for the whole process)."""
    names = set(CREDENTIAL_ENVIRONMENT.values())
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            elif os.environ.get(name) != value:
                os.environ[name] = value


#: ``--storage-embedded-login`` name -> the XRootD security protocol it forces
LOGIN_PROTOCOLS = {"unix": "unix", "krb5": "krb5", "gsi": "gsi", "token": "ztn"}


def session_login(options: Mapping[str, str], *, embedded: bool) -> str | None:
    """The login (``unix``, ``krb5``, ``gsi``, ``token``) the clients of a session use:
    the one protocol forced by the driver option ``security_protocol`` (or
    ``XrdSecPROTOCOL``); the embedded server's unix login forces none. None when a
    remote endpoint's protocol is not forced (the server picks it)."""
    forced = (options.get("security_protocol") or os.environ.get("XrdSecPROTOCOL", "")).strip()
    if not forced:
        return "unix" if embedded else None
    return next((login for login, protocol in LOGIN_PROTOCOLS.items() if protocol == forced),
                None)


def token_expired_at(token: str | None) -> str:
    """``"<when> UTC"`` when ``token`` is a JWT past its ``exp`` claim, else ``""``: a
    refusal of it then says why (the servers answer only "Auth failed" or 403)."""
    import datetime as dt

    from .credentials import token_expiry

    when = token_expiry(token) if token else None
    if when is None or when > dt.datetime.now(dt.UTC):
        return ""
    return f"{when:%Y-%m-%d %H:%M:%S} UTC"


def login_refusal(message: str, options: Mapping[str, str]) -> str:
    """The server refused the login (XRootD ``Auth failed``): which protocol and which
    credential were tried, and how to renew it (never the token itself)."""
    from .credentials import RENEW

    protocol = options.get("security_protocol") or os.environ.get("XrdSecPROTOCOL")
    given = []
    for option, variable in (("x509_proxy", "X509_USER_PROXY"), ("token", "BEARER_TOKEN"),
                             ("krb5ccname", "KRB5CCNAME")):
        value = options.get(option) or os.environ.get(variable)
        if value:
            expired = token_expired_at(value) if option == "token" else ""
            given.append((option, f" (it expired at {expired})" if expired else
                          "" if option == "token" else f" {value}"))
    used = ", ".join(f"{option}{where}" for option, where in given)
    renew = "; ".join(f"{option}: {RENEW[option]}" for option, _ in given)
    return (
        f"login refused by the server ({message}): authentication "
        f"{f'with {protocol}' if protocol else 'with the protocols it offers'} failed "
        + (f"using {used}. Check that the server accepts it (its CA, token issuer and "
           f"audience, Kerberos realm) and that it is valid; {renew}."
           if given else "and no credential was given (driver options x509_proxy, token, "
           "krb5ccname; security_protocol forces one protocol).")
    )


def base36(number: int) -> str:
    """``number`` in digits and lower-case letters (``46655`` -> ``zzz``)."""
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, rest = divmod(number, 36)
        text = digits[rest] + text
        if not number:
            return text


#: XRootD's answers: kXR_NotFound; errSocketTimeout, errOperationExpired (XrdClStatus.hh)
KXR_NOT_FOUND = 3011
TIMEOUT_CODES = (103, 206)


@dataclass(frozen=True)
class Location:
    """One entry of a ``locate`` answer: ``host:port`` and what it is."""

    address: str
    #: a data server (``kXR_lsrv``), else a manager (``kXR_lman``: ask it again)
    is_server: bool
    #: the manager has not yet confirmed it (``kXR_...pending``)
    pending: bool

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


def located(manager: str, path: str, *, timeout: float = 10.0, refresh: bool = True
            ) -> tuple[Location, ...]:
    """The locations ``locate`` through ``manager`` (``root://host:port``) answers for
    ``path`` (``refresh``: the manager asks its servers now, not its cache); a
    :class:`~pytest_storagescale.errors.StorageError` when it answers an error."""
    from XRootD import client
    from XRootD.client.flags import LocationType, OpenFlags

    status, info = client.FileSystem(manager).locate(
        path, OpenFlags.REFRESH if refresh else OpenFlags.NONE, timeout=max(1, int(timeout)))
    if not status.ok:
        raise locate_error(status, manager, path)
    pending = (LocationType.MANAGER_PENDING, LocationType.SERVER_PENDING)
    servers = (LocationType.SERVER_ONLINE, LocationType.SERVER_PENDING)
    return tuple(Location(entry.address, entry.type in servers, entry.type in pending)
                 for entry in info)


def locate_error(status, manager: str, path: str) -> StorageError:
    """The error of a ``locate`` answer: not found (kXR_NotFound), a timeout, or other."""
    kind = StorageError
    error_class = f"xrootd_errno_{status.errno}" if status.errno else f"xrootd_{status.code}"
    if status.errno == KXR_NOT_FOUND:
        kind, error_class = StorageNotFound, "not_found"
    elif status.code in TIMEOUT_CODES:
        kind, error_class = StorageTimeout, "timeout"
    return kind(status.message.strip(), driver="xrootd", endpoint=manager, operation="locate",
                path=path, native_status=f"status={status.status} code={status.code} "
                f"errno={status.errno}", error_class=error_class)


class XRootDLogins:
    """The login-name rule of a driver class (a mixin for :class:`Driver` subclasses).

    One generation for all of them: the ``xrootd`` driver and gfal2's xroot plugin
    share the process's XRootD client, and with it its connections."""

    #: bumped by forget_connections(); part of every load client's login name
    _generation: ClassVar[int] = 0
    #: a login's XRootD security protocol (``--storage-driver-option security_protocol=``)
    login_protocols: ClassVar[Mapping[str, str]] = LOGIN_PROTOCOLS

    @classmethod
    def session_login(cls, options: Mapping[str, str], *, embedded: bool) -> str | None:
        """The login the session's clients of this driver use: :func:`session_login`."""
        return session_login(options, embedded=embedded)

    @classmethod
    def locate(cls, server: str, path: str, *, timeout: float = 10.0, refresh: bool = True
               ) -> tuple[Location, ...]:
        """Where ``path`` is, as ``server`` (``root://host:port``, a redirector) answers
        XRootD's ``locate``: :func:`located`."""
        return located(server, path, timeout=timeout, refresh=refresh)

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        """A proxy, token or ticket cache that is missing or expired is one error naming
        it and how to renew it, before any load (checked again after a minute)."""
        from .credentials import check_credentials

        key = tuple(sorted(options.items()))
        now = time.monotonic()
        if now - _checked.get(key, -CREDENTIAL_CHECK_INTERVAL) >= CREDENTIAL_CHECK_INTERVAL:
            check_credentials(options)
            _checked[key] = now

    @classmethod
    def client_name(cls, index: int) -> str:
        """``c<generation><index>``, at most 8 characters.

        Client i of every step logs in as the same name, so a step reuses the
        connections of the last one instead of piling up idle ones (the XRootD client
        keeps them for minutes, and a process holding thousands is measurably
        slower). After a step with hung clients the generation changes
        (:meth:`forget_connections`), so no step inherits a stuck connection.
        """
        generation = base36(XRootDLogins._generation % 36**2).rjust(2, "0")
        if index < 100_000:
            return f"c{generation}{index:05d}"
        if index >= 36**5:
            raise ValueError(f"client index {index}: XRootD login names run out at {36**5}")
        return f"k{generation}{base36(index).rjust(5, '0')}"

    @classmethod
    def role_name(cls, role: str) -> str:
        """``ss<role>`` for the session's own connections (``ssadmin``...); a test's
        client logs in as its name (``functional-other`` as ``other``, ``ssfunc`` as
        itself) when that fits, else as ``g`` and a hash of the name."""
        if role in _ROLE_NAMES:
            return _ROLE_NAMES[role]
        name = role.removeprefix("functional-")
        if name.isalnum() and len(name) <= LOGIN_NAME_LENGTH:
            return name
        return "g" + hashlib.sha1(role.encode()).hexdigest()[:LOGIN_NAME_LENGTH - 1]

    @classmethod
    def forget_connections(cls) -> None:
        """The next clients log in under new names: new connections."""
        XRootDLogins._generation += 1
