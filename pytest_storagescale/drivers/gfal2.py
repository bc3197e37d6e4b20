"""gfal2 driver: the grid's client library for ``davs://``, ``https://``, ``root://``,
``file://`` (and ``srm://``, ``gsiftp://`` where the plugins are installed).

One gfal2 context per driver instance, so one client is one context (a context's
``cancel`` cancels everything on it). Timeouts go through gfal2's options
(``CORE:NAMESPACE_TIMEOUT``, ``CORE:CHECKSUM_TIMEOUT``, ``HTTP PLUGIN:OPERATION_TIMEOUT``);
for ``root://`` gfal2 sets none of its own and the XRootD client settings apply.
TLS is verified against ``X509_CERT_DIR`` (the driver option ``ca_dir`` sets it),
never switched off. Credentials are driver options read through the environment, as
for the ``xrootd`` driver: ``x509_proxy``, ``token`` (BEARER_TOKEN, sent by the HTTP
plugin and by XRootD's ``ztn``), ``krb5ccname``, ``security_protocol``.

On ``root://`` each context logs in as its client's own name (the XRootD client
would otherwise share one connection among all contexts of a process), with the
``xrootd`` driver's naming rule.

**Writes on HTTP doors go through the http driver.** gfal2's HTTP plugin (davix)
follows every redirect itself, and gfal2 offers no setting to stop it: a door that
answered a ``DELETE`` inside the run directory with ``307 Location: /outside/victim``
had the victim deleted. So on ``davs://``, ``https://``, ``dav://`` and ``http://``
every request that writes or removes (``mkdir``, the exclusive ``mkdir`` of the run
directory, ``put``, ``delete``, ``rmdir``, ``rename``, and clean-up through them) is
made by an :class:`~pytest_storagescale.drivers.http.HTTPDriver` of the same endpoint
URL, with this driver's client name, timeout, writable root and the options it takes
(``ca_dir``, ``x509_proxy``, ``token``; the same environment): its redirects are
followed only to the same path, anything else is
:class:`~pytest_storagescale.errors.RedirectRefused` (``redirect_refused``), and its
uploads are checked by its adler32 rule (``checksum=auto``). Reads (``stat``, ``ls``,
``get``, ``read``, ``readv``, ``checksum``, copies to local disk) stay with gfal2, and
may be redirected anywhere the TLS trust allows, as the http driver's reads may; but
gfal2 sends the door's bearer token along to the server a read is redirected to
(seen with 2.21: a ``GET`` sent to another port carried it), where the http driver
does not. Errors of the requests the http driver makes name the ``http`` driver.

**srm://**: the namespace requests (``srmMkdir``, ``srmRm``, ``srmRmdir``, ``srmMv``)
name the SURL, which the guard checks, and are carried out by the SRM server, with no
redirect the client sees. A ``put``/``get`` asks the SRM server for a transfer URL
(TURL) on another door (a pool's ``gsiftp://`` or ``https://``), which gfal2's SRM
plugin uses as given: its path is the server's choice and is not checked against the
test area, and gfal2's HTTP plugin follows that door's redirects. What the driver
guarantees there is the SURL's path only; a TURL elsewhere is trusted to the SRM
server.

**dcap://, gsidcap://**: stat, copies in and out, reads, delete, mkdir and rmdir go
through gfal2's dcap plug-in (libdcap, dccp's library), in libdcap's active mode
(``DCACHE_CLIENT_ACTIVE=1``, dccp's ``-A``: the client connects to the pool's mover).
libdcap still opens a socket listening on every interface at a process's first
``open`` (active mode or not, no setting for its address: :mod:`.dcap_mover`), so the
data requests (uploads, copies out, reads) are made by *movers*, processes running
this driver with the loopback-only preload library, where that socket is bound to
loopback, forked from one factory per client process (a mover's start costs no
interpreter start: 50 clients' logins at once); stat, mkdir, delete and rmdir open no
file and are made here. dcap has no
checksum request and no rename
(``EPROTONOSUPPORT``), and its listing is never sent (:data:`DCAP_NO_LISTING`): a
service connection (a step's set-up and clean-up, a check's, the run directory's) lists
through the door the option ``listing_door`` names (another door of the same namespace,
chosen by the session), so that what the run made is removed as through any door; a
load client never does, and its ``ls`` fails (a step would measure the other door).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import stat as stat_module
import tempfile
import threading
import time
from collections.abc import Iterator
from urllib.parse import quote

import gfal2

from ..errors import (
    BadAnswer,
    EndpointError,
    StorageError,
    StorageNotFound,
    StoragePermissionDenied,
    StorageScaleUsageError,
    StorageThrottled,
    StorageTimeout,
    StorageUnreachable,
)
from .base import Driver, StatInfo
from .dcap_mover import Movers, contained
from .grid import (
    CREDENTIAL_ENVIRONMENT,
    HTTP_SCHEMES,
    SECRET_OPTIONS,
    XROOTD_SCHEMES,
    XRootDLogins,
    configure_xrootd_shard,
    login_refusal,
)
from .http import THROTTLE_SENDS, THROTTLE_SHARE, THROTTLE_WAIT, HTTPDriver
from .url import HTTPS_SCHEMES, split_url

# gfal2's gridftp plugin (Globus) aborts the whole process ("bit out of range 0 -
# FD_SETSIZE on fd_set") when it is first activated in a process holding descriptors
# above 1024, as one does after a step of 1000 XRootD clients; activated once, it
# stays so. The registry imports this module before any step's clients start
# (start_early_drivers), while the process holds few descriptors; the context is kept,
# so no gfal2 version can stop Globus when it is freed.


def new_context() -> gfal2.Gfal2Context:
    """``gfal2.creat_context()``, leaving the calling thread's signal mask as it was:
    making a context (its Globus plugins) blocks every asynchronous signal in the
    calling thread, and every process spawned from that thread inherits the mask: a
    ``serve`` process started by a test after a gfal2 import ignored SIGTERM (issue 31;
    CI, test_serve.py)."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        return gfal2.creat_context()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


