"""What a client knows of its door: the ``Server`` header of the first answer it read
headers of (``dCache/9.2.4``, ``XrootD/v5.5.3``, ``Apache/2.4``). Two choices hang on
it: a ``PUT`` to a dCache door asks for ``100-continue`` (the door then redirects the
upload to a pool before the body is sent), and ``checksum=auto`` verifies transfers on
every door but XrdHttp.

Each client (:class:`~pytest_storagescale.drivers.http.HTTPDriver`) keeps its own,
learned on its first contact (:meth:`HTTPDriver.connect`, which a load client makes
before the step's clock starts, else the first request that reads headers): two doors
in one process, or a door that another server replaces on the same port, are never
mixed up (a process-wide table keyed by ``host:port`` did both)."""

from __future__ import annotations

from collections.abc import Mapping


class DoorServer:
    """The software behind one client's door, once an answer named it."""

    __slots__ = ("server",)

    def __init__(self, server: str | None = None) -> None:
        #: the Server header ("" when the answer had none); None: not learned yet
        self.server = server

    @property
    def known(self) -> bool:
        return self.server is not None

    def learn(self, headers: Mapping[str, str]) -> None:
        """Keep the ``Server`` header of ``headers`` (an answer's, names in lower
        case), unless one was learned before: the first answer names the door (later
        ones may be a pool's, after a redirect)."""
        if self.server is None:
            self.server = headers.get("server", "")

    @property
    def is_dcache(self) -> bool:
        return (self.server or "").lower().startswith("dcache")

    @property
    def is_xrdhttp(self) -> bool:
        return (self.server or "").lower().startswith("xrootd")

    def __repr__(self) -> str:
        return f"DoorServer({self.server!r})"
