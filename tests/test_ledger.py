"""The step ledger (session/ledger.py): a step is logged when it begins and when it
ends; the owner of the results records one never finished (its process died mid-step)
with a verdict naming that process. The whole path, with a worker killed under
``pytest -n 2``, is in test_plugin.py."""

from __future__ import annotations

import dataclasses
import json

from test_reporting_units import RUN, mixed, record

from pytest_storagescale.records import Verdict
from pytest_storagescale.reporting.results import ResultsFile
from pytest_storagescale.session.ledger import StepLedger


def _ledgers(tmp_path):
    """A worker's ledger and the owner's, on one shared folder; the owner writes r.json."""
    shared = tmp_path / "shared"
    return (StepLedger(shared, ResultsFile(None)),
            StepLedger(shared, ResultsFile(tmp_path / "r.json")))


def test_a_begun_step_waits_for_its_end_and_is_not_a_finished_step(tmp_path):
    worker, owner = _ledgers(tmp_path)
    begun = record(worker="gw0", verdict=Verdict.INFO, sides={})
    worker.begin(RUN, begun)
    assert owner.sync() == [] and owner.steps == []  # not a step of the table yet
    assert worker.logged() == []  # a scan's plot reads finished steps only
    worker.append(RUN, dataclasses.replace(begun, verdict=Verdict.PASS))
    [step] = owner.sync()
    assert step.verdict is Verdict.PASS
    assert owner.lose(None, "never finished ({worker})") == []  # it finished


def test_a_step_whose_process_died_is_recorded_naming_it(tmp_path):
    worker, owner = _ledgers(tmp_path)
    worker.begin(RUN, record("stat", 2, worker="gw0", sides={}))
    worker.begin(RUN, record("put", 3, worker="gw1", sides={}))
    [lost] = owner.lose("gw0", "the worker {worker} was lost")
    assert (lost.section, lost.verdict, lost.error) == ("stat", Verdict.ERROR,
                                                         "the worker gw0 was lost")
    [stopped] = owner.lose(None, "interrupted ({worker})", Verdict.INTERRUPTED)
    assert (stopped.section, stopped.verdict, stopped.error) == (
        "put", Verdict.INTERRUPTED, "interrupted (gw1)")
    written = json.loads((tmp_path / "r.json").read_text())["steps"]
    assert sorted((s["op"], s["verdict"]) for s in written) == [
        ("put", "interrupted"), ("stat", "error")]
    assert owner.lose(None, "again") == [] and owner.sync() == []  # each once


def test_the_shared_folder_is_this_users_only_and_a_forged_one_refused(tmp_path):
    """The session's processes hand each other the embedded server's URL (a dCache
    door's password in it), minted tokens and the steps in the shared folder, named by
    the run id in the temporary folder: it is made 0700, and one found there already
    that is a link, open to others or another user's is a usage error, never used."""
    import os
    import stat

    import pytest

    from pytest_storagescale.errors import StorageScaleUsageError
    from pytest_storagescale.session.ledger import private_folder

    made = private_folder(tmp_path / "run")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert private_folder(made) == made  # another process of the session: the same
    worker, _ = _ledgers(tmp_path)
    with worker.lock():
        assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o700
    forged = tmp_path / "forged-open"
    forged.mkdir()
    forged.chmod(0o777)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "forged-link").symlink_to(elsewhere)
    cases = [forged, tmp_path / "forged-link"]
    if os.geteuid() == 0:
        other = tmp_path / "forged-other"
        other.mkdir(mode=0o700)
        os.chown(other, 65534, 65534)
        cases.append(other)
    for path in cases:
        with pytest.raises(StorageScaleUsageError, match="is not this user's private folder"):
            private_folder(path)
        with pytest.raises(StorageScaleUsageError):
            with StepLedger(path, ResultsFile(None)).lock():
                pass
    assert list(elsewhere.iterdir()) == []  # nothing written through the link


def test_a_forged_shared_folder_stops_the_session_and_is_left_alone(pytester, tmp_path):
    """Through the plugin: a folder in the run id's name made before the session (by
    someone else, open to all) is a usage error before any test, and the session's
    end does not remove it or what is in it (it is not the run's)."""
    import tempfile
    from pathlib import Path

    name = f"storagescale-run-forged-{tmp_path.name}"
    forged = Path(tempfile.gettempdir()) / name
    forged.mkdir(mode=0o777)
    forged.chmod(0o777)
    (forged / "theirs").write_text("a co-tenant's file\n")
    try:
        pytester.makeconftest(f"import pytest_storagescale.session as session\n"
                              f"session.make_run_id = lambda: {name!r}\n")
        pytester.makepyfile(test_suite="def test_endpoint(storage_endpoint):\n"
                                       "    assert storage_endpoint.version\n")
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
        assert result.ret == 4, result.stdout.str()[-2000:]
        assert "is not this user's private folder" in result.stderr.str()
        assert (forged / "theirs").read_text() == "a co-tenant's file\n"
    finally:
        import shutil

        shutil.rmtree(forged, ignore_errors=True)


