"""Faults of the tape behind the embedded dCache (servers/tape_hsm.py's fault file,
``TapeControl.inject``): a flush the drive fails, a stage of a file lost on tape, a
drive that hangs. The script alone first (what it answers dCache's script provider),
then on the tests' shared dCache: a failed flush leaves the file on disk only and
precious (never ``NEARLINE``), a lost file's stage fails at once through the Tape REST
API and SRM (dCache itself retries it for ever), and the suite's tape steps count them as failures or hangs of the storage, never a
pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_storagescale.servers import dcache_tape, tape_hsm

SCRIPT = Path(tape_hsm.__file__)
SI = "size=5;new=true;stored=false;sClass=storagescale:tape;cClass=-;hsm=osm;"


def hsm(base: Path, *arguments: str, timeout: float = 60) -> subprocess.CompletedProcess:
    extra = [f"-hsmBase={base}", "-hsmType=osm", "-hsmInstance=osm", "-drives=1",
             "-mount=0", "-perFile=0"]
    return subprocess.run([sys.executable, "-I", str(SCRIPT), *arguments, *extra],
                          capture_output=True, text=True, timeout=timeout)


def faults(base: Path, **by_request: object) -> None:
    base.mkdir(exist_ok=True)
    (base / "faults.json").write_text(json.dumps(by_request))


def test_a_failed_flush_exits_with_the_faults_code_and_stores_nothing(tmp_path: Path) -> None:
    library = tmp_path / "lib"
    replica = tmp_path / "replica"
    replica.write_bytes(b"tape!")
    faults(library, put={"mode": "fail", "rc": 3})
    put = hsm(library, "put", "0000AA", str(replica), f"-si={SI}")
    assert put.returncode == 3 and "injected" in put.stderr
    assert put.stdout == ""  # no URI: dCache keeps the file precious
    assert not (library / "data" / "0000AA").exists()
    [record] = dcache_tape.log_records(library)
    assert record["op"] == "put" and record["fault"] == "fail" and record["error"]
    # the fault cleared: the same flush works
    (library / "faults.json").unlink()
    assert hsm(library, "put", "0000AA", str(replica), f"-si={SI}").returncode == 0
    assert (library / "data" / "0000AA").read_bytes() == b"tape!"


def test_a_lost_file_fails_its_stage_only(tmp_path: Path) -> None:
    library = tmp_path / "lib"
    replica = tmp_path / "replica"
    replica.write_bytes(b"tape!")
    uris = {}
    for pnfsid in ("0000B1", "0000B2"):
        put = hsm(library, "put", pnfsid, str(replica), f"-si={SI}")
        assert put.returncode == 0, put.stderr
        uris[pnfsid] = put.stdout.strip()
    faults(library, get={"mode": "lost", "pnfsids": ["0000B1"]})
    lost = hsm(library, "get", "0000B1", str(tmp_path / "b1"), f"-si={SI}",
               f"-uri={uris['0000B1']}")
    # dCache's CacheException.BROKEN_ON_TAPE, what its own tar/filesystem providers
    # fail such a stage with; never 41-43 (a stage's 41-43 disables the pool)
    assert lost.returncode == tape_hsm.LOST_RC == 243 and "lost on tape" in lost.stderr
    assert hsm(library, "get", "0000B1", str(tmp_path / "b1"), f"-si={SI}",
               f"-uri={uris['0000B1']}").returncode == 243  # each time asked
    assert not (tmp_path / "b1").exists()
    other = hsm(library, "get", "0000B2", str(tmp_path / "b2"), f"-si={SI}",
                f"-uri={uris['0000B2']}")
    assert other.returncode == 0 and (tmp_path / "b2").read_bytes() == b"tape!"
    # flushes are not touched by a stage fault
    assert hsm(library, "put", "0000B3", str(replica), f"-si={SI}").returncode == 0


def test_a_hung_drive_holds_the_request_then_fails_it(tmp_path: Path) -> None:
    library = tmp_path / "lib"
    replica = tmp_path / "replica"
    replica.write_bytes(b"x")
    faults(library, put={"mode": "hang", "seconds": 1.5})
    began = time.monotonic()
    put = hsm(library, "put", "0000C1", str(replica), f"-si={SI}")
    assert put.returncode == tape_hsm.FAULT_RC and "hung" in put.stderr
    assert time.monotonic() - began >= 1.5
    [record] = dcache_tape.log_records(library)
    assert record["fault"] == "hang" and record["ended"] - record["started"] >= 1.5


@pytest.mark.parametrize("text, reason", [
    ("{not json", "unreadable"),
    ('{"put": {"mode": "lost"}}', "mode 'lost'"),
    ('{"put": {"mode": "hang"}}', "needs seconds"),
    ('{"put": {"mode": "fail", "rc": 0}}', "rc 0"),
    ('{"put": {"mode": "hang", "seconds": 99999}}', "seconds 99999"),
])
def test_a_bad_fault_file_fails_the_request_saying_why(tmp_path: Path, text: str,
                                                       reason: str) -> None:
    """A fault the test meant is never silently dropped: the request fails."""
    library = tmp_path / "lib"
    library.mkdir()
    (library / "faults.json").write_text(text)
    replica = tmp_path / "replica"
    replica.write_bytes(b"x")
    put = hsm(library, "put", "0000D1", str(replica), f"-si={SI}")
    assert put.returncode == tape_hsm.FAULT_RC and reason in put.stderr, put.stderr


def test_inject_checks_the_faults_before_writing_them(tmp_path: Path) -> None:
    control = dcache_tape.TapeControl.__new__(dcache_tape.TapeControl)
    control.folder = tmp_path
    with pytest.raises(ValueError, match="mode 'lost'"):
        control.inject(put={"mode": "lost"})
    with pytest.raises(ValueError, match="give put= or get="):
        control.inject(remove={"mode": "fail"})
    assert not (tmp_path / "faults.json").exists()
    control.inject(get={"mode": "hang", "seconds": 5, "pnfsids": ["0000E1"]})
    assert json.loads((tmp_path / "faults.json").read_text()) == {
        "get": {"mode": "hang", "rc": 1, "seconds": 5.0, "pnfsids": ["0000E1"]}}
    control.clear_faults()
    assert not (tmp_path / "faults.json").exists()


#: a failed stage's billing record (its message as dCache 11.2.5 wrote it for
#: test_a_file_lost_on_tape_fails_its_stage_at_once, 2026-11-29; one JSON line)
LOST_RESTORE = ('{"msgType":"restore","date":"2026-11-29T12:00:00.000+0000",'
                '"cellName":"pool1","status":{"code":243,"msg":"HSM script failed (script '
                'reported: 243: tape get: 0000B1: the tape copy cannot be read (injected: '
                'lost on tape);)"},"pnfsid":"0000B1","billingPath":"Unknown","fileSize":1300,'
                '"transferTime":1200}')


def test_the_restore_watch_reads_only_what_billing_appended_since_it_began(tmp_path):
    """dCache's failed restores from the watch's start: a failure before it is not
    seen, a success is no failure, BROKEN_ON_TAPE only for the pnfsids asked."""
    day = tmp_path / "2026" / "11"
    day.mkdir(parents=True)
    billing = day / "billing-2026.11.29"
    billing.write_text(LOST_RESTORE.replace("0000B1", "0000A0") + "\n")
    watch = dcache_tape.RestoreWatch(str(tmp_path))
    assert watch.failures() == []  # before the watch
    with billing.open("a") as stream:
        stream.write(LOST_RESTORE.replace('"code":243', '"code":0') + "\n")
        stream.write(LOST_RESTORE.replace('"code":243', '"code":1').replace("0000B1", "0000C1")
                     + "\n")
        stream.write(LOST_RESTORE + "\n")
        stream.write('{"msgType":"restore","date":')  # a record being written
    assert [(r.pnfsid, r.code) for r in watch.failures()] == [("0000C1", 1), ("0000B1", 243)]
    assert set(watch.lost({"0000B1", "0000C1", "0000A0"})) == {"0000B1"}
    assert "lost on tape" in watch.lost({"0000B1"})["0000B1"].message
    assert watch.lost({"0000FF"}) == {}
    assert dcache_tape.RestoreWatch("").failures() == []  # no billing folder: nothing


# -- on the shared dCache ---------------------------------------------------------------
def _client(server, root: str):
    from pytest_storagescale.drivers.registry import driver_spec

    return driver_spec(server.url_for("davs"), driver="http", options=_options(server),
                       writable_root=root).connect("tape-faults", timeout=60)


def _options(server) -> dict:
    return {key: value for key, value in server.driver_options().items()
            if key != "security_protocol"}


@pytest.fixture
def faulty_tape(embedded_dcache):
    """The shared dCache's tape, a folder of this test in its tape-backed directory, a
    WebDAV client; the faults cleared and the folder removed after the test."""
    control = embedded_dcache.tape_control
    client = _client(embedded_dcache, control.area)
    folder = f"{control.area}/faults-{int(time.time() * 1000)}"
    client.mkdir(folder)
    try:
        yield folder, client, control
    finally:
        control.clear_faults()
        try:
            client.remove_tree(folder)
        finally:
            client.close()


def _wait_for(what: str, check, timeout: float) -> None:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)


def test_a_flush_the_drive_fails_keeps_the_file_on_disk_until_a_retry_works(faulty_tape):
    """dCache runs the flush, the drive fails it: the file stays on the pool's disk
    only (ONLINE, never NEARLINE), the pool retries; once the drive works the retry
    puts it on tape."""
    folder, client, control = faulty_tape
    path = f"{folder}/fails.dat"
    control.inject(put={"mode": "fail"})
    client.put(path, b"not on tape yet\n" * 100)
    pnfsid = str(control.attributes(path)["pnfsId"])
    _wait_for("a failed flush in the tape's log",
              lambda: any(record["pnfsid"] == pnfsid for record in control.failures()), 300)
    assert control.locality(path) == "ONLINE"
    assert control.replicas(pnfsid) and not control.on_tape(pnfsid)
    control.clear_faults()
    seconds = control.wait_locality(path, dcache_tape.ON_TAPE, 300)
    print(f"on tape {seconds:.1f} s after the fault was cleared (the pool's retry)")
    assert control.on_tape(pnfsid)


def _evicted(folder: str, client, control, name: str) -> tuple[str, str]:
    path = f"{folder}/{name}"
    client.put(path, b"lost on tape\n" * 100)
    control.wait_locality(path, dcache_tape.ON_TAPE, 300)
    return path, control.evict(path)


def test_a_file_lost_on_tape_fails_its_stage_at_once(faulty_tape):
    """The library cannot read the file: it exits 243 (dCache's BROKEN_ON_TAPE), dCache's
    billing records the failed restore with that code, and yet dCache keeps the Tape
    REST request going: PinManager asks for the restore again (a second failed get in
    the library's log) while the file's state stays STARTED, never FAILED. The suite's
    stage does not wait for its deadline: it fails as soon as billing has the failure
    (LostOnTape, naming the code and dCache's message) and cancels the request
    (CANCELLED); SRM bringOnline the same (aborted). Readable again, a stage works."""
    from suites.dcache import tape

    folder, client, control = faulty_tape
    path, pnfsid = _evicted(folder, client, control, "lost.dat")
    control.inject(get={"mode": "lost", "pnfsids": [pnfsid]})
    # what dCache does by itself: a failed restore recorded, asked again, still STARTED
    watch = control.restore_watch()
    request = control.stage_tape_rest([path])
    _wait_for("dCache's billing recording the restore failed with 243",
              lambda: pnfsid in watch.lost({pnfsid}), 120)
    record = watch.lost({pnfsid})[pnfsid]
    print(f"dCache's billing: restore of {pnfsid}: {record.code} {record.message}")
    assert "243" in record.message and "lost on tape" in record.message
    _wait_for("PinManager asking for the restore again (a second failed get)",
              lambda: sum(r["pnfsid"] == pnfsid and r["fault"] == "lost"
                          for r in control.failures()) >= 2, 150)
    files = control.tape_rest_files(request)
    print(f"the Tape REST request after two failed restores: {files}")
    assert files[path]["state"] == "STARTED"  # dCache never ends it by itself
    assert control.cancel_tape_rest(request, [path]) == 200
    # the suite's stage: at once, not at its deadline
    for interface, ended in (("tape-rest", "CANCELLED"), ("srm", "aborted")):
        began = time.monotonic()
        with pytest.raises(tape.LostOnTape) as raised:
            tape.stage(control, interface, [path], timeout=600)
        took = time.monotonic() - began
        print(f"a stage of a file lost on tape through {interface}: {took:.1f} s: "
              f"{raised.value}")
        assert took < 300, "the stage waited for its deadline, not for dCache's answer"
        assert "BROKEN_ON_TAPE" in str(raised.value) and pnfsid in str(raised.value)
        assert ended in str(raised.value)
    assert control.locality(path) == "NEARLINE" and control.replicas(pnfsid) == []
    control.clear_faults()
    tape.stage(control, "tape-rest", [path], timeout=300)
    assert control.replicas(pnfsid)


def _step(server, operation, hang_timeout: float, **params):
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.load.engine import run_step
    from pytest_storagescale.load.plan import StepContext, StepPlan

    root = "/storagescale"
    spec = driver_spec(server.url_for("davs"), driver="http", options=_options(server),
                       writable_root=root)
    # a hung client keeps a count-bounded step to its duration: just past the hang
    plan = StepPlan(operation=operation, clients=1, duration=hang_timeout + 30, warmup=0.0,
                    hang_timeout=hang_timeout, driver=spec,
                    workdir=f"{root}/fault-step-{int(time.time() * 1000)}", params=params,
                    max_operations=1,
                    step=StepContext(extra={"tape": server.tape_access,
                                            "prefix": f"fault-steps-{int(time.time())}"}))
    return run_step(plan)


def test_the_suites_tape_steps_count_a_failing_tape_as_failed_or_hung(embedded_dcache):
    """The suite's flush step with every flush failing: its file never reaches tape,
    the step counts it hung (its hang_timeout), nothing succeeded. Its stage step of
    a file lost on tape: failed (dCache's billing says BROKEN_ON_TAPE; dCache itself
    would retry the restore for ever), before the hang timeout, nothing succeeded."""
    from suites.dcache import tape

    control = embedded_dcache.tape_control
    control.inject(put={"mode": "fail"})
    try:
        flush = _step(embedded_dcache, tape.Flush(), 20.0, file_size=1000)
    finally:
        control.clear_faults()
    print(f"flush with a failing drive: {flush.total}")
    assert flush.total.succeeded == 0 and flush.total.hung + flush.total.failed == 1
    assert flush.total.hung == 1

    class LostStage(tape.Stage):
        """The suite's stage, with its files lost on tape once evicted."""

        def prepare(self, driver, workdir, params, clients, step=None):
            context = super().prepare(driver, workdir, params, clients, step)
            pnfsids = [str(control.attributes(path)["pnfsId"]) for path in context["paths"]]
            control.inject(get={"mode": "lost", "pnfsids": pnfsids})
            return context

    try:
        stage = _step(embedded_dcache, LostStage(), 45.0, file_size=1000, files=1,
                      interface="tape-rest", per_request=1)
    finally:
        control.clear_faults()
    print(f"stage of a file lost on tape: {stage.total}")
    assert stage.total.succeeded == 0 and stage.total.failed == 1 and stage.total.hung == 0
    assert "BROKEN_ON_TAPE" in str(stage.total.error_examples)
