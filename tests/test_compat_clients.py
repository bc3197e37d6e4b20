"""The XRootD client release of a run, apart from the server's (issue 34):
``STORAGESCALE_XROOTD_CLIENT=6.2.1`` makes the run's process (pytest, its workers and
load processes, the ``storagescale`` command) import the 6.2.1 Python bindings that
``scripts/build-xrootd6.sh --client`` built from the server's sdist, and run its tools;
a release not offered or not built is one paragraph, exit 4, before anything; the
embedded server keeps its own release's ``xrdcp``. And scripts/compat_matrix.py
--clients: the client x server matrix, its cells as real runs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_storagescale.servers import xrootd_releases
from pytest_storagescale.servers.xrootd_releases import (
    BUILT_VERSION,
    CLIENT_VARIABLE,
    client_prefix,
    installed_client_version,
)

ROOT = Path(__file__).resolve().parent.parent

#: a test that says which XRootD bindings the process imported, from where, and which
#: XRootD libraries it mapped (``/proc/self/maps``)
PROBE = """
import json, os
from importlib import metadata

def test_probe():
    import XRootD.client
    from XRootD.client import FileSystem  # noqa: F401 - the extension loaded
    maps = open("/proc/self/maps").read().splitlines()
    libs = sorted({line.split()[-1] for line in maps if "/libXrd" in line})
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump({"file": XRootD.client.__file__, "version": metadata.version("xrootd"),
                   "libs": libs, "path": os.environ["PATH"]}, out)
"""


def _pytest(tmp_path: Path, *arguments: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           *arguments], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_a_release_not_offered_is_one_paragraph_exit_4(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    done = _pytest(tmp_path, env={CLIENT_VARIABLE: "4.12.9"})
    assert done.returncode == 4, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert f"{CLIENT_VARIABLE}=4.12.9: the XRootD client releases offered are" in said
    assert BUILT_VERSION in said and "Traceback" not in said
    assert said.count("ERROR:") == 1


def test_a_release_not_built_names_the_build_command(tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    done = _pytest(tmp_path, env={CLIENT_VARIABLE: BUILT_VERSION,
                                  "XDG_CACHE_HOME": str(tmp_path / "empty-cache")})
    said = done.stdout + done.stderr
    assert done.returncode == 4, said
    assert "client environment is not built on this machine" in said
    assert "bash scripts/build-xrootd6.sh --client" in said and "Traceback" not in said


def test_the_storagescale_command_refuses_it_too(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pytest_storagescale.cli", "tree", "verify",
                           "memory://x/area", "--manifest", str(tmp_path / "m.json")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, CLIENT_VARIABLE: "4.12.9"})
    assert done.returncode == 4
    assert done.stderr.startswith(f"ERROR: {CLIENT_VARIABLE}=4.12.9:"), done.stderr


def test_the_installed_release_by_name_changes_nothing(tmp_path):
    installed = installed_client_version()
    if not installed:
        pytest.skip("no XRootD Python bindings installed")
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "probe.json"
    done = _pytest(tmp_path, env={CLIENT_VARIABLE: installed, "PROBE_OUT": str(out)})
    assert done.returncode == 0, done.stdout + done.stderr
    probe = json.loads(out.read_text())
    assert probe["version"] == installed
    own = client_prefix()
    assert own is None or not probe["file"].startswith(str(own))


def test_the_server_keeps_its_own_xrdcp(tmp_path, monkeypatch):
    """A client environment's tools first on PATH are the clients': the embedded
    server's third-party copy program stays the one beside its own ``xrootd``."""
    system = xrootd_releases.system_binary()
    if system is None or not Path(system).with_name("xrdcp").is_file():
        pytest.skip("no installed xrootd with xrdcp beside it")
    other = tmp_path / "bin"
    other.mkdir()
    (other / "xrdcp").write_text("#!/bin/sh\nexit 0\n")
    (other / "xrdcp").chmod(0o755)
    release = xrootd_releases.XRootDRelease(system, None, "5.5.3")
    monkeypatch.setenv("PATH", f"{other}{os.pathsep}{os.environ['PATH']}")
    assert release.tool("xrdcp") == str(Path(system).with_name("xrdcp"))


@pytest.fixture
def built_client():
    prefix = client_prefix()
    if prefix is None:
        pytest.skip(f"the XRootD {BUILT_VERSION} client environment is not built: run "
                    f"'bash scripts/build-xrootd6.sh --client' (make setup runs it)")
    return prefix


