"""The embedded dCache (``--storage-embedded dcache``): a real dCache release from the
distribution cache (a dCache takes a minute to come up here): the session's shared one
(``embedded_dcache``, conftest.py, also test_dcache_doors.py's) for every check of its
doors, its version and its redirects (its stop is checked at the session's end), and one
in a process that dies without stopping it, for the orphan reaper. The newest release of the cache unless ``STORAGESCALE_DCACHE_VERSION``
names another (a version of the cache or the path of a tarball: the ``dcache_release``
fixture).

Without any distribution the checks that need one fail naming what is missing: the
project's set-up (``scripts/bootstrap.sh``, ``scripts/dcache-dist.sh``) fills the
cache wherever the shared dCache folder exists."""

from __future__ import annotations

import base64
import http.client
import io
import json
import ssl
import subprocess
import sys
import tarfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from dcache_checks import gone

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.servers import dcache as dcache_module
from pytest_storagescale.servers.dcache import AREA, USER, EmbeddedDCache

REPO = Path(__file__).resolve().parent.parent

LEAVE_A_DCACHE = """
import os, sys
from pytest_storagescale.servers.dcache import EmbeddedDCache

# what the reaper stops is the JVMs and PostgreSQL: no tape services nor GridFTP door,
# which only lengthen the start
server = EmbeddedDCache(tape=None, extra_doors=())
server.requested_version = sys.argv[1] or None
server.start()
print(server.process.pid, server.database.process.pid, server.zookeeper.pid, server.directory,
      flush=True)
os._exit(0)  # dies without stopping it, as a killed pytest would
"""


GSI_STAT = """
import json, sys
from pytest_storagescale.drivers.registry import driver_spec
url, path, options = json.loads(sys.stdin.read())
print(driver_spec(url, driver="xrootd", options=options).connect("gsi", timeout=30).stat(path).size)
"""


def _expected_version(release: str) -> str:
    match = dcache_module.TARBALL.fullmatch(Path(release).name)
    return match.group(1) if match else release


#: the address a wrong password is sent from: dCache 11.2's limiter blocks an address
#: after more than 3 bad logins in 20 s (test_dcache_doors.py provokes it from 127.0.0.1
#: on the same dCache), so this file's one bad login is neither blocked by it nor counted
#: towards it
WRONG_PASSWORD_SOURCE = "127.0.0.2"


def _webdav(server: EmbeddedDCache, method: str, path: str, *, upload: int = 0,
            password: str | None = None) -> http.client.HTTPResponse:
    """One request to the WebDAV door with user/password, redirects not followed. An
    ``upload`` is announced (its length, ``Expect: 100-continue``) and its answer read
    before any body is sent: the door redirects a PUT only to a client that waits so
    (one that sends the body at once gets its data taken by the door, 201). A wrong
    ``password`` is sent from ``WRONG_PASSWORD_SOURCE``."""
    context = ssl.create_default_context(capath=server.ca_dir)
    source = (WRONG_PASSWORD_SOURCE, 0) if password else None
    connection = http.client.HTTPSConnection("localhost", server.ports["webdav"],
                                             context=context, timeout=30,
                                             source_address=source)
    secret = base64.b64encode(f"{USER}:{password or server.password}".encode()).decode()
    connection.putrequest(method, path)
    connection.putheader("Authorization", f"Basic {secret}")
    if upload:
        connection.putheader("Content-Length", str(upload))
        connection.putheader("Expect", "100-continue")
    connection.endheaders()
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_the_embedded_dcache_serves_each_door(embedded_dcache):
    """The session's dCache (the unix login, plus the GSI xrootd door, so that every
    login is checked on it): each door answers each login, the version is the server's
    own report, the WebDAV door redirects to a pool. Its stop (no JVM, no PostgreSQL,
    no directory left) is checked when the session ends (``embedded_dcache``)."""
    # first: the xrootd client takes the GSI login of a later client for the whole
    # process (the anonymous door offers none)
    _the_version_is_the_servers_own_report(embedded_dcache)
    _each_door_answers_each_login(embedded_dcache)
    _the_webdav_door_redirects_put_and_get_to_a_pool(embedded_dcache)


