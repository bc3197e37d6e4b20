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
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKERS = ("<!-- gate-bench:start (written by benchmarks/bench_gate.py --write-docs) -->",
           "<!-- gate-bench:end -->")
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
        if select.select([self._process.stdout], [], [], 30.0)[0]:
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

    began = time.monotonic()
    before = probe_client_host()
    result = run_step(StepPlan(operation=get_operation("stat"), clients=settings.clients,
                               duration=settings.duration, warmup=settings.warmup,
                               hang_timeout=30.0, driver=spec, workdir=f"{ROOT}/{tag}"),
                      executor="auto")
    probe = HostProbe(before, probe_client_host())
    total = result.total
    return Run(list(total.windows), probe, total.rate_hz, total.latency_s["p99"],
               total.failed + total.hung, time.monotonic() - began, os.getloadavg()[0])


@contextmanager
def injected(kind: str, pid: int, settings: Settings) -> Iterator[DutyCycle | None]:
    if kind == "A/A":
        yield None
        return
    stop, period = ((settings.rate_stop_ms, settings.rate_period_ms) if kind == "rate"
                    else (settings.p99_stop_ms, settings.p99_period_ms))
    with DutyCycle(pid, stopped_s=stop / 1e3, period_s=period / 1e3,
                   limit_s=4 * (settings.duration + settings.warmup) + 60) as cycle:
        yield cycle


def judge(run: Run, bases: list[Run], probed: bool = True):
    """The gate as the plugin's (``probed``: with the client host's probe), or the
    statistics alone."""
    from pytest_storagescale.gate import host_slowdown, judge_samples

    slowdown = host_slowdown(run.probe, [base.probe for base in bases]) \
        if probed else None  # type: ignore[arg-type]
    return judge_samples(run.windows, [base.windows for base in bases],
                         host_slowdown=slowdown)


def final(gate, again: Run | None, bases: list[Run], probed: bool) -> str:
    """The verdict after the retest: a regressed run measured again."""
    if not gate.fails:
        return gate.verdict.value
    assert again is not None
    return "regressed (confirmed)" if judge(again, bases, probed).fails else \
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
            by_probe=gate.reason.startswith("client host "), reason=gate.reason))
    return outcomes, [r for r in (run, again) if r is not None]


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
                "rate": "rate: SIGSTOP duty cycle", "p99": "p99: short SIGSTOPs"}[kind]
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
    if args.stress and shutil.which("stress-ng") is None:
        problems.append("--stress needs stress-ng: bash scripts/bootstrap.sh all "
                        "(or --stress 0)")
    if problems:
        print("bench_gate: " + "; ".join(problems), file=sys.stderr)
        return 4
    settings = Settings(clients=args.clients, duration=args.duration, warmup=args.warmup,
                        rate_stop_ms=args.rate_stop_ms, rate_period_ms=args.rate_period_ms,
                        p99_stop_ms=args.p99_stop_ms, p99_period_ms=args.p99_period_ms)
    if args.dry_run:
        dry_run(args, settings)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
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
    with Stress(args.stress, args.budget + 120), EmbeddedXRootD(https=False) as server:
        spec = driver_spec(f"root://127.0.0.1:{server.port}/{ROOT}", writable_root=ROOT)
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
        f"{median([b.p99_s for b in bases_all]) * 1e3:.1f} ms; {failed} requests failed or "
        f"hung in all. Injected: rate, SIGSTOP "
        f"{settings.rate_stop_ms:g} ms of every {settings.rate_period_ms:g} ms; p99, SIGSTOP "
        f"{settings.p99_stop_ms:g} ms of every {settings.p99_period_ms:g} ms. Wall time per "
        f"verdict: the baseline runs it needs, the judged run and its retest when regressed "
        f"(each step with its 0.2 s of host probe and its set-up).",
        "", *summary_rows(outcomes, runs, bases_all)]
    if interrupted:
        lines.insert(0, "(interrupted: only the pairs done)")
    if args.json:
        args.json.write_text(json.dumps({
            "outcomes": [asdict(o) for o in outcomes],
            "baselines": [{"rate_hz": b.rate_hz, "p99_s": b.p99_s, "load": b.load}
                          for b in bases_all]}, indent=1))
    print("\n".join(lines))
    if args.write_docs and done and not interrupted:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_engine import write_docs  # (this folder: the script's own)

        write_docs(lines, MARKERS)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
