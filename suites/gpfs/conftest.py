"""The gpfs suite's server, its operations, its derived metrics and its second host.

- the embedded server this suite fits: CephFS mounted with ``ceph-fuse`` on two client
  hosts (``--storage-embedded cephfs``: network namespaces, one CephFS client each);
- the ioperf patterns and ``ls_depth`` (``suites/gpfs/ioperf.py``), the killed writer
  deleted from another host (``suites/gpfs/crossnode.py``) and its metrics;
- ``--storage-gpfs-second-mount URL``: host B's view of the same test area, for the
  cross-host steps against a real shared file system (``file:///gpfs/...`` of a second
  mount on this machine, e.g. a second client's NFS or FUSE mount); the embedded
  CephFS gives its second host's mount.
"""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from pytest_storagescale import StorageScaleUsageError

from . import crossnode, ioperf


def _hosts(value: str) -> int:
    if not str(value).isdigit() or int(value) < 1:
        raise StorageScaleUsageError(
            f"--storage-gpfs-hosts {value!r}: a number of client hosts, e.g. 4.")
    return int(value)


def pytest_storagescale_options() -> dict:
    """Resolved as the plugin's own: option > environment > ini > default."""
    return {
        "storage_gpfs_second_mount": (
            "--storage-gpfs-second-mount", None, None,
            "the test area as a second client host mounts it (file:///...), for the "
            "killed-writer and ls-at-depth steps; default: the embedded CephFS's second "
            "host"),
        "storage_gpfs_hosts": (
            "--storage-gpfs-hosts", _hosts, None,
            "client hosts of --storage-cluster for the one-thread-per-host ioperf steps "
            "(one worker per node); default: the embedded CephFS's client hosts"),
    }


def pytest_storagescale_embedded(config: pytest.Config) -> str:
    """Seed 001 is a shared POSIX file system seen from several nodes."""
    return "cephfs"


def pytest_storagescale_operations() -> list:
    return [*ioperf.OPERATIONS, *crossnode.OPERATIONS]


def pytest_storagescale_metrics() -> dict[str, str]:
    return {
        "delete_s": "seconds from the writer's SIGKILL on host A until host B deleted its "
        "file (infinite: never within give_up)",
        "delete_refusals": "times host B's delete was refused before it went through",
        "delete_errno": "errno of host B's first refused delete (0: none; 13 EACCES, the "
        "seed's 'Permission denied')",
    }


def second_host(options, endpoint) -> dict | None:
    """The endpoint's host and a second one, as the cross-host steps take them in
    their step context (``storage_load.run(..., context=hosts)``): ``area_a``,
    ``area_b`` (the same test area through each host's mount), ``netns_a``,
    ``netns_b`` (their network namespaces, absent: here) and ``client`` (kill host B's
    file system client, mount it again); None: no second host."""
    given = options.get("storage_gpfs_second_mount")
    area_a = urlparse(endpoint.url).path.rstrip("/")
    if given:
        return {"area_a": area_a, "area_b": urlparse(given).path.rstrip("/")}
    server = endpoint.embedded
    hosts = getattr(server, "hosts", None) or []
    if len(hosts) < 2:
        return None
    return {"area_a": str(hosts[0].area), "area_b": str(hosts[1].area),
            "netns_a": hosts[0].netns, "netns_b": hosts[1].netns,
            "client": (lambda: server.kill_client(1), lambda: server.remount(1))}


@pytest.fixture
def second_host_if_any(storage_suite_options, storage_endpoint) -> dict:
    """The step context of this test's cross-host steps: they write on host B when
    there is one (empty: no second host)."""
    return second_host(storage_suite_options, storage_endpoint) or {}


@pytest.fixture
def two_hosts(storage_suite_options, storage_endpoint) -> dict:
    """The step context of this test's cross-host steps, which write on host A and act
    on host B; skipped without a second host."""
    hosts = second_host(storage_suite_options, storage_endpoint)
    if hosts is None:
        pytest.skip("no second client host of this file system: give its mount of the "
                    "same test area with --storage-gpfs-second-mount file:///mnt/b/area, "
                    "or run the embedded CephFS (--storage-embedded cephfs)")
    return hosts


#: the fixture with which a test asks for one client per host (storage_cluster below)
PER_HOST = "host_cluster"


@pytest.fixture
def storage_cluster(request: pytest.FixtureRequest, storage_settings, storage_endpoint):
    """The plugin's ``storage_cluster``, overridden: ``--storage-cluster`` when given;
    else, for a test that asks for :func:`host_cluster`, the embedded CephFS's own
    cluster (a scheduler and one worker per namespace host), for that test's steps."""
    if storage_settings.cluster or PER_HOST not in request.fixturenames:
        return storage_settings.cluster
    server = storage_endpoint.embedded
    return server.cluster_address() if hasattr(server, "cluster_address") else None


@pytest.fixture
def host_cluster(storage_suite_options, storage_settings, storage_endpoint,
                 storage_cluster) -> int:
    """The number of client hosts this test's steps run on, one Dask worker each: the
    --storage-cluster given (with --storage-gpfs-hosts N), or the embedded CephFS's
    hosts (:func:`storage_cluster`)."""
    given = storage_suite_options.get("storage_gpfs_hosts")
    if storage_settings.cluster:
        if not given:
            pytest.skip("--storage-cluster is given: say how many client hosts it has "
                        "with --storage-gpfs-hosts N (one worker per node)")
        return given
    if storage_cluster is None:
        pytest.skip("no client hosts: give --storage-cluster with one worker per node and "
                    "--storage-gpfs-hosts N, or run the embedded CephFS")
    return len(storage_endpoint.embedded.hosts)
