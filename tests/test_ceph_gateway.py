"""The embedded Ceph gateway: Ceph 16 (mon + memstore OSD) behind XRootD's libXrdCeph,
with its XCache door, started once for the module; the plugin's XRootD driver on its
flat namespace, and suites/ceph through pytester at a shrunk scale."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from caches import access_when

from pytest_storagescale.drivers.base import CreatedPaths
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import EndpointError, StorageError, StorageNotFound
from pytest_storagescale.load.engine import cleanup_tree
from pytest_storagescale.servers import family
from pytest_storagescale.servers.ceph import AREA, AREA_MARKER, EmbeddedCephGateway

REPO = Path(__file__).resolve().parent.parent

#: one Ceph cluster at a time with the CephFS tests (see tests/test_ceph_suite.py)
pytestmark = pytest.mark.xdist_group("network_namespaces")


def pool_objects(server: EmbeddedCephGateway) -> list[str]:
    """Every object name the gateway lists (cut short by one character in 5.5.3)."""
    admin = driver_spec(server.url, driver="xrootd").connect("admin", timeout=30)
    try:
        return admin._server_ls("/")
    finally:
        admin.close()


@pytest.fixture(scope="module")
def ceph_gateway():
    EmbeddedCephGateway.check_installed()
    server = EmbeddedCephGateway().start()
    directory, pids = server.directory, [d.process.pid for d in server.daemons]
    pids.append(server.xcache.process.pid)
    yield server
    server.stop()
    assert not directory.exists()
    for pid in pids:  # every daemon is gone (reaped by stop())
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text().lower()


def test_missing_package_is_one_paragraph(monkeypatch, tmp_path):
    """A PATH without ceph-mon: one paragraph with the install command, no start."""
    for name in ("xrootd", "ceph", "ceph-osd", "ceph-authtool", "monmaptool"):
        (tmp_path / name).symlink_to(f"/usr/bin/{name}")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EndpointError) as caught:
        family.start_embedded("ceph", "unix")
    text = str(caught.value)
    assert "ceph-mon" in text and "apt-get install ceph-mon ceph-osd" in text
    assert "\n" not in text and "--storage-endpoint" in text


@pytest.mark.slow_server
def test_gateway_started(ceph_gateway):
    assert ceph_gateway.version.startswith(ceph_gateway.xrootd_version + "+ceph16.")
    assert {"mon.a", "osd.0", "gateway", "xcache"} <= set(ceph_gateway.rss_bytes())
    assert all(size > 0 for size in ceph_gateway.rss_bytes().values())
    assert ceph_gateway.driver_options() == {"flat_namespace": "true"}
    assert ceph_gateway.cached_url != ceph_gateway.url
    assert f"{AREA.strip('/')}/{AREA_MARKER[:-1]}" in pool_objects(ceph_gateway)


@pytest.mark.slow_server
def test_driver_on_flat_namespace(ceph_gateway):
    """put/get/stat/readv through the plugin's driver; a name prefix is a directory;
    rmdir of a prefix with objects is refused; the tree is removed to the last object."""
    folder = f"{AREA}/driver-test"
    spec = driver_spec(ceph_gateway.url, driver="xrootd",
                       options=ceph_gateway.driver_options(), writable_root=folder)
    client = spec.connect("functional-flat", timeout=30)
    client.created = CreatedPaths(folder)  # what the clean-up may remove
    try:
        with pytest.raises(StorageNotFound):
            client.stat(folder)
        client.mkdir(folder, parents=False)
        data = os.urandom(5_000_000)  # two 4 MB stripes
        for index in range(12):  # names that the gateway's listing cuts alike
            client.put(f"{folder}/sub/file-{index:05d}", data[:1000])
        assert client.put(f"{folder}/big", data) == len(data)
        assert client.stat(f"{folder}/big").size == len(data)
        assert client.stat(folder).is_dir and client.stat(f"{folder}/sub").is_dir
        assert client.get(f"{folder}/big") == len(data)
        assert client.read(f"{folder}/big", 4_194_300, 10) == data[4_194_300:4_194_310]
        assert client.readv(f"{folder}/big", [(0, 100), (4_194_000, 1000)]) == 1100
        assert client.ls(folder) == ["big", "sub"]
        assert client.ls(f"{folder}/sub") == [f"file-{i:05d}" for i in range(12)]
        with pytest.raises(StorageError, match="not empty"):
            client.rmdir(f"{folder}/sub")
        with pytest.raises(StorageError, match="exists"):
            client.mkdir(folder, parents=False)
        assert cleanup_tree(client, folder, created=client.created) is None
        with pytest.raises(StorageNotFound):
            client.stat(folder)
    finally:
        client.close()
    assert not [name for name in pool_objects(ceph_gateway) if "driver-test" in name]


@pytest.mark.slow_server
def test_ceph_suite_on_the_gateway(ceph_gateway, pytester):
    """suites/ceph at 2% of its plan against this gateway and its XCache door: every
    step measured something, the run directory existed and is gone, and the *_xcache
    steps were served by the cache (its own access records: bytes hit)."""
    before = ceph_gateway.xcache.access()
    pytester.makepyfile(test_run_area="""
        def test_run_area(storage_endpoint, storage_client):
            run_dir = storage_endpoint.run_dir
            assert storage_client.stat(run_dir).is_dir
            assert ".storagescale-owner.json" in storage_client.ls(run_dir)
    """)
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "ceph"), "test_run_area.py",
        f"--storage-endpoint={ceph_gateway.url}",
        "--storage-driver-option=flat_namespace=true",
        f"--storage-ceph-xcache={ceph_gateway.cached_url}",
        f"--storage-version={ceph_gateway.version}",
        # 3 s steps: on a loaded box (load 30+) a 1 s read step at 1 client measured no
        # operation (its first read pays the gateway login) and was, rightly, an error
        "--storage-scale=0.1", "--storage-duration=3s",
        "--storage-results=r.json", "--storage-report=report", "-p", "no:cacheprovider",
    )
    # a daemon that died mid-run (mon, OSD, gateway, XCache) is named, with how and when
    note = ceph_gateway.exit_note()
    if "killed by SIGABRT" in note and "end_of_buffer" in note:
        # xrootd 5.5.3's XrdCeph gateway aborts now and then (CI of 2026-11-26: reading a
        # file just written through XCache, "terminate called after throwing an instance
        # of 'ceph::buffer::v15_2_0::end_of_buffer'"): the storage's crash, which the
        # suite reported as it should; the death note is what this test could check
        pytest.xfail(f"the XrdCeph gateway crashed (a known crash of the server, named "
                     f"by its death note): {note.splitlines()[0]}")
    assert not note, note
    result.assert_outcomes(passed=11)
    result.stdout.fnmatch_lines(["*thresholds: *ceph/embedded.toml*plan scale 0.1*"])
    steps = json.loads((pytester.path / "r.json").read_text())["steps"]
    ops = {(s["op"], s["clients"]) for s in steps}
    assert {op for op, _ in ops} == {
        "distinct", "hotfile", "distinct_xcache", "hotfile_xcache", "readv", "readv_xcache",
        "read", "read_xcache"}
    assert ("read_xcache", 6) in ops and ("readv", 1) in ops
    for step in steps:
        assert step["succeeded"] > 0 and step["failed"] == 0, step["op"]
        assert step["cleanup_error"] is None, step["cleanup_error"]
    hot = [s for s in steps if s.get("label") == "same file"]
    assert len(hot) == 2 and all(s["derived"]["hot_ratio"] > 0 for s in hot)
    # the cache's records: what the *_xcache steps read came mostly from its disk
    after = access_when(ceph_gateway.xcache, lambda now: (
        now.hit_bytes - before.hit_bytes > now.miss_bytes - before.miss_bytes > 0))
    hit, miss = after.hit_bytes - before.hit_bytes, after.miss_bytes - before.miss_bytes
    assert after.accesses > before.accesses
    assert hit > miss > 0, (hit, miss)
    # the latency ECDF of every step is in the report
    page = (pytester.path / "report" / "index.html").read_text()
    assert page.count('alt="latency ECDF ') >= len(steps)
    # the run directory and every step's objects are gone from the pool
    assert [name for name in pool_objects(ceph_gateway) if "storagescale-run-" in name] == []


@pytest.mark.slow_server
def test_the_gateways_key_is_readable_by_its_user_alone(ceph_gateway):
    """Issue 31: the gateway's keyring (rwx on the pool) was written with the umask's
    0644 in a folder made 0755 for the gateway's user: any local user could read it.
    It is made 0600 (then given to that user)."""
    import stat as stat_module

    keyring = next((ceph_gateway.directory / "gateway").glob("ceph.client.*.keyring"))
    assert "key = " in keyring.read_text()
    assert stat_module.S_IMODE(keyring.stat().st_mode) == 0o600
