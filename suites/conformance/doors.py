"""The doors of the storage under test: one client per protocol on one namespace.

The door resolution lives in the core package (:mod:`pytest_storagescale.session.doors`)
since the load steps run over doors too (``--storage-load-doors``); this module keeps
the names the conformance suite and other helpers import from it.
"""

from __future__ import annotations

from pytest_storagescale.session.doors import (
    DOOR_TIMEOUT,
    Door,
    build_doors,
    door_names,
    door_urls,
    folder_name,
    main_door_name,
)

__all__ = ["DOOR_TIMEOUT", "Door", "build_doors", "door_names", "door_urls", "folder_name",
           "main_door_name"]
