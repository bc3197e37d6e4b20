"""dCache's own count of a step's transfers (``load/dcache_billing.py``): the billing
records read from the instance's ``var/billing`` files, bounded, kept by the step's
folder and time, and compared with the clients' operations as the xrootd summary
counters are (``server_monitor.disagreement``). The records here are lines as the
embedded dCache's billing cell wrote them (``billing.format.json=true``); the test
against a real dCache is ``test_dcache_dcap_gsiftp.py`` (its module's dCache)."""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import UTC, datetime

import pytest

from pytest_storagescale.load.dcache_billing import (
    BillingCounts,
    BillingLog,
    BillingWatch,
    count,
    counter_for,
    in_folder,
    normal_path,
    parse_record,
)
from pytest_storagescale.load.server_monitor import ServerWatch, disagreement


def _line(path: str, *, write: bool = False, code: int = 0, size: int = 100,
          when: float | None = None, kind: str = "transfer") -> str:
    stamp = datetime.fromtimestamp(time.time() if when is None else when, UTC
                                   ).isoformat(timespec="milliseconds")
    return json.dumps({"msgType": kind, "date": stamp, "cellName": "pool1",
                       "status": {"code": code, "msg": "" if not code else "failed"},
                       "isWrite": "write" if write else "read", "transferSize": size,
                       "billingPath": path, "protocolInfo": {"protocol": "Http"}})


def _billing(tmp_path, lines: list[str]):
    folder = tmp_path / "billing" / "2026" / "11"
    folder.mkdir(parents=True, exist_ok=True)
    day = folder / "billing-2026.11.29"
    with day.open("a") as stream:
        stream.writelines(line + "\n" for line in lines)
    return day


def test_a_transfer_record_is_read_and_other_records_are_not():
    transfer = parse_record(_line("/storagescale/run/f", write=True, size=7))
    assert transfer is not None and transfer.is_write and transfer.size == 7
    assert transfer.path == "/storagescale/run/f" and transfer.protocol == "Http"
    assert transfer.when > 0
    assert parse_record(_line("/storagescale/run/f", kind="remove")) is None
    for junk in ("", "not json", "[1, 2]", '{"msgType": "transfer", "transferSize": "x"}'):
        assert parse_record(junk) is None


def test_only_the_steps_folder_and_the_loads_time_count():
    began = time.time()
    transfers = [parse_record(line) for line in (
        _line("/storagescale/run/step/file-00001"),
        _line("/storagescale/run/step/file-00002", code=10006),  # failed: still an op
        _line("/storagescale/run/step/c00001-0000001", write=True, size=5),
        _line("/storagescale/run/step-other/file-00001"),  # a sibling folder
        _line("/storagescale/run/step/file-00003", when=began - 60),  # the set-up's
    )]
    counts = count([t for t in transfers if t is not None], "//storagescale/run/step/",
                   began - 1)
    assert (counts.read, counts.write, counts.failed, counts.write_bytes) == (2, 1, 1, 5)
    assert normal_path("//storagescale//run/") == "/storagescale/run"


def test_what_was_appended_since_the_mark_is_read_and_a_half_line_waits(tmp_path):
    day = _billing(tmp_path, [_line("/a/old")])
    log = BillingLog(tmp_path / "billing")
    marks = log.mark()
    with day.open("a") as stream:
        stream.write(_line("/a/new") + "\n" + _line("/a/half")[:20])
    found, marks, _ = log.since(marks)
    assert [t.path for t in found] == ["/a/new"]
    with day.open("a") as stream:
        stream.write(_line("/a/half")[20:] + "\n")
    found, _, _ = log.since(marks)
    assert [t.path for t in found] == ["/a/half"]


def test_the_watch_takes_the_records_once_they_stop_coming(tmp_path):
    _billing(tmp_path, [_line("/storagescale/run/s/file-1", when=time.time() - 600)])
    watch = BillingWatch(BillingLog(tmp_path / "billing"), "/storagescale/run/s",
                         settle_s=0.3, deadline_s=5)
    watch.start()
    _billing(tmp_path, [_line("/storagescale/run/s/file-2") for _ in range(3)])
    counts = watch.finish()
    assert (counts.read, counts.note) == (3, "")


def test_namespace_steps_compare_nothing_and_composites_every_transfer():
    assert (counter_for("ls", False), counter_for("stat", False)) == ("", "")
    assert (counter_for("get", False), counter_for("put", False)) == ("read", "write")
    assert counter_for("mixed", True) == "transfers"


