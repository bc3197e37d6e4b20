"""What the scale benchmarks share: a suite run by pytest as a user runs it (its plan
from ``tests/plans.py``, its results JSON read back), and samplers beside it that read
this machine every so often in a thread of their own (bounded in count).

Used by ``bench_slurm_scale.py``, ``bench_dcache_hosts_slurm.py`` and
``bench_cluster.py``; not a benchmark itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from plans import NO_LOSS, op_section, plan  # noqa: E402


def scale_plan(system: str, clients: Sequence[int], sections: dict[str, dict], args) -> str:
    """A plan for ``system``: per op of ``sections`` (op -> its settings) a step at each
    number of ``clients``, none losing a client; ``args``' duration, warm-up and hang
    timeout (seconds)."""
    return plan(*(op_section(op, clients, NO_LOSS, **settings)
                  for op, settings in sections.items()),
                system=system, duration=f"{args.duration:g}s", warmup=f"{args.warmup:g}s",
                hang_timeout=f"{args.hang_timeout:g}s")


def scale_options(doc: str, *, ops: Sequence[str], clients: str, default_ops: str,
                  duration: float, timeout: float, log: str) -> argparse.ArgumentParser:
    """The options of a scale run: client hosts, clients per step, ``ops`` (the
    known ones kept), step duration, warm-up and hang timeout, the whole run's timeout,
    pytest's output file."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--clients", default=clients,
                        type=lambda text: [int(c) for c in text.split(",")])
    parser.add_argument("--ops", default=default_ops,
                        type=lambda text: [op for op in text.split(",") if op in ops])
    parser.add_argument("--duration", type=float, default=duration)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--hang-timeout", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=timeout,
                        help="seconds for the whole pytest run")
    parser.add_argument("--log", default=log)
    return parser


def available_mb() -> float:
    """The machine's available memory (``MemAvailable``), MB."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def process_rss_mb(pid: int) -> float:
    """A process's resident memory (MB; nan when it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return float("nan")


class Periodic:
    """:meth:`sample` every ``interval`` seconds in a thread of its own, from the
    ``with`` to its end, ``limit`` times at the most."""

    interval = 0.5
    limit = 20000

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        for _ in range(self.limit):
            if self._stop.is_set():
                return
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def run_pytest(command: list[str], work: Path, *, timeout: float, log: str,
               beside: Sequence[contextlib.AbstractContextManager] = (),
               preexec_fn: Callable[[], None] | None = None) -> tuple[list[dict], dict, str]:
    """``command`` (``python -m pytest ... --storage-results=out.json``) in ``work``,
    with the ``beside`` samplers running, within ``timeout`` seconds; its output
    written to ``log``. The results' steps, {code, began, took} and the output."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    print(f"# load average {load_average()} before; {' '.join(command[3:])}", flush=True)
    began = time.time()
    with contextlib.ExitStack() as running:
        for sampler in beside:
            running.enter_context(sampler)
        try:
            done = subprocess.run(command, cwd=work, capture_output=True, text=True,
                                  timeout=timeout, env=environment, preexec_fn=preexec_fn)
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            output = exc.stdout.decode(errors="replace") if isinstance(
                exc.stdout, bytes) else (exc.stdout or "")
            code = -1
    took = time.time() - began
    Path(log).write_text(output)
    print(f"# pytest exit {code} after {took:.0f} s; load average {load_average()} after; "
          f"its output in {log}", flush=True)
    results = work / "out.json"
    steps = json.loads(results.read_text())["steps"] if results.exists() else []
    return steps, {"code": code, "began": began, "took": took}, output
