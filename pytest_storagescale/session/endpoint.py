"""The endpoint under test: its URL (or the embedded server), the driver that speaks
it, and the storage version that chooses the thresholds file."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..config import ALL_DOORS, Settings
from ..drivers.registry import DriverSpec, driver_class, driver_spec
from ..drivers.url import EndpointURL, split_url
from ..drivers.version import first_contact
from ..errors import EndpointError, StorageError, StorageScaleUsageError
from ..redact import redact_url
from ..servers.family import (
    DEFAULT_KIND,
    EmbeddedServer,
    check_embedded_choice,
    embedded_class,
    start_embedded,
)

#: deadline of the version query (a shorter hang timeout shortens it)
VERSION_TIMEOUT = 10.0
#: in the session's shared folder: the endpoint a deferred xdist controller hands over
ENDPOINT_FILE = "endpoint.json"


@dataclass(frozen=True)
class ResolvedEndpoint:
    """The endpoint under test resolved once (the embedded server started, or the
    controller's read): the main door's driver spec, its parsed URL, the doors, the
    display and identity strings. Everything else reads these attributes; nothing
    resolves the endpoint's URL or driver again."""

    #: the main door's client spec, writable nowhere (:meth:`driver_spec` guards one)
    spec: DriverSpec
    #: the main door's name (``root``, ``davs``...)
    main_door: str
    #: door name -> the URL of its test area (the embedded server's doors, or the
    #: endpoint and the ``--storage-door`` ones)
    door_urls: Mapping[str, str]
    #: what names the endpoint across runs (the embedded one's port changes)
    identity: str

    @property
    def url(self) -> EndpointURL:
        return self.spec.endpoint

    @property
    def display(self) -> str:
        """The main door's URL without credentials."""
        return self.spec.endpoint.display

    @property
    def driver_name(self) -> str:
        return self.spec.name

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.spec.options))

    def driver_spec(self, writable_root: str | None) -> DriverSpec:
        """The main door's spec, its clients writing only below ``writable_root``."""
        spec = self.spec
        return DriverSpec(spec.driver_class, spec.endpoint_url, writable_root, spec.options)

    @functools.cached_property
    def door_specs(self) -> dict[str, DriverSpec]:
        """Door name -> its client spec (writable nowhere), resolved once on first
        need: a door's driver is chosen by its scheme (the main driver for the main
        endpoint's URL), with those of the main options it takes."""
        specs = {}
        for name, url in self.door_urls.items():
            by_scheme = driver_spec(url).driver_class
            options = {k: v for k, v in self.spec.options.items() if k in by_scheme.option_names}
            same = url == self.spec.endpoint_url
            specs[name] = with_listing_door(
                driver_spec(url, driver=self.spec.name if same else "auto", options=options),
                self.door_urls)
        return specs


    def door_spec(self, name: str) -> DriverSpec:
        """Door ``name``'s client spec (writable nowhere): :attr:`door_specs`'s, or for a
        load door ``DOOR+CLIENT`` (:func:`split_client`) door ``DOOR``'s URL through the
        driver ``CLIENT``, with the options it takes of the main door's and ``DOOR``'s.
        ``KeyError``: the storage has no door ``DOOR``."""
        door, client = split_client(name)
        base = self.door_specs[door]
        if client is None:
            return base
        taken = driver_class(client).option_names
        options = {key: value for key, value in {**self.spec.options, **base.options}.items()
                   if key in taken}
        return with_listing_door(driver_spec(base.endpoint_url, driver=client,
                                             options=options), self.door_urls)


#: ``--storage-load-doors DOOR+CLIENT``: the door ``DOOR`` through the driver ``CLIENT``
#: (``dcap+dccp``, ``gsiftp+globus-url-copy``: the seeds' own command-line clients)
CLIENT_SEPARATOR = "+"


def split_client(name: str) -> tuple[str, str | None]:
    """A load door's name as its door and its client (None: the door's own driver)."""
    door, separator, client = name.partition(CLIENT_SEPARATOR)
    return door, (client if separator else None)