def test_a_step_whose_counts_disagree_says_so(tmp_path):
    """The clients made 10 gets; billing recorded 10 (agree), then 14 (load from
    outside), then 6 (requests that never reached a pool): the watch's usage and
    disagreement() say which."""
    for recorded, verdict in ((10, None), (14, "load from outside the plugin"),
                              (6, "never reached the server")):
        folder = tmp_path / str(recorded)
        billing = BillingWatch(BillingLog(folder / "billing"), "/storagescale/run/s",
                               counter=counter_for("get", False), settle_s=0.2, deadline_s=5)
        watch = ServerWatch(source="embedded dcache", operation="get", billing=billing,
                            billing_counter=billing.counter)
        with watch.bracket():
            _billing(folder, [_line(f"/storagescale/run/s/file-{i}") for i in range(recorded)])
        usage = watch.usage(time.time() - 1, time.time())
        assert usage.counted == "read" and usage.operations == recorded
        said = disagreement(10, 0, usage, clients=4)
        assert (said is None) if verdict is None else (verdict in said), said


def test_a_step_of_the_embedded_dcache_is_watched_in_its_folder(tmp_path):
    """steps.server_watch's billing part: a server with ``billing_directory`` (the
    embedded dCache) has a get step watched in the step's own folder, compared by its
    reads, readers beside writers by every transfer; a namespace step, or a server
    without billing, is not watched."""
    from types import SimpleNamespace

    from pytest_storagescale.load.operations import get_operation
    from pytest_storagescale.steps import _billing_watch

    server = SimpleNamespace(billing_directory=tmp_path / "billing")
    for operation, counter in (("get", "read"), ("put", "write"), ("mixed", "transfers"),
                               ("ls", None), ("stat", None)):
        plan = SimpleNamespace(operation=get_operation(operation),
                               workdir="//storagescale/run/step-1")
        watch = _billing_watch(server, plan)
        if counter is None:
            assert watch is None, operation
            continue
        assert (watch.counter, watch.folder, watch.log.folder) == (
            counter, "//storagescale/run/step-1", tmp_path / "billing"), operation
    plan = SimpleNamespace(operation=get_operation("get"), workdir="/storagescale/x")
    assert _billing_watch(SimpleNamespace(), plan) is None


def _tape_line(kind: str, path: str, pnfsid: str, *, size: int = 100, code: int = 0,
               when: float | None = None) -> str:
    """A ``store`` (flush) or ``restore`` (stage) record as the pool's nearline storage
    handler sends it: a stage's names no path (``Unknown``)."""
    stamp = datetime.fromtimestamp(time.time() if when is None else when, UTC
                                   ).isoformat(timespec="milliseconds")
    return json.dumps({"msgType": kind, "date": stamp, "cellName": "pool1",
                       "status": {"code": code, "msg": ""}, "pnfsid": pnfsid,
                       "billingPath": path if kind == "store" else "Unknown",
                       "fileSize": size, "transferTime": 5,
                       "hsm": {"type": "osm", "instance": "osm"}})


def _write(path: str, pnfsid: str, when: float | None = None) -> str:
    line = json.loads(_line(path, write=True, when=when))
    return json.dumps({**line, "pnfsid": pnfsid})


def test_flushes_and_stages_are_counted_beside_the_transfers():
    """A tape step's folder is named after the step's (``<run>/<step>-<suffix>``, in the
    tape-backed directory): its writes count, its flushes (``store``) beside them, its
    stages (``restore``, no path) by the files the set-up wrote; another step's folder
    and another run's do not."""
    began = time.time()
    step = "/storagescale/run-1/tape_write-c2-main-007"
    tape = "/storagescale/tape/run-1/tape_write-c2-main-007-a1b2c3"
    lines = [
        _write(f"{tape}/staged-0", "00A0", when=began - 300),  # the set-up's: not counted
        _write(f"{tape}/c0-0", "00A1"), _write(f"{tape}/c1-0", "00A2"),
        _tape_line("store", f"{tape}/c0-0", "00A1", size=7),
        _tape_line("store", f"{tape}/c1-0", "00A2", size=7, code=41),  # failed flush
        _tape_line("restore", "", "00A0", size=9),
        _tape_line("restore", "", "00FF"),  # a file of no folder of the step
        _write("/storagescale/tape/run-1/tape_write-c2-main-0071-x/c0", "00B1"),
        _write("/storagescale/tape/run-2/tape_write-c2-main-007-x/c0", "00B2"),
        _tape_line("store", "/storagescale/tape/run-1/flush-c1-main-003-x/c0", "00B3"),
    ]
    transfers = [parse_record(line) for line in lines]
    assert [t.kind for t in transfers if t is not None][:6] == [
        "transfer", "transfer", "transfer", "store", "store", "restore"]
    counts = count([t for t in transfers if t is not None], step, began - 1)
    assert (counts.write, counts.stored, counts.restored, counts.tape_failed) == (2, 2, 1, 1)
    assert (counts.stored_bytes, counts.restored_bytes) == (14, 9)
    assert counts.ops()["stored"] == 2 and "restored" in counts.ops()
    assert "stored" not in BillingCounts(write=1).ops()  # no tape: no tape keys
    assert in_folder(f"{tape}/c0-0", step) and in_folder(f"{step}/f", step)
    assert not in_folder(f"{tape}", step)  # the folder itself is no file of it
    assert counter_for("tape_write", False) == counter_for("flush", False) == "write"


