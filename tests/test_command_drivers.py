"""The seeds' command-line clients as drivers (``drivers/commands.py``, issue 35): one
bounded process per load request (``drivers/bounded.py``). Server-free: the tools here
are fake executables (shell scripts named ``dccp`` and ``globus-url-copy`` first in
``PATH``), so what is tested is this project's process handling (the deadline that
kills a tool's whole process group, the output bound, a tool dying with its client
process, the environment it gets, what a load client refuses, how a failure reads),
not the storage; tests/test_command_drivers_dcache.py runs the real tools against the
embedded dCache. The ``DOOR+CLIENT`` load doors' usage errors are pinned too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pytest_storagescale.drivers import bounded
from pytest_storagescale.drivers.bounded import CommandKilled, run_bounded
from pytest_storagescale.drivers.commands import (
    DccpDriver,
    GlobusUrlCopyDriver,
    parse_listing,
)
from pytest_storagescale.drivers.url import EndpointURL
from pytest_storagescale.errors import (
    BadAnswer,
    StorageError,
    StorageNotFound,
    StorageScaleUsageError,
    StorageTimeout,
    StorageUnreachable,
)

DCAP = "gsidcap://door.example:22125/pnfs/area"
GRIDFTP = "gsiftp://door.example:2811/pnfs/area"


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """A folder first in ``PATH``; ``make(name, body)`` writes a fake tool there."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")

    def make(name: str, body: str) -> Path:
        tool = folder / name
        tool.write_text("#!/bin/sh\n" + textwrap.dedent(body))
        tool.chmod(0o755)
        return tool
    return make


def _client(cls, url: str, *, timeout: float = 30.0, options=None, load: bool = True):
    """A client of ``cls``; ``load``: a load client (the engine gives it its stop)."""
    driver = cls(EndpointURL.parse(url), client_id="c0", timeout=timeout,
                 writable_root="/pnfs/area/run", options=options or {})
    if load:
        driver.halted = threading.Event()
    return driver


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether process ``pid`` ended (or is a zombie nobody reaped yet) within
    ``within`` seconds."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _pids(path: Path, count: int, within: float = 20.0) -> list[int]:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if path.exists() and len(lines := path.read_text().split()) >= count:
            return [int(pid) for pid in lines[:count]]
        time.sleep(0.05)
    raise AssertionError(f"the fake tool did not write {count} pids to {path}")


# -- the deadline, the process group, the parent's death ---------------------------------

def test_a_tool_past_its_deadline_is_killed_with_what_it_forked(tools, tmp_path):
    """A copy out whose tool (and a process it forked) would run 300 s ends at the
    client's timeout as a timeout; both processes are gone, not left running."""
    pids = tmp_path / "pids"
    tools("dccp", f"""
        sleep 300 &
        echo $! >> {pids}
        echo $$ >> {pids}
        echo 'opening the file' >&2
        sleep 300
        """)
    client = _client(DccpDriver, DCAP, timeout=2.0)
    began = time.monotonic()
    try:
        with pytest.raises(StorageTimeout) as caught:
            client.get("/pnfs/area/run/file", None)
    finally:
        client.close()
    took = time.monotonic() - began
    assert 1.9 <= took < 30, took
    error = caught.value
    assert error.error_class == "timeout" and error.operation == "get"
    assert "still running at its deadline (2 s): its process group killed" in error.message
    assert "opening the file" in error.message  # what it said before, quoted
    assert error.native_status == "dccp killed: deadline"
    forked, tool = _pids(pids, 2)
    assert _gone(tool) and _gone(forked), "the tool or what it forked still runs"


def test_a_tool_that_ended_leaves_nothing_it_forked(tools, tmp_path):
    """A tool that left a process behind when it ended: the process is killed with the
    tool's group, and the request is what the tool answered."""
    pids = tmp_path / "pids"
    tools("dccp", f"""
        sleep 300 &
        echo $! >> {pids}
        printf 'x%.0s' $(seq 1 10) > "$3"
        """)
    client = _client(DccpDriver, DCAP)
    try:
        assert client.get("/pnfs/area/run/file", str(tmp_path / "copy")) == 10
    finally:
        client.close()
    assert _gone(_pids(pids, 1)[0])


