"""Results files as input (issue 31, items 9, 10, 13 and 18): read bounded (regular
files only, a size cap, no recursion or overflow traceback), shown safely (terminal
control characters escaped, HTML escaped, a ``$`` never mathtext), the comparison
page written without matplotlib, and the report's cause column wrapped."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import matplotlib.pyplot  # noqa: F401 - loaded before pytester's snapshot of sys.modules
import pytest
from test_reporting_units import RUN, record

from pytest_storagescale import cli
from pytest_storagescale.baseline import read_results
from pytest_storagescale.compare import NO_PLOTS, load_runs, page_html
from pytest_storagescale.errors import StorageScaleUsageError
from pytest_storagescale.reporting import plots, results
from pytest_storagescale.reporting.html import _STYLE
from pytest_storagescale.reporting.results import ResultsFile

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).with_name("storagescale")  # the installed console script


def _results(path: Path, version: str = "5.5.3", **step_fields) -> Path:
    run = dataclasses.replace(RUN, version=version)
    ResultsFile(path).write(run, [dataclasses.replace(record(), **step_fields)])
    return path


def _compare(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), "compare", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def _one_paragraph(done: subprocess.CompletedProcess, message: str) -> None:
    assert done.returncode == 4, done
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr, done.stderr


# -- item 9: bounded reading ---------------------------------------------------------------

def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    """Before: compare blocked forever in open() of the FIFO (no writer)."""
    good = _results(tmp_path / "a.json")
    os.mkfifo(tmp_path / "pipe.json")
    done = _compare(str(good), "pipe.json", cwd=tmp_path)  # timeout=120: a hang fails
    _one_paragraph(done, "pipe.json: it is a named pipe (FIFO), not a regular file")


def test_a_device_is_refused_without_reading_it(tmp_path):
    """Before: /dev/zero grew compare's memory until it was killed."""
    done = _compare(str(_results(tmp_path / "a.json")), "/dev/zero", cwd=tmp_path)
    _one_paragraph(done, "/dev/zero: it is a device, not a regular file")


def test_a_file_larger_than_the_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "MAX_INPUT_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"steps": [], "pad": "x" * 2000}))
    with pytest.raises(StorageScaleUsageError, match="holds 20.. bytes, more than the 0 MiB"):
        read_results(big, "storagescale compare")


def test_a_file_whose_size_says_nothing_is_read_up_to_the_cap_only():
    """A regular file whose size is 0 (``/proc``'s) and whose content is longer than
    the cap: read up to cap + 1 bytes, then refused."""
    status = Path("/proc/self/status")
    assert status.stat().st_size == 0 and len(status.read_bytes()) > 200
    with pytest.raises(results.InputFileError, match="more than the 0 MiB"):
        results.read_input_file(status, limit=200)
    assert results.read_input_file(status).startswith(b"Name:")


@pytest.mark.parametrize("content, message", [
    ("[" * 200_000, "nested too deep"),
    ('{"run": {"started": 1e300}, "steps": []}', "the number 1e+300 is out of range"),
    ('{"run": {"started": 1e12}, "steps": []}', "run.started = 1000000000000.0 is not a "
                                                 "time"),
    ('{"run": {}, "steps": [{"clients": 1e400}]}', "the number 1e400 is out of range"),
    ('{"run": {}, "steps": [{"clients": 1e30}]}', "the number 1e+30 is out of range"),
    ('{"run": {}, "steps": [{"clients": NaN}]}', "NaN is not a number of a results file"),
    ('{"run": {}, "steps": [{"started": -5}]}', "steps[0].started = -5 is not a time"),
    ('{"run": {}, "steps": [{"clients": "many"}]}', "a step it holds cannot be read"),
])
def test_malformed_numbers_and_nesting_are_one_paragraph(tmp_path, content, message):
    """Before: RecursionError and OverflowError tracebacks."""
    (tmp_path / "bad.json").write_text(content)
    done = _compare(str(_results(tmp_path / "a.json")), "bad.json", cwd=tmp_path)
    _one_paragraph(done, message)


