"""dCache's own account of a step: the transfers its billing service recorded.

Every pool transfer (a mover: a read or a write of one file through any door) ends in
a billing record, written by dCache's ``billing`` cell to a text file of the
instance's ``var/billing/<year>/<month>/`` folder, one line per record, each line
appended with its own write (``BillingCell``: ``Files.write(..., APPEND)``). The
embedded dCache writes them as JSON (``billing.format.json=true``: the record as
dCache's Kafka billing stream sends it, ``msgType``, ``isWrite``, ``transferSize``,
``billingPath``, ``status``...), one object a line.

:class:`BillingLog` reads what was appended since a mark, bounded, and keeps the pool
transfers (``msgType`` ``transfer``) below one folder. :class:`BillingWatch` brackets a
step's load: the billing files' ends at the start, then, after the load, the records
of the step's folder until no new one came for :data:`SETTLE_S` (a pool sends its
record when the mover ends, which may be after the client's answer), at most
:data:`SETTLE_DEADLINE_S`. Records are kept by their path (the step's own folder, so
another xdist worker's checks on the same dCache do not count) and their start (the
record's date, when the mover ended, less its transfer time: not before the load began,
so the set-up's uploads are not the load's). The counts go into the
step's :class:`~pytest_storagescale.load.server_usage.ServerUsage` (``read``,
``write``, ``transfers``, ``failed``), compared with the clients' operations as the
xrootd summary counters are (:func:`~.server_monitor.disagreement`).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

#: after the load: the records are taken once none came for this long (s) ...
SETTLE_S = 2.0
#: ... or, at the latest, after this long (a pool whose records never come)
SETTLE_DEADLINE_S = 30.0
#: how often the billing files are read while settling (s)
POLL_S = 0.25
#: the most bytes read from the billing files per step (a record is ~1-2 kB: some
#: 100,000 transfers); beyond, the counts are not compared (said why)
MAX_BYTES = 256 * 1024 * 1024
#: a record's line longer than this is no record of ours (skipped unparsed)
MAX_LINE = 64 * 1024
#: the operations whose transfers the step compares, and the counter holding them:
#: a ``get`` or ``put`` is one pool transfer (one mover) on every door
COUNTERS = {"get": "read", "put": "write", "stream": "read"}
#: a composite step (readers and writers) compares every transfer
COMPOSITE_COUNTER = "transfers"
#: the billing files of one day (``billing-2026.11.29``; ``.json``, ``.error`` aside)
_BILLING_FILE = re.compile(r"billing-\d{4}\.\d{2}\.\d{2}")


@dataclass(frozen=True)
class Transfer:
    """One pool transfer as dCache's billing recorded it."""

    path: str
    is_write: bool
    size: int
    #: the mover's protocol (``Http``, ``Xrootd``, ``DCap``, ``GFtp``)
    protocol: str
    #: dCache's result code (0: succeeded) and message
    code: int
    message: str
    #: when the transfer began (epoch s; NaN: unknown): the record's ``date`` (written
    #: when the mover ended) less its ``transferTime`` (ms)
    when: float


def _epoch(value: object) -> float:
    """A billing date (ISO 8601 with an offset, or epoch milliseconds) as epoch s."""
    if isinstance(value, int | float):
        return float(value) / 1000.0
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        if re.search(r"[+-]\d{4}$", text):  # +0000 -> +00:00
            text = f"{text[:-2]}:{text[-2:]}"
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            return math.nan
    return math.nan


def parse_record(line: str) -> Transfer | None:
    """A pool transfer from one JSON billing line, or None (another kind of record,
    a line that is no JSON object)."""
    if len(line) > MAX_LINE or not line.lstrip().startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("msgType") != "transfer":
        return None
    status = record.get("status")
    status = status if isinstance(status, dict) else {}
    protocol = record.get("protocolInfo")
    protocol = protocol if isinstance(protocol, dict) else {}
    path = record.get("billingPath") or record.get("transferPath") or ""
    direction = record.get("isWrite")
    try:
        size, code = int(record.get("transferSize") or 0), int(status.get("code") or 0)
    except (TypeError, ValueError):
        return None
    try:
        took = float(record.get("transferTime") or 0) / 1000.0
    except (TypeError, ValueError):
        took = 0.0
    return Transfer(path=str(path), is_write=direction in ("write", True),
                    size=size, protocol=str(protocol.get("protocol") or ""), code=code,
                    message=str(status.get("msg") or ""),
                    when=_epoch(record.get("date")) - took)


