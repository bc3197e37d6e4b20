"""Lazy registry: URL scheme -> driver name -> driver class."""

from __future__ import annotations

import importlib

from ..errors import StorageScaleUsageError

#: driver name -> (module, class, what to install when the import fails)
DRIVERS: dict[str, tuple[str, str, str]] = {
    "xrootd": (
        "pytest_storagescale.drivers.xrootd", "XRootDDriver",
        "the XRootD Python bindings: 'apt-get install python3-xrootd' (Debian, then a venv "
        "with --system-site-packages) or 'pip install xrootd'",
    ),
    "gfal2": (
        "pytest_storagescale.drivers.gfal2", "Gfal2Driver",
        "gfal2-python: 'apt-get install python3-gfal2 gfal2-plugin-http gfal2-plugin-xrootd "
        "gfal2-plugin-file' (then a venv with --system-site-packages)",
    ),
    "local": ("pytest_storagescale.drivers.local", "LocalDriver", ""),
}

#: which driver serves a scheme when the user did not force one
DEFAULT_DRIVER = {
    "root": "xrootd", "xroot": "xrootd", "roots": "xrootd",
    "davs": "gfal2", "https": "gfal2", "dav": "gfal2", "http": "gfal2",
    "file": "local",
    "srm": "gfal2", "gsiftp": "gfal2",
}


def driver_name_for(scheme: str, forced: str = "auto") -> str:
    """The driver for ``scheme``; ``forced`` (``--storage-driver``) wins unless ``auto``."""
    name = DEFAULT_DRIVER.get(scheme, "gfal2") if forced == "auto" else forced
    schemes = getattr(driver_class(name), "schemes", ())
    if scheme not in schemes:
        raise StorageScaleUsageError(
            f"--storage-driver {name}: cannot speak {scheme}://. It handles "
            f"{', '.join(s + '://' for s in schemes)}; use --storage-driver auto."
        )
    return name


def driver_class(name: str) -> type:
    """Import and return the driver class registered as ``name``."""
    try:
        module_name, class_name, hint = DRIVERS[name]
    except KeyError:
        raise StorageScaleUsageError(
            f"unknown driver {name!r}. Known drivers: {', '.join(DRIVERS)}."
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StorageScaleUsageError(
            f"the {name} driver needs {hint}. Import failed: {exc}."
        ) from None
    return getattr(module, class_name)
