"""Bad input and hostile endpoints: each is one paragraph and exit code 4, found once
before any test, under xdist too; and the plan does not depend on unrelated options.

File URLs (``file://``) for the plugin's own paths; real loopback servers for the
hostile ones: one that accepts and never answers, and one that speaks enough XRootD
to reach the version query, then answers it with an error message that is not UTF-8
(the XRootD Python client dies of it with SIGSEGV)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

import pytest

THRESHOLDS = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "0.2s"
warmup = "0s"
hang_timeout = "5s"

[ops.stat]
clients = [CLIENTS]

[[ops.stat.expect]]
clients = "*"
rules = ["hung == 0"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()

def test_area_one(storage_endpoint):
    pass

def test_area_two(storage_endpoint):
    pass
"""


@pytest.fixture
def area(tmp_path):
    folder = tmp_path / "area"
    folder.mkdir()
    return folder


def _suite(pytester, clients: str = "1", folder: str = "thresholds") -> None:
    pytester.makepyfile(test_suite=SUITE)
    plans = pytester.path / folder / "xrootd"
    plans.mkdir(parents=True, exist_ok=True)
    (plans / "any.toml").write_text(THRESHOLDS.replace("CLIENTS", clients))


def _one_paragraph(result, text: str) -> None:
    """Exit code 4, ``text`` said once on stderr, no traceback anywhere."""
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    result.stderr.fnmatch_lines([f"ERROR: {text}"])
    output = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in output and "INTERNALERROR" not in output, output[-3000:]
    assert output.count("ERROR:") == 1, output[-3000:]


# -- 1. the thresholds folder does not move with pytest's rootdir ------------------------------
def test_the_thresholds_folder_does_not_move_with_an_output_path(pytester, area):
    """Without an ini file pytest's rootdir is the common folder of the arguments that
    name existing paths, option values in the space form included: an existing
    ``--storage-results`` file elsewhere moved it, and the plan came from the
    shipped thresholds. The folder is the one pytest was started in; the header
    says which and why."""
    _suite(pytester, clients="2")
    results = pytester.path.parent / f"{pytester.path.name}-out" / "rr.json"
    results.parent.mkdir()
    results.write_text("{}")
    result = pytester.runpytest_subprocess(
        "test_suite.py", f"--storage-endpoint=file://{area}", "--storage-version=1.0",
        "--storage-results", str(results), "-p", "no:cacheprovider", "--collect-only")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    folder = pytester.path / "thresholds"
    result.stdout.fnmatch_lines([
        f"  storage_thresholds: {folder} (thresholds/ of the folder pytest was started in)",
        f"rootdir: {pytester.path.parent}",  # pytest's rootdir did move
        f"storagescale: xrootd 1.0 *: thresholds {folder}/xrootd/any.toml *",
        "*test_stat[[]c2[]]*",  # the plan of this folder, not the shipped one
    ])


# -- 2. every output path is checked before any load ----------------------------------------
@pytest.mark.parametrize("option, target, reason", [
    ("--storage-report", "a_file", "is a file, not a folder"),
    ("--storage-report", "a_file/report", "is a file, not a folder"),
    ("--storage-benchmark-json", "a_folder", "is a directory"),
    ("--storage-benchmark-json", "/proc/storagescale/bench.json", "cannot create a file in /proc"),
])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_load(
        pytester, area, option, target, reason):
    _suite(pytester)
    (pytester.path / "a_file").write_text("not a folder")
    (pytester.path / "a_folder").mkdir()
    result = pytester.runpytest(f"--storage-endpoint=file://{area}", "--storage-version=1.0",
                                f"{option}={target}", "-p", "no:cacheprovider")
    _one_paragraph(result, f"{option} *: * cannot be written there: *{reason}*")
    assert list(area.iterdir()) == []  # no run directory: nothing ran


# -- 3. a thresholds file that is not UTF-8 -----------------------------------------------
def test_a_thresholds_file_with_a_latin1_byte_is_one_paragraph(pytester, area):
    _suite(pytester)
    plan = pytester.path / "thresholds" / "xrootd" / "any.toml"
    plan.write_bytes(b"# r\xe9glages du site\n" + plan.read_bytes())
    result = pytester.runpytest(f"--storage-endpoint=file://{area}", "--storage-version=1.0",
                                "-p", "no:cacheprovider")
    _one_paragraph(result, f"{plan}: line 1, column 4 (byte 3): the byte 0xe9 is not UTF-8*")


# -- 4. endpoint URLs that cannot be read --------------------------------------------------
@pytest.mark.parametrize("endpoint, message", [
    ("root://[::1//area", "--storage-endpoint: 'root://[[]::1//area' cannot be read as a URL "
                          "(Invalid IPv6 URL)*"),
    ("file://relative/area", "--storage-endpoint: 'file://relative/area' is not an absolute "
                             "file URL ('relative' after file:// is read as a host name)*"),
])
def test_an_endpoint_url_that_cannot_be_read_is_one_paragraph(pytester, endpoint, message):
    _suite(pytester)
    (pytester.path / "area").mkdir()  # what file://relative/area silently used to miss
    result = pytester.runpytest(f"--storage-endpoint={endpoint}", "--storage-version=1.0",
                                "-p", "no:cacheprovider")
    _one_paragraph(result, message)


