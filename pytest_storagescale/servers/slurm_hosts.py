"""``--storage-cluster embedded-slurm:N``: client hosts from a SLURM cluster started for
the run, its Dask workers submitted as SLURM batch jobs by dask-jobqueue.

The batch system is :class:`~pytest_storagescale.cluster.slurm.EmbeddedSlurm` (Debian's
``slurm-wlm`` and ``munge``: ``munged`` with a key made for the run, ``slurmctld``, one
``slurmd`` per host); this module gives it its hosts and runs it for a session:

- N client hosts, each a network namespace with its own address on a private /24, and
  one more namespace that holds the bridge and runs ``slurmctld`` (``.254``). None is
  named (``ip netns add`` would leave ``/run/netns`` entries): each is held by an
  ``unshare --net sleep infinity`` process started in the run's folder, so the kernel
  removes it, its veth ends and the bridge with its last process (:mod:`.netns`);
- this machine's end of a veth to the bridge (``.1``) is where the Dask scheduler (in
  the pytest process) listens, with mutual TLS on a certificate made for the run; the
  hosts' default route leads there, so a job reaches the addresses of this machine
  (not its loopback, which is each namespace's own; nothing beyond: this module
  changes no forwarding or NAT setting of the machine);
- ``SLURMCluster`` submits N jobs (``select/linear``: one per host), each a Dask
  worker of one thread bound to its host's address; ``sbatch``/``scancel`` find the
  run's controller by ``SLURM_CONF`` on their own command line (the process's
  environment is left alone).

Everything (munge key 0400 and socket, ``slurm.conf``, state, spool, logs, the jobs'
scripts, output, working and scratch folders, the dumped TLS files 0600) lives in a
0700 folder from :func:`~.orphans.server_directory`: a pytest killed with SIGKILL
leaves its daemons, holders and jobs to the next run's orphan cleaner, which finds
them by that folder. :meth:`EmbeddedSlurmHosts.stop` cancels the jobs, stops the
daemons, kills what still runs in the namespaces, waits for the namespaces to go and
removes the folder.

A server on namespace hosts of its own in the same process (the dCache over several
hosts, :mod:`.dcache_hosts`) offers its door host (:func:`offer_door`): each run's
bridge gets one more port, a veth whose other end is in the door host's namespace
(``.253``, ``.252``... of the run's /24), and every client host a route to the door's
client-side address through it (a ``/32``, nothing else). Only the door host is
linked, and no namespace forwards (a new namespace's ``ip_forward`` is 0, this
machine's is left as it is): the pools' movers, on the server's own bridge, stay out
of the client hosts' reach.

Needs root (namespaces; SLURM's daemons run as root, the partition admits root's jobs
only). What is missing is one paragraph, exit 4, before any load.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cluster.address import ClusterAddress, parse_cluster_address
from ..cluster.slurm import COMMANDS as SLURM_COMMANDS
from ..cluster.slurm import EmbeddedSlurm, SlurmNode, kill_namespace
from ..errors import StorageScaleUsageError
from .netns import (
    free_subnet,
    handle,
    hold,
    ip,
    join_bridge,
    link_to_bridge,
    make_bridge,
    rss_by_namespace,
)
from .orphans import server_directory

#: the recipe's name in ``--storage-cluster``
RECIPE = "embedded-slurm"
#: the commands it needs besides SLURM's and munge's (iproute2, util-linux)
COMMANDS = (*SLURM_COMMANDS, "ip", "nsenter", "unshare")
#: client hosts at most (``.2`` to ``.(1 + N)`` of the run's /24; the controller is .254)
MAX_HOSTS = 64
#: seconds for SLURM to come up (every node idle)
START_TIMEOUT = 120.0
#: seconds for every worker job to run and join the scheduler (after SLURM is up)
JOBS_TIMEOUT = 300.0
_PACKAGES = "slurmctld slurmd slurm-client munge"
_INSTEAD = ("or give --storage-cluster slurm:N with your site's SLURM configured in the "
            "Dask config's jobqueue.slurm section, or leave --storage-cluster out")


def missing_commands() -> list[str]:
    return [name for name in COMMANDS if shutil.which(name) is None]


def check_usable(text: str, *, embedded_endpoint: bool, endpoint_host: str | None,
                 embedded_on_hosts: bool = False) -> None:
    """Before any load: what ``--storage-cluster embedded-slurm:N`` needs is here (the
    commands, root) and its hosts can reach the endpoint. One paragraph otherwise.

    ``embedded_on_hosts``: the embedded server runs on namespace hosts whose door host
    offers itself to the client hosts (:func:`offer_door`: the dCache over several
    hosts), which the client hosts reach; any other embedded server listens on this
    machine's loopback, which they cannot."""
    address = parse_cluster_address(text)
    if address.recipe != RECIPE:
        return
    if address.hosts > MAX_HOSTS:
        raise StorageScaleUsageError(
            f"--storage-cluster {text}: the embedded SLURM cluster has at most {MAX_HOSTS} "
            f"client hosts (one /24 of namespaces); give {RECIPE}:{MAX_HOSTS} or fewer, "
            f"{_INSTEAD}.")
    missing = missing_commands()
    if missing:
        raise StorageScaleUsageError(
            f"--storage-cluster {text} starts a SLURM cluster for the run, and "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on PATH. "
            f"Install Debian's {_PACKAGES} (and iproute2, util-linux): apt-get install "
            f"{_PACKAGES}, as 'scripts/bootstrap.sh servers' does; {_INSTEAD}.")
    if os.geteuid() != 0:
        raise StorageScaleUsageError(
            f"--storage-cluster {text} makes its client hosts as network namespaces and "
            f"runs SLURM's daemons as root, which needs root (this process runs as uid "
            f"{os.geteuid()}); run as root (as the CI does), {_INSTEAD}.")
    if embedded_endpoint and not embedded_on_hosts:
        raise StorageScaleUsageError(
            f"--storage-cluster {text}: its client hosts are network namespaces, and the "
            f"embedded servers listen on this machine's loopback only, which a namespace "
            f"cannot reach. Give --storage-endpoint a server that listens on an address of "
            f"this machine other than loopback, or the embedded dCache over several hosts "
            f"(--storage-embedded dcache --storage-embedded-hosts 4), whose door host is "
            f"linked to the client hosts, {_INSTEAD}.")
    if endpoint_host is not None and _is_loopback(endpoint_host):
        raise StorageScaleUsageError(
            f"--storage-cluster {text}: its client hosts are network namespaces, whose "
            f"loopback is their own: they cannot reach the endpoint at {endpoint_host}. "
            f"Give --storage-endpoint this machine's address on another interface (the "
            f"server listening there), {_INSTEAD}.")


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerDoor:
    """A server's door host to link to the client hosts: the process holding its
    namespace, and its client-side addresses (the doors' URLs name them)."""

    pid: int
    addresses: tuple[str, ...]


