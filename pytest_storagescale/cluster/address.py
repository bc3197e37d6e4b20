"""What ``--storage-cluster`` may name (parsed without importing Dask).

- a running scheduler: ``tcp://host:8786`` (also ``tls://``, ``ws://``, ``wss://``);
- ``local:N``: a Dask ``LocalCluster`` of N worker processes on this machine (a test
  cluster: every "host" is this one);
- ``embedded-slurm:N``: a SLURM cluster started for the run (N client hosts as network
  namespaces of this machine, :mod:`pytest_storagescale.servers.slurm_hosts`), its N
  workers submitted as SLURM jobs by dask-jobqueue;
- ``NAME:N``: N workers started as batch jobs by dask-jobqueue, NAME one of its
  cluster kinds (``htcondor``, ``slurm``, ``pbs``, ``sge``, ``lsf``, ``oar``,
  ``moab``), configured in the Dask config's ``jobqueue.NAME`` section (cores,
  memory, queue, job extra directives...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import StorageScaleUsageError

#: schemes of a Dask scheduler address
SCHEDULER_SCHEMES = ("tcp", "tls", "ws", "wss")
#: the dask-jobqueue cluster classes by recipe name
JOBQUEUE_KINDS = {
    "htcondor": "HTCondorCluster", "slurm": "SLURMCluster", "pbs": "PBSCluster",
    "sge": "SGECluster", "lsf": "LSFCluster", "oar": "OARCluster", "moab": "MoabCluster",
}
#: started for the run by the plugin (a starter registered with cluster/hosts.py)
EMBEDDED_RECIPES = ("embedded-slurm",)
RECIPES = ("local", *EMBEDDED_RECIPES, *JOBQUEUE_KINDS)
_HINT = ("Write a scheduler address, e.g. --storage-cluster tcp://head.example.org:8786, "
         "or a recipe with its number of hosts: local:4 (worker processes on this machine), "
         "embedded-slurm:2 (SLURM jobs on namespace hosts of this machine, started for the "
         "run), "
         f"{', '.join(f'{k}:20' for k in JOBQUEUE_KINDS)} (batch jobs through dask-jobqueue, "
         "configured in the Dask config's jobqueue.<name> section).")


@dataclass(frozen=True)
class ClusterAddress:
    """A parsed ``--storage-cluster`` value: a scheduler, or a recipe and its hosts."""

    text: str
    scheduler: str | None = None
    recipe: str | None = None
    hosts: int = 0

    def __str__(self) -> str:
        return self.text


def parse_cluster_address(value: str) -> ClusterAddress:
    """``tcp://host:port`` or ``<recipe>:<hosts>``; anything else is a usage error."""
    text = str(value).strip()
    scheme, sep, rest = text.partition("://")
    if sep:
        if scheme.lower() not in SCHEDULER_SCHEMES or not re.fullmatch(
                r"\[?[\w.:-]+\]?:\d{1,5}", rest):
            raise StorageScaleUsageError(
                f"--storage-cluster: {value!r} is not a Dask scheduler address "
                f"(scheme {'/'.join(SCHEDULER_SCHEMES)}, then host:port). {_HINT}")
        return ClusterAddress(text, scheduler=text)
    match = re.fullmatch(r"([a-z]+(?:-[a-z]+)?)(?::(\d+))?", text.lower())
    if match is None or match.group(1) not in RECIPES:
        raise StorageScaleUsageError(f"--storage-cluster: unknown cluster {value!r}. {_HINT}")
    hosts = int(match.group(2) or 0)
    if not 1 <= hosts <= 10_000:
        raise StorageScaleUsageError(
            f"--storage-cluster: {value!r} needs its number of hosts (1 to 10000), e.g. "
            f"{match.group(1)}:4. {_HINT}")
    return ClusterAddress(text, recipe=match.group(1), hosts=hosts)


def under_xdist_refusal(address: ClusterAddress) -> str:
    """Why a recipe cannot run under pytest -n (one paragraph)."""
    return (f"--storage-cluster {address}: under pytest -n every worker would start its own "
            f"cluster. Start it once (dask scheduler / dask worker, or dask-jobqueue) and "
            f"give its scheduler address, e.g. --storage-cluster tcp://head:8786, or run "
            f"without -n.")


def refuse_recipe_under_xdist(text: str) -> None:
    """On the xdist controller, before its workers start: a recipe is one paragraph,
    exit 4 (each worker would start a cluster, and say so in a traceback)."""
    address = parse_cluster_address(text)
    if address.recipe is not None:
        raise StorageScaleUsageError(under_xdist_refusal(address))
