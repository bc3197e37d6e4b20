"""The cluster's client hosts: connecting to (or starting) the Dask cluster, and each
host's clock offset.

One :class:`ClusterConnection` per process and address (a session's steps reuse it).
Before every step the coordinator asks each worker for its clock a few times over
(:meth:`ClusterConnection.hosts`): the offset is the worker's time minus the middle of
the round trip, known to +- half of it; the round with the shortest trip counts. A
host whose offset exceeds :data:`MAX_CLOCK_OFFSET_S` is refused before the load starts.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import resource
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import StorageError, StorageScaleUsageError
from .address import (
    EMBEDDED_RECIPES,
    JOBQUEUE_KINDS,
    ClusterAddress,
    parse_cluster_address,
    under_xdist_refusal,
)

#: the largest clock offset a client host may have (seconds): beyond it, the hosts'
#: windows cannot be trusted to line up (every host's clock should be NTP-synchronized)
MAX_CLOCK_OFFSET_S = 0.5
#: a test hook: seconds a worker adds to its clock when it reports it (a host whose
#: clock is off, without changing the system clock)
CLOCK_SKEW_ENV = "STORAGESCALE_TEST_CLOCK_SKEW_S"
#: how long a recipe may take to bring up its hosts (batch jobs queue)
RECIPE_START_TIMEOUT = {"local": 120.0, "embedded-slurm": 300.0}
JOBQUEUE_START_TIMEOUT = 1800.0
_CONNECT_TIMEOUT = 30.0
_TLS_HINT = ("Give this process the cluster's client certificate in the Dask config: "
             "distributed.comm.tls.ca-file, distributed.comm.tls.client.cert and "
             "distributed.comm.tls.client.key (e.g. $DASK_DISTRIBUTED__COMM__TLS__CA_FILE, "
             "..._CLIENT__CERT, ..._CLIENT__KEY), the files the scheduler and workers were "
             "started with (--tls-ca-file, --tls-cert, --tls-key).")
_ROUNDS = 3


def host_clock() -> float:
    """This host's wall clock as a worker reports it (with the test hook's skew)."""
    return time.time() + clock_skew()


def clock_skew() -> float:
    try:
        return float(os.environ.get(CLOCK_SKEW_ENV) or 0.0)
    except ValueError:
        return 0.0


def peak_rss_mb() -> float:
    """This process's peak resident memory (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


@dataclass(frozen=True)
class ClusterHost:
    """One Dask worker: a client host."""

    worker: str
    name: str
    address: str
    threads: int
    clock_offset_s: float = 0.0
    clock_uncertainty_s: float = 0.0

    def describe(self) -> str:
        return (f"{self.name} {self.address} (clock {self.clock_offset_s * 1e3:+.1f} ms "
                f"+- {self.clock_uncertainty_s * 1e3:.1f} ms)")


class ClusterError(StorageError):
    """The cluster cannot run the step (no hosts, a clock off, too few hosts)."""

    def __init__(self, message: str, *, address: str) -> None:
        super().__init__(message, driver="cluster", endpoint=address, operation="cluster",
                         path="-", error_class="cluster")
        self.message = message

    def __str__(self) -> str:
        return self.message


