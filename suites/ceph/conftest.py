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

import os

import pytest

from pytest_storagescale import driver_spec

from . import xcache

#: where an xdist worker finds the controller's embedded door
WORKER_KEY = "storagescale_ceph_xcache"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--storage-ceph-xcache", default=None, metavar="URL",
        help="the test area through an XCache in front of the gateway, for the *_xcache "
             "steps (env STORAGESCALE_CEPH_XCACHE); default: the embedded gateway's door")


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
    from pytest_storagescale import storage_run

    server = storage_run(node.config).endpoint.embedded_server
    node.workerinput[WORKER_KEY] = getattr(server, "cached_url", None)


def door_url(config: pytest.Config, embedded) -> str | None:
    """The option, the environment, an xdist controller's door, or the embedded one."""
    given = (config.getoption("--storage-ceph-xcache")
             or os.environ.get("STORAGESCALE_CEPH_XCACHE"))
    if given:
        return given
    worker = getattr(config, "workerinput", {})
    if WORKER_KEY in worker:
        return worker[WORKER_KEY]
    return getattr(embedded, "cached_url", None)


@pytest.fixture
def xcache_door(request: pytest.FixtureRequest, storage_endpoint) -> dict:
    """The doors of this test's ``*_xcache`` steps (``storage_load.run(doors=...)``):
    the XCache door they read through; skipped when the endpoint has none."""
    url = door_url(request.config, storage_endpoint.embedded)
    if not url:
        pytest.skip("no XCache in front of this endpoint: give its URL with "
                    "--storage-ceph-xcache root://xcache:1094//same/test/area")
    own = storage_endpoint.driver_spec
    spec = driver_spec(url, driver=own.name, options=dict(own.options),
                       writable_root=storage_endpoint.run_dir)
    return {xcache.DOOR: spec}
