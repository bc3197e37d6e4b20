"""The servers' side of a step: their processes sampled over the measured window, and
their own counters, so that a step shows what the storage says it served beside what
its clients measured. It serves remote storage as well as the embedded servers, and
sits in ``load/`` beside :mod:`.server_usage` (what it measures): a remote run's
``--storage-server-monitor`` imports nothing of ``servers/``, which imports
:func:`report_line` from here for the embedded xrootd's configuration.

- :class:`SummaryListener`: a UDP socket (on loopback for the embedded servers) that
  receives XRootD's summary monitoring (``xrd.report <host:port> every 1s all sync``:
  one XML ``<statistics>`` packet per report) and keeps each server's latest report.
  The embedded xrootd is configured to report to it; a remote XRootD site points its
  ``xrd.report`` at the address the session listens on.
- :class:`ProcessSampler`: the server processes (and what they forked) sampled with
  psutil a few times a second: CPU (user + system), threads, TCP connections.
- :class:`ServerWatch`: one step. :meth:`ServerWatch.bracket` is entered right before
  the engine starts the clients (after the step's set-up) and left once they are
  done (before the clean-up): at both ends it waits for the servers' next report,
  so that the counters' difference is the load's own requests (logins, warm-up,
  window, drain) and nothing of the set-up or clean-up. :meth:`ServerWatch.usage`
  gives the :class:`~pytest_storagescale.load.server_usage.ServerUsage`.

On the embedded dCache the watch also brackets the load with dCache's billing
(:mod:`.dcache_billing`: the pool transfers of the step's folder) and, on 11.1 and
later, its Prometheus exporter (:mod:`.dcache_exporter`: the namespace's counters and
the JVM's); :func:`exporter_disagreement` compares the exporter's count as
:func:`disagreement` compares the others'.

A server's counters count requests by kind (``<ops>``: ``open``, ``rd``, ``misc``...);
how many of them one operation makes depends on the server's release (XRootD 5.5
counts a ``stat`` twice in ``misc``), so for an operation the step compares
(:data:`COUNTERS`) the watch measures it once per session: it sends a known number
of requests of that kind between two reports (:meth:`SummaryListener.per_operation`).
"""

from __future__ import annotations

import math
import os
import pwd
import shutil
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from xml.etree import ElementTree

from ..drivers import xmlsafe
from .dcache_billing import BillingWatch
from .dcache_exporter import ExporterFigures, ExporterWatch
from .server_usage import ServerUsage

#: after Ctrl-C or SIGTERM, how long the servers' last report is waited for (s)
INTERRUPTED_REPORT_WAIT = 1.0
#: how often the embedded xrootd reports (seconds; ``xrd.report ... every``)
REPORT_EVERY = 1
#: the ``xrd.report`` line of an embedded xrootd reporting to ``address``
REPORT_LINE = "xrd.report {address} every {every}s all sync"
#: the most the watch waits for a server's next report at the load's start and end:
#: this, or one and a half of a server's reporting interval (the shortest seen between
#: two of its reports: a gap while it was frozen does not count), at most
#: :data:`LONGEST_WAIT` (a remote storage reporting every 10 s)
FRESH_WAIT = 5.0
LONGEST_WAIT = 60.0
#: a server not heard from for this long (and three of its intervals) is no longer
#: waited for: it stopped
SILENT_AFTER = 10.0
#: how often the server processes are sampled (seconds); connections every 4th time
#: (psutil reads the whole TCP table for them)
SAMPLE_EVERY = 0.25
CONNECTIONS_EVERY = 4
#: operation -> the counter of XRootD's summary holding its requests, for the
#: operations whose server count the step compares with its clients'
COUNTERS = {"stat": "misc", "ls": "misc"}
#: the requests of a counter one client's login may add (XRootD 5.5.3 and 6.2.1
#: count the ``kXR_ping`` after it twice in ``misc``; measured)
LOGIN_REQUESTS = 2
#: requests sent to measure how many of a counter one operation makes, and the most
#: they may take together (seconds; a frozen server: no comparison, the step goes on)
CALIBRATION_REQUESTS = 20
CALIBRATION_DEADLINE = 10.0
#: the largest summary read (one with every section is about 2 kB); a longer packet is
#: refused unread, so the work per packet is bounded
PACKET_BYTES = 16384
#: the most packets the listener reads in one second (a server reports once a second
#: or less); beyond, it reads nothing until the second ends: a flood costs at most
#: this many parses a second, and what it sends meanwhile waits in (and is dropped
#: from) the kernel's queue
MAX_PACKETS_PER_S = 200
#: the most servers one listener keeps reports of (a flood of forged ``src`` names
#: does not grow the session's memory)
MAX_SOURCES = 1024
#: how long a sender pid found not to be the server's makes the listener look at the
#: server's processes again at most once (s): a flood from other processes costs one
#: look at the process table a second
RECHECK_AFTER = 1.0
#: the ``xrd.report`` socket of an embedded server, in the listener's private folder
SOCKET_NAME = "report.sock"
#: ``struct ucred`` of ``SCM_CREDENTIALS``: the sender's pid, uid and gid
_CREDENTIALS = struct.Struct("iII")