class ClusterConnection:
    """A Dask client of the cluster at ``address`` (and the cluster, when a recipe
    started it here)."""

    def __init__(self, address: ClusterAddress) -> None:
        from distributed import Client

        began = time.monotonic()
        self.address = address
        self.cluster: Any = None
        #: seconds from the cluster's start (a recipe's) until its hosts joined
        self.joined_in: float | None = None
        if address.scheduler is not None:
            target: Any = address.scheduler
        else:
            if os.environ.get("PYTEST_XDIST_WORKER"):
                raise StorageScaleUsageError(under_xdist_refusal(address))
            self.cluster = _started_recipe(address)
            # a starter's wrapper holds the Dask cluster object the Client connects to
            target = getattr(self.cluster, "dask_cluster", self.cluster)
        # a cluster started here has its own certificate; a scheduler given by address
        # one registered by who started it (the embedded CephFS), else the Dask
        # config's TLS settings (distributed.comm.tls.*), as the dask tools read them
        security = (getattr(self.cluster, "security", None) if self.cluster is not None
                    else security_for(str(address.scheduler)))
        # a Client of an earlier refused start in this process is closed by its __del__
        # when the garbage collector finds it, and distributed's LoopRunner takes one lock
        # (a class attribute, not re-entrant) that this start holds: found during it, the
        # start waited for ever (seen in tests/test_cluster_security.py). Collect it first.
        gc.collect()
        try:
            self.client = Client(target, timeout=_CONNECT_TIMEOUT, set_as_default=False,
                                 security=security)
        except TypeError as exc:  # a tls:// address and no certificate to present
            self._close_cluster()
            raise StorageScaleUsageError(
                f"--storage-cluster {address}: the scheduler speaks TLS and this process "
                f"has no certificate to present ({exc}). {_TLS_HINT}") from None
        except OSError as exc:
            self._close_cluster()
            hint = _TLS_HINT if "TLS" in str(exc) or str(address).startswith("tls") else (
                "Start one ('dask scheduler' on the head node, 'dask worker "
                "tcp://head:8786' on each client host) or fix the address.")
            raise StorageScaleUsageError(
                f"--storage-cluster {address}: no Dask scheduler answered within "
                f"{_CONNECT_TIMEOUT:.0f} s ({exc}). {hint}") from None
        if address.recipe is not None:
            try:
                self._wait_for_hosts(address.hosts)
            except BaseException:  # its jobs cancelled, its daemons stopped: not left
                self.close()
                raise
            self.joined_in = time.monotonic() - began

    @property
    def scheduler(self) -> str:
        return self.client.scheduler.address

    def _wait_for_hosts(self, count: int) -> None:
        timeout = RECIPE_START_TIMEOUT.get(self.address.recipe or "", JOBQUEUE_START_TIMEOUT)
        try:
            self.client.wait_for_workers(count, timeout=timeout)
        except TimeoutError:
            raise StorageScaleUsageError(
                f"--storage-cluster {self.address}: only {len(self._workers())} of {count} "
                f"hosts joined within {timeout:.0f} s. For batch jobs, check the queue "
                f"(condor_q / squeue) and the Dask config's jobqueue."
                f"{self.address.recipe} section.") from None

    def _workers(self) -> dict[str, dict[str, Any]]:
        return dict(self.client.scheduler_info(n_workers=-1).get("workers") or {})

    def worker_addresses(self) -> set[str]:
        """The workers the scheduler knows right now (a round trip to it)."""
        return set(self.client.run_on_scheduler(_scheduler_workers))

    def hosts(self, rounds: int = _ROUNDS) -> list[ClusterHost]:
        """Every worker with its measured clock offset, in a stable order."""
        workers = self._workers()
        if not workers:
            raise ClusterError(
                f"the cluster at {self.address} has no workers: start 'dask worker "
                f"{self.scheduler}' on each client host", address=str(self.address))
        best: dict[str, tuple[float, float]] = {}  # worker -> (round trip, offset)
        for _ in range(rounds):
            sent = time.time()
            clocks = self.client.run(host_clock, workers=list(workers), on_error="return")
            back = time.time()
            trip = back - sent
            for worker, remote in clocks.items():
                if isinstance(remote, float) and (worker not in best or trip < best[worker][0]):
                    best[worker] = (trip, remote - (sent + back) / 2)
        hosts = []
        for worker, info in workers.items():
            if worker not in best:
                continue  # it left while measured
            trip, offset = best[worker]
            name = info.get("name")
            name = str(name) if name not in (None, "") else str(info.get("host") or worker)
            hosts.append(ClusterHost(worker, name, str(info.get("host") or ""),
                                     int(info.get("nthreads") or 1), offset, trip / 2))
        return sorted(hosts, key=lambda h: (h.name, h.worker))

    def close(self) -> None:
        try:
            self.client.close(timeout=10)
        finally:
            self._close_cluster()

    def _close_cluster(self) -> None:
        if self.cluster is not None:
            try:
                self.cluster.close()
            finally:
                # the certificate and key dask-jobqueue dumped for the jobs go now, not
                # whenever the cluster object is collected
                for name in ("_job_ca_file", "_job_cert", "_job_key"):
                    with contextlib.suppress(OSError):
                        dumped = getattr(self.cluster, name, None)
                        if dumped is not None:
                            dumped.close()
                self.cluster = None