#: doors offered by servers of this process, and the client hosts started (each links
#: every door, whichever started first)
_DOORS: list[ServerDoor] = []
_RUNNING: list[EmbeddedSlurmHosts] = []
_LINKING = threading.Lock()
#: the doors' addresses on a run's bridge, from .253 down (the hosts end at .65)
FIRST_DOOR, MAX_DOORS = 253, 8


def offer_door(door: ServerDoor) -> None:
    """Link ``door`` to the client hosts of every run of this process, now and to
    those started later (until :func:`withdraw_door`)."""
    with _LINKING:
        _DOORS.append(door)
        for hosts in _RUNNING:
            hosts.link_door(door)


def withdraw_door(door: ServerDoor) -> None:
    """The client hosts' routes to ``door`` removed (its veth goes with its namespace)."""
    with _LINKING:
        with contextlib.suppress(ValueError):
            _DOORS.remove(door)
        for hosts in _RUNNING:
            hosts.unlink_door(door)


class EmbeddedSlurmHosts:
    """The namespaces, the bridge and the SLURM cluster of one run."""

    def __init__(self, hosts: int, *, start_timeout: float = START_TIMEOUT) -> None:
        self.host_count = hosts
        self.start_timeout = start_timeout
        self.directory: Path | None = None
        self.subnet: ipaddress.IPv4Network | None = None
        self.holders: dict[str, subprocess.Popen] = {}
        self.nodes: list[SlurmNode] = []
        self.controller: SlurmNode | None = None
        self.slurm: EmbeddedSlurm | None = None
        #: the run's veths are named sl<tag>h (this machine's end), sl<tag>p<i>/c<i>
        self.tag = secrets.token_hex(3)
        #: seconds: namespaces made, then SLURM's nodes idle (from the start)
        self.timings: dict[str, float] = {}
        #: the doors linked to the bridge: door -> its veth's address on the bridge
        self.doors: dict[ServerDoor, str] = {}

    @property
    def head(self) -> str:
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def start(self) -> EmbeddedSlurmHosts:
        began = time.monotonic()
        try:
            self.start_network()
            self.timings["network"] = time.monotonic() - began
            assert self.controller is not None and self.directory is not None
            self.slurm = EmbeddedSlurm(self.directory / "run", self.nodes, self.controller,
                                       scheduler_host=self.head,
                                       start_timeout=self.start_timeout)
            self.slurm.start()
            self.timings["slurm"] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        return self

    def start_network(self) -> None:
        """The run's folder, the namespaces and the bridge, every offered door linked
        (SLURM not started: :meth:`start` does)."""
        self.directory = server_directory("slurm")
        self._network()
        with _LINKING:
            _RUNNING.append(self)
            for door in _DOORS:
                self.link_door(door)

    def _hold(self, name: str) -> int:
        """A new network namespace, held by a process in the run's folder: its pid."""
        assert self.directory is not None
        self.holders[name] = hold(self.directory, name, timeout=10.0)
        return self.holders[name].pid

    def _network(self) -> None:
        subnet = self.subnet = free_subnet()
        controller = str(subnet.network_address + 254)
        switch = self._hold("controller")
        self.controller = SlurmNode("controller", controller, handle(switch))
        make_bridge(switch, f"{controller}/24")
        link_to_bridge(switch, f"sl{self.tag}h", f"sl{self.tag}s", f"{self.head}/24")
        for index in range(self.host_count):
            name, address = f"ns{index}", str(subnet.network_address + 2 + index)
            host = self._hold(name)
            join_bridge(switch, host, f"sl{self.tag}p{index}", f"sl{self.tag}c{index}",
                        f"{address}/24")
            ip("route", "add", "default", "via", self.head, netns=handle(host))
            self.nodes.append(SlurmNode(name, address, handle(host)))

    def link_door(self, door: ServerDoor) -> None:
        """A veth from the bridge into the door host's namespace (an address of the
        run's /24 there), and each client host's route to the door's addresses through
        it: one /32 each, not the server's networks."""
        assert self.subnet is not None and self.controller is not None
        if door in self.doors or not os.path.exists(handle(door.pid)):
            return  # linked already, or its server ended without withdrawing it
        index = len(self.doors)
        if index >= MAX_DOORS:
            raise RuntimeError(f"more than {MAX_DOORS} doors offered to the client hosts")
        via = str(self.subnet.network_address + FIRST_DOOR - index)
        join_bridge(self.holders["controller"].pid, door.pid, f"sl{self.tag}d{index}",
                    f"sl{self.tag}e{index}", f"{via}/24", loopback=False)
        self.doors[door] = via
        for node in self.nodes:
            for address in door.addresses:
                if ipaddress.ip_address(address).version == 4:
                    ip("route", "replace", f"{address}/32", "via", via, netns=node.netns)

    def unlink_door(self, door: ServerDoor) -> None:
        """The client hosts' routes to ``door`` removed (best effort: its namespace
        may be gone, with its veth)."""
        via = self.doors.pop(door, None)
        if via is None:
            return
        for node in self.nodes:
            for address in door.addresses:
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    ip("route", "del", f"{address}/32", "via", via, netns=node.netns)

    # -- the Dask side ------------------------------------------------------------------
    def dask_cluster(self, jobs: int) -> Any:
        """dask-jobqueue's SLURMCluster on this batch system, ``jobs`` worker jobs
        submitted (one per host), its scheduler on :attr:`head` with mutual TLS."""
        import dask
        from dask_jobqueue import SLURMCluster
        from dask_jobqueue.slurm import SLURMJob

        from ..cluster.hosts import NO_HTTP_ROUTES, run_security

        assert self.slurm is not None
        conf = shlex.quote(str(self.slurm.conf))
        job = type("EmbeddedSlurmJob", (SLURMJob,), {
            "submit_command": f"env SLURM_CONF={conf} sbatch",
            "cancel_command": f"env SLURM_CONF={conf} scancel"})
        cluster_class = type("SLURMCluster", (SLURMCluster,), {"job_cls": job})
        settings = self.slurm.jobqueue_config(python=sys.executable)
        # each job works in the run's folder (sbatch's default: this process's)
        settings["job-extra-directives"] = [
            f"--chdir={self.slurm.directory / 'slurm' / 'jobs'}"]
        kwargs = {key.replace("-", "_"): value for key, value in settings.items()}
        with dask.config.set(NO_HTTP_ROUTES):
            cluster = cluster_class(security=run_security(), **kwargs)
        cluster.scale(jobs=jobs)
        return cluster

    # -- what it is ---------------------------------------------------------------------
    def memory_by_host(self) -> dict[str, int]:
        """Resident bytes of everything in each client host's namespace (its slurmd,
        a job's slurmstepd, shell and Dask worker)."""
        return rss_by_namespace({node.name: node.netns for node in self.nodes})

    def jobs(self) -> list[tuple[str, str, str]]:
        """(job id, node, state) of every job SLURM knows."""
        if self.slurm is None:
            return []
        return [tuple(line.split()[:3]) for line in self.slurm.jobs()  # type: ignore[misc]
                if len(line.split()) >= 3]

    def stop(self) -> None:
        """Cancel the jobs, stop the daemons, kill what runs in the namespaces, let the
        namespaces go (their holders killed) and remove the folder. Safe twice."""
        with _LINKING:
            if self in _RUNNING:
                _RUNNING.remove(self)
        self.doors.clear()
        if self.slurm is not None:
            with contextlib.suppress(Exception):
                self.slurm.stop()
        for name, holder in list(self.holders.items()):
            netns = handle(holder.pid)
            if holder.poll() is None and name != "controller":
                kill_namespace(netns)  # a job's processes, then the holder itself
            if holder.poll() is None:
                holder.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                holder.wait(timeout=10)
        self.holders.clear()
        deadline = time.monotonic() + 10  # the veths go with the namespaces they are in
        while self._own_links() and time.monotonic() < deadline:
            time.sleep(0.1)
        for link in self._own_links():  # a start that failed before it moved them
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


    def _own_links(self) -> list[str]:
        """This run's veth ends still in this machine's namespace."""
        listed = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                                timeout=30).stdout
        return [name for name in re.findall(r"^\d+: ([^:@]+)", listed, re.M)
                if name.startswith(f"sl{self.tag}")]


