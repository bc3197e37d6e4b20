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
