"""``make test``'s ``--dist loadgroup``: the tests of one ``xdist_group`` run on one
worker (the session's dCache, ``embedded_dcache``, is started once because of it)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent

GROUPED = """
import os
import pytest

@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("n", range(4))
def test_grouped(n):
    with open(os.environ["WORKERS_SEEN"], "a") as seen:
        seen.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("n", range(4))
def test_free(n):
    pass
"""


def test_an_xdist_group_runs_on_one_worker(pytester, monkeypatch, tmp_path):
    """Eight tests of one group in two files, beside eight free ones, under ``-n 2
    --dist loadgroup`` with this folder's conftest: all eight on one worker (with
    pytest 9.2 and xdist 3.8 alone they were spread over both)."""
    seen = tmp_path / "workers"
    monkeypatch.setenv("WORKERS_SEEN", str(seen))
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(test_one=GROUPED, test_two=GROUPED)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=16)
    workers = seen.read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, workers


MODULE_FIXTURE = """
import os
import time
import pytest

@pytest.fixture(scope="module")
def shared():
    with open(os.environ["SETUPS_SEEN"], "a") as seen:
        seen.write(f"{__name__} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.parametrize("n", range(6))
def test_uses_it(shared, n):
    time.sleep(0.2)

@pytest.mark.parametrize("n", range(2))
def test_free(n):
    pass
"""


def test_a_modules_tests_sharing_its_module_fixture_run_on_one_set_up(pytester, monkeypatch,
                                                                       tmp_path):
    """Two modules whose six tests each use a module-scoped fixture of their module,
    under ``-n 2 --dist loadgroup`` with this folder's conftest: each fixture is set up
    once (ungrouped, each test was a unit of its own and both workers set up both
    fixtures: 4 set-ups, measured with the conftest's grouping taken out)."""
    seen = tmp_path / "setups"
    monkeypatch.setenv("SETUPS_SEEN", str(seen))
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(test_one=MODULE_FIXTURE, test_two=MODULE_FIXTURE)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=16)
    setups = seen.read_text().splitlines()
    assert sorted(line.split()[0] for line in setups) == ["test_one", "test_two"], setups
