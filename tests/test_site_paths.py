"""A release a site names by its path (``--storage-embedded-version PATH``) is run as
the user running pytest (root in CI): one that another user may change is a usage
error (exit 4) before any of its programs runs, and the wrapper script the server
runs quotes the prefix's paths (a folder named with shell characters runs nothing
else). A dCache path that is no dCache tarball is a usage error too, before the
server's start (servers/site_paths.py, xrootd_releases.py, dcache.py)."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from pytest_storagescale.servers.site_paths import others_control
from pytest_storagescale.servers.xrootd_releases import XRootDRelease

SUITE = """
def test_endpoint(storage_endpoint):
    print("VERSION", storage_endpoint.version)
"""


def _fake_prefix(root: Path, ran: Path) -> Path:
    """An installation prefix whose xrootd writes ``ran`` when executed."""
    prefix = root / "xrootd-site"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    binary = prefix / "bin" / "xrootd"
    binary.write_text(f"#!/bin/sh\ntouch {ran}\necho v6.2.1\n")
    binary.chmod(0o755)
    (prefix / "lib" / "libXrdUtils.so.3").write_bytes(b"")
    return prefix


def _usage_error(pytester, value: str) -> str:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           f"--storage-embedded-version={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr.str(), result.stderr.str()
    return errors[0]


def test_a_prefix_another_user_may_change_is_a_usage_error(pytester, tmp_path):
    ran = tmp_path / "xrootd-ran"
    prefix = _fake_prefix(tmp_path, ran)
    assert others_control(prefix / "bin" / "xrootd", prefix / "lib") == ""
    (prefix / "lib").chmod(0o777)  # anyone may drop a libXrdHttp-6.so in
    error = _usage_error(pytester, str(prefix))
    assert f"--storage-embedded-version {prefix}: {prefix / 'lib'} is writable by every " \
           f"user" in error and "chmod go-w" in error
    assert not ran.exists()  # nothing of the release ran
    (prefix / "lib").chmod(0o755)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_prefix_owned_by_another_user_is_a_usage_error(pytester, tmp_path):
    ran = tmp_path / "xrootd-ran"
    prefix = _fake_prefix(tmp_path, ran)
    os.chown(prefix / "bin" / "xrootd", 65534, -1)
    error = _usage_error(pytester, str(prefix))
    assert f"{prefix / 'bin' / 'xrootd'} is owned by " in error
    assert not ran.exists()


def test_a_folder_above_the_release_counts_but_a_sticky_one_does_not(tmp_path):
    shared = tmp_path / "shared"
    release = shared / "release"
    release.mkdir(parents=True)
    shared.chmod(0o1777)  # as /tmp: others cannot replace what is in it
    assert others_control(release) == ""
    shared.chmod(0o777)  # anyone may rename release away and put their own there
    assert others_control(release) == f"{shared} is writable by every user"
    shared.chmod(0o755)


def test_the_wrapper_script_quotes_the_prefix(tmp_path):
    """``ofs.tpc``'s copy program is a script naming the prefix: a prefix whose name
    holds shell syntax is a name, not a command."""
    prefix = tmp_path / 'site "$(touch pwned)" `touch pwned2`'
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    for name in ("xrootd", "xrdcp"):
        (prefix / "bin" / name).write_text('#!/bin/sh\necho "$LD_LIBRARY_PATH|$1"\n')
        (prefix / "bin" / name).chmod(0o755)
    release = XRootDRelease(str(prefix / "bin" / "xrootd"), str(prefix / "lib"), "6.2.1")
    script = release.program("xrdcp", tmp_path)
    done = subprocess.run([script, "arg"], capture_output=True, text=True, timeout=30,
                          cwd=tmp_path, env={"PATH": os.environ["PATH"]})
    assert done.stdout.strip() == f"{prefix / 'lib'}|arg", done.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def _tarball(path: Path, members: dict[str, bytes]) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue()))
    return path


@pytest.mark.parametrize("content", ["not gzip", "not a tar", "another tar"])
def test_a_dcache_path_that_is_no_dcache_tarball_is_a_usage_error(pytester, tmp_path,
                                                                   content):
    tarball = tmp_path / "dcache-11.2.5.tar.gz"
    if content == "not gzip":
        tarball.write_text("<html>404 Not Found</html>")
    elif content == "not a tar":
        tarball.write_bytes(gzip.compress(b"x" * 4096))
    else:
        _tarball(tarball, {"other-1.0/bin/other": b"#!/bin/sh\n"})
    pytester.makeini("[pytest]\nstorage_embedded = dcache\n")
    error = _usage_error(pytester, str(tarball))
    assert error.startswith(f"ERROR: --storage-embedded-version {tarball}: not a dCache "
                            f"distribution tarball"), error
    assert "Delete it" not in error  # a site's own file is not ours to delete


def test_a_dcache_tarball_is_recognised_without_unpacking_it(tmp_path):
    from pytest_storagescale.servers.dcache import EmbeddedDCache

    tarball = _tarball(tmp_path / "dcache-11.2.5.tar.gz",
                       {"dcache-11.2.5/share/x": b"", "dcache-11.2.5/bin/dcache": b"#!/bin/sh\n"})
    assert EmbeddedDCache.check_version(str(tarball)) == str(tarball)


def test_the_dcache_password_is_never_printed_once_made(tmp_path):
    """The door's password is registered the moment it is made (before any driver is
    built from the URL): a start-up error's log tail or a door echoing it shows ***,
    in every spelling."""
    import base64
    from urllib.parse import quote

    from pytest_storagescale.redact import redact_text
    from pytest_storagescale.servers.dcache import USER, EmbeddedDCache

    server = EmbeddedDCache()
    server.directory = tmp_path
    server._make_credentials()
    password = server.password
    basic = base64.b64encode(f"{USER}:{password}".encode()).decode()
    shown = redact_text(f"log: pass={password} q={quote(password, safe='')} basic {basic}")
    assert password not in shown and basic not in shown and shown.count("***") == 3, shown


def test_a_ceph_daemons_log_is_never_written_through_a_link(tmp_path):
    """The embedded Ceph's log folder is writable by the gateway's user: a link put
    there in a daemon's log's name (to a file of root's) is refused, not appended to."""
    from pytest_storagescale.errors import EndpointError
    from pytest_storagescale.servers.ceph import EmbeddedCephGateway

    target = tmp_path / "roots-file"
    target.write_text("untouched\n")
    server = EmbeddedCephGateway()
    server.directory = tmp_path / "run"
    (server.directory / "log").mkdir(parents=True)
    (server.directory / "log" / "gateway.out").symlink_to(target)
    with pytest.raises(EndpointError, match="never written through"):
        server._spawn("gateway", ["echo", "pwned"])
    assert target.read_text() == "untouched\n" and not server.daemons
    server._spawn("mon.a", ["echo", "logged"]).process.wait(timeout=30)
    assert (server.directory / "log" / "mon.a.out").read_text() == "logged\n"