def test_a_deeply_nested_baseline_is_a_usage_error_not_internalerror(pytester, tmp_path):
    """Before: INTERNALERROR (RecursionError) under --storage-baseline."""
    area = tmp_path / "area"
    area.mkdir()
    pytester.makepyfile(test_checks="def test_ok(storage_endpoint):\n    pass\n")
    (pytester.path / "deep.json").write_text("[" * 200_000)
    result = pytester.runpytest_subprocess(f"--storage-endpoint=file://{area}",
                                           "--storage-version=1.0", "-p", "no:cacheprovider",
                                           "--storage-baseline=deep.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output and "Traceback" not in output
    result.stderr.fnmatch_lines(["ERROR: --storage-baseline *deep.json: its JSON is nested "
                                 "too deep to read*"])


# -- item 13: control characters ------------------------------------------------------------

ESCAPE = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"


def test_control_characters_from_a_results_file_are_escaped(tmp_path, capsys):
    """Before: the terminal got ESC ] (set title), ESC [2J (clear screen) and a C1 CSI."""
    old = _results(tmp_path / "a.json", version=f"5.5.3{ESCAPE}")
    document = json.loads(old.read_text())
    document["tests"] = [{"nodeid": f"t.py::test_x{ESCAPE}", "outcome": "passed"}]
    old.write_text(json.dumps(document))
    new = _results(tmp_path / "b.json", version="6.2.1")
    document = json.loads(new.read_text())
    document["tests"] = [{"nodeid": f"t.py::test_x{ESCAPE}", "outcome": "failed",
                          "cause": f"boom{ESCAPE}"}]
    new.write_text(json.dumps(document))
    capsys.readouterr()
    assert cli.main(["compare", str(old), str(new)]) == 1  # the check failed
    out = capsys.readouterr().out
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", out)
    assert "5.5.3\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202e" in out
    assert "t.py::test_x\\x1b" in out and "boom\\x1b" in out
    page = page_html(load_runs([old, new]))
    assert "\x1b" not in page and "\x9b" not in page and "5.5.3\\x1b]0;owned" in page


def test_html_from_a_results_file_is_escaped(tmp_path):
    files = [_results(tmp_path / "a.json", version="<script>alert(1)</script>"),
             _results(tmp_path / "b.json", version="6.2.1")]
    page = page_html(load_runs(files))
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


# -- item 10: the page without matplotlib, and a $ in a name ------------------------------

def test_the_page_is_written_without_matplotlib_saying_the_plots_are_left_out(
        tmp_path, monkeypatch, capsys):
    """Before: ModuleNotFoundError traceback (the demo environments had no matplotlib)."""
    files = [str(_results(tmp_path / f"{name}.json")) for name in "ab"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    assert not plots.available()
    assert cli.main(["compare", *files, "--html", str(tmp_path / "page")]) == 0
    page = (tmp_path / "page" / "index.html").read_text()
    assert NO_PLOTS in page and "<img" not in page and "Steps, run by run" in page
    assert "ModuleNotFoundError" not in capsys.readouterr().err


@pytest.mark.parametrize("text", ["$\\foo$", "$x^$", "cost $5 and $6", "a$b"])
def test_a_dollar_in_a_step_name_or_version_is_drawn_as_written(tmp_path, text):
    """Before: matplotlib's mathtext parsed '$\\foo$' and raised ValueError."""
    files = [_results(tmp_path / "a.json", version=text, section=f"stat{text}"),
             _results(tmp_path / "b.json", version=f"6{text}", section=f"stat{text}")]
    page = page_html(load_runs(files))
    assert "<img" in page  # the overlay was drawn
    figure = plots.overlay_figure(f"stat{text}", {f"A: {text}": load_runs(files)[0].steps})
    figure.canvas.draw()  # mathtext would raise here
    assert figure.axes[0].get_title() == plots.plain(f"scan: stat{text}")
    assert figure.axes[0].title.get_text().replace("\\$", "$") == f"scan: stat{text}"
    assert not figure.axes[0].title._preprocess_math(figure.axes[0].get_title())[1]


def test_the_demo_environments_install_matplotlib():
    """make demo / make upgrade-demo (bootstrap.sh demo|upgrade) install the report
    extra, so upgrade-demo's last command, compare --html, draws its plots."""
    script = (REPO / "scripts" / "bootstrap.sh").read_text()
    spec = re.search(r"local spec='\.\[([\w,]+)\]'", script)
    assert spec is not None
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    wanted = [pin for name in spec.group(1).split(",") for pin in extras[name]]
    assert any(pin.startswith("matplotlib") for pin in wanted), spec.group(1)


# -- item 18: the report's cause column wraps ---------------------------------------------

def test_the_cause_column_and_the_why_block_wrap():
    """Before: td.cause had max-width 60em and a fixed-less table; long node ids and the
    Why block (a <pre>) ran past the page's right edge."""
    rules = {match.group(1).strip(): match.group(2)
             for match in re.finditer(r"([^{}]+)\{([^}]*)\}", _STYLE)}
    assert "overflow-wrap: anywhere" in rules["td.cause"]
    assert "max-width" not in rules["td.cause"]
    assert "table-layout: fixed" in rules["table.tests"] and "width: 100%" in rules[
        "table.tests"]
    assert "overflow-wrap: anywhere" in rules["table.tests td"]
    assert "white-space: pre-wrap" in rules["pre"]