def _each_door_answers_each_login(dcache: EmbeddedDCache) -> None:
    """WebDAV with user/password and with an X.509 proxy, a wrong password refused;
    xrootd anonymous (writes only inside the area) and GSI; SRM with the proxy."""
    proxy, ca_dir = str(dcache.proxy), dcache.ca_dir
    text = b"written with a password\n"
    davs = driver_spec(dcache.url_for("davs"), driver="http", options={"ca_dir": ca_dir},
                       writable_root=AREA).connect("password", timeout=30)
    davs.put(f"{AREA}/by-password", text)
    assert davs.read(f"{AREA}/by-password", 0, len(text)) == text

    x509_url = dcache.url_for("davs").replace(f"{USER}:{dcache.password}@", "")
    x509 = driver_spec(x509_url, driver="http", options={"ca_dir": ca_dir, "x509_proxy": proxy},
                       writable_root=AREA).connect("proxy", timeout=30)
    assert x509.stat(f"{AREA}/by-password").size == len(text)
    assert _webdav(dcache, "PROPFIND", AREA, password="wrong").status == 401

    anonymous = driver_spec(dcache.url_for("root"), driver="xrootd",
                            writable_root=AREA).connect("anonymous", timeout=30)
    anonymous.put(f"{AREA}/by-xrootd", b"anonymous\n")
    assert {"by-password", "by-xrootd"} <= {name.rsplit("/", 1)[-1]
                                            for name in anonymous.ls(AREA)}
    from XRootD import client as xrootd_client  # the driver's guard would refuse first
    from XRootD.client.flags import OpenFlags

    outside = xrootd_client.File()
    status, _ = outside.open(f"root://localhost:{dcache.ports['xrootd']}//outside-the-area",
                             OpenFlags.NEW, timeout=30)
    assert not status.ok and "permission denied" in status.message.lower(), status.message

    # from a process of its own: the XRootD client's gsi plug-in takes its CA folder
    # and proxy once per process, so a gsi login here would pin this dCache's
    # throwaway CA for every later gsi test of this pytest worker
    gsi = subprocess.run([sys.executable, "-c", GSI_STAT], input=json.dumps([
        f"root://localhost:{dcache.ports['xrootd_gsi']}/{AREA}", f"{AREA}/by-xrootd",
        {"ca_dir": ca_dir, "x509_proxy": proxy, "security_protocol": "gsi"}]),
        capture_output=True, text=True, timeout=120)
    assert gsi.stdout.strip() == str(len(b"anonymous\n")), gsi.stdout + gsi.stderr[-2000:]

    srm = driver_spec(dcache.url_for("srm"), driver="gfal2", options={
        "ca_dir": ca_dir, "x509_proxy": proxy}).connect("srm", timeout=60)
    assert srm.stat(f"{AREA}/by-xrootd").size == len(b"anonymous\n")


def _the_version_is_the_servers_own_report(dcache: EmbeddedDCache) -> None:
    """The release started is the one the WebDAV door's Server header and the xrootd
    door's ``query config version`` name."""
    expected = _expected_version(dcache.requested_version or "")
    assert dcache.version == expected
    assert _webdav(dcache, "PROPFIND", AREA).getheader("Server") == f"dCache/{expected}"
    door = driver_spec(dcache.url_for("root"), driver="xrootd").connect("version", timeout=30)
    assert expected in door.version()


def _pool_location(dcache: EmbeddedDCache, response: http.client.HTTPResponse,
                   path: str) -> None:
    """``response`` redirects to a pool's mover: another port, the same path, dCache's
    one-time reference in the query."""
    location = urlsplit(response.getheader("Location") or "")
    assert (location.scheme, location.hostname, location.path) == ("https", "localhost", path)
    assert location.port not in (None, dcache.ports["webdav"])
    assert "dcache-http-uuid=" in location.query


def _the_webdav_door_redirects_put_and_get_to_a_pool(dcache: EmbeddedDCache) -> None:
    """A PUT (announced with ``Expect: 100-continue``) is answered by a 307 to a pool,
    a GET by a redirect (302) to the pool holding the file."""
    path = f"{AREA}/redirected"
    put = _webdav(dcache, "PUT", path, upload=len(b"to a pool\n"))
    assert put.status == 307, put.status
    _pool_location(dcache, put, path)
    davs = driver_spec(dcache.url_for("davs"), driver="http", options={"ca_dir": dcache.ca_dir},
                       writable_root=AREA).connect("redirect", timeout=30)
    davs.put(path, b"to a pool\n")
    get = _webdav(dcache, "GET", path)
    assert get.status in (302, 307), get.status
    _pool_location(dcache, get, path)


