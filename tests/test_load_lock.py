"""The load lock's unit is the test (issue 31, "the verdict a user reads"): a
multi-step test holds the endpoint from its first step to its end, so no other
worker's step comes between its steps (the recovery test's overload and probe), and
functional checks hold it shared, so none runs beside a load test's steps.

Against the memory driver (no server: the lock is the test) in two processes: a
pytest run of its own under ``-n 2``, and :class:`EndpointLock` between this process
and a child.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path

from pytest_storagescale.session.ledger import EndpointLock

PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[ops.put]
clients = [2]
duration = "1s"
warmup = "0s"
hang_timeout = "30s"
file_size = "1kB"
"""

SUITE = """
import json
import os
import time
from pathlib import Path

import pytest

LOG = Path(os.environ["LOCK_LOG"])


def note(what, when=None):
    with LOG.open("a") as log:
        log.write(json.dumps([what, when or time.time()]) + "\\n")


@pytest.mark.storagescale_op("put")
def test_two_steps(storage_load, storage_clients):
    first = storage_load.run(label="first", judge=False)
    note("held", first.lock_acquired)
    time.sleep(1.5)  # between the steps: nothing else of the session may come here
    second = storage_load.run(label="second", judge=False)
    note("second", second.lock_acquired)
    note("released")


@pytest.mark.storagescale_op("put")
def test_other_load(storage_load, storage_clients):
    step = storage_load.run(judge=False)
    note("other-step", step.lock_acquired)
    note("other-end", step.ended)


@pytest.mark.parametrize("n", range(30))
def test_check(storage_client, storage_test_dir, n):
    note("check-begin")
    storage_client.mkdir(storage_test_dir + "/d")
    time.sleep(0.15)
    note("check-end")
"""


def test_a_multi_step_test_holds_the_endpoint_for_all_its_steps(tmp_path):
    (tmp_path / "thr" / "xrootd").mkdir(parents=True)
    (tmp_path / "thr" / "xrootd" / "t.toml").write_text(PLAN)
    (tmp_path / "test_suite.py").write_text(SUITE)
    log = tmp_path / "lock.log"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_suite.py", "-p", "no:cacheprovider", "-n", "2",
         "--storage-endpoint=memory://lock/area", "--storage-version=1.0",
         "--storage-thresholds=thr", "--storage-driver-option=latency=0.01"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "LOCK_LOG": str(log)})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    at = {name: when for name, when in events if name in
          ("held", "second", "released", "other-step", "other-end")}
    held, released = at["held"], at["released"]
    # the second step took the lock at once: the test held it since its first step
    assert 1.5 <= at["second"] - held < 1.5 + 30, at
    # the other worker's step ran before the two-step test or after it, never between
    assert at["other-end"] <= held or at["other-step"] >= released, at
    checks = [when for name, when in events if name.startswith("check")]
    assert len(checks) == 60
    begun = [when for name, when in events if name == "check-begin"]
    ended = [when for name, when in events if name == "check-end"]
    for begin, end in zip(sorted(begun), sorted(ended), strict=True):
        assert end <= held or begin >= released, (begin, end, at)
    # the checks were running while the load waited, or waited for it: some on
    # either side of a load test (30 checks of 0.15 s beside two load tests)
    loads = [(held, released), (at["other-step"], at["other-end"])]
    assert any(when < start for when in begun for start, _ in loads) or \
        any(when > end for when in begun for _, end in loads), (events, at)


def _hold_in_child(folder: str, exclusive: bool, holding, release) -> None:
    lock = EndpointLock(Path(folder))
    with lock.hold(exclusive=exclusive):
        holding.set()
        release.wait(60)


def _waits(folder: Path, child_exclusive: bool, mine_exclusive: bool) -> bool:
    """Whether this process's hold waits while a child process holds its own: the
    hold is tried in a thread; compatible, it is taken while the child still holds
    (within 30 s, however busy the machine); else it is not taken after 1 s, and is
    once the child lets go."""
    spawn = multiprocessing.get_context("spawn")
    holding, release = spawn.Event(), spawn.Event()
    child = spawn.Process(target=_hold_in_child,
                          args=(str(folder), child_exclusive, holding, release))
    child.start()
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with EndpointLock(folder).hold(exclusive=mine_exclusive):
            taken.set()
        done.set()

    try:
        assert holding.wait(120)
        threading.Thread(target=hold, daemon=True).start()
        waited = not taken.wait(1.0)
        if waited:
            assert not taken.is_set()
        else:
            assert child.is_alive()  # taken while the child held its own
        release.set()
        assert done.wait(30)
        return waited
    finally:
        release.set()
        child.join(30)


def test_checks_share_the_endpoint_and_a_load_test_waits_for_them(tmp_path):
    folder = tmp_path / "shared"
    assert not _waits(folder, False, False)  # two checks at once
    assert _waits(folder, False, True)  # a load test waits for a check
    assert _waits(folder, True, False)  # a check waits for a load test
    assert _waits(folder, True, True)


def test_the_hold_is_reentrant_in_a_process(tmp_path):
    lock = EndpointLock(tmp_path / "shared")
    with lock.hold(exclusive=False):
        assert lock.mode == "shared"
        with lock.hold(exclusive=True):  # a check's own step: upgraded, not deadlocked
            assert lock.mode == "exclusive"
            with lock.hold(exclusive=False):
                assert lock.mode == "exclusive"
        assert lock.mode == "shared"
        with lock.hold(exclusive=False):
            assert lock.mode == "shared"
    assert lock.mode is None
    # released: a child process takes it exclusively (and this one then waits)
    assert _waits(tmp_path / "shared", True, False)
