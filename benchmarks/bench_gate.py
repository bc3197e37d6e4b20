"""The gate's calibration (issue 32 part 4): false alarms and detections of the
statistical gate (``pytest_storagescale/gate.py``) against a real embedded xrootd, in
the stored-baseline mode, with the machine loaded by ``stress-ng --cpu N``.

One server (the embedded xrootd, root:// only) for the whole run; a closed-loop
root:// stat step at ``--clients`` clients (the engine's ``auto`` executor, the
compiled client loop), ``--duration`` s after ``--warmup`` s, its per-window samples
kept (as the plugin keeps them). Per pair: three baseline runs of the server as it
is, then, in an order rotated from pair to pair, three runs judged against them:

- **A/A**: the same server again: a ``regressed`` is a false alarm;
- **rate**: the server SIGSTOPped ``--rate-stop-ms`` out of every ``--rate-period-ms``
  (25 % of the time by default: a rate regression of about 25 %; a duty cycle, not a
  cgroup CPU quota, because its effect does not depend on how much CPU the server
  needed on a machine whose clients, not the server, often set the rate);
- **p99**: the server SIGSTOPped ``--p99-stop-ms`` out of every ``--p99-period-ms``
  (short stops: the requests in flight wait, the tail grows, the rate barely moves).

Each judged run goes through the gate as the plugin's does (``judge_samples`` with the
client host's probe before and after each step), against the first baseline run alone
and against all three (the gate pools them and widens the interval by their spread);
a ``regressed`` run is measured again under the same condition and its verdict is
``regressed (confirmed)`` or ``inconclusive (not reproduced)``, as the plugin's retest
does. The duty cycle runs in a process of its own (SIGCONT at its end, on SIGTERM, or
when this process is gone), measured: its achieved stopped share is in the table.

``--stress N`` starts ``stress-ng --cpu N`` (bounded by its own ``--timeout``, in a
session of its own, killed at the end, on Ctrl-C and on SIGTERM). The run stops
starting pairs when the next one would end after ``--budget`` s. The table goes to
stdout and, with ``--write-docs``, into docs/benchmarks.md between the ``gate-bench``
markers. ``--dry-run`` prints the plan (no server, no load). Usage::

    .venv/bin/python benchmarks/bench_gate.py [--quick] [--pairs 20] [--stress 4] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKERS = ("<!-- gate-bench:start (written by benchmarks/bench_gate.py --write-docs) -->",
           "<!-- gate-bench:end -->")
CAPPED_MARKERS = ("<!-- gate-bench-capped:start (written by benchmarks/bench_gate.py "
                  "--capped --write-docs) -->", "<!-- gate-bench-capped:end -->")
PAIRED_MARKERS = ("<!-- gate-bench-paired:start (written by benchmarks/bench_gate.py --paired "
                  "--write-docs) -->", "<!-- gate-bench-paired:end -->")
ROOT = "/storagescale/bench-gate"
KINDS = ("A/A", "rate", "p99")
BASELINE_MODES = (1, 3)

#: the duty cycle's own process: SIGSTOP/SIGCONT of ``pid`` on an absolute schedule
#: (an oversleep shifts both edges: the stopped share holds), SIGCONT whatever ends it;
#: it prints the share of wall time the server was stopped
_CYCLE = r"""
import os, signal, sys, time
pid, stopped, period, limit, parent = (int(sys.argv[1]), float(sys.argv[2]),
                                       float(sys.argv[3]), float(sys.argv[4]),
                                       int(sys.argv[5]))
done = []
signal.signal(signal.SIGTERM, lambda *_: done.append(1))
signal.signal(signal.SIGINT, lambda *_: done.append(1))
print("ready", flush=True)
try:
    os.nice(-10)
except OSError:
    pass
began = time.monotonic()
stopped_s, cycle = 0.0, 0
try:
    while not done and time.monotonic() - began < limit and os.getppid() == parent:
        start = began + cycle * period
        time.sleep(max(0.0, start - time.monotonic()))
        if done:
            break
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        time.sleep(max(0.0, start + stopped - t0))
        os.kill(pid, signal.SIGCONT)
        stopped_s += time.monotonic() - t0
        cycle += 1
finally:
    os.kill(pid, signal.SIGCONT)
    print(f"{stopped_s / max(time.monotonic() - began, 1e-9):.4f}", flush=True)