def test_a_tool_dies_with_its_client_process(tmp_path):
    """A load client process ended at once (SIGKILL here: what a client process's
    os._exit after Ctrl-C or SIGTERM amounts to for its children) takes its tools with
    it (setpriv --pdeathsig): none is left running to its deadline."""
    pids = tmp_path / "pids"
    tool = tmp_path / "tool"
    tool.write_text(f"#!/bin/sh\necho $$ >> {pids}\nsleep 300\n")
    tool.chmod(0o755)
    client = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os
        from pytest_storagescale.drivers.bounded import run_bounded
        run_bounded([{str(tool)!r}], environment={{"PATH": os.environ["PATH"]}},
                    deadline_s=600)
        """)])
    try:
        (pid,) = _pids(pids, 1)
        client.send_signal(signal.SIGKILL)
        client.wait(30)
        assert _gone(pid), "the tool outlived its client process"
    finally:
        client.kill()
        client.wait(30)


# -- the output bound -------------------------------------------------------------------

@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_tool_that_writes_without_end_is_killed_at_its_bound(tools, stream):
    """A listing (or a message) that never ends: the tool is killed once its stream
    passed its bound, the request is a bad answer, and no more than the bound was
    kept."""
    redirect = "" if stream == "stdout" else " >&2"
    tools("globus-url-copy", f"yes 'an entry of a listing without end'{redirect}\n")
    client = _client(GlobusUrlCopyDriver, GRIDFTP)
    limit = bounded.STDOUT_LIMIT if stream == "stdout" else bounded.STDERR_LIMIT
    try:
        with pytest.raises(BadAnswer) as caught:
            client.ls("/pnfs/area/run/dir")
    finally:
        client.close()
    assert caught.value.error_class == "bad_answer"
    assert f"wrote more than {limit:,} bytes to its {stream}" in caught.value.message
    assert len(caught.value.message) < 2000  # the error quotes a tail, not the stream


def test_run_bounded_keeps_at_most_the_bound():
    with pytest.raises(CommandKilled) as caught:
        run_bounded(["yes"], environment={"PATH": os.environ["PATH"]}, deadline_s=60,
                    stdout_limit=1000)
    assert caught.value.reason == "output" and len(caught.value.stdout) == 1000


# -- what a load client makes, and how -----------------------------------------------

def test_the_tools_command_lines_and_what_they_moved(tools, tmp_path):
    """put: the payload staged once in the client's private folder, ``dccp -A local
    URL``; get into memory: a private file, its size, removed after; get to disk:
    ``dccp -A URL local``. globus-url-copy: file:// URLs both ways."""
    calls = tmp_path / "calls"
    body = f"""
        echo "$@" >> {calls}
        for last; do :; done
        case "$last" in
          file://*) head -c 7 /dev/zero > "${{last#file://}}" ;;
          /*) head -c 7 /dev/zero > "$last" ;;
        esac
        """
    tools("dccp", body)
    tools("globus-url-copy", body)
    data = b"payload" * 3
    dccp = _client(DccpDriver, DCAP)
    guc = _client(GlobusUrlCopyDriver, GRIDFTP)
    try:
        assert dccp.put("/pnfs/area/run/a", data) == len(data)
        assert dccp.put("/pnfs/area/run/b", data) == len(data)
        assert dccp.get("/pnfs/area/run/a", None) == 7
        assert dccp.get("/pnfs/area/run/a", str(tmp_path / "out")) == 7
        assert guc.put("/pnfs/area/run/c", data) == len(data)
        assert guc.get("/pnfs/area/run/c", None) == 7
        folder = dccp._folder
        staged = sorted(os.listdir(folder))
        assert staged == ["put-0"], staged  # one staged file; the copy into memory gone
        assert (Path(folder) / "put-0").read_bytes() == data
        assert os.stat(folder).st_mode & 0o077 == 0
    finally:
        dccp.close()
        guc.close()
    assert not os.path.exists(folder)  # removed with the client
    lines = calls.read_text().splitlines()
    assert lines[0] == f"-A {folder}/put-0 gsidcap://door.example:22125/pnfs/area/run/a"
    assert lines[2].startswith("-A gsidcap://door.example:22125/pnfs/area/run/a /")
    assert lines[3] == f"-A gsidcap://door.example:22125/pnfs/area/run/a {tmp_path}/out"
    assert lines[4].startswith("file:///") and lines[4].endswith(
        " gsiftp://door.example:2811/pnfs/area/run/c")
    assert lines[5].startswith("gsiftp://door.example:2811/pnfs/area/run/c file:///")


