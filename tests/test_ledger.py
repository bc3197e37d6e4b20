"""The step ledger (session/ledger.py): a step is logged when it begins and when it
ends; the owner of the results records one never finished (its process died mid-step)
with a verdict naming that process. The whole path, with a worker killed under
``pytest -n 2``, is in test_plugin.py."""

from __future__ import annotations

import dataclasses
import json

from test_reporting_units import RUN, record

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