"""


class DutyCycle:
    """The process ``pid`` SIGSTOPped ``stopped_s`` out of every ``period_s`` by a
    process of its own, until the block ends (at most ``limit_s``): then continued
    (SIGCONT) whatever happened. :attr:`stopped_share` is the share of the block's
    wall time it was stopped, as measured by that process."""

    def __init__(self, pid: int, *, stopped_s: float, period_s: float,
                 limit_s: float = 120.0) -> None:
        if not 0 < stopped_s < period_s:
            raise ValueError(f"stopped {stopped_s} s must be within the period {period_s} s")
        self.pid, self.stopped_s, self.period_s, self.limit_s = pid, stopped_s, period_s, limit_s
        self.stopped_share: float | None = None
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> DutyCycle:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _CYCLE, str(self.pid), str(self.stopped_s),
             str(self.period_s), str(self.limit_s), str(os.getpid())],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        # its handlers are set before it says so: a stop right after the start (a busy
        # host starts Python slowly) still ends with its share printed
        assert self._process.stdout is not None
        # poll, not select: a long-lived process (a test worker) may hold fds past 1024
        poller = select.poll()
        poller.register(self._process.stdout, select.POLLIN)
        if poller.poll(30_000):
            self._process.stdout.readline()
        return self

    def __exit__(self, *exc: object) -> None:
        process = self._process
        assert process is not None
        process.send_signal(signal.SIGTERM)
        try:
            out, _ = process.communicate(timeout=10)
            with suppress(ValueError):
                self.stopped_share = float(out.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, IndexError):
            process.kill()
            process.wait(10)
        with suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)


class Stress:
    """``stress-ng --cpu N`` for at most ``limit_s`` (its own timeout), in a session of
    its own; the block's end kills the whole group (SIGTERM, then SIGKILL)."""

    def __init__(self, workers: int, limit_s: float) -> None:
        self.workers, self.limit_s = workers, limit_s
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Stress:
        if self.workers > 0:
            self._process = subprocess.Popen(
                ["stress-ng", "--cpu", str(self.workers), "--timeout", f"{int(self.limit_s)}s",
                 "--quiet"], start_new_session=True, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        process = self._process
        if process is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(5)
                break
            except subprocess.TimeoutExpired:
                continue
        # its workers outlive their parent by a moment: the block ends when the group is
        # gone (killed again each half second, for at most 10 s)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.5)


class CpuGroup:
    """Process ``pid`` (all its threads, and those it starts later) in a cgroup v1
    ``cpu`` group of its own, capped at ``cores`` (None: no quota), until the block
    ends: then moved back to the root group and the group removed. Both sides of the
    paired calibration sit in a group of their own, so that the A/A pairs and the
    capped ones differ by the quota alone (a group is one entity to the scheduler: a
    server moved into one measured faster than one left in the root group)."""

    ROOT = Path("/sys/fs/cgroup/cpu")

    def __init__(self, pid: int, name: str) -> None:
        self.pid = pid
        self.group = self.ROOT / f"storagescale-bench-gate-{os.getpid()}-{name}"

    def __enter__(self) -> CpuGroup:
        self.group.mkdir()
        (self.group / "cpu.cfs_period_us").write_text("100000")
        (self.group / "cgroup.procs").write_text(str(self.pid))
        return self

    def cap(self, cores: float | None) -> None:
        (self.group / "cpu.cfs_quota_us").write_text(
            "-1" if cores is None else str(max(1000, int(100000 * cores))))

    def __exit__(self, *exc: object) -> None:
        with suppress(OSError):
            self.cap(None)
        for task in (self.group / "tasks").read_text().split():
            with suppress(OSError):
                (self.ROOT / "tasks").write_text(task)
        with suppress(OSError):
            self.group.rmdir()


@dataclass
class Run:
    """One measured step: its window samples, the client host's probe, wall time."""

    windows: list
    probe: object
    rate_hz: float
    p99_s: float
    failed: int
    seconds: float
    load: float
    stopped_share: float | None = None
    #: the server's CPU (cores: its CPU seconds over the step's wall time), None: unknown
    server_cores: float | None = None


@dataclass
class Outcome:
    """One judged run against ``baselines`` baseline runs."""

    kind: str
    baselines: int
    first: str
    verdict: str
    deciding: str
    rate_ratio: float | None
    p99_ratio: float | None
    p99_verdict: str
    seconds: float
    short: str = ""
    #: the verdict of the statistics alone (no client host probe), after the retest
    alone: str = ""
    #: made inconclusive by the client host's probe
    by_probe: bool = False
    reason: str = ""
    #: the client host's probe this share slower than the baseline runs' (None: not probed)
    host_slowdown: float | None = None
    #: the rate's interval
    rate_low: float | None = None
    rate_high: float | None = None
    #: the judged run's rate and the baseline runs'
    rate_hz: float | None = None
    base_rates: list = field(default_factory=list)


@dataclass
class Settings:
    clients: int = 5
    duration: float = 5.0
    warmup: float = 1.0
    rate_stop_ms: float = 25.0
    rate_period_ms: float = 100.0
    p99_stop_ms: float = 10.0
    p99_period_ms: float = 50.0
    extra: dict = field(default_factory=dict)


def measure(spec, tag: str, settings: Settings) -> Run:
    from pytest_storagescale.gate import HostProbe, probe_client_host
    from pytest_storagescale.load.engine import run_step
    from pytest_storagescale.load.operations import get_operation
    from pytest_storagescale.load.plan import StepPlan

    pid = settings.extra.get("server_pid")
    cpu_before = _cpu_seconds(pid)
    began = time.monotonic()
    before = probe_client_host()
    result = run_step(StepPlan(operation=get_operation("stat"), clients=settings.clients,
                               duration=settings.duration, warmup=settings.warmup,
                               hang_timeout=30.0, driver=spec, workdir=f"{ROOT}/{tag}"),
                      executor="auto")
    probe = HostProbe(before, probe_client_host())
    total = result.total
    seconds = time.monotonic() - began
    cpu_after = _cpu_seconds(pid)
    cores = (cpu_after - cpu_before) / seconds if None not in (cpu_before, cpu_after) \
        else None  # type: ignore[operator]
    return Run(list(total.windows), probe, total.rate_hz, total.latency_s["p99"],
               total.failed + total.hung, seconds, os.getloadavg()[0], server_cores=cores)


def _cpu_seconds(pid: int | None) -> float | None:
    """The CPU seconds (user and system, all threads) process ``pid`` has used."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def injected(kind: str, pid: int, settings: Settings) -> Iterator[DutyCycle | None]:
    if kind == "A/A":
        yield None
        return
    if kind == "capped":  # --capped: the server's own group (calibrate()) gets a quota
        group = settings.extra["group"]
        group.cap(settings.extra["cap"])
        try:
            yield None
        finally:
            group.cap(None)
        return
    stop, period = ((settings.rate_stop_ms, settings.rate_period_ms) if kind == "rate"
                    else (settings.p99_stop_ms, settings.p99_period_ms))
    with DutyCycle(pid, stopped_s=stop / 1e3, period_s=period / 1e3,
                   limit_s=4 * (settings.duration + settings.warmup) + 60) as cycle:
        yield cycle


def judge(run: Run, bases: list[Run], probed: bool = True):
    """The gate as the plugin's (``probed``: with the client host's probe), or the
    statistics alone."""
    from pytest_storagescale.gate import (
        host_pvalue,
        host_shown_slowdown,
        host_slowdown,
        judge_samples,
    )

    probes = [base.probe for base in bases]
    slowdown = host_slowdown(run.probe, probes) if probed else None  # type: ignore[arg-type]
    p = host_pvalue(run.probe, probes) if probed else None  # type: ignore[arg-type]
    shown = host_shown_slowdown(run.probe, probes) if probed else None  # type: ignore[arg-type]
    return judge_samples(run.windows, [base.windows for base in bases],
                         host_slowdown=slowdown, host_p=p, host_shown=shown)


def final(gate, again: Run | None, bases: list[Run], probed: bool) -> str:
    """The verdict after the retest: a regressed run measured again."""
    from pytest_storagescale.gate import reproduced

    if not gate.fails:
        return gate.verdict.value
    assert again is not None
    return "regressed (confirmed)" if reproduced(gate, judge(again, bases, probed)) else \
        "inconclusive (not reproduced)"


def judged_runs(kind: str, spec, server_pid: int, tag: str, bases: list[Run],
                settings: Settings) -> tuple[list[Outcome], list[Run]]:
    """The run of ``kind`` (and its retest when a mode found it regressed), judged
    against the first baseline run and against all of them, with and without the
    client host's probe."""
    with injected(kind, server_pid, settings) as cycle:
        run = measure(spec, tag, settings)
        firsts = {(n, probed): judge(run, bases[:n], probed)
                  for n in BASELINE_MODES for probed in (True, False)}
        again = None
        if any(gate.fails for gate in firsts.values()):
            again = measure(spec, f"{tag}-again", settings)
    share = cycle.stopped_share if cycle is not None else None
    run.stopped_share = share
    if again is not None:
        again.stopped_share = share
    outcomes = []
    for n in BASELINE_MODES:
        gate, alone = firsts[n, True], firsts[n, False]
        seconds = run.seconds + sum(b.seconds for b in bases[:n])
        if gate.fails and again is not None:
            seconds += again.seconds
        rate, p99 = gate.effects.get("rate_hz"), gate.effects.get("p99_s")
        outcomes.append(Outcome(
            kind, n, gate.verdict.value, final(gate, again, bases[:n], True),
            gate.metric or "", rate.ratio if rate else None, p99.ratio if p99 else None,
            p99.verdict.value if p99 else "-", seconds, gate.short(),
            alone=final(alone, again, bases[:n], False),
            by_probe=gate.reason.startswith("client host "), reason=gate.reason,
            host_slowdown=gate.host_slowdown, rate_low=rate.low if rate else None,
            rate_high=rate.high if rate else None, rate_hz=run.rate_hz,
            base_rates=[b.rate_hz for b in bases[:n]]))
    return outcomes, [r for r in (run, again) if r is not None]


