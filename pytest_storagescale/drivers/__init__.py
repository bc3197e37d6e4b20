"""Client libraries behind one small interface, chosen by URL scheme.

The registry imports a driver only when it is used (the XRootD and gfal2 bindings
are heavy and may be missing); a missing library gives an install hint instead of
an ImportError.
"""

from .base import Driver, StatInfo
from .registry import driver_class, driver_name_for

__all__ = ["Driver", "StatInfo", "driver_class", "driver_name_for"]
