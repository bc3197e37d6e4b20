"""Option value parsers: accepted and rejected inputs."""

from __future__ import annotations

import pytest

from pytest_storagescale.config import (
    parse_byte_size,
    parse_choice,
    parse_clients,
    parse_duration,
)
from pytest_storagescale.errors import StorageScaleUsageError


@pytest.mark.parametrize(
    "text, seconds",
    [("10s", 10), ("5m", 300), ("1h", 3600), ("500ms", 0.5), ("2.5", 2.5), (7, 7), (" 3 s ", 3)],
)
def test_duration_accepted(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "10x", "-5s", "0s", "5 minutes"])
def test_duration_rejected_names_value_and_units(text):
    with pytest.raises(StorageScaleUsageError) as info:
        parse_duration(text, what="--storage-duration")
    message = str(info.value)
    assert "--storage-duration" in message and repr(text) in message
    assert "10s" in message


def test_clients_accepted():
    assert parse_clients("5, 50,200") == (5, 50, 200)


@pytest.mark.parametrize("text", ["", "a,b", "5,-1", "0", "5;50"])
def test_clients_rejected(text):
    with pytest.raises(StorageScaleUsageError, match="positive whole numbers"):
        parse_clients(text)


def test_choice_lists_valid_values():
    assert parse_choice("Threads", ("threads", "processes"), what="--storage-executor") == "threads"
    with pytest.raises(StorageScaleUsageError, match="'fibers'.*threads, processes"):
        parse_choice("fibers", ("threads", "processes"), what="--storage-executor")


@pytest.mark.parametrize(
    "text, size", [("1MB", 10**6), ("10MiB", 10 * 2**20), ("4k", 4000), (0, 0), ("512", 512)]
)
def test_byte_size(text, size):
    assert parse_byte_size(text) == size


def test_byte_size_rejected():
    with pytest.raises(StorageScaleUsageError, match="not a size"):
        parse_byte_size("big")
