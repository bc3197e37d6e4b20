"""The servers' side of a step: their processes sampled over the measured window, and
their own counters, so that a step shows what the storage says it served beside what
its clients measured.

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

A server's counters count requests by kind (``<ops>``: ``open``, ``rd``, ``misc``...);
how many of them one operation makes depends on the server's release (XRootD 5.5
counts a ``stat`` twice in ``misc``), so for an operation the step compares
(:data:`COUNTERS`) the watch measures it once per session: it sends a known number
of requests of that kind between two reports (:meth:`SummaryListener.per_operation`).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from xml.etree import ElementTree

from ..load.server_usage import ServerUsage

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
#: the largest packet read (a summary with every section is about 2 kB)
PACKET_BYTES = 65536
#: the most servers one listener keeps reports of (a flood of forged ``src`` names
#: does not grow the session's memory); and the most sender addresses remembered as
#: not the embedded server's
MAX_SOURCES = 1024
#: how long a sender found not to be the server's is not looked at again (s)
RECHECK_AFTER = 1.0


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


def _int(node: ElementTree.Element | None) -> int | None:
    try:
        return int((node.text or "").strip()) if node is not None else None
    except ValueError:
        return None


def _seconds(node: ElementTree.Element | None) -> float:
    if node is None:
        return 0.0
    return (_int(node.find("s")) or 0) + (_int(node.find("u")) or 0) / 1e6


def parse_summary(data: bytes, received: float | None = None) -> Summary | None:
    """A ``<statistics>`` packet of XRootD's summary monitoring; None for anything
    else (a packet from the network: no document type or entity is read)."""
    if b"<!" in data or b"<?xml" in data[1:]:
        return None
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError:
        return None
    if root.tag != "statistics":
        return None
    sections = {node.get("id"): node for node in root.findall("stats")}
    xrootd, proc = sections.get("xrootd"), sections.get("proc")
    ops_node = xrootd.find("ops") if xrootd is not None else None
    ops = {child.tag: value for child in (ops_node if ops_node is not None else [])
           if (value := _int(child)) is not None}
    link, sched = sections.get("link"), sections.get("sched")
    return Summary(
        source=root.get("src") or "?", received=time.time() if received is None else received,
        started=int(root.get("tos") or 0), ops=ops,
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


def _udp_ports(pids: list[int]) -> set[int]:
    """The local ports of the UDP sockets of ``pids`` and what they forked."""
    import psutil

    ports: set[int] = set()
    for pid in pids:
        for process in _tree(pid):
            try:
                listing = getattr(process, "net_connections", None) or process.connections
                ports.update(connection.laddr[1] for connection in listing(kind="udp")
                             if connection.laddr)
            except psutil.Error:
                continue
    return ports


class SummaryListener:
    """Receives XRootD summary reports on ``address`` (``host:port``; port 0: a free
    one) in a daemon thread and keeps each server's latest. Close it when done.

    ``senders``: the pids whose reports count (an embedded server's daemons, asked on
    each new sender): a packet from any other process's socket (a co-tenant of this
    host forging a report to pass or fail a step) is dropped. None (a remote storage's
    stream): every sender counts, at most :data:`MAX_SOURCES` servers."""

    def __init__(self, address: str = "127.0.0.1:0",
                 senders: Callable[[], list[int]] | None = None) -> None:
        self._senders = senders
        #: sender (host, port) -> True: one of ``senders``' sockets; else when it was
        #: last found not to be (``time.monotonic()``)
        self._trusted: dict[tuple, bool | float] = {}
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_DGRAM)
        self._socket.bind((host, int(port or 0)))
        self._socket.settimeout(0.2)  # the thread looks whether it was closed
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

    @property
    def address(self) -> str:
        """``host:port`` as ``xrd.report`` takes it."""
        host, port = self._socket.getsockname()[:2]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _receive(self) -> None:
        while not self._closed.is_set():
            try:
                data, sender = self._socket.recvfrom(PACKET_BYTES)
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            if not self._from_server(sender):
                continue
            summary = parse_summary(data)
            if summary is None:
                continue
            with self._condition:
                if summary.source not in self._latest and len(self._latest) >= MAX_SOURCES:
                    continue
                last = self._latest.get(summary.source)
                gap = summary.received - last.received if last is not None else 0.0
                if gap > 0.2:  # two packets of one report, or a stray one: not an interval
                    self._interval[summary.source] = min(
                        gap, self._interval.get(summary.source, gap))
                self._latest[summary.source] = summary
                self._condition.notify_all()

    def _from_server(self, sender: tuple) -> bool:
        """Whether a packet from ``sender`` (host, port) is one of the servers'. A
        sender found to be theirs stays so; one that is not is looked at again (the
        server may have started since) until :data:`MAX_SOURCES` were seen."""
        if self._senders is None:
            return True
        key, now = tuple(sender[:2]), time.monotonic()
        known = self._trusted.get(key)
        if known is True:
            return True
        if known is not None and now - known < RECHECK_AFTER:
            return False  # a flood from one sender costs one look a second
        if len(self._trusted) >= MAX_SOURCES:  # a flood of senders: keep the servers'
            self._trusted = {known: True for known, ok in self._trusted.items() if ok is True}
        try:
            pids = list(self._senders())
        except Exception:  # noqa: BLE001 - a server being stopped: no report counts
            pids = []
        ours = bool(pids) and key[1] in _udp_ports(pids)
        self._trusted[key] = True if ours else now
        return ours

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
                 send: Callable[[int], None] | None = None) -> None:
        self.source = source
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

    @contextmanager
    def bracket(self) -> Iterator[None]:
        """Around the load: the servers' reports at both ends, the processes sampled."""
        counter = COUNTERS.get(self.operation)
        self.entered = True
        if self.listener is not None and counter:  # before the start: nothing else runs
            self.per_operation = self.listener.per_operation(
                self.operation, self.door, counter, self.send)
        if self.listener is not None:
            self.before = self.listener.fresh(time.time())
        if self.pids:
            self.sampler = ProcessSampler(self.pids)
            self.sampler.start()
        try:
            yield
        finally:
            if self.sampler is not None:
                self.sampler.stop()
            if self.listener is not None and self.before:
                self.after = self.listener.fresh(time.time())

    def _counters(self) -> tuple[dict[str, int], str]:
        """The requests the servers counted over the load, and why none ("")."""
        if self.listener is None or not self.entered:
            return {}, ""
        if not self.before or not self.after:
            return {}, (f"no summary report from the server within "
                        f"{self.listener.wait_limit():g} s at the load's "
                        f"{'start' if not self.before else 'end'} (listening on "
                        f"{self.listener.address})")
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
        cpu_s = threads = connections = None
        if self.sampler is not None:
            cpu_s, threads, connections = self.sampler.over(measure_from, end_at)
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
        )


