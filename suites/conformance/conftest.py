"""The conformance suite's fixtures: ``storage_doors`` (every door of the storage)."""

from .fixtures import storage_doors  # noqa: F401 - the fixture, for this folder's tests
