"""dCache's own count of a step's transfers (``load/dcache_billing.py``): the billing
records read from the instance's ``var/billing`` files, bounded, kept by the step's
folder and time, and compared with the clients' operations as the xrootd summary
counters are (``server_monitor.disagreement``). The records here are lines as the
embedded dCache's billing cell wrote them (``billing.format.json=true``); the test
against a real dCache is ``test_dcache_dcap_gsiftp.py`` (its module's dCache)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from pytest_storagescale.load.dcache_billing import (
    BillingLog,
    BillingWatch,
    count,
    counter_for,
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
