"""The doors of the storage under test: one client per protocol on one namespace.

The doors come from the plugin (the ``storage_doors`` fixture; their names at
collection: ``storage_view(config).door_names``); this module keeps the names the
conformance suite and other helpers import from it.
"""

from __future__ import annotations

from pytest_storagescale import Door
from pytest_storagescale.conformance import folder_name

__all__ = ["Door", "folder_name"]