@dataclass(frozen=True)
class Summary:
    """One summary report of one server."""

    #: the server's ``host:port`` (the report's ``src``)
    source: str
    #: when this process received it (``time.time()``)
    received: float
    #: the server's start (``tos``): a restarted server's counters begin again
    started: int
    #: ``<stats id="xrootd"><ops>``: requests by kind since the server started
    ops: dict[str, int]
    #: ``<stats id="link"><num>``: connections now
    links: int | None = None
    #: ``<stats id="sched"><threads>``: its scheduler's threads now
    threads: int | None = None
    #: ``<stats id="proc">``: the server process's CPU time so far (user + system)
    cpu_s: float | None = None


#: a counter's largest value (XRootD's are 64-bit); a larger one is no counter
_LARGEST_COUNT = 2**63 - 1


def _count(text: str | None) -> int | None:
    """A counter's value: a whole number from 0 to :data:`_LARGEST_COUNT`, else None
    (a packet from the network may hold anything)."""
    text = (text or "").strip()
    if not text.isdigit() or len(text) > 19:
        return None
    value = int(text)
    return value if value <= _LARGEST_COUNT else None


def _int(node: ElementTree.Element | None) -> int | None:
    return _count(node.text) if node is not None else None


def _seconds(node: ElementTree.Element | None) -> float:
    if node is None:
        return 0.0
    return (_int(node.find("s")) or 0) + (_int(node.find("u")) or 0) / 1e6


def parse_summary(data: bytes, received: float | None = None) -> Summary | None:
    """A ``<statistics>`` packet of XRootD's summary monitoring; None for anything
    else. A packet from the network: parsed by :mod:`~..drivers.xmlsafe`, which
    refuses a document type in any encoding (a UTF-16 packet's entities too), and
    every number read is a counter's (0 to 2**63 - 1) or left out."""
    try:
        root = xmlsafe.fromstring(data)
    except (ElementTree.ParseError, ValueError, LookupError):
        return None  # LookupError: an encoding the parser does not know
    if root.tag != "statistics":
        return None
    sections = {node.get("id"): node for node in root.findall("stats")}
    xrootd, proc = sections.get("xrootd"), sections.get("proc")
    ops_node = xrootd.find("ops") if xrootd is not None else None
    ops = {child.tag: value for child in (ops_node if ops_node is not None else [])
           if isinstance(child.tag, str) and (value := _int(child)) is not None}
    link, sched = sections.get("link"), sections.get("sched")
    return Summary(
        source=(root.get("src") or "?")[:256],
        received=time.time() if received is None else received,
        started=_count(root.get("tos")) or 0, ops=ops,
        links=_int(link.find("num")) if link is not None else None,
        threads=_int(sched.find("threads")) if sched is not None else None,
        cpu_s=(_seconds(proc.find("usr")) + _seconds(proc.find("sys"))
               if proc is not None else None),
    )


def ops_between(before: dict[str, Summary], after: dict[str, Summary]) -> dict[str, int]:
    """The requests the servers counted between two sets of reports, by kind, summed
    over the servers that reported at both ends and did not restart in between."""
    total: dict[str, int] = {}
    for source, end in after.items():
        start = before.get(source)
        if start is None or start.started != end.started:
            continue
        for name, value in end.ops.items():
            total[name] = total.get(name, 0) + max(0, value - start.ops.get(name, 0))
    return total


def _tree_pids(pids: list[int]) -> set[int]:
    """``pids`` and every process they forked."""
    return {process.pid for pid in pids for process in _tree(pid)}