def test_a_flush_right_after_its_write_counts_as_the_step_s():
    """A store record is dated when the pool took the flush, not when it ended (11.2.5's
    billing: a store dated 15:01:30.366 with transferTime 1,203 ms, the tape library
    asked at 15:01:30.433): a flush begun 0.2 s after the step's start counts, though
    its date less its time falls before it (CI, 2026-11-29: 0 of 3 counted)."""
    began = time.time()
    tape = "/storagescale/tape/run-1/tape_write-c1-main-001-a1b2c3"
    store = json.loads(_tape_line("store", f"{tape}/c0-0", "00A1", size=8000,
                                  when=began + 0.2))
    store["transferTime"] = 1203
    write = _write(f"{tape}/c0-0", "00A1", when=began + 0.3)
    transfers = [parse_record(line) for line in (write, json.dumps(store))]
    assert transfers[1] is not None and transfers[1].when >= began
    counts = count([t for t in transfers if t is not None],
                   "/storagescale/run-1/tape_write-c1-main-001", began)
    assert (counts.write, counts.stored, counts.stored_bytes) == (1, 1, 8000)
    transfer = parse_record(json.dumps({**json.loads(write), "transferTime": 2000}))
    assert transfer is not None and transfer.when == pytest.approx(began + 0.3 - 2, abs=0.01)


def test_flushes_still_coming_after_the_load_do_not_hold_the_watch(tmp_path):
    """The pools go on flushing a tape step's files after its load: the watch settles
    on its transfers, takes the flushes recorded by then, and says nothing is short."""
    step = "/storagescale/run/tape_write-c1-main-001"
    watch = BillingWatch(BillingLog(tmp_path / "billing"), step, counter="write",
                         settle_s=0.3, deadline_s=5)
    watch.prime()
    watch.start()
    _billing(tmp_path, [_write(f"{step}/c0-0", "00C1")])
    stop = threading.Event()

    def flushing():
        for index in range(40):
            if stop.wait(0.1):
                return
            _billing(tmp_path, [_tape_line("store", f"{step}/c0-0", f"00D{index}")])

    thread = threading.Thread(target=flushing, daemon=True)
    thread.start()
    began = time.monotonic()
    try:
        counts = watch.finish()
    finally:
        stop.set()
        thread.join(5)
    assert time.monotonic() - began < 3, "the flushes held the watch"
    assert (counts.write, counts.note) == (1, "") and counts.stored >= 1