def _scheduler_workers(dask_scheduler: Any) -> list[str]:
    return list(dask_scheduler.workers)


def _started_recipe(address: ClusterAddress) -> Any:
    """The recipe's cluster; one that fails to start (a local worker that dies while
    starting: a preload, memory, a broken environment) is one paragraph."""
    try:
        return _start_recipe(address)
    except StorageScaleUsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - Dask raises RuntimeError, OSError, ...
        raise StorageScaleUsageError(
            f"--storage-cluster {address}: the cluster's hosts did not start: "
            f"{_causes(exc)}. A worker died while starting; its own error, if any, is "
            f"above in stderr (a worker preload, memory, or a Python environment the "
            f"workers cannot import the plugin from). Run 'dask worker' by hand to see "
            f"it, or leave out --storage-cluster to run the clients here."
        ) from None


def _causes(exc: BaseException) -> str:
    """``exc`` and what caused it, innermost last, each said once."""
    said: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(said) < 4:
        text = f"{type(seen).__name__}: {str(seen).rstrip('.')}"
        if text not in said:
            said.append(text)
        seen = seen.__cause__ or seen.__context__
    return "; caused by ".join(said)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored meanwhile (in the main thread; elsewhere it cannot be changed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:  # None: a handler not set from Python, which Python cannot put back
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None
                      else previous)


#: recipe -> what starts its cluster, registered by an upper layer (the plugin:
#: ``embedded-slurm``, servers/slurm_hosts.py); the object returned has ``close()``
#: and ``security``, and may have ``header_lines(joined_in)``
_RECIPE_STARTERS: dict[str, Any] = {}


def register_recipe(name: str, starter: Any) -> None:
    """``starter(address)`` starts the cluster of the recipe ``name``."""
    _RECIPE_STARTERS[name] = starter


def _start_recipe(address: ClusterAddress) -> Any:
    if address.recipe in EMBEDDED_RECIPES:
        starter = _RECIPE_STARTERS.get(address.recipe)
        if starter is None:
            raise StorageScaleUsageError(
                f"--storage-cluster {address}: this cluster is started by the pytest "
                f"plugin for a session (pytest --storage-cluster {address}); nothing here "
                f"registered its starter.")
        return starter(address)
    if address.recipe == "local":
        import dask
        from distributed import LocalCluster

        # its workers are this process's children, in the terminal's process group: a
        # Ctrl-C would kill them before they report what they measured. Started with
        # SIGINT ignored (which they inherit), they stop as remote hosts do: by the
        # coordinator's stop event, within about a second, and report.
        # A Dask scheduler, worker or nanny runs any function a client sends it: every
        # one of them listens on loopback only, with mutual TLS on a certificate made
        # for this cluster (in memory, passed to the workers on their command pipe),
        # so another local user's Client is refused at the handshake. A scheduler and
        # a worker serve HTTP even without a dashboard (the worker list, task state, a
        # proxy): with no routes, on loopback, they answer 404 to everything
        with _sigint_ignored(), dask.config.set(NO_HTTP_ROUTES):
            return LocalCluster(n_workers=address.hosts, threads_per_worker=1,
                                processes=True, host=LOOPBACK, protocol="tls://",
                                security=run_security(), dashboard_address=None,
                                worker_dashboard_address=None,
                                # its page-less HTTP server on a free port (8787 may
                                # be another cluster's)
                                scheduler_kwargs={"dashboard_address": f"{LOOPBACK}:0"})
    import dask
    import dask_jobqueue

    kind = address.recipe or ""
    cluster_class = getattr(dask_jobqueue, JOBQUEUE_KINDS[kind])
    # the scheduler's HTTP server (no dashboard asked for) on loopback, without pages,
    # unless the config puts it elsewhere; with a folder the jobs share for it
    # (jobqueue.<kind>.shared-temp-directory), mutual TLS on a certificate made for the
    # run, which dask-jobqueue dumps there (0600 files) for the workers' command lines
    options = dict(dask.config.get(f"jobqueue.{kind}.scheduler-options", None) or {})
    options.setdefault("dashboard_address", f"{LOOPBACK}:0")
    kwargs: dict[str, Any] = {"scheduler_options": options}
    if dask.config.get(f"jobqueue.{kind}.shared-temp-directory", None):
        kwargs["security"] = run_security()
    try:
        with dask.config.set(NO_HTTP_ROUTES):
            cluster = cluster_class(**kwargs)
    except ValueError as exc:  # a setting the Dask config lacks (cores, memory...)
        raise StorageScaleUsageError(
            f"--storage-cluster {address}: dask-jobqueue could not set up {kind} jobs: "
            f"{' '.join(str(exc).split())} "
            f"Configure the jobqueue.{kind} section of the Dask config "
            f"(~/.config/dask/jobqueue.yaml): cores, memory, and the queue/project your "
            f"site needs.") from None
    cluster.scale(jobs=address.hosts)
    return cluster


