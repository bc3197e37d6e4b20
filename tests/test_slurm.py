"""Client hosts from a real batch system (issue 36): a SLURM cluster of the test's own
(munged, slurmctld in a namespace of its own, one slurmd per namespace host:
:mod:`pytest_storagescale.cluster.slurm`) and ``--storage-cluster slurm:N``, whose
dask-jobqueue SLURMCluster submits the Dask workers as SLURM jobs, against a real
embedded xrootd on the namespaces' bridge.

Needs root (``ip netns``) and Debian's slurmctld, slurmd, slurm-client and munge
(scripts/bootstrap.sh servers); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from netns import (
    NamespaceCluster,
    bridge_xrootd,
    during_step,
    netns_unavailable,
    xrootd_logins,
)
from plans import op_section, plan, scan_suite, write_suite

from pytest_storagescale.cluster import hosts as cluster_hosts
from pytest_storagescale.cluster.coordinator import run_cluster_step
from pytest_storagescale.cluster.slurm import (
    EmbeddedSlurm,
    SlurmNode,
    kill_namespace,
    missing_commands,
)
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.load.operations import get_operation
from pytest_storagescale.load.plan import StepPlan

# one worker at a time with the other namespace tests (their bridges and subnets)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("network_namespaces")]

HOSTS = 4
CLIENTS_PER_HOST = 5
#: how long the jobs may take to join (the recipe's own default is 30 minutes)
JOBS_TIMEOUT = 180.0


def _listeners(netns: str | None = None) -> str:
    """``ss -ltnpH`` of this machine's namespace (or of ``netns``)."""
    command = ["ss", "-ltnpH"] if netns is None else ["nsenter", f"--net={netns}", "ss",
                                                      "-ltnpH"]
    return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """4 namespace hosts on a bridge, a controller namespace, and a SLURM cluster on
    them; afterwards no process, namespace, link or file of it is left."""
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    missing = missing_commands()
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)}): scripts/bootstrap.sh "
                    f"servers installs slurmctld slurmd slurm-client munge")
    directory = tmp_path_factory.mktemp("slurm")
    network = NamespaceCluster(HOSTS, directory, dask=False)
    run = directory / "run"
    batch = None
    try:
        network.start()
        controller = network.add_controller()
        batch = EmbeddedSlurm(
            run, [SlurmNode(h.name, h.address, h.netns) for h in network.hosts],
            controller=SlurmNode("ctl", controller.address, controller.netns),
            scheduler_host=network.head)
        began = time.monotonic()
        batch.start()
        print(f"SLURM up in {time.monotonic() - began:.1f} s")
        yield network, batch
    finally:
        cluster_hosts.disconnect()
        if batch is not None:
            batch.stop()
        network.stop()
        assert network.leftovers() == []
        leftover = [p for p in os.listdir("/proc") if p.isdigit() and _mentions(p, str(run))]
        assert leftover == [], f"processes of the SLURM cluster left: {leftover}"
        shutil.rmtree(run, ignore_errors=True)
        assert not run.exists()


