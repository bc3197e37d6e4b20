"""The doors of the storage under test: one client per protocol on one namespace.

The embedded server offers every door it serves (the embedded xrootd: ``root`` and
``davs``); a remote storage offers its ``--storage-endpoint`` (named by its scheme)
and the named ``--storage-door NAME=URL`` extra doors (ini ``storage_doors``). Each
door's clients may write only inside this run's directory as that door sees it
(``<door's test area>/<run id>``): the same guard as the session's own clients.

A door whose driver lists no directory over it (dcap) gets another door of the same
storage for its service connections' listings (:attr:`Door.listing_door`, chosen by
:func:`~.endpoint.with_listing_door`): its steps' and checks' clean-up lists there and
removes through the door itself, only what the run made, as through any door. That the
listing door shows the same namespace is checked before the door's first step: this
run's owner file must be listed in the run directory through it.

The *main* door is the endpoint's own (the embedded server's
``--storage-embedded-protocol``, or the scheme of ``--storage-endpoint``): the one
the load steps use unless ``--storage-load-doors`` names others, and the one a
baseline written without doors is matched against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from ..drivers.base import OWNER_FILE, Driver
from ..drivers.registry import DriverSpec
from ..errors import EndpointError, StorageError, StorageNotFound, StorageScaleUsageError
from .endpoint import EndpointUnderTest, endpoint_door_names, split_client

if TYPE_CHECKING:
    from ..config import Settings
    from .area import RunArea

#: deadline of one request when no hang timeout is set
DOOR_TIMEOUT = 60.0


@dataclass(frozen=True)
class Door:
    """One door: its name (test ids), its client spec and this run's directory on it."""

    name: str
    spec: DriverSpec
    #: this run's directory as the door names it
    run_dir: str
    timeout: float = DOOR_TIMEOUT

    @property
    def scheme(self) -> str:
        return self.spec.endpoint.scheme

    @property
    def display(self) -> str:
        return self.spec.endpoint.display

    @property
    def is_xrootd(self) -> bool:
        """It speaks XRootD (its driver class tells: :meth:`Driver.is_xrootd`)."""
        return self.spec.driver_class.is_xrootd(self.scheme)

    @property
    def is_http(self) -> bool:
        """It speaks HTTP (WebDAV)."""
        return self.spec.driver_class.is_http(self.scheme)

    @property
    def has_checksum(self) -> bool:
        """Its protocol has a checksum request (dcap has none: :meth:`Driver.has_checksum`)."""
        return self.spec.driver_class.has_checksum(self.scheme)

    @property
    def has_listing(self) -> bool:
        """Its client lists a directory (not through dcap: :meth:`Driver.has_listing`)."""
        return self.spec.driver_class.has_listing(self.scheme)

    @property
    def listing_door(self) -> str | None:
        """The door (its URL, no credentials) through which this door's service
        connections list, when its own protocol lists nothing (dcap); None: itself."""
        option = self.spec.driver_class.listing_door_option(self.scheme)
        return self.spec.options.get(option) if option else None

    def url(self, path: str) -> str:
        """The URL of the absolute ``path`` through this door (XRootD's ``//path``)."""
        return self.spec.driver_class.url_of(self.spec.endpoint, path)

    def client(self, label: str) -> Driver:
        """A new client of this door (its own connection and login)."""
        return self.spec.connect(label, timeout=self.timeout)

    def path(self, *parts: str) -> str:
        """A path inside this run's directory on this door."""
        return "/".join([self.run_dir, *parts])


class Run(Protocol):
    """What the doors read of the session's run (a
    :class:`~pytest_storagescale.session.StorageRun`, which builds on this module: the
    caller hands it in; a conftest gets it from ``storage_run(config)``)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def endpoint(self) -> EndpointUnderTest: ...

    @property
    def run_id(self) -> str: ...

    @property
    def area(self) -> RunArea: ...


def door_names(run: Run) -> tuple[str, ...]:
    """The doors' names, known at collection (before any server starts)."""
    return endpoint_door_names(run.endpoint)


def door_urls(run: Run) -> dict[str, str]:
    """Door name -> URL of its test area (starts the embedded server when needed)."""
    return dict(run.endpoint.resolved.door_urls)


def door_spec(spec: DriverSpec, run_id: str) -> tuple[DriverSpec, str]:
    """A door's resolved client spec (:attr:`ResolvedEndpoint.door_specs`) guarded to
    this run's directory on it, and that directory."""
    run_dir = f"{spec.endpoint.path.rstrip('/')}/{run_id}"
    return replace(spec, writable_root=run_dir), run_dir


def build_doors(run: Run) -> dict[str, Door]:
    """Every door with a client spec guarded to this run's directory on it: the
    endpoint's driver for the main one, the other doors' by their scheme, each with
    the options (merged from the embedded server and ``--storage-driver-option``) its
    driver takes (:attr:`ResolvedEndpoint.door_specs`)."""
    timeout = run.settings.hang_timeout or DOOR_TIMEOUT
    doors = {}
    for name, resolved in run.endpoint.resolved.door_specs.items():
        spec, run_dir = door_spec(resolved, run.run_id)
        doors[name] = Door(name, spec, run_dir, timeout)
    return doors


