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

from importlib import resources
from pathlib import Path

__all__ = ["SUITES_PACKAGE", "shipped_suites", "shipped_thresholds"]

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