# -- 5. a test area that does not exist: once, exit 4, under xdist too ----------------------
@pytest.mark.parametrize("workers", [None, "2"])
def test_a_missing_test_area_is_one_usage_error_before_any_test(pytester, tmp_path, workers):
    _suite(pytester)
    missing = tmp_path / "typo" / "area"
    xdist = ["-n", workers] if workers else []
    result = pytester.runpytest_subprocess(f"--storage-endpoint=file://{missing}",
                                           "--storage-version=1.0", "-p", "no:cacheprovider",
                                           *xdist)
    _one_paragraph(result, f"--storage-endpoint file://{missing}: the test area {missing} does "
                           f"not exist*")
    assert "passed" not in result.stdout.str() and "failed" not in result.stdout.str()


# -- 6. an endpoint found unusable is asked once ---------------------------------------------
@contextlib.contextmanager
def _server(answer) -> Iterator[tuple[int, list]]:
    """A loopback TCP server calling ``answer(connection)`` for each connection; yields
    its port and the list of connections it accepted."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            accepted.append(connection)
            threading.Thread(target=answer, args=(connection,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], accepted
    finally:
        listener.close()
        for connection in accepted:
            connection.close()


def _silent(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while connection.recv(4096):
            pass


@pytest.mark.parametrize("workers", [None, "2"])
def test_an_endpoint_that_never_answers_is_asked_once(pytester, workers):
    """A door that accepts and never answers: the version is asked once for the
    session, not once per test function (3 here) nor once per xdist worker (the
    controller asks before it starts them), and the session says it once."""
    _suite(pytester)
    pytester.makepyfile(test_more="""
        import pytest

        @pytest.mark.storagescale_op("stat")
        def test_stat_again(storage_load, storage_clients):
            storage_load.run()

        @pytest.mark.storagescale_op("stat")
        def test_stat_once_more(storage_load, storage_clients):
            storage_load.run()
    """)
    with _server(_silent) as (port, accepted):
        result = pytester.runpytest_subprocess(
            f"--storage-endpoint=davs://127.0.0.1:{port}/area", "--storage-hang-timeout=1s",
            "-p", "no:cacheprovider", *(["-n", workers] if workers else []))
        connections = len(accepted)
    _one_paragraph(result, f"--storage-endpoint davs://127.0.0.1:{port}/area: cannot use the "
                           f"storage: *--storage-version VERSION skips the detection.)")
    assert connections == 1, connections


# -- 7. a client library that crashes on the server's answer ---------------------------------
def _recv_exact(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


def _garbling_xrootd(connection: socket.socket) -> None:
    """Handshake, kXR_protocol and kXR_login answered as a server would; every other
    request gets a kXR_error whose message is not UTF-8."""
    with contextlib.suppress(OSError):
        _recv_exact(connection, 20)  # the handshake
        connection.sendall(struct.pack(">2sHIII", b"\0\0", 0, 8, 0x520, 1))
        while True:
            header = _recv_exact(connection, 24)
            stream, request = header[:2], struct.unpack(">H", header[2:4])[0]
            _recv_exact(connection, struct.unpack(">I", header[20:24])[0])
            if request == 3006:  # kXR_protocol
                connection.sendall(stream + struct.pack(">HIII", 0, 8, 0x520, 1))
            elif request == 3007:  # kXR_login
                connection.sendall(stream + struct.pack(">HI", 0, 16) + bytes(16))
            else:  # kXR_error: errnum 3001, then a message that is not UTF-8
                connection.sendall(stream + struct.pack(">HII", 4003, 6, 3001) + b"\xff\xff")


@pytest.mark.parametrize("version", [None, "5.5.3"])
def test_a_client_library_crash_at_first_contact_is_one_paragraph(pytester, version):
    """The XRootD client dies (SIGSEGV) reading the garbled answer to the version query
    (or, with --storage-version, to the test area's stat): the session says so in one
    paragraph naming the endpoint, and ends with exit code 4."""
    _suite(pytester)
    given = [f"--storage-version={version}"] if version else []
    with _server(_garbling_xrootd) as (port, _):
        result = pytester.runpytest_subprocess(
            f"--storage-endpoint=root://127.0.0.1:{port}//data/area", *given,
            "-p", "no:cacheprovider")
    _one_paragraph(result, f"--storage-endpoint root://127.0.0.1:{port}//data/area: cannot use "
                           f"the storage: xrootd first contact root://127.0.0.1:{port}/data/area:"
                           f" the xrootd client library crashed while talking to the server "
                           f"for the first time (killed by SIG*")


# -- 8. a local Dask cluster whose worker dies while starting ---------------------------------
def test_a_local_cluster_whose_worker_dies_while_starting_is_one_paragraph(pytester, area,
                                                                           monkeypatch):
    """Each worker of ``--storage-cluster local:2`` runs a preload that ends it: Dask's
    "Nanny failed to start" is one paragraph naming the option, not an INTERNALERROR."""
    _suite(pytester)
    dying = pytester.path / "die_at_start.py"
    dying.write_text("import os\nos._exit(3)\n")
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PRELOAD", f'["{dying}"]')
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # make test runs with -n 2
    result = pytester.runpytest_subprocess(
        f"--storage-endpoint=file://{area}", "--storage-version=1.0",
        "--storage-cluster=local:2", "-p", "no:cacheprovider")
    _one_paragraph(result, "--storage-cluster local:2: the cluster's hosts did not start: "
                           "RuntimeError: Nanny failed to start*")
