"""What one client host can run is checked before the load: open files against
``ulimit -n`` (issue 8: 500 clients with ``ulimit -n 256`` died with a raw
``OSError: Too many open files`` and lost the step), threads against ``ulimit -u``
(issue 22: 60 clients with ``ulimit -u 40`` died with ``can't start new thread``,
then a segfault); a client thread that cannot start anyway is the step's error."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

PLAN = """
[storage]
system = "xrootd"
versions = ["*"]

[defaults]
duration = "1s"
hang_timeout = "10s"

[ops.stat]
clients = [{clients}]

[[ops.stat.expect]]
rules = ["failed == 0"]
"""

SUITE = """
import pytest

@pytest.mark.storagescale_op("stat")
def test_stat(storage_load, storage_clients):
    storage_load.run()
"""


def _limit_open_files():
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.integration
@pytest.mark.parametrize("executor, clients, needed", [
    ("threads", 500, 564),
    # auto: at most 200 xrootd clients per process, so 10 processes of 200
    ("auto", 2000, 264),
], ids=["threads", "auto-sharded"])
def test_more_clients_than_open_files_is_one_paragraph(tmp_path, embedded_xrootd, executor,
                                                       clients, needed):
    (tmp_path / "thr" / "xrootd").mkdir(parents=True)
    (tmp_path / "thr" / "xrootd" / "t.toml").write_text(PLAN.format(clients=clients))
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_suite.py",
         f"--storage-endpoint={embedded_xrootd.url}", "--storage-thresholds=thr",
         "--storage-results=r.json", f"--storage-executor={executor}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        preexec_fn=_limit_open_files,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert (f"stat step at {clients} clients: a step of {clients} clients needs about "
            f"{needed} open files per process (1 per client), and this process may open 256 "
            f"(ulimit -n: soft 256, hard 256). Raise the limit, e.g. 'ulimit -n {needed}'"
            ) in output, output[-2000:]
    assert "Too many open files" not in output and "Traceback" not in output


def test_the_open_files_check_counts_the_processes_the_executor_will_use():
    """500 xrootd clients fit in ulimit -n 256 when auto spreads them over 3 processes
    (at most 200 each), not in one process of threads."""
    from pytest_storagescale.drivers.xrootd import XRootDDriver
    from pytest_storagescale.load.executors import planned_processes, usable_cores

    assert XRootDDriver.clients_per_process == 200
    assert planned_processes("threads", 500, XRootDDriver) == 1
    assert planned_processes("auto", 200, XRootDDriver) == 1
    assert planned_processes("auto", 500, XRootDDriver) == max(3, usable_cores())
    assert planned_processes("auto", 5000, XRootDDriver) == 25
    assert planned_processes("processes", 10, XRootDDriver) == max(2, usable_cores())
    assert planned_processes("auto", 5000, object) == 1  # a driver without a limit


def test_the_soft_limit_is_raised_to_the_hard_one():
    code = ("import resource; from pytest_storagescale.limits import raise_open_files_limit;"
            "print(*raise_open_files_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))")

    def limits():
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 512))

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         preexec_fn=limits, check=True).stdout.split()
    assert out == ["512", "512", "512", "512"]


# -- threads: ulimit -u counts every thread of the user --------------------------------
#: an unprivileged user whose thread limit the tests set (root has none)
LIMITED_USER = "nobody"

needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="running as a user with a thread limit needs root")


@pytest.fixture
def limited_user(tmp_path_factory):
    """(folder, environment, run): ``run(command, nproc)`` runs ``command`` in the
    folder as :data:`LIMITED_USER` with ``ulimit -u nproc``; the compiled client loop
    already built in its cache."""
    import pwd
    import shutil
    import tempfile

    from pytest_storagescale.drivers import native

    user = pwd.getpwnam(LIMITED_USER)
    folder = Path(tempfile.mkdtemp(prefix="storagescale-nproc-"))  # pytest's is root's 0700
    cache = folder / "cache"
    built = native.build()
    (cache / "pytest-storagescale").mkdir(parents=True)
    shutil.copy(built, cache / "pytest-storagescale" / built.name)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.update(HOME=str(folder), XDG_CACHE_HOME=str(cache))

    def run(command: list[str], nproc: int) -> subprocess.CompletedProcess:
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid)

        def demote():
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

        return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                              timeout=180, preexec_fn=demote)

    yield folder, run
    shutil.rmtree(folder, ignore_errors=True)


@needs_root
@pytest.mark.integration
def test_more_threads_than_ulimit_u_is_one_paragraph(limited_user, embedded_xrootd):
    folder, run = limited_user
    (folder / "thr" / "xrootd").mkdir(parents=True)
    (folder / "thr" / "xrootd" / "t.toml").write_text(PLAN.format(clients=60))
    (folder / "test_suite.py").write_text(SUITE + "\n\ndef test_after():\n    pass\n")
    result = run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_suite.py",
                  f"--storage-endpoint={embedded_xrootd.url}", "--storage-thresholds=thr",
                  "--storage-results=r.json"], nproc=40)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-2000:]
    assert ("stat step at 60 clients: a step of 60 clients needs about 92 threads (one per "
            "client and about 32 per client process for the client library), and this user "
            "may run 40") in output, output[-2000:]
    assert "(ulimit -u: soft 40, hard 40; it counts every thread of the user)" in output
    assert "Raise the limit, e.g. 'ulimit -u " in output
    assert "1 failed, 1 passed" in output  # the session went on
    assert "can't start new thread" not in output and "Traceback" not in output


#: a step run directly (no check before it): its client threads cannot all start
STEP = """
import sys
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.errors import StorageError
from pytest_storagescale.load.engine import run_step
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan

if __name__ == "__main__":
    url, root, executor = sys.argv[1:]
    plan = StepPlan(operation=get_operation("stat"), clients=60, duration=1.0, warmup=0.1,
                    hang_timeout=5.0, workdir=f"{root}/threads-{executor}",
                    driver=driver_spec(url, writable_root=root))
    try:
        run_step(plan, executor=executor)
    except StorageError as error:
        print("step error:", error.error_class, error)
"""


@needs_root
@pytest.mark.integration
@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_client_thread_that_cannot_start_is_the_steps_error(limited_user, xrootd_area,
                                                              embedded_xrootd, executor):
    folder, run = limited_user
    (folder / "step.py").write_text(STEP)
    root, _ = xrootd_area
    result = run([sys.executable, "step.py", embedded_xrootd.url, root, executor], nproc=40)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-2000:]  # no crash, no traceback
    assert "step error: client_threads" in output, output[-2000:]
    assert "could not start the thread of client" in output and "ulimit -u" in output
    assert "Traceback" not in output
