"""The ceph suite's server, its XCache door, its derived metric and its operations.

- the embedded server this suite fits: the Ceph gateway (``--storage-embedded ceph``:
  Ceph with memstore OSDs behind an XRootD ``libXrdCeph`` gateway, with an XCache door);
- ``--storage-ceph-xcache URL``: the XCache in front of a remote gateway, the same
  test area through it (``root://xcache:1094//echo/test/storagescale``); the
  embedded gateway's own door is used when it is not given;
- ``hot_ratio`` belongs to this suite (seed 002's hot-file problem), not to the core:
  a suite in a site's own repository adds its metrics the same way;
- the ``*_xcache`` operations (``suites/ceph/xcache.py``).
"""

from __future__ import annotations

import pytest

from pytest_storagescale import driver_spec, storage_view

from . import xcache

#: where an xdist worker finds the controller's embedded door
WORKER_KEY = "storagescale_ceph_xcache"


#: the XCache door's option, resolved as the plugin's own (option > env > ini)
XCACHE_OPTION = "storage_ceph_xcache"


def pytest_storagescale_options() -> dict:
    return {XCACHE_OPTION: (
        "--storage-ceph-xcache", None, None,
        "the test area through an XCache in front of the gateway, for the *_xcache steps "
        "(URL); default: the embedded gateway's door")}


def pytest_storagescale_embedded(config: pytest.Config) -> str:
    """Seed 002 is about Ceph behind XRootD gateways."""
    return "ceph"


def pytest_storagescale_metrics() -> dict[str, str]:
    """``hot_ratio``, computed by ``test_hot_file_against_distinct_files``."""
    return {
        "hot_ratio": "mean transfer time when every client copies one file, over the mean "
        "when each copies its own (seed 002: ~13)",
    }


def pytest_storagescale_operations() -> list:
    return list(xcache.OPERATIONS)


@pytest.hookimpl(optionalhook=True, trylast=True)
def pytest_configure_node(node) -> None:
    """xdist controller: tell the workers where the embedded gateway's door is (after
    the plugin's own hook started the server)."""
    view = storage_view(node.config)
    node.workerinput[WORKER_KEY] = getattr(view and view.embedded_server, "cached_url", None)


def door_url(config: pytest.Config, options, embedded) -> str | None:
    """The option (its environment variable, its ini key), an xdist controller's door,
    or the embedded one."""
    given = options.get(XCACHE_OPTION)
    if given:
        return given
    worker = getattr(config, "workerinput", {})
    if WORKER_KEY in worker:
        return worker[WORKER_KEY]
    return getattr(embedded, "cached_url", None)


@pytest.fixture
def xcache_door(request: pytest.FixtureRequest, storage_endpoint,
                storage_suite_options) -> dict:
    """The doors of this test's ``*_xcache`` steps (``storage_load.run(doors=...)``):
    the XCache door they read through; skipped when the endpoint has none."""
    url = door_url(request.config, storage_suite_options, storage_endpoint.embedded)
    if not url:
        pytest.skip("no XCache in front of this endpoint: give its URL with "
                    "--storage-ceph-xcache root://xcache:1094//same/test/area")
    own = storage_endpoint.driver_spec
    spec = driver_spec(url, driver=own.name, options=dict(own.options),
                       writable_root=storage_endpoint.run_dir)
    return {xcache.DOOR: spec}
