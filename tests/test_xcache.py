"""The embedded XCache: XRootD's proxy file cache (pss + pfc) in front of an origin
embedded xrootd. Files written to the origin are read through the door; the second
read is served from the cache's disk (its own access records), not the origin."""

from __future__ import annotations

import os

import pytest
from caches import access_when

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import EndpointError, StorageError
from pytest_storagescale.servers import family
from pytest_storagescale.servers.xcache import EmbeddedXCache
from pytest_storagescale.servers.xrootd import AREA

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def xcache():
    EmbeddedXCache.check_installed()
    with EmbeddedXCache() as server:
        yield server


def test_reads_are_served_from_the_cache(xcache):
    folder = f"{AREA}/xcache-test"
    origin = driver_spec(xcache.url, driver="xrootd", writable_root=folder).connect(
        "functional-origin", timeout=30)
    door = driver_spec(xcache.cached_url, driver="xrootd", writable_root=folder).connect(
        "functional-door", timeout=30)
    data = os.urandom(3_000_000)
    origin.put(f"{folder}/file", data)
    before = xcache.proxy.access()
    # first access: the 1 MiB block is fetched from the origin
    assert door.read(f"{folder}/file", 1_100_000, 65536) == data[1_100_000:1_165_536]
    door.close()
    door = driver_spec(xcache.cached_url, driver="xrootd").connect("functional-door2",
                                                                   timeout=30)
    # second access, same block: from the cache's disk
    assert door.read(f"{folder}/file", 1_100_000, 65536) == data[1_100_000:1_165_536]
    assert door.readv(f"{folder}/file", [(1_048_576, 10), (2_000_000, 10)]) == 20
    door.close()
    after = access_when(xcache.proxy, lambda now: (
        now.miss_bytes - before.miss_bytes >= 65536 and
        now.hit_bytes - before.hit_bytes >= 65536))
    assert f"{folder}/file" in xcache.proxy.cached_files()
    assert xcache.proxy.cached_bytes() >= 1_048_576  # the blocks read, not the file
    assert after.accesses >= before.accesses + 1
    assert after.miss_bytes - before.miss_bytes == 65536  # only the first read missed
    assert after.hit_bytes - before.hit_bytes >= 65536
    origin.remove_tree(folder)


def test_the_door_is_read_only(xcache):
    """XRootD 5.5's file cache refuses writes: steps write to the origin."""
    door = driver_spec(xcache.cached_url, driver="xrootd", writable_root=AREA).connect(
        "functional-ro", timeout=30)
    with pytest.raises(StorageError, match="read-only"):
        door.put(f"{AREA}/through-the-door", b"x")


def test_stop_removes_everything():
    server = EmbeddedXCache().start()
    directory, origin_directory = server.directory, server.origin.directory
    processes = [server.proxy.process, server.origin.process]
    server.stop()
    server.stop()  # idempotent
    assert not directory.exists() and not origin_directory.exists()
    assert all(process.poll() is not None for process in processes)


def test_missing_xrootd_is_one_paragraph(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EndpointError) as caught:
        family.start_embedded("xcache", "unix")
    text = str(caught.value)
    assert "xrootd" in text and "apt-get install xrootd-server xrootd-server-plugins" in text
    assert "\n" not in text
