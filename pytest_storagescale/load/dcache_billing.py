"""dCache's own account of a step: the transfers (and the flushes to tape and stages
from it) its billing service recorded.

Every pool transfer (a mover: a read or a write of one file through any door) ends in
a billing record, written by dCache's ``billing`` cell to a text file of the
instance's ``var/billing/<year>/<month>/`` folder, one line per record, each line
appended with its own write (``BillingCell``: ``Files.write(..., APPEND)``). The
embedded dCache writes them as JSON (``billing.format.json=true``: the record as
dCache's Kafka billing stream sends it, ``msgType``, ``isWrite``, ``transferSize``,
``billingPath``, ``status``...), one object a line.

:class:`BillingLog` reads what was appended since a mark, bounded, and keeps the pool
transfers (``msgType`` ``transfer``), the flushes to tape (``store``, written by the
pool when its nearline storage ended one) and the stages (``restore``) below one
folder. :class:`BillingWatch` brackets a
step's load: the billing files' ends at the start, then, after the load, the records
of the step's folder until no new one came for :data:`SETTLE_S` (a pool sends its
record when the mover ends, which may be after the client's answer), at most
:data:`SETTLE_DEADLINE_S`. Records are kept by their path (the step's own folder, so
another xdist worker's checks on the same dCache do not count) and their start (the
record's date, when the mover ended, less its transfer time: not before the load began,
so the set-up's uploads are not the load's). The counts go into the
step's :class:`~pytest_storagescale.load.server_usage.ServerUsage` (``read``,
``write``, ``transfers``, ``failed``; ``stored`` and ``restored`` beside them),
compared with the clients' operations as the xrootd summary counters are
(:func:`~.server_monitor.disagreement`).

A step's folder is its own directory and any folder named after it outside the run's
directory (``<run>/<step folder>-<suffix>``: the tape steps write into the
tape-backed directory so, ``suites/dcache/tape.py``). A ``restore`` record names no
path (dCache's pool sets none on a stage's record): it is the step's when its file
(``pnfsid``) is one whose transfer billing recorded below the step's folders since
the watch was made, before the set-up (:meth:`BillingWatch.prime`).
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
#: a ``get`` or ``put`` is one pool transfer (one mover) on every door; the tape
#: steps' ``flush`` and ``tape_write`` write one file each (their flushes are
#: ``stored``, counted beside)
COUNTERS = {"get": "read", "put": "write", "stream": "read", "flush": "write",
            "tape_write": "write"}
#: operations watched without a comparison: a ``stage`` moves no file through a door
#: (its ``restored`` files are counted)
WATCHED = ("stage",)
#: the billing records of pool transfers and of the nearline storage's flushes and
#: stages (``StorageInfoMessage``: ``store``, ``restore``)
KINDS = ("transfer", "store", "restore")
#: a composite step (readers and writers) compares every transfer
COMPOSITE_COUNTER = "transfers"
#: the billing files of one day (``billing-2026.11.29``; ``.json``, ``.error`` aside)
_BILLING_FILE = re.compile(r"billing-\d{4}\.\d{2}\.\d{2}")


@dataclass(frozen=True)
class Transfer:
    """One pool transfer (or a flush to tape, a stage from it) as dCache's billing
    recorded it."""

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
    #: ``transfer``; ``store`` (a flush to tape), ``restore`` (a stage from it)
    kind: str = "transfer"
    #: the file's id in the namespace ("": not in the record)
    pnfsid: str = ""


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
    """A pool transfer, flush or stage from one JSON billing line, or None (another
    kind of record, a line that is no JSON object)."""
    if len(line) > MAX_LINE or not line.lstrip().startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("msgType") not in KINDS:
        return None
    kind = str(record["msgType"])
    status = record.get("status")
    status = status if isinstance(status, dict) else {}
    protocol = record.get("protocolInfo")
    protocol = protocol if isinstance(protocol, dict) else {}
    path = record.get("billingPath") or record.get("transferPath") or ""
    if path == "Unknown":  # a record whose sender set no path (a stage's)
        path = ""
    # a flush reads the pool's replica to tape, a stage writes one from it
    direction = record.get("isWrite") if kind == "transfer" else kind == "restore"
    size_field = "transferSize" if kind == "transfer" else "fileSize"
    try:
        size, code = int(record.get(size_field) or 0), int(status.get("code") or 0)
    except (TypeError, ValueError):
        return None
    try:
        took = float(record.get("transferTime") or 0) / 1000.0
    except (TypeError, ValueError):
        took = 0.0
    # a mover's record is dated when the transfer ended (its start: the date less its
    # time); a flush's or stage's when the pool took the request (11.2.5: a store dated
    # 15:01:30.366, its transferTime 1,203 ms, the tape asked at 30.433): less its
    # time, a flush right after its write began before the step (CI, 2026-11-29)
    return Transfer(path=str(path), is_write=direction in ("write", True),
                    size=size, protocol=str(protocol.get("protocol") or ""), code=code,
                    message=str(status.get("msg") or ""),
                    when=_epoch(record.get("date")) - (took if kind == "transfer" else 0),
                    kind=kind,
                    pnfsid=str(record.get("pnfsid") or ""))


def normal_path(path: str) -> str:
    """A namespace path as billing writes it: one ``/`` between names, none at the end
    (an XRootD door's ``//storagescale/run`` is ``/storagescale/run``)."""
    return "/" + "/".join(part for part in path.split("/") if part)


def in_folder(path: str, folder: str) -> bool:
    """``path`` is below the step's ``folder`` (``<run>/<name>``), or below a folder
    named after it outside the run's directory (``.../<run>/<name>-<suffix>/...``:
    the tape steps' folders in the tape-backed directory; ``<run>/<name>-x`` beside
    the step's own is another step's)."""
    path, folder = normal_path(path), normal_path(folder)
    if path.startswith(folder + "/"):
        return True
    run, _, name = folder.rpartition("/")
    if not run or path.startswith(run + "/"):
        return False
    own = f"/{run.rsplit('/', 1)[-1]}/{name}-"
    at = path.find(own)
    return at >= 0 and "/" in path[at + len(own):]


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
    #: the step's files flushed to tape (``store``) and staged from it (``restore``)
    #: that billing recorded before the watch ended (failed ones among them:
    #: ``tape_failed``)
    stored: int = 0
    restored: int = 0
    stored_bytes: int = 0
    restored_bytes: int = 0
    tape_failed: int = 0
    #: why the counts are incomplete ("" when complete)
    note: str = ""

    @property
    def transfers(self) -> int:
        return self.read + self.write

    def ops(self) -> dict[str, int]:
        """As a server's request counters (:attr:`ServerUsage.ops`)."""
        tape = {"stored": self.stored, "restored": self.restored,
                "stored_bytes": self.stored_bytes, "restored_bytes": self.restored_bytes,
                "tape_failed": self.tape_failed}
        return {"read": self.read, "write": self.write, "transfers": self.transfers,
                "failed": self.failed, "read_bytes": self.read_bytes,
                "write_bytes": self.write_bytes,
                **{key: value for key, value in tape.items() if value}}


def count(transfers: list[Transfer], folder: str, since: float) -> BillingCounts:
    """The transfers, flushes and stages below ``folder`` (:func:`in_folder`) that
    began at ``since`` or later (a record without a time counts: its path is the
    step's own). A record without a path (a stage's) is the step's when its file is
    one an earlier record below the folder named (the set-up's writes among them)."""
    files = {t.pnfsid for t in transfers if t.pnfsid and t.path and in_folder(t.path, folder)}
    tally = dict.fromkeys(("read", "write", "failed", "read_bytes", "write_bytes", "stored",
                           "restored", "stored_bytes", "restored_bytes", "tape_failed"), 0)
    for transfer in transfers:
        if not (in_folder(transfer.path, folder) if transfer.path
                else transfer.pnfsid in files):
            continue
        if not math.isnan(transfer.when) and transfer.when < since:
            continue
        if transfer.kind != "transfer":
            kind = "stored" if transfer.kind == "store" else "restored"
            tally[kind] += 1
            tally[f"{kind}_bytes"] += transfer.size
            tally["tape_failed"] += transfer.code != 0
            continue
        tally["failed"] += transfer.code != 0  # a failed transfer is an operation too
        side = "write" if transfer.is_write else "read"
        tally[side] += 1
        tally[f"{side}_bytes"] += transfer.size
    return BillingCounts(
        read=tally["read"], write=tally["write"], failed=tally["failed"],
        read_bytes=tally["read_bytes"], write_bytes=tally["write_bytes"],
        stored=tally["stored"], restored=tally["restored"],
        stored_bytes=tally["stored_bytes"], restored_bytes=tally["restored_bytes"],
        tape_failed=tally["tape_failed"])


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
        self._primed = False
        self.counts: BillingCounts | None = None

    def prime(self) -> None:
        """The billing files' ends before the step's set-up: what is read later starts
        there, so the set-up's records name the files (a stage's ``restore`` names
        none) without being counted (they began before :meth:`start`)."""
        self._marks, self._primed = self.log.mark(), True

    def start(self) -> None:
        """The billing files' ends (unless :meth:`prime` marked them before the
        set-up), and the load's start (the records' earliest time)."""
        if not self._primed:
            self._marks = self.log.mark()
        # the pool's clock is this host's; its dates are in milliseconds. A transfer of
        # the set-up began before this, one of the load after
        self.began = self.clock() - 0.002

    def finish(self, wait: float | None = None) -> BillingCounts:
        """The step folder's transfers since :meth:`start`, once no new one came for
        ``settle_s`` (at most ``deadline_s``, or ``wait`` when interrupted), and the
        flushes and stages recorded by then (the pools go on flushing a tape step's
        files after its load: they do not hold the watch)."""
        limit = self.deadline_s if wait is None else wait
        deadline = time.monotonic() + limit
        transfers: list[Transfer] = []
        marks, budget = dict(self._marks), MAX_BYTES
        last_new = time.monotonic()
        note = ""
        while True:
            new, marks, read = self.log.since(marks, budget)
            budget -= read
            mine = [t for t in new if not t.path or in_folder(t.path, self.folder)]
            transfers.extend(mine)
            now = time.monotonic()
            if any(t.kind == "transfer" and t.path for t in mine):
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
    no transfer; a stage none through a door)."""
    if composite:
        return COMPOSITE_COUNTER
    return COUNTERS.get(operation, "")


def billing_folder(home: Path | str) -> Path:
    """Where a dCache instance's billing files are (``dcache.paths.billing``'s default,
    ``<home>/var/billing``)."""
    return Path(home) / "var" / "billing"