def test_a_load_client_makes_only_what_its_tool_makes(tools, tmp_path):
    """A stat, mkdir, delete, checksum or read of a load client is refused before
    anything runs (its step would measure gfal2, not the tool); dccp lists nothing."""
    calls = tmp_path / "calls"
    tools("dccp", f"echo \"$@\" >> {calls}\n")
    client = _client(DccpDriver, DCAP)
    try:
        for request in (lambda: client.stat("/pnfs/area/run"),
                        lambda: client.ls("/pnfs/area/run"),
                        lambda: client.mkdir("/pnfs/area/run/d"),
                        lambda: client.delete("/pnfs/area/run/f"),
                        lambda: client.checksum("/pnfs/area/run/f"),
                        lambda: client.read("/pnfs/area/run/f", 0, 10)):
            with pytest.raises(StorageError) as caught:
                request()
            assert caught.value.error_class == "unsupported"
            assert "dccp makes no" in caught.value.message
            assert "(put, get)" in caught.value.message
    finally:
        client.close()
    assert not calls.exists()
    assert client._gfal2 is None  # no gfal2 client was made for it either


@pytest.mark.parametrize("said, expected, error_class", [
    ("Can't open source file : No such file or directory", StorageNotFound, "not_found"),
    ("Failed to create a control line\nSystem error: Connection refused",
     StorageUnreachable, "unreachable"),
    ("something else went wrong", StorageError, "exit_3"),
])
def test_a_tools_failure_reads_as_the_storage_error_it_says(tools, tmp_path, said,
                                                            expected, error_class):
    (tmp_path / "said").write_text(said + "\n")
    tools("dccp", f"cat {tmp_path / 'said'} >&2\nexit 3\n")
    client = _client(DccpDriver, DCAP)
    try:
        with pytest.raises(expected) as caught:
            client.get("/pnfs/area/run/missing", None)
    finally:
        client.close()
    error = caught.value
    assert type(error) is expected and error.error_class == error_class
    assert error.native_status == "dccp exit status 3"
    assert said.split("\n")[-1] in error.message
    assert error.driver == "dccp" and error.path == "/pnfs/area/run/missing"


def test_the_tools_environment_is_given_whole(tools, tmp_path, monkeypatch):
    """The tool sees the CA folder and the proxy by path, LANG=C and the loopback-only
    library preloaded; never a bearer token or another variable of this process."""
    seen = tmp_path / "environment"
    tools("dccp", f"env > {seen}\nhead -c 1 /dev/zero > \"$3\"\n")
    monkeypatch.setenv("BEARER_TOKEN", "eyJ-a-token-never-passed-on")
    monkeypatch.setenv("SOME_SETTING", "kept-here")
    monkeypatch.setenv("GLOBUS_TCP_PORT_RANGE", "20000,20100")
    client = _client(DccpDriver, DCAP, options={"ca_dir": "/some/ca",
                                                 "x509_proxy": "/some/proxy"})
    try:
        client.get("/pnfs/area/run/f", None)
    finally:
        client.close()
    environment = dict(line.split("=", 1) for line in seen.read_text().splitlines()
                       if "=" in line)
    assert "BEARER_TOKEN" not in environment and "SOME_SETTING" not in environment
    assert "eyJ-a-token" not in seen.read_text()
    assert environment["X509_CERT_DIR"] == "/some/ca"
    assert environment["X509_USER_PROXY"] == "/some/proxy"
    assert environment["GLOBUS_TCP_PORT_RANGE"] == "20000,20100"
    assert environment["LANG"] == "C"
    from pytest_storagescale.servers.loopback import library_path

    assert environment["LD_PRELOAD"].split()[0] == str(library_path())


