"""Seed 002's "with XCache" steps: the set-up writes through the gateway, the load
clients read through an XCache door in front of it (as RAL's worker nodes read Echo).

XRootD 5.5's file cache is read-only, so a step cannot be set up through the door:
``read_xcache``, ``readv_xcache`` and ``get_xcache`` are ``read``, ``readv`` and
``get`` whose files are made (and removed) by the step's own connection to the
endpoint, while each load client reads the same paths through the door
(:func:`use_door`: its :class:`~pytest_storagescale.drivers.spec.DriverSpec`, the
same driver and options on the door's URL). The door's client is made on the
client's first repetition, so the warm-up pays its login.
"""

from __future__ import annotations

import threading

from pytest_storagescale import Driver, DriverSpec, Get, Read, ReadV, StorageScaleUsageError

#: the door the *_xcache steps of this process read through (set by the suite's fixture)
_door: list[DriverSpec] = []
#: the door's clients of this process: (door URL, client index) -> driver
_clients: dict[tuple[str, int], Driver] = {}
_lock = threading.Lock()


def use_door(spec: DriverSpec | None) -> None:
    """Read the ``*_xcache`` steps through ``spec`` (None: no door)."""
    _door[:] = [spec] if spec is not None else []


def door_client(door: DriverSpec, client: int, timeout: float) -> Driver:
    """Load client ``client``'s connection to the door (made once per step)."""
    key = (door.endpoint_url, client)
    with _lock:
        driver = _clients.get(key)
        if driver is None:
            driver = _clients[key] = door.client(client, timeout=timeout)
    return driver


def close_door_clients() -> None:
    with _lock:
        for driver in _clients.values():
            driver.close()
        _clients.clear()


class ThroughCache:
    """Set up through the endpoint, read through the door (a mixin before the
    operation it changes)."""

    def prepare(self, driver, workdir, params, clients):
        if not _door:
            raise StorageScaleUsageError(
                f"{self.name}: no XCache door to read through. Give its URL with "
                f"--storage-ceph-xcache root://xcache:1094//same/test/area, or run the "
                f"embedded Ceph gateway (--storage-embedded ceph), which has one.")
        context = super().prepare(driver, workdir, params, clients)
        context["door"] = _door[0]  # a DriverSpec: picklable, for spawned clients too
        return context

    def run(self, driver, client, iteration, context):
        door = door_client(context["door"], client, driver.timeout)
        return super().run(door, client, iteration, context)

    def cleanup(self, context):
        super().cleanup(context)
        close_door_clients()


class ReadThroughCache(ThroughCache, Read):
    """``read`` through the XCache door."""

    name = "read_xcache"


class ReadVThroughCache(ThroughCache, ReadV):
    """``readv`` through the XCache door."""

    name = "readv_xcache"


class GetThroughCache(ThroughCache, Get):
    """``get`` (whole-file copies) through the XCache door."""

    name = "get_xcache"


OPERATIONS = [ReadThroughCache(), ReadVThroughCache(), GetThroughCache()]