def with_listing_door(spec: DriverSpec, door_urls: Mapping[str, str]) -> DriverSpec:
    """``spec`` with the option naming the door its service connections list through,
    when its driver lists no directory over its scheme (gfal2 over dcap:
    :meth:`Driver.listing_door_option`) and the option was not given: the first other
    door of the same storage that speaks XRootD, else HTTP, whose directories the
    driver lists; its URL without credentials (the client's own log in there). No such
    door: ``spec`` as it is (its clean-up then cannot list)."""
    cls = spec.driver_class
    option = cls.listing_door_option(spec.endpoint.scheme)
    if option is None or option in spec.options:
        return spec
    for speaks in (cls.is_xrootd, cls.is_http):
        for url in door_urls.values():
            scheme = split_url(url).scheme.lower()
            if url != spec.endpoint_url and speaks(scheme) and cls.has_listing(scheme):
                listing = cls.parse_endpoint(url).display
                return replace(spec, options={**spec.options, option: listing})
    return spec


class EndpointUnderTest:
    """``--storage-endpoint``, or the embedded server (``--storage-embedded``) started
    on first use.

    Under xdist the controller starts the embedded server and the workers get its URL
    and driver options (CA, credentials) through ``shared`` (see :meth:`shared_info`).
    A controller given no storage setting hands it over only once a worker collected a
    storage test (``shared["deferred"]``): the worker reads it from the shared folder
    at its first need, after collection (:meth:`from_controller`)."""

    def __init__(self, settings: Settings, shared: dict[str, Any] | None = None) -> None:
        self.settings = settings
        self._shared = shared
        self._server: EmbeddedServer | None = None
        #: why the embedded server did not start: raised again, never started again (each
        #: load test's collection asked; at load 40-56 a dCache start failed after 300 s
        #: once per load test of suites/dcache, an hour before the one usage error)
        self._start_error: StorageScaleUsageError | None = None
        #: why the embedded server died during the run ("" when it did not), see stop()
        self.exit_note = ""
        self._resolved: ResolvedEndpoint | None = None
        self._version: str | None = (shared or {}).get("version")
        #: the first contact's verdict: None not yet, "" usable, else why not (said once)
        self._contact: str | None = "" if (shared or {}).get("contacted") else None
        self._tokens: dict[str, str] | None = None
        #: the servers' summary monitoring this process receives (the embedded xrootd's,
        #: or a remote storage's stream): load/server_monitor.SummaryListener, or None
        self.listener: Any = None

    def check(self) -> None:
        """Refuse a malformed URL, an unknown driver or driver option now, before any
        test runs (no request is sent), and a ``--storage-load-doors`` name the storage
        has no door for."""
        if not self.is_embedded:
            _ = self.resolved  # resolved once, here: no request is sent
        else:
            _ = self.protocol  # refuses a protocol or login the embedded server lacks
            if self.settings.embedded_version:
                embedded_class(self.embedded_kind).check_version(self.settings.embedded_version)
            if self.settings.embedded_start_timeout is not None:
                check_start_timeout(self.embedded_kind)
            if self.settings.embedded_hosts != 1:
                from ..servers.dcache_hosts import check_hosts

                if self.embedded_kind != "dcache":
                    raise StorageScaleUsageError(
                        f"--storage-embedded-hosts {self.settings.embedded_hosts}: only the "
                        f"embedded dcache runs on several hosts, not the embedded "
                        f"{self.embedded_kind}. Give --storage-embedded dcache, or leave the "
                        f"option out (1 host).")
                check_hosts(self.settings.embedded_hosts)
            if self.settings.driver != "auto":
                driver_class(self.settings.driver)
        load_door_names(self)

    @property
    def deferred(self) -> bool:
        """An xdist worker whose controller has not handed the endpoint over yet."""
        return bool((self._shared or {}).get("deferred"))

    def from_controller(self) -> dict[str, Any]:
        """What the xdist controller handed this worker about the endpoint (read from
        the shared folder, once, when it was deferred); empty when not a worker."""
        shared = self._shared
        if shared is None or not shared.get("deferred"):
            return shared or {}
        path = Path(shared["shared_dir"]) / ENDPOINT_FILE
        try:
            shared.update(json.loads(path.read_text()), deferred=False)
        except (OSError, ValueError) as exc:
            raise EndpointError(
                f"the xdist controller handed no endpoint to this worker ({path}: "
                f"{getattr(exc, 'strerror', None) or exc}): it starts the embedded server "
                f"once a worker collected a storage test. Give a storage setting (e.g. "
                f"--storage-embedded xrootd) to have it started at the session's start."
            ) from None
        return shared

    # -- where ---------------------------------------------------------------------
    @property
    def is_embedded(self) -> bool:
        return self.settings.endpoint is None

    @property
    def embedded_kind(self) -> str:
        return self.settings.embedded or DEFAULT_KIND

    @property
    def protocol(self) -> str:
        """The scheme used on the embedded server (its first, unless one was asked)."""
        return check_embedded_choice(self.embedded_kind, self.settings.embedded_protocol,
                                     self.settings.embedded_login)

    @property
    def resolved(self) -> ResolvedEndpoint:
        """The endpoint resolved once; the embedded server is started on first use."""
        if self._resolved is None:
            # the driver class parses its own URLs (its schemes, its path rules)
            spec = driver_spec(self._start_or_read_url(), driver=self.settings.driver,
                               options=self._options())
            main = main_door_name(self)
            if self.is_embedded:
                urls = self._embedded_door_urls()
                login = self.settings.embedded_login
                suffix = "" if login == "unix" else f", {login} login"
                identity = f"embedded {self.embedded_kind} ({spec.endpoint.scheme}{suffix})"
            else:
                urls = {main: spec.endpoint_url, **{name: url for name, url in (
                    self.settings.doors or {}).items() if name != main}}
                identity = spec.endpoint.display
            spec = with_listing_door(spec, urls)  # a dcap endpoint lists through another
            self._resolved = ResolvedEndpoint(spec, main, urls, identity)
        return self._resolved

    @property
    def url(self) -> EndpointURL:
        """The endpoint's parsed URL; the embedded server is started on first use."""
        return self.resolved.url

    def _start_or_read_url(self) -> str:
        if self.settings.endpoint is not None:  # remote
            if self.settings.server_monitor and self._shared is None and self.listener is None:
                self.listener = _listen(self.settings.server_monitor)
            return self.settings.endpoint
        if self._shared is not None:
            return self.from_controller()["endpoint_url"]
        protocol = self.protocol
        if self._server is None:  # once: a bad driver option after the start starts none again
            if embedded_class(self.embedded_kind).reports_summary and self.listener is None:
                from ..load.server_monitor import SummaryListener
                from ..servers.orphans import server_directory
                from ..servers.processes import unprivileged_user

                # a Unix socket only the server's user may write to, in a folder recorded
                # like a server's; only packets its daemons sent (their pids, as the
                # kernel gives them) count
                self.listener = SummaryListener(
                    senders=self._server_pids, user=unprivileged_user(),
                    folder=lambda: server_directory("monitor"))
            if self._start_error is not None:
                raise self._start_error
            try:
                self._server = start_embedded(
                    self.embedded_kind, self.settings.embedded_login,
                    self.settings.embedded_version,
                    report_to=self.listener.address if self.listener is not None else "",
                    **self._server_class())
            except StorageScaleUsageError as exc:  # EndpointError too: one paragraph
                self._start_error = exc
                raise
        return self._server.url_for(protocol)

    def _server_class(self) -> dict[str, Any]:
        """The server class and options: ``--storage-embedded-hosts N`` (N > 1: the
        dCache over several hosts; for 1, the kind's own layout) and
        ``--storage-embedded-start-timeout`` (the class's ``startup_timeout``)."""
        timeout = self.settings.embedded_start_timeout
        options: dict[str, Any] = {} if timeout is None else {"startup_timeout": timeout}
        hosts = self.settings.embedded_hosts
        if hosts == 1:
            return {"options": options} if options else {}
        from ..servers.dcache_hosts import EmbeddedDCacheHosts

        return {"server_class": EmbeddedDCacheHosts, "options": {"hosts": hosts, **options}}

    def _server_pids(self) -> list[int]:
        """The embedded server's daemons (none before it started)."""
        return self._server.server_pids() if self._server is not None else []

    @property
    def embedded_server(self):
        """The :class:`~pytest_storagescale.servers.family.EmbeddedServer` this
        process runs (None: remote, or a worker)."""
        return self._server

    @property
    def display(self) -> str:
        """The URL without credentials (before the embedded server started too)."""
        if self._resolved is not None:
            return self._resolved.display
        remote = self.settings.endpoint
        if remote is None:
            where = ("file://<its mount>" if self.protocol == "file"
                     else f"{self.protocol}://127.0.0.1:<free port>")
            return (f"embedded {self.embedded_kind} ({where}, "
                    f"{self.settings.embedded_login} login)")
        try:
            return EndpointURL.parse(remote).display
        except EndpointError:
            return redact_url(remote)

    @property
    def identity(self) -> str:
        """What names the endpoint across runs (the embedded one's port changes)."""
        return self.resolved.identity

    # -- how -------------------------------------------------------------------------
    def _options(self) -> dict[str, str]:
        """The user's driver options over those the embedded server hands out that the
        driver takes (the http driver of a davs door has no ``security_protocol``)."""
        shared = self.from_controller()
        server: dict[str, str] = shared.get("driver_options") or {}
        url = shared.get("endpoint_url")
        if not server and self._server is not None:
            server, url = self._server.driver_options(), self._server.url_for(self.protocol)
        if server and url:
            accepted = driver_spec(url, driver=self.settings.driver).driver_class.option_names
            server = {key: value for key, value in server.items() if key in accepted}
        return {**server, **(self.settings.driver_options or {})}

    def driver_spec(self, writable_root: str | None) -> DriverSpec:
        """How to open clients of the endpoint that may write only below ``writable_root``
        (the resolved spec, :attr:`resolved`)."""
        return self.resolved.driver_spec(writable_root)

    @property
    def driver_name(self) -> str:
        return self.resolved.driver_name

    @property
    def option_names(self) -> tuple[str, ...]:
        return self.resolved.option_names

    def shared_info(self) -> dict[str, Any]:
        """What an xdist worker needs to reach the same endpoint."""
        if not self.is_embedded:  # the controller's first contact, made once for all
            return {"endpoint_url": None, "driver_options": {}, "version": self._version,
                    "contacted": self._contact == ""}
        url = self.url.url  # starts the server, once
        return {"endpoint_url": url, "embedded_version": self.version,
                "driver_options": self._server.driver_options() if self._server else {},
                "door_urls": self.door_urls(),
                "authorization_tokens": self.authorization_tokens()}

    def authorization_tokens(self) -> dict[str, str]:
        """The authorization checks' tokens (``readonly``, ``write``, ``expired``), minted
        once by the embedded server's token issuer (its token login), also for xdist
        workers; empty otherwise."""
        if not self.is_embedded:
            return {}
        if self._shared is not None:
            return dict(self.from_controller().get("authorization_tokens") or {})
        if self._tokens is None:
            from ..servers.credentials import authorization_tokens

            _ = self.url  # starts the server, once
            self._tokens = authorization_tokens(getattr(self._server, "token_issuer", None))
        return dict(self._tokens)

    def door_urls(self) -> dict[str, str]:
        """Every door of the embedded server, scheme -> its test area URL (the
        conformance suite's doors); empty for a remote endpoint."""
        return dict(self.resolved.door_urls) if self.is_embedded else {}

    def _embedded_door_urls(self) -> dict[str, str]:
        """The embedded server's doors (this process's started one, or the controller's)."""
        if self._shared is not None:
            return dict(self.from_controller().get("door_urls") or {})
        server = self._server
        return {scheme: server.url_for(scheme) for scheme in server.schemes} if server else {}

    # -- which version -----------------------------------------------------------------
    @property
    def version(self) -> str:
        if self._version is None:
            self._version = self.settings.version or self._detect_version()
        return self._version

    @property
    def version_source(self) -> str:
        if self.settings.version:
            return f"from {self.settings.source('version')}"
        if self.is_embedded:
            return f"detected from the embedded {self.embedded_kind}"
        return f"detected from {self.url.server}"

    def _detect_version(self) -> str:
        if self.is_embedded and self._server is not None:
            return self._server.version
        shared = self._shared or {}
        if self.is_embedded and shared.get("embedded_version"):
            return str(shared["embedded_version"])
        if self.is_embedded and (self._shared is None or self.deferred):
            cls, release = embedded_class(self.embedded_kind), self.settings.embedded_version
            installed = cls.release_version(release) if release else cls.installed_version()
            if installed:
                return installed  # without starting it
        if self.deferred:  # collecting, the controller starts the server after
            embedded_class(self.embedded_kind).check_installed()
            raise StorageScaleUsageError(
                f"the embedded {self.embedded_kind} tells its version only once it runs, "
                f"and the xdist controller starts it after collection: give "
                f"--storage-embedded {self.embedded_kind} (started at the session's start) "
                f"or --storage-version VERSION.")
        if self.is_embedded and self._shared is None:
            _ = self.url  # starts it: a server knows its version once it runs
            if self._server is not None:
                return self._server.version
        self.first_contact()  # asks the version: want_version, as the version is unknown
        return self._version or ""

    def first_contact(self) -> None:
        """Log in, stat the test area and (without ``--storage-version``) detect the
        version, once per session: in a child process for a compiled client library
        (its crash on a hostile server is one paragraph, not the session's end; see
        :func:`~pytest_storagescale.drivers.version.first_contact`). An endpoint
        found unusable stays unusable: the paragraph is raised again, nothing is
        asked again (a door that never answers costs its deadline once). The embedded
        server is ours: nothing to check."""
        if self._contact == "" or self.is_embedded:
            return
        if self._contact is not None:
            raise EndpointError(self._contact)
        want_version = self._version is None and not self.settings.version
        # a deadline of its own per request, kept even by a library that ignores its timeout
        timeout = min(self.settings.hang_timeout or VERSION_TIMEOUT, VERSION_TIMEOUT)
        try:
            version = first_contact(self.driver_spec(None), want_version=want_version,
                                    timeout=timeout)
        except StorageError as exc:
            if exc.error_class == "version":  # it answered, but not its version
                how = "" if "--storage-version" in exc.message else (
                    " Give it with --storage-version VERSION (it chooses the thresholds file).")
                self._contact = f"--storage-endpoint {self.display}: {exc.message}.{how}"
                raise EndpointError(self._contact) from None
            hint = (" (The version is detected to choose the thresholds file; "
                    "--storage-version VERSION skips the detection.)" if want_version else "")
            self._contact = f"{self.unusable(exc)}{hint}"
            raise EndpointError(self._contact) from None
        except StorageScaleUsageError as exc:
            self._contact = str(exc)
            raise
        self._version = version if want_version else self._version
        self._contact = ""

    def unusable(self, exc: Exception) -> str:
        """One paragraph for an endpoint that refused us."""
        return (
            f"--storage-endpoint {self.display}: cannot use the storage: {exc}. Check the "
            f"host, port and path, that the test area exists and is writable by this identity "
            f"(credentials, proxy, token: --storage-driver-option)."
        )

    def stop(self) -> None:
        """Stop the embedded server; if it had died during the run, ``exit_note`` says so."""
        if self._server is not None:
            try:
                self.exit_note = self._server.exit_note()
            finally:
                self._server.stop()
                self._server = None
        if self.listener is not None:
            self.listener.close()
            self.listener = None


