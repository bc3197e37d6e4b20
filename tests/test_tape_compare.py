"""What changed on the tape path in ``storagescale compare`` (reporting/tape.py): the
dCache suite's tape steps of two runs matched by section, interface (label), door and
clients, each served or not in each run with its rates or dCache's answer, the
changes (served in one run only, or failing with another kind of error) first, right
under the gate's lines. The phrases on hand-made records first; then the two results
files the tape steps of suites/dcache wrote against the embedded 10.2.25 and 11.2.5
(tests/data/tape-10.2.25.json, tape-11.2.5.json: real runs, see docs/dcache-upgrade.md).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from test_reporting_units import record, side

from pytest_storagescale.compare import load_runs, report_lines
from pytest_storagescale.reporting import tape

DATA = Path(__file__).parent / "data"
BEFORE, AFTER = DATA / "tape-10.2.25.json", DATA / "tape-11.2.5.json"


def _stage(interface: str, *, succeeded: int = 8, failed: int = 0, error: str = "",
           kind: str = "StageRefused", clients: int = 1):
    result = side(clients, succeeded=succeeded, failed=failed, duration_s=8.0)
    if failed:
        result = dataclasses.replace(result, errors={kind: failed},
                                     error_examples={kind: error})
    step = record("stage", clients, label=interface, sides={"stage": result},
                  params={"interface": interface})
    return dataclasses.replace(step, test=f"test_tape.py::test_stage[{interface}]",
                               door="davs")


def test_a_stage_served_in_one_run_only_is_a_change_listed_first() -> None:
    before = [_stage("tape-rest"), _stage("srm"),
              _stage("root", succeeded=0, failed=1, kind="TimeoutError",
                     error="locality NEARLINE after 120 s, not ONLINE")]
    after = [_stage("tape-rest", succeeded=8),
             _stage("srm", succeeded=0, failed=8, kind="EndpointError",
                    error="srmBringOnline answered 500"),
             _stage("root", succeeded=0, failed=1,
                    error="[3013] Request 3021 not supported")]
    lines = tape.tape_lines(
        ("A", before, {"test_tape.py::test_stage[root]": "xfailed"}),
        ("B", after, {"test_tape.py::test_stage[root]": "xfailed"}))
    assert lines[0] == "tape path (A -> B): 2 changes in what is served or how it fails:"
    # the changes: root fails otherwise (timed out -> refused), srm no longer served
    assert lines[1].startswith("  stage[root] over davs, 1 client: A NOT served: 1 of 1 "
                               "failed (locality NEARLINE")
    assert "[xfailed] -> B NOT served: 1 of 1 failed ([3013] Request 3021 not supported) " \
           "[xfailed]" in lines[1]
    assert lines[2].startswith("  stage[srm] over davs, 1 client: A served: 8 in ")
    assert "-> B NOT served: 8 of 8 failed (srmBringOnline answered 500)" in lines[2]
    assert lines[3] == "  the same in both (served or not in each):"
    assert lines[4].startswith("    stage[tape-rest] over davs, 1 client: A served: 8 in ")
    assert lines[4].endswith("(+0 %)") or "%" in lines[4]
    # a run without tape steps: no lines at all
    assert tape.tape_lines(("A", [record()], {}), ("B", [record()], {})) == []


def test_a_step_of_one_run_only_is_a_change() -> None:
    lines = tape.tape_lines(("A", [_stage("tape-rest")], {}),
                            ("B", [_stage("tape-rest"), _stage("tape-rest token")], {}))
    assert lines[0].endswith("1 change in what is served or how it fails:")
    assert lines[1].startswith("  stage[tape-rest token] over davs, 1 client: B only: served")


@pytest.mark.skipif(not (BEFORE.exists() and AFTER.exists()),
                    reason="the two runs' results files are not in tests/data")
def test_compare_of_the_two_releases_runs_lists_the_tape_path_under_the_gate() -> None:
    """The two real runs (tests/data: the whole-suite runs of both releases over
    every door at --storage-scale 0.05, 2026-11-29, docs/dcache-upgrade.md, kept to
    their tape steps and tape tests): the tape block comes right after the gate's
    lines, before the table; xrootd's stage is a change (10.2.25 accepted it and staged
    nothing within the step, 11.2.5 refused it), the Tape REST API served both."""
    runs = load_runs([BEFORE, AFTER])
    lines = report_lines(runs)
    at = next(index for index, line in enumerate(lines) if line.startswith("tape path"))
    table = next(index for index, line in enumerate(lines) if line.startswith("op "))
    assert 0 < at < table
    block = lines[at:table]
    print("\n".join(block))
    root = [line for line in block if line.lstrip().startswith("stage[root]")]
    assert root and all("A NOT served" in line and "B NOT served" in line for line in root)
    assert any("Request 3021 not supported" in line for line in root)
    rest = [line for line in block if line.lstrip().startswith("stage[tape-rest]")]
    assert rest and all("A served" in line and "B served" in line for line in rest)
    bulk = [line for line in block if line.lstrip().startswith("stage_bulk")]
    assert bulk and all("A served: 1 in" in line and "B served: 1 in" in line for line in bulk)
    writes = [line for line in block if line.lstrip().startswith("tape_write")]
    assert {"tape_write[disk]", "tape_write[tape]"} <= {line.split()[0] for line in writes}
    assert all("MB/s" in line for line in writes)
    # the command itself
    done = subprocess.run([sys.executable, "-m", "pytest_storagescale.cli", "compare",
                           str(BEFORE), str(AFTER)], capture_output=True, text=True,
                          timeout=120)
    assert "tape path (A -> B)" in done.stdout, done.stdout + done.stderr


def test_the_gates_lines_name_a_steps_door() -> None:
    """A run over several doors has one ``ls at 1 clients`` per door: the compare's
    regression, failure and inconclusive lines name the door the step ran over (the
    whole-suite compare of both releases printed ``ls_open at 5/s ...: inconclusive``
    with no door); a step of results written before doors were recorded, none."""
    from pytest_storagescale.compare import _where

    step = dataclasses.replace(record("ls", 1), door="davs")
    assert _where(step) == "ls at 1 clients over davs"
    assert _where(dataclasses.replace(step, door="")) == "ls at 1 clients"
