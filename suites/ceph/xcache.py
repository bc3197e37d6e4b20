"""Seed 002's "with XCache" steps: the set-up writes through the gateway, the load
clients read through an XCache door in front of it (as RAL's worker nodes read Echo).

XRootD 5.5's file cache is read-only, so a step cannot be set up through the door:
``read_xcache``, ``readv_xcache`` and ``get_xcache`` are ``read``, ``readv`` and
``get`` whose files are made (and removed) by the step's own connection to the
endpoint, while each load client reads the same paths through the door. The door
comes with the step: ``storage_load.run(doors={"xcache": spec})``, its
:class:`~pytest_storagescale.drivers.spec.DriverSpec` (the same driver and options on
the door's URL), handed to ``prepare`` in the step context. Each client's connection
to the door is made on its first repetition (so the warm-up pays its login) and kept
in the step's context: one per client, in whichever process runs it.
"""

from __future__ import annotations

from pytest_storagescale import Get, Read, ReadV, StorageScaleUsageError

#: the step context's name of the door the *_xcache steps read through
DOOR = "xcache"


class ThroughCache:
    """Set up through the endpoint, read through the door (a mixin before the
    operation it changes)."""

    def prepare(self, driver, workdir, params, clients, step=None):
        door = step.doors.get(DOOR) if step is not None else None
        if door is None:
            raise StorageScaleUsageError(
                f"{self.name}: no XCache door to read through. Give its URL with "
                f"--storage-ceph-xcache root://xcache:1094//same/test/area, or run the "
                f"embedded Ceph gateway (--storage-embedded ceph), which has one.")
        context = super().prepare(driver, workdir, params, clients)
        context["door"] = door  # a DriverSpec: picklable, for spawned clients too
        # client index -> its connection to the door, made in the process that runs
        # the client (empty when the context is sent to a spawned process)
        context["door_clients"] = {}
        return context

    def run(self, driver, client, iteration, context):
        clients = context["door_clients"]
        door = clients.get(client)
        if door is None:  # only this client's thread makes its connection
            door = clients[client] = context["door"].client(client, timeout=driver.timeout)
        return super().run(door, client, iteration, context)

    def cleanup(self, context):
        super().cleanup(context)
        for door in list(context["door_clients"].values()):
            door.close()
        context["door_clients"].clear()


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
