"""The results file's writing over a session: before (the whole document serialized
and written after each finished step) and now (:meth:`ResultsFile.write_soon`: at
most once per gap, each step's text made once), side by side.

``--steps`` steps, each with a ``--timeline``-second per-second timeline (four
series, as a step's side has), go through the session's step log as a plain
session's do: appended, then taken by the owner (``StepLedger.sync``), as fast as
they come (the worst case: a suite of short checks' steps), or with ``--apart`` s
between their ends (a clock of the benchmark's, not waited for: more than the gap,
and every step is written, each writing joining the steps' texts made once); the
session's end writes the file once more (``finish``). Prints, for each way, the seconds spent in the
owner's taking and the end's writing, and how many times the file was written. The
"before" way is the previous ``ResultsFile.write``: ``write_json_atomic`` of the
whole document after each step.

    .venv/bin/python benchmarks/bench_results_file.py --steps 100 --timeline 3600
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

from hdrh.histogram import HdrHistogram

from pytest_storagescale.load.stats import SideResult, StepResult, latency_summary
from pytest_storagescale.records import ClientInfo, RunInfo, StepRecord, Verdict
from pytest_storagescale.reporting.results import ResultsFile, write_json_atomic
from pytest_storagescale.session.ledger import StepLedger

RUN = RunInfo(endpoint="root://localhost:1094//data", endpoint_id="bench", embedded=True,
              system="xrootd", version="5.5.3", version_source="probed",
              thresholds_file="t.toml", thresholds_reason="bench", run_id="bench",
              started=time.time(), executor="threads", driver="xrootd",
              client=ClientInfo(host="bench", user="me", versions={}, argv=[]))


def step(index: int, seconds: int) -> StepRecord:
    histogram = HdrHistogram(1, 60_000_000, 2)
    for value in range(1, 2000):
        histogram.record_value(value * 7)
    timeline = {name: [index % 7 + second % 5 for second in range(seconds)]
                for name in ("completions", "failures", "in_flight", "hung")}
    side = SideResult(clients=4, duration_s=float(seconds), succeeded=10 * seconds,
                      failed=0, hung=0, bytes=0, latency_s=latency_summary(histogram),
                      errors={}, error_examples={}, timeline=timeline,
                      histogram=histogram.encode().decode())
    result = StepResult("stat", 4, 1000.0 + index, 1000.0 + index + seconds, seconds, 0.0,
                        {"stat": side})
    return StepRecord(step_id=f"main-{index:03d}", test=f"suite.py::test_stat[{index}]",
                      section="stat", operation="stat", clients=4, label=None,
                      result=result, verdict=Verdict.PASS, warmup_s=0.0,
                      started=1000.0 + index, system="xrootd")


class Before(ResultsFile):
    """The previous writing: the whole document serialized after each step (and at
    the end)."""

    def write_soon(self, run: RunInfo, steps: list[StepRecord]) -> None:
        self.write(run, steps)

    def _write(self, run: RunInfo, steps: list[StepRecord]) -> None:
        assert self.path is not None
        write_json_atomic(self.path, self.document(run, steps))
        self.writes += 1


def session(results: ResultsFile, folder: Path, steps: list[StepRecord],
            clock: list[float], apart: float) -> float:
    worker = StepLedger(folder / "shared", ResultsFile(None))
    owner = StepLedger(folder / "shared", results)
    spent = 0.0
    for record in steps:
        worker.append(RUN, record)
        clock[0] += apart
        started = time.perf_counter()
        owner.sync()
        spent += time.perf_counter() - started
    started = time.perf_counter()
    results.finish(RUN, owner.steps, "passed", [])
    return spent + time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--timeline", type=int, default=3600)
    parser.add_argument("--apart", type=float, default=0.0,
                        help="seconds between two steps' ends (the benchmark's clock)")
    options = parser.parse_args()
    steps = [step(index, options.timeline) for index in range(options.steps)]
    print(f"load average {os.getloadavg()[0]:.1f}; {options.steps} steps, "
          f"{options.timeline} s timelines, {options.apart:g} s apart")
    for name, kind in (("before", Before), ("now", ResultsFile)):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "r.json"
            clock = [0.0]
            results = kind(path, clock=lambda clock=clock: clock[0])
            spent = session(results, Path(folder), [dataclasses.replace(s) for s in steps],
                            clock, options.apart)
            print(f"{name:6} {spent:7.1f} s writing, {results.writes:3d} writings, "
                  f"{path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
