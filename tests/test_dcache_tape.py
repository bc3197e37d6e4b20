"""The tape behind the embedded dCache (servers/dcache_tape.py, servers/tape_hsm.py).

The script alone (no server): what dCache's script provider asks of it (put prints
the URI, get copies back, remove), the drives (never more requests at once than
drives), the mounts (a volume is mounted once while a drive keeps it, again after
another volume), its answers to bad requests. Then on the tests' shared dCache
(``embedded_dcache``, started with a tape): a file written into the tape-backed
directory is flushed (its locality, the library's folder, the log), evicted (the
replica file leaves the pool's folder), staged back through each interface (the
WLCG Tape REST API with archiveinfo, SRM bringOnline through gfal2, ``xrdfs prepare
-s``, which 11.2's door refuses) and read back the same; a file outside it is never
flushed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_storagescale.servers import dcache_tape, tape_hsm
from pytest_storagescale.servers.dcache_tape import TapeLibrary

SCRIPT = Path(dcache_tape.__file__).with_name("tape_hsm.py")
SI = "size=5;new=true;stored=false;sClass=storagescale:tape;cClass=-;hsm=osm;"


def hsm(base: Path, *arguments: str, timeout: float = 60, **options: str
        ) -> subprocess.CompletedProcess:
    """The script as dCache's script provider runs it."""
    extra = [f"-{key}={value}" for key, value in
             {"hsmBase": str(base), "hsmType": "osm", "hsmInstance": "osm", **options}.items()]
    return subprocess.run([sys.executable, "-I", str(SCRIPT), *arguments, *extra],
                          capture_output=True, text=True, timeout=timeout)


def records(base: Path) -> list[dict]:
    return dcache_tape.log_records(base)


def test_put_get_remove_as_dcache_calls_them(tmp_path: Path) -> None:
    replica = tmp_path / "replica"
    replica.write_bytes(b"tape!")
    put = hsm(tmp_path / "lib", "put", "0000ABCD", str(replica), f"-si={SI}")
    assert put.returncode == 0, put.stderr
    uri = put.stdout.strip()
    assert uri == "osm://osm/?store=storagescale&group=tape&bfid=0000ABCD"
    assert (tmp_path / "lib" / "data" / "0000ABCD").read_bytes() == b"tape!"
    back = tmp_path / "back"
    got = hsm(tmp_path / "lib", "get", "0000ABCD", str(back), f"-si={SI}", f"-uri={uri}")
    assert got.returncode == 0, got.stderr
    assert back.read_bytes() == b"tape!"
    assert [record["op"] for record in records(tmp_path / "lib")] == ["put", "get"]
    removed = hsm(tmp_path / "lib", "remove", f"-uri={uri}")
    assert removed.returncode == 0, removed.stderr
    assert not (tmp_path / "lib" / "data" / "0000ABCD").exists()
    # removed already: not an error (dCache's hsmcp.rb's rule)
    assert hsm(tmp_path / "lib", "remove", f"-uri={uri}").returncode == 0


def test_bad_requests_are_refused_with_a_reason(tmp_path: Path) -> None:
    missing = hsm(tmp_path / "lib", "get", "0000FFFF", str(tmp_path / "x"), f"-si={SI}",
                  "-uri=osm://osm/?store=s&group=g&bfid=0000FFFF")
    # dCache's BROKEN_ON_TAPE (not 41-43: those disable the pool on a stage)
    assert missing.returncode == tape_hsm.LOST_RC == 243 and "not on the tape" in missing.stderr
    sneaky = hsm(tmp_path / "lib", "remove", "-uri=osm://osm/?bfid=../../etc")
    assert sneaky.returncode == 5 and "no usable bfid" in sneaky.stderr
    assert hsm(tmp_path / "lib", "rewind").returncode == 4
    no_base = subprocess.run([sys.executable, "-I", str(SCRIPT), "put", "a", "b"],
                             capture_output=True, text=True, timeout=60)
    assert no_base.returncode == 4 and "usage" in no_base.stderr