@pytest.mark.slow_server
@pytest.mark.long_running
def test_a_dcache_whose_pytest_was_killed_is_reaped(dcache_release):
    """A process starts a dCache and dies without stopping it: the JVM and PostgreSQL
    keep running; the orphan reaper (run by the next server start) stops both and
    removes the directory."""
    from pytest_storagescale.servers.orphans import stop_orphaned_servers

    left = subprocess.run([sys.executable, "-c", LEAVE_A_DCACHE, dcache_release],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert left.returncode == 0, left.stderr[-2000:]
    jvm, postgres, zookeeper, directory = left.stdout.split()
    pids = {int(jvm), int(postgres), int(zookeeper)}  # ZooKeeper: a JVM of its own
    assert not any(gone(pid) for pid in pids), "nothing left running to reap"
    stopped = [orphan for orphan in stop_orphaned_servers() if orphan.directory == directory]
    assert len(stopped) == 1
    assert pids <= set(stopped[0].killed)
    assert all(gone(pid) for pid in pids)
    assert not Path(directory).exists()


def test_without_a_distribution_the_run_says_so_and_names_the_option(pytester, monkeypatch,
                                                                      tmp_path):
    """No tarball in the cache and none given: one paragraph naming
    --storage-embedded-version PATH, exit 4, no test run, nothing started."""
    monkeypatch.setenv("STORAGESCALE_DCACHE_DIST", str(tmp_path / "empty"))
    pytester.makepyfile(test_s="""
        def test_stat(storage_endpoint):
            storage_endpoint.client("x", timeout=10).stat(storage_endpoint.run_dir)
    """)
    result = pytester.runpytest("--storage-embedded", "dcache",
                                f"--storage-thresholds={REPO / 'thresholds'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stderr.str() + result.stdout.str()
    assert "needs a dCache distribution, and there is none" in text
    assert "--storage-embedded-version PATH" in text and "Traceback" not in text


def test_a_release_is_named_from_the_cache_or_by_a_tarballs_path(monkeypatch, tmp_path):
    """--storage-embedded-version takes a release of the cache or the path of a
    dcache-VERSION.tar.gz; anything else is a usage error naming what is offered."""
    from pytest_storagescale.errors import StorageScaleUsageError

    cache = tmp_path / "cache"
    cache.mkdir()
    for version in ("10.2.25", "9.2.4", "11.2.5"):
        (cache / f"dcache-{version}.tar.gz").write_bytes(b"")
    (cache / ".assemble-11.2.6-x").mkdir()  # an assembly under way is no release
    monkeypatch.setenv("STORAGESCALE_DCACHE_DIST", str(cache))
    assert EmbeddedDCache.available_versions() == ("9.2.4", "10.2.25", "11.2.5")
    assert EmbeddedDCache.check_version("10.2.25") == "10.2.25"
    site = tmp_path / "site" / "dcache-11.2.7.tar.gz"
    site.parent.mkdir()
    with tarfile.open(site, "w:gz") as archive:  # a dCache tarball: <release>/bin/dcache
        archive.addfile(tarfile.TarInfo("dcache-11.2.7/bin/dcache"), io.BytesIO(b""))
    assert EmbeddedDCache.check_version(str(site)) == str(site)
    for wrong in ("11.2.7", str(tmp_path / "dcache-1.0.tar.gz"), str(site.parent)):
        with pytest.raises(StorageScaleUsageError, match="9.2.4, 10.2.25, 11.2.5"):
            EmbeddedDCache.check_version(wrong)


def test_suites_dcache_says_why_it_runs_against_apache_without_a_distribution(
        pytester, monkeypatch, tmp_path):
    """suites/dcache's own server is the embedded dCache when a release is there; without
    one it is the Apache door, and the header says why and how to get a dCache."""
    monkeypatch.setenv("STORAGESCALE_DCACHE_DIST", str(tmp_path / "empty"))
    result = pytester.runpytest_subprocess(str(REPO / "suites" / "dcache"), "--collect-only",
                                           "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    result.stdout.fnmatch_lines([
        "storagescale: endpoint embedded webdav *",
        "*storage_embedded: webdav (from the suite's conftest)",
        "storagescale: suites/dcache runs against the Apache WebDAV door: no dCache "
        "distribution (scripts/dcache-dist.sh fills the cache; --storage-embedded dcache "
        "--storage-embedded-version PATH gives a tarball)",
    ])


def test_a_set_up_tool_past_its_deadline_is_one_paragraph(tmp_path: Path):
    """``bin/dcache database update`` that did not end within its deadline (seen at a
    load above 40) stops the start with a message naming the command and the deadline,
    not a TimeoutExpired traceback."""
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "dcache"
    tool.write_text("#!/bin/sh\necho migrating; exec sleep 30\n")
    tool.chmod(0o700)
    server = EmbeddedDCache(tape=None)
    server.home = tmp_path
    with pytest.raises(dcache_module.EndpointError) as caught:
        server._dcache("database", "update", timeout=1)
    text = str(caught.value)
    assert "'bin/dcache database update' did not end within 1 s" in text, text
    assert "migrating" in text and "Traceback" not in text


def test_a_door_is_probed_only_once_its_port_listens():
    """The readiness probes (a Python process each for the GSI xrootd door and the extra
    doors) run only once the door's port takes a connection: while the JVM starts, a
    round costs a connect per door, not a process per door. Here the xrootd door's port
    has no listener for the whole wait: its probe never runs, and the answer names the
    port; the WebDAV and SRM ports listen, so theirs run."""
    import socket

    server = EmbeddedDCache(tape=None, extra_doors=())
    called: list[str] = []

    def probe(door: str, error: str = ""):
        def run() -> None:
            called.append(door)
            if error:
                raise RuntimeError(error)
        return run

    server._probe_webdav = probe("davs")
    server._probe_xrootd = probe("root")
    server._probe_srm = probe("srm", "srm not ready")
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there from now on
    server.ports = {"webdav": listeners[0].getsockname()[1], "xrootd": closed_port,
                    "srm": listeners[1].getsockname()[1]}
    server.startup_timeout = 2.0
    server.process = subprocess.Popen(["sleep", "30"])
    try:
        error = server._probe_doors()
    finally:
        server.process.kill()
        server.process.wait()
        for listener in listeners:
            listener.close()
    assert "root" not in called and "davs" in called and "srm" in called, called
    assert f"the root door did not answer (nothing listens on its port {closed_port} yet)" \
        in error, error
    assert "the srm door did not answer (srm not ready)" in error, error
    assert set(server.door_seconds) == {"davs"}
