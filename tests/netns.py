"""Client hosts as network namespaces, for the cluster tests and benchmark.

:class:`NamespaceCluster` makes N namespaces, each joined to a bridge in this
(the root) namespace by a veth pair, on one private /24: the bridge is ``.1`` (the
"head node": the Dask scheduler and the storage server listen there), host i is
``.(i+2)``. Each namespace runs a real ``dask worker`` process bound to its own
address. Nothing leaves the namespaces and this machine's bridge. Scheduler and
workers speak mutual TLS only (``tls://``), on a certificate made for the cluster
(files 0600 in a 0700 folder): this root-run cluster is no door for another local
user while the tests run. This process finds its security registered for the address
(``cluster.hosts.register_security``); a pytest started by a test gets it from the
Dask config in its environment (:meth:`NamespaceCluster.dask_env`), as a site's
scheduler would be reached.

A host's link can be capped (``tc qdisc ... tbf``, both directions) to make a slow
client host; a worker can be killed. :meth:`NamespaceCluster.stop` removes every
process, namespace, veth and the bridge, and is safe to call twice (the fixtures call
it in their finalizers, also after a failure).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pytest_storagescale.cluster.hosts import NO_HTTP_ROUTES_ENV
from pytest_storagescale.servers.netns import free_subnet, free_subnet6

PYTHON = sys.executable
#: the workers and the scheduler import this module (the tasks at its end)
TESTS = str(Path(__file__).resolve().parent)


def _ip(*args: str, namespace: str | None = None, check: bool = True
        ) -> subprocess.CompletedProcess:
    command = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace,
                                                       "ip", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return done


def _python_path() -> str:
    return os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)


def _bracketed(address: str) -> str:
    """An address as Dask's --host takes it (an IPv6 one in brackets)."""
    return f"[{address}]" if ":" in address else address


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here, or None (tried for real: add and delete)."""
    name = f"ssprobe{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return f"'ip netns add' is not permitted here ({exc}); the cluster tests need root"
    _ip("netns", "del", name, check=False)
    return None


@dataclass
class NamespaceHost:
    """One client host: a namespace, its veth pair and its dask worker."""

    index: int
    namespace: str
    veth_outside: str
    veth_inside: str
    address: str
    worker: subprocess.Popen | None = None
    log: Path | None = None
    #: its IPv6 address (a ULA), when the cluster has IPv6
    address6: str | None = None

    @property
    def name(self) -> str:
        return f"ns{self.index}" if self.index >= 0 else "ctl"

    @property
    def netns(self) -> str:
        """Its handle for ``nsenter --net=`` (which, unlike ``ip netns exec``, keeps this
        machine's /sys, the cgroup mounts that slurmd reads included)."""
        return f"/run/netns/{self.namespace}"


@dataclass
class NamespaceCluster:
    """N namespace hosts on a bridge, a dask scheduler on the bridge's address, and a
    dask worker in each namespace (``dask=False``: the network only; ``ipv6=True``: every
    address has an IPv6 twin from a random fd00::/8 /64, and the scheduler and workers
    speak over IPv6)."""

    count: int
    directory: Path
    threads: int = 1
    dask: bool = True
    ipv6: bool = False
    tag: str = field(default_factory=lambda: f"{os.getpid() % 10000:04d}"
                     f"{random.randint(0, 35 ** 2):03x}"[:7])
    hosts: list[NamespaceHost] = field(default_factory=list)
    subnet: ipaddress.IPv4Network | None = None
    subnet6: ipaddress.IPv6Network | None = None
    #: a namespace of its own on the bridge (.254), for a controller (SLURM's)
    controller: NamespaceHost | None = None
    scheduler: subprocess.Popen | None = None
    port: int = 0
    #: the Dask security of a client of this cluster (once started)
    security: object = None
    tls_files: tuple[str, str] = ("", "")
    _made: list[tuple[str, str]] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"ssbr{self.tag}"

    @property
    def head(self) -> str:
        """The bridge's address: where the scheduler and the server listen."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    @property
    def head6(self) -> str:
        """The bridge's IPv6 address (with ``ipv6=True``)."""
        assert self.subnet6 is not None
        return str(self.subnet6.network_address + 1)

    @property
    def listen(self) -> str:
        """Where the scheduler listens: the bridge's IPv6 address with ``ipv6``."""
        return self.head6 if self.ipv6 else self.head

    @property
    def address(self) -> str:
        host = f"[{self.head6}]" if self.ipv6 else self.head
        return f"tls://{host}:{self.port}"

    def _make_tls(self) -> None:
        """The cluster's certificate (its own CA) and key, 0600 in a 0700 folder."""
        from distributed.security import Security

        material = Security.temporary().get_tls_config_for_role("worker")
        folder = self.directory / "tls"
        folder.mkdir(mode=0o700)
        folder.chmod(0o700)
        files = []
        for name in ("cert", "key"):
            path = folder / f"{name}.pem"
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with open(handle, "w") as sink:
                sink.write(material[name])
            files.append(str(path))
        cert, key = self.tls_files = (files[0], files[1])
        self.security = Security(tls_ca_file=cert, tls_client_cert=cert, tls_client_key=key,
                                 require_encryption=True)

    def _tls_args(self) -> list[str]:
        cert, key = self.tls_files
        return ["--tls-ca-file", cert, "--tls-cert", cert, "--tls-key", key]

    def dask_env(self) -> dict[str, str]:
        """The Dask config, as environment variables, of a client of this cluster."""
        cert, key = self.tls_files
        return {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": cert,
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": cert,
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": key}

    def start(self, *, skew: dict[int, float] | None = None) -> NamespaceCluster:
        """Make the network, the scheduler and the workers (``skew``: host index ->
        seconds its worker adds to its reported clock, the test hook)."""
        from pytest_storagescale.cluster.hosts import register_security

        try:
            with _SERVING:
                _CLUSTERS.append(self)
            self._network()
            if not self.dask:
                return self
            self._make_tls()
            self._start_scheduler()
            register_security(self.address, self.security)
            for host in self.hosts:
                self._start_worker(host, (skew or {}).get(host.index, 0.0))
            self.wait_for_workers(self.count)
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        self.subnet = free_subnet()
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"{self.head}/24", "dev", self.bridge)
        if self.ipv6:
            self.subnet6 = free_subnet6()
            # nodad: usable at once (duplicate address detection would hold it ~2 s)
            _ip("-6", "addr", "add", f"{self.head6}/64", "dev", self.bridge, "nodad")
        _ip("link", "set", self.bridge, "up")
        for i in range(self.count):
            self.hosts.append(self._host(i, 2 + i))

    def _host(self, index: int, last: int) -> NamespaceHost:
        """A namespace on the bridge at .``last`` of the subnet (and ::``last``)."""
        assert self.subnet is not None
        suffix = str(index) if index >= 0 else "c"
        host = NamespaceHost(
            index, f"ss{self.tag}n{suffix}", f"ss{self.tag}o{suffix}",
            f"ss{self.tag}i{suffix}", str(self.subnet.network_address + last),
            address6=(str(self.subnet6.network_address + last) if self.subnet6 else None))
        _ip("netns", "add", host.namespace)
        self._made.append(("netns", host.namespace))
        _ip("link", "add", host.veth_outside, "type", "veth", "peer", "name", host.veth_inside)
        self._made.append(("link", host.veth_outside))
        _ip("link", "set", host.veth_inside, "netns", host.namespace)
        _ip("link", "set", host.veth_outside, "master", self.bridge)
        _ip("link", "set", host.veth_outside, "up")
        ns = host.namespace
        _ip("addr", "add", f"{host.address}/24", "dev", host.veth_inside, namespace=ns)
        if host.address6:
            _ip("-6", "addr", "add", f"{host.address6}/64", "dev", host.veth_inside, "nodad",
                namespace=ns)
        _ip("link", "set", host.veth_inside, "up", namespace=ns)
        _ip("link", "set", "lo", "up", namespace=ns)
        with _SERVING:
            for address in _SERVER_ADDRESSES:
                self._route(host, address)
        return host

    def _route(self, host: NamespaceHost, address: str, *, remove: bool = False) -> None:
        """``host``'s route to a bridge server's ``address`` (:func:`bridge_xrootd`)
        through the bridge: one /32 (/128), nothing else."""
        six = ":" in address
        if six and host.address6 is None:
            return
        via = self.head6 if six else self.head
        _ip(*(["-6"] if six else []), "route", "del" if remove else "replace",
            f"{address}/{128 if six else 32}", "via", via, namespace=host.namespace,
            check=not remove)

    def add_controller(self) -> NamespaceHost:
        """A namespace of its own on the bridge at .254 (a batch system's controller:
        what it listens on is reachable from the bridge and the hosts, nowhere else)."""
        if self.controller is None:
            self.controller = self._host(-1, 254)
        return self.controller

    def _start_scheduler(self) -> None:
        with socket.socket(socket.AF_INET6 if self.ipv6 else socket.AF_INET) as probe:
            probe.bind((self.listen, 0))
            self.port = probe.getsockname()[1]
        log = self.directory / "scheduler.log"
        self.scheduler = subprocess.Popen(
            [PYTHON, "-m", "distributed.cli.dask_scheduler", "--host", _bracketed(self.listen),
             "--port", str(self.port), "--protocol", "tls", "--no-dashboard",
             "--dashboard-address", "127.0.0.1:0", *self._tls_args()],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
            cwd=self.directory, env=dict(os.environ, PYTHONPATH=_python_path(),
                                         **NO_HTTP_ROUTES_ENV))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.scheduler.poll() is not None:
                raise RuntimeError(f"dask scheduler exited: {log.read_text()[-2000:]}")
            try:
                socket.create_connection((self.listen, self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"dask scheduler did not listen within 60 s: {log.read_text()[-2000:]}")

    def _start_worker(self, host: NamespaceHost, skew: float = 0.0) -> None:
        host.log = self.directory / f"worker-{host.name}.log"
        local = self.directory / f"worker-{host.name}"
        local.mkdir(exist_ok=True)
        environment = dict(os.environ, STORAGESCALE_TEST_CLOCK_SKEW_S=str(skew),
                           PYTHONPATH=_python_path(), **NO_HTTP_ROUTES_ENV)
        host.worker = subprocess.Popen(
            ["ip", "netns", "exec", host.namespace, PYTHON, "-m",
             "distributed.cli.dask_worker", self.address,
             "--host", _bracketed(host.address6) if self.ipv6 and host.address6 else host.address,
             "--nthreads", str(self.threads), "--no-nanny", "--name", host.name,
             "--no-dashboard", "--dashboard-address", "127.0.0.1:0", "--local-directory",
             str(local), *self._tls_args()],
            stdout=host.log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
            cwd=self.directory, env=environment)

    def restart_workers(self) -> None:
        """Fresh worker processes (no connections kept from earlier steps)."""
        for host in self.hosts:
            self.kill(host.index)
        self._wait_for_count(0)
        for host in self.hosts:
            self._start_worker(host)
        self.wait_for_workers(self.count)

    def _wait_for_count(self, count: int, timeout: float = 60) -> None:
        from distributed import Client

        with Client(self.address, timeout=30, security=self.security) as client:
            deadline = time.monotonic() + timeout
            while len(client.scheduler_info(n_workers=-1)["workers"]) != count:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the scheduler still lists workers after {timeout} s")
                time.sleep(0.2)

    def wait_for_workers(self, count: int, timeout: float = 120) -> None:
        from distributed import Client

        with Client(self.address, timeout=30, security=self.security) as client:
            try:
                client.wait_for_workers(count, timeout=timeout)
            except TimeoutError:
                logs = "\n".join(f"{h.name}: {h.log.read_text()[-800:]}" for h in self.hosts
                                 if h.log is not None and h.log.exists())
                raise RuntimeError(f"{count} workers did not join in {timeout} s:\n{logs}") \
                    from None

    def cap(self, index: int, rate: str = "50mbit") -> None:
        """A token-bucket cap on host ``index``'s link, both directions."""
        host = self.hosts[index]
        tbf = ["qdisc", "add", "dev", None, "root", "tbf", "rate", rate, "burst", "64kb",
               "latency", "200ms"]
        subprocess.run(["tc", *[host.veth_outside if a is None else a for a in tbf]],
                       check=True, capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "exec", host.namespace, "tc",
                        *[host.veth_inside if a is None else a for a in tbf]],
                       check=True, capture_output=True, timeout=30)

    def uncap(self, index: int) -> None:
        host = self.hosts[index]
        subprocess.run(["tc", "qdisc", "del", "dev", host.veth_outside, "root"],
                       capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "exec", host.namespace, "tc", "qdisc", "del", "dev",
                        host.veth_inside, "root"], capture_output=True, timeout=30)

    def cut(self, index: int) -> None:
        """Take host ``index``'s link down: its worker and clients are cut off, nothing
        is reset (a network cut, not a crash)."""
        _ip("link", "set", self.hosts[index].veth_outside, "down")

    def kill(self, index: int) -> None:
        """SIGKILL host ``index``'s worker (a client host lost mid-step)."""
        worker = self.hosts[index].worker
        if worker is not None and worker.poll() is None:
            os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)

    def stop(self) -> None:
        """Stop every process; remove the namespaces, veths and the bridge."""
        from pytest_storagescale.cluster.hosts import forget_security

        with _SERVING:
            if self in _CLUSTERS:
                _CLUSTERS.remove(self)
        if self.port:
            forget_security(self.address)
        for process in [h.worker for h in self.hosts] + [self.scheduler]:
            if process is not None and process.poll() is None:
                process.kill()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        for kind, name in reversed(self._made):
            if kind == "netns":
                self._kill_inside(name)
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        self._made.clear()

    @staticmethod
    def _kill_inside(namespace: str) -> None:
        """SIGKILL what still runs in ``namespace`` (a batch job's processes: a
        namespace outlives its name while one runs)."""
        for _ in range(5):
            pids = [int(p) for p in _ip("netns", "pids", namespace, check=False).stdout.split()]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)

    def leftovers(self) -> list[str]:
        """Namespaces or links of this cluster still present (for the clean-up test)."""
        names = _ip("netns", "list").stdout + _ip("link").stdout
        return sorted({word.rstrip(":").split("@")[0] for word in names.split()
                       if word.startswith(f"ss{self.tag}") or word.startswith(self.bridge)})

    def __enter__(self) -> NamespaceCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