def _private_folder(make: Callable[[], str | os.PathLike[str]], user: str | None) -> str:
    """A new folder for the listener's socket, made by ``make`` (an embedded server's:
    ``servers.orphans.server_directory("monitor")``, recorded like a server's folder, so
    that a run killed before it removed it has it removed by the next start): this
    user's alone, except that ``user`` (the one the server runs as, when this process
    is root) may pass through it to the socket, never list or change it."""
    folder = os.fspath(make())
    if os.stat(folder).st_mode & 0o077:
        raise ValueError(f"the listener's folder {folder} is open to other users")
    if user is not None:
        os.chmod(folder, 0o711)
    return folder


class SummaryListener:
    """Receives XRootD summary reports in a daemon thread and keeps each server's
    latest. Close it when done. Two kinds:

    - ``senders`` given (an embedded server's daemons, asked when an unknown process
      sends): a Unix datagram socket in a private folder that ``folder`` makes (the
      session's: ``servers.orphans.server_directory``; this module imports no server
      code); :attr:`address` is its path, which ``xrd.report`` takes; writable only
      by ``user`` (the one the server runs as; None: this process's user), read
      with ``SO_PASSCRED``: each packet carries the sending process's pid as the
      kernel saw it, and a packet of any other process than the server's (and what
      it forked) is dropped. Nothing another user can bind or reach: no port, no address to forge.
    - else (a remote storage's stream): a UDP socket on ``address`` (``host:port``;
      port 0: a free one); every sender counts, at most :data:`MAX_SOURCES` servers.

    Either way at most :data:`MAX_PACKETS_PER_S` packets a second are read and each
    at most :data:`PACKET_BYTES` long; what was refused (and when the rate was
    reached: a flood) is counted, :meth:`refusals`, so that a step whose server
    counters could not be taken says why."""

    def __init__(self, address: str = "127.0.0.1:0",
                 senders: Callable[[], list[int]] | None = None, *,
                 user: str | None = None,
                 folder: Callable[[], str | os.PathLike[str]] | None = None) -> None:
        self._senders = senders
        self._folder: str | None = None
        if senders is not None:
            if folder is None:
                raise TypeError("SummaryListener(senders=...) needs folder=, which makes "
                                "the private folder of its socket")
            self._socket = self._private_socket(folder, user)
        else:
            host, _, port = address.rpartition(":")
            host = host.strip("[]") or "127.0.0.1"
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._socket = socket.socket(family, socket.SOCK_DGRAM)
            self._socket.bind((host, int(port or 0)))
        self._socket.settimeout(0.2)  # the thread looks whether it was closed
        self._address = self._bound_address()
        #: the server's processes as last looked up, and when (``time.monotonic()``)
        self._allowed: set[int] = set()
        self._looked = -math.inf
        #: packets refused, by why: "sender" (not the server's process), "packet"
        #: (not a summary, too long, a document type), "rate" (seconds the listener
        #: stopped reading: more than MAX_PACKETS_PER_S packets came)
        self._refused = {"sender": 0, "packet": 0, "rate": 0}
        self._latest: dict[str, Summary] = {}
        #: each server's reporting interval: the shortest seen between two reports (s)
        self._interval: dict[str, float] = {}
        self._condition = threading.Condition()
        self._closed = threading.Event()
        #: (operation, door) -> the counter's requests per operation, measured once
        self._per_operation: dict[tuple[str, str], float] = {}
        self._thread = threading.Thread(target=self._receive, daemon=True,
                                        name="storagescale-summary-listener")
        self._thread.start()

    def _private_socket(self, folder: Callable[[], str | os.PathLike[str]],
                        user: str | None) -> socket.socket:
        self._folder = _private_folder(folder, user)
        path = os.path.join(self._folder, SOCKET_NAME)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(path)
            os.chmod(path, 0o600)
            if user is not None:
                entry = pwd.getpwnam(user)
                os.chown(path, entry.pw_uid, entry.pw_gid)
        except BaseException:
            sock.close()
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        return sock

    def _bound_address(self) -> str:
        if self._socket.family == socket.AF_UNIX:
            return str(self._socket.getsockname())
        host, port = self._socket.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def address(self) -> str:
        """Where a server sends its reports, as ``xrd.report`` takes it: the socket's
        path, or ``host:port``."""
        return self._address

    def refusals(self) -> dict[str, int]:
        """Packets refused so far, by why (see :meth:`__init__`)."""
        with self._condition:
            return dict(self._refused)

    def _refuse(self, why: str) -> None:
        with self._condition:
            self._refused[why] += 1

    def _receive(self) -> None:
        second, read = time.monotonic(), 0
        while not self._closed.is_set():
            now = time.monotonic()
            if now - second >= 1.0:
                second, read = now, 0
            elif read >= MAX_PACKETS_PER_S:  # a flood: nothing more read this second
                self._refuse("rate")
                if self._closed.wait(1.0 - (now - second)):
                    return
                continue
            try:
                data, ancillary, flags, _ = self._socket.recvmsg(
                    PACKET_BYTES, socket.CMSG_SPACE(_CREDENTIALS.size))
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            read += 1
            self._take(data, ancillary, flags)

    def _take(self, data: bytes, ancillary: list, flags: int) -> None:
        """One packet: its sender checked, then (bounded) parsed and kept."""
        if self._senders is not None and not self._from_server(ancillary):
            return self._refuse("sender")
        summary = None if flags & socket.MSG_TRUNC else parse_summary(data)
        if summary is None:
            return self._refuse("packet")
        with self._condition:
            if summary.source not in self._latest and len(self._latest) >= MAX_SOURCES:
                return None
            last = self._latest.get(summary.source)
            gap = summary.received - last.received if last is not None else 0.0
            if gap > 0.2:  # two packets of one report, or a stray one: not an interval
                self._interval[summary.source] = min(
                    gap, self._interval.get(summary.source, gap))
            self._latest[summary.source] = summary
            self._condition.notify_all()
        return None

    def _from_server(self, ancillary: list) -> bool:
        """Whether the packet's sender (its pid, as the kernel gives it with
        ``SO_PASSCRED``) is one of the server's processes. The server's processes are
        looked up again for an unknown pid, at most once per :data:`RECHECK_AFTER`."""
        pid = next((_CREDENTIALS.unpack_from(payload)[0]
                    for level, kind, payload in ancillary
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
                    and len(payload) >= _CREDENTIALS.size), None)
        if pid is None or pid <= 0:
            return False
        if pid in self._allowed:
            return True
        now = time.monotonic()
        if now - self._looked < RECHECK_AFTER:
            return False
        self._looked = now
        try:
            self._allowed = _tree_pids(list(self._senders() if self._senders else []))
        except Exception:  # noqa: BLE001 - a server being stopped: no report counts
            self._allowed = set()
        return pid in self._allowed

    def latest(self) -> dict[str, Summary]:
        """Each server's latest report (empty: none came)."""
        with self._condition:
            return dict(self._latest)

    def wait_limit(self) -> float:
        """How long :meth:`fresh` waits by default (see :data:`FRESH_WAIT`)."""
        with self._condition:
            interval = max(self._interval.values(), default=0.0)
        return min(max(FRESH_WAIT, 1.5 * interval), LONGEST_WAIT)

    def _live(self, now: float) -> set[str]:
        """The servers still reporting: heard from within three of their intervals (at
        least :data:`SILENT_AFTER` s); one stopped for good is not waited for."""
        return {source for source, summary in self._latest.items()
                if now - summary.received < max(SILENT_AFTER,
                                                 3 * self._interval.get(source, 0.0))}

    def fresh(self, after: float, timeout: float | None = None) -> dict[str, Summary]:
        """The reports received after ``after`` (``time.time()``), waiting up to
        ``timeout`` seconds (default :meth:`wait_limit`) until every server still
        reporting has sent one (at least one server); those that did not are left out."""
        deadline = time.monotonic() + (self.wait_limit() if timeout is None else timeout)
        with self._condition:
            while True:
                new = {source: summary for source, summary in self._latest.items()
                       if summary.received > after}
                if new and self._live(after) <= set(new):
                    return new
                left = deadline - time.monotonic()
                if left <= 0:
                    return new
                self._condition.wait(left)

    def per_operation(self, operation: str, door: str, counter: str,
                      send: Callable[[int], None] | None) -> float:
        """How many of ``counter`` the servers count per ``operation`` over ``door``,
        measured once: :data:`CALIBRATION_REQUESTS` requests sent by ``send`` between
        two reports (nothing else runs then: the session holds the step lock). 0 when
        it could not be measured (no report, or ``send`` failed)."""
        key = (operation, door)
        if key not in self._per_operation:
            value = 0.0
            if send is not None:
                before = self.fresh(time.time())
                if before and not _sent_in_time(send):
                    before = {}
                after = self.fresh(time.time()) if before else {}
                counted = ops_between(before, after).get(counter, 0)
                value = round(counted / CALIBRATION_REQUESTS) if counted else 0.0
            self._per_operation[key] = float(value)
        return self._per_operation[key]

    def close(self) -> None:
        self._closed.set()
        self._socket.close()
        self._thread.join(timeout=2)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None


