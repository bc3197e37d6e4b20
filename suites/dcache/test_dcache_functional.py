"""dCache functional checks: what every door must do right before load numbers mean
anything. They run in parallel across xdist workers (no load lock), each test in its
own directory under the run's test area, through the endpoint's protocol
(``davs://`` doors through gfal2, ``root://`` doors through XRootD, or forced with
``--storage-driver``).
"""

from __future__ import annotations

import os
import zlib

import pytest

from pytest_storagescale import StorageNotFound

pytestmark = pytest.mark.storagescale_system("dcache")


@pytest.fixture
def door(storage_client, storage_test_dir):
    """A client of the door and a fresh directory for this test (the plugin's shared
    ``storage_client`` and ``storage_test_dir``)."""
    return storage_client, storage_test_dir


def _data(size: int) -> bytes:
    return (bytes(range(251)) * (size // 251 + 1))[:size]


def test_put_get_checksum(door, tmp_path):
    driver, folder = door
    data = _data(3_000_017)
    path = f"{folder}/file.dat"
    assert driver.put(path, data) == len(data)
    local = tmp_path / "copy.dat"
    assert driver.get(path, str(local)) == len(data)
    assert local.read_bytes() == data
    assert driver.checksum(path, "adler32") == f"{zlib.adler32(data):08x}"


def test_stat_file_and_directory(door):
    driver, folder = door
    driver.put(f"{folder}/f", b"12345")
    info = driver.stat(f"{folder}/f")
    assert info.size == 5 and not info.is_dir
    assert driver.stat(folder).is_dir


def test_mkdir_ls_rmdir(door):
    driver, folder = door
    driver.mkdir(f"{folder}/a/b")
    driver.put(f"{folder}/a/file", b"x")
    assert sorted(driver.ls(f"{folder}/a")) == ["b", "file"]
    driver.rmdir(f"{folder}/a/b")
    assert driver.ls(f"{folder}/a") == ["file"]


def test_rename(door):
    driver, folder = door
    driver.put(f"{folder}/old", b"content")
    driver.rename(f"{folder}/old", f"{folder}/new")
    assert driver.ls(folder) == ["new"]
    assert driver.read(f"{folder}/new", 0, 7) == b"content"


def test_delete(door):
    driver, folder = door
    driver.put(f"{folder}/gone", b"x")
    driver.delete(f"{folder}/gone")
    with pytest.raises(StorageNotFound):
        driver.stat(f"{folder}/gone")


def test_overwrite(door):
    driver, folder = door
    driver.put(f"{folder}/f", b"first version, longer")
    driver.put(f"{folder}/f", b"second")
    assert driver.stat(f"{folder}/f").size == 6
    assert driver.read(f"{folder}/f", 0, 6) == b"second"


def test_zero_byte_file(door, tmp_path):
    driver, folder = door
    driver.put(f"{folder}/empty", b"")
    assert driver.stat(f"{folder}/empty").size == 0
    assert driver.get(f"{folder}/empty", str(tmp_path / "empty")) == 0
    assert driver.checksum(f"{folder}/empty") == "00000001"


def test_large_file(door, tmp_path):
    """A file larger than one transfer chunk (default 64 MB; STORAGESCALE_LARGE_MB)."""
    driver, folder = door
    size = int(float(os.environ.get("STORAGESCALE_LARGE_MB", "64")) * 1_000_000) + 7
    data = os.urandom(size)
    driver.put(f"{folder}/large", data)
    assert driver.stat(f"{folder}/large").size == size
    local = tmp_path / "large"
    assert driver.get(f"{folder}/large", str(local)) == size
    assert zlib.adler32(local.read_bytes()) == zlib.adler32(data)
    assert driver.checksum(f"{folder}/large") == f"{zlib.adler32(data):08x}"


def test_partial_and_vector_reads(door):
    driver, folder = door
    data = _data(1_000_000)
    driver.put(f"{folder}/f", data)
    assert driver.read(f"{folder}/f", 123_456, 1000) == data[123_456:124_456]
    assert driver.readv(f"{folder}/f", [(0, 10), (500_000, 4096), (999_990, 10)]) == 4116