def _mentions(pid: str, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(slurm):
    """One embedded xrootd on an address the namespace hosts reach (netns.bridge_xrootd)."""
    with bridge_xrootd(https=False) as xrootd:
        yield xrootd


def _settings(batch: EmbeddedSlurm) -> dict[str, object]:
    """The jobqueue.slurm settings key by key, dask-jobqueue imported first: a section
    set before its defaults are loaded is removed whole when the setting ends (its
    defaults with it: KeyError 'interface' in the next test), and one set whole after
    replaces them."""
    import dask_jobqueue  # noqa: F401 - its defaults into the Dask config

    return {f"jobqueue.slurm.{key}": value
            for key, value in batch.jobqueue_config(python=sys.executable).items()}


def _run_root(network: NamespaceCluster, server, name: str) -> tuple[str, str]:
    url = f"root://{server.host}:{server.port}//storagescale"
    root = f"/storagescale/{name}-{time.time_ns()}"
    driver_spec(url, writable_root=root).connect("functional-tests", timeout=10).mkdir(root)
    return url, root


def test_the_batch_system_is_the_runs_own(slurm):
    """The munge key is 0400 in a 0700 folder; slurmctld listens in its own namespace
    only, each slurmd in its host's; nothing of SLURM's listens in this machine's."""
    network, batch = slurm
    key = batch.directory / "munge" / "munge.key"
    assert key.stat().st_mode & 0o777 == 0o400
    assert (batch.directory / "munge").stat().st_mode & 0o777 == 0o700
    assert batch.node_states() == {h.name: "idle" for h in network.hosts}
    here = _listeners()
    assert "slurm" not in here and "munged" not in here, here
    assert network.controller is not None
    assert "slurmctld" in _listeners(network.controller.netns)
    assert "slurmd" in _listeners(network.hosts[0].netns)
    assert "AllowGroups=root" in batch.conf.read_text()


def test_slurm_jobs_are_the_client_hosts_of_a_step(slurm, server, monkeypatch):
    """--storage-cluster slurm:4: dask-jobqueue submits 4 worker jobs to the SLURM
    cluster, one runs on each namespace host (its slurmd's), and a step's 20 clients
    run 5 on each: the server sees 5 logins from each host's address, the per-host
    breakdown adds up to the step. The scheduler speaks mutual TLS (a certificate made
    for the run). Closing the connection cancels the jobs."""
    network, batch = slurm
    url, root = _run_root(network, server, "slurm-step")
    for name, value in batch.environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # a recipe, not under -n
    monkeypatch.setitem(cluster_hosts.RECIPE_START_TIMEOUT, "slurm", JOBS_TIMEOUT)
    import dask

    plan = StepPlan(operation=get_operation("stat"), clients=HOSTS * CLIENTS_PER_HOST,
                    duration=2.0, warmup=0.5, hang_timeout=30.0,
                    driver=driver_spec(url, writable_root=root), workdir=f"{root}/step")
    since = len(server.log_path.read_bytes())
    with dask.config.set(_settings(batch)):
        began = time.monotonic()
        connection = cluster_hosts.connect(f"slurm:{HOSTS}")
        joined = time.monotonic() - began
        try:
            assert connection.scheduler.startswith(f"tls://{network.head}:")
            jobs = batch.jobs()
            assert sorted(j.split()[1] for j in jobs) == [h.name for h in network.hosts], jobs
            assert all(j.split()[2] == "RUNNING" for j in jobs), jobs
            # the workers' scratch space is the run's, not /tmp/dask-scratch-space
            # (a lambda: pickled by value, the jobs cannot import this test module)
            scratch = connection.client.run(
                lambda dask_worker: str(dask_worker.local_directory))
            assert all(d.startswith(f"{batch.directory}/") for d in scratch.values()), scratch
            result = run_cluster_step(f"slurm:{HOSTS}", plan)
        finally:
            cluster_hosts.disconnect(f"slurm:{HOSTS}")
    print(f"4 worker jobs joined in {joined:.1f} s")
    addresses = {h.address for h in network.hosts}
    assert sorted(h.address for h in result.hosts) == sorted(addresses)
    assert [h.clients for h in result.hosts] == [CLIENTS_PER_HOST] * HOSTS
    total = result.total
    assert total.failed == 0 and total.hung == 0 and total.succeeded > 0
    assert sum(h.succeeded for h in result.hosts) == total.succeeded
    assert all(h.succeeded > 0 for h in result.hosts) and result.lost == 0
    logins = xrootd_logins(server.log_path.read_text(errors="replace")[since:])
    assert {a: len(u) for a, u in logins.items() if a in addresses} == \
        {a: CLIENTS_PER_HOST for a in addresses}
    # the certificate and key dask-jobqueue dumped for the jobs are gone with it
    assert list((batch.directory / "slurm" / "dask-tls").iterdir()) == []
    # the jobs are cancelled with the connection
    deadline = time.monotonic() + 30
    while batch.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert batch.jobs() == []


def test_a_cancelled_job_is_a_lost_host(slurm, server, monkeypatch):
    """scancel of one host's job mid-step (a batch system taking a client host back): its
    worker leaves the cluster, its clients are lost (named, with why), the other hosts'
    are measured, and the step ends by its end + hang_timeout + the report grace."""
    import dask

    from pytest_storagescale.cluster.coordinator import REPORT_GRACE

    network, batch = slurm
    url, root = _run_root(network, server, "slurm-cancel")
    for name, value in batch.environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setitem(cluster_hosts.RECIPE_START_TIMEOUT, "slurm", JOBS_TIMEOUT)
    victim = network.hosts[1]
    cancelled: list[str] = []
    during_step(monkeypatch, 1.5, lambda: cancelled.append(
        batch.command("scancel", f"--nodelist={victim.name}")))
    plan = StepPlan(operation=get_operation("stat"), clients=HOSTS * CLIENTS_PER_HOST,
                    duration=5.0, warmup=0.5, hang_timeout=3.0,
                    driver=driver_spec(url, writable_root=root), workdir=f"{root}/step")
    with dask.config.set(_settings(batch)):
        try:
            cluster_hosts.connect(f"slurm:{HOSTS}")
            began = time.monotonic()
            result = run_cluster_step(f"slurm:{HOSTS}", plan)
            took = time.monotonic() - began
        finally:
            cluster_hosts.disconnect(f"slurm:{HOSTS}")
    assert cancelled == [""], "the job was never cancelled"
    assert took < 1 + 1 + 0.5 + 5 + 3 + REPORT_GRACE + 15, took
    lost = [h for h in result.hosts if h.lost]
    assert [(h.address, h.lost) for h in lost] == [(victim.address, CLIENTS_PER_HOST)], \
        [(h.address, h.lost, h.lost_reason) for h in result.hosts]
    assert result.lost == CLIENTS_PER_HOST
    reason = lost[0].lost_reason or ""
    assert any(words in reason for words in ("left the cluster", "no report by",
                                             "its task failed")), reason
    kept = [h for h in result.hosts if not h.lost]
    assert len(kept) == HOSTS - 1 and all(h.succeeded > 0 for h in kept)
    assert result.total.succeeded == sum(h.succeeded for h in kept)


def test_a_suite_runs_its_clients_as_slurm_jobs(slurm, server, pytester):
    """A suite with --storage-cluster slurm:4 and the Dask config in a jobqueue.yaml
    (as a site writes it): the header names the 4 job hosts, -v shows each host's row
    under the table, the JSON has the per-host breakdown."""
    network, batch = slurm
    config = pytester.path / "dask"
    config.mkdir()
    (config / "jobqueue.yaml").write_text(yaml.safe_dump(
        {"jobqueue": {"slurm": batch.jobqueue_config(python=sys.executable)}}))
    write_suite(pytester.path, scan_suite("stat"), plan(op_section("stat", 8)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
         f"--storage-endpoint=root://{server.host}:{server.port}//storagescale",
         "--storage-version=5.5", "--storage-thresholds=thr", "--storage-results=out.json",
         f"--storage-cluster=slurm:{HOSTS}", "-v", "test_suite.py"],
        cwd=pytester.path, capture_output=True, text=True, timeout=400,
        env={**env, **batch.environment, "DASK_CONFIG": str(config)})
    output = done.stdout + done.stderr
    print(output)
    assert done.returncode == 0, output[-3000:]
    # the coordinator waits for the hosts without queue gets that time out (each one an
    # ERROR with a traceback from the in-process scheduler, in the user's terminal)
    assert "Exception while handling op" not in output, output[-3000:]
    addresses = sorted(h.address for h in network.hosts)
    assert re.search(rf"storagescale: cluster slurm:{HOSTS} \(scheduler tls://"
                     rf"{re.escape(network.head)}:\d+\): {HOSTS} client hosts", output), output
    rows = re.findall(r"^  host (\S+)\s+([\d.]+)\s+clients\s+(\d+)\s+succeeded\s+(\d+)", output,
                      re.M)
    assert sorted(r[1] for r in rows) == addresses and {r[2] for r in rows} == {"2"}, rows
    import json

    [step] = json.loads((pytester.path / "out.json").read_text())["steps"]
    assert step["executor"] == "cluster" and step["lost"] == 0
    assert sorted(h["address"] for h in step["hosts"]) == addresses
    assert sum(h["succeeded"] for h in step["hosts"]) == step["succeeded"] > 0
    deadline = time.monotonic() + 30
    while batch.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert batch.jobs() == []  # the session's end cancelled them


def test_kill_namespace_ends_what_runs_there():
    """What a job left running in a host's namespace is killed by the clean-up (a
    namespace of this test's own: held by one process, entered by another)."""
    why = netns_unavailable()
    if why is not None:
        pytest.skip(why)
    holder = subprocess.Popen(["unshare", "--net", "sleep", "300"], start_new_session=True)
    processes = [holder]
    try:
        deadline = time.monotonic() + 10
        mine = os.readlink("/proc/self/ns/net")
        while os.readlink(f"/proc/{holder.pid}/ns/net") == mine and time.monotonic() < deadline:
            time.sleep(0.05)  # unshare execs sleep once the namespace is made
        netns = f"/proc/{holder.pid}/ns/net"
        processes.append(subprocess.Popen(["nsenter", f"--net={netns}", "sleep", "300"],
                                          start_new_session=True))
        while os.readlink(f"/proc/{processes[1].pid}/ns/net") == mine \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kill_namespace(netns) == 2
        assert [p.wait(timeout=10) for p in processes] == [-9, -9]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