def test_a_globus_url_copy_listing_is_read():
    # as globus-url-copy 10.12 writes it against dCache 10.2.25 and 11.2.5: a space after
    # a file's name, a slash after a directory's (measured: 'a.dat ' was taken for the
    # name before, test_seed_clients.py's test_ls failed)
    answer = (b"gsiftp://door:2811/pnfs/area/run/ls-dir/\n"
              b"    entry-00001 \n    entry-00000 \n    sub/\n    c d.dat \n"
              b"    ends in a space  \n    ./\n    ../\n\n")
    assert parse_listing(answer, "globus-url-copy", "gsiftp://door:2811", "/d") == [
        "c d.dat", "ends in a space ", "entry-00000", "entry-00001", "sub"]
    with pytest.raises(BadAnswer, match="not UTF-8"):
        parse_listing(b"gsiftp://door/d/\n    caf\xe9\n", "g", "e", "/d")
    with pytest.raises(BadAnswer, match="not a listing"):
        parse_listing(b"error: something\n", "g", "e", "/d")


# -- the URL and the options ------------------------------------------------------------

def test_a_url_with_a_password_is_refused_without_showing_it(tools):
    from pytest_storagescale.drivers.registry import driver_spec

    tools("globus-url-copy", "exit 0\n")
    with pytest.raises(StorageScaleUsageError) as caught:
        driver_spec("gsiftp://user:s3cret-pw@door:2811/pnfs/area", driver="globus-url-copy")
    assert "s3cret-pw" not in str(caught.value)
    assert "every local user can read" in str(caught.value)


def test_a_missing_tool_is_one_usage_error_naming_the_package(monkeypatch, tmp_path):
    from pytest_storagescale.drivers.registry import driver_spec

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StorageScaleUsageError) as caught:
        driver_spec(DCAP, driver="dccp")
    assert str(caught.value) == (
        "the dccp driver runs dccp for each request, and dccp is not installed. Install "
        "it: apt-get install dcap dcap-tunnel-gsi util-linux (make setup, "
        "scripts/bootstrap.sh, installs them).")