def test_the_tape_steps_are_watched_and_a_stage_compares_nothing(tmp_path, monkeypatch):
    """steps.server_watch's billing part for the tape steps (suites/dcache/tape.py,
    registered by the suite's conftest): a flush and a central-flushing write are
    compared by their writes; a stage is watched (its files' stages counted) with no
    comparison, and its watch marks the billing files before the set-up."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    from pytest_storagescale.steps import _billing_watch

    source = Path(__file__).resolve().parent.parent / "suites" / "dcache" / "tape.py"
    spec = importlib.util.spec_from_file_location("billing_test_tape_operations", source)
    assert spec is not None and spec.loader is not None
    tape = importlib.util.module_from_spec(spec)
    # a module loaded from its file is in sys.modules while it runs, as an import puts
    # it: its dataclasses look their module up there (tape.Flushing)
    monkeypatch.setitem(sys.modules, spec.name, tape)
    spec.loader.exec_module(tape)
    operations = {operation.name: operation for operation in tape.OPERATIONS}
    day = _billing(tmp_path, [_line("/storagescale/run/stage-c1-main-002/before")])
    server = SimpleNamespace(billing_directory=tmp_path / "billing")
    for name, counter in (("flush", "write"), ("tape_write", "write"), ("stage", "")):
        plan = SimpleNamespace(operation=operations[name],
                               workdir=f"//storagescale/run/{name}-c1-main-002")
        watch = _billing_watch(server, plan)
        assert watch is not None and watch.counter == counter, name
        assert watch._marks == {day: day.stat().st_size}, name  # primed: before the set-up


# -- the tests' shared dCache, with its tape --------------------------------------------
def test_a_tape_steps_writes_flushes_and_stages_are_in_billing(embedded_dcache):
    """As a tape step's watch sees them (steps._billing_watch on the shared dCache):
    3 files written into a folder of the tape-backed directory named after the step's
    (``<run>/<step>-<suffix>``, as suites/dcache/tape.py names its folders) are 3
    writes and, once on tape, 3 ``store`` records (the flushes); evicted and staged
    back through the Tape REST API under a second watch, primed before their writes
    as a stage step's is before its set-up, 3 ``restore`` records (which name no
    path: matched by the files' ids in the writes' records) and no transfer."""
    import secrets
    from types import SimpleNamespace

    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.load.operations import get_operation
    from pytest_storagescale.servers import dcache_tape
    from pytest_storagescale.steps import _billing_watch

    server = embedded_dcache
    control = server.tape_control
    run = f"billing-{secrets.token_hex(4)}"
    step = f"/storagescale/{run}/tape_write-c1-main-001"
    folder = f"{control.area}/{run}/tape_write-c1-main-001-{secrets.token_hex(3)}"
    options = {key: value for key, value in server.driver_options().items()
               if key != "security_protocol"}
    client = driver_spec(server.url_for("davs"), driver="http", options=options,
                         writable_root=f"{control.area}/{run}").connect("billing-tape",
                                                                          timeout=60)
    paths = [f"{folder}/c0-{index}" for index in range(3)]
    try:
        client.mkdir(f"{control.area}/{run}")
        client.mkdir(folder)
        writes = _billing_watch(server, SimpleNamespace(
            operation=get_operation("put"), workdir=step))
        stages = _billing_watch(server, SimpleNamespace(
            operation=SimpleNamespace(name="stage", sides=()), workdir=step))
        assert writes is not None and stages is not None and stages.counter == ""
        writes.start()
        for path in paths:
            client.put(path, b"to tape " * 1000)
        for path in paths:
            control.wait_locality(path, dcache_tape.ON_TAPE, 900)
        # a pool sends a flush's billing record after the file shows on tape (CI,
        # 2026-11-29: none of 3 there when the watch read): billing's lines are read
        # apart from the watch until the 3 stores are there (at most 300 s)
        recorded = _recorded(server, writes, "stored", 3, 300)
        flushed = writes.finish()
        control.evict_many(paths)
        stages.start()
        request = control.stage_tape_rest(paths)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            states = control.poll_tape_rest(request)
            if all(states.get(path) == "COMPLETED" for path in paths):
                break
            time.sleep(0.5)
        restores = _recorded(server, stages, "restored", 3, 300)  # as for the stores
        staged = stages.finish()
    finally:
        try:
            client.remove_tree(f"{control.area}/{run}")
        finally:
            client.close()
    print(f"billing of a tape step's folder: writes {flushed}, stages {staged}")
    # the watch does not wait for flushes still on their way after the load (by
    # design: a flush may end minutes later): it counts the stores billing had
    # recorded when it read, 8,000 bytes each
    assert (flushed.write, flushed.note) == (3, ""), flushed
    assert recorded >= 1, "billing recorded no flush of 3 files on tape within 300 s"
    assert recorded <= flushed.stored <= 3, (recorded, flushed)
    assert flushed.stored_bytes == flushed.stored * 8000, flushed
    assert restores >= 1, "billing recorded no stage of 3 files staged within 300 s"
    assert restores <= staged.restored <= 3, (restores, staged)
    assert (staged.restored_bytes, staged.transfers, staged.note) == (
        staged.restored * 8000, 0, ""), staged


def _recorded(server, watch: BillingWatch, kind: str, wanted: int, deadline_s: float
              ) -> int:
    """How many ``kind`` records (``stored``: flushes, ``restored``: stages) of files in
    ``watch``'s folder billing's files gained
    since the watch marked them, read apart from it until ``wanted`` are there or
    ``deadline_s`` has passed."""
    log, marks = BillingLog(server.billing_directory), dict(watch._marks)
    records: list = []
    deadline = time.monotonic() + deadline_s
    while True:
        new, marks, _ = log.since(marks)
        records.extend(new)
        found = getattr(count(records, watch.folder, watch.began), kind)
        if found >= wanted or time.monotonic() >= deadline:
            return found
        time.sleep(1)
