"""Keys of the plugin's state in ``config.stash`` (no globals: xdist workers are
separate processes)."""

from __future__ import annotations

import pytest

from .session import StorageRun

storage_run_key = pytest.StashKey[StorageRun]()
