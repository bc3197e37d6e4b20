"""The doors of the storage under test: one client per protocol on one namespace.

The embedded server offers every door it serves (the embedded xrootd: ``root`` and
``davs``); a remote storage offers its ``--storage-endpoint`` (named by its scheme)
and the named ``--storage-door NAME=URL`` extra doors (ini ``storage_doors``). Each
door's clients may write only inside this run's directory as that door sees it
(``<door's test area>/<run id>``): the same guard as the session's own clients.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from pytest_storagescale.drivers.base import Driver
from pytest_storagescale.drivers.registry import DriverSpec, driver_spec
from pytest_storagescale.endpoints.family import embedded_class
from pytest_storagescale.endpoints.url import HTTP_SCHEMES, XROOTD_SCHEMES
from pytest_storagescale.session import StorageRun
from pytest_storagescale.stash import storage_run_key

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
        return self.scheme in XROOTD_SCHEMES

    @property
    def is_http(self) -> bool:
        return self.scheme in HTTP_SCHEMES

    def client(self, label: str) -> Driver:
        """A new client of this door (its own connection and login)."""
        return self.spec.connect(label, timeout=self.timeout)

    def path(self, *parts: str) -> str:
        """A path inside this run's directory on this door."""
        return "/".join([self.run_dir, *parts])


def _run(config: pytest.Config) -> StorageRun:
    return config.stash[storage_run_key]


def door_names(config: pytest.Config) -> tuple[str, ...]:
    """The doors' names, known at collection (before any server starts)."""
    run = _run(config)
    if run.endpoint.is_embedded:
        return tuple(dict.fromkeys(embedded_class(run.endpoint.embedded_kind).schemes))
    main = urlsplit(run.settings.endpoint).scheme.lower() or "endpoint"
    return tuple(dict.fromkeys([main, *(run.settings.doors or {})]))


def door_urls(config: pytest.Config) -> dict[str, str]:
    """Door name -> URL of its test area (starts the embedded server when needed)."""
    run = _run(config)
    if run.endpoint.is_embedded:
        return run.endpoint.door_urls()
    main = urlsplit(run.settings.endpoint).scheme.lower() or "endpoint"
    return {main: run.settings.endpoint, **{
        name: url for name, url in (run.settings.doors or {}).items() if name != main}}


def build_doors(config: pytest.Config, main: DriverSpec) -> dict[str, Door]:
    """Every door with a client spec guarded to this run's directory on it.

    ``main`` is the session's own spec (the endpoint's driver, options merged from the
    embedded server and ``--storage-driver-option``); the other doors get the options
    their driver takes."""
    run = _run(config)
    timeout = run.settings.hang_timeout or DOOR_TIMEOUT
    doors = {}
    for name, url in door_urls(config).items():
        cls = driver_spec(url).driver_class
        options = {k: v for k, v in main.options.items() if k in cls.option_names}
        area = driver_spec(url).endpoint.path.rstrip("/")
        run_dir = f"{area}/{run.run_id}"
        same = url == main.endpoint_url
        spec = driver_spec(url, driver=main.name if same else "auto", options=options,
                           writable_root=run_dir)
        doors[name] = Door(name, spec, run_dir, timeout)
    return doors


def folder_name(nodename: str) -> str:
    """A directory name for one test (its id without characters paths dislike)."""
    return re.sub(r"[^\w.-]+", "-", nodename).strip("-")
