"""What a test gives a step's operation (the step context: doors by name, extra data)
and what the operation gives back (``Operation.observe``, summed over every process
that ran its clients, in the record's derived metrics before the rules); an operation
that cannot leave pytest's process refused by the processes executor and the
cluster, in one sentence, before any load (issue 33)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from pytest_storagescale.drivers import memory
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import StorageScaleUsageError
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.operations import Operation, Stat, prepare_step
from pytest_storagescale.load.plan import StepContext, StepPlan


class Counting(Operation):
    """Counts its repetitions in the context of each process that runs its clients."""

    name = "counting"

    def prepare(self, driver, workdir, params, clients, step=None):
        context = super().prepare(driver, workdir, params, clients)
        context.update(runs=[], given=dict(step.extra)["given"])
        return context

    def run(self, driver, client, iteration, context):
        context["runs"].append(1)  # list.append: atomic under the threads executor
        return 0

    def observe(self, context):
        return {"runs": len(context["runs"]), "processes": 1, "given": context["given"]}


class OldStyle(Stat):
    """A site's operation written before the step context: four arguments."""

    def prepare(self, driver, workdir, params, clients):
        return super().prepare(driver, workdir, params, clients)


class Local(Counting):
    name = "local"
    in_process = True


@pytest.fixture
def spec():
    store = f"ctx-{os.getpid()}"
    yield driver_spec(f"memory://{store}/area", writable_root="/area")
    memory.clear_stores()


def plan(spec, operation: Operation, **overrides) -> StepPlan:
    values = dict(operation=operation, clients=4, duration=60.0, warmup=0.0,
                  hang_timeout=5.0, driver=spec, workdir="/area/step", max_operations=40,
                  step=StepContext(extra={"given": 0.5}))
    values.update(overrides)
    return StepPlan(**values)


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_what_the_operation_observed_in_every_process_is_summed(spec, executor):
    """Under the processes executor each spawned process observes its own clients'
    repetitions and the parent sums them (a module global of the operation's module,
    the suites' way before, stayed in the process that ran the clients: the parent
    saw nothing)."""
    result = run_step(plan(spec, Counting(), processes=2), executor=executor)
    assert result.total.succeeded == 40
    processes = 2 if executor == "processes" else 1
    assert result.observed == {"runs": 40.0, "processes": processes, "given": 0.5 * processes}


def test_a_four_argument_prepare_still_runs_and_the_context_reaches_a_new_one(spec):
    driver = spec.connect("coordinator", timeout=5)
    context = prepare_step(OldStyle(), driver, "/area/old", {"file_size": 10}, 1,
                           StepContext(extra={"given": 1}))
    assert context["target"] == "/area/old/stat-target"
    context = prepare_step(Counting(), driver, "/area/new", {}, 1,
                           StepContext(extra={"given": 2.0}))
    assert context["given"] == 2.0


def test_a_missing_door_names_the_operation_and_how_to_give_it():
    with pytest.raises(StorageScaleUsageError) as info:
        StepContext(doors={}).door("xcache", "read_xcache")
    assert str(info.value) == (
        "read_xcache: the step was given no 'xcache' door (doors given: none). Pass it "
        "with storage_load.run(..., doors={'xcache': spec}).")


@pytest.mark.parametrize("executor", ["processes", "cluster"])
def test_an_in_process_operation_is_refused_out_of_process_in_one_sentence(spec, executor):
    def cluster(*args):  # a cluster executor is a callable; never reached
        raise AssertionError("the load ran")

    with pytest.raises(StorageScaleUsageError) as info:
        run_step(plan(spec, Local()), executor=cluster if executor == "cluster" else executor)
    text = str(info.value)
    assert text.count(". ") == 0 and text.endswith("or deselect its tests.")
    assert text.startswith("operation 'local' runs only in pytest's own process")
    assert ("--storage-cluster" if executor == "cluster" else "--storage-executor processes") \
        in text


