"""The public API: what ``pytest_storagescale`` exports (``__all__``, imported on first
use), the fixtures a suite builds on, and ``storage_load`` built from the smaller
fixtures, so a site's conftest that overrides ``storage_thresholds`` or
``storage_endpoint`` changes the steps (issue 23)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

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


def test_no_suite_reaches_into_the_plugins_state_or_its_private_modules():
    stash, private = [], set()
    for path in sorted(SUITES.rglob("*.py")):
        text = path.read_text()
        if "storage_run_key" in text or "config.stash" in text:
            stash.append(path.name)
        private |= set(re.findall(r"(pytest_storagescale\.[\w.]+) import", text))
    assert stash == []  # storage_run(config) / the fixtures instead
    # the protocol rules are the driver classes' (Driver.is_xrootd, create_command,
    # url_of, XRootD's locate and logins), reached through a door: no private module
    assert private == set(), sorted(private)


CONFTEST = '''
import threading
from pathlib import Path

import pytest

from pytest_storagescale import StorageEndpoint, driver_spec, load_thresholds, storage_run
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
    return ElsewhereEndpoint(storage_run(request.config), storage_endpoint.run_dir)
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
