"""The embedded dCache's dcap and GridFTP doors (issue 35, ``extra_doors``): a real
dCache release with a plain dcap door and a GSI ``ftp`` door beside WebDAV, xrootd and
SRM. Files go in and out through the seeds' own clients (``dccp`` from Debian's
``dcap``, ``globus-url-copy``), the shared conformance checks run through both doors
(gfal2's dcap and gridftp plug-ins), and every listening socket of the domain, the new
doors' among them, is on loopback. One dCache start for the module (a minute here)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from dcache_checks import stop_leaves_no_jvm_and_no_postgres
from test_loopback_only import assert_loopback_only, outside_addresses  # noqa: F401

from pytest_storagescale.servers.dcache import (
    AREA,
    EXTRA_DOORS,
    LAN_PORTS,
    WAN_PORTS,
    EmbeddedDCache,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow_server]
REPO = Path(__file__).resolve().parent.parent
#: libdcap's active mode: the client connects to the pool's mover (on loopback), never
#: listens for the pool's call back (a port on every interface while a file moves)
ACTIVE = {"DCACHE_CLIENT_ACTIVE": "1"}


@pytest.fixture(scope="module")
def dcache(dcache_release):
    server = EmbeddedDCache(extra_doors=EXTRA_DOORS)
    server.requested_version = dcache_release
    server.start()
    try:
        yield server
    finally:
        stop_leaves_no_jvm_and_no_postgres(server)


def _grid_environment(server: EmbeddedDCache) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("X509_", "DCACHE_"))}
    return {**environment, "X509_CERT_DIR": server.ca_dir,
            "X509_USER_PROXY": str(server.proxy), **ACTIVE}


def _run(command: list[str], server: EmbeddedDCache) -> subprocess.CompletedProcess:
    tool = shutil.which(command[0])
    if tool is None:
        pytest.fail(f"{command[0]} is not installed: 'make setup' (scripts/bootstrap.sh "
                    f"installs Debian's dcap and globus-gass-copy-progs)")
    return subprocess.run([tool, *command[1:]], capture_output=True, text=True, timeout=300,
                          env=_grid_environment(server))


@pytest.mark.parametrize("door", ["dcap", "gsiftp"])
def test_the_seeds_client_copies_a_file_in_and_out(dcache, tmp_path, door):
    """``dccp`` (active mode) through the dcap door, ``globus-url-copy`` through the
    GridFTP door: 3 MB in, out again, the same bytes; the file's adler32 as dCache
    stored it is the content's."""
    data = secrets.token_bytes(3 * 1024 * 1024 + 7)
    source, back = tmp_path / "in.bin", tmp_path / "out.bin"
    source.write_bytes(data)
    remote = f"{dcache.url_for(door)}/{door}-{secrets.token_hex(4)}.bin"
    if door == "dcap":
        copy_in, copy_out = (["dccp", "-A", str(source), remote],
                             ["dccp", "-A", remote, str(back)])
    else:
        copy_in, copy_out = (["globus-url-copy", f"file://{source}", remote],
                             ["globus-url-copy", remote, f"file://{back}"])
    for command in (copy_in, copy_out):
        done = _run(command, dcache)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    assert back.read_bytes() == data
    from pytest_storagescale.drivers.registry import driver_spec

    client = driver_spec(dcache.url_for("root"), driver="xrootd").connect("check", timeout=30)
    try:
        name = remote.rsplit("/", 1)[1]
        assert client.checksum(f"{AREA}/{name}", "adler32") == f"{zlib.adler32(data):08x}"
    finally:
        client.close()


def test_the_new_doors_listen_on_loopback_only(dcache, tmp_path, outside_addresses):  # noqa: F811
    """After a file went through a pool from each new door, every listening socket of
    the domain's processes (the dcap and ftp doors', the movers') is on loopback and
    none takes a connection from outside."""
    source = tmp_path / "f.bin"
    source.write_bytes(b"loopback only\n" * 100)
    for command in (["dccp", "-A", str(source), f"{dcache.url_for('dcap')}/lo-dcap.bin"],
                    ["globus-url-copy", f"file://{source}",
                     f"{dcache.url_for('gsiftp')}/lo-ftp.bin"]):
        done = _run(command, dcache)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    from test_loopback_only import listening

    pids = dcache.server_pids()
    movers = range(dcache.ports["wan"], dcache.ports["wan"] + WAN_PORTS + LAN_PORTS)
    mover_ports = {port for _, port in listening(pids) if port in movers}
    assert_loopback_only(pids, {dcache.ports["dcap"], dcache.ports["ftp"], *mover_ports},
                         outside_addresses)


def test_the_conformance_checks_pass_through_the_gridftp_door(dcache, pytester):
    """suites/conformance with the GridFTP door as the endpoint (gfal2's gridftp
    plug-in, the session's proxy mapped to the test user): every check passes but
    persist-on-close (an XRootD open flag: skipped). Measured on 11.2.5: 16 passed, 1
    skipped. (Through the dcap door the run cannot start: the anonymous dcap user may
    not write into a directory it made, so the run directory's owner file is refused;
    docs/servers.md.)"""
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "conformance"), f"--storage-endpoint={dcache.url_for('gsiftp')}",
        f"--storage-driver-option=ca_dir={dcache.ca_dir}",
        f"--storage-driver-option=x509_proxy={dcache.proxy}",
        f"--storage-version={dcache.version}", "-p", "no:cacheprovider", "-rs", timeout=900)
    result.assert_outcomes(passed=16, skipped=1)
    result.stdout.fnmatch_lines(["*not an XRootD door: persist-on-close*"])
