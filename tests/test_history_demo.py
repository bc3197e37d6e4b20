"""scripts/history_demo.py's slowing mechanism (``make history-demo``'s slowed run): a
process moved into the CPU-capped cgroup gets at most its share of a core, and the
cgroup is gone after; and the dashboard's queries it runs are the shipped panels'."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "history_demo.py"


def _demo():
    spec = importlib.util.spec_from_file_location("history_demo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_capped_cgroup_holds_a_busy_process_to_its_share():
    demo = _demo()
    try:
        demo._cgroup_parent()
    except demo.Missing as exc:
        pytest.skip(str(exc))
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with demo.cpu_capped([busy.pid], 0.01) as said:
            group = Path(said.split()[2])
            assert str(busy.pid) in (group / "cgroup.procs").read_text().split()
            before, began = _cpu_seconds(busy.pid), time.monotonic()
            time.sleep(3)
            used = _cpu_seconds(busy.pid) - before
            wall = time.monotonic() - began
            stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
        # the kernel held it: periods where the quota ran out (a busy loop outruns 1 ms
        # in 100 ms however loaded the machine), and its CPU within the quota (1 ms a
        # 100 ms period; one period's slack, and a clock tick's)
        assert int(stat["nr_throttled"]) > 0, stat
        assert used <= 0.01 * wall + 0.01 + 0.02, (used, wall)
        assert not group.exists()  # removed, the process moved back to the parent
    finally:
        busy.kill()
        busy.wait(timeout=30)


def test_the_demo_runs_the_dashboards_panel_queries():
    demo = _demo()
    queries = demo.dashboard_queries("xrootd", "stat")
    assert len(queries) == 5
    assert all("$" not in query and 'storage="xrootd"' in query for _, query in queries)
    assert all('operation=~"stat"' in query for _, query in queries)