def check_offsets(hosts: list[ClusterHost], address: str,
                  bound: float = MAX_CLOCK_OFFSET_S) -> None:
    """Refuse hosts whose clock is off by more than ``bound`` (one paragraph)."""
    off = [h for h in hosts if abs(h.clock_offset_s) - h.clock_uncertainty_s > bound]
    if off:
        raise ClusterError(
            f"client host clock(s) off by more than {bound:g} s from this machine's: "
            + ", ".join(f"{h.name} ({h.address}) {h.clock_offset_s:+.3f} s" for h in off)
            + ". Synchronize them (chrony/ntpd) or take them out of the cluster; the step "
            "was not run.", address=address)


#: where the clusters started here listen
LOOPBACK = "127.0.0.1"
#: the Dask config that leaves a scheduler's and a worker's HTTP server without pages
#: (the same as DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES=[] in a worker's environment)
NO_HTTP_ROUTES: dict[str, list[str]] = {"distributed.scheduler.http.routes": [],
                                            "distributed.worker.http.routes": []}
NO_HTTP_ROUTES_ENV = {"DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES": "[]",
                      "DASK_DISTRIBUTED__WORKER__HTTP__ROUTES": "[]"}
#: scheduler address -> the Security its starter made (the embedded CephFS's)
_SECURITY: dict[str, Any] = {}


def run_security() -> Any:
    """A new Dask :class:`~distributed.security.Security` for a cluster started here:
    a self-signed certificate and key made in memory (``Security.temporary``, RSA
    2048, with ``cryptography``) that every role presents and is the only CA it
    trusts (mutual TLS), with encryption required: a peer without it is refused."""
    from distributed.security import Security

    try:
        return Security.temporary()
    except ImportError:
        raise StorageScaleUsageError(
            "a Dask cluster started here is secured with TLS, whose certificate is made "
            "with the 'cryptography' package, not installed. Install the plugin's cluster "
            "extra: pip install 'pytest-storagescale[cluster]'.") from None


def register_security(address: str, security: Any) -> None:
    """``security`` is what a client of the scheduler at ``address`` presents."""
    _SECURITY[address] = security


def forget_security(address: str) -> None:
    _SECURITY.pop(address, None)


def security_for(address: str) -> Any:
    """The Security registered for ``address`` (None: the Dask config's)."""
    return _SECURITY.get(address)


_OPEN: dict[str, ClusterConnection] = {}


def connect(text: str) -> ClusterConnection:
    """This process's connection to the cluster ``text`` (made once, closed at exit)."""
    connection = _OPEN.get(text)
    if connection is None:
        connection = _OPEN[text] = ClusterConnection(parse_cluster_address(text))
    return connection


def disconnect(text: str | None = None) -> None:
    """Close one connection (or all): a recipe's cluster stops with it."""
    for key in [text] if text is not None else list(_OPEN):
        connection = _OPEN.pop(key, None)
        if connection is not None:
            connection.close()


atexit.register(disconnect)


def cluster_header(text: str) -> list[str]:
    """``storagescale: cluster tcp://...: 4 hosts`` and one line per host."""
    connection = connect(text)
    hosts = connection.hosts()
    lines = [f"storagescale: cluster {text} (scheduler {connection.scheduler}): "
             f"{len(hosts)} client hosts, clock offsets measured from this machine "
             f"(bound {MAX_CLOCK_OFFSET_S:g} s)"]
    lines += [f"  host {host.describe()}" for host in hosts]
    batch = getattr(connection.cluster, "header_lines", None)
    return lines + (batch(connection.joined_in) if batch is not None else [])