def normal_path(path: str) -> str:
    """A namespace path as billing writes it: one ``/`` between names, none at the end
    (an XRootD door's ``//storagescale/run`` is ``/storagescale/run``)."""
    return "/" + "/".join(part for part in path.split("/") if part)


class BillingLog:
    """The billing files of one dCache instance (its ``var/billing`` folder)."""

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)

    def files(self) -> list[Path]:
        """Today's (and any other day's) billing files, found under the folder."""
        if not self.folder.is_dir():
            return []
        return sorted(path for path in self.folder.rglob("billing-*")
                      if _BILLING_FILE.match(path.name) and path.is_file())

    def mark(self) -> dict[Path, int]:
        """Each billing file's size now: what is read later starts there."""
        marks = {}
        for path in self.files():
            try:
                marks[path] = path.stat().st_size
            except OSError:
                continue
        return marks

    def since(self, marks: dict[Path, int], budget: int = MAX_BYTES
              ) -> tuple[list[Transfer], dict[Path, int], int]:
        """The transfers appended after ``marks`` (a file new since the mark from its
        start), the new marks, and the bytes read. A line not yet ended (a record being
        written) is left for the next read."""
        found: list[Transfer] = []
        moved = dict(marks)
        read = 0
        for path in self.files():
            start = marks.get(path, 0)
            try:
                with path.open("rb") as stream:
                    stream.seek(start)
                    data = stream.read(max(0, budget - read))
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            chunk = data[:end + 1]
            read += len(chunk)
            moved[path] = start + len(chunk)
            for line in chunk.decode("utf-8", "replace").splitlines():
                transfer = parse_record(line)
                if transfer is not None:
                    found.append(transfer)
            if read >= budget:
                break
        return found, moved, read


@dataclass(frozen=True)
class BillingCounts:
    """The transfers of one step's folder that billing recorded over its load."""

    #: the reads and writes recorded (failed ones among them: ``failed``)
    read: int = 0
    write: int = 0
    failed: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    #: why the counts are incomplete ("" when complete)
    note: str = ""

    @property
    def transfers(self) -> int:
        return self.read + self.write

    def ops(self) -> dict[str, int]:
        """As a server's request counters (:attr:`ServerUsage.ops`)."""
        return {"read": self.read, "write": self.write, "transfers": self.transfers,
                "failed": self.failed, "read_bytes": self.read_bytes,
                "write_bytes": self.write_bytes}


def count(transfers: list[Transfer], folder: str, since: float) -> BillingCounts:
    """The transfers below ``folder`` recorded at ``since`` or later (a record without
    a time counts: its path is the step's own)."""
    prefix = normal_path(folder) + "/"
    read = write = failed = read_bytes = write_bytes = 0
    for transfer in transfers:
        if not normal_path(transfer.path).startswith(prefix):
            continue
        if not math.isnan(transfer.when) and transfer.when < since:
            continue
        failed += transfer.code != 0  # a failed transfer is an operation too
        if transfer.is_write:
            write, write_bytes = write + 1, write_bytes + transfer.size
        else:
            read, read_bytes = read + 1, read_bytes + transfer.size
    return BillingCounts(read=read, write=write, failed=failed, read_bytes=read_bytes,
                         write_bytes=write_bytes)