_GLOBUS_STARTED = new_context()
#: Globus XIO waits on its sockets with select(): one numbered 1024 or above aborts the
#: process, so a gsiftp:// client is not made where the next descriptors are near it
#: (a GridFTP client holds a control and a data connection, and Globus some pipes)
_SELECT_LIMIT, _GRIDFTP_MARGIN = 1024, 64
#: GridFTP's reply 530 (not logged in) or a GSS failure in a gsiftp:// error, read
#: with the message's URLs taken out: a path may hold those digits (a run folder
#: ``...-fa2a5304e2b7f216`` made a missing file's ENOENT a refused login)
_GRIDFTP_LOGIN_REFUSED = re.compile(r"(?<![\w./-])530(?![\w./])|gss", re.IGNORECASE)
_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S*", re.IGNORECASE)

#: dcap, plain and through libdcap's GSI tunnel (``dcap-tunnel-gsi``)
DCAP_SCHEMES = ("dcap", "gsidcap")
#: why a dcap directory is not listed (measured with libdcap 2.47.14, dCache 11.2.5)
DCAP_NO_LISTING = (
    "a dcap directory listing is not sent: libdcap's dc_opendir has the door's lookup "
    "service connect back to the client, which listens for it on every interface "
    "(ss: LISTEN *:<port>, also with DCACHE_CLIENT_ACTIVE), and the second listing of a "
    "process waits for that call for ever (poll without a timeout in "
    "data_hello_conversation); list through another door of the same namespace")
#: the driver option naming another door of the same namespace (its URL, without
#: credentials: the dcap client's own log in there) through which a dcap client's
#: service connections (the step's set-up and clean-up, a check's clean-up, the run
#: directory's) list a directory; a load client never does (its step would measure
#: that door). The session sets it (session/endpoint.py ``with_listing_door``)
LISTING_DOOR = "listing_door"
#: libdcap's active mode for every dcap transfer: the client connects to the pool's
#: mover instead of waiting for the pool's call back (dccp's -A); libdcap listens all
#: the same (drivers/dcap_mover.py), in the movers on loopback only
DCAP_ACTIVE = ("DCACHE_CLIENT_ACTIVE", "1")
#: the GSI credentials (CA folder, proxy: path, size and time) of this process's first
#: dcap client. libdcap's GSI tunnel keeps what it loaded first for the life of the
#: process: a second dCache with another CA (the next embedded one of a test session,
#: side B of a paired run) had every request of this process refused ("control line
#: down", EIO), while a process of its own was served. A dcap client with other
#: credentials than these makes all its requests, the namespace's too, in its movers
_DCAP_FIRST_CREDENTIALS: list[tuple[str, ...]] = []
_CHUNK = 8 * 1024 * 1024
_TIMEOUT_ERRNOS = {errno.ETIMEDOUT, errno.ECANCELED}
_UNREACHABLE_ERRNOS = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.EHOSTDOWN,
                       errno.ENETUNREACH, errno.ECONNRESET}