# -- tasks the tests run on a namespace host (imported there from this module) -------------
_HELD: list = []


def write_and_hold(url: str, root: str, path: str) -> str:
    """The driver spec refuses a write outside the run directory (its text is
    returned); then ``path`` is opened, half written and held open, never closed."""
    from XRootD import client as xrd
    from XRootD.client.flags import OpenFlags

    from pytest_storagescale.drivers.registry import driver_spec
    from pytest_storagescale.errors import UnsafePathError

    try:
        driver_spec(url, writable_root=root).connect("writer", timeout=10).put(
            "/storagescale/outside.dat", b"x")
        refused = "not refused"
    except UnsafePathError as exc:
        refused = str(exc)
    handle = xrd.File()
    server = url.split("//storagescale")[0]  # root://host:port
    status, _ = handle.open(f"{server}/{path}", OpenFlags.NEW | OpenFlags.MAKEPATH,
                            timeout=10)
    if not status.ok:
        raise RuntimeError(f"open {path}: {status.message}")
    status, _ = handle.write(b"half a file" * 1000, offset=0, timeout=10)
    if not status.ok:
        raise RuntimeError(f"write {path}: {status.message}")
    _HELD.append(handle)  # open until the process dies
    return refused


def delete_left_behind(url: str, root: str, path: str) -> str:
    """Delete what a killed writer left (the server may take a moment to notice)."""
    from pytest_storagescale.drivers.registry import driver_spec

    driver = driver_spec(url, writable_root=root).connect("deleter", timeout=10)
    deadline = time.time() + 20
    while True:
        try:
            driver.delete(path)
            return "deleted"
        except Exception as exc:  # noqa: BLE001 - retried until the deadline
            if time.time() > deadline:
                return f"not deleted: {exc}"
            time.sleep(0.5)


