"""The seeds' scale against the dCache over several hosts (issue 36): ``suites/dcache``'s
namespace scan (``test_namespace_scan``: a directory listing per request) and, when
asked, its copy-out scan (``test_copy_out_scan``), run by pytest as a user runs it with
``--storage-embedded dcache --storage-embedded-hosts 4 --storage-cluster
embedded-slurm:N``: the dCache's core, door and pool hosts and the N SLURM client hosts
are network namespaces of this machine; the door host is linked to the client hosts'
bridge (``slurm_hosts.offer_door``), the pools are not.

One pytest run with a plan of its own (thresholds ``clients = [...]`` per op, short
steps; the rules: no failed, hung or lost client). Per step, from the run's results
JSON: total clients, each host's row (its Dask worker, address, clients, succeeded,
rate, p99, worker peak), rate, p99, failed/hung/lost and hosts lost; sampled every
0.5 s while pytest runs: each client host's memory (every process in its namespace),
the door host's JVM, the machine's available memory at its lowest and the 1-minute
load average at its highest (``bench_slurm_scale.py``'s sampler).

While pytest runs, every 2 s, the pools' reach is probed for real: every TCP port
listening on a pool host (its namespace's ``/proc/<pid>/net/tcp``: the movers' ports
while transfers run) is connected to from a client host (its ``slurmd``'s namespace) at
the pool's bridge address, which must fail each time; as a control, the door's
listening ports from the same client host at the door's client-side address, which
must connect (``tests/test_slurm_embedded.py`` tests the wiring without a dCache).

Needs root, SLURM and a dCache release (scripts/bootstrap.sh servers). Usage::

    .venv/bin/python benchmarks/bench_dcache_hosts_slurm.py [--hosts 4]
        [--clients 20,400,1000,2000] [--ops ls] [--protocol root] [--duration 5]
        [--warmup 1] [--hang-timeout 60] [--timeout 2400] [--version 11.2.5]
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_slurm_scale as scale  # noqa: E402
from suite_runs import Periodic, run_pytest, scale_options, scale_plan  # noqa: E402

SUITE = REPO / "suites" / "dcache" / "test_dcache_scalability.py"
TESTS = {"ls": "test_namespace_scan", "copyout": "test_copy_out_scan"}
DCACHE_UP = re.compile(r"embedded dCache[^\n]*?started in ([\d.]+) s", re.I)


def thresholds(args) -> str:
    settings = {"ls": {"entries": 10},
                "copyout": {"op": "get", "file_size": args.file_size, "files": 10,
                            "to_disk": True}}
    return scale_plan("dcache", args.clients, {op: settings[op] for op in args.ops}, args)


def door_jvm_mb() -> float:
    """The door host's JVM (its command line names doorDomain), resident MB."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
            if b"doorDomain" in command and b"java" in command.split(b"\0")[0]:
                total += int(Path(f"/proc/{entry}/statm").read_text().split()[1]) * page / 1e6
        except (OSError, IndexError, ValueError):
            continue
    return total


class Sampler(scale.Sampler):
    """bench_slurm_scale's sampler, the door JVM's memory among the hosts."""

    def hosts(self) -> dict[str, float]:
        hosts = super().hosts()
        door = door_jvm_mb()
        if door:
            hosts["door-jvm"] = door
        return hosts


def _pids(marker: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _listening(pid: int) -> set[int]:
    """TCP ports listening on a non-loopback address in ``pid``'s network namespace."""
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, port = fields[1].split(":")
            if fields[3] == "0A" and not address.startswith(("0100007F", "0000000000000000"
                                                              "0000000001000000")):
                ports.add(int(port, 16))
    return ports


def _addresses(pid: int, *what: str) -> str:
    done = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-4", "-o", *what],
                          capture_output=True, text=True, timeout=30)
    return done.stdout


