"""The public API: what ``pytest_storagescale`` exports (``__all__``, imported on first
use), the fixtures a suite builds on, and ``storage_load`` built from the smaller
fixtures, so a site's conftest that overrides ``storage_thresholds`` or
``storage_endpoint`` changes the steps (issue 23)."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_storagescale

SUITES = Path(__file__).parent.parent / "suites"

def _python(code: str) -> list[str]:
    """What a fresh interpreter prints running ``code``."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def test_the_package_exports_its_api_and_imports_nothing_until_asked():
    code = ("import sys, pytest_storagescale as p\n"
            "print(sorted(m for m in sys.modules if m.startswith('pytest_storagescale.')))\n"
            "print(sorted(m for m in ('pytest', 'psutil') if m in sys.modules))\n"
            "[getattr(p, name) for name in p.__all__]\n"
            "print(p.Driver.__module__, p.RuleCheck.__module__)\n")
    out = _python(code)
    assert out[:2] == ["[]", "[]"]  # the import alone loads nothing
    assert out[2] == "pytest_storagescale.drivers.base pytest_storagescale.records"
    wanted = {"Driver", "DriverSpec", "register_driver", "Operation", "Param",
              "register_operation", "register_metric", "StepRecord", "Verdict", "RuleCheck",
              "Door", "StorageError", "StorageNotFound", "StorageScaleUsageError"}
    assert wanted <= set(pytest_storagescale.__all__)
    assert set(pytest_storagescale.__all__) == set(pytest_storagescale._EXPORTS)


def test_the_step_record_holds_its_cluster_hosts_without_importing_the_cluster():
    """A cluster step's hosts are part of its result (the executor returns them); the
    records, which the results file and every report read, do not import the cluster."""
    code = ("import sys\n"
            "from pytest_storagescale.records import StepRecord\n"
            "from pytest_storagescale.load.stats import HostResult, StepResult\n"
            "host = HostResult('h', '10.0.0.1', 'tcp://10.0.0.1:1', 2, 0.0, lost=2)\n"
            "result = StepResult('stat', 2, 0.0, 1.0, 1.0, 0.0, hosts=[host], lost=2)\n"
            "again = StepRecord.from_json(StepRecord('s', 't', 'stat', 'stat', 2,\n"
            "                                        result=result).to_json())\n"
            "print(again.hosts == [host], again.lost,\n"
            "      any(m.startswith('pytest_storagescale.cluster') for m in sys.modules))\n")
    assert _python(code) == ["True 2 False"]


#: the session object and the ways to it: a suite reads the fixtures, or, in a hook that
#: gets only the config, storage_view(config) (a frozen SessionView)
SESSION_NAMES = {"storage_run", "storage_run_key", "StorageRun", "stash"}
#: the public submodules a suite may import beside the package's names
PUBLIC_MODULES = {"pytest_storagescale.conformance"}


