"""docs/ci.md's commands: their JUnit options keep the properties a suite records
(``record_property``, as suites/dcache's release-behaviour checks do) in the XML,
without pytest's ``incompatible with junit_family`` warning (issue 31, item 19)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from xml.etree import ElementTree

import pytest

CI_DOC = Path(__file__).resolve().parent.parent / "docs" / "ci.md"

RECORDING = """
def test_records(record_property):
    record_property("bad_logins", "401 401")
    record_property("held_s", 1.25)
"""


def junit_options() -> list[list[str]]:
    """The options after ``--junitxml`` in each of the page's commands."""
    text = CI_DOC.read_text().replace("\\\n", " ")
    commands = [line for line in text.splitlines() if "--junitxml" in line]
    assert len(commands) == 2, commands  # GitHub's and GitLab's
    found = []
    for line in commands:
        words = shlex.split(line.split("--junitxml", 1)[1].strip().strip('"'))
        options = ["--junitxml=junit.xml"]
        for flag, value in zip(words[1:], words[2:], strict=False):
            if flag == "-o":
                options += ["-o", value]
        found.append(options)
    return found


@pytest.mark.parametrize("options", junit_options(), ids=["github", "gitlab"])
def test_the_documented_junit_options_keep_properties_without_a_warning(pytester, options):
    pytester.makepyfile(test_recording=RECORDING)
    result = pytester.runpytest("-p", "no:cacheprovider", *options)
    result.assert_outcomes(passed=1)
    assert "incompatible with junit_family" not in result.stdout.str()
    assert not re.search(r"\d+ warning", result.stdout.str()), result.stdout.str()
    case = ElementTree.parse(pytester.path / "junit.xml").find(".//testcase")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties == {"bad_logins": "401 401", "held_s": "1.25"}


def test_without_them_pytest_warns(pytester):
    """The check above can fail: with pytest's default family (what the page's commands
    gave before) a test recording properties is a warning."""
    pytester.makepyfile(test_recording=RECORDING)
    result = pytester.runpytest("-p", "no:cacheprovider", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, warnings=1)  # one per test using the fixture
    assert "incompatible with junit_family 'xunit2'" in result.stdout.str()
