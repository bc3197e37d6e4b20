"""A small SLURM cluster of the run's own: client hosts from a real batch system.

Sites run their load clients as batch jobs (glideTester ran the seeds' as HTCondor
glide-ins); ``--storage-cluster slurm:N`` has dask-jobqueue submit N Dask workers as
SLURM jobs. :class:`EmbeddedSlurm` starts such a batch system for a run on this
machine, from Debian's ``slurm-wlm`` and ``munge``:

- ``munged`` with a key made for the run (1024 random bytes, 0400 in a 0700 folder),
  its socket in that folder: only root's processes reach it (``munged --force``
  accepts a socket folder others cannot enter);
- ``slurmctld`` in a network namespace of its own (``controller``), where it listens
  on every address of that namespace (SLURM 22.05 has no setting that binds it to one
  address): reachable from the bridge and the hosts, from nowhere else;
- one ``slurmd`` per client host, each in its host's network namespace
  (``nsenter --net=``, which keeps this machine's ``/sys`` and its cgroup mounts), so
  that a batch job (``slurmstepd`` and the Dask worker it starts) runs in that
  namespace, on that host's address.

Every file (``slurm.conf``, state, spool, logs, the jobs' output) is under the run's
folder; the partition admits root's jobs only (``AllowGroups=root``).
:meth:`EmbeddedSlurm.jobqueue_config` is the Dask config's ``jobqueue.slurm`` section
that points dask-jobqueue at it: one worker (one thread) per job, one job per host
(``select/linear``), the worker on its host's address facing the scheduler, mutual TLS
with a certificate made for the run (dumped 0600 into a 0700 folder the jobs read).
:meth:`EmbeddedSlurm.stop` cancels the jobs, stops the daemons and kills what still
runs in the hosts' namespaces; the folder is the caller's to remove.

Needs root (the namespaces, SLURM's daemons as root). The namespaces themselves are
the caller's (the tests' :class:`netns.NamespaceCluster`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the commands the cluster needs (Debian: slurmctld, slurmd, slurm-client, munge)
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
#: the partition the jobs go to
PARTITION = "hosts"
#: seconds a SLURM command may take
COMMAND_TIMEOUT = 30.0
#: a job's worker finds its host's address facing the scheduler (the scheduler's address
#: substituted): the first ``src`` of ``ip route get``
_HOST_ADDRESS = ("STORAGESCALE_HOST=$(ip -o route get {head} | "
                 "sed -n 's/.* src \\([^ ]*\\).*/\\1/p')")


def missing_commands() -> list[str]:
    """The commands of :data:`COMMANDS` not on PATH (the Debian packages to install)."""
    from shutil import which

    return [name for name in COMMANDS if which(name) is None]


@dataclass(frozen=True)
class SlurmNode:
    """A host SLURM knows: its node name, its address, its network namespace."""

    name: str
    address: str
    #: a handle for ``nsenter --net=`` (``/run/netns/<name>`` or ``/proc/<pid>/ns/net``)
    netns: str


@dataclass
class EmbeddedSlurm:
    """munged, slurmctld (in ``controller``'s namespace) and a slurmd per node, with
    everything under ``directory``; ``scheduler_host`` is where the Dask scheduler
    listens (the bridge's address, v4 or v6)."""

    directory: Path
    nodes: list[SlurmNode]
    controller: SlurmNode
    scheduler_host: str
    start_timeout: float = 120.0
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    #: seconds from start() until every node was idle
    started_in: float = 0.0

    @property
    def conf(self) -> Path:
        return self.directory / "slurm" / "slurm.conf"

    @property
    def environment(self) -> dict[str, str]:
        """What a SLURM command (sbatch, squeue: dask-jobqueue's) needs to find it."""
        return {"SLURM_CONF": str(self.conf)}

    # -- start ---------------------------------------------------------------------
    def start(self) -> EmbeddedSlurm:
        began = time.monotonic()
        missing = missing_commands()
        if missing:
            raise RuntimeError(f"SLURM is not installed: {', '.join(missing)} missing "
                               f"(Debian: apt-get install slurmctld slurmd slurm-client "
                               f"munge; scripts/bootstrap.sh servers does)")
        try:
            self._private("munge")
            self._private("slurm")
            for name in ("state", "spool", "jobs", "dask-tls", "scratch"):
                self._private(f"slurm/{name}")
            for node in self.nodes:
                self._private(f"slurm/spool/{node.name}")
            self._start_munge()
            self.directory.chmod(0o700)
            handle = os.open(self.conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o600)  # read by root's daemons and commands only
            with open(handle, "w") as sink:
                sink.write(self._slurm_conf())
            self._spawn("slurmctld", ["nsenter", f"--net={self.controller.netns}",
                                      "slurmctld", "-D", "-f", str(self.conf)])
            for node in self.nodes:
                self._spawn(f"slurmd.{node.name}", [
                    "nsenter", f"--net={node.netns}", "slurmd", "-D", "-N", node.name,
                    "-f", str(self.conf)])
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _private(self, relative: str) -> Path:
        path = self.directory / relative
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.chmod(0o700)  # whatever the umask
        return path

    def _start_munge(self) -> None:
        folder = self.directory / "munge"
        key = folder / "munge.key"
        handle = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        with open(handle, "wb") as sink:
            sink.write(secrets.token_bytes(1024))
        self._spawn("munged", [
            "munged", "--foreground", "--force", f"--key-file={key}",
            f"--socket={folder / 'munge.socket'}", f"--log-file={folder / 'munged.log'}",
            f"--pid-file={folder / 'munged.pid'}", f"--seed-file={folder / 'munged.seed'}"])
        deadline = time.monotonic() + 30
        while not (folder / "munge.socket").exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged made no socket within 30 s: {self._tail('munged')}")
            time.sleep(0.1)

    def _slurm_conf(self) -> str:
        d = self.directory / "slurm"
        lines = [
            "# a SLURM cluster of one pytest-storagescale run (made by cluster/slurm.py)",
            "ClusterName=storagescale",
            f"SlurmctldHost={os.uname().nodename.split('.')[0]}({self.controller.address})",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.directory / 'munge' / 'munge.socket'}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'spool'}/%n/slurmd.pid",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'spool'}/%n/slurmd.log",
            # nothing of the machine's: no cgroups, accounting or MPI set-up
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/linear",  # a job takes a whole host: one worker per host
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            "MinJobAge=5",
            "KillWait=5",
        ]
        for node in self.nodes:
            lines.append(f"NodeName={node.name} NodeHostname={os.uname().nodename} "
                         f"NodeAddr={node.address} CPUs=1 RealMemory=1000 State=UNKNOWN")
        names = ",".join(node.name for node in self.nodes)
        lines.append(f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE "
                     f"State=UP AllowGroups=root")
        return "\n".join(lines) + "\n"

    def _spawn(self, name: str, command: list[str]) -> None:
        log = self.directory / "slurm" / f"{name}.out"
        with log.open("wb") as sink:
            self.processes[name] = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.directory,
                env={**os.environ, **self.environment})

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited ({process.returncode}) while SLURM "
                                   f"started: {self._tail(name)}")

    def _tail(self, name: str) -> str:
        log = self.directory / "slurm" / f"{name}.out"
        try:
            return " | ".join(log.read_text(errors="replace").strip().splitlines()[-6:])
        except OSError:
            return "(no output)"

    def command(self, *args: str, check: bool = True) -> str:
        """A SLURM client command against this cluster (its output)."""
        done = subprocess.run(list(args), capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT, env={**os.environ, **self.environment})
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.stdout}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        """Node name -> its state (``idle``, ``allocated``, ``down*``...)."""
        out = self.command("sinfo", "--noheader", "--Node", "--format=%N %t", check=False)
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            self._check_alive()
            states = self.node_states()
            if len(states) == len(self.nodes) and set(states.values()) == {"idle"}:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM nodes were not idle within {self.start_timeout:.0f} s: "
                           f"{states or 'slurmctld did not answer'}; slurmctld: "
                           f"{self._tail('slurmctld')}")

    # -- dask-jobqueue ----------------------------------------------------------------
    def jobqueue_config(self, *, python: str, memory: str = "8GiB",
                        walltime: str = "02:00:00") -> dict[str, Any]:
        """The Dask config's ``jobqueue.slurm`` section for this cluster (as
        ``dask.config.set({"jobqueue": {"slurm": ...}})`` or a jobqueue.yaml takes it)."""
        head = self.scheduler_host
        return {
            "cores": 1, "processes": 1, "memory": memory, "python": python,
            "queue": PARTITION, "walltime": walltime,
            # SLURM here tracks no memory (select/linear): no --mem line
            "job-directives-skip": ["--mem"],
            "log-directory": str(self.directory / "slurm" / "jobs"),
            # the workers' scratch space (else /tmp/dask-scratch-space, outside the run)
            "local-directory": str(self.directory / "slurm" / "scratch"),
            # where dask-jobqueue dumps the run's certificate for the jobs (0600 files)
            "shared-temp-directory": str(self.directory / "slurm" / "dask-tls"),
            "job-script-prologue": [
                _HOST_ADDRESS.format(head=head),
                "export DASK_DISTRIBUTED__WORKER__HTTP__ROUTES='[]'"],
            # the worker on its host's address (v4 or v6, as the scheduler's), its
            # page-less HTTP server on loopback
            "worker-extra-args": ["--host", "$STORAGESCALE_HOST", "--no-dashboard",
                                  "--dashboard-address", "127.0.0.1:0"],
            "scheduler-options": {"host": head, "dashboard_address": "127.0.0.1:0"},
            "death-timeout": 60,
        }

    def jobs(self) -> list[str]:
        """``jobid node state`` of every job the controller knows."""
        return [line.strip() for line in self.command(
            "squeue", "--noheader", "--format=%i %N %T", check=False).splitlines()
            if line.strip()]

    # -- stop ------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel every job, stop the daemons, kill what still runs in the hosts'
        namespaces (a job's processes). Safe to call twice."""
        if self.processes.get("slurmctld") is not None and \
                self.processes["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.command("scancel", "--full", f"--partition={PARTITION}", check=False)
                deadline = time.monotonic() + 15
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.3)
        order = [n for n in self.processes if n.startswith("slurmd.")] + ["slurmctld",
                                                                          "munged"]
        for name in order:
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        for node in self.nodes:
            kill_namespace(node.netns)
        self.processes.clear()


def _namespace_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def kill_namespace(netns: str, rounds: int = 5) -> int:
    """SIGKILL every process in the network namespace ``netns`` (the run's own: a
    host's, where only its slurmd and jobs run); how many were killed."""
    try:
        target = os.stat(netns).st_ino
    except OSError:
        return 0
    killed = 0
    for _ in range(rounds):
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()
                and int(p) != os.getpid() and _namespace_of(int(p)) == target]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.2)
    return killed
