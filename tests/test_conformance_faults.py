"""Faults the conformance suite must catch, and its authorization checks, each against
a real xrootd on loopback run through pytester:

- a full disk (the exported area on a 4 MiB tmpfs): a large put fails saying "no
  space left", over both doors;
- the test area made read-only on the server's disk half-way through a run: the checks
  after it fail with a permission message, the clean-ups that cannot remove their
  files are warnings, and the run ends cleanly (no traceback, no hang);
- the authorization checks pass on the embedded xrootd's token login, skip under the
  unix login naming the option that runs them, and fail on a server whose authdb lets
  any token write.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from plans import xrootd_plan

from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import EndpointError, StorageError
from pytest_storagescale.servers.xrootd import AREA, EmbeddedXRootD, unprivileged_user

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parent.parent
CONFORMANCE = REPO / "suites" / "conformance"
XROOTD_SUITE = REPO / "suites" / "xrootd"
#: the authorization checks per door
AUTHZ_CHECKS = 5
#: generous bound of one pytester run on a busy 2-core machine (a hang is far longer)
RUN_TIMEOUT = 300


def _remote_args(server: EmbeddedXRootD, tmp_path: Path) -> list[str]:
    """The server as a remote storage with its davs door, and a plan without known issues."""
    return [f"--storage-endpoint={server.url}", f"--storage-door=davs={server.https_url}",
            f"--storage-driver-option=ca_dir={server.ca_dir}",
            f"--storage-thresholds={xrootd_plan(tmp_path)}", "-p", "no:cacheprovider"]


def _assert_clean_end(result) -> None:
    """No traceback and no internal error: every failure was one message."""
    text = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in text and "INTERNALERROR" not in text, text[-3000:]


# -- full disk ---------------------------------------------------------------------------
class FullDiskXRootD(EmbeddedXRootD):
    """An xrootd whose exported area is a small tmpfs (root only: it mounts)."""

    def __init__(self, *, size: str = "4m", **kwargs) -> None:
        super().__init__(**kwargs)
        self.size = size
        self.mounted: Path | None = None

    def _launch(self, user: str | None) -> None:
        if self.mounted is None:
            assert self.directory is not None and user is not None
            area = self.directory / "data" / AREA.strip("/")
            owner = area.stat()
            subprocess.run(["mount", "-t", "tmpfs", "-o",
                            f"size={self.size},mode=0755,uid={owner.st_uid},gid={owner.st_gid}",
                            "storagescale-full-disk", str(area)],
                           check=True, capture_output=True, timeout=30)
            self.mounted = area
        super()._launch(user)

    def stop(self) -> None:
        self._terminate()  # nothing holds the mount when it goes
        if self.mounted is not None:
            done = subprocess.run(["umount", str(self.mounted)], capture_output=True,
                                  timeout=30)
            if done.returncode != 0:  # a straggler holds it: detach it now
                subprocess.run(["umount", "-l", str(self.mounted)], capture_output=True,
                               timeout=30)
            self.mounted = None
        super().stop()


def _can_mount() -> str:
    """Why a tmpfs cannot be mounted here ('' when it can)."""
    if os.geteuid() != 0:
        return "mounting the small tmpfs needs root (CI runs as root)"
    if unprivileged_user() is None or shutil.which("mount") is None:
        return "no mount command or no unprivileged user for xrootd"
    return ""


@pytest.fixture(scope="module")
def full_disk_xrootd():
    reason = _can_mount()
    if reason:
        pytest.skip(reason)
    server = FullDiskXRootD()
    try:
        server.start()
    except subprocess.CalledProcessError as exc:  # a container without CAP_SYS_ADMIN
        pytest.skip(f"mount -t tmpfs was refused here: {exc.stderr.decode().strip()}")
    try:
        yield server
    finally:
        server.stop()
    assert server.mounted is None


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in
               Path("/proc/mounts").read_text().splitlines())


def test_a_full_disk_says_no_space_left(pytester, tmp_path, full_disk_xrootd):
    """A 64 MiB put into a 4 MiB area fails through each door, naming the door, the
    path and what was expected. The root door says "no space left" (kXR_NoSpace, error
    class no_space); XrdHttp 5.5.3 drops the connection without an answer when its write
    fails, so the davs door can only say that: "Empty reply from server" when the body
    was all sent and read, "Connection reset by peer" when the client was still sending
    it or the server had not read it all (both seen here; which one is a race)."""
    server = full_disk_xrootd
    assert server.mounted is not None and _mounted(server.mounted)
    result = pytester.runpytest_subprocess(
        str(CONFORMANCE), *_remote_args(server, tmp_path), "-k", "large_file", "-v",
        timeout=RUN_TIMEOUT)
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    said = {}
    for door in ("root", "davs"):
        failure = re.search(rf"{door} door \([^)]*\): put \S+/large\.dat: the storage answered "
                            rf"an error: (.*); expected success\.", out)
        assert failure, out[-3000:]
        said[door] = failure.group(1)
    assert "no space left" in said["root"].lower() and "errno=3009" in said["root"], said
    dropped = ("Empty reply from server", "Connection reset by peer")  # send or recv
    assert "http put" in said["davs"] and any(how in said["davs"] for how in dropped), said
    _assert_clean_end(result)
    # the xrootd driver's class of the error: grouped as no_space in results
    client = driver_spec(server.url, writable_root=AREA).connect("full", timeout=30)
    try:
        with pytest.raises(StorageError) as refused:
            client.put(f"{AREA}/direct.dat", bytes(8 * 1024 * 1024))
        assert refused.value.error_class == "no_space", refused.value
        client.delete(f"{AREA}/direct.dat")  # the part written: the area is full
    finally:
        client.close()


def test_the_full_disk_is_unmounted_when_the_server_stops(tmp_path):
    """The tmpfs goes with the server, also when the server fails to start."""
    reason = _can_mount()
    if reason:
        pytest.skip(reason)

    class NeverReady(FullDiskXRootD):
        def _wait_ready(self) -> str:
            assert self.mounted is not None and _mounted(self.mounted)
            return "not ready (the test says so)"

    server = NeverReady(https=False)
    try:
        with pytest.raises(EndpointError, match="did not start: not ready"):
            server.start()
    finally:
        server.stop()
    assert server.mounted is None and server.directory is None


# -- the test area made read-only mid-run ------------------------------------------------
#: a plugin of the pytester run: once the second check has run its body, the run
#: directory (on the server's disk) is made read-only, before that check's clean-up
FREEZE_PLUGIN = '''
import os
import pytest

AREA = os.environ["STORAGESCALE_TEST_AREA_ON_DISK"]
calls = []


def read_only(top):
    for folder, _, files in os.walk(top):
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield
    calls.append(item.nodeid)
    if len(calls) == 2:
        for name in os.listdir(AREA):
            read_only(os.path.join(AREA, name))
        print("\\nMADE READ-ONLY after", item.nodeid, flush=True)
'''


@pytest.fixture
def xrootd():
    with EmbeddedXRootD() as server:
        yield server


def _writable_again(top: Path) -> None:
    for folder, _, files in os.walk(top):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), stat.S_IRUSR | stat.S_IWUSR)


def test_a_test_area_made_read_only_mid_run(pytester, tmp_path, xrootd, monkeypatch):
    """The checks after the change fail with a permission message naming the door and the
    path; the check whose clean-up was refused keeps its verdict and warns; the run
    ends with the run directory left, said in one line, no traceback."""
    area = xrootd.directory / "data" / AREA.strip("/")
    pytester.makepyfile(freeze_area=FREEZE_PLUGIN)
    monkeypatch.setenv("STORAGESCALE_TEST_AREA_ON_DISK", str(area))
    try:
        result = pytester.runpytest_subprocess(
            str(CONFORMANCE), *_remote_args(xrootd, tmp_path), "-p", "freeze_area",
            "-k", "(stat_fields or ls or rename or delete or zero_byte) and root", "-v",
            "-s", "-W", "always::pytest_storagescale.errors.StorageScaleWarning",
            timeout=RUN_TIMEOUT)
    finally:
        _writable_again(area)
    out = result.stdout.str()
    assert "MADE READ-ONLY after" in out, out[-3000:]
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 2, outcomes  # the two before the change
    assert outcomes.get("errors", 0) + outcomes.get("failed", 0) == 3, outcomes
    # each later check: its directory could not be made, with the storage's refusal
    # (the short summary repeats each message when the terminal is wide: count checks once)
    refusals = dict(re.findall(r"root door \([^)]*\): mkdir \S+/conformance/(\S+): the "
                               r"storage answered an error: xrootd mkdir \S+: ([^\n]*?); "
                               r"expected success", out))
    assert sorted(refusals) == ["test_delete-root", "test_ls-root", "test_rename-root"], \
        out[-4000:]
    assert all("permission denied" in said.lower() for said in refusals.values()), refusals
    # the second check's clean-up met the read-only directory: a warning, not a failure
    assert re.search(r"StorageScaleWarning: root door: \S+ not removed: .*[Pp]ermission "
                     r"denied", out), out[-4000:]
    # the session's removal of the run directory was refused too: one line, no traceback
    result.stdout.fnmatch_lines(["storagescale: could not remove this run's directory "
                                 "*[Pp]ermission denied*by hand"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    _assert_clean_end(result)


# -- the authorization checks -------------------------------------------------------------
@pytest.mark.slow_server
def test_authorization_checks_pass_on_the_token_login(pytester, tmp_path):
    """The embedded xrootd with the token login, under xdist: every authorization check
    passes over root:// (ztn) and davs:// (Bearer)."""
    result = pytester.runpytest_subprocess(
        str(XROOTD_SUITE), "-k", "Authorization", "--storage-embedded-login", "token",
        f"--storage-thresholds={xrootd_plan(tmp_path)}", "-p", "no:cacheprovider", "-v",
        "-n", "2", timeout=RUN_TIMEOUT)  # the workers get the controller's tokens
    result.assert_outcomes(passed=2 * AUTHZ_CHECKS)
    for check in ("read_only_token_reads", "read_only_token_cannot_write", "write_token_writes",
                  "missing_credential_is_refused", "expired_token_is_refused"):
        for door in ("root", "davs"):
            result.stdout.fnmatch_lines([f"*PASSED *::test_{check}?{door}?*"])
    _assert_clean_end(result)
    # the probe's files were recorded as the run's (written in another process): removed
    assert "StorageScaleWarning" not in result.stdout.str(), result.stdout.str()[-3000:]