class ReachProbe(Periodic):
    """Every 2 s: pool ports from a client host (must not connect), door ports (must).
    The client host: a ``slurmd -N ns0``'s namespace with a route to a door (a /32 via
    the door's veth); the door: the ``doorDomain`` JVM whose host has that address; the
    pools: the ``pool<i>Domain`` JVMs on that dCache's bridge."""

    interval = 2.0
    limit = 5000

    def __init__(self) -> None:
        super().__init__()
        self.pool_tries: dict[tuple[str, int], int] = {}
        self.pool_connected: list[str] = []
        self.door_tries = self.door_connected = 0

    def sample(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
            self._probe()

    def _probe(self) -> None:
        from pytest_storagescale.servers.dcache_hosts import in_namespace

        for client in _pids(b"slurmd\0-D\0-N\0ns0"):
            fronts = re.findall(r"^(\d\S+) via ", _addresses(client, "route"), re.M)
            for front in fronts:
                doors = [pid for pid in _pids(b"doorDomain")
                         if f"inet {front}/" in _addresses(pid, "addr")]
                if not doors:
                    continue
                prefix = ".".join(front.split(".")[:3]) + "."
                pools = {}
                for pid in _pids(b"Domain"):
                    command = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if re.search(rb"pool\d+Domain", command):
                        found = re.findall(r"inet (\S+)/", _addresses(pid, "addr"))
                        for address in found:
                            if address.startswith(prefix):
                                pools[address] = pid
                netns = f"/proc/{client}/ns/net"
                for port in sorted(_listening(doors[0]))[:3]:
                    self.door_tries += 1
                    self.door_connected += in_namespace(
                        netns, lambda a=front, p=port: _connect(a, p))
                for address, pid in sorted(pools.items()):
                    for port in sorted(_listening(pid)):
                        key = (address, port)
                        self.pool_tries[key] = self.pool_tries.get(key, 0) + 1
                        if in_namespace(netns, lambda a=address, p=port: _connect(a, p)):
                            self.pool_connected.append(f"{address}:{port}")

    def report(self) -> str:
        tried = ", ".join(f"{address}:{port} x{count}" for (address, port), count
                          in sorted(self.pool_tries.items()))
        connected = ", ".join(self.pool_connected[:10])
        return (f"reach from client host ns0: the pools' listening ports "
                f"{len(self.pool_tries)} ({tried[:600]}), connected "
                f"{len(self.pool_connected)} times{': ' + connected if connected else ''}; "
                f"the door's ports {self.door_tries} tries, connected {self.door_connected}")


def _connect(address: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((address, port), timeout=2).close()
        return True
    except OSError:
        return False


def run(args):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "thr" / "dcache").mkdir(parents=True)
        (work / "thr" / "dcache" / "scale.toml").write_text(thresholds(args))
        selected = " or ".join(TESTS[op] for op in args.ops)
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                   "--storage-embedded=dcache", "--storage-embedded-hosts=4",
                   f"--storage-embedded-version={args.version}",
                   f"--storage-embedded-protocol={args.protocol}",
                   "--storage-thresholds=thr",
                   f"--storage-cluster=embedded-slurm:{args.hosts}",
                   "--storage-results=out.json", "-v", "-k", selected, str(SUITE)]
        sampler, probe = Sampler(), ReachProbe()
        steps, meta, output = run_pytest(command, work, timeout=args.timeout, log=args.log,
                                         beside=[sampler, probe])
        print(probe.report(), flush=True)
        return steps, meta, output, sampler, meta["began"]


def main() -> None:
    parser = scale_options(__doc__, ops=TESTS, clients="20,400,1000,2000", default_ops="ls",
                           duration=5.0, timeout=2400.0, log="/tmp/bench_dcache_hosts_slurm.log")
    parser.add_argument("--protocol", default="root", help="the door: root or davs")
    parser.add_argument("--file-size", default="100kB", help="copyout's file")
    parser.add_argument("--version", default="11.2.5")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, SLURM's daemons)")
    steps, meta, output, sampler, began = run(args)
    up = DCACHE_UP.search(output)
    if up:
        print(f"embedded dCache over 4 hosts: {up.group(0)}")
    args.nofile = 0
    scale.report(steps, meta, output, sampler, began, args)
    summary = re.findall(r"^=+ .*(?:passed|failed|error).* =+$", output, re.M)
    print("\n".join(summary[-1:]))


if __name__ == "__main__":
    main()
