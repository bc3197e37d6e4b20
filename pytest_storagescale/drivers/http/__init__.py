"""HTTP/WebDAV driver (libcurl through pycurl) for ``davs://``, ``https://``, ``dav://``
and ``http://`` doors: dCache's WebDAV door, XrdHttp, EOS, Apache mod_dav.

Chosen by measurement (docs/benchmarks.md, "HTTP clients"): a libcurl easy handle
per client releases the GIL for the whole request, costs a fraction of the CPU of
the pure-Python clients per request, and keeps up with h2load on the same door.

**One client, one connection.** A driver instance is one client: one easy handle
with its own connection, kept alive between requests, and its own TLS session cache,
so a connection the server closed is made again with a resumed TLS session. When
the session's own connections are used from several threads at once (the set-up
uploads in parallel) each thread gets a handle of its own.

**TLS** is always verified: against the grid CA folder (a hashed directory) of the
driver option ``ca_dir``, else ``$X509_CERT_DIR``, else
``/etc/grid-security/certificates`` -- never switched off. **Credentials**: an RFC
3820 proxy or a plain certificate in one PEM file (``x509_proxy``, else
``$X509_USER_PROXY``), or a certificate and key in two files (``x509_user_cert``
and ``x509_user_key``, else ``$X509_USER_CERT``/``$X509_USER_KEY``); a bearer token
(``token``, else ``$BEARER_TOKEN``, else the file ``$BEARER_TOKEN_FILE``), sent as
``Authorization: Bearer`` and never shown; or ``user:password@`` in the URL (basic
authentication). Over plain ``http://`` no credential is sent (a ``token`` option
there is a usage error).

**Every request has a deadline** (the driver's timeout, connection included).
**Checksums**: downloads ask for ``Want-Digest: adler32`` and compare the server's
``Digest`` with the adler32 of the bytes received; uploads compare the adler32 of
the data with the one the server gives after the upload (a ``HEAD``), as gfal2 and
``gfal-copy -K`` do; a mismatch is an error naming both values, and a server that
offers no adler32 is not asked again by that client. Driver option ``checksum``:
``auto`` (the default) verifies on every door except XrdHttp (known from its
``Server`` header), where xrootd 5.5 crashes when checksums are asked for right
after uploads under load (xrootd/xrootd#2534) and announces a stale adler32 after an
overwrite within the same second; ``adler32`` verifies there too; ``none`` never.

**Deleting is careful**: a WebDAV ``DELETE`` of a collection is recursive on most
servers, and the plugin's clean-up relies on ``rmdir`` refusing a directory that has
entries. So :meth:`HTTPDriver._rmdir` lists the directory first (``PROPFIND Depth:
1``) and refuses one with entries (``not_empty``, as every driver does); only an
empty one is deleted. The window between the listing and the ``DELETE`` is a race:
an entry another client creates in it meanwhile is deleted with it (only inside the
run's own directory: every mutating call is guarded). A file is deleted with
``Depth: 0``, which a server such as Apache refuses for a collection.

**Redirects**: a read (``GET``, ``HEAD``, ``PROPFIND``) follows a redirect anywhere the
TLS trust allows (libcurl, at most 5; only to ``https://`` from an ``https`` door). A
mutating request (``PUT``, ``DELETE``, ``MKCOL``, ``MOVE``, ``COPY``, ``PROPPATCH``...)
follows one only to the same path (decoded, no ``.`` or ``..`` segment) on another
server, as a dCache door sends a client to its pool; anything else is refused, never
followed (:class:`~pytest_storagescale.errors.RedirectRefused`, ``redirect_refused``,
naming the ``Location``). Credentials go to the door only: on a redirect to another
scheme, host or port neither the ``Authorization`` header (token) nor ``user:password``
is sent (libcurl's own rule for reads: ``UNRESTRICTED_AUTH`` is never set; the same rule
here for mutating requests); the client certificate is presented to whichever server
the TLS trust accepts. Each followed redirect is counted (:attr:`HTTPDriver.redirects`,
with the door's share of the time in :attr:`HTTPDriver.door_seconds`). A ``PUT`` sends
no ``Content-Type`` (dCache's pool refuses one with 501) and, to a dCache door,
``Expect: 100-continue``, on which the door redirects the upload to its pool.

**Throttling**: a 429, or a 503 with ``Retry-After``, is waited out (``Retry-After``,
else 1 s) and the request sent again, while the waits end within half its deadline
(at most 20 sends); past that it is
:class:`~pytest_storagescale.errors.StorageThrottled` (``throttled``), which a load
step counts as ``throttled``, not ``failed`` (docs/drivers.md).

**Answers are bounded**: a metadata answer (a stat, the answer to a mutating request,
an error page) is read up to :data:`ANSWER_LIMIT` (4 MiB), a listing (``PROPFIND
Depth: 1``) and a third-party copy's markers up to :data:`LISTING_LIMIT` (64 MiB);
a longer answer is aborted as ``bad_answer``. A listing is parsed as it arrives (an
incremental XML parser), keeping each entry's name and kind, never the answer. Every
field read from an answer (sizes, dates, checksums, byte ranges) is checked: a
malformed one is ``bad_answer`` (:class:`~pytest_storagescale.errors.BadAnswer`).

**What a door is** (dCache, XrdHttp, another server) each client learns from the
``Server`` header of its first answer it reads headers of -- :meth:`HTTPDriver.connect`
asks, which a load client makes before the step's clock starts -- and keeps as its own
:attr:`HTTPDriver.door` (:class:`DoorServer`): never in a table of the process, so two
doors in one process, or a server that another replaces on the same port, are never
mixed up.

**Third-party copy** (HTTP TPC, WebDAV ``COPY``; XrdHttpTPC, dCache, EOS):
:meth:`HTTPDriver.pull` sends ``COPY`` to the destination with a ``Source:`` header,
:meth:`HTTPDriver.push` sends it to the source with a ``Destination:`` header; the
other server's credential (a bearer token) is forwarded in
``TransferHeaderAuthorization`` and ``Credential: none`` asks for no delegation. The
server answers at once and streams performance markers while it copies; the copy's
outcome is the body's last line (``success: ...``, ``failure: ...``), not the status
code. The whole ``COPY`` has the driver's deadline.


The package's modules, each with one job (the layers go down, none imports one above):

- :mod:`.driver`: :class:`HTTPDriver`, each storage operation as WebDAV requests;
- :mod:`._tpc`: third-party copy (``COPY``, :class:`CopyOutcome`);
- :mod:`._webdav`: readers of the answers (207 Multi-Status, listings as they arrive,
  ``Digest``, ``multipart/byteranges``, dates), no requests;
- :mod:`._transport`: the libcurl handles, deadlines, size limits, redirects and
  throttling (:class:`Body`, the answer);
- :mod:`._errors`: libcurl codes and HTTP statuses as the plugin's error types;
- :mod:`._door`: what a client learned of its door (:class:`DoorServer`).
"""

from __future__ import annotations

from ._door import DoorServer
from ._tpc import CopyOutcome
from ._transport import (
    ANSWER_LIMIT,
    LISTING_LIMIT,
    THROTTLE_SENDS,
    THROTTLE_SHARE,
    THROTTLE_WAIT,
    Body,
)
from .driver import HTTPDriver

__all__ = [
    "ANSWER_LIMIT",
    "LISTING_LIMIT",
    "THROTTLE_SENDS",
    "THROTTLE_SHARE",
    "THROTTLE_WAIT",
    "Body",
    "CopyOutcome",
    "DoorServer",
    "HTTPDriver",
]