def test_the_built_client_is_the_one_the_run_imports(tmp_path, built_client):
    """pytest under the variable imports 6.2.1's bindings from the client environment,
    maps no XRootD library from elsewhere (Debian's libXrdCl.so.3 has the same soname),
    and finds 6.2.1's xrdcp first on PATH."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "probe.json"
    done = _pytest(tmp_path, env={CLIENT_VARIABLE: BUILT_VERSION, "PROBE_OUT": str(out)})
    assert done.returncode == 0, done.stdout + done.stderr
    probe = json.loads(out.read_text())
    assert probe["version"] == BUILT_VERSION
    assert probe["file"].startswith(str(built_client / "python") + "/")
    assert probe["libs"] and all(lib.startswith(str(built_client / "python") + "/")
                                 for lib in probe["libs"]), probe["libs"]
    assert probe["path"].split(os.pathsep)[0] == str(built_client / "bin")
    version = subprocess.run([str(built_client / "bin" / "xrdcp"), "--version"],
                             capture_output=True, text=True, timeout=60)
    assert f"v{BUILT_VERSION}" in version.stdout + version.stderr


def _compat_matrix():
    """scripts/compat_matrix.py as a module."""
    spec = importlib.util.spec_from_file_location("compat_matrix",
                                                  ROOT / "scripts" / "compat_matrix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("compat_matrix", module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def test_the_matrix_is_every_client_with_every_server():
    compat = _compat_matrix()
    cells = compat.release_cells(["", BUILT_VERSION], ["5.5.3", BUILT_VERSION])
    assert {(c.client, c.server) for c in cells} == {
        (client, server) for client in ("", BUILT_VERSION) for server in ("5.5.3", BUILT_VERSION)}
    assert {(c.check, c.login) for c in cells} == {("auth", "unix"), ("auth", "gsi"),
                                                   ("conformance", "unix")}
    installed = compat.ReleaseCell("", "5.5.3", "auth", "gsi")
    assert CLIENT_VARIABLE not in installed.environment()
    assert compat.ReleaseCell(BUILT_VERSION, "5.5.3", "auth", "gsi").environment()[
        CLIENT_VARIABLE] == BUILT_VERSION
    argv = installed.argv(Path("r.json"), Path("j.xml"), 0.05)
    assert argv[argv.index("--storage-embedded-version") + 1] == "5.5.3"
    assert argv[argv.index("-k") + 1] == "auth_rate_gsi"


@pytest.mark.integration
def test_a_matrix_cell_is_a_real_run_with_its_client_release(tmp_path, built_client,
                                                             monkeypatch):
    """One cell of the client x server matrix (scripts/compat_matrix.py --clients):
    the 6.2.1 client's unix logins against the embedded xrootd 5.5.3, a real pytest
    run; the run itself records the client library it used and the server's version,
    and the steps measured logins."""
    compat = _compat_matrix()
    monkeypatch.setattr(compat, "CLIENT_MATRIX_STEP_S", 1.0)
    result = compat.run_release_cell(compat.ReleaseCell(BUILT_VERSION, "5.5.3", "auth"),
                                     tmp_path, 0.05, 600)
    assert result.outcome == "pass", result.reason
    assert result.client_version == BUILT_VERSION
    assert result.server_version == "5.5.3"
    assert result.steps and all(rate > 0 and failed == 0
                                for _, rate, _, failed, _ in result.steps), result.steps
    header = compat.RunHeader(date="now", host="here", commit="c", load="1", cpus=2,
                              scale=0.05, timeout=600)
    table = compat.render_releases([result], header)
    assert f"| auth unix | {BUILT_VERSION} | 5.5.3 | " in table


def test_bindings_imported_before_the_choice_are_refused_not_switched(built_client,
                                                                      monkeypatch):
    """A process that imported Debian's bindings before the client release was chosen
    (a conftest, another plugin) is told to set the variable before Python starts: two
    releases' libXrdCl of one soname in one process is never attempted."""
    pytest.importorskip("XRootD")
    from pytest_storagescale.errors import StorageScaleUsageError

    monkeypatch.setenv(CLIENT_VARIABLE, BUILT_VERSION)
    with pytest.raises(StorageScaleUsageError, match="imported the XRootD bindings from"):
        xrootd_releases.use_client_release()
    assert str(built_client / "python") not in sys.path


def test_the_client_build_is_keyed_cached_and_marked_last(tmp_path):
    """scripts/build-xrootd6.sh --client: its prefix is under the cache, keyed apart
    from the server's; a prefix with the marker and a clean RUNPATH is not built again
    (a dry run says what it would build otherwise: pip from the pinned sdist)."""
    script = ROOT / "scripts" / "build-xrootd6.sh"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script), *args], env=env, capture_output=True,
                              text=True, timeout=120)
    prefix = Path(run("--print-client-prefix").stdout.strip())
    server = Path(run("--print-prefix").stdout.strip())
    assert prefix.is_relative_to(tmp_path / "pytest-storagescale")
    assert prefix.name.startswith(f"xrootd-client-{BUILT_VERSION}-") and prefix != server
    (server).mkdir(parents=True)
    (server / ".storagescale-built").write_text("version=6.2.1\n")
    sdist = tmp_path / "pytest-storagescale" / "sdist" / f"xrootd-{BUILT_VERSION}.tar.gz"
    sdist.parent.mkdir(parents=True)
    cached = Path.home() / ".cache" / "pytest-storagescale" / "sdist" / sdist.name
    if not cached.is_file():
        pytest.skip("the pinned sdist is not cached on this machine")
    sdist.symlink_to(cached)
    dry = run("--client", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"pip install --target {prefix}/python {sdist}" in dry.stdout
    prefix.mkdir(parents=True)
    (prefix / ".storagescale-built").write_text("version=6.2.1\n")
    again = run("--client")
    assert again.returncode == 0, again.stderr
    assert "client environment is already built" in again.stdout
