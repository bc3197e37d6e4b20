"""Client libraries behind one small interface, chosen by URL scheme.

The registry imports a driver only when it is used (the XRootD and gfal2 bindings
are heavy and may be missing); a missing library gives an install hint instead of
an ImportError. :func:`driver_spec` resolves an endpoint URL to a
:class:`DriverSpec`, which builds the clients.
"""

from .base import Driver, StatInfo
from .registry import (
    driver_class,
    driver_names,
    driver_spec,
    known_schemes,
    register_driver,
)
from .spec import DriverSpec

__all__ = [
    "Driver",
    "DriverSpec",
    "StatInfo",
    "driver_class",
    "driver_names",
    "driver_spec",
    "known_schemes",
    "register_driver",
]
