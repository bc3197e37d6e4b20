"""The conformance suite's session fixture: the doors of the storage under test.

A suite gets it by importing it into its test module (or its ``conftest.py``)::

    from ..conformance.fixtures import storage_doors  # noqa: F401
"""

from __future__ import annotations

import pytest

from .doors import Door, build_doors


@pytest.fixture(scope="session")
def storage_doors(storage_endpoint, request: pytest.FixtureRequest) -> dict[str, Door]:
    """Door name -> :class:`Door`: every door of the storage, each guarded to this
    run's directory (which exists: ``storage_endpoint`` made it)."""
    return build_doors(request.config, storage_endpoint.driver_spec)