def _cores_text(bases: list[Run]) -> str:
    """What CPU the uncapped server got in the baseline runs (does a cap bind?)."""
    cores = sorted(b.server_cores for b in bases if b.server_cores is not None)
    if not cores:
        return "the server's CPU not measured"
    q = statistics.quantiles(cores, n=10) if len(cores) >= 2 else [cores[0]] * 9
    return (f"the server got {q[0]:.2f}-{q[8]:.2f} core in the baseline runs (10th-90th "
            f"percentile, median {statistics.median(cores):.2f}, over each step with its "
            f"warm-up and probes)")


def pair_order(index: int) -> list[str]:
    """The judged runs' order, rotated from pair to pair (a drift of the machine's
    load over a pair falls on each kind alike)."""
    return [KINDS[(index + k) % len(KINDS)] for k in range(len(KINDS))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def summary_rows(outcomes: list[Outcome], runs: dict[str, list[Run]],
                 bases: list[Run]) -> list[str]:
    rows = ["| injected | baseline runs | judged | regressed (confirmed) | inconclusive | "
            "unchanged | improved | regressed before the retest | inconclusive by the host "
            "probe | regressed without the probe (confirmed) | p99 effect regressed | "
            "ratio to the baseline: median (range) | wall time per verdict (mean) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for kind in KINDS:
        kind_runs = runs.get(kind, [])
        shares = [r.stopped_share for r in kind_runs if r.stopped_share is not None]
        stopped = f"; stopped {statistics.mean(shares):.0%} of the time" if shares else ""
        name = {"A/A": "none (A/A: the same server again)",
                "rate": "rate: SIGSTOP duty cycle", "p99": "p99: short SIGSTOPs",
                "capped": "capped by a cgroup"}[kind]
        for n in BASELINE_MODES:
            mine = [o for o in outcomes if o.kind == kind and o.baselines == n]
            if not mine:
                continue
            count = len(mine)
            effect = "; ".join(
                f"{label} {_fmt(median(values))} ({_fmt(min(values))}-{_fmt(max(values))})"
                for label, values in (
                    ("rate", [o.rate_ratio for o in mine if o.rate_ratio is not None]),
                    ("p99", [o.p99_ratio for o in mine if o.p99_ratio is not None]))
                if values)

            def share(pred, mine=mine, count=count) -> str:
                hits = sum(1 for o in mine if pred(o))
                return f"{hits} ({hits / count:.0%})"
            rows.append(
                f"| {name} | {n} | {count} | "
                f"{share(lambda o: o.verdict.startswith('regressed'))} | "
                f"{share(lambda o: o.verdict.startswith('inconclusive'))} | "
                f"{share(lambda o: o.verdict == 'unchanged')} | "
                f"{share(lambda o: o.verdict == 'improved')} | "
                f"{share(lambda o: o.first == 'regressed')} | "
                f"{share(lambda o: o.by_probe)} | "
                f"{share(lambda o: o.alone.startswith('regressed'))} | "
                f"{share(lambda o: o.p99_verdict == 'regressed')} | "
                f"{effect}{stopped} | "
                f"{statistics.mean(o.seconds for o in mine):.1f} s |")
    return rows


PAIRED_KINDS = ("A/A", "capped")


def rate_interval(hits: int, count: int) -> str:
    """``3/20 = 15 % [3-38 %]``: the share with its exact (Clopper-Pearson) 95 % interval
    (:func:`scipy.stats.binomtest`)."""
    from scipy.stats import binomtest

    if not count:
        return "-"
    ci = binomtest(hits, count).proportion_ci(confidence_level=0.95, method="exact")
    return f"{hits}/{count} = {hits / count:.0%} [{ci.low:.0%}-{ci.high:.0%}]"


def paired_trial(kind: str, index: int, specs, groups, settings: Settings,
                 cores: float) -> dict:
    """One paired step (the plugin's :func:`~pytest_storagescale.paired.measure_alternating`)
    of side A against side B, B capped at ``cores`` for ``capped``; a regressed one
    measured again (the plugin's retest). Beside the gate's verdict, the same runs
    judged as the gate judged a paired step before (B's windows pooled against A's,
    :func:`~pytest_storagescale.gate.judge_samples`), and the client host's probe."""
    from dataclasses import replace as replace_plan

    from pytest_storagescale.gate import (
        GateSettings,
        judge_samples,
        probe_client_host,
        reproduced,
    )
    from pytest_storagescale.load.operations import get_operation
    from pytest_storagescale.load.plan import StepPlan
    from pytest_storagescale.paired import measure_alternating

    spec_a, spec_b = specs
    plan = StepPlan(operation=get_operation("stat"), clients=settings.clients,
                    duration=settings.duration, warmup=settings.warmup, hang_timeout=30.0,
                    driver=spec_a, workdir=f"{ROOT}/t{index}")

    def plan_b(sub: StepPlan, n: int) -> StepPlan:
        return replace_plan(sub, driver=spec_b, workdir=f"{ROOT}/t{index}-b{n}")

    groups[1].cap(cores if kind == "capped" else None)
    stopped = None
    try:
        began = time.monotonic()
        probe = probe_client_host()
        with ExitStack() as stack:
            cycle = None
            if kind in ("rate", "p99"):  # side B's server stopped on a duty cycle
                stop, period = ((settings.rate_stop_ms, settings.rate_period_ms)
                                if kind == "rate" else
                                (settings.p99_stop_ms, settings.p99_period_ms))
                cycle = stack.enter_context(DutyCycle(
                    settings.extra["pid_b"], stopped_s=stop / 1e3, period_s=period / 1e3,
                    limit_s=2 * paired_limit(settings) + 60))
            gate_settings = GateSettings(paired_budget=settings.extra.get("paired_budget", 3.0))
            result = measure_alternating(plan, plan_b, "B", settings=gate_settings)
            again = None
            if result.gate is not None and result.gate.fails:
                again = measure_alternating(replace_plan(plan, workdir=f"{ROOT}/t{index}r"),
                                            plan_b, "B", settings=gate_settings)
        if cycle is not None:
            stopped = cycle.stopped_share
        seconds = time.monotonic() - began
    finally:
        groups[1].cap(None)
    gate = result.gate
    assert gate is not None
    pooled = judge_samples(result.b.total.windows, [result.a.total.windows])
    final = gate.verdict.value
    if gate.fails:
        assert again is not None and again.gate is not None
        final = ("regressed (confirmed)" if reproduced(gate, again.gate)
                 else "inconclusive (not reproduced)")
    rate, p99 = gate.effects.get("rate_hz"), gate.effects.get("p99_s")
    return {
        "kind": kind, "first": gate.verdict.value, "verdict": final, "short": gate.short(),
        "rate": [rate.ratio, rate.low, rate.high] if rate else None,
        "p99": [p99.ratio, p99.low, p99.high] if p99 else None,
        "pooled": pooled.verdict.value, "pooled_short": pooled.short(),
        "pairs": [[a.rate_hz, b.rate_hz] for a, b in result.pairs],
        "again": again.gate.short() if again is not None and again.gate else None,
        "order": "".join(result.order), "seconds": seconds,
        "rate_a": result.a.total.rate_hz, "rate_b": result.b.total.rate_hz,
        "probe_mb_s": probe, "load": os.getloadavg()[0],
        "failed": result.a.total.failed + result.b.total.failed,
        "stopped_share": stopped,
    }


def paired_limit(settings: Settings) -> float:
    """The longest a paired step runs: each side up to ``BUDGET`` times the step's
    duration, in runs with a warm-up each."""
    from pytest_storagescale.paired import BUDGET, PAIRS

    budget = settings.extra.get("paired_budget", BUDGET)
    runs = budget * PAIRS
    return 2 * (budget * settings.duration + runs * (settings.warmup + 1.0))


def paired_rows(trials: list[dict]) -> list[str]:
    rows = ["| side B | trials | regressed (confirmed): share [95 % interval] | "
            "inconclusive | unchanged | improved | the same runs judged by the gate before "
            "(windows pooled): regressed, before a retest | B / A: median (range) | "
            "pairs per verdict "
            "(median) | wall time per verdict (mean) |",
            "|---|---:|---|---:|---:|---:|---|---|---:|---:|"]
    names = {"A/A": "the same server (A/A)", "capped": "capped by a cgroup",
             "rate": "rate: SIGSTOP duty cycle", "p99": "p99: short SIGSTOPs"}
    for kind in ("A/A", "capped", "rate", "p99"):
        mine = [t for t in trials if t["kind"] == kind]
        if not mine:
            continue
        count = len(mine)
        ratios = [t["rate"][0] for t in mine if t["rate"] and t["rate"][0] is not None]
        p99s = [t["p99"][0] for t in mine if t.get("p99") and t["p99"][0] is not None]
        shares = [t["stopped_share"] for t in mine if t.get("stopped_share") is not None]
        extra = (f"; p99 {_fmt(median(p99s))} ({_fmt(min(p99s, default=None))}-"
                 f"{_fmt(max(p99s, default=None))})" if p99s else "")
        extra += f"; stopped {statistics.mean(shares):.0%} of the time" if shares else ""
        rows.append(
            f"| {names[kind]} | "
            f"{count} | "
            f"{rate_interval(sum(t['verdict'].startswith('regressed') for t in mine), count)} | "
            f"{sum(t['verdict'].startswith('inconclusive') for t in mine)} | "
            f"{sum(t['verdict'] == 'unchanged' for t in mine)} | "
            f"{sum(t['verdict'] == 'improved' for t in mine)} | "
            f"{rate_interval(sum(t['pooled'] == 'regressed' for t in mine), count)} | "
            f"{_fmt(median(ratios))} ({_fmt(min(ratios, default=None))}-"
            f"{_fmt(max(ratios, default=None))}){extra} | "
            f"{median([len(t['pairs']) for t in mine]):g} | "
            f"{statistics.mean(t['seconds'] for t in mine):.0f} s |")
    return rows


def calibrate_paired(args, settings: Settings) -> int:
    """The paired mode's calibration: two embedded xrootd, each in a cgroup of its
    own; per trial, side B as it is (A/A) or capped at ``--cap`` cores, in turn."""
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    trials: list[dict] = []
    began_wall, began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.monotonic()
    load_start = os.getloadavg()[0]
    log = args.json.open("w") if args.json else None
    interrupted = False
    longest = 0.0
    with Stress(args.stress, args.budget + 300), EmbeddedXRootD(https=False) as a, \
            EmbeddedXRootD(https=False) as b, CpuGroup(a.pid, "a") as group_a, \
            CpuGroup(b.pid, "b") as group_b:
        specs = [driver_spec(f"root://127.0.0.1:{server.port}/{ROOT}", writable_root=ROOT)
                 for server in (a, b)]
        settings.extra["pid_b"] = b.pid
        version = a.version
        try:
            kinds = args.kinds or PAIRED_KINDS
            for index in range(len(kinds) * args.pairs):
                elapsed = time.monotonic() - began
                if elapsed + longest > args.budget:
                    print(f"budget: {elapsed:.0f} s spent, a trial takes up to "
                          f"{longest:.0f} s: stopping after {len(trials)} trials", flush=True)
                    break
                # rotated from round to round: A/A, capped, capped, A/A... for two kinds
                kind = kinds[(index + index // len(kinds)) % len(kinds)]
                trial = paired_trial(kind, index, specs, (group_a, group_b), settings,
                                     args.cap)
                longest = max(longest, trial["seconds"])
                trials.append(trial)
                if log:
                    log.write(json.dumps(trial) + "\n")
                    log.flush()
                print(f"trial {index + 1} {kind:6}: {trial['short']} -> {trial['verdict']}"
                      f" (pooled windows: {trial['pooled_short']}; again: {trial['again']});"
                      f" {len(trial['pairs'])} pairs, {trial['seconds']:.0f} s, load "
                      f"{trial['load']:.1f}; pairs "
                      + " ".join(f"{x:.0f}/{y:.0f}" for x, y in trial["pairs"]), flush=True)
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: the load stopped, the table of the trials done:",
                  file=sys.stderr)
    if log:
        log.close()
    total = time.monotonic() - began
    loads = [t["load"] for t in trials]
    lines = [
        f"Measured {began_wall}: {len(trials)} paired steps in {total / 60:.1f} min on "
        f"{os.cpu_count()} cores, two embedded xrootd {version} (root://), each in a cgroup "
        f"of its own, side B "
        + "; ".join(text for kind, text in (
            ("capped", f"capped at {args.cap:g} core"),
            ("rate", f"SIGSTOPped {settings.rate_stop_ms:g} ms of every "
                     f"{settings.rate_period_ms:g} ms (rate)"),
            ("p99", f"SIGSTOPped {settings.p99_stop_ms:g} ms of every "
                    f"{settings.p99_period_ms:g} ms (p99)"))
            if kind in (args.kinds or PAIRED_KINDS))
        + (", in turn with trials of side B as it is (A/A)"
           if "A/A" in (args.kinds or PAIRED_KINDS) else "") + "; "
        f"stat at {settings.clients} clients, a {settings.duration:g} s step measured "
        f"as the plugin's paired mode does (A B B A A B B A runs of "
        f"{settings.duration / 4:g} s after {settings.warmup:g} s of warm-up each, more "
        f"mirrored blocks while inconclusive up to {settings.extra.get('paired_budget', 3):g}x "
        f"the step's duration a side, a "
        f"regressed step measured again), the machine loaded by "
        f"{f'`stress-ng --cpu {args.stress}` and by ' if args.stress else 'no stress-ng, only '}"
        f"other jobs sharing it (1-minute load average {load_start:.1f} at the start, "
        f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f} after the trials); "
        f"{sum(t['failed'] for t in trials)} requests failed or hung in all.",
        "", *paired_rows(trials)]
    if interrupted:
        lines.insert(0, "(interrupted: only the trials done)")
    print("\n".join(lines))
    if args.write_docs and trials and not interrupted:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_engine import write_docs  # (this folder: the script's own)

        write_docs(lines, PAIRED_MARKERS)
    return 130 if interrupted else 0


def dry_run(args, settings: Settings) -> None:
    per_step = settings.duration + settings.warmup
    print(f"plan: {args.pairs} pairs at most, each 3 baseline runs + {len(KINDS)} judged runs "
          f"({', '.join(KINDS)}; a regressed one measured again), stat at {settings.clients} "
          f"clients, {settings.duration:g} s steps after {settings.warmup:g} s of warm-up "
          f"(about {per_step:g} s of load a step), stress-ng --cpu {args.stress}, budget "
          f"{args.budget:g} s")
    print(f"rate injection: SIGSTOP {settings.rate_stop_ms:g} ms every "
          f"{settings.rate_period_ms:g} ms; p99 injection: SIGSTOP {settings.p99_stop_ms:g} "
          f"ms every {settings.p99_period_ms:g} ms")
    for index in range(min(args.pairs, 3)):
        print(f"pair {index + 1}: baseline x3, then {' , '.join(pair_order(index))}")
    for kind in KINDS:  # the injection's mechanism, on a process of no importance
        if kind == "A/A":
            continue
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            with injected(kind, sleeper.pid, settings) as cycle:
                time.sleep(0.5)
            state = Path(f"/proc/{sleeper.pid}/stat").read_text().split(")")[-1].split()[0]
            assert cycle is not None
            share = ("not measured" if cycle.stopped_share is None
                     else f"{cycle.stopped_share:.0%} of the time")
            print(f"{kind} injection tried on a sleep process for 0.5 s: stopped "
                  f"{share}, its state after: {state}")
        finally:
            sleeper.kill()
            sleeper.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 pairs, 2 s steps")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds a step")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--stress", type=int, default=4, metavar="N",
                        help="stress-ng --cpu N during the run (0: none)")
    parser.add_argument("--budget", type=float, default=2100.0,
                        help="seconds: no pair starts that would end after it")
    parser.add_argument("--rate-stop-ms", type=float, default=25.0)
    parser.add_argument("--rate-period-ms", type=float, default=100.0)
    parser.add_argument("--p99-stop-ms", type=float, default=10.0)
    parser.add_argument("--p99-period-ms", type=float, default=50.0)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--paired", action="store_true",
                        help="the paired mode (two servers, side B capped by a cgroup in "
                             "every other pair of trials); --pairs counts trials of each kind")
    parser.add_argument("--cap", type=float, default=0.05, metavar="CORES",
                        help="--paired, --capped: the CPU quota of the capped runs")
    parser.add_argument("--capped", action="store_true",
                        help="stored-baseline mode: judge A/A and runs of the server capped "
                             "at --cap cores by a cgroup (instead of the duty cycles)")
    parser.add_argument("--kinds", type=lambda text: tuple(text.split(",")),
                        help="the kinds of judged runs, comma-separated, of A/A, capped, rate, "
                             "p99 (default: A/A,rate,p99; --capped: A/A,capped; --paired: "
                             "A/A,capped)")
    parser.add_argument("--paired-budget", type=float, default=3.0,
                        help="--paired: the gate's paired_budget (times the step's duration "
                             "a side while inconclusive)")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--json", type=Path, help="every judged run's outcome, to this file")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.duration, args.warmup = min(args.pairs, 3), 2.0, 0.5
    problems = [f"--{name} {value}: must be above 0" for name, value in
                (("pairs", args.pairs), ("clients", args.clients),
                 ("duration", args.duration), ("budget", args.budget)) if value <= 0]
    problems += [f"--{kind}-stop-ms must be above 0 and below --{kind}-period-ms"
                 for kind, stop, period in (("rate", args.rate_stop_ms, args.rate_period_ms),
                                            ("p99", args.p99_stop_ms, args.p99_period_ms))
                 if not 0 < stop < period]
    if args.kinds and not set(args.kinds) <= {"A/A", "capped", "rate", "p99"}:
        problems.append(f"--kinds {','.join(args.kinds)}: of A/A, capped, rate, p99")
    if args.kinds and "capped" in args.kinds:
        args.capped = args.capped or not args.paired
    if (args.paired or args.capped) and not 0 < args.cap < 64:
        problems.append(f"--cap {args.cap}: a share of cores above 0 (0.05: a twentieth)")
    if (args.paired or args.capped) and not (os.geteuid() == 0 and CpuGroup.ROOT.joinpath(
            "cpu.cfs_quota_us").exists()):
        problems.append("--paired and --capped need root and the cgroup v1 cpu controller "
                        "(/sys/fs/cgroup/cpu)")
    if args.stress and shutil.which("stress-ng") is None:
        problems.append("--stress needs stress-ng: bash scripts/bootstrap.sh all "
                        "(or --stress 0)")
    problems += [f"--paired-budget {args.paired_budget}: from 1 to 100"] * (
        not 1 <= args.paired_budget <= 100)
    if problems:
        print("bench_gate: " + "; ".join(problems), file=sys.stderr)
        return 4
    settings = Settings(clients=args.clients, duration=args.duration, warmup=args.warmup,
                        rate_stop_ms=args.rate_stop_ms, rate_period_ms=args.rate_period_ms,
                        p99_stop_ms=args.p99_stop_ms, p99_period_ms=args.p99_period_ms)
    settings.extra["paired_budget"] = args.paired_budget
    if args.dry_run:
        dry_run(args, settings)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.paired:
        return calibrate_paired(args, settings)
    global KINDS
    if args.capped:
        KINDS = ("A/A", "capped")
        settings.extra["cap"] = args.cap
    if args.kinds:
        KINDS = args.kinds
    return calibrate(args, settings)