class EmbeddedSlurmCluster:
    """What ``--storage-cluster embedded-slurm:N`` connects to: dask-jobqueue's
    SLURMCluster on the run's own SLURM; closing it stops both."""

    def __init__(self, hosts: EmbeddedSlurmHosts, cluster: Any) -> None:
        self.hosts = hosts
        #: dask-jobqueue's cluster (what a distributed Client connects to)
        self.dask_cluster = cluster

    @property
    def security(self) -> Any:
        return self.dask_cluster.security

    def header_lines(self, joined_in: float | None = None) -> list[str]:
        """The batch system: where it runs, how long it took, its jobs, each host's
        memory (measured now)."""
        hosts = self.hosts
        slurm_up = hosts.timings.get("slurm", 0.0)
        joined = f", {len(hosts.nodes)} worker jobs joined {joined_in:.1f} s later" \
            if joined_in is not None else ""
        assert hosts.controller is not None and hosts.directory is not None
        lines = [f"storagescale: embedded SLURM for this run: controller "
                 f"{hosts.controller.address}, {len(hosts.nodes)} client hosts (network "
                 f"namespaces), up in {slurm_up:.1f} s{joined}; folder {hosts.directory}"]
        memory = hosts.memory_by_host()
        on = {node: (job, state) for job, node, state in hosts.jobs()}
        workers = self._worker_names()
        for node in hosts.nodes:
            job, state = on.get(node.name, ("-", "no job"))
            lines.append(f"  slurm node {node.name} {node.address}: job {job} {state}, "
                         f"Dask worker {workers.get(node.address, '-')}, "
                         f"memory {memory.get(node.name, 0) / 1e6:.0f} MB")
        return lines

    def _worker_names(self) -> dict[str, str]:
        """Host address -> the name of the Dask worker there (the scheduler's view)."""
        try:
            workers = dict(self.dask_cluster.scheduler_info.get("workers") or {})
        except Exception:  # noqa: BLE001 - a header line, not a reason to stop
            return {}
        return {str(info.get("host")): str(info.get("name")) for info in workers.values()}

    def close(self) -> None:
        try:
            self.dask_cluster.close()
        finally:
            for name in ("_job_ca_file", "_job_cert", "_job_key"):
                with contextlib.suppress(OSError, AttributeError):
                    dumped = getattr(self.dask_cluster, name, None)
                    if dumped is not None:
                        dumped.close()
            self.hosts.stop()


def start_cluster(address: ClusterAddress) -> EmbeddedSlurmCluster:
    """The recipe's starter (:func:`~pytest_storagescale.cluster.hosts.register_recipe`):
    the namespaces and SLURM up, then the worker jobs submitted; a start that fails is
    one paragraph naming what did."""
    check_usable(str(address), embedded_endpoint=False, endpoint_host=None)
    hosts = EmbeddedSlurmHosts(address.hosts, start_timeout=START_TIMEOUT)
    try:
        hosts.start()
        return EmbeddedSlurmCluster(hosts, hosts.dask_cluster(address.hosts))
    except StorageScaleUsageError:
        hosts.stop()
        raise
    except Exception as exc:  # noqa: BLE001 - a daemon, a command or Dask
        hosts.stop()
        raise StorageScaleUsageError(
            f"--storage-cluster {address}: the run's SLURM cluster did not start: "
            f"{' '.join(str(exc).split())[:600]}. Its daemons' logs were in the run's "
            f"folder (removed); run 'munged', 'slurmctld -D' and 'slurmd -D' by hand to "
            f"see their errors, {_INSTEAD}.") from None