#: the addresses the bridge servers listen on, and the clusters running (whose hosts
#: get a route to each): :func:`bridge_xrootd`
_SERVER_ADDRESSES: list[str] = []
_CLUSTERS: list[NamespaceCluster] = []
_SERVING = threading.RLock()


@contextlib.contextmanager
def bridge_xrootd(*, ipv6: bool = False, **kw):
    """An embedded xrootd that the namespace hosts reach: it listens on the address of an
    interface made for it in this namespace (a bridge without ports) (a free private /24's ``.1``, or
    with ``ipv6`` a free ULA /64's ``::1``), never on every interface. The loopback-only
    library binds there (``STORAGESCALE_BIND_ADDRESS``, servers/loopback.c); each
    cluster host has a /32 (/128) route to it through its bridge, and an embedded
    SLURM's hosts reach it through their default route (an address of this machine).
    Nothing forwards: it is not reachable from beyond this machine's namespaces.
    Before, it listened on ``*`` (every interface: an anonymous server any host that
    reaches this machine could write to while the cluster tests ran)."""
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD

    subnet = free_subnet6() if ipv6 else free_subnet()
    address = str(subnet.network_address + 1)
    link = f"ssdm{os.getpid() % 10000:04d}{random.randint(0, 35 ** 2):03x}"[:15]

    class BridgeXRootD(EmbeddedXRootD):
        @property
        def host(self) -> str:
            return f"[{address}]" if ipv6 else address

        @property
        def listen_address(self) -> str:
            return address

        def _environment(self) -> dict[str, str]:
            return {**super()._environment(), "STORAGESCALE_BIND_ADDRESS": address}

    _ip("link", "add", link, "type", "bridge")  # a bridge without ports: this kernel has no dummy
    try:
        _ip(*(["-6"] if ipv6 else []), "address", "add",
            f"{address}/{128 if ipv6 else 32}", "dev", link, *(["nodad"] if ipv6 else []))
        _ip("link", "set", link, "up")
        with _SERVING:
            _SERVER_ADDRESSES.append(address)
            for cluster in _CLUSTERS:
                for host in [*cluster.hosts, *filter(None, [cluster.controller])]:
                    cluster._route(host, address)
        with BridgeXRootD(**kw) as server:
            yield server
    finally:
        with _SERVING:
            if address in _SERVER_ADDRESSES:
                _SERVER_ADDRESSES.remove(address)
                for cluster in _CLUSTERS:
                    for host in [*cluster.hosts, *filter(None, [cluster.controller])]:
                        cluster._route(host, address, remove=True)
        _ip("link", "del", link, check=False)


