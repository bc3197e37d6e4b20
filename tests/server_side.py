"""A load step with the server's side watched as a session watches it
(load/server_monitor.ServerWatch around the engine's load), for the tests of the server's
counters against a real xrootd or cluster."""

from __future__ import annotations

import threading

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan
from pytest_storagescale.load.server_monitor import ServerWatch
from pytest_storagescale.records import StepRecord


def stat_step(server, root, **values) -> StepPlan:
    plan = dict(operation=get_operation("stat"), clients=4, duration=2.0, warmup=0.5,
                hang_timeout=30.0, workdir=f"{root}/step",
                driver=driver_spec(server.url, writable_root=root,
                                   options={"client_loop": "compiled"}))
    plan.update(values)
    return StepPlan(**plan)


def watched_step(server, listener, plan: StepPlan, root: str,
             during=None) -> tuple[StepRecord, ServerWatch]:
    """Run ``plan`` with the server's side watched as a session watches it (``during``:
    called in a thread once the load began); the step's record."""
    calibration = driver_spec(server.url, writable_root=root).connect("calib", timeout=10)

    def send(count: int) -> None:  # as steps.server_watch's: the step's kind of request
        request = calibration.ls if plan.operation.name == "ls" else calibration.stat
        for _ in range(count):
            request(root)

    watch = ServerWatch(source="test", operation=plan.operation.name,
                        pids=server.server_pids(), listener=listener, door="root", send=send)
    outside = None

    def observe():
        nonlocal outside
        bracket = watch.bracket()

        class Started:
            def __enter__(self):
                bracket.__enter__()
                if during is not None:
                    nonlocal outside
                    outside = threading.Thread(target=during, daemon=True)
                    outside.start()

            def __exit__(self, *exc):
                if outside is not None:
                    outside.join()
                return bracket.__exit__(*exc)

        return Started()

    result = run_step(plan, executor="threads", observe=observe)
    calibration.close()
    record = StepRecord(step_id="1", test="t", section="stat", operation="stat",
                        clients=plan.clients, result=result, client_cpu_limit=0.9)
    measure_from = result.started + result.warmup_s
    record.server = watch.usage(measure_from, measure_from + result.duration_s)
    return record, watch
