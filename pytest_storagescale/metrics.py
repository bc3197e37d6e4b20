"""The metrics a thresholds rule may name.

Two kinds: :data:`MEASURED`, which every load step has (a mixed step has them per
side too: ``readers.mb_s``), and *derived* metrics, which a suite computes from
several steps (``mix_ratio`` compares a mixed step with separate ones). The core's
derived metrics are registered here; a suite registers its own (the ceph suite's
``hot_ratio``) with :func:`register_metric` from its ``pytest_storagescale_metrics``
hook, which runs before any thresholds file is loaded: rules are checked against
:func:`known_metrics` when a file is read.
"""

from __future__ import annotations

from .registry import RegistrationError, Registry, Scope

__all__ = ["MEASURED", "STEP_MEASURED", "known_metrics", "metric_description",
           "register_metric"]

#: metrics every step has, computed from its measurement (per side, too); ``throttled``
#: counts operations the storage told to come back later (HTTP 429, or 503 with
#: ``Retry-After``) past their deadline: neither ``succeeded`` nor ``failed``;
#: ``redirects``, the redirects the clients followed (a dCache door to its pools), and
#: ``door_latency_s``, the mean seconds a redirected request spent at the door, both
#: over the whole step (warm-up included)
MEASURED: tuple[str, ...] = (
    "rate_hz", "rate_per_min", "mb_s", "mbit_s", "succeeded", "failed", "hung",
    "throttled", "redirects", "door_latency_s", "error_ratio", "mean_s", "p50_s", "p90_s",
    "p99_s", "max_s",
    *("offered_hz", "achieved_hz", "dropped", "late"),
)
#: of these, an open-loop step's own (``arrival_rate``): the offered rate, the achieved
#: one (``rate_hz``), the requests dropped at the cap on requests in flight and those
#: sent late (0 for a closed loop); its ``p50_s``... are response times, from each
#: request's intended start (load/open_loop.py)
OPEN_LOOP: tuple[str, ...] = ("offered_hz", "achieved_hz", "dropped", "late")
#: metrics of the whole step only (no side): ``client_cpu``, the client processes'
#: CPU (user + system) over the measured window as a fraction of the cores they may
#: use (1: the client host was saturated, and measured itself); ``lost``, the clients
#: of client hosts lost mid-step (a --storage-cluster step; 0 on one host)
#: ``server_cpu``, ``server_threads``, ``server_connections``: the embedded server's
#: processes over the window (CPU per core, the most threads and TCP connections);
#: ``server_ops``, the requests the server counted over the load (XRootD's summary
#: monitoring); NaN when the server's side was not measured (load/server_monitor.py)
STEP_MEASURED: tuple[str, ...] = ("client_cpu", "lost", "server_cpu", "server_ops",
                                  "server_threads", "server_connections")

#: derived metric name -> its description (pytest_storagescale/registry.py); a
#: registry, not a pytest stash, because thresholds files are parsed outside any pytest
#: config; every xdist worker registers its own
DERIVED: Registry[str] = Registry(
    "derived metric", adder="register_metric", pattern=r"[A-Za-z]\w*", name_attr=None,
    name_hint="Use letters, digits and underscores, starting with a letter, e.g. "
              "'hot_ratio'.", identity=repr)


def register_metric(name: str, description: str, *, replace: bool = False,
                    scope: Scope | None = None) -> None:
    """Let thresholds rules name the derived metric ``name`` (in ``scope`` only: what a
    session's ``pytest_storagescale_metrics`` hook gives).

    Registering a name again with the same description does nothing; another
    description is refused unless ``replace`` is true. Measured metrics cannot be
    replaced.
    """
    if name in MEASURED or name in STEP_MEASURED:
        raise RegistrationError(
            f"register_metric: {name!r} is a measured metric of every step; choose "
            f"another name for a derived metric."
        )
    DERIVED.add(description, name=name, replace=replace, scope=scope)


def known_metrics() -> tuple[str, ...]:
    """The measured metrics, then the derived ones in registration order."""
    return (*MEASURED, *STEP_MEASURED, *DERIVED.names())


def metric_description(name: str) -> str:
    """A derived metric's description; empty for a measured or unknown one."""
    return DERIVED.get(name) if name in DERIVED else ""


for _name, _description in (
    ("mix_ratio", "mixed step's total MB/s over the separate read and write steps' sum"),
    ("recovery_s", "seconds from the overload's end until the rate was back (inf: never)"),
    ("mb_s_mean", "mean MB/s over a section's tries"),
    ("mb_s_stddev", "population standard deviation of MB/s over a section's tries"),
    ("rate_hz_mean", "mean operations per second over a section's tries"),
    ("rate_hz_stddev", "population standard deviation of the rate over a section's tries"),
):
    register_metric(_name, _description)