def _sent_in_time(send: Callable[[int], None]) -> bool:
    """``send`` made its :data:`CALIBRATION_REQUESTS` within
    :data:`CALIBRATION_DEADLINE` without an error (in a daemon thread: a request the
    client library never ends is abandoned)."""
    done, failed = threading.Event(), []

    def calibrate() -> None:
        try:
            send(CALIBRATION_REQUESTS)
        except Exception as exc:  # noqa: BLE001 - no calibration: no comparison
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=calibrate, daemon=True,
                     name="storagescale-server-calibration").start()
    return done.wait(CALIBRATION_DEADLINE) and not failed


# -- the server processes ----------------------------------------------------------
def _tree(pid: int) -> list:
    import psutil

    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return []


def _connections(process) -> int:
    """Established TCP connections of ``process`` (psutil 6 renamed the call)."""
    listing = getattr(process, "net_connections", None) or process.connections
    return sum(1 for connection in listing(kind="tcp") if connection.status == "ESTABLISHED")


def sample_processes(pids: list[int], with_connections: bool) -> tuple[float, int, int | None]:
    """CPU seconds (user + system; with the leaders' reaped children), threads and
    (when asked) established TCP connections of ``pids`` and everything they forked."""
    import psutil

    cpu, threads, connections = 0.0, 0, 0
    for pid in pids:
        for index, process in enumerate(_tree(pid)):
            try:
                times = process.cpu_times()
                cpu += times.user + times.system
                if index == 0:  # workers that ended and were reaped count in the leader's
                    cpu += times.children_user + times.children_system
                threads += process.num_threads()
                if with_connections:
                    connections += _connections(process)
            except psutil.Error:
                continue  # gone meanwhile
    return cpu, threads, (connections if with_connections else None)


