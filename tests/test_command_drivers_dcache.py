"""The seeds' own clients against a real dCache (issue 35, seed 004): the copy-out and
transaction steps, and a namespace scan through ``globus-url-copy -list``, run over
the load doors ``dcap+dccp`` and ``gsiftp+globus-url-copy`` of the tests' shared
embedded dCache (``embedded_dcache``: it has the dcap and GridFTP doors), pointed at as
a remote storage (its WebDAV door the endpoint, ``--storage-door`` for the others).
Each request is one run of the real ``dccp`` / ``globus-url-copy``; a wrapper first
in ``PATH`` logs each run and then ``exec``s the real tool, so the test sees that every
measured request was one tool process with the URL of its door. The conformance checks
through the tools (``suites/dcache/test_seed_clients.py``) run there too, their outcomes
those measured on the release."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow_server]

PLAN = """
[storage]
system = "dcache"
versions = ["*"]

[defaults]
warmup = "0s"
hang_timeout = "120s"

[ops.copyout]
op = "get"
clients = [2]
duration = "4s"
file_size = "1MB"
files = 4
to_disk = true

[[ops.copyout.expect]]
clients = "*"
rules = ["failed == 0", "hung == 0", "succeeded >= 1"]

[ops.transactions]
op = "get"
clients = [2]
file_size = "100kB"
files = 12
operations = 12
duration = "5m"

[[ops.transactions.expect]]
clients = "*"
rules = ["failed == 0", "hung == 0", "succeeded == 12"]

[ops.ls]
clients = [2]
duration = "3s"
entries = 5

[[ops.ls.expect]]
clients = "*"
rules = ["failed == 0", "hung == 0", "succeeded >= 1"]
"""

SUITE = """
import pytest

pytestmark = pytest.mark.storagescale_system("dcache")


@pytest.mark.storagescale_op("copyout")
def test_copy_out(storage_load, storage_clients):
    storage_load.run()


@pytest.mark.storagescale_op("transactions")
def test_transactions(storage_load, storage_clients):
    storage_load.run()


@pytest.mark.storagescale_op("ls")
def test_namespace(storage_load, storage_clients, storage_load_door):
    if storage_load_door.startswith("dcap"):
        pytest.skip("dccp lists nothing")
    storage_load.run()