def check_start_timeout(kind: str) -> None:
    """``--storage-embedded-start-timeout`` is for a server class whose constructor
    takes ``startup_timeout`` (every shipped kind; a site's may not)."""
    import inspect

    parameters = inspect.signature(embedded_class(kind).__init__).parameters
    if "startup_timeout" not in parameters:
        raise StorageScaleUsageError(
            f"--storage-embedded-start-timeout: the embedded {kind} takes no start "
            f"deadline (its class has no startup_timeout). Leave the option out, or give "
            f"its class a startup_timeout keyword.")


def _listen(address: str):
    """The session's listener for a remote storage's summary monitoring on ``address``
    (``--storage-server-monitor``); a usage error when it cannot be bound."""
    from ..load.server_monitor import SummaryListener

    try:
        return SummaryListener(address)
    except (OSError, ValueError) as exc:
        raise StorageScaleUsageError(
            f"--storage-server-monitor {address}: cannot listen there "
            f"({getattr(exc, 'strerror', None) or exc}). Give an address of this host and "
            f"a free UDP port, e.g. 0.0.0.0:9931.") from None


def main_door_name(endpoint: EndpointUnderTest) -> str:
    """The endpoint's own door: the embedded protocol, or the endpoint URL's scheme."""
    if endpoint._resolved is not None:  # resolved: its main door, parsed once
        return endpoint._resolved.main_door
    remote = endpoint.settings.endpoint
    if remote is None:
        return endpoint.protocol
    return urlsplit(remote).scheme.lower() or "endpoint"