def usable_cores(pids: list[int]) -> int:
    """The cores the first server process may run on."""
    import psutil

    for pid in pids:
        try:
            return len(psutil.Process(pid).cpu_affinity() or []) or os.cpu_count() or 1
        except (psutil.Error, AttributeError):
            continue
    return os.cpu_count() or 1


class ProcessSampler:
    """Samples ``pids`` every :data:`SAMPLE_EVERY` seconds in a daemon thread between
    :meth:`start` and :meth:`stop`; :meth:`over` reads a window of the samples."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        #: (time.time(), cpu seconds, threads, connections or None)
        self.samples: list[tuple[float, float, int, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="storagescale-server-sampler")

    def _run(self) -> None:
        count = 0
        while True:
            cpu, threads, connections = sample_processes(
                self.pids, with_connections=count % CONNECTIONS_EVERY == 0)
            self.samples.append((time.time(), cpu, threads, connections))
            count += 1
            if self._stop.wait(SAMPLE_EVERY):
                cpu, threads, connections = sample_processes(self.pids, True)
                self.samples.append((time.time(), cpu, threads, connections))
                return

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _cpu_at(self, moment: float) -> float:
        """The CPU seconds used from the first sample to ``moment``, between the
        samples around it. Only increases count: a worker that ended (and was not
        reaped by its leader) takes its CPU out of the sum, which is no negative use."""
        samples, used = self.samples, 0.0
        if moment <= samples[0][0]:
            return 0.0
        for (t0, c0, *_), (t1, c1, *_) in zip(samples, samples[1:], strict=False):
            step = max(0.0, c1 - c0)
            if t0 <= moment <= t1:
                return used + step * ((moment - t0) / (t1 - t0) if t1 > t0 else 1.0)
            used += step
        return used

    def over(self, start: float, end: float
             ) -> tuple[float | None, int | None, int | None]:
        """CPU seconds over ``[start, end]``, and the most threads and connections
        sampled in it (or the nearest samples when none falls inside)."""
        if not self.samples or end <= start:
            return None, None, None
        middle = (start + end) / 2
        nearest = sorted(self.samples, key=lambda s: abs(s[0] - middle))
        inside = [s for s in self.samples if start <= s[0] <= end] or nearest[:1]
        # connections are sampled once a second: a shorter window may hold none
        connections = [s[3] for s in inside if s[3] is not None] or [
            s[3] for s in nearest if s[3] is not None][:1]
        return (self._cpu_at(end) - self._cpu_at(start),
                max(s[2] for s in inside), max(connections) if connections else None)


# -- one step ----------------------------------------------------------------------
class ServerWatch:
    """The servers' side of one step: ``pids`` sampled (the embedded server's
    daemons; empty for a remote storage) and ``listener``'s reports around the load.

    ``send`` makes a given number of requests of the step's operation (on the step's
    door) for :meth:`SummaryListener.per_operation`; ``door`` names that door."""

    def __init__(self, *, source: str, operation: str, pids: list[int] | None = None,
                 listener: SummaryListener | None = None, door: str = "",
                 send: Callable[[int], None] | None = None,
                 billing: BillingWatch | None = None, billing_counter: str = "",
                 exporter: ExporterWatch | None = None) -> None:
        self.source = source
        #: dCache's Prometheus exporter over the load (:mod:`.dcache_exporter`)
        self.exporter = exporter
        #: dCache's billing over the load (:mod:`.dcache_billing`), and the counter of
        #: its transfers compared with the step's operations ("" none)
        self.billing = billing
        self.billing_counter = billing_counter
        self.operation = operation
        self.pids = list(pids or [])
        self.listener = listener
        self.door = door
        self.send = send
        self.sampler: ProcessSampler | None = None
        self.before: dict[str, Summary] = {}
        self.after: dict[str, Summary] = {}
        #: the load began (the bracket was entered), and the servers' count per operation
        self.entered = False
        self.per_operation = 1.0
        #: the listener's refusals when the bracket was entered (see ``refused``)
        self._refused_before: dict[str, int] = {}

    @contextmanager
    def bracket(self) -> Iterator[None]:
        """Around the load: the servers' reports at both ends, the processes sampled."""
        counter = COUNTERS.get(self.operation)
        self.entered = True
        if self.listener is not None:
            self._refused_before = self.listener.refusals()
        if self.listener is not None and counter:  # before the start: nothing else runs
            self.per_operation = self.listener.per_operation(
                self.operation, self.door, counter, self.send)
        if self.listener is not None:
            self.before = self.listener.fresh(time.time())
        if self.pids:
            self.sampler = ProcessSampler(self.pids)
            self.sampler.start()
        if self.billing is not None:
            self.billing.start()
        if self.exporter is not None:  # last: its scrape is the nearest to the load
            self.exporter.start()
        wait = None  # the listener's own limit
        try:
            yield
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: a frozen server must not hold
            wait = INTERRUPTED_REPORT_WAIT  # up the exit for its report
            raise
        finally:
            if self.sampler is not None:
                self.sampler.stop()
            if self.listener is not None and self.before:
                self.after = self.listener.fresh(time.time(), wait)
            if self.exporter is not None:  # first: the nearest to the load's end
                self.exporter.finish(wait)
            if self.billing is not None:
                self.billing.finish(wait)

    def refused(self) -> str:
        """What the listener refused since the bracket was entered, as a clause
        (``""``: nothing): a flood, or packets not from the server."""
        if self.listener is None:
            return ""
        now = self.listener.refusals()
        gone = {why: now[why] - self._refused_before.get(why, 0) for why in now}
        parts = [f"{gone['sender']} packet(s) from other processes than the server's"
                 if gone.get("sender") else "",
                 f"{gone['packet']} packet(s) that were no summary report"
                 if gone.get("packet") else "",
                 f"more than {MAX_PACKETS_PER_S} packets a second in {gone['rate']} "
                 f"second(s) (a flood: it read no more then)" if gone.get("rate") else ""]
        said = "; ".join(part for part in parts if part)
        return f"; the listener refused {said}" if said else ""

    def _counters(self) -> tuple[dict[str, int], str]:
        """The requests the servers counted over the load, and why none ("")."""
        if self.listener is None or not self.entered:
            return {}, ""
        if not self.before or not self.after:
            return {}, (f"no summary report from the server within "
                        f"{self.listener.wait_limit():g} s at the load's "
                        f"{'start' if not self.before else 'end'} (listening on "
                        f"{self.listener.address}){self.refused()}")
        ops = ops_between(self.before, self.after)
        if not ops:
            return ops, "the server restarted during the step"
        missing = sorted(source for source in self.before if source not in self.after or
                         self.after[source].started != self.before[source].started)
        if missing:  # a server stopped or restarted: its part of the load is unknown
            return ops, (f"no report at the load's end from {', '.join(missing)} (stopped "
                         f"or restarted during the step): the counts are not compared")
        return ops, ""

    def usage(self, measure_from: float, end_at: float) -> ServerUsage:
        """What the servers did: CPU, threads and connections over the measured window
        ``[measure_from, end_at]``, requests over the whole load."""
        usage = self._usage(measure_from, end_at)
        if self.exporter is None:
            return usage
        figures = self.exporter.figures if self.entered else None
        if figures is None:
            figures = ExporterFigures(counter=self.exporter.counter,
                                      note="the load never began")
        return replace(usage, exporter=figures)

    def _usage(self, measure_from: float, end_at: float) -> ServerUsage:
        cpu_s = threads = connections = None
        if self.sampler is not None:
            cpu_s, threads, connections = self.sampler.over(measure_from, end_at)
        if self.billing is not None:
            return self._billing_usage(cpu_s, threads, connections, end_at - measure_from)
        ops, note = self._counters()
        counter = COUNTERS.get(self.operation, "")
        per_operation = self.per_operation
        if ops and counter and not per_operation:
            note = (f"how many '{counter}' requests the server counts per "
                    f"{self.operation} could not be measured: the counts are not compared")
        return ServerUsage(
            source=self.source, window_s=max(0.0, end_at - measure_from), cpu_s=cpu_s,
            cores=usable_cores(self.pids) if self.pids else 0, threads=threads,
            connections=connections, ops=ops,
            counted=counter if ops and per_operation and not note else "",
            per_operation=per_operation or 1.0, counters_note=note,
            compare_with=counter if self.listener is not None and self.entered else "",
        )


    def _billing_usage(self, cpu_s: float | None, threads: int | None,
                       connections: int | None, window_s: float) -> ServerUsage:
        """The step as dCache's billing recorded it: its folder's pool transfers over
        the load (``read``, ``write``, ``transfers``, ``failed``), one per operation."""
        assert self.billing is not None
        counts = self.billing.counts if self.entered else None
        counter = self.billing_counter
        note = ("the load never began" if counts is None else counts.note)
        ops = counts.ops() if counts is not None else {}
        return ServerUsage(
            source=self.source, window_s=max(0.0, window_s), cpu_s=cpu_s,
            cores=usable_cores(self.pids) if self.pids else 0, threads=threads,
            connections=connections, ops=ops,
            counted=counter if ops and counter and not note else "",
            per_operation=1.0, counters_note=note, compare_with=counter, per_login=0.0)


