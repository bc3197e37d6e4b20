"""What it takes to make clients of an endpoint: a driver class, the endpoint URL,
the writable root and the driver options, as one picklable value.

A :class:`DriverSpec` is what the session hands to the engine, and what spawned
client processes (and, later, remote hosts) rebuild their clients from; nobody
builds a driver by hand. Its ``repr`` never shows a URL password or the value of
a secret option (a token).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..redact import redact_url
from .base import Driver
from .url import EndpointURL

#: the service connections a session opens besides the load clients
ROLES = ("admin", "version", "cleanup", "coordinator", "probe")


class DriverOptions(Mapping[str, str]):
    """Driver options, frozen and picklable (a ``MappingProxyType`` is not)."""

    __slots__ = ("_items",)

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        self._items = dict(options or {})

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:  # values may be secrets: DriverSpec shows them redacted
        return f"DriverOptions({', '.join(self._items)})"

    def __getstate__(self) -> dict[str, str]:
        return self._items

    def __setstate__(self, state: dict[str, str]) -> None:
        self._items = state


@dataclass(frozen=True, repr=False)
class DriverSpec:
    """A driver class bound to an endpoint, a writable root and options."""

    driver_class: type[Driver]
    endpoint_url: str
    #: mutating operations are refused outside this path (None: refuse all)
    writable_root: str | None = None
    options: Mapping[str, str] = field(default_factory=DriverOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.options, DriverOptions):
            object.__setattr__(self, "options", DriverOptions(self.options))

    @property
    def name(self) -> str:
        """The driver's registry name (``xrootd``, ``gfal2``...)."""
        return self.driver_class.name

    @functools.cached_property
    def endpoint(self) -> EndpointURL:
        return self.driver_class.parse_endpoint(self.endpoint_url)


    def client(self, index: int, *, timeout: float) -> Driver:
        """Load client ``index``: its own connection, its login name from the driver."""
        return self._make(self.driver_class.client_name(index), timeout)

    def connect(self, role: str, *, timeout: float) -> Driver:
        """A connection of its own for ``role``: the session's ``admin``, ``version``,
        ``cleanup``, ``coordinator``, ``probe``, or any other name for a test's own
        client (``functional-<name>``); the driver turns it into a login it accepts."""
        if not role:
            raise ValueError("a connection needs a role name")
        return self._make(self.driver_class.role_name(role), timeout)

    def _make(self, client_id: str, timeout: float) -> Driver:
        return self.driver_class(
            self.endpoint, client_id=client_id, timeout=timeout,
            writable_root=self.writable_root, options=self.options,
        )

    def __reduce__(self):
        # the class travels by its import path, looked up again where it is unpickled
        # (pickle's own by-reference check fails for a module imported twice, as an
        # in-process pytester run does)
        cls = self.driver_class
        return (_rebuild, (f"{cls.__module__}:{cls.__qualname__}", self.endpoint_url,
                           self.writable_root, dict(self.options)))

    def __repr__(self) -> str:
        secret = set(self.driver_class.secret_options)
        options = ", ".join(
            f"{key}={'***' if key in secret else repr(value)}"
            for key, value in self.options.items()
        )
        return (
            f"DriverSpec({self.name}, {redact_url(self.endpoint_url)!r}, "
            f"writable_root={self.writable_root!r}, options={{{options}}})"
        )


def _rebuild(class_path: str, endpoint_url: str, writable_root: str | None,
             options: dict[str, str]) -> DriverSpec:
    import importlib

    module, _, qualname = class_path.partition(":")
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    return DriverSpec(cls, endpoint_url, writable_root, options)