def endpoint_door_names(endpoint: EndpointUnderTest) -> tuple[str, ...]:
    """The doors' names (the embedded server's in its order, else the main door
    first); no server is started."""
    if endpoint.is_embedded:
        return tuple(dict.fromkeys(embedded_class(endpoint.embedded_kind).schemes))
    return tuple(dict.fromkeys([main_door_name(endpoint), *(endpoint.settings.doors or {})]))


def load_door_names(endpoint: EndpointUnderTest) -> tuple[str, ...]:
    """The doors the load steps run over (``--storage-load-doors``; default: the main
    door); an unknown name is one usage error naming the doors the storage has."""
    wanted = endpoint.settings.load_doors
    known = endpoint_door_names(endpoint)
    if not wanted:
        return (main_door_name(endpoint),)
    if wanted == (ALL_DOORS,):
        return known
    unknown = [name for name in wanted if split_client(name)[0] not in known]
    if unknown:
        where = (f"the embedded {endpoint.embedded_kind}" if endpoint.is_embedded
                 else "this storage (the --storage-endpoint's scheme and the --storage-door "
                      "names)")
        raise StorageScaleUsageError(
            f"--storage-load-doors: unknown door {', '.join(map(repr, unknown))}. The doors "
            f"of {where}: {', '.join(known)}. Name some of those, or all; another door of a "
            f"remote storage is added with --storage-door NAME=URL."
        )
    for name in wanted:
        check_client(endpoint, name)
    return tuple(wanted)


