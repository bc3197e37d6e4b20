"""This checkout's own pytest set-up, kept small on purpose.

The fixtures and markers that suites share live in the plugin
(``pytest_storagescale``), so that a site's suite in its own repository gets them
with no conftest at all. What is here concerns only runs from this checkout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    # The plugin is loaded through its entry point before this file is read: with a
    # stale non-editable install, tests/ and suites/ would quietly run that copy.
    import pytest_storagescale

    loaded = Path(pytest_storagescale.__file__).resolve().parent
    if loaded.parent != CHECKOUT:
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(
                f"pytest_storagescale is imported from {loaded}, not from this checkout "
                f"({CHECKOUT}): this run tests that copy. Install the checkout with "
                f"'.venv/bin/python -m pip install -e .' (scripts/bootstrap.sh does)."
            ),
            stacklevel=2,
        )