def report_line(address: str) -> str:
    """The configuration line that has an xrootd report to ``address``."""
    return REPORT_LINE.format(address=address, every=REPORT_EVERY)


def disagreement(client_operations: int, in_flight: int, usage: ServerUsage,
                 clients: int = 0, limit: float = 0.02, who: str = "the server"
                 ) -> str | None:
    """Why the server's count of the step's operations and the clients' disagree by
    more than ``limit`` (a fraction), or None. ``in_flight``: requests the clients
    gave up on (hung), which the server may or may not have served; ``clients``: their
    logins, which a server may count as requests of the same kind (:data:`LOGIN_REQUESTS`
    each: the ``kXR_ping`` after a login is ``misc``, as a stat is)."""
    served = usage.operations
    if served is None or client_operations + in_flight <= 0:
        return None
    logins = clients * usage.per_login / usage.per_operation
    low, high = client_operations, client_operations + in_flight + logins
    nearest = min(max(served, low), high)
    gap = (served - nearest) / max(nearest, 1)
    if abs(gap) <= limit or math.isclose(served, nearest):
        return None
    return (f"{who} counted {served:.0f} of this step's operations "
            f"({usage.ops.get(usage.counted, 0)} {usage.counted!r} requests, "
            f"{usage.per_operation:g} per operation) where its clients made "
            f"{client_operations}"
            + (f" (and {in_flight} given up)" if in_flight else "")
            + f", {gap:+.1%}: the step did not measure what it claims ("
            + ("load from outside the plugin reached the server during the step"
               if gap > 0 else "requests the clients counted never reached the server")
            + "); rerun it on a quiet server")