class Gfal2Driver(XRootDLogins, Driver):
    """One gfal2 context: one client of the storage."""

    name = "gfal2"
    isolate_clients = True  # its plugins (XrdCl, Globus) may crash their process
    schemes = (*HTTP_SCHEMES, *XROOTD_SCHEMES, "file", "srm", "gsiftp", *DCAP_SCHEMES)
    option_names = (*CREDENTIAL_ENVIRONMENT, LISTING_DOOR)
    secret_options = SECRET_OPTIONS

    @classmethod
    def protocol_of(cls, scheme: str) -> str:
        """Each scheme speaks its own protocol: XRootD, HTTP, a file, or srm/gsiftp."""
        if scheme in XROOTD_SCHEMES:
            return "xrootd"
        return "http" if scheme in HTTP_SCHEMES else scheme
    option_environment = CREDENTIAL_ENVIRONMENT

    @classmethod
    def has_checksum(cls, scheme: str) -> bool:
        """dcap has no checksum request (gfal2's dcap plug-in answers EPROTONOSUPPORT)."""
        return scheme not in DCAP_SCHEMES

    @classmethod
    def has_listing(cls, scheme: str) -> bool:
        """A dcap directory is not listed (:data:`DCAP_NO_LISTING`)."""
        return scheme not in DCAP_SCHEMES

    @classmethod
    def listing_door_option(cls, scheme: str) -> str | None:
        """Over dcap, :data:`LISTING_DOOR`: another door lists for the service
        connections."""
        return LISTING_DOOR if scheme in DCAP_SCHEMES else None

    @classmethod
    def check_options(cls, options) -> None:
        """A :data:`LISTING_DOOR` must be an XRootD or HTTP door's URL (gfal2 lists
        those), without credentials; then the credentials (:class:`XRootDLogins`)."""
        door = options.get(LISTING_DOOR)
        if door:
            try:
                parts = split_url(door)
            except EndpointError:
                parts = None
            scheme = parts.scheme.lower() if parts is not None else ""
            if parts is None or not (cls.is_xrootd(scheme) or cls.is_http(scheme)):
                raise StorageScaleUsageError(
                    f"--storage-driver-option {LISTING_DOOR}={door!r}: not the URL of an "
                    f"XRootD or WebDAV door. Name the test area through another door of "
                    f"the same namespace, e.g. {LISTING_DOOR}=root://door:1094//pnfs/area: "
                    f"a dcap client's set-up and clean-up list directories through it.")
            if parts.username or parts.password:
                raise StorageScaleUsageError(
                    f"--storage-driver-option {LISTING_DOOR}: give the URL without user or "
                    f"password (the dcap client's own credentials, x509_proxy or token, "
                    f"log in there too).")
        super().check_options(options)

    def __init__(self, endpoint, **kwargs) -> None:
        # the environment (CA, credentials) is set before the context loads its plugins
        super().__init__(endpoint, **kwargs)
        if endpoint.scheme in DCAP_SCHEMES:  # read by libdcap at each transfer
            os.environ[DCAP_ACTIVE[0]] = DCAP_ACTIVE[1]
        if endpoint.scheme == "gsiftp":
            self._check_descriptors("login", "")
        self._srm = endpoint.scheme == "srm"
        #: gfal2 failed a listing of this SRM door: list with the driver's own srmLs
        self._own_srm_ls = False
        self._context = self._new_context()
        self._stage: dict[int, tuple[bytes, str]] = {}
        self._stage_lock = threading.Lock()
        port = f":{endpoint.port}" if endpoint.port else ""
        self._xroot = self.is_xrootd(endpoint.scheme)
        login = f"{self.client_id}@" if self._xroot else ""
        sep = "/" if self._xroot else ""
        self._prefix = f"{endpoint.scheme}://{login}{endpoint.netloc_host}{port}{sep}"
        if self._srm:
            # the full SURL names the service path: gfal2 neither asks the BDII nor
            # warns, on every request, that it guesses the default path
            from .srm import SERVICE_PATH

            self._prefix = f"srm://{endpoint.netloc_host}{port}{SERVICE_PATH}?SFN="
        self._http = self.is_http(endpoint.scheme)
        self._gridftp = endpoint.scheme == "gsiftp"
        #: dcap has no checksum request (gfal2's dcap plug-in: EPROTONOSUPPORT): its
        #: copies are verified by the content read back, not by the storage's checksum
        self._dcap = endpoint.scheme in DCAP_SCHEMES
        #: where this client's dcap data moves: processes bound to loopback (libdcap
        #: listens on every interface otherwise: drivers/dcap_mover.py); None: here
        self._movers = Movers(self) if self._dcap and not contained() else None
        #: this dcap client's credentials are not the process's first (libdcap's GSI
        #: tunnel would present those): every request goes through its movers
        self._apart = self._movers is not None and not _first_dcap_credentials(
            self.options)
        #: the client of :data:`LISTING_DOOR` that lists for a dcap service connection
        self._lister: Gfal2Driver | None = None
        #: on HTTP doors what writes or removes goes through the http driver (module doc)
        self._writer = self._http_writer() if self._http else None

    def _new_context(self) -> gfal2.Gfal2Context:
        """A gfal2 context with this client's settings."""
        context = new_context()
        seconds = max(1, int(round(self.timeout)))
        for group, key in (("CORE", "NAMESPACE_TIMEOUT"), ("CORE", "CHECKSUM_TIMEOUT"),
                           ("HTTP PLUGIN", "OPERATION_TIMEOUT")):
            context.set_opt_integer(group, key, seconds)
        context.set_user_agent("pytest-storagescale", "0.1")
        # gfal2 would otherwise ask the server for a bearer token before every request
        context.set_opt_boolean("HTTP PLUGIN", "RETRIEVE_BEARER_TOKEN", False)
        if self._srm:
            # dCache's SRM door (Jetty) answers a kept-alive connection's second request
            # with nothing: "Unknown SOAP error (6)" (dCache 10.2 and 11.2)
            context.set_opt_boolean("SRM PLUGIN", "KEEP_ALIVE", False)
            # else every SRM request first asks the grid's information system (LDAP to
            # lcg-bdii.cern.ch) for the endpoint, which the URL already names
            context.set_opt_boolean("BDII", "ENABLED", False)
        return context

    def _http_writer(self) -> HTTPDriver:
        """The http driver that makes this client's mutating requests on an HTTP door:
        the same URL, client name, timeout and writable root, the options it takes (a
        token only over TLS, where it is sent)."""
        secure = self.endpoint.scheme in HTTPS_SCHEMES
        options = {key: value for key, value in self.options.items()
                   if key in HTTPDriver.option_names and (secure or key != "token")}
        return HTTPDriver(self.endpoint, client_id=self.client_id, timeout=self.timeout,
                          writable_root=self.writable_root, options=options)

    @classmethod
    def request_line(cls, options) -> str | None:
        return ("requests: through gfal2; on davs://, https://, dav:// and http:// doors "
                "what writes or removes (mkdir, put, delete, rmdir, rename) through the "
                "http driver (libcurl), which follows its redirects only to the same path "
                "(gfal2's HTTP plugin follows every redirect)")

    @classmethod
    def in_shard_process(cls) -> None:
        """gfal2's root:// plugin drives the process's XRootD client library: a shard
        process gives it the xrootd driver's event loops per process."""
        configure_xrootd_shard()

    def _check_descriptors(self, operation: str, path: str) -> None:
        """Refuse, with the fix, a gsiftp:// client or request whose sockets would be
        numbered near 1024: Globus would abort the whole process ("bit out of range 0 -
        FD_SETSIZE"). A probe costs microseconds; a GridFTP request, milliseconds."""
        probe = os.open(os.devnull, os.O_RDONLY)
        os.close(probe)  # the number the next socket would get
        if probe < _SELECT_LIMIT - _GRIDFTP_MARGIN:
            return
        raise StorageError(
            f"gsiftp:// through gfal2 cannot make another request in this process: "
            f"its next descriptor would be number {probe}, and Globus (GridFTP's client "
            f"library, which waits with select()) aborts the whole process on one above "
            f"{_SELECT_LIMIT - 1}. Idle root:// connections of earlier steps stay open for "
            f"the XRootD client's DataServerTTL (300 s), and each GridFTP client holds a "
            f"control and a data connection. To fix it, run the gsiftp:// tests in a "
            f"pytest run of their own, or with fewer clients per step.",
            driver=self.name, endpoint=self.endpoint.server, operation=operation, path=path,
            error_class="client_limit", native_status=f"descriptor {probe}",
        )

    def _url(self, path: str) -> str:
        if self._http:  # a path with spaces or brackets is still one URL path
            return f"{self._prefix}{quote(path, safe='/-._~')}"
        return f"{self._prefix}{path}"

    def _error(self, exc: gfal2.GError, operation: str, path: str) -> StorageError:
        code, message = exc.code, (exc.message or str(exc)).strip()
        kwargs = dict(
            driver=self.name, endpoint=self.endpoint.server, operation=operation, path=path,
            native_status=f"GError code={code} ({errno.errorcode.get(code, '?')})",
        )
        lowered = message.lower()
        if "http 429" in lowered:  # davix: "Result HTTP 429 : Unexpected server error"
            return StorageThrottled(
                f"the server throttled the request: {message} (gfal2 does not wait; the "
                f"driver sent it again each {THROTTLE_WAIT:g} s while half its deadline "
                f"allowed)", error_class="throttled", **kwargs)
        if self.endpoint.scheme == "gsiftp" and _GRIDFTP_LOGIN_REFUSED.search(
                _URL.sub("", message)):
            # GridFTP's 530 / a GSS failure: the login was refused (no proxy, a CA the
            # server does not trust, no grid-mapfile entry), not the server's certificate
            return StoragePermissionDenied(login_refusal(message, self.options),
                                           error_class="auth", **kwargs)
        if "certificate" in lowered or "ssl" in lowered or "tls" in lowered:
            ca_dir = os.environ.get("X509_CERT_DIR", "/etc/grid-security/certificates")
            return StorageUnreachable(
                f"TLS verification failed: {message}. The client checks the server's "
                f"certificate against X509_CERT_DIR ({ca_dir}); install the CA there or "
                f"point X509_CERT_DIR at it",
                error_class="tls", **kwargs,
            )
        if self._dcap and "directory is not empty" in lowered:
            # libdcap's rmdir of a full directory: gfal2 gives it no errno of its own
            # (measured: "number : 30"); the clean-up then lists it (listing_door)
            return StorageError(message, error_class="not_empty", **kwargs)
        if code == errno.ECOMM:  # srm-ifce: "Communication error on send ... or timeout"
            return StorageError(message, error_class="communication", **kwargs)
        if code in _TIMEOUT_ERRNOS or "timeout" in lowered or "timed out" in lowered:
            return StorageTimeout(message, error_class="timeout", **kwargs)
        if code == errno.ENOENT:
            return StorageNotFound(message, error_class="not_found", **kwargs)
        if code in (errno.EACCES, errno.EPERM):
            return StoragePermissionDenied(message, error_class="permission", **kwargs)
        if code in _UNREACHABLE_ERRNOS:
            return StorageUnreachable(message, error_class="unreachable", **kwargs)
        return StorageError(message, error_class=f"errno_{errno.errorcode.get(code, code)}",
                            **kwargs)

    def _call(self, operation: str, path: str, function, *args):
        if self._gridftp:  # its sockets open now, not at login
            self._check_descriptors(operation, path)
        began, sends = time.monotonic(), 1
        while True:
            try:
                return function(*args)
            except gfal2.GError as exc:
                error = self._error(exc, operation, path)
            except UnicodeDecodeError as exc:  # the bindings decode names, values as UTF-8
                raise BadAnswer(f"the answer holds {exc.object[:80]!r}, not UTF-8 text",
                                driver=self.name, endpoint=self.endpoint.server,
                                operation=operation, path=path,
                                error_class="bad_answer") from None
            except TypeError as exc:  # gfal2-python 1.12 could not make its GError: seen on
                # srm:// stat and checksum of a UTF-8 name (dCache 11.2.5), its message lost
                raise BadAnswer(f"gfal2's Python bindings failed to raise the request's "
                                f"error ({exc}): its message is lost",
                                driver=self.name, endpoint=self.endpoint.server,
                                operation=operation, path=path,
                                error_class="bad_answer") from None
            if not isinstance(error, StorageThrottled):
                raise error
            # gfal2 (davix) neither waits nor tells the Retry-After: the http driver's rule
            left = began + self.timeout * THROTTLE_SHARE - time.monotonic()
            if THROTTLE_WAIT > left or sends >= THROTTLE_SENDS:
                raise error
            if self.pause(THROTTLE_WAIT):  # the step stopped (Ctrl-C, its end)
                raise error
            sends += 1

    # -- namespace -----------------------------------------------------------
    def connect(self) -> None:
        """Log in now with a ``stat`` of the test area, before the step's clock: over
        gsiftp:// the first request of a context is its GSI handshake (seconds on a busy
        machine, in a client process that starts with each step), and the gridftp
        plugin keeps that session for the requests after it (``SESSION_REUSE``)."""
        path = self.endpoint.path
        if self._apart:  # a mover logs in (_DCAP_FIRST_CREDENTIALS)
            self._in_mover("_stat", path)
            return
        self._call("login", path, self._context.stat, self._url(path))
        if self._movers is not None:  # its first mover's start is no request's time
            self._movers.start()

    def _in_mover(self, request: str, path: str, *args):
        """A namespace request of a client :attr:`_apart`, served by a mover."""
        assert self._movers is not None  # _apart: a dcap client outside a mover
        return self._movers.call(request, path, *args)

    def _stat(self, path: str) -> StatInfo:
        # gfal2's SRM plugin answers every other stat of a path from its cache (a
        # server's answer is kept until the next stat takes it): a context of its own
        # (1.4 ms here) makes each stat the server's
        if self._apart:
            return self._in_mover("_stat", path)
        context = self._new_context() if self._srm else self._context
        info = self._call("stat", path, context.stat, self._url(path))
        return StatInfo(size=info.st_size, is_dir=stat_module.S_ISDIR(info.st_mode),
                        modified=float(info.st_mtime))

    def _ls(self, path: str) -> list[str]:
        if self._dcap:  # dc_opendir: never sent (DCAP_NO_LISTING)
            return self._listed_elsewhere(path)
        if self._srm and self._own_srm_ls:
            return self._srm_ls(path)
        try:
            names = self._call("ls", path, self._context.listdir, self._url(path))
        except StorageError as exc:
            if not (self._srm and exc.error_class == "communication"):
                raise
            # gfal2 2.21 fails every srm:// listing of 4 or more entries, which the
            # door answers (docs/drivers.md, SRM): this client lists with its own srmLs
            self._own_srm_ls = True
            return self._srm_ls(path)
        return sorted(n for n in names if n not in (".", ".."))

    def _listed_elsewhere(self, path: str) -> list[str]:
        """A dcap directory's names, listed through :data:`LISTING_DOOR` (the same path
        below that door's test area) for a service connection; a load client (one the
        engine gave its step's stop, :attr:`Driver.halted`) or a client without that
        door is refused before anything is sent."""
        door = self.options.get(LISTING_DOOR)
        why = DCAP_NO_LISTING
        if door and self.halted is not None:
            why += ("; a load client never lists through the other door (its step would "
                    "measure that door, not dcap)")
        elif door:
            with self._stage_lock:  # the clean-up lists from several threads
                if self._lister is None:
                    options = {k: v for k, v in self.options.items() if k != LISTING_DOOR}
                    self._lister = Gfal2Driver(
                        type(self).parse_endpoint(door), client_id=self.client_id,
                        timeout=self.timeout, writable_root=None, options=options)
                lister = self._lister
            area, other = self.endpoint.path.rstrip("/"), lister.endpoint.path.rstrip("/")
            if path.rstrip("/") == area or path.startswith(area + "/"):
                return lister.ls(other + path.rstrip("/")[len(area):])
            why = (f"{path} is outside the dcap door's test area {area}: not listed "
                   f"through {lister.endpoint.display}")
        raise StorageError(why, driver=self.name, endpoint=self.endpoint.server,
                           operation="ls", path=path, error_class="unsupported")

    def _mkdir(self, path: str) -> None:
        if self._apart:
            return self._in_mover("_mkdir", path)
        if self._writer is not None:
            return self._writer.mkdir(path)
        self._call("mkdir", path, self._context.mkdir_rec, self._url(path), 0o755)

    def _not_empty(self, exc: StorageError) -> bool:  # type: ignore[override]  # base: static
        if self._writer is not None:  # the http driver's refusal (not_empty)
            return super()._not_empty(exc)
        # gfal2 reports rmdir of a non-empty directory as EIO (davs: HTTP 500) or ENODEV
        # (root), as it would a link's refusal; only ENOTDIR says it is no directory
        return "ENOTDIR" not in exc.native_status

    def _mkdir_exclusive(self, path: str) -> None:
        if self._apart:
            return self._in_mover("_mkdir_exclusive", path)
        if self._writer is not None:
            return self._writer.mkdir(path, parents=False)
        # gfal2's plain mkdir: fails when the path exists or its parent does not
        self._call("mkdir", path, self._context.mkdir, self._url(path), 0o755)

    def _delete(self, path: str) -> None:
        if self._apart:
            return self._in_mover("_delete", path)
        if self._writer is not None:
            return self._writer.delete(path)
        self._call("delete", path, self._context.unlink, self._url(path))

    def _rmdir(self, path: str) -> None:
        if self._apart:
            return self._in_mover("_rmdir", path)
        if self._writer is not None:
            return self._writer.rmdir(path)
        self._call("rmdir", path, self._context.rmdir, self._url(path))

    def _rename(self, source: str, target: str) -> None:
        if self._apart:
            return self._in_mover("_rename", source, target)
        if self._writer is not None:
            return self._writer.rename(source, target)
        self._call("rename", source, self._context.rename, self._url(source), self._url(target))

    def _checksum(self, path: str, algorithm: str) -> str:
        if self._dcap:
            raise StorageError("the dcap protocol has no checksum request",
                               driver=self.name, endpoint=self.endpoint.server,
                               operation="checksum", path=path, error_class="checksum_type")
        return self._call("checksum", path, self._context.checksum, self._url(path),
                          algorithm.upper())

    def _version(self) -> str:
        """The HTTP door's ``Server`` header; an SRM door's ``srmPing``
        ``backend_version`` (:mod:`.srm`: gfal2 hands out only its ``backend_type``).
        gfal2 has no request for a server's version over the other protocols (its xroot
        plugin answers checksum and space queries only)."""
        if self.endpoint.scheme == "srm":
            from .srm import srm_ping

            answer = srm_ping(self.endpoint, ca_dir=self.options.get("ca_dir"),
                              x509_proxy=self.options.get("x509_proxy"),
                              timeout=self.timeout)
            if answer.backend_version:
                return answer.backend_version
            raise StorageError(
                f"the SRM door's srmPing names no backend_version (it answered SRM "
                f"{answer.srm_version or '?'}, {answer.info or 'no other information'}). "
                f"Give the version: --storage-version VERSION",
                driver=self.name, endpoint=self.endpoint.server, operation="version",
                path=self.endpoint.path, error_class="version")
        if self._http:
            from .version import server_header_version

            return server_header_version(
                self.endpoint, ca_dir=self.options.get("ca_dir"),
                x509_proxy=self.options.get("x509_proxy"), token=self.options.get("token"),
                timeout=self.timeout,
            )
        raise StorageError(
            f"gfal2 cannot ask a {self.endpoint.scheme}:// server for its version (the "
            f"version chooses the thresholds file). Give it: --storage-version VERSION "
            f"skips the detection" + ("; or use --storage-driver xrootd, which asks the "
                                      "server" if self._xroot else ""),
            driver=self.name, endpoint=self.endpoint.server, operation="version",
            path=self.endpoint.path, error_class="version",
        )

    # -- data ----------------------------------------------------------------
    def _put(self, path: str, data: bytes) -> int:
        """Upload like ``gfal-copy``/``lcg-cr``: a local file copied to the storage,
        overwriting, ADLER32 verified end to end. (gfal2's streaming ``open('w')``
        cannot overwrite over WebDAV.) On an HTTP door: the http driver's ``PUT``."""
        if self._writer is not None:
            return self._writer.put(path, data)
        if self._movers is not None:
            return self._movers.call("_upload", path, self._staged(data))
        return self._upload(path, self._staged(data))

    def _upload(self, path: str, local: str) -> int:
        """The local file ``local`` copied to ``path`` (:meth:`_put`); its size."""
        params = self._context.transfer_parameters()
        params.overwrite = True
        params.create_parent = True
        params.timeout = max(1, int(round(self.timeout)))
        params.set_checksum(gfal2.checksum_mode.none if self._dcap
                            else gfal2.checksum_mode.both, "ADLER32", "")
        self._call("put", path, self._context.filecopy, params, f"file://{local}",
                   self._url(path))
        return os.path.getsize(local)

    def _staged(self, data: bytes) -> str:
        """A local file holding ``data``, made once per data object and driver (load
        steps upload the same payload over and over; the set-up uploads in parallel)."""
        with self._stage_lock:
            staged = self._stage.get(id(data))
            if staged is None:
                handle, local = tempfile.mkstemp(prefix="storagescale-put-")
                with os.fdopen(handle, "wb") as stream:
                    stream.write(data)
                # keeping data referenced keeps its id from being reused
                staged = self._stage[id(data)] = (data, local)
            return staged[1]

    def _get(self, path: str, local_path: str | None) -> int:
        if self._movers is not None:
            return self._movers.call("_get", path, local_path)
        if local_path:
            return self.copy_out(path, local_path)
        if self._srm:
            return len(self._copied(path, "get"))

        return self._call("get", path, lambda: sum(map(len, self._chunks(path))))

    def _chunks(self, path: str) -> Iterator[bytes]:
        """The file from its start to its end, read in chunks of :data:`_CHUNK`."""
        handle = self._context.open(self._url(path), "r")
        while chunk := handle.read_bytes(_CHUNK):
            yield chunk

    def copy_out(self, path: str, local_path: str) -> int:
        """Copy to local disk like ``lcg-cp``/``gfal-copy``, ADLER32 verified end to end.
        From srm:// with a context of its own: gfal2 2.21 crashed (SIGSEGV) on the second
        copy out of an SRM door through one context (dCache 11.2.5)."""
        if self._movers is not None:
            return self._movers.call("copy_out", path, os.path.abspath(local_path))
        context = self._new_context() if self._srm else self._context
        params = context.transfer_parameters()
        params.overwrite = True
        params.timeout = max(1, int(round(self.timeout)))
        params.set_checksum(gfal2.checksum_mode.none if self._dcap
                            else gfal2.checksum_mode.both, "ADLER32", "")
        self._call("get", path, context.filecopy, params, self._url(path),
                   f"file://{os.path.abspath(local_path)}")
        return os.path.getsize(local_path)

    def _copied(self, path: str, operation: str) -> bytes:
        """The file copied out whole (``lcg-cp``) to a temporary file and read. gfal2
        2.21 opens an srm:// file only through a TURL of its ``TURL_PROTOCOLS`` (gsiftp,
        dcap...: dCache offered none of them), and with https there, ``pread`` and a
        second ``open`` crashed the process (SIGSEGV, dCache 11.2.5): a copy does not."""
        with tempfile.TemporaryDirectory(prefix="storagescale-get-") as folder:
            local = os.path.join(folder, "data")
            try:
                self.copy_out(path, local)
            except StorageError as exc:
                exc.operation = operation
                raise
            with open(local, "rb") as stream:
                return stream.read()

    def _read(self, path: str, offset: int, size: int) -> bytes:
        if self._movers is not None:
            return self._movers.call("_read", path, offset, size)
        if self._gridftp:
            return self._whole(path, "read")[offset:offset + size]
        if self._srm:
            return self._copied(path, "read")[offset:offset + size]

        def read() -> bytes:
            return self._context.open(self._url(path), "r").pread_bytes(offset, size)
        return self._call("read", path, read)

    def _readv(self, path: str, chunks: list[tuple[int, int]]) -> int:
        if self._movers is not None:
            return self._movers.call("_readv", path, chunks)
        if self._gridftp or self._srm:
            data = self._copied(path, "readv") if self._srm else self._whole(path, "readv")
            return sum(len(data[o:o + s]) for o, s in chunks)

        def readv() -> int:
            handle = self._context.open(self._url(path), "r")
            return sum(len(handle.pread_bytes(o, s)) for o, s in chunks)
        return self._call("readv", path, readv)

    def _whole(self, path: str, operation: str) -> bytes:
        """The file read to its end. Over gsiftp:// a partial read is a partial
        transfer that gfal2 2.21's GridFTP plugin aborts once it has the bytes, and the
        abort races with the transfer's own callbacks: beside ``stress-ng --cpu 4`` it
        crashed the process (SIGSEGV in ``pread_bytes``) in 11 of 30 runs of a short
        sequence. A transfer read to its end is never aborted."""
        return self._call(operation, path, lambda: b"".join(self._chunks(path)))

    def counters(self) -> dict[str, float]:
        """The http driver's, which makes this client's writes on an HTTP door (gfal2
        follows its reads' redirects without telling)."""
        return self._writer.counters() if self._writer is not None else {}

    def _srm_ls(self, path: str) -> list[str]:
        """``path``'s names by the driver's own srmLs (:func:`.srm.srm_ls`)."""
        from .srm import srm_ls

        port = f":{self.endpoint.port}" if self.endpoint.port else ""
        # a SURL is a URI: dCache's SRM door decodes %20, and refuses a raw space
        surl = f"srm://{self.endpoint.netloc_host}{port}{quote(path, safe='/-._~')}"
        return srm_ls(self.endpoint, surl, path,
                      ca_dir=self.options.get("ca_dir"),
                      x509_proxy=self.options.get("x509_proxy"), timeout=self.timeout)

    def close(self) -> None:
        self._context = None
        if self._movers is not None:
            self._movers.close()
        if self._writer is not None:
            self._writer.close()
        with self._stage_lock:
            lister, self._lister = self._lister, None
        if lister is not None:
            lister.close()
        with self._stage_lock:
            for _, local in self._stage.values():
                os.unlink(local)
            self._stage.clear()


def _first_dcap_credentials(options) -> bool:
    """Whether a dcap client with these driver options presents the GSI credentials
    of this process's first dcap client (:data:`_DCAP_FIRST_CREDENTIALS`; the first
    client's are recorded)."""
    def part(option: str) -> tuple[str, ...]:
        value = options.get(option) or os.environ.get(CREDENTIAL_ENVIRONMENT[option], "")
        try:
            found = os.stat(value) if value else None
        except OSError:
            found = None
        return (value, *((str(found.st_size), str(found.st_mtime_ns)) if found else ()))

    credentials = (*part("ca_dir"), *part("x509_proxy"))
    with _DCAP_LOCK:
        if not _DCAP_FIRST_CREDENTIALS:
            _DCAP_FIRST_CREDENTIALS.append(credentials)
        return _DCAP_FIRST_CREDENTIALS[0] == credentials


_DCAP_LOCK = threading.Lock()