def check_client(endpoint: EndpointUnderTest, name: str) -> None:
    """A load door ``DOOR+CLIENT``'s client is a driver that speaks the door's scheme
    and is installed (its ``check_options``: a tool it runs is there); one usage error
    naming the fix otherwise. No server is started."""
    door, client = split_client(name)
    if client is None:
        return
    if endpoint.is_embedded:
        scheme = door  # the embedded servers name their doors by their schemes
    else:
        url = (endpoint.settings.doors or {}).get(door) or endpoint.settings.endpoint or ""
        scheme = urlsplit(url).scheme.lower()
    try:
        cls = driver_class(client)
    except StorageScaleUsageError as exc:
        raise StorageScaleUsageError(f"--storage-load-doors {name}: no client {client!r}: "
                                     f"{exc}") from None
    if scheme not in cls.schemes:
        raise StorageScaleUsageError(
            f"--storage-load-doors {name}: the {client} driver speaks "
            f"{', '.join(s + '://' for s in cls.schemes)}, not the {door} door's "
            f"{scheme}://. Drivers that speak it: {', '.join(drivers_of(scheme)) or 'none'} "
            f"(write {door}+DRIVER).")
    try:
        cls.check_options({})
    except StorageScaleUsageError as exc:
        raise StorageScaleUsageError(f"--storage-load-doors {name}: {exc}") from None


def drivers_of(scheme: str) -> list[str]:
    """The installed drivers that speak ``scheme`` (an error's hint: imports them all)."""
    from ..drivers.registry import driver_names

    found = []
    for driver in driver_names():
        try:
            if scheme in driver_class(driver).schemes:
                found.append(driver)
        except StorageScaleUsageError:  # not installed
            continue
    return found