def load_door(run: Run, name: str | None) -> Door:
    """The door a load step runs over: ``name``, or the main door when None. The main
    door's spec is the session's own (:meth:`EndpointUnderTest.driver_spec`)."""
    what = (f"the embedded {run.endpoint.embedded_kind}'s {name} door"
            if run.endpoint.is_embedded else f"--storage-door {name}")
    return open_door(
        run.endpoint, run.area.ensure(), run.run_id, name,
        run.settings.hang_timeout or DOOR_TIMEOUT, run.area.door_checks, what=what,
        unknown=(f"--storage-load-doors: unknown door {name!r}. The doors of this "
                 f"storage: {', '.join(run.endpoint.resolved.door_urls)}."))


def open_door(endpoint: EndpointUnderTest, run_dir: str, run_id: str, name: str | None,
              timeout: float, checks: dict[str, str | None], *, what: str,
              unknown: str) -> Door:
    """``endpoint``'s door ``name`` (its main door when None or the main door's name)
    guarded to this run's directory ``run_dir``; another door is checked once
    (``checks``, by name: :func:`door_problem` on ``what``). ``unknown``: the usage
    error's paragraph when the endpoint has no such door."""
    resolved = endpoint.resolved
    if name is None or name == resolved.main_door:
        return Door(resolved.main_door, resolved.driver_spec(run_dir), run_dir, timeout)
    if split_client(name)[0] not in resolved.door_urls:
        raise StorageScaleUsageError(unknown)
    spec, door_dir = door_spec(resolved.door_spec(name), run_id)
    door = Door(name, spec, door_dir, timeout)
    if name not in checks:
        checks[name] = door_problem(door, what, run_dir_made=True)
    if checks[name]:
        raise EndpointError(str(checks[name]))
    return door


def door_problem(door: Door, what: str, *, run_dir_made: bool) -> str | None:
    """Why ``door`` cannot be written through (None: it can). Its test area (the parent
    of its run directory) must exist: the plugin makes only the run directory, never
    an area or its parents. ``run_dir_made``: the run directory was made through the
    endpoint, and the door (the same storage) must show it."""
    area = door.run_dir.rstrip("/").rpartition("/")[0] or "/"
    client = door.client("area-check")
    try:
        found = _kind(client, area)
        if found == "directory" and run_dir_made:
            if _kind(client, door.run_dir) != "directory":
                return (f"{what} {door.display}: this run's directory {door.run_dir} (made "
                        f"through the endpoint) is not there through this door. A door must "
                        f"name the endpoint's test area over its own protocol; the plugin "
                        f"makes no other directory.")
            if run_dir_made and not door.has_listing:
                return _listing_problem(door, client, what)
    except StorageError as exc:
        return f"{what} {door.display}: the test area {area} cannot be checked: {exc}"
    finally:
        client.close()
    if found == "directory":
        return None
    return (f"{what} {door.display}: the test area {area} {found}. The plugin makes only its "
            f"run directory inside an existing test area, never the area or its parents (a "
            f"typo would leave them behind). Create it first: "
            f"{door.spec.driver_class.create_command(door.spec.endpoint)}")


def _listing_problem(door: Door, client: Driver, what: str) -> str | None:
    """Why the door through which ``door`` lists (:attr:`Door.listing_door`) cannot
    serve its clean-up: none, or it does not show this run's owner file in the run
    directory (another namespace); None: it can."""
    listing = door.listing_door
    if not listing:
        return (f"{what} {door.display}: its protocol lists no directory, which the "
                f"clean-up of a step's or check's folder needs, and the storage has no "
                f"XRootD or WebDAV door to list through. Add one of the same namespace: "
                f"--storage-door NAME=URL (or, with this door as the endpoint, "
                f"--storage-driver-option listing_door=URL).")
    try:
        names = client.ls(door.run_dir)
    except StorageError as exc:
        return (f"{what} {door.display}: its clean-up lists through {listing}, which "
                f"could not list this run's directory {door.run_dir}: {exc}")
    if OWNER_FILE in names:
        return None
    return (f"{what} {door.display}: its clean-up lists through {listing}, which does "
            f"not show this run's owner file in {door.run_dir}: not the same namespace. "
            f"The session's first XRootD door (else WebDAV) lists for it: give the same "
            f"storage's test area there (--storage-door NAME=URL).")


def _kind(client: Driver, path: str) -> str:
    try:
        return "directory" if client.stat(path).is_dir else "is not a directory"
    except StorageNotFound:
        return "does not exist"


def folder_name(nodename: str) -> str:
    """A directory name for one test (its id without characters paths dislike)."""
    return re.sub(r"[^\w.-]+", "-", nodename).strip("-")