# -- the results file: written as steps end, not once per step ---------------------------

def _steps(count: int):
    return [dataclasses.replace(record("stat", 1 + index % 5, started=1000.0 + index),
                                step_id=f"gw0-{index:03d}") for index in range(count)]


def _written(path) -> dict:
    return json.loads(path.read_text())


def _count_writings(monkeypatch, path) -> list[str]:
    """Each writing of ``path`` (a rename onto it) appends to the list returned."""
    import os

    renamed: list[str] = []
    replace = os.replace

    def counting(source, target, *args, **kwargs):
        if os.fspath(target) == os.fspath(path):
            renamed.append(os.fspath(source))
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", counting)
    return renamed


def test_steps_ending_within_the_gap_are_written_together_not_one_writing_each(
        tmp_path, monkeypatch):
    """50 steps that end faster than the gap between writings: the file is written
    for the first, the others wait (here for a gap of an hour: no timer comes), and
    the session's end writes them all. Before, each step rewrote the whole growing
    file: 50 writings (quadratic in the steps; 249 s of a 358 s run)."""
    import pytest_storagescale.reporting.results as results

    monkeypatch.setattr(results, "MIN_REWRITE_GAP_S", 3600.0, raising=False)
    writings = _count_writings(monkeypatch, tmp_path / "r.json")
    worker, owner = _ledgers(tmp_path)
    for step in _steps(50):
        worker.append(RUN, step)
        owner.sync()
    assert len(writings) == 1 and len(owner.steps) == 50  # before: 50
    assert len(_written(tmp_path / "r.json")["steps"]) == 1  # the others wait
    owner.results.finish(RUN, owner.steps, "passed", [])
    assert len(writings) == owner.results.writes == 2
    document = _written(tmp_path / "r.json")
    assert [step["step_id"] for step in document["steps"]] == [
        f"gw0-{index:03d}" for index in range(50)]
    assert document["verdict"] == "passed"
    assert owner.results._timer is None  # the end's writing took the pending one's place


def test_a_step_waiting_for_the_gap_is_written_when_it_has_passed(tmp_path, monkeypatch):
    """No later step or session end needed: a timer writes the waiting step when the
    gap since the last writing has passed (a run killed after that keeps it)."""
    import time

    import pytest_storagescale.reporting.results as results

    monkeypatch.setattr(results, "MIN_REWRITE_GAP_S", 0.5, raising=False)
    writings = _count_writings(monkeypatch, tmp_path / "r.json")
    worker, owner = _ledgers(tmp_path)
    first, second = _steps(2)
    worker.append(RUN, first)
    owner.sync()
    worker.append(RUN, second)
    owner.sync()
    assert len(writings) == 1  # the second waits for the gap
    written = []
    deadline = time.monotonic() + 60  # the gap is 0.5 s; a loaded machine is slower
    while time.monotonic() < deadline:
        written = _written(tmp_path / "r.json")["steps"]
        if len(written) == 2:
            break
        time.sleep(0.05)
    assert [step["step_id"] for step in written] == ["gw0-000", "gw0-001"]
    assert len(writings) == 2


def test_the_file_is_the_whole_documents_json_with_each_step_made_once(tmp_path):
    """The file is assembled from each step's text, made once: the same bytes as the
    whole document's JSON (NaN and infinity as null, newlines and quotes escaped, a
    credential redacted), and a secret registered after a step was made is redacted
    in it all the same (the texts are of one generation of the registry)."""
    import math
    import secrets

    from pytest_storagescale.redact import register_secret
    from pytest_storagescale.reporting.results import json_text

    token = f"late-{secrets.token_hex(8)}"
    steps = [record(), mixed(),
             record("get", 3, sides={}, verdict=Verdict.ERROR,
                    error=f'ünï\n"quoted" root://u:pw1234@h//x {token}',
                    derived={"nan": math.nan, "inf": math.inf})]
    results = ResultsFile(tmp_path / "r.json")
    for verdict in (None, "FAILED"):
        results.verdict, results.tests = verdict, [{"nodeid": "a\nb", "outcome": "ok"}]
        assert results.text(RUN, steps) == json_text(results.document(RUN, steps))
        assert results.text(RUN, []) == json_text(results.document(RUN, []))
    assert token in results.text(RUN, steps) and "pw1234" not in results.text(RUN, steps)
    register_secret(token)
    results.write(RUN, steps)
    assert token not in (tmp_path / "r.json").read_text()
    assert (tmp_path / "r.json").read_text() == json_text(results.document(RUN, steps)) + "\n"


PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
warmup = "0s"
hang_timeout = "5s"

[ops.stat]
clients = [1, 2, 3, 4, 5, 6, 7, 8]
duration = "0.05s"

