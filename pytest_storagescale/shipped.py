"""Where an installed plugin keeps the suites and thresholds it ships.

The checkout has ``suites/<system>/`` and ``thresholds/<system>/`` at its top level;
the wheel installs them as the package ``storagescale_suites``, with the thresholds
inside it as data (``storagescale_suites/thresholds/<system>/*.toml``), so that
``pytest --pyargs storagescale_suites.dcache`` runs with no checkout at hand. Both
functions answer ``None`` when the suites are not installed (a checkout used through
``PYTHONPATH``, or a wheel built without them); callers then fall back to the
checkout's folders.
"""

from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path

__all__ = ["SUITES_PACKAGE", "pyargs_folders", "shipped_suites", "shipped_thresholds"]

#: the import name of the suites in the wheel (``suites/`` in the checkout)
SUITES_PACKAGE = "storagescale_suites"


def shipped_suites() -> Path | None:
    """The installed ``storagescale_suites`` folder, or None when it is not installed."""
    try:
        root = resources.files(SUITES_PACKAGE)
    except ModuleNotFoundError:
        return None
    # A suite runs from files on disk (pytest collects paths); a zipped install has none.
    return root if isinstance(root, Path) and root.is_dir() else None


def shipped_thresholds() -> Path | None:
    """The installed thresholds folder (``<system>/*.toml``), or None when not installed."""
    suites = shipped_suites()
    if suites is None:
        return None
    folder = suites / "thresholds"
    if not folder.is_dir() and suites.name == "suites":
        # an editable install maps storagescale_suites to the checkout's suites/,
        # whose thresholds/ sit next to it rather than inside it
        folder = suites.parent / "thresholds"
    return folder if folder.is_dir() else None


def pyargs_folders(args: list[str]) -> list[Path]:
    """The folders of the packages (or files of the modules) that ``--pyargs``
    arguments name (``storagescale_suites.dcache``, ``pkg.test_x::test_y``), so that
    their ``conftest.py`` is loaded before the session is configured, as a path argument's
    is. pytest loads a suite's conftest only at collection under ``--pyargs``: too late
    for its ``pytest_storagescale_embedded`` (the server) and ``pytest_addoption`` (its
    options). An argument that names no importable module is left to pytest."""
    folders: list[Path] = []
    for arg in args:
        name = str(arg).split("::", 1)[0]
        if not all(part.isidentifier() for part in name.split(".")):
            continue  # a path: pytest finds its conftest itself
        try:
            spec = importlib.util.find_spec(name)  # imports the parent packages only
        except Exception:  # noqa: BLE001 - pytest reports the argument in its own words
            continue
        if spec is None:
            continue
        if spec.submodule_search_locations:
            folders.extend(Path(location) for location in spec.submodule_search_locations)
        elif spec.origin and spec.has_location:
            folders.append(Path(spec.origin))
    return [folder for folder in folders if folder.exists()]
