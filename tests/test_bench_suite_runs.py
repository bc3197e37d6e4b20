"""What the scale benchmarks share (benchmarks/suite_runs.py): their plan, their
samplers (bounded), the pytest run with its deadline. No server: a suite of its own."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("suite_runs",
                                                  REPO / "benchmarks" / "suite_runs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


suite_runs = _module()


def test_the_scale_plan_is_a_step_per_number_of_clients_losing_none():
    args = argparse.Namespace(duration=3.0, warmup=1.0, hang_timeout=60.0)
    text = suite_runs.scale_plan("dcache", [20, 400], {
        "ls": {"entries": 10}, "copyout": {"op": "get", "to_disk": True}}, args)
    plan = tomllib.loads(text)
    assert plan["storage"] == {"system": "dcache", "versions": ["*"]}
    assert plan["defaults"] == {"duration": "3s", "warmup": "1s", "hang_timeout": "60s"}
    assert plan["ops"]["ls"]["entries"] == 10 and plan["ops"]["ls"]["clients"] == [20, 400]
    assert plan["ops"]["copyout"]["op"] == "get" and plan["ops"]["copyout"]["to_disk"] is True
    for op in ("ls", "copyout"):
        assert plan["ops"][op]["expect"] == [
            {"clients": "*", "rules": ["failed == 0", "hung == 0", "lost == 0"]}]


def test_a_sampler_samples_until_the_with_ends_and_at_most_its_limit():
    class Counting(suite_runs.Periodic):
        interval, limit = 0.01, 5

        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def sample(self) -> None:
            self.count += 1

    with Counting() as sampler:
        time.sleep(1.0)
    assert sampler.count == 5  # its limit, not 100
    assert not sampler._thread.is_alive()


def test_a_pytest_run_past_its_deadline_is_exit_minus_1_with_its_output(tmp_path, capsys):
    """(A Python that prints and sleeps stands in for pytest: what is run is not the
    point.)"""
    began = time.monotonic()
    steps, meta, output = suite_runs.run_pytest(
        [sys.executable, "-u", "-c", "print('started'); import time; time.sleep(120)"],
        tmp_path, timeout=10, log=str(tmp_path / "log"))
    assert time.monotonic() - began < 60
    assert steps == [] and meta["code"] == -1  # no results file: no steps
    assert output == "started\n" and (tmp_path / "log").read_text() == output
    assert "# pytest exit -1 after" in capsys.readouterr().out


def test_a_finished_run_gives_its_results_steps(tmp_path):
    script = "import json; json.dump({'steps': [{'op': 'stat'}]}, open('out.json', 'w'))"
    steps, meta, _ = suite_runs.run_pytest([sys.executable, "-c", script], tmp_path,
                                           timeout=60, log=str(tmp_path / "log"))
    assert steps == [{"op": "stat"}] and meta["code"] == 0