# -- DOOR+CLIENT load doors -------------------------------------------------------------

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()
"""


@pytest.mark.parametrize("doors, said", [
    ("root+dccp", "ERROR: --storage-load-doors root+dccp: the dccp driver speaks dcap://, "
                  "gsidcap://, not the root door's root://. Drivers that speak it: "
                  "xrootd, gfal2 (write root+DRIVER)."),
    ("root,root+nosuch", "ERROR: --storage-load-doors root+nosuch: no client 'nosuch': "
                         "unknown driver 'nosuch'. Known drivers: *"),
    ("ftp+dccp", "ERROR: --storage-load-doors: unknown door 'ftp+dccp'. *"),
])
def test_a_door_through_a_client_that_cannot_serve_it_is_one_usage_error(
        pytester, doors, said):
    """Before any server starts or any step runs: exit 4, one paragraph, no traceback."""
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "--storage-embedded=xrootd", f"--storage-load-doors={doors}",
        "--storage-results=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.lines
    result.stderr.fnmatch_lines([said])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert not (pytester.path / "r.json").exists()


def test_door_client_names_parse():
    from pytest_storagescale.config import parse_load_doors
    from pytest_storagescale.session.endpoint import split_client

    assert parse_load_doors("dcap,dcap+dccp,gsiftp+globus-url-copy") == (
        "dcap", "dcap+dccp", "gsiftp+globus-url-copy")
    assert split_client("gsiftp+globus-url-copy") == ("gsiftp", "globus-url-copy")
    assert split_client("dcap") == ("dcap", None)
    for bad in ("dcap+", "+dccp", "dcap+dccp+x", "dcap+DCCP"):
        with pytest.raises(StorageScaleUsageError, match="DOOR\\+CLIENT"):
            parse_load_doors(bad)


def test_a_steps_client_cpu_counts_its_tools():
    """The client CPU of a step (the client-CPU check, the results' client_cpu) counts
    the tools its clients ran: a tool's CPU is its own process's, which the Python
    client waits for (before, a step through dccp measured ~1 % of a core)."""
    from pytest_storagescale.load.stats import CpuMeter

    meter = CpuMeter(1)
    meter.start()
    done = run_bounded(["sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"],
                       environment={"PATH": os.environ["PATH"]}, deadline_s=120)
    meter.stop()
    assert done.returncode == 0
    own = os.times()
    assert own.children_user + own.children_system >= 0.2  # the tool did burn CPU
    assert meter.usage is not None and meter.usage.cpu_s >= 0.2, meter.usage


# -- the tools themselves, for the checks through them (suites/dcache/test_seed_clients.py)

def test_a_check_runs_the_tool_with_its_options_on_any_connection(tools, tmp_path):
    """copy_in / copy_out / copy_within / listing run the tool on a service connection
    too (a check asks the tool, not gfal2), options before the URLs; a copy in is
    guarded (outside the run directory: refused before anything runs) and recorded as
    made, refused or not; ``check=False`` returns a non-zero exit with what the tool
    said, else it is the storage error of its words."""
    from pytest_storagescale import CreatedPaths, UnsafePathError

    calls = tmp_path / "calls"
    tools("dccp", f"""
        echo "$@" >> {calls}
        case "$*" in *exists*) echo 'Can'"'"'t open destination file : "File is readOnly"' >&2
                              exit 255 ;; esac
        """)
    tools("globus-url-copy", f"""
        echo "$@" >> {calls}
        case "$*" in *-list*) printf 'gsiftp://door/d/\\n    a.dat \\n    sub/\\n' ;; esac
        """)
    local = tmp_path / "local"
    local.write_bytes(b"x" * 5)
    dccp = _client(DccpDriver, DCAP, load=False)
    guc = _client(GlobusUrlCopyDriver, GRIDFTP, load=False)
    dccp.created = CreatedPaths("/pnfs/area/run")
    try:
        dccp.copy_in(str(local), "/pnfs/area/run/d/new", "-d", "2")
        refused = dccp.copy_in(str(local), "/pnfs/area/run/exists", check=False)
        assert refused.returncode == 255 and b"File is readOnly" in refused.stderr
        with pytest.raises(StorageError, match="File is readOnly") as caught:
            dccp.copy_in(str(local), "/pnfs/area/run/exists")
        assert caught.value.operation == "put"
        with pytest.raises(UnsafePathError):
            dccp.copy_in(str(local), "/pnfs/area/elsewhere")
        dccp.copy_out("/pnfs/area/run/d/new", str(tmp_path / "out"), "-c")
        guc.copy_within("/pnfs/area/run/a", "/pnfs/area/run/b", "-verify-checksum")
        with pytest.raises(UnsafePathError):
            guc.copy_within("/pnfs/area/run/a", "/pnfs/other/b")
        assert guc.listing("/pnfs/area/run") == ["a.dat", "sub"]
    finally:
        dccp.close()
        guc.close()
    assert dccp.created.kind("/pnfs/area/run/d/new") == "file"
    assert dccp.created.kind("/pnfs/area/run/d") == "dir"
    assert dccp.created.kind("/pnfs/area/run/exists") == "file"
    lines = calls.read_text().splitlines()
    assert lines == [
        f"-d 2 -A {local} gsidcap://door.example:22125/pnfs/area/run/d/new",
        f"-A {local} gsidcap://door.example:22125/pnfs/area/run/exists",
        f"-A {local} gsidcap://door.example:22125/pnfs/area/run/exists",
        f"-c -A gsidcap://door.example:22125/pnfs/area/run/d/new {tmp_path}/out",
        "-verify-checksum gsiftp://door.example:2811/pnfs/area/run/a "
        "gsiftp://door.example:2811/pnfs/area/run/b",
        "-list gsiftp://door.example:2811/pnfs/area/run/",
    ]  # the refused paths ran nothing


def test_what_the_tools_say_of_checksums_is_read():
    """dccp -d 2's "File checksum is: N" (decimal, the adler32 it sends with its close)
    as 8 hex digits; globus-url-copy -dbg's CKSM commands paired with the door's
    replies, the debug lines between them skipped (as 10.12 writes them)."""
    from pytest_storagescale.drivers.bounded import Finished

    said = Finished(0, b"", b"Enabling checksumming on write.\nFile checksum is: 1579600897\n"
                            b"Sending CLOSE for fd:7 ID:2.\n", 0.1)
    assert DccpDriver.sent_checksum(said) == "5e26cc01"
    assert DccpDriver.sent_checksum(Finished(0, b"", b"300000 bytes in 0 seconds\n", 0.1)) \
        is None
    assert DccpDriver.sent_checksum(Finished(0, b"", b"File checksum is: 1\n", 0.1)) \
        == "00000001"
    debug = (b"debug: sending command to gsiftp://h:1/s/a:\n"
             b"CKSM adler32 0 -1 /storagescale/run/source.dat\n\n"
             b"debug: response from gsiftp://h:1/s/a:\n"
             b"213 5e26cc01\n\n"
             b"debug: sending command to gsiftp://h:1/s/b:\n"
             b"CKSM MD5 0 -1 /storagescale/run/c d.dat\n"
             b"debug: response from gsiftp://h:1/s/b:\n"
             b"500-Operation failed\n"
             b"500 Operation failed due to internal error: null\n")
    assert GlobusUrlCopyDriver.door_checksums(Finished(1, b"", debug, 0.1)) == [
        ("adler32", "/storagescale/run/source.dat", "213 5e26cc01"),
        ("MD5", "/storagescale/run/c d.dat", "500 Operation failed due to internal error: null"),
    ]
    assert GlobusUrlCopyDriver.door_checksums(Finished(0, b"", b"226 Transfer complete.\n",
                                                       0.1)) == []


def test_the_seed_clients_checks_say_why_a_tool_lacks_one():
    """suites/dcache/seed_clients.py: the seed tool of a load door; every check neither
    tool makes has a reason for each; a check one tool makes has none for it."""
    from suites.dcache import seed_clients

    assert seed_clients.seed_tool("dcap+dccp") == "dccp"
    assert seed_clients.seed_tool("gsiftp+globus-url-copy") == "globus-url-copy"
    for door in ("dcap", "gsiftp", "root+gfal2", "davs", None, "dcap+"):
        assert seed_clients.seed_tool(door) is None, door
    assert seed_clients.seed_doors(["davs", "dcap+dccp", "dcap", "gsiftp+globus-url-copy"]) \
        == ["dcap+dccp", "gsiftp+globus-url-copy"]
    for check in seed_clients.NEITHER:
        for tool in seed_clients.SEED_TOOLS:
            assert seed_clients.not_through(check, tool), (check, tool)
    assert seed_clients.not_through("ls", "dccp")
    for check in ("ls", "partial_read", "md5_of_a_local_copy", "overwrite", "checksum"):
        assert seed_clients.not_through(check, "globus-url-copy") is None, check
    assert seed_clients.not_through("overwrite", "dccp") is None


def test_the_seed_clients_checks_run_on_their_load_doors_only(pytester):
    """suites/dcache deselects test_seed_clients.py's checks on a load door that is not
    a seed tool's, and says so in its header when no load door is; on dcap+dccp and
    gsiftp+globus-url-copy each check is collected once per door. Collection only: no
    server starts, none is contacted (the version is given)."""
    from pathlib import Path as _Path

    suite = _Path(__file__).resolve().parent.parent / "suites" / "dcache"
    common = ["--co", "-p", "no:cacheprovider", "--storage-version=11.2.5",
              "--storage-endpoint=davs://door.example:2880/pnfs/area",
              "--storage-door=dcap=gsidcap://door.example:22125/pnfs/area",
              "--storage-door=gsiftp=gsiftp://door.example:2811/pnfs/area",
              str(suite / "test_seed_clients.py")]
    result = pytester.runpytest_subprocess(*common, "--storage-load-doors=davs,dcap")
    result.stdout.fnmatch_lines([
        "storagescale: suites/dcache's checks through the seeds' own clients "
        "(test_seed_clients.py) deselected: no load door runs dccp or globus-url-copy*",
        "*no tests collected (36 deselected)*"])
    result = pytester.runpytest_subprocess(
        *common, "--storage-load-doors=dcap,dcap+dccp,gsiftp+globus-url-copy")
    result.stdout.fnmatch_lines(["*36/54 tests collected (18 deselected)*"])
    result.stdout.no_fnmatch_line("*test_seed_clients.py) deselected*")
    assert "test_overwrite[dcap+dccp]" in result.stdout.str()
    assert "test_overwrite[gsiftp+globus-url-copy]" in result.stdout.str()
    assert "[dcap]" not in result.stdout.str()
