"""The wheel ships the suites and their thresholds, and an installed plugin runs a
shipped suite through ``--pyargs`` with no checkout at hand."""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from pytest_storagescale.metrics import known_metrics

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
SUITES_PACKAGE = "storagescale_suites"

# Loaded with -p into the installed session: records which copy of the plugin that
# session imported, under which names it registered it, and where its tests came from.
PROBE = """
import json
from pathlib import Path

def pytest_collection_finish(session):
    import pytest_storagescale.plugin as plugin
    from pytest_storagescale.shipped import shipped_suites, shipped_thresholds
    registered = [name for name, module in session.config.pluginmanager.list_name_plugin()
                  if module is plugin]
    Path("probe.json").write_text(json.dumps({
        "plugin": plugin.__file__,
        "registered_as": registered,
        "items": sorted({str(item.path) for item in session.items}),
        "shipped_suites": str(shipped_suites()),
        "shipped_thresholds": str(shipped_thresholds()),
    }))
"""


def _installed_env(site: Path) -> dict[str, str]:
    """The environment of a session that imports only the installed wheel in ``site``:
    a session of its own, none of this session's xdist or PYTEST_ADDOPTS settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(site)
    return env


def _installed_name(path: Path) -> str:
    """Where a checkout file lands in the wheel (pyproject's package-dir mapping)."""
    relative = path.relative_to(REPO)
    top, rest = relative.parts[0], relative.parts[1:]
    if top == "suites":
        return "/".join((SUITES_PACKAGE, *rest))
    if top == "thresholds":
        return "/".join((SUITES_PACKAGE, "thresholds", *rest))
    return relative.as_posix()


def _checkout_files() -> list[Path]:
    files = [*REPO.glob("pytest_storagescale/**/*.py"), *REPO.glob("suites/**/*.py"),
             *REPO.glob("thresholds/*/*.toml")]
    return sorted(path for path in files if "__pycache__" not in path.parts)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the checkout's sources.

    A copy, because building in the checkout leaves ``build/`` behind and setuptools
    ships stale modules from it into later wheels.
    """
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("pytest_storagescale", "suites", "thresholds"):
        shutil.copytree(REPO / folder, source / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
         "-w", str(root / "dist"), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output[-3000:]
    # setuptools' hint that a package folder is missing from [tool.setuptools] packages
    assert "absent from the `packages` configuration" not in output, output[-3000:]
    (wheel,) = (root / "dist").glob("pytest_storagescale-*.whl")
    return wheel


def test_wheel_ships_suites_thresholds_and_the_plugin(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("storagescale_suites/dcache/test_dcache_scalability.py",
                 "storagescale_suites/thresholds/dcache/default.toml",
                 "storagescale_suites/ceph/conftest.py",
                 "pytest_storagescale/plugin.py"):
        assert name in names
    missing = [name for name in map(_installed_name, _checkout_files()) if name not in names]
    assert not missing, (
        f"not in the wheel: {missing}. Add their packages to [tool.setuptools] packages "
        f"in pyproject.toml."
    )
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    assert "storagescale = pytest_storagescale.plugin" in zipfile.ZipFile(wheel).read(
        entry_points).decode()


@pytest.fixture(scope="module")
def installed_run(wheel, tmp_path_factory):
    """``pytest --pyargs storagescale_suites.xrootd --co`` of the installed wheel, run
    from a folder with no thresholds/ while this venv also has the editable install."""
    root = tmp_path_factory.mktemp("installed")
    site, work = root / "site", root / "work"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    work.mkdir()
    (work / "storagescale_probe.py").write_text(PROBE)
    env = _installed_env(site)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "storagescale_probe", "-p", "no:cacheprovider",
         "--pyargs", f"{SUITES_PACKAGE}.xrootd", "--co", "-q"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )
    output = result.stdout + result.stderr
    probe = work / "probe.json"
    assert probe.exists(), f"exit code {result.returncode}:\n{output[-3000:]}"
    return site, result.returncode, output, json.loads(probe.read_text())


def test_installed_plugin_collects_the_shipped_suite(installed_run):
    site, _, output, probe = installed_run
    assert Path(probe["plugin"]).is_relative_to(site), probe["plugin"]
    # the editable install's entry point has the same name and is skipped, not added
    assert probe["registered_as"] == ["storagescale"], output[-3000:]
    assert probe["items"] == [
        str(site / SUITES_PACKAGE / "xrootd" / name)
        for name in ("test_authorization.py", "test_conformance.py",
                     "test_redirection.py", "test_xrootd_scalability.py")]
    assert "test_xrootd_scalability.py::test_round_trip_with_checksum" in output
    # the shared conformance checks, imported from the installed package, by door
    assert "test_conformance.py::TestXRootDConformance::test_cross_door_read[davs]" in output
    assert probe["shipped_suites"] == str(site / SUITES_PACKAGE)
    assert probe["shipped_thresholds"] == str(site / SUITES_PACKAGE / "thresholds")


def test_installed_plugin_defaults_to_the_shipped_thresholds(installed_run):
    """With no thresholds/ under the rootdir, the scans come from the shipped files."""
    _, returncode, output, _ = installed_run
    assert returncode == 0, output[-3000:]
    assert f"{SUITES_PACKAGE}/thresholds/xrootd/" in output, output[-3000:]
    assert re.search(r"::test_stat_scan\[c\d+\]", output), output[-3000:]
    assert "[error]" not in output, output[-3000:]


def test_ceph_suite_registers_the_metric_its_thresholds_name():
    """The suite's conftest, imported as a module of its package (as pytest and the
    installed wheel import it: its ``from . import xcache`` needs the package)."""
    sys.path.insert(0, str(REPO))
    try:
        conftest = importlib.import_module("suites.ceph.conftest")
    finally:
        sys.path.remove(str(REPO))
    metrics = conftest.pytest_storagescale_metrics()
    assert set(metrics) == {"hot_ratio"} and metrics["hot_ratio"]
    plan = tomllib.loads((REPO / "thresholds" / "ceph" / "default.toml").read_text())
    named = {re.match(r"\s*(?:\w+\.)?(\w+)", rule).group(1)
             for section in plan["ops"].values()
             for expect in section.get("expect", ()) for rule in expect["rules"]}
    assert named - set(known_metrics()) == {"hot_ratio"}


def test_installed_suites_conftests_import(installed_run):
    """Each shipped suite's conftest (and through it its own modules, by relative
    imports) imports from the installed package, with no checkout on the path."""
    site, _, _, _ = installed_run
    conftests = sorted((site / SUITES_PACKAGE).glob("*/conftest.py"))
    names = [f"{SUITES_PACKAGE}.{path.parent.name}.conftest" for path in conftests]
    assert f"{SUITES_PACKAGE}.ceph.conftest" in names
    env = _installed_env(site)
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    print(name, importlib.import_module(name).__file__)\n")
    result = subprocess.run([sys.executable, "-c", script, *names], cwd=site.parent,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert all(str(site) in line for line in result.stdout.splitlines()), result.stdout
    assert len(result.stdout.splitlines()) == len(names)


#: the shipped xrootd suite's closed-loop scans (suites/xrootd/test_xrootd_scalability.py)
SCANS = "test_stat_scan or test_ls_scan or test_small_file or test_mixed"


@pytest.mark.long_running
def test_installed_suite_runs_against_the_embedded_server(installed_run):
    """A real run of the shipped suite from the installed wheel, at a small plan scale,
    with the shipped thresholds: every scan step measured and judged. The suite's closed-
    loop scans only (stat, ls, put, get, mixed), one concurrency each (the whole suite
    took 114 s of a make test here): its functional checks run from the checkout in
    test_xrootd_suite_against_embedded_server, whose files the wheel holds
    (test_wheel_ships_suites_thresholds_and_the_plugin) and whose conftests import from
    the installed package (test_installed_suites_conftests_import)."""
    site, _, _, _ = installed_run
    work = site.parent / "work"
    env = _installed_env(site)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs",
         f"{SUITES_PACKAGE}.xrootd", "-k", SCANS, "--storage-clients=2",
         "--storage-scale=0.1", "--storage-results=r.json",
         # steps long enough for the p99 rules on a loaded machine
         "--storage-duration=3s"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )
    output = result.stdout + result.stderr
    # judged, not necessarily passed: the shipped plan's rate and MB/s floors are this
    # machine's speed at scale 0.1 (one writer of 100 kB files made 4.2 MB/s against 5
    # beside stress-ng); a run that failed did so by its rules only
    assert result.returncode in (0, 1), output[-3000:]
    if result.returncode == 1:
        failures = [line for line in result.stdout.splitlines()
                    if line.startswith(("FAILED ", "ERROR "))]
        assert failures and all(line.startswith("FAILED ") and "ThresholdViolation" in line
                                for line in failures), output[-3000:]
    document = json.loads((work / "r.json").read_text())
    assert document["run"]["scale"] == 0.1
    assert f"{SUITES_PACKAGE}/thresholds/xrootd/" in document["run"]["thresholds_file"]
    steps = document["steps"]
    assert {step["op"] for step in steps} >= {"stat", "ls", "put", "get", "mixed"}
    for step in steps:  # every step measured, and judged by the shipped rules
        assert step["succeeded"] > 0 and step["failed"] == 0 and step["hung"] == 0, step
        if step["verdict"] == "info":
            # an open-loop step whose busy client host could not keep its schedule (CI,
            # 2026-11-29: r20hz at load ~20) was judged by its rules and says in its
            # gate why it is not compared (steps.not_comparable)
            assert step["arrival_rate"] and step["checks"], step
            assert step["gate"]["verdict"] == "inconclusive" and any(
                why in step["gate"]["reason"] for why in (
                    "schedule not kept", "neither completed")), step
            continue
        assert step["verdict"] in ("pass", "fail") and step["checks"], step


def _shipped_suites(site: Path) -> list[str]:
    """Every suite the wheel ships: a folder of storagescale_suites with test files."""
    root = site / SUITES_PACKAGE
    return sorted(folder.name for folder in root.iterdir()
                  if folder.is_dir() and any(folder.glob("test_*.py")))


def _servers_their_conftests_name(site: Path, suites: list[str]) -> dict[str, str | None]:
    """What each installed suite's own conftest answers to pytest_storagescale_embedded
    (None: it names none), asked of the installed module itself."""
    env = _installed_env(site)
    script = ("import importlib, json, sys\n"
              "class _Config:  # a session given no option: what the hook reads\n"
              "    def getoption(self, name, default=None):\n"
              "        return default\n"
              "    def getini(self, name):\n"
              "        return ''\n"
              "kinds = {}\n"
              "for suite in sys.argv[1:]:\n"
              "    try:\n"
              f"        module = importlib.import_module(f'{SUITES_PACKAGE}.{{suite}}.conftest')\n"
              "    except ModuleNotFoundError:\n"
              "        kinds[suite] = None\n"
              "        continue\n"
              "    hook = getattr(module, 'pytest_storagescale_embedded', None)\n"
              "    kinds[suite] = hook(_Config()) if hook else None\n"
              "print(json.dumps(kinds))\n")
    result = subprocess.run([sys.executable, "-c", script, *suites], cwd=site.parent,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.long_running
def test_every_shipped_suite_runs_against_the_server_its_conftest_names(installed_run):
    """``pytest --pyargs storagescale_suites.<suite> --co`` of the installed wheel, for
    every shipped suite: it collects, the header names the embedded server the suite's
    conftest chose (xrootd when it names none), its own options are known, and its load
    steps are planned from the shipped thresholds of its own system, matched against
    that server's version. Under
    --pyargs pytest loaded a suite's conftest only at collection, after the server was
    chosen: the dcache suite ran against the embedded xrootd, called "dcache 5.5.3"."""
    site, _, _, _ = installed_run
    work = site.parent / "work"
    suites = _shipped_suites(site)
    assert {"ceph", "conformance", "dcache", "gpfs", "xrootd"} <= set(suites), suites
    kinds = _servers_their_conftests_name(site, suites)
    from pytest_storagescale import embedded_class

    dcache = "dcache" if embedded_class("dcache").available_versions() else "webdav"
    assert kinds["dcache"] == dcache and kinds["ceph"] == "ceph", kinds
    env = _installed_env(site)
    # a suite's own option is known too (its conftest's pytest_addoption, read early)
    options = {"ceph": ["--storage-ceph-xcache=root://127.0.0.1:1//storagescale"]}
    for suite in suites:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs",
             f"{SUITES_PACKAGE}.{suite}", "--co", *options.get(suite, [])],
            cwd=work, env=env, capture_output=True, text=True, timeout=600)  # dCache: ~2 min
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{suite}: {output[-3000:]}"
        assert re.search(r"collected [1-9]\d* items", output), f"{suite}: {output[-3000:]}"
        kind = kinds[suite] or "xrootd"
        assert f"storagescale: endpoint embedded {kind} (" in output, f"{suite}: {output}"
        if kinds[suite]:
            assert f"storage_embedded: {kind} (from the suite's conftest)" in output, output
        plans = re.findall(r"^storagescale: (\S+) (\S+) \(detected from the embedded (\S+)\): "
                           r"thresholds (\S+)", output, re.MULTILINE)
        if (site / SUITES_PACKAGE / "thresholds" / suite).is_dir():
            assert plans, f"{suite}: no thresholds chosen:\n{output[-3000:]}"
        for system, _, detected_from, path in plans:
            assert (system, detected_from) == (suite, kind), f"{suite}: {output[-3000:]}"
            assert Path(path).is_relative_to(site / SUITES_PACKAGE / "thresholds" / suite), path
