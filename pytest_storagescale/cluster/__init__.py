"""Load steps whose clients run on many hosts, on a Dask distributed cluster.

``--storage-cluster ADDRESS`` names a running Dask scheduler (``tcp://host:8786``) or a
recipe that starts one (``local:4``, ``htcondor:20``, ``slurm:20``: see
:mod:`.address`). Each step's clients are split over the cluster's hosts; every host
runs its share with the engine's own client threads (:func:`~pytest_storagescale.load.
clients.run_clients`) from one common start time, and the coordinator merges the hosts'
measurements into one step (:mod:`.coordinator`).

This package imports Dask only when a cluster is used: :mod:`.address` (parsing the
option) and :mod:`.breakdown` (the per-host records) are light.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .address import parse_cluster_address
from .breakdown import HostResult, breakdown_lines

if TYPE_CHECKING:
    from ..load.plan import StepPlan, StepProgress
    from ..load.stats import StepResult

__all__ = ["HostResult", "breakdown_lines", "disconnect", "header_lines",
           "parse_cluster_address", "run_cluster_step"]


def run_cluster_step(address: str, plan: StepPlan,
                     progress: Callable[[StepProgress], None] | None = None, *,
                     clients_per_host: int = 0, observe=None) -> StepResult:
    """Measure ``plan`` on the cluster at ``address``; the result holds the per-host
    breakdown (``hosts``, ``lost``). See :func:`.coordinator.run_cluster_step`."""
    from .coordinator import run_cluster_step as run

    return run(address, plan, progress, clients_per_host=clients_per_host, observe=observe)


def disconnect() -> None:
    """Close this process's cluster connections (a recipe's cluster stops with them)."""
    from .hosts import disconnect as close_all

    close_all()


def header_lines(address: str | None) -> list[str]:
    """The pytest header's lines naming the cluster, its hosts and their clock offsets
    (nothing without a cluster)."""
    if not address:
        return []
    from .hosts import cluster_header

    return cluster_header(address)
