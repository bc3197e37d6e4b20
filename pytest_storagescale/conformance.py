"""What a conformance suite uses beside the package's names (``suites/conformance``,
or a site's own checks built the same way): public, as this module's ``__all__``
names them, and kept out of the package's top-level names, which are for every suite.

- :func:`remove_folder`: remove what a client made in a test's folder, naming what is
  left in a warning;
- :func:`door_problem`: why a door's test area cannot be written through (None: it
  can);
- :func:`folder_name`: a directory name for one test (its id, made path-safe);
- :func:`checksum_hint`: what a refused checksum usually means, for the failure's text.

The doors' names at collection are :attr:`pytest_storagescale.SessionView.door_names`
(``storage_view(config).door_names``).
"""

from __future__ import annotations

from .fixtures import remove_folder
from .reporting.failures import checksum_hint
from .session.doors import door_problem, folder_name

__all__ = ["checksum_hint", "door_problem", "folder_name", "remove_folder"]