def session_uses(path: Path) -> list[str]:
    """Where ``path`` names the session object or the config's stash (line: name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names] + [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            if name in SESSION_NAMES or name.startswith("pytest_storagescale.session"):
                found.append(f"{path.name}:{node.lineno}: {name}")
    return found


def test_no_suite_touches_the_session_object_or_a_private_module():
    """``storage_run`` left the public API (issue 33): what suites read of the session
    comes from fixtures (storage_settings, storage_endpoint.is_embedded...) or the view."""
    uses, private = [], set()
    for path in sorted(SUITES.rglob("*.py")):
        uses += session_uses(path)
        private |= set(re.findall(r"(pytest_storagescale\.[\w.]+) import", path.read_text()))
    assert uses == []
    # the protocol rules are the driver classes' (Driver.is_xrootd, create_command,
    # url_of, XRootD's locate and logins), reached through a door: no private module
    assert private - PUBLIC_MODULES == set(), sorted(private)


def test_the_guard_sees_each_way_to_the_session(tmp_path):
    suite = tmp_path / "conftest.py"
    suite.write_text("from pytest_storagescale.fixtures import storage_run\n"
                     "import pytest_storagescale.session\n"
                     "def hook(config):\n"
                     "    return config.stash, storage_run(config).settings\n")
    found = [line.split(": ", 1)[1] for line in session_uses(suite)]
    assert found.count("storage_run") == 2 and "stash" in found
    assert "pytest_storagescale.session" in found


def test_the_session_is_not_public_and_its_view_is_read_only():
    assert "storage_run" not in pytest_storagescale.__all__
    assert not hasattr(pytest_storagescale, "storage_run")
    assert {"storage_view", "SessionView"} <= set(pytest_storagescale.__all__)
    moved = {"door_names", "door_problem", "folder_name", "checksum_hint", "remove_folder"}
    assert not moved & set(pytest_storagescale.__all__)
    from pytest_storagescale import conformance

    assert set(conformance.__all__) == moved - {"door_names"}
    view = pytest_storagescale.SessionView(
        settings=None, suite_options={}, is_embedded=True, embedded_kind="xrootd",
        embedded_server=None, _door_names=lambda: ("root",), _thresholds=lambda s: s)
    assert view.door_names == ("root",) and view.thresholds("x") == "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.is_embedded = False  # type: ignore[misc]


CONFTEST = '''
import threading
from pathlib import Path

import pytest

from pytest_storagescale import StorageEndpoint, driver_spec, load_thresholds
from pytest_storagescale.drivers.memory import MemoryDriver


class Elsewhere(MemoryDriver):
    """Another storage (the memory driver under its own scheme), counting its logins."""

    name = "elsewhere"
    schemes = ("elsewhere",)
    logins = 0
    lock = threading.Lock()

    def connect(self):
        with Elsewhere.lock:
            Elsewhere.logins += 1
        super().connect()


def pytest_storagescale_drivers():
    return [Elsewhere]
'''

OWN_THRESHOLDS = '''
@pytest.fixture
def storage_thresholds():
    return load_thresholds(Path(__file__).parent / "mine.toml")
'''

OWN_ENDPOINT = '''
class ElsewhereEndpoint(StorageEndpoint):
    @property
    def driver_spec(self):
        return driver_spec("elsewhere://store/area", writable_root=self.run_dir)


@pytest.fixture(scope="session")
def storage_endpoint(storage_endpoint, request):
    return ElsewhereEndpoint.like(storage_endpoint)
'''

FILE = '''
[storage]
system = "site"
versions = ["*"]

[defaults]
duration = "{duration}"
hang_timeout = "5s"

[ops.stat]
clients = [2]

[[ops.stat.expect]]
rules = {rules}
'''

SUITE = '''
import pytest

pytestmark = pytest.mark.storagescale_system("site")


@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    record = storage_load.run()
    {after}
'''


def _site(pytester, conftest: str, after: str = "pass"):
    pytester.makeconftest(CONFTEST + conftest)
    (pytester.path / "thresholds" / "site").mkdir(parents=True)
    (pytester.path / "thresholds" / "site" / "default.toml").write_text(
        FILE.format(duration="0.5s", rules='["succeeded >= 1"]'))
    (pytester.path / "mine.toml").write_text(
        FILE.format(duration="0.3s", rules='["hung == 0", "failed == 0"]'))
    pytester.makepyfile(test_site=SUITE.format(after=after))
    results = pytester.path / "r.json"
    outcome = pytester.runpytest_subprocess(
        "--storage-endpoint", "memory://store/area", "--storage-version", "1.0",
        "--storage-executor", "threads", f"--storage-results={results}",
        "-p", "no:cacheprovider", "-p", "no:xdist")
    outcome.assert_outcomes(passed=1)
    [step] = json.loads(results.read_text())["steps"]
    return step


def test_a_conftests_storage_thresholds_plans_and_judges_the_steps(pytester):
    step = _site(pytester, OWN_THRESHOLDS,  # the record holds the engine's plan
                 after="assert record.plan.duration == 0.3 and record.plan.clients == 2")
    assert Path(step["thresholds_file"]) == pytester.path / "mine.toml"
    assert step["planned_duration_s"] == 0.3
    rules = [check["rule"] for check in step["checks"]]
    assert rules[:2] == ["hung == 0", "failed == 0"] and "succeeded >= 1" not in rules


def test_a_conftests_storage_endpoint_carries_the_steps(pytester):
    step = _site(pytester, OWN_ENDPOINT,
                 after="from conftest import Elsewhere\n    assert Elsewhere.logins >= 2\n"
                       "    assert record.plan.driver.name == 'elsewhere'")
    assert Path(step["thresholds_file"]).name == "default.toml"  # only the endpoint
