"""The gate's calibration harness (benchmarks/bench_gate.py, issue 32 part 4): its
mechanics, not this machine's speed. The injected regression (a SIGSTOP duty cycle)
stops the process it is given and leaves it running at the block's end; the load
(stress-ng) is gone at the block's end; bad options are exit 4 before any load; the
dry run prints the plan and tries the injections on a process of no importance."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "bench_gate.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gate", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_gate", module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


def _state(pid: int) -> str:
    """The process's state letter ('' when it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return ""


def test_the_duty_cycle_stops_the_process_and_leaves_it_running():
    bench = _bench()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        seen = set()
        with bench.DutyCycle(sleeper.pid, stopped_s=0.05, period_s=0.1) as cycle:
            deadline = time.monotonic() + 5
            while "T" not in seen and time.monotonic() < deadline:
                seen.add(_state(sleeper.pid))
                time.sleep(0.005)
        assert "T" in seen  # stopped during the block
        # the share it measured, when its process could report it before the block ended
        assert cycle.stopped_share is None or 0 < cycle.stopped_share < 1
        time.sleep(0.05)
        assert _state(sleeper.pid) != "T"  # continued at its end
    finally:
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(ValueError, match="within the period"):
        bench.DutyCycle(1, stopped_s=0.2, period_s=0.1)


@pytest.mark.skipif(shutil.which("stress-ng") is None,
                    reason="needs stress-ng (scripts/bootstrap.sh all)")
def test_the_load_is_gone_at_the_blocks_end():
    bench = _bench()
    with bench.Stress(1, limit_s=60) as stress:
        time.sleep(0.3)
        process = stress._process
        assert process is not None and process.poll() is None
    assert process.poll() is not None
    group = subprocess.run(["pgrep", "-g", str(process.pid)], capture_output=True, text=True)
    assert group.stdout.strip() == ""


def test_bad_options_are_exit_4_before_any_load():
    result = subprocess.run([sys.executable, str(SCRIPT), "--p99-stop-ms", "50",
                             "--p99-period-ms", "40", "--pairs", "0", "--stress", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 4
    assert "--pairs 0: must be above 0" in result.stderr
    assert "--p99-stop-ms must be above 0 and below --p99-period-ms" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_bad_cap_of_the_paired_mode_is_exit_4_before_any_load():
    result = subprocess.run([sys.executable, str(SCRIPT), "--paired", "--cap", "0",
                             "--stress", "0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 4
    assert "--cap 0.0: a share of cores above 0" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_detection_rate_carries_its_exact_interval():
    bench = _bench()
    assert bench.rate_interval(0, 20) == "0/20 = 0% [0%-17%]"
    assert bench.rate_interval(12, 12) == "12/12 = 100% [74%-100%]"
    assert bench.rate_interval(0, 0) == "-"


@pytest.mark.skipif(not (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists()
                         and __import__("os").geteuid() == 0),
                    reason="needs root and the cgroup v1 cpu controller")
def test_the_cpu_group_caps_and_gives_the_process_back():
    """A process in the harness's group: its quota set and lifted, the process back in
    the root group and the group gone at the block's end."""
    bench = _bench()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        with bench.CpuGroup(sleeper.pid, "test") as group:
            assert str(sleeper.pid) in (group.group / "tasks").read_text().split()
            group.cap(0.05)
            assert (group.group / "cpu.cfs_quota_us").read_text().strip() == "5000"
            group.cap(None)
            assert (group.group / "cpu.cfs_quota_us").read_text().strip() == "-1"
        assert not group.group.exists()
        assert str(sleeper.pid) in (bench.CpuGroup.ROOT / "tasks").read_text().split()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_dry_run_prints_the_plan_and_tries_the_injections():
    result = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--dry-run",
                             "--stress", "0"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "plan: 3 pairs at most" in out and "stat at 5 clients, 2 s steps" in out
    assert "pair 2: baseline x3, then rate , p99 , A/A" in out
    for kind in ("rate", "p99"):
        line = next(line for line in out.splitlines()
                    if line.startswith(f"{kind} injection tried"))
        # continued: asleep (S), or running (R) the moment after its SIGCONT; not stopped (T)
        assert line[-1] in "SR", line


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("stress-ng") is None or shutil.which("xrootd") is None,
                    reason="needs stress-ng and the xrootd server (scripts/bootstrap.sh all)")
def test_sigterm_stops_the_load_and_the_server():
    """SIGTERM in the middle of a run: exit 130, stress-ng and the server gone."""
    import signal

    run = subprocess.Popen([sys.executable, str(SCRIPT), "--quick", "--pairs", "1",
                            "--stress", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        stress: list[str] = []
        deadline = time.monotonic() + 60
        while not stress and time.monotonic() < deadline and run.poll() is None:
            stress = subprocess.run(["pgrep", "-P", str(run.pid), "-x", "stress-ng"],
                                    capture_output=True, text=True).stdout.split()
            time.sleep(0.1)
        assert stress, "stress-ng did not start"
        time.sleep(2)  # the server started, a step under way
        children = subprocess.run(["pgrep", "-P", str(run.pid)], capture_output=True,
                                  text=True).stdout.split()
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 130, err
    assert "interrupted: the load stopped" in err
    # stress-ng and the server gone; multiprocessing's resource tracker ends once it
    # reads EOF, which may take it a few seconds on a busy machine
    deadline = time.monotonic() + 15
    left = children
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if _state(int(pid)) not in ("", "Z")]
        time.sleep(0.1)
    assert not left, left


SUITE_SCRIPT = REPO / "benchmarks" / "bench_gate_suite.py"


def test_the_suite_harness_answers_bad_options_with_exit_4_before_any_load():
    """benchmarks/bench_gate_suite.py (issue 32's "done when" through the plugin): each
    bad value named, one paragraph, exit 4, no server or stress-ng started."""
    result = subprocess.run([sys.executable, str(SUITE_SCRIPT), "--modes", "paired,nightly",
                             "--rounds", "0", "--cap", "3", "--stress", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 4, result.stderr
    for named in ("--modes paired,nightly", "--rounds 0", "--cap 3.0"):
        assert named in result.stderr
    assert "Nothing was started" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_the_suite_harness_names_each_steps_gate():
    """A step's line says its clients, the deciding ratio with its interval, the gate's
    verdict, the retest and the rate when p99 decided: what the docs' table is read from."""
    spec = importlib.util.spec_from_file_location("bench_gate_suite", SUITE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    step = {"clients": 50, "verdict": "fail", "gate": "regressed", "retest": "confirmed",
            "metric": "p99_s", "ratio": 2.31, "low": 1.8, "high": 2.9, "rate_ratio": 0.71}
    assert module.step_text(step) == ("50: p99_s 2.31 [1.80-2.90] regressed (confirmed) "
                                      "(rate 0.71) -> fail")
    assert module.step_text({"clients": 5, "verdict": "pass", "gate": None}) == \
        "5: pass (no gate)"