def calibrate(args, settings: Settings) -> int:
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    outcomes: list[Outcome] = []
    runs: dict[str, list[Run]] = {kind: [] for kind in KINDS}
    bases_all: list[Run] = []
    began_wall, began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.monotonic()
    load_start = os.getloadavg()[0]
    pair_seconds: list[float] = []
    done = 0
    interrupted = False
    with Stress(args.stress, args.budget + 120), EmbeddedXRootD(https=False) as server, \
            ExitStack() as stack:
        if "cap" in settings.extra:  # in a group of its own throughout (see CpuGroup)
            settings.extra["group"] = stack.enter_context(CpuGroup(server.pid, "server"))
        spec = driver_spec(f"root://127.0.0.1:{server.port}/{ROOT}", writable_root=ROOT)
        settings.extra["server_pid"] = server.pid
        version = server.version
        try:
            for index in range(args.pairs):
                elapsed = time.monotonic() - began
                estimate = max(pair_seconds) if pair_seconds else 0.0
                if elapsed + estimate > args.budget:
                    print(f"budget: {elapsed:.0f} s spent, a pair takes up to "
                          f"{estimate:.0f} s: stopping after {done} pairs", flush=True)
                    break
                pair_began = time.monotonic()
                bases = [measure(spec, f"p{index}-b{k}", settings) for k in range(3)]
                bases_all += bases
                for kind in pair_order(index):
                    mine, measured = judged_runs(kind, spec, server.pid,
                                                 f"p{index}-{kind.replace('/', '')}", bases,
                                                 settings)
                    outcomes += mine
                    runs[kind] += measured[:1]
                    for o in mine:
                        print(f"pair {index + 1} {kind:4} vs {o.baselines} base: "
                              f"{o.short} -> {o.verdict}; without the probe {o.alone} "
                              f"({o.seconds:.0f} s): {o.reason[:90]}", flush=True)
                pair_seconds.append(time.monotonic() - pair_began)
                done += 1
                print(f"pair {index + 1} done in {pair_seconds[-1]:.0f} s, load "
                      f"{os.getloadavg()[0]:.1f}, base rates "
                      f"{', '.join(f'{b.rate_hz:,.0f}/s' for b in bases)}", flush=True)
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted: the load stopped, the table of the pairs done:",
                  file=sys.stderr)
    total = time.monotonic() - began
    loads = [r.load for rs in runs.values() for r in rs] + [b.load for b in bases_all]
    failed = sum(r.failed for rs in runs.values() for r in rs) + sum(b.failed for b in bases_all)
    lines = [
        f"Measured {began_wall}: {done} pairs in {total / 60:.1f} min on {os.cpu_count()} "
        f"cores, embedded xrootd {version} (root://, one server throughout), stat at "
        f"{settings.clients} clients, {settings.duration:g} s steps after "
        f"{settings.warmup:g} s of warm-up (10 windows each), the machine loaded by "
        f"{f'`stress-ng --cpu {args.stress}` and by ' if args.stress else 'no stress-ng, only '}"
        f"other jobs sharing it (1-minute load "
        f"average {load_start:.1f} at the start, {min(loads, default=0):.1f}-"
        f"{max(loads, default=0):.1f} after the steps). Baseline rates "
        f"{min((b.rate_hz for b in bases_all), default=0):,.0f}-"
        f"{max((b.rate_hz for b in bases_all), default=0):,.0f}/s (median "
        f"{median([b.rate_hz for b in bases_all]):,.0f}/s), p99 median "
        f"{median([b.p99_s for b in bases_all]) * 1e3:.1f} ms; {_cores_text(bases_all)}; "
        f"{failed} requests failed or "
        f"hung in all. Injected: "
        + "; ".join(
            text for kind, text in (
                ("capped", f"capped, the server (in a cgroup of its own throughout) capped "
                           f"at {settings.extra.get('cap', 0):g} core"),
                ("rate", f"rate, SIGSTOP {settings.rate_stop_ms:g} ms of every "
                         f"{settings.rate_period_ms:g} ms"),
                ("p99", f"p99, SIGSTOP {settings.p99_stop_ms:g} ms of every "
                        f"{settings.p99_period_ms:g} ms")) if kind in KINDS) + ". "
        + "Wall time per "
        "verdict: the baseline runs it needs, the judged run and its retest when regressed "
        "(each step with its host probe before and after and its set-up).",
        "", *summary_rows(outcomes, runs, bases_all)]
    if interrupted:
        lines.insert(0, "(interrupted: only the pairs done)")
    if args.json:
        args.json.write_text(json.dumps({
            "outcomes": [asdict(o) for o in outcomes],
            "baselines": [{"rate_hz": b.rate_hz, "p99_s": b.p99_s, "load": b.load,
                           "server_cores": b.server_cores}
                          for b in bases_all]}, indent=1))
    print("\n".join(lines))
    if args.write_docs and done and not interrupted:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_engine import write_docs  # (this folder: the script's own)

        write_docs(lines, CAPPED_MARKERS if "cap" in settings.extra else MARKERS)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