def test_authorization_checks_skip_under_the_unix_login(pytester, tmp_path):
    result = pytester.runpytest_subprocess(
        str(XROOTD_SUITE), "-k", "Authorization", f"--storage-thresholds={xrootd_plan(tmp_path)}",
        "-p", "no:cacheprovider", "-rs", timeout=RUN_TIMEOUT)
    result.assert_outcomes(skipped=2 * AUTHZ_CHECKS)
    result.stdout.fnmatch_lines(["SKIPPED [[]*] *the authorization checks need token logins "
                                 "and the embedded server runs with the unix login: run "
                                 "'pytest suites/xrootd --storage-embedded-login token'*"])


class EveryoneWritesXRootD(EmbeddedXRootD):
    """A token server whose authdb grants every authenticated user every right: the
    token's scopes no longer limit anything (a misconfiguration to catch)."""

    def _prepare_token(self) -> None:
        super()._prepare_token()
        assert self.directory is not None
        (self.directory / "authdb").write_text(f"u * {AREA} a\n")


@pytest.fixture(scope="module")
def everyone_writes():
    with EveryoneWritesXRootD(login="token") as server:
        yield server


def _token_file(folder: Path, name: str, token: str) -> Path:
    path = folder / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.slow_server
def test_a_server_that_lets_a_read_only_token_write_is_caught(pytester, tmp_path,
                                                              everyone_writes):
    """The remote-storage path (token files): every write the authdb lets through is a
    failed check saying what the storage did and what was expected; the others pass."""
    server = everyone_writes
    issuer = server.token_issuer
    assert issuer is not None
    readonly = _token_file(tmp_path, "readonly", issuer.mint(scope="storage.read:/"))
    expired = _token_file(tmp_path, "expired", issuer.mint(lifetime=-60))
    result = pytester.runpytest_subprocess(
        str(XROOTD_SUITE), "-k", "Authorization", *_remote_args(server, tmp_path),
        f"--storage-driver-option=token={server.token}",
        "--storage-driver-option=security_protocol=ztn",
        f"--storage-token-readonly={readonly}", f"--storage-token-expired={expired}", "-v",
        timeout=RUN_TIMEOUT)
    out = result.stdout.str()
    # the read-only token writes through both doors; over davs (no login step) the
    # authdb also lets in a request without a token and one with an expired token;
    # root:// still refuses those at the ztn login
    failing = {("read_only_token_cannot_write", "root"), ("read_only_token_cannot_write",
               "davs"), ("missing_credential_is_refused", "davs"),
               ("expired_token_is_refused", "davs")}
    result.assert_outcomes(passed=2 * AUTHZ_CHECKS - len(failing), failed=len(failing))
    for check, door in sorted(failing):
        result.stdout.fnmatch_lines([f"*test_{check}?{door}? FAILED*"])
    for door in ("root", "davs"):
        assert re.search(rf"{door} door \([^)]*\): put as the read-only token \S+/forbidden"
                         rf"\.dat: the storage accepted it: succeeded in [\d.]+ s; expected a "
                         rf"permission error \(the token's only scope is storage\.read:/\)",
                         out), out[-3000:]
    assert re.search(r"davs door \([^)]*\): put with no credential \S+/anonymous\.dat: the "
                     r"storage accepted it: succeeded in [\d.]+ s; expected a permission error "
                     r"\(no token was presented\)", out), out[-3000:]
    text = out + result.stderr.str()
    for token in (server.token, readonly.read_text().strip(), expired.read_text().strip()):
        assert token not in text
    _assert_clean_end(result)


def test_a_token_file_that_cannot_be_read_is_one_usage_error(pytester, tmp_path):
    """Checked when the run starts, before any server or storage is asked."""
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    for path, said in ((tmp_path / "missing", "cannot read it (No such file or directory)"),
                       (empty, "the file is empty")):
        result = pytester.runpytest_subprocess(
            str(XROOTD_SUITE), "-k", "Authorization", f"--storage-token-readonly={path}",
            "-p", "no:cacheprovider", timeout=RUN_TIMEOUT)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"ERROR: --storage-token-readonly {path}: {said}*"])
        assert "Traceback" not in result.stderr.str()
