"""scripts/build-xrootd6.sh builds from PyPI's xrootd-6.2.1 sdist with its sha256
pinned: a cached (or downloaded) file with another hash is refused with a message
naming it, before anything is unpacked or built; a finished build is never redone (nor
its source read). Dry runs only: nothing is built or downloaded here."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build-xrootd6.sh"


def _run(cache_home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=120)


def _sdist(cache_home: Path) -> Path:
    folder = cache_home / "pytest-storagescale" / "sdist"
    folder.mkdir(parents=True)
    return folder / "xrootd-6.2.1.tar.gz"


def test_the_pin_is_a_sha256():
    pin = re.search(r"^SDIST_SHA256=([0-9a-f]*)$", SCRIPT.read_text(), re.MULTILINE)
    assert pin and len(pin.group(1)) == 64


def test_a_cached_sdist_with_another_hash_is_refused(tmp_path):
    sdist = _sdist(tmp_path)
    sdist.write_bytes(b"<html>not the sdist</html>")
    done = _run(tmp_path, "--dry-run")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{sdist} is not PyPI's xrootd-6.2.1.tar.gz: its sha256 is " \
           f"{hashlib.sha256(sdist.read_bytes()).hexdigest()}" in done.stderr, done.stderr
    assert "tar -xzf" not in done.stdout  # refused before the unpack
    assert sdist.exists()  # not the script's to delete: the message says to


def test_a_finished_build_is_not_redone_nor_its_source_read(tmp_path):
    sdist = _sdist(tmp_path)
    sdist.write_bytes(b"tampered after the build")
    prefix = Path(_run(tmp_path, "--print-prefix").stdout.strip())
    assert prefix.is_relative_to(tmp_path)
    prefix.mkdir(parents=True)
    (prefix / ".storagescale-built").write_text("version=6.2.1\n")
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "already built" in done.stdout and not done.stderr


def test_the_pinned_sdist_passes(tmp_path):
    cached = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / (
        "pytest-storagescale/sdist/xrootd-6.2.1.tar.gz")
    if not cached.is_file():
        pytest.skip(f"no cached sdist at {cached} (scripts/build-xrootd6.sh downloads it)")
    shutil.copyfile(cached, _sdist(tmp_path))
    done = _run(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "tar -xzf" in done.stdout