def exporter_retries(client_operations: int, in_flight: int, usage: ServerUsage,
                     clients_failed: int = 0) -> tuple[int, str]:
    """The exporter's calls beyond the clients' operations that were retries inside
    them, and what says so (``0, ""``: none). A client library or a door that retries
    an upload inside one operation makes a ``createfile`` more: one that failed, or
    one whose file it removed again (:func:`.dcache_exporter.retried_calls`: every
    call beyond the clients' ``client_operations`` and ``in_flight`` must be matched
    by such a trace, failed calls beyond the ``clients_failed`` operations counted
    first). And billing, which keeps the step's folder, must have counted no transfer
    beyond the clients' operations (:attr:`ServerUsage.operations` of its
    ``transfers``): without billing's count (none for the step's operation, or not
    read) no call is taken for a retry. What this cannot tell from a retry: another
    client's create that failed, or whose file was removed again, outside the step's
    folder."""
    from .dcache_exporter import RETRY_TRACES, retried_calls
    from .server_usage import TRANSFERS

    figures = usage.exporter
    if (figures is None or figures.operations is None
            or figures.counter not in RETRY_TRACES):
        return 0, ""
    most = client_operations + in_flight
    billed = usage.operations if TRANSFERS in usage.ops else None
    if billed is None or billed > most:
        return 0, ""
    retried = retried_calls(figures.rose, figures.counter, most, clients_failed)
    if not retried:
        return 0, ""
    failed, removed = (figures.rose.get(name, 0.0) for name in RETRY_TRACES[figures.counter])
    call = figures.counter.rsplit("_", 1)[-1]
    return retried, (
        f"{retried} {call!r} call(s) beyond the clients' {most} operations taken for "
        f"retries inside them (a client library's or the door's): {failed:.0f} failed "
        f"(the clients' failed operations {clients_failed}), {removed:.0f} file(s) "
        f"removed again; billing counted {billed:.0f} transfers")