def outward_address() -> str:
    """This machine's source address towards the outside: an interface other than
    loopback, which namespace hosts reach through their default route (a RuntimeError
    where there is none)."""
    done = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.200"],
                          capture_output=True, text=True, timeout=30)
    found = re.search(r" src (\S+)", done.stdout)
    if found is None or found.group(1).startswith("127."):
        raise RuntimeError(f"this machine has no IPv4 address besides loopback: "
                           f"{done.stdout or done.stderr}")
    return found.group(1)


def xrootd_logins(log: str) -> dict[str, set[str]]:
    """Distinct load-client logins (user.pid:fd) in an xrootd's log, by the address the
    server saw, v4 or v6 (XRootD writes ``user@[address]`` for IPv6 and mapped IPv4
    addresses)."""
    logins: dict[str, set[str]] = {}
    for user, address in re.findall(r"XrootdXeq: (c\w+\.\d+:\d+)@\[?(?:::ffff:)?([\w.:]+?)\]? "
                                    r"\S+ \S+ login", log):
        logins.setdefault(str(ipaddress.ip_address(address)), set()).add(user)
    return logins


def during_step(monkeypatch, seconds: float, action) -> list[bool]:
    """Run ``action`` ``seconds`` into the next cluster step's measurement (timed by the
    step's own clock, once every host is running); returns [True] once it ran."""
    fired: list[bool] = []
    from pytest_storagescale.cluster.coordinator import ClusterExecutor

    original = ClusterExecutor._wait

    def wait(self, plan, clock, futures):
        def fire() -> None:
            fired.append(True)
            action()

        timer = threading.Timer(max(0.0, clock.measure_from + seconds - time.time()), fire)
        timer.start()
        try:
            return original(self, plan, clock, futures)
        finally:
            timer.cancel()

    monkeypatch.setattr(ClusterExecutor, "_wait", wait)
    return fired