def test_an_in_process_operation_runs_in_threads_under_auto(spec, monkeypatch):
    """``auto`` would spawn a process for a driver that isolates its clients: not for
    an operation that stays in process."""
    monkeypatch.setattr(memory.MemoryDriver, "isolate_clients", True, raising=False)
    result = run_step(plan(spec, Local(), max_operations=8), executor="auto")
    assert result.observed["processes"] == 1 and result.observed["runs"] == 8


CONFTEST = '''
import pytest
from pytest_storagescale import Operation, StorageScaleUsageError


class Counting(Operation):
    name = "counting"

    def prepare(self, driver, workdir, params, clients, step=None):
        context = super().prepare(driver, workdir, params, clients)
        context.update(runs=[], door=step.door("other", self.name).endpoint_url)
        return context

    def run(self, driver, client, iteration, context):
        context["runs"].append(1)
        return 0

    def observe(self, context):
        return {"runs": len(context["runs"]), "processes": 1}


class Local(Counting):
    name = "local"
    in_process = True


def pytest_storagescale_operations():
    return [Counting(), Local()]


def pytest_storagescale_metrics():
    return {"runs": "repetitions the operation counted", "processes": "processes that ran it"}
'''

THRESHOLDS = '''
[storage]
system = "site"
versions = ["*"]

[defaults]
duration = "60s"
hang_timeout = "5s"
warmup = "0s"

[ops.{section}]
op = "{op}"
clients = [4]
operations = 20

[[ops.{section}.expect]]
rules = ["runs == 20", "processes >= 2"]
'''

SUITE = '''
import pytest
from pytest_storagescale import driver_spec

pytestmark = pytest.mark.storagescale_system("site")


@pytest.mark.storagescale_op("{section}")
def test_step(storage_load, storage_clients, storage_endpoint):
    other = driver_spec("memory://other/area", writable_root="/area/x")
    storage_load.run(doors={{"other": other}})
'''


def _suite(pytester, section: str, op: str, *args: str, xdist: bool = False):
    pytester.makeconftest(CONFTEST)
    (pytester.path / "thresholds" / "site").mkdir(parents=True)
    (pytester.path / "thresholds" / "site" / "default.toml").write_text(
        THRESHOLDS.format(section=section, op=op))
    pytester.makepyfile(test_site=SUITE.format(section=section))
    return pytester.runpytest_subprocess(
        "--storage-endpoint", "memory://store/area", "--storage-version", "1.0",
        "-p", "no:cacheprovider", *(["-n", "2"] if xdist else ["-p", "no:xdist"]), *args)


def test_observations_reach_the_rules_under_the_processes_executor(pytester):
    """The operation's observations, from both client processes, are the record's
    derived metrics, judged by the section's rules."""
    results = pytester.path / "r.json"
    outcome = _suite(pytester, "count", "counting", "--storage-executor", "processes",
                     f"--storage-results={results}")
    outcome.assert_outcomes(passed=1)
    [step] = json.loads(results.read_text())["steps"]
    assert step["derived"]["runs"] == 20.0 and step["derived"]["processes"] >= 2
    assert [check["passed"] for check in step["checks"][:2]] == [True, True]


@pytest.mark.parametrize("xdist", [False, True], ids=["alone", "xdist"])
def test_an_in_process_operation_under_processes_is_a_usage_error_before_any_load(
        pytester, xdist):
    """Once on stderr, exit 4, no test run; under -n too (a worker's refusal went up
    as an internal error, exit 3, before the controller was told)."""
    outcome = _suite(pytester, "local", "local", "--storage-executor", "processes",
                     xdist=xdist)
    assert outcome.ret == 4
    text = outcome.stderr.str()
    assert text.count("test_site.py::test_step[c4]: operation 'local' runs only in "
                      "pytest's own process") == 1
    assert "Traceback" not in text
    assert not outcome.parseoutcomes().get("passed") and "failed" not in outcome.stdout.str()


def test_the_step_context_is_frozen():
    context = StepContext(extra={"a": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.extra = {}  # type: ignore[misc]