class BillingWatch:
    """One step's load as dCache's billing saw it (see the module's doc)."""

    def __init__(self, log: BillingLog, folder: str, *, counter: str = "",
                 settle_s: float = SETTLE_S, deadline_s: float = SETTLE_DEADLINE_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.log = log
        self.folder = folder
        #: the counter compared with the step's operations (:func:`counter_for`)
        self.counter = counter
        self.settle_s = settle_s
        self.deadline_s = deadline_s
        self.clock = clock
        self.began = math.nan
        self._marks: dict[Path, int] = {}
        self.counts: BillingCounts | None = None

    def start(self) -> None:
        """The billing files' ends, and the load's start (the records' earliest time)."""
        self._marks = self.log.mark()
        # the pool's clock is this host's; its dates are in milliseconds. A transfer of
        # the set-up began before this, one of the load after
        self.began = self.clock() - 0.002

    def finish(self, wait: float | None = None) -> BillingCounts:
        """The step folder's transfers since :meth:`start`, once no new one came for
        ``settle_s`` (at most ``deadline_s``, or ``wait`` when interrupted)."""
        limit = self.deadline_s if wait is None else wait
        deadline = time.monotonic() + limit
        transfers: list[Transfer] = []
        marks, budget = dict(self._marks), MAX_BYTES
        last_new = time.monotonic()
        note = ""
        while True:
            new, marks, read = self.log.since(marks, budget)
            budget -= read
            mine = [t for t in new if normal_path(t.path).startswith(
                normal_path(self.folder) + "/")]
            transfers.extend(mine)
            now = time.monotonic()
            if mine:
                last_new = now
            if budget <= 0:
                note = (f"the billing files grew by more than {MAX_BYTES // 2**20} MiB "
                        f"during the step: not read further")
                break
            if now - last_new >= min(self.settle_s, limit):
                break
            if now >= deadline:
                note = (f"billing records of the step still arriving {limit:g} s after "
                        f"its load: the counts may be short")
                break
            time.sleep(POLL_S)
        counts = count(transfers, self.folder, self.began)
        self.counts = BillingCounts(**{**counts.__dict__, "note": note})
        return self.counts


def counter_for(operation: str, composite: bool) -> str:
    """The counter compared with a step's operations ("" none: a namespace step makes
    no transfer)."""
    if composite:
        return COMPOSITE_COUNTER
    return COUNTERS.get(operation, "")


def billing_folder(home: Path | str) -> Path:
    """Where a dCache instance's billing files are (``dcache.paths.billing``'s default,
    ``<home>/var/billing``)."""
    return Path(home) / "var" / "billing"



# -- dCache 11.1+'s Prometheus JMX exporter ------------------------------------------------
#: the most bytes of one scrape of the exporter (its answer is some 100 kB)
MAX_SCRAPE_BYTES = 16 * 1024 * 1024
#: the exporter's namespace counters (PnfsManager's requests by message type, and
#: chimera's calls by method, with the release's own rules): what a namespace step
#: made dCache do, beside the clients' operations
NAMESPACE_PREFIXES = ("dcache_pnfsmanager_ops_", "dcache_pnfsmanager_messages_")


def scrape_exporter(url: str, user: str, password: str, timeout: float = 30
                    ) -> dict[str, float]:
    """One scrape of dCache's Prometheus JMX exporter (``dcache.enable.prometheus.
    exporter``: the JVM's agent, HTTP basic authentication): every sample, by its name
    and labels (``name{label="v"}``), parsed by prometheus_client's parser. At most
    :data:`MAX_SCRAPE_BYTES`; an error naming the URL (never the password)."""
    import base64
    import urllib.error
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from ..errors import EndpointError

    secret = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {secret}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            body = answer.read(MAX_SCRAPE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise EndpointError(f"dCache's Prometheus exporter {url} answered {exc.code}") from None
    except (OSError, urllib.error.URLError) as exc:
        raise EndpointError(f"dCache's Prometheus exporter {url}: {exc}") from None
    if len(body) > MAX_SCRAPE_BYTES:
        raise EndpointError(f"dCache's Prometheus exporter {url} answered more than "
                            f"{MAX_SCRAPE_BYTES >> 20} MiB: not read")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode("utf-8", errors="replace")):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return samples


def exporter_counts(before: dict[str, float], after: dict[str, float],
                    prefixes: tuple[str, ...] = NAMESPACE_PREFIXES) -> dict[str, float]:
    """What the exporter's namespace counters rose by between two scrapes (only those
    that rose; a counter gone or lower, a restarted JVM, is left out)."""
    return {name: after[name] - before.get(name, 0.0) for name in sorted(after)
            if name.startswith(prefixes) and after[name] > before.get(name, 0.0)}