def exporter_disagreement(client_operations: int, in_flight: int, usage: ServerUsage,
                          clients: int = 0, limit: float = 0.02,
                          clients_failed: int = 0) -> str | None:
    """Why dCache's Prometheus exporter counted the step's operations otherwise than
    its clients did (its counter's rise, one per operation: :data:`.dcache_exporter.
    COUNTERS`), by more than ``limit``; None when they agree or nothing was compared.
    A login makes no chimera call of those (``per_login`` 0). On the ``srm`` door the
    counter is the SRM door's requests of a type (:data:`.dcache_exporter.
    SRM_COUNTERS`), and each of the ``clients``' logins may add its
    :data:`.dcache_exporter.PER_LOGIN` (a gfal2 client's login stat: one ``srmLs``).
    The calls that were retries inside the clients' operations (:func:`exporter_retries`;
    ``clients_failed``: the operations that failed at the clients) are not counted."""
    from .dcache_exporter import PER_LOGIN, SRM_PREFIX

    figures = usage.exporter
    if figures is None or not figures.counter or figures.operations is None:
        return None
    srm = figures.counter.startswith(SRM_PREFIX)
    # createfile, mkdir; the SRM door's ls, preparetoput
    counter = figures.counter.removeprefix(SRM_PREFIX) if srm \
        else figures.counter.rsplit("_", 1)[-1]
    retried, _ = exporter_retries(client_operations, in_flight, usage, clients_failed)
    view = ServerUsage(ops={counter: round(figures.operations) - retried}, counted=counter,
                       per_operation=1.0, per_login=PER_LOGIN.get(figures.counter, 0.0))
    return disagreement(client_operations, in_flight, view, clients=clients, limit=limit,
                        who="dCache's Prometheus exporter"
                            + (" (the SRM door's requests)" if srm else ""))


def parse_listen_address(value: str) -> str:
    """``--storage-server-monitor``: ``host:port`` (``[v6]:port``) to listen on for a
    remote storage's summary monitoring; a usage error naming the form otherwise."""
    from ..errors import StorageScaleUsageError

    host, _, port = value.strip().rpartition(":")
    if host and port.isdigit() and 0 < int(port) < 65536 and host.strip("[]"):
        return value.strip()
    raise StorageScaleUsageError(
        f"--storage-server-monitor {value!r}: give the address to listen on for the "
        f"storage's XRootD summary monitoring as host:port (e.g. 0.0.0.0:9931, the "
        f"destination of the servers' 'xrd.report HOST:9931 every 10s all sync').")
