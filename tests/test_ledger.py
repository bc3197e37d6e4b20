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
