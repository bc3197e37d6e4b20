"""Shared fixtures of the plugin's own tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def thresholds_dir(tmp_path: Path):
    """Write ``<system>/<name>.toml`` files under a fresh thresholds folder."""
    root = tmp_path / "thresholds"

    def write(text: str, *, system: str = "xrootd", name: str = "t.toml") -> Path:
        folder = root / system
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_text(text)
        return path

    write.root = root  # type: ignore[attr-defined]
    return write


@pytest.fixture(scope="session")
def embedded_xrootd():
    """A real xrootd on loopback for the integration tests."""
    if shutil.which("xrootd") is None and not Path("/usr/bin/xrootd").exists():
        pytest.fail("xrootd is not installed: run 'make setup' (the tests need a real server)")
    from pytest_storagescale.endpoints.embedded import EmbeddedXRootD

    with EmbeddedXRootD() as server:
        yield server
