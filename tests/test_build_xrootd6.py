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


# -- the library search path (issue 31, item 4) -------------------------------------
# CMake gives the build tree's files a RUNPATH into the build tree with an empty element
# ([<work>/build/lib:], [$ORIGIN:]); the build tree is deleted and the empty element is
# the working directory: a libz.so.1 another user put where pytest was started ran as
# root. The script sets every ELF file's RUNPATH to the prefix's lib/ and repairs a
# build an older copy of it made; the plugin refuses a prefix that still has one.

def _search_paths(path: Path) -> list[tuple[str, str]]:
    """``(RUNPATH|RPATH, element)`` of an ELF file, from ``readelf -d``."""
    done = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True,
                          timeout=30, check=True)
    found = []
    for line in done.stdout.splitlines():
        match = re.search(r"\((RUNPATH|RPATH)\).*\[(.*)\]$", line)
        if match:
            found.extend((match.group(1), element) for element in match.group(2).split(":"))
    return found


def _is_elf(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(4) == b"\x7fELF"


def _bad_elements(prefix: Path) -> list[str]:
    """Each empty, relative or missing search path element of the ELF files under
    ``prefix``, and how many ELF files were read."""
    bad = []
    for path in sorted(prefix.rglob("*")):
        if path.is_symlink() or not path.is_file() or not _is_elf(path):
            continue
        for kind, element in _search_paths(path):
            expanded = element.replace("$ORIGIN", str(path.parent))
            if not expanded.startswith("/") or not Path(expanded).is_dir():
                bad.append(f"{path}: {kind} '{element}'")
    return bad


def test_the_built_release_searches_its_own_library_folder_only():
    """Every ELF file of the installed 6.2.1 tree: no empty, relative or missing
    RUNPATH/RPATH element; the programs' RUNPATH is the prefix's lib/."""
    from pytest_storagescale.servers.xrootd_releases import built_prefix, search_path_problems

    prefix = built_prefix()
    if prefix is None:
        pytest.skip("XRootD 6.2.1 is not built on this machine (no cache: "
                    "scripts/build-xrootd6.sh builds it); nothing to check")
    elves = [p for p in prefix.rglob("*") if p.is_file() and not p.is_symlink() and _is_elf(p)]
    assert len(elves) >= 20, elves  # the programs, libraries and plug-ins of TARGETS
    assert _bad_elements(prefix) == []
    assert _search_paths(prefix / "bin" / "xrootd") == [("RUNPATH", f"{prefix}/lib")]
    assert search_path_problems(prefix) == []
    assert f"runpath={prefix}/lib" in (prefix / ".storagescale-built").read_text()


def _compile(tmp_path: Path, target: Path, search_path: str, *, shared: bool) -> None:
    """A small ELF file with ``search_path`` as its RUNPATH."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is missing (scripts/bootstrap.sh installs it)")
    source = tmp_path / "empty.c"
    source.write_text("int main(void) { return 0; }\n" if not shared else "int f(void);\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", *(["-shared", "-fPIC"] if shared else []), str(source), "-o",
                    str(target), f"-Wl,--enable-new-dtags,-rpath,{search_path}"],
                   check=True, capture_output=True, timeout=120)


def _old_build(tmp_path: Path) -> Path:
    """A prefix as an older copy of the script left it: the marker, a program whose
    RUNPATH is the deleted build tree and the working directory, a library's
    ``$ORIGIN`` and the working directory."""
    prefix = Path(_run(tmp_path, "--print-prefix").stdout.strip())
    _compile(tmp_path, prefix / "bin" / "xrootd", f"{tmp_path}/gone/build/lib:",
             shared=False)
    _compile(tmp_path, prefix / "lib" / "libXrdUtils.so.6.2.1", "$ORIGIN:", shared=True)
    (prefix / "lib" / "libXrdUtils.so.6").symlink_to("libXrdUtils.so.6.2.1")
    (prefix / ".storagescale-built").write_text("version=6.2.1\n")
    assert _bad_elements(prefix)  # what the old script left
    return prefix


def test_an_old_build_is_repaired_not_trusted(tmp_path):
    """The marker alone is not trusted: the script finds the stray search path, sets
    it to the prefix's lib/, and says so; the next run finds it whole."""
    if shutil.which("patchelf") is None:
        pytest.skip("patchelf is missing: scripts/bootstrap.sh servers installs it")
    prefix = _old_build(tmp_path)
    done = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "was built by an older copy of this script" in done.stdout
    assert f"XRootD 6.2.1 in {prefix} repaired" in done.stdout
    assert _bad_elements(prefix) == []
    assert _search_paths(prefix / "bin" / "xrootd") == [("RUNPATH", f"{prefix}/lib")]
    assert _search_paths(prefix / "lib" / "libXrdUtils.so.6.2.1") == [
        ("RUNPATH", f"{prefix}/lib")]
    assert f"runpath={prefix}/lib" in (prefix / ".storagescale-built").read_text()
    again = _run(tmp_path)
    assert again.returncode == 0 and "already built" in again.stdout, again.stdout


def test_an_old_build_is_refused_by_the_plugin_until_repaired(tmp_path, monkeypatch):
    """--storage-embedded-version 6.2.1 with such a build: a usage error naming the
    file, the element and the command that repairs it, before any server starts."""
    from pytest_storagescale.errors import StorageScaleUsageError
    from pytest_storagescale.servers.xrootd_releases import check_requested

    prefix = _old_build(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(StorageScaleUsageError) as caught:
        check_requested("6.2.1", "5.5.3")
    text = str(caught.value)
    assert f"{prefix}/bin/xrootd's RUNPATH element '' is empty: the working directory" in text
    assert "does not exist" in text  # the deleted build tree
    assert "Run 'bash scripts/build-xrootd6.sh'" in text and "\n" not in text


def test_a_site_prefix_with_a_stray_search_path_is_refused(tmp_path):
    """A site's own installation prefix with a relative RUNPATH: refused, the fix named."""
    from pytest_storagescale.errors import StorageScaleUsageError
    from pytest_storagescale.servers.xrootd_releases import check_requested

    prefix = tmp_path / "site"
    _compile(tmp_path, prefix / "bin" / "xrootd", "lib", shared=False)
    _compile(tmp_path, prefix / "lib" / "libXrdUtils.so.5", f"{prefix}/lib", shared=True)
    with pytest.raises(StorageScaleUsageError) as caught:
        check_requested(str(prefix), "5.5.3")
    text = str(caught.value)
    assert "RUNPATH element 'lib' is relative" in text
    assert f"patchelf --set-rpath {prefix}/lib FILE" in text
