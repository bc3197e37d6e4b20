"""Hook specifications: how a site's conftest or package extends the plugin.

Added in ``pytest_addhooks`` (as pytest-xdist adds its ``newhooks``). Each hook is
dispatched through ``config.hook``: pluggy calls every implementation (conftest files
and plugins) and the answers are merged, again each time a conftest or plugin that
implements it is registered; a name another operation, metric or driver already has is a usage error
naming the conftest or plugin that gave it.

Example, in a suite's ``conftest.py``::

    from pytest_storagescale.load.operations import Operation

    class Touch(Operation):
        name = "touch"
        def run(self, driver, client, iteration, context):
            driver.put(f"{context['workdir']}/c{client}-{iteration}", b"")
            return 0

    def pytest_storagescale_operations():
        return [Touch()]

    def pytest_storagescale_metrics():
        return {"hot_ratio": "mean transfer time of one shared file / of distinct files"}
"""

from __future__ import annotations

import pytest


@pytest.hookspec
def pytest_storagescale_operations() -> list | None:
    """Operations a thresholds section may name (``op = "touch"``): a list of
    :class:`pytest_storagescale.load.operations.Operation` instances."""


@pytest.hookspec
def pytest_storagescale_metrics() -> dict[str, str] | None:
    """Derived metrics a rule may name, as ``{name: one-line description}``. A test
    computes them with ``storage_load.run(..., derive=...)``."""


@pytest.hookspec
def pytest_storagescale_drivers() -> list | None:
    """Driver classes (subclasses of :class:`pytest_storagescale.drivers.base.Driver`)
    the endpoint may use: chosen by URL scheme or by ``--storage-driver NAME``."""


@pytest.hookspec
def pytest_storagescale_embedded(config: pytest.Config) -> str | None:
    """The embedded server this suite fits (``"ceph"``, ``"webdav"``...), used when the
    user names none with ``--storage-embedded``. Implement it in the suite's
    ``conftest.py``; it is read when that conftest is loaded before the session starts
    (``pytest suites/ceph``). Suites that disagree are a usage error."""


@pytest.hookspec(historic=True)
def pytest_storagescale_options() -> dict | None:
    """A suite's own options, resolved like the plugin's: ``{name: (flag, parser,
    default, help)}`` as :data:`pytest_storagescale.config.OPTIONS` writes them, e.g.
    ``{"storage_ceph_xcache": ("--storage-ceph-xcache", None, None, "the XCache...")}``
    (``parser``: a function of the text given, or None). Each is a command-line
    option, an environment variable (``STORAGESCALE_CEPH_XCACHE``) and an ini key
    (``storage_ceph_xcache``), resolved in that order before the default, and shown in
    the header with where its value came from. Read with the ``storage_suite_options``
    fixture or ``storage_view(config).suite_options`` (name -> value). Declared in a
    conftest pytest loads before it parses the command line (the suite's folder given
    as an argument), as any ``pytest_addoption``."""


@pytest.hookspec(firstresult=True)
def pytest_storagescale_stand_in(config: pytest.Config) -> str | None:
    """What stood in for the system the suite is about (the embedded Apache WebDAV door
    for a dCache), in one sentence, or None: said in the terminal summary and the
    results' label. Asked once the settings are resolved and again after collection."""