def test_no_more_requests_at_once_than_drives_and_mounts_counted(tmp_path: Path) -> None:
    """Two drives, six puts at once, 0.4 s a file: never three on drives at once;
    each drive mounts its volume once (1 s), then keeps it."""
    library = tmp_path / "lib"
    replicas = []
    for index in range(6):
        replica = tmp_path / f"r{index}"
        replica.write_bytes(b"x" * 1000)
        replicas.append(replica)
    done: list[subprocess.CompletedProcess] = []

    def put(index: int) -> None:
        done.append(hsm(library, "put", f"0000{index:04X}", str(replicas[index]), f"-si={SI}",
                        drives="2", mount="1", perFile="0.4", dismount="60"))

    threads = [threading.Thread(target=put, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [result.returncode for result in done] == [0] * 6, [r.stderr for r in done]
    seen = records(library)
    assert len(seen) == 6
    assert {record["drive"] for record in seen} <= {0, 1}
    moments = sorted([(record["started"], 1) for record in seen]
                     + [(record["ended"], -1) for record in seen])
    busy, most = 0, 0
    for _, change in moments:
        busy += change
        most = max(most, busy)
    assert most <= 2
    mounts = [record for record in seen if record["mounted"]]
    assert 1 <= len(mounts) <= 2  # a drive mounts its volume once, then keeps it
    for record in seen:
        spent = record["ended"] - record["started"]
        assert spent >= 0.4 + (1.0 if record["mounted"] else 0.0) - 0.05


def test_another_volume_or_an_idle_drive_mounts_again(tmp_path: Path) -> None:
    library = tmp_path / "lib"
    replica = tmp_path / "r"
    replica.write_bytes(b"y")
    options = {"drives": "1", "mount": "0.2", "perFile": "0", "dismount": "600"}
    for index, sclass in enumerate(("a:one", "a:one", "b:two")):
        info = SI.replace("storagescale:tape", sclass)
        assert hsm(library, "put", f"1{index}", str(replica), f"-si={info}",
                   **options).returncode == 0
    # a drive idle longer than its dismount time unloaded its volume (0 s: any pause)
    info = SI.replace("storagescale:tape", "b:two")
    assert hsm(library, "put", "13", str(replica), f"-si={info}",
               **{**options, "dismount": "0"}).returncode == 0
    assert [record["mounted"] for record in records(library)] == [True, False, True, True]
    assert [record["volume"] for record in records(library)] == ["a:one", "a:one", "b:two",
                                                                 "b:two"]


@pytest.mark.parametrize("field, value", [("drives", 0), ("mount_s", -1.0),
                                          ("per_file_s", 7200.0), ("flush_files", -1)])
def test_a_library_out_of_range_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        TapeLibrary(**{field: value})


def test_the_pools_setup_names_the_script_and_the_flush_triggers(tmp_path: Path) -> None:
    library = TapeLibrary(drives=3, mount_s=2, per_file_s=0.5, flush_after_s=600,
                          flush_files=10, flush_bytes=200_000_000)
    setup = dcache_tape.pool_setup(library, tmp_path, "storagescale")
    assert (f"hsm create osm osm script -command={tmp_path / 'hsm-tape'} -hsmBase={tmp_path}"
            in setup)
    assert "-drives=3 -mount=2 -perFile=0.5" in setup and "-c:puts=3 -c:gets=3" in setup
    # seed 004's central-flushing triggers: max.minutes=10 max.files=10 max.megabytes=200
    assert ("queue define class osm storagescale:tape -expire=600 -pending=10 "
            "-total=200000000") in setup
    assert "pm set default -stage-allowed=yes" in dcache_tape.poolmanager_conf(("p1", "p2"))


def test_the_hold_bridge_asks_every_pool_with_a_setup_to_flush_the_tape_class(
        tmp_path: Path) -> None:
    for name in ("pool2", "pool1"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "setup").write_text("")
    (tmp_path / "not-a-pool").mkdir()
    assert dcache_tape.flush_class_commands(str(tmp_path)) == (
        "\\s pool1 flush class osm storagescale:tape\n"
        "\\s pool2 flush class osm storagescale:tape\n")
    # seed 004's 10-minute trigger keeps dCache's hold: only short triggers are bridged
    assert TapeLibrary().flush_after_s <= dcache_tape.BRIDGE_MAX_AFTER_S < 600


def test_an_x509_login_needs_the_proxy_and_no_token() -> None:
    from pytest_storagescale.errors import EndpointError

    fields = dict(area="/a/tape", user="u", password="secret", ca_dir="/ca",
                  frontend_port=1, admin_port=2, admin_key="/k", pools="/p", library="/l",
                  srm_url="srm://x", xrootd_url="root://x")
    access = dcache_tape.TapeAccess(**fields, driver_options=(("x509_proxy", "/tmp/x509up"),))
    assert access.x509_proxy == "/tmp/x509up"
    assert access.control(x509=True).login == "x509" and access.control("t").login == "token"
    assert access.control().login == "password" and "secret" not in repr(access.control())
    with pytest.raises(EndpointError, match="needs the session's proxy"):
        access.control("t", x509=True)
    with pytest.raises(EndpointError, match="needs the session's proxy"):
        dcache_tape.TapeAccess(**fields).control(x509=True)


def test_a_jwt_login_needs_a_trusted_issuer(tmp_path: Path) -> None:
    """A server trusting no issuer names the fix; one that trusts the loopback issuer
    mints a WLCG-profile JWT of storage.stage on the tape-backed directory."""
    import jwt

    from pytest_storagescale.errors import EndpointError
    from pytest_storagescale.servers.credentials import ThrowawayCA
    from pytest_storagescale.servers.oidc_issuer import OidcIssuer

    fields = dict(area="/a/tape", user="u", password="p", ca_dir="/ca", frontend_port=1,
                  admin_port=2, admin_key="/k", pools="/p", library="/l", srm_url="srm://x",
                  xrootd_url="root://x")
    with pytest.raises(EndpointError, match="trusts no token issuer"):
        dcache_tape.TapeAccess(**fields).mint_jwt()
    issuer = OidcIssuer(tmp_path / "oidc", ThrowawayCA(tmp_path / "grid")).start()
    try:
        access = dcache_tape.TapeAccess(**fields, oidc=issuer.access)
        claims = jwt.decode(access.mint_jwt(), options={"verify_signature": False})
    finally:
        issuer.stop()
    assert claims["scope"] == "storage.stage:/tape" == dcache_tape.JWT_SCOPE
    assert claims["iss"] == issuer.url and claims["wlcg.ver"] == "1.0"
    assert "oidc" not in repr(access) and str(tmp_path) not in repr(access)


def test_the_embedded_dcache_trusts_its_issuer_with_the_wlcg_profile(tmp_path: Path) -> None:
    """With the tape (the frontend) an issuer by default, none without unless asked;
    the provider line a site writes for its IAM: the issuer's URL, the WLCG profile,
    the scopes' paths under the test area, the audience it mints for."""
    from pytest_storagescale.servers.credentials import ThrowawayCA
    from pytest_storagescale.servers.dcache import EmbeddedDCache
    from pytest_storagescale.servers.oidc_issuer import AUDIENCE, OidcIssuer

    without = EmbeddedDCache(tape=None)
    without._start_oidc_issuer()  # returns before needing a folder: no issuer wanted
    assert without.oidc_issuer is None and without._oidc_lines() == []
    assert without.oidc_access is None
    server = EmbeddedDCache(tape=TapeLibrary(), oidc_issuer=None)
    assert server.oidc_issuer_wanted is None and server.tape is not None
    server.oidc_issuer = OidcIssuer(tmp_path / "oidc", ThrowawayCA(tmp_path / "grid")).start()
    try:
        assert server._oidc_lines() == [
            f"gplazma.oidc.provider!storagescale={server.oidc_issuer.url} -profile=wlcg "
            f"-prefix=/storagescale", f"gplazma.oidc.audience-targets={AUDIENCE}"]
        assert server.oidc_access is not None and server.oidc_access.issuer.startswith(
            "https://localhost:")
    finally:
        server.oidc_issuer.stop()


def test_a_door_is_found_by_its_name_or_its_urls_scheme() -> None:
    """A load step over the dcap door asks the tape for a client of its driver's scheme
    (``gsidcap``), the embedded dCache names the door ``dcap``: both find it (a trial
    run of suites/dcache over dcap failed test_flush[c1-dcap] and [c4-dcap] on it)."""
    from pytest_storagescale.errors import EndpointError

    access = dcache_tape.TapeAccess(
        area="/a/tape", user="u", password="p", ca_dir="/ca", frontend_port=1,
        admin_port=2, admin_key="/k", pools="/p", library="/l", srm_url="srm://x",
        xrootd_url="root://x", doors=(("davs", "davs://h:1/a"), ("root", "root://h:2/a"),
                                      ("dcap", "gsidcap://h:3/a")))
    assert access.door_url("dcap") == access.door_url("gsidcap") == "gsidcap://h:3/a"
    assert access.door_url("root") == "root://h:2/a"
    with pytest.raises(EndpointError, match=r"no gsiftp door \(doors: davs, root, dcap\)"):
        access.door_url("gsiftp")


# -- the tape sections at any --storage-scale (no server) ------------------------------
REPO = Path(__file__).resolve().parent.parent


def _slowest_s(plan) -> float:
    """The slowest operation the section's rules pass: its ``max_s`` rule, else its
    ``hang_timeout`` (an operation longer than that is hung)."""
    limits = [float(rule.text.split("<=")[1]) for rule in plan.rules_for(plan.clients[0])
              if rule.text.replace(" ", "").startswith("max_s<=")]
    return min(limits) if limits else plan.hang_timeout


@pytest.fixture
def tape_plans():
    """The shipped dCache plans that have tape sections, with the suite's operations."""
    from pytest_storagescale.load.operations import OPERATIONS, register_operation
    from pytest_storagescale.metrics import DERIVED, register_metric
    from pytest_storagescale.thresholds import load_thresholds
    from suites.dcache import streaming, tape

    with OPERATIONS.kept(), DERIVED.kept():
        for operation in (*tape.OPERATIONS, *streaming.OPERATIONS):
            register_operation(operation, replace=True)
        for metric, description in {**streaming.METRICS, **tape.METRICS}.items():
            register_metric(metric, description, replace=True)
        yield [load_thresholds(REPO / "thresholds" / "dcache" / name)
               for name in ("10.2.25.toml", "11.2.5.toml")]


@pytest.mark.parametrize("scale", [1.0, 0.5, 0.25, 0.1, 0.05, 0.02, 0.001])
def test_every_tape_step_has_time_for_a_flush_or_stage_at_any_scale(tape_plans, scale) -> None:
    """flush, stage and the bulk stage are count-bounded (at least one operation at
    any scale) and their cap leaves every client's share of the count the slowest
    operation the rules pass: at --storage-scale 0.1 the flush section's 20 s window
    was 2 s and measured no flush (an error), the stage's 5 min cap 30 s (its max_s 40 s)."""
    for plans in tape_plans:
        for name in ("flush", "stage", "stage_bulk"):
            full = plans.section(name)
            plan = full.scaled(scale) if scale < 1 else full
            assert plan.max_operations >= 1, (plans.path, name, "not count-bounded")
            for clients in plan.clients:
                each = -(-plan.max_operations // clients)  # the most one client does
                assert each * _slowest_s(plan) <= plan.duration, (
                    plans.path, name, scale, clients, plan.max_operations, plan.duration)


def test_a_central_flushing_step_writes_long_enough_for_a_flush(tape_plans) -> None:
    """The central-flushing step (time-bounded: its MB/s) writes for at least 5 flush
    delays of the library (15 s by default), whatever the scale: at 0.1 its 20 s
    were 2 s, less than a pool waits before its first flush (1 s old, the next look at
    its queues, a mount), so no flush could run beside the writes."""
    from suites.dcache import tape

    library = TapeLibrary()
    assert library.flush_delay_s == 3.0
    assert dcache_tape.FLUSH_INTERVAL_S == 1
    assert "flush set interval 1\n" in dcache_tape.pool_setup(library, Path("/x"), "s")
    for plans in tape_plans:
        planned = plans.section("tape_write").duration
        assert tape.central_flushing_duration(planned, library) is None  # 20 s: as planned
        small = plans.section("tape_write").scaled(0.1).duration
        assert small == 2.0 and tape.central_flushing_duration(small, library) == 15.0
    slow = TapeLibrary(mount_s=10.0)
    assert tape.central_flushing_duration(20.0, slow) == 5 * (1 + 1 + 10)


# -- on the shared dCache ---------------------------------------------------------------
def _writer(server):
    from pytest_storagescale.drivers.registry import driver_spec

    options = {key: value for key, value in server.driver_options().items()
               if key != "security_protocol"}
    return driver_spec(server.url_for("davs"), driver="http", options=options,
                       writable_root=server.tape_control.area).connect("tape-tests", timeout=60)


@pytest.fixture(scope="module")
def tape_folder(embedded_dcache):
    """A folder of the tape-backed directory for this module, and a WebDAV client."""
    control = embedded_dcache.tape_control
    client = _writer(embedded_dcache)
    folder = f"{control.area}/tests-{int(time.time())}"
    client.mkdir(folder)
    yield folder, client, control
    try:
        client.remove_tree(folder)
    finally:
        client.close()


def _flushed_and_evicted(folder, client, control, name: str, data: bytes) -> tuple[str, str]:
    path = f"{folder}/{name}"
    client.put(path, data)
    control.wait_locality(path, dcache_tape.ON_TAPE, 900)
    pnfsid = control.evict(path)
    return path, pnfsid


def test_a_file_in_the_tape_directory_is_flushed_evicted_and_staged_by_tape_rest(
        tape_folder) -> None:
    folder, client, control = tape_folder
    data = b"written to tape\n" * 1000
    path = f"{folder}/rest.dat"
    held = control.flush_held_s()
    client.put(path, data)
    seconds = control.wait_locality(path, dcache_tape.ON_TAPE, 900)
    pnfsid = str(control.attributes(path)["pnfsId"])
    print(f"flushed in {seconds:.1f} s; the pools' flush timers were held {held:.0f} s more")
    if held > 30:  # dCache's 5-minute hold after a pool's start: the bridge flushed it
        assert seconds < held - 10, (f"flushed after {seconds:.0f} s: the pool's own timer "
                                     f"(held {held:.0f} s), not the hold bridge")
    assert control.on_tape(pnfsid)
    assert (control.folder / "data" / pnfsid).read_bytes() == data
    assert any(r["op"] == "put" and r["pnfsid"] == pnfsid for r in control.records())
    assert control.replicas(pnfsid)  # still on a pool's disk: ONLINE_AND_NEARLINE
    # the WLCG Tape REST API's words: DISK_AND_TAPE, TAPE
    assert control.archiveinfo([path]) == {path: "DISK_AND_TAPE"}
    control.evict(path)
    assert control.replicas(pnfsid) == []  # the replica file left the pool's folder
    assert control.archiveinfo([path]) == {path: "TAPE"}
    began = time.monotonic()
    request = control.stage_tape_rest([path])
    states = {}
    while time.monotonic() - began < 300:
        states = control.poll_tape_rest(request)
        if states.get(path) in ("COMPLETED", "FAILED"):
            break
        time.sleep(0.2)
    assert states == {path: "COMPLETED"}
    print(f"staged through the Tape REST API in {time.monotonic() - began:.1f} s")
    assert control.replicas(pnfsid)  # back on a pool's disk
    assert control.archiveinfo([path]) == {path: "DISK_AND_TAPE"}
    assert control.release_tape_rest(request, [path]) == 200
    assert any(r["op"] == "get" and r["pnfsid"] == pnfsid for r in control.records())
    assert client.read(path, 0, len(data)) == data


def test_the_tape_rest_api_stages_with_a_bearer_token(embedded_dcache, tape_folder) -> None:
    """A token login to the Tape REST API: a macaroon the WebDAV door mints (the
    user's password, activities LIST, READ_METADATA, STAGE) sent as ``Authorization:
    Bearer`` and nothing else stages an evicted file, polls and releases it; a token
    that is no macaroon is refused, and so is one without the STAGE activity. Its
    ``archiveinfo`` differs: 11.2.5 answers it, 10.2.25 refuses it (its archiveinfo
    asks to read the data, which the token may not)."""

    folder, client, control = tape_folder
    path, pnfsid = _flushed_and_evicted(folder, client, control, "token.dat", b"t" * 4000)
    access = embedded_dcache.tape_access
    token = access.mint_token()
    assert token and token not in repr(access.control(token))
    with_token = access.control(token)
    # refused: a made-up token, a real one that may not stage
    status, answer, _ = access.control("not-a-macaroon").rest(
        "POST", "/api/v1/tape/stage", {"files": [{"path": path}]})
    assert status in (401, 403), (status, answer)
    no_stage = access.control(access.mint_token(activities=("LIST", "READ_METADATA")))
    status, answer, _ = no_stage.rest("POST", "/api/v1/tape/stage", {"files": [{"path": path}]})
    print(f"a token without STAGE: {status} {answer}")
    if status in (200, 201):  # accepted: the file must then fail, not stage
        request = str(answer["requestId"])
        _wait(lambda: no_stage.poll_tape_rest(request).get(path) not in ("", "QUEUED",
                                                                        "SUBMITTED"), 120)
        assert no_stage.poll_tape_rest(request)[path] != "COMPLETED"
    else:
        assert status in (401, 403), (status, answer)
    assert control.replicas(pnfsid) == []
    _staged_back(with_token, "a bearer token", control, client, path, pnfsid, b"t" * 4000,
                 archiveinfo_by_login=int(embedded_dcache.version.split(".")[0]) >= 11)
    if int(embedded_dcache.version.split(".")[0]) < 11:
        # 10.2.25's archiveinfo asks to read the file's data: a token that may stage
        # but not download is refused it (11.2.5 answers it; measured 2026-11-29)
        answer = with_token.archiveinfo([path])[path]
        assert "denied access for [READ_DATA]" in answer, answer


def _staged_back(login, how: str, control, client, path: str, pnfsid: str,
                 content: bytes, archiveinfo_by_login: bool = True) -> None:
    """Stage the evicted ``path`` through the Tape REST API with ``login`` (a control
    logged in another way): back on a pool, on disk and tape (``archiveinfo`` asked
    with ``login``, else with the password), read whole."""
    from suites.dcache import tape

    seconds = tape.stage(login, "tape-rest", [path], timeout=300)
    print(f"staged with {how} in {seconds:.1f} s")
    assert control.replicas(pnfsid)
    asking = login if archiveinfo_by_login else control
    assert asking.archiveinfo([path]) == {path: "DISK_AND_TAPE"}
    assert client.read(path, 0, len(content)) == content


def test_the_tape_rest_api_stages_with_the_x509_proxy(embedded_dcache, tape_folder) -> None:
    """An X.509 login to the frontend: the session user's proxy as the TLS client
    certificate, no Authorization header. The frontend's ``/api/v1/user`` says who
    that is (the password's user, authenticated; without a certificate nor a password:
    anonymous), and the Tape REST API stages an evicted file with it, polls, releases."""
    import http.client
    import ssl


    folder, client, control = tape_folder
    access = embedded_dcache.tape_access
    assert access.x509_proxy
    with_x509 = access.control(x509=True)
    assert repr(with_x509).endswith("login=x509)")
    status, by_password, _ = control.rest("GET", "/api/v1/user")
    assert status == 200 and by_password["status"] == "AUTHENTICATED", by_password
    status, by_x509, _ = with_x509.rest("GET", "/api/v1/user")
    print(f"/api/v1/user: password {by_password}; X.509 {by_x509}")
    assert status == 200 and by_x509["status"] == "AUTHENTICATED", by_x509
    assert by_x509["uid"] == by_password["uid"], (by_x509, by_password)
    bare = http.client.HTTPSConnection(
        "localhost", access.frontend_port, timeout=60,
        context=ssl.create_default_context(capath=access.ca_dir))
    try:  # neither a certificate nor a password
        bare.request("GET", "/api/v1/user", headers={"Accept": "application/json"})
        answer = bare.getresponse()
        anonymous = json.loads(answer.read(1 << 20) or b"{}")
    finally:
        bare.close()
    assert answer.status != 200 or anonymous.get("status") == "ANONYMOUS", anonymous
    path, pnfsid = _flushed_and_evicted(folder, client, control, "x509.dat", b"x" * 4000)
    assert control.replicas(pnfsid) == []
    _staged_back(with_x509, "the X.509 proxy", control, client, path, pnfsid, b"x" * 4000)


def test_the_tape_rest_api_stages_with_an_outside_issuers_jwt(embedded_dcache,
                                                             tape_folder) -> None:
    """A WLCG site's login: a WLCG-profile JWT of an outside OIDC issuer (the loopback
    one), ``storage.stage:/tape``. dCache's gPlazma ``oidc`` plugin (``-profile=wlcg``)
    fetched the issuer's discovery document and keys over HTTPS (the issuer served
    them), the frontend's ``/api/v1/user`` names the password's user (the token's
    subject mapped to it), and the Tape REST API stages an evicted file with it, polls
    and releases; the WebDAV door reads the file with the same token."""
    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.servers.oidc_issuer import DISCOVERY, JWKS

    folder, client, control = tape_folder
    access = embedded_dcache.tape_access
    issuer = embedded_dcache.oidc_issuer
    assert access.oidc is not None and issuer is not None
    etc = embedded_dcache.home / "etc"
    assert "auth    optional    oidc\n" in (etc / "gplazma.conf").read_text()
    assert (f"gplazma.oidc.provider!storagescale={issuer.url} -profile=wlcg "
            f"-prefix=/storagescale") in (etc / "dcache.conf").read_text()
    token = access.mint_jwt()
    with_jwt = access.control(token)
    assert token not in repr(with_jwt)
    status, by_password, _ = control.rest("GET", "/api/v1/user")
    assert status == 200 and by_password["status"] == "AUTHENTICATED", by_password
    status, by_jwt, _ = with_jwt.rest("GET", "/api/v1/user")
    print(f"/api/v1/user: password {by_password}; JWT {by_jwt}")
    assert status == 200 and by_jwt["status"] == "AUTHENTICATED", by_jwt
    assert by_jwt["uid"] == by_password["uid"], (by_jwt, by_password)
    # dCache checked the token against the issuer's published key, fetched over HTTPS
    assert {("GET", DISCOVERY, 200), ("GET", JWKS, 200)} <= set(issuer.served), issuer.served
    data = b"j" * 4000
    path, pnfsid = _flushed_and_evicted(folder, client, control, "jwt.dat", data)
    assert control.replicas(pnfsid) == []
    _staged_back(with_jwt, "an outside issuer's JWT", control, client, path, pnfsid, data)
    options = {"ca_dir": embedded_dcache.ca_dir, "token": token}
    reader = driver_spec(embedded_dcache.url_for("davs"), driver="http",
                         options=options).connect("jwt-reader", timeout=60)
    try:
        assert reader.read(path, 0, len(data)) == data
    finally:
        reader.close()


def _quiet_frontend(control, timeout: float = 120) -> None:
    """Until the frontend serves the password's request again, then 11 s without a
    request: 11.2's frontend (``frontend.limits.error.*``, 10.2 has none) answers every
    request of an address 429 for 20 s once it made more than 3 authentication or
    permission errors in 20 s, and forgets its errors after 10 s without a request, so
    a refused token's own answer is the login's (401), not the limiter's."""
    began = time.monotonic()
    while control.rest("GET", "/api/v1/user")[0] != 200:
        assert time.monotonic() - began < timeout, "the frontend blocked us for good"
        time.sleep(2)
    time.sleep(11)


@pytest.mark.parametrize("made, why", [
    ({"lifetime": -120}, "expired"),
    ({"audience": "https://elsewhere.example"}, "another audience"),
    ({"key": "other"}, "signed by a key the issuer never published"),
    ({"subject": "someone-else"}, "a subject mapped to no user"),
])
def test_a_jwt_dcache_must_refuse_logs_no_one_in(embedded_dcache, made, why) -> None:
    """The tokens a site's dCache must refuse: none logs in (401) to ask for a stage,
    where the same issuer's good token stages (the test above: the check can fail)."""
    access = embedded_dcache.tape_access
    control = access.control()
    refused = access.control(access.mint_jwt(**made))
    _quiet_frontend(control)
    try:
        status, answer, _ = refused.rest("POST", "/api/v1/tape/stage",
                                         {"files": [{"path": f"{access.area}/none"}]})
        print(f"a token {why}: stage {status} {answer}")
        assert status == 401, (why, status, answer)
    finally:
        _quiet_frontend(control)


def test_a_jwt_without_storage_stage_stages_nothing(embedded_dcache, tape_folder) -> None:
    """A good token of the wrong scope (``storage.read:/tape``: it may read, not
    stage): the file stays on tape."""
    folder, client, control = tape_folder
    access = embedded_dcache.tape_access
    _quiet_frontend(control)
    path, pnfsid = _flushed_and_evicted(folder, client, control, "jwt-read.dat", b"r" * 4000)
    read_only = access.control(access.mint_jwt(scope="storage.read:/tape"))
    try:
        status, user, _ = read_only.rest("GET", "/api/v1/user")
        assert status == 200 and user["status"] == "AUTHENTICATED", user  # logged in
        status, answer, _ = read_only.rest("POST", "/api/v1/tape/stage",
                                           {"files": [{"path": path}]})
        print(f"a token of storage.read only: stage {status} {answer}")
        if status in (200, 201):  # accepted: the file must then fail, not stage
            request = str(answer["requestId"])
            _wait(lambda: read_only.poll_tape_rest(request).get(path) not in (
                "", "QUEUED", "SUBMITTED", "CREATED"), 120)
            time.sleep(10)  # a stage with the right scope took 1-4 s here: time for one
            states = read_only.tape_rest_files(request)
            print(f"... then {states}")
            control.cancel_tape_rest(request, [path])  # no pin left asking for it
            assert states[path]["state"] != "COMPLETED", states
        else:
            assert status in (401, 403), (status, answer)
    finally:
        _quiet_frontend(control)
    assert control.replicas(pnfsid) == [] and control.locality(path) == "NEARLINE"


def _wait(check, timeout: float) -> None:
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < timeout, f"not within {timeout:.0f} s"
        time.sleep(0.5)


def test_archiveinfo_names_a_missing_file(tape_folder) -> None:
    folder, _, control = tape_folder
    missing = f"{folder}/never-written"
    answer = control.archiveinfo([missing])
    assert list(answer) == [missing]
    assert "No such file" in answer[missing]  # its error, not a locality


def test_srm_bring_online_stages_an_evicted_file(tape_folder) -> None:
    folder, client, control = tape_folder
    data = b"srm" * 3000
    path, pnfsid = _flushed_and_evicted(folder, client, control, "srm.dat", data)
    stager = control.srm_stager()
    try:
        token, done = stager.bring_online(path)
        began = time.monotonic()
        while not done and time.monotonic() - began < 300:
            time.sleep(0.2)
            done = stager.poll(path, token)
        assert done, "srmBringOnline: not online within 300 s"
        stager.release(path, token)
    finally:
        stager.close()
    assert control.replicas(pnfsid)
    assert control.locality(path) == "ONLINE_AND_NEARLINE"
    assert client.read(path, 0, len(data)) == data


def test_xrootd_prepare_is_refused_by_11_2_and_stages_nothing_on_10_2(embedded_dcache,
                                                                    tape_folder) -> None:
    """``xrdfs prepare -s`` of a file on tape only: 11.2's door answers Unsupported;
    10.2.25's answers OK and stages nothing (measured: still on tape only 4 minutes
    later; docs/dcache-upgrade.md: a site stages through the Tape REST API or SRM)."""
    folder, client, control = tape_folder
    path, pnfsid = _flushed_and_evicted(folder, client, control, "root.dat", b"r" * 5000)
    major = int(embedded_dcache.version.split(".")[0])
    if major >= 11:
        with pytest.raises(dcache_tape.StageRefused, match="3021 not supported"):
            control.prepare_xrootd([path])
    else:
        control.prepare_xrootd([path])  # accepted
        time.sleep(20)  # the Tape REST API staged a file in 3-4 s here
    assert control.locality(path) == "NEARLINE"
    assert control.replicas(pnfsid) == []


def test_a_file_outside_the_tape_directory_is_never_flushed(embedded_dcache) -> None:
    from pytest_storagescale.drivers.registry import driver_spec

    control = embedded_dcache.tape_control
    options = {key: value for key, value in embedded_dcache.driver_options().items()
               if key != "security_protocol"}
    client = driver_spec(embedded_dcache.url_for("davs"), driver="http", options=options,
                         writable_root="/storagescale").connect("tape-tests", timeout=60)
    path = f"/storagescale/disk-only-{int(time.time())}.dat"
    try:
        client.put(path, b"disk only")
        # longer than the flush trigger (1 s) and a flush of the same size took
        time.sleep(5)
        attributes = control.attributes(path)
        assert attributes["fileLocality"] == "ONLINE"
        assert not control.on_tape(str(attributes["pnfsId"]))
    finally:
        client.delete(path)
        client.close()


def test_the_tape_log_is_json_lines(embedded_dcache) -> None:
    """Every request of the session's library is one JSON line (the tests above made
    flushes and stages: the log cannot be empty)."""
    log = embedded_dcache.tape_control.folder / "tape.log"
    lines = log.read_text().splitlines()
    assert {json.loads(line)["op"] for line in lines} >= {"put", "get"}
    for line in lines:
        record = json.loads(line)
        assert {"op", "pnfsid", "drive", "mounted", "started", "ended"} <= set(record)
        assert record["ended"] >= record["started"] >= record["asked"]