"""

TOOLS = ("dccp", "globus-url-copy")


def _wrappers(folder: Path, log: Path) -> None:
    """``dccp`` and ``globus-url-copy`` in ``folder`` that log their arguments and then
    are the real tools."""
    folder.mkdir()
    for tool in TOOLS:
        real = shutil.which(tool)
        if real is None:
            pytest.fail(f"{tool} is not installed: 'make setup' (scripts/bootstrap.sh "
                        f"installs Debian's dcap and globus-gass-copy-progs)")
        wrapper = folder / tool
        wrapper.write_text(textwrap.dedent(f"""\
            #!/bin/sh
            echo "{tool} $*" >> {log}
            exec {real} "$@"
            """))
        wrapper.chmod(0o755)


def test_copy_out_transactions_and_listing_through_the_seeds_clients(
        embedded_dcache, pytester, monkeypatch):
    dcache = embedded_dcache
    log = pytester.path / "tools.log"
    _wrappers(pytester.path / "bin", log)
    monkeypatch.setenv("PATH", f"{pytester.path / 'bin'}:{os.environ['PATH']}")
    pytester.makepyfile(test_seed_clients=SUITE)
    (pytester.path / "thr" / "dcache").mkdir(parents=True)
    (pytester.path / "thr" / "dcache" / "any.toml").write_text(PLAN)
    result = pytester.runpytest_subprocess(
        # the WebDAV door's login (the password) and the proxy are the same user: the run
        # directory made through it takes the dcap and GridFTP clients' files
        *_doors_and_login(dcache),
        f"--storage-version={dcache.version}", "--storage-thresholds=thr",
        "--storage-load-doors=dcap+dccp,gsiftp+globus-url-copy",
        "--storage-results=r.json", "-p", "no:cacheprovider", "-v", "-rs", timeout=1500)
    result.assert_outcomes(passed=5, skipped=1)
    result.stdout.fnmatch_lines(["*test_copy_out[[]c2-dcap+dccp[]] PASSED*",
                                 "*test_transactions[[]c2-gsiftp+globus-url-copy[]] PASSED*"])
    steps = {(step["op"], step["door"]): step
             for step in json.loads((pytester.path / "r.json").read_text())["steps"]}
    assert set(steps) == {(op, door) for op in ("copyout", "transactions")
                          for door in ("dcap+dccp", "gsiftp+globus-url-copy")} | {
        ("ls", "gsiftp+globus-url-copy")}, sorted(steps)
    runs = log.read_text().splitlines()
    dcap, gridftp = dcache.url_for("dcap"), dcache.url_for("gsiftp")
    for (op, door), step in steps.items():
        assert step["failed"] == 0 and step["hung"] == 0 and step["succeeded"] >= 1, step
        assert step["rate_hz"] > 0 and step["latency_s"]["p50"] > 0, step
        tool, url = ("dccp", dcap) if door.startswith("dcap") else ("globus-url-copy", gridftp)
        # every request measured was one run of the tool, with its door's URL (the
        # set-up's uploads are gfal2's: no run copies in)
        made = [run for run in runs if run.startswith(f"{tool} ")
                and ((" -list " in run) == (op == "ls"))]
        assert len(made) >= step["succeeded"], (op, door, len(made), step["succeeded"])
        assert all(url.split("/storagescale")[0] in run for run in made)
    assert steps[("transactions", "dcap+dccp")]["succeeded"] == 12
    assert steps[("transactions", "gsiftp+globus-url-copy")]["succeeded"] == 12
    assert not any("/put-" in run for run in runs)  # the set-up's uploads are gfal2's


#: suites/dcache/test_seed_clients.py's outcomes by release (measured 2026-11-29 on the
#: embedded 10.2.25 and 11.2.5): what the tools cannot do is skipped (17), and the
#: known issues of thresholds/dcache/<release>.toml are strict expected failures
SEED_CHECKS = {
    "10.2.25": {"passed": 18, "skipped": 17, "xfailed": 1},
    "11.2.5": {"passed": 17, "skipped": 17, "xfailed": 2},
}


def test_the_conformance_checks_through_the_seeds_clients(embedded_dcache, pytester):
    """suites/dcache/test_seed_clients.py over the load doors dcap+dccp and
    gsiftp+globus-url-copy of the shared embedded dCache, pointed at as a remote
    storage: every check through a tool passes but the release's known issues (a
    partial retrieve past the end on both; 11.2.5's 500 to CKSM MD5), each skip names
    the tool that cannot, and nothing the checks made is left (no warning)."""
    dcache = embedded_dcache
    expected = SEED_CHECKS.get(dcache.version)
    if expected is None:
        pytest.skip(f"outcomes measured on {', '.join(SEED_CHECKS)} only, not "
                    f"{dcache.version}")
    repo = Path(__file__).resolve().parent.parent
    result = pytester.runpytest_subprocess(
        str(repo / "suites" / "dcache" / "test_seed_clients.py"),
        *_doors_and_login(dcache),
        f"--storage-version={dcache.version}", f"--storage-thresholds={repo / 'thresholds'}",
        "--storage-load-doors=dcap+dccp,gsiftp+globus-url-copy",
        "-p", "no:cacheprovider", "-rsxX",
        "-W", "error::pytest_storagescale.StorageScaleWarning", timeout=1200)
    result.assert_outcomes(**expected)
    result.stdout.fnmatch_lines([
        "*dcap+dccp door: not applicable: dccp deletes nothing*",
        "*gsiftp+globus-url-copy door: not applicable: globus-url-copy deletes nothing*",
        "*known issue of dcache*'partial_read_across_the_end[[]gsiftp+globus-url-copy[]]'*",
    ])
    if dcache.version == "11.2.5":
        result.stdout.fnmatch_lines(["*'md5_of_a_local_copy[[]gsiftp+globus-url-copy[]]'*"])


def _doors_and_login(dcache) -> list[str]:
    """The options naming the embedded dCache's doors (the WebDAV one the endpoint) and
    the CA folder and proxy its clients log in with."""
    return [f"--storage-endpoint={dcache.url_for('davs')}",
            *(f"--storage-door={door}={dcache.url_for(door)}"
              for door in ("root", "dcap", "gsiftp")),
            f"--storage-driver-option=ca_dir={dcache.ca_dir}",
            f"--storage-driver-option=x509_proxy={dcache.proxy}"]
