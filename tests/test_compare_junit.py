"""The behaviour gate in JUnit XML (issue 32's "behaviour gate not in JUnit"): a run
whose checks changed behaviour against its baseline carries the gate's verdict and
what changed as properties of the ``<testsuite>`` in pytest's ``--junitxml`` file,
where a CI server that reads JUnit shows it; a run without a baseline adds none.
Real pytest sessions against a file:// area."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from pytest_storagescale.compare import JUNIT_GATE, JUNIT_GATE_LINES, junit_behaviour_gate

CHECKS = """
import os

import pytest


def test_prepare_stage(storage_endpoint):
    if os.environ.get("SCALE_V2"):
        pytest.xfail("known issue: the door refuses a stage request ([3013])")


def test_checksum(storage_endpoint):
    pass
"""


def _properties(path) -> dict[str, str]:
    root = ET.parse(path).getroot()
    [suite] = root.findall("testsuite") if root.tag == "testsuites" else [root]
    return {p.get("name"): p.get("value") for p in suite.iter("property")
            if p.get("name", "").startswith("storagescale_behaviour")}


@pytest.fixture
def run(pytester, tmp_path):
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_checks=CHECKS)

    def session(version: str, *args: str):
        return pytester.runpytest(f"--storage-endpoint=file://{area}",
                                  f"--storage-version={version}", "-p", "no:cacheprovider",
                                  *args)
    return session


def test_the_behaviour_gate_is_a_property_of_the_junit_testsuite(pytester, run, monkeypatch):
    first = run("1.0", "--storage-results=base.json", "--junitxml=base.xml")
    first.assert_outcomes(passed=2)
    assert _properties(pytester.path / "base.xml") == {}  # no baseline: no gate
    monkeypatch.setenv("SCALE_V2", "1")
    changed = run("2.0", "--storage-baseline=base.json", "--junitxml=b.xml")
    assert changed.ret == 1
    found = _properties(pytester.path / "b.xml")
    assert found[JUNIT_GATE] == (f"gate: 1 behaviour change not accepted (against "
                                 f"{pytester.path / 'base.json'})"), found
    assert "test_checks.py::test_prepare_stage: passed -> xfailed" in found[JUNIT_GATE_LINES]
    # the rest of pytest's file is as it wrote it
    root = ET.parse(pytester.path / "b.xml").getroot()
    assert len(list(root.iter("testcase"))) == 2


def test_a_junit_file_that_cannot_be_read_is_said_not_raised(tmp_path):
    class Gate:
        def lines(self):
            return ["gate: FAILED", "a change"]

    broken = tmp_path / "j.xml"
    broken.write_text("<testsuites><testsuite>")  # cut off
    note = junit_behaviour_gate(broken, Gate())  # type: ignore[arg-type]
    assert note is not None and note.startswith(f"JUnit XML {broken}: the behaviour gate "
                                                f"not added")
    assert junit_behaviour_gate(None, Gate()) is None  # type: ignore[arg-type]