[ops.long]
op = "stat"
clients = [1]
duration = "300s"
"""

QUICK = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_quick(storage_load, storage_clients):
    storage_load.run()
"""

LONG = """
@pytest.mark.storagescale_op("long")
def test_long(storage_load, storage_clients):
    storage_load.run()
"""

#: the gap given by the test, the writings of r.json counted (renames onto it) and
#: said at the end; "long" marks the long step measuring
RUN_CONFTEST = """
import os

import pytest_storagescale.reporting.results as results

results.MIN_REWRITE_GAP_S = {gap}
writings = []
replace = os.replace

def counting(source, target, *args, **kwargs):
    if os.fspath(target) == "r.json" or str(target).endswith("/r.json"):
        writings.append(source)
    return replace(source, target, *args, **kwargs)

os.replace = counting

def pytest_unconfigure(config):
    open("writes", "w").write(str(len(writings)))
"""


def _suite(folder, gap: float, *, long: bool) -> list[str]:
    from faults import progress_conftest

    area = folder / "area"
    area.mkdir()
    (folder / "thr" / "xrootd").mkdir(parents=True)
    (folder / "thr" / "xrootd" / "t.toml").write_text(PLAN)
    (folder / "test_suite.py").write_text(QUICK + (LONG if long else ""))
    marking = progress_conftest('if state.total_s > 30 and state.succeeded > 0:\n'
                                '    Path("long").touch()',
                                imports="from pathlib import Path")
    (folder / "conftest.py").write_text(RUN_CONFTEST.format(gap=gap) + marking)
    return ["test_suite.py", "-p", "no:cacheprovider", f"--storage-endpoint=file://{area}",
            "--storage-version=1.0", "--storage-thresholds=thr", "--storage-results=r.json"]


def test_a_session_of_quick_steps_writes_its_file_twice_and_whole(pytester):
    """Through the plugin: 8 steps that end within the gap (an hour here): the file is
    written for the first step and at the session's end, with every step (before:
    once per step and at the end, 9 writings)."""
    args = _suite(pytester.path, 3600.0, long=False)
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=8)
    assert (pytester.path / "writes").read_text() == "2"
    document = _written(pytester.path / "r.json")
    assert sorted(step["clients"] for step in document["steps"]) == list(range(1, 9))
    assert document["verdict"] and len(document["tests"]) == 8


def _run_until_the_long_step(folder, gap: float):
    import os
    import subprocess
    import sys
    import time

    args = _suite(folder, gap, long=True)
    child = subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=folder,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, env={**os.environ,
                                                          "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 240
    while not (folder / "long").exists() and child.poll() is None and (
            time.monotonic() < deadline):
        time.sleep(0.1)
    if not (folder / "long").exists():
        child.kill()
        raise AssertionError(f"the long step never measured: {child.communicate()[0]}")
    return child


def _stop(child, number) -> str:
    import os
    import signal

    try:
        os.killpg(child.pid, number)
        return child.communicate(timeout=120)[0]
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        try:  # what the killed run forked (its client processes), if anything is left
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_run_killed_with_sigkill_keeps_the_steps_that_ended_a_gap_before(tmp_path):
    """The 8 quick steps end within one gap (2 s, the default); the long step runs;
    a SIGKILL (no finalizer) some time later: the file holds the quick steps, written
    by the timer once the gap had passed, not by the session's end."""
    import signal
    import time

    import pytest_storagescale.reporting.results as results

    child = _run_until_the_long_step(tmp_path, getattr(results, "MIN_REWRITE_GAP_S", 2.0))
    deadline = time.monotonic() + 60  # the gap is 2 s: a loaded machine's slack
    steps: list = []
    while time.monotonic() < deadline and len(steps) < 8:
        time.sleep(0.2)
        steps = _written(tmp_path / "r.json")["steps"]
    output = _stop(child, signal.SIGKILL)
    assert not (tmp_path / "writes").exists(), output  # no session end: killed
    document = _written(tmp_path / "r.json")
    assert sorted(step["clients"] for step in document["steps"]) == list(range(1, 9)), output
    assert "verdict" not in document  # as the timer left it


def test_an_interrupted_run_writes_every_step_however_soon_after_the_last_writing(
        tmp_path):
    """SIGTERM during the long step, the quick steps still waiting for their gap (an
    hour): the session's end writes them all and the interrupted step."""
    import signal

    child = _run_until_the_long_step(tmp_path, 3600.0)
    assert len(_written(tmp_path / "r.json")["steps"]) == 1  # the others wait
    output = _stop(child, signal.SIGTERM)
    assert child.returncode == 2, output[-3000:]
    assert (tmp_path / "writes").read_text() == "2", output[-3000:]
    document = _written(tmp_path / "r.json")
    verdicts = sorted((step["op"], step["clients"], step["verdict"])
                      for step in document["steps"])
    assert verdicts == [("long", 1, "interrupted"),
                        *[("stat", clients, "pass") for clients in range(1, 9)]], output