def report_line(address: str) -> str:
    """The configuration line that has an xrootd report to ``address``."""
    return REPORT_LINE.format(address=address, every=REPORT_EVERY)


def disagreement(client_operations: int, in_flight: int, usage: ServerUsage,
                 clients: int = 0, limit: float = 0.02) -> str | None:
    """Why the server's count of the step's operations and the clients' disagree by
    more than ``limit`` (a fraction), or None. ``in_flight``: requests the clients
    gave up on (hung), which the server may or may not have served; ``clients``: their
    logins, which a server may count as requests of the same kind (:data:`LOGIN_REQUESTS`
    each: the ``kXR_ping`` after a login is ``misc``, as a stat is)."""
    served = usage.operations
    if served is None or client_operations + in_flight <= 0:
        return None
    logins = clients * LOGIN_REQUESTS / usage.per_operation
    low, high = client_operations, client_operations + in_flight + logins
    nearest = min(max(served, low), high)
    gap = (served - nearest) / max(nearest, 1)
    if abs(gap) <= limit or math.isclose(served, nearest):
        return None
    return (f"the server counted {served:.0f} of this step's operations "
            f"({usage.ops.get(usage.counted, 0)} {usage.counted!r} requests, "
            f"{usage.per_operation:g} per operation) where its clients made "
            f"{client_operations}"
            + (f" (and {in_flight} given up)" if in_flight else "")
            + f", {gap:+.1%}: the step did not measure what it claims ("
            + ("load from outside the plugin reached the server during the step"
               if gap > 0 else "requests the clients counted never reached the server")
            + "); rerun it on a quiet server")


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
