"""A site extends the plugin from its own conftest, touching only its new code plus one
registration line each: a new operation, a new driver and a new suite (README,
"Extending")."""

from __future__ import annotations

import json

CONFTEST = '''
from pytest_storagescale.drivers.memory import MemoryDriver
from pytest_storagescale.load.operations import Operation


class Touch(Operation):
    """Create an empty file per repetition."""

    name = "touch"

    def run(self, driver, client, iteration, context):
        driver.put(f"{context['workdir']}/c{client}-{iteration}", b"")
        return 0


class SiteStore(MemoryDriver):
    """The site's own client library (here: the memory driver under another scheme)."""

    name = "sitestore"
    schemes = ("sitestore",)


def pytest_storagescale_operations():
    return [Touch()]


def pytest_storagescale_drivers():
    return [SiteStore]


def pytest_storagescale_metrics():
    return {"touch_share": "touches per stat"}
'''

THRESHOLDS = '''
[storage]
system = "site"
versions = ["*"]

[defaults]
duration = "0.5s"
hang_timeout = "5s"

[ops.touch]
clients = [2]

[[ops.touch.expect]]
rules = ["succeeded >= 1", "failed == 0", "hung == 0", "touch_share > 0"]
'''

SUITE = '''
import pytest

pytestmark = pytest.mark.storagescale_system("site")


@pytest.mark.storagescale_op("touch")
def test_touch_scan(storage_load, storage_clients):
    storage_load.run(derive=lambda step: {"touch_share": step.metric("rate_hz")})


def test_functional_round_trip(storage_client, storage_test_dir):
    storage_client.put(f"{storage_test_dir}/f", b"abc")
    assert storage_client.stat(f"{storage_test_dir}/f").size == 3
'''


def test_site_adds_operation_driver_and_suite(pytester):
    pytester.makeconftest(CONFTEST)
    (pytester.path / "thresholds" / "site").mkdir(parents=True)
    (pytester.path / "thresholds" / "site" / "default.toml").write_text(THRESHOLDS)
    pytester.makepyfile(test_site=SUITE)
    results = pytester.path / "r.json"
    outcome = pytester.runpytest_subprocess(
        "--storage-endpoint", "sitestore://site/area", "--storage-version", "1.0",
        f"--storage-results={results}", "-p", "no:cacheprovider",
    )
    outcome.assert_outcomes(passed=2)
    outcome.stdout.fnmatch_lines(["touch *2 *pass"])
    document = json.loads(results.read_text())
    [step] = document["steps"]
    assert step["operation"] == "touch" and step["succeeded"] >= 1
    assert document["run"]["driver"] == "sitestore"
    assert step["derived"]["touch_share"] > 0


def test_a_name_taken_twice_is_one_paragraph(pytester):
    pytester.makeconftest(CONFTEST.replace('name = "touch"', 'name = "stat"'))
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    outcome = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    outcome.stderr.fnmatch_lines(["*pytest_storagescale_operations*stat*"])
    assert "Traceback" not in outcome.stderr.str()


def test_an_operation_whose_set_up_raises_is_a_recorded_error_step(pytester):
    """A site's operation raising something other than a StorageError in its set-up
    (here a ValueError) used to escape the step: a traceback, and the step missing from
    the table and the JSON. It is the step's error, naming the exception."""
    pytester.makeconftest(CONFTEST.replace(
        "    def run(self, driver, client, iteration, context):",
        "    def prepare(self, driver, workdir, params, clients):\n"
        "        raise ValueError('the site set-up read a malformed answer')\n\n"
        "    def run(self, driver, client, iteration, context):"))
    (pytester.path / "thresholds" / "site").mkdir(parents=True)
    (pytester.path / "thresholds" / "site" / "default.toml").write_text(THRESHOLDS)
    pytester.makepyfile(test_site=SUITE)
    results = pytester.path / "r.json"
    outcome = pytester.runpytest_subprocess(
        "--storage-endpoint", "sitestore://site/area", "--storage-version", "1.0",
        f"--storage-results={results}", "-p", "no:cacheprovider",
    )
    outcome.assert_outcomes(passed=1, failed=1)
    outcome.stdout.fnmatch_lines(["touch *2 *error"])
    [step] = json.loads(results.read_text())["steps"]
    assert step["operation"] == "touch" and step["verdict"] == "error"
    assert step["error"] == ("ValueError in touch's step: the site set-up read a malformed "
                             "answer")
    assert "Traceback" not in outcome.stdout.str() + outcome.stderr.str()
