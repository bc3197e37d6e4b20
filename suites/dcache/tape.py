"""The tape steps' operations (seed 004: the pools in front of HPSS): ``flush`` and
``stage``, registered by the suite's conftest (``pytest_storagescale_operations``).

Both need the tape of the embedded dCache (``EmbeddedDCache(tape=...)``: a tape
library emulated in the run's folder behind both pools, ``servers/dcache_tape.py``),
given to the step as ``context={"tape": server.tape_access}``; each makes a folder of
its own in the tape-backed directory (``/storagescale/tape``) and the test removes it.

- ``flush``: one repetition writes a new file through the step's door into the
  tape-backed directory and waits until its locality says it is on tape
  (``NEARLINE``/``ONLINE_AND_NEARLINE``, the frontend's answer): the latency is the
  flush latency (write included), the rate the flushes per second.
- ``tape_write`` (seed 004's central flushing): one repetition writes a new file into
  the tape-backed directory (``into = "tape"``) or into a folder never flushed
  (``"disk"``); the suite alternates the two in windows, disk tape tape disk ..., and
  judges the ratio tape/disk of their MB/s with the paired gate's statistics
  (:func:`judge_flushing`: :func:`pytest_storagescale.gate.judge_pairs`).
- ``stage``: the set-up writes ``files`` files, waits for their flush and evicts each
  from the pools' disks (the replica file leaves the pool's folder); one repetition
  stages the next one through the ``interface`` (``srm``: SRM bringOnline through
  gfal2, polled; ``root``: ``xrdfs prepare -s`` through the xrootd door, the locality
  polled; ``tape-rest``: the WLCG Tape REST API, ``POST /api/v1/tape/stage``, polled,
  then ``release``; ``login = "token"``: with a bearer token, a macaroon the WebDAV door
  minted, instead of the password; ``login = "jwt"``: with a WLCG-profile JWT of an
  outside issuer the server trusts, ``storage.stage`` of the tape-backed directory, as
  a WLCG site's clients log in (the embedded dCache's loopback OIDC issuer,
  ``servers/oidc_issuer.py``, checked by its gPlazma ``oidc`` plugin); ``login =
  "x509"``: with the session user's X.509 proxy as the TLS client certificate) and
  waits until it is on disk again: the latency is
  the stage latency. A step stages each file once (``operations = files``).

A file dCache cannot stage ends the stage at once, as a failure naming dCache's answer:
a Tape REST file ``FAILED`` (or ``CANCELLED``, ``SKIPPED``) with its error, or a file
whose restore dCache's billing recorded as failed with ``BROKEN_ON_TAPE`` (code 243:
the tape copy is gone; :class:`LostOnTape`). dCache itself never ends such a request:
its PinManager asks for the restore again every 30 s, with no deadline for a Tape REST
request (the bulk service waits for the pin with ``Long.MAX_VALUE``), so the Tape REST
API shows the file ``STARTED`` for ever; the stage cancels the request (SRM: aborts it)
and says so. A restore that failed otherwise (a drive's error) is retried by dCache
and waited for, up to the step's deadline.
"""

from __future__ import annotations

import itertools
import math
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_storagescale import (
    GateSettings,
    GateVerdict,
    Operation,
    Param,
    StorageScaleUsageError,
    WindowSample,
    driver_spec,
    judge_pairs,
)

#: the most one file's flush or stage is waited for (s); the step's hang_timeout is
#: what judges a slow one
WAIT_S = 900.0
#: how long a file asked for with ``xrdfs prepare -s`` may stay on tape only (s)
ROOT_STAGE_S = 120.0
#: the pause between polls (s)
POLL_S = 0.2
#: the localities of a file on tape, and on disk
ON_TAPE = frozenset({"NEARLINE", "ONLINE_AND_NEARLINE"})
ON_DISK = frozenset({"ONLINE", "ONLINE_AND_NEARLINE"})
#: the stage interfaces (the thresholds' and records' names)
INTERFACES = ("srm", "root", "tape-rest")
#: the Tape REST API's logins: the user's password, a bearer token (dCache's own
#: macaroon), a WLCG-profile JWT of an outside issuer, the X.509 proxy
LOGINS = ("password", "token", "jwt", "x509")
#: the Tape REST API's file states that end a file other than staged
ENDED = ("FAILED", "CANCELLED", "SKIPPED")
#: a central-flushing step writes for at least this many times the tape library's
#: flush delay (``TapeLibrary.flush_delay_s``, 3 s by default): a shorter one ends
#: before a flush of its files can begin (its 20 s are 2 s at --storage-scale 0.1)
WRITING_FLUSH_DELAYS = 5
#: what the central-flushing step observes (``TapeWrite.observe``): the rules may name them
METRICS = {
    "flushes_during": "files the pools flushed to tape while the step's clients wrote "
                      "(the tape library's log)",
    "flushed_mb_during": "MB the pools flushed to tape while the step's clients wrote",
    # the central-flushing comparison (test_central_flushing, :func:`judge_flushing`),
    # on its last window
    "flush_ratio": "central flushing: the tape windows' MB/s over the disk windows' (the "
                   "geometric mean of the pairs' ratios, the gate's paired_effect)",
    "flush_ratio_low": "central flushing: the low end of flush_ratio's 95 % interval",
    "flush_ratio_high": "central flushing: the high end of flush_ratio's 95 % interval",
    "flush_regressed": "central flushing: 1 when flush_ratio's interval lies wholly below "
                       "1 - min_effect_rate (flushing cost the writers more than that "
                       "share), else 0",
    "flushes_beside_disk": "central flushing: flushes that ran during the disk windows "
                           "(the tape windows' files flushed late): 0 for a clean baseline",
}
#: the central-flushing comparison's pairs of windows (disk, tape): the gate's fewest
#: (``GateSettings.min_samples``, the paired mode's first round), in the order disk
#: tape tape disk ...
FLUSHING_PAIRS = 4
#: the longest a disk window waits for the pools to flush the tape windows' files
#: written before it (s; at least 10 flush delays of the library): a flush running
#: during a disk window would make the baseline a flushing one too
DRAIN_MIN_S = 60.0


def _access(step: Any, name: str) -> Any:
    access = (step.extra or {}).get("tape") if step is not None else None
    if access is None:
        raise StorageScaleUsageError(
            f"the {name} step needs the embedded dCache's tape: run it with "
            f"storage_load.run(..., context={{'tape': server.tape_access}}) on an "
            f"EmbeddedDCache(tape=TapeLibrary(...)).")
    return access


def _folder(driver: Any, step: Any, workdir: str) -> str:
    """The step's folder in the tape-backed directory: under the run's own folder
    there (``context={"prefix": <run id>}``), which the test removes. Made through a
    client of the step's door that may write there (the step's own clients may write
    only in the run's directory)."""
    extra = step.extra or {}
    prefix = str(extra.get("prefix") or "steps")
    folder = (f"{extra['tape'].area}/{prefix}/"
              f"{workdir.rstrip('/').rsplit('/', 1)[-1]}-{secrets.token_hex(3)}")
    client = extra["tape"].client(driver.endpoint.scheme, driver.name, "tape-set-up")
    try:
        client.mkdir(folder)
    finally:
        client.close()
    return folder


def _client(driver: Any, client: int, context: dict, root: str | None = None) -> Any:
    """Client ``client``'s own client of the step's door, writable in the tape-backed
    directory (made once, closed by the operation's clean-up); with ``root``, the same
    client (the door, driver and options :meth:`TapeAccess.client` gives) writable in
    ``root`` only: a central-flushing disk window writes as its tape windows do, only
    the directory differs."""
    with context["lock"]:
        made = context["clients"].get(client)
    if made is None:
        access, scheme = context["access"], driver.endpoint.scheme
        if root is None:
            made = access.client(scheme, driver.name, f"tape-{client}")
        else:
            options = {key: value for key, value in access.driver_options
                       if not (key == "security_protocol" and scheme in ("davs", "https"))}
            made = driver_spec(dict(access.doors)[scheme], driver=driver.name,
                               options=options, writable_root=root
                               ).connect(f"disk-{client}", timeout=60)
        with context["lock"]:
            context["clients"][client] = made
    return made


class StageFailed(RuntimeError):
    """The step's interface failed an earlier file (said again for the rest), or the
    Tape REST API ended a file of the request other than ``COMPLETED``."""


class LostOnTape(RuntimeError):
    """dCache recorded a file's stage as failed with ``BROKEN_ON_TAPE``: its tape copy
    is gone, no retry stages it (dCache retries it anyway: the stage cancelled it)."""


class _TapeOperation(Operation):
    in_process = True  # the frontend's password is in the context: never pickled out

    def cleanup(self, context):
        for made in context.get("clients", {}).values():
            made.close()


class Flush(_TapeOperation):
    """Write a file into the tape-backed directory, wait until it is on tape."""

    name = "flush"
    parameters = {"file_size": Param("bytes", 1_000_000, description="bytes per file")}

    def prepare(self, driver, workdir, params, clients, step=None):
        access = _access(step, self.name)
        return {"folder": _folder(driver, step, workdir), "access": access,
                "data": b"f" * params["file_size"], "lock": threading.Lock(),
                "clients": {}, **params}

    def run(self, driver, client, iteration, context):
        path = f"{context['folder']}/c{client}-{iteration}"
        _client(driver, client, context).put(path, context["data"])
        context["access"].control().wait_locality(path, ON_TAPE, WAIT_S)
        return len(context["data"])


class Stage(_TapeOperation):
    """Stage the next evicted file through ``interface``, wait until it is on disk."""

    name = "stage"
    parameters = {
        "file_size": Param("bytes", 1_000_000, description="bytes per file"),
        "files": Param("count", 10, description="files written, flushed and evicted first"),
        "interface": Param("choice", "tape-rest", INTERFACES,
                           description="how the stage is asked for"),
        "per_request": Param("count", 1, description="files one stage request names"),
        "login": Param("choice", "password", LOGINS,
                       description="the Tape REST API's login: the user's password, a "
                                   "bearer token (a macaroon the WebDAV door mints), a "
                                   "WLCG-profile JWT of an outside issuer the server "
                                   "trusts, or the session user's X.509 proxy (no "
                                   "password)"),
    }

    def prepare(self, driver, workdir, params, clients, step=None):
        access = _access(step, self.name)
        if params["login"] != "password" and params["interface"] != "tape-rest":
            raise StorageScaleUsageError(
                f"login = \"{params['login']}\" is the Tape REST API's (interface = "
                f"\"tape-rest\"), not {params['interface']!r}'s: SRM logs in with the "
                f"X.509 proxy, the xrootd door anonymously")
        if params["login"] == "x509" and not access.x509_proxy:
            raise StorageScaleUsageError(
                "login = \"x509\": the embedded dCache handed out no X.509 proxy "
                "(x509_proxy); give login = \"password\" or \"token\"")
        if params["login"] == "jwt" and access.oidc is None:
            raise StorageScaleUsageError(
                "login = \"jwt\": the embedded dCache trusts no token issuer (its "
                "loopback OIDC issuer comes with the tape: EmbeddedDCache(oidc_issuer=True)); "
                "give login = \"token\" for dCache's own macaroon")
        control = access.control()
        folder = _folder(driver, step, workdir)
        data = b"s" * params["file_size"]
        paths = [f"{folder}/staged-{index}" for index in range(params["files"])]
        writer = access.client(driver.endpoint.scheme, driver.name, "tape-set-up")
        try:
            for path in paths:
                writer.put(path, data)
        finally:
            writer.close()
        for path in paths:
            control.wait_locality(path, ON_TAPE, WAIT_S)
        control.evict_many(paths)
        # the step's token, minted once (never pickled out: the operation runs in process)
        token = (access.mint_token() if params["login"] == "token"
                 else access.mint_jwt() if params["login"] == "jwt" else None)
        return {"folder": folder, "access": access, "paths": paths, "next": itertools.count(),
                "lock": threading.Lock(), "clients": {}, "size": len(data), "token": token,
                **params}

    def run(self, driver, client, iteration, context):
        count = context["per_request"]
        with context["lock"]:
            first = next(context["next"]) * count
        paths = context["paths"][first:first + count]
        if len(paths) < count:
            raise StorageScaleUsageError(
                f"every one of the {len(context['paths'])} evicted files was staged: give "
                f"the stage section operations = files / per_request")
        if context.get("refused"):  # the interface failed this step already: say it again
            raise StageFailed(context["refused"])
        try:
            stage(context["access"].control(context["token"], x509=context["login"] == "x509"),
                  context["interface"], paths)
        except Exception as exc:
            if context["interface"] == "root":  # one answer per step, not one wait a file
                context["refused"] = f"{type(exc).__name__}: {exc}"
            raise
        return context["size"] * count


class TapeWrite(_TapeOperation):
    """Seed 004's central-flushing question: write throughput while the pools flush.

    ``into = "tape"``: each repetition writes a new file into the tape-backed
    directory (the pools flush each a second after its write, so flushes, which read
    the pools' disks, run between and beside the writes); ``into = "disk"``: the same
    writes into the step's own folder, never flushed (the baseline). The suite runs
    the two as short alternating windows, disk tape tape disk ... (:func:`window_order`),
    and judges the pairs' MB/s tape/disk with the paired gate (:func:`judge_flushing`);
    :meth:`observe` says how many flushes ran
    while the clients wrote (``flushes_during``, ``flushed_mb_during``: the library's
    log, requests that began after the set-up), so a "tape" step during which nothing
    was flushed is seen as such (a rule ``flushes_during > 0``)."""

    name = "tape_write"
    parameters = {
        "file_size": Param("bytes", 10_000_000, description="bytes per file"),
        "into": Param("choice", "tape", ("tape", "disk"),
                      description="the tape-backed directory, or the step's own folder"),
    }

    def prepare(self, driver, workdir, params, clients, step=None):
        access = _access(step, self.name)
        driver.mkdir(workdir)
        folder = _folder(driver, step, workdir) if params["into"] == "tape" else workdir
        return {"folder": folder, "access": access, "data": b"w" * params["file_size"],
                "lock": threading.Lock(), "clients": {}, "began": time.time(), **params}

    def run(self, driver, client, iteration, context):
        path = f"{context['folder']}/c{client}-{iteration}"
        if context["into"] == "tape":
            writer = _client(driver, client, context)
        else:  # the same kind of client, writable in the step's own folder only
            writer = _client(driver, client, context, root=context["folder"])
        writer.put(path, context["data"])
        return len(context["data"])

    def observe(self, context):
        ended = time.time()
        flushes = [record for record in context["access"].control().records()
                   if record.get("op") == "put" and not record.get("error")
                   and context["began"] <= record.get("started", 0) <= ended]
        return {"flushes_during": float(len(flushes)),
                "flushed_mb_during": sum(record.get("bytes", 0) for record in flushes) / 1e6}


def central_flushing_duration(planned: float, library: Any) -> float | None:
    """The duration (s) a central-flushing step of ``planned`` seconds runs instead on
    ``library`` (a :class:`~pytest_storagescale.servers.dcache_tape.TapeLibrary`), or
    None when ``planned`` leaves the pools time to flush beside the writes."""
    floor = WRITING_FLUSH_DELAYS * library.flush_delay_s
    return floor if planned < floor else None


def window_order(pairs: int = FLUSHING_PAIRS) -> list[str]:
    """The labels of a central-flushing comparison's windows, as the paired gate
    alternates two servers (:func:`pytest_storagescale.paired.pairs_order`: A B B A
    ...): ``disk`` (A, the baseline) and ``tape`` (B), ``pairs`` of each, so that what
    the machine does during one pair it does to both of its windows."""
    if pairs < 1:
        raise ValueError(f"a central-flushing comparison of {pairs} pairs: give 1 or more")
    return [label for index in range(pairs)
            for label in (("disk", "tape") if index % 2 == 0 else ("tape", "disk"))]


def window_sample(result: Any) -> WindowSample:
    """One window (a step's :class:`~pytest_storagescale.load.stats.StepResult`) as one
    sample of the paired gate: its **bytes** written (the count) over its measured
    window, so the sample's ``rate_hz`` is its bytes per second (MB/s x 1e6), and its
    p50 and p99 (None without a succeeded write)."""
    total = result.total
    latency = total.latency_s if total.succeeded else {}

    def seconds(key: str) -> float | None:
        value = latency.get(key)
        return None if value is None or value != value else float(value)

    return WindowSample(start_s=0.0, width_s=float(result.duration_s),
                        operations=int(total.bytes), p50_s=seconds("p50"),
                        p99_s=seconds("p99"))


def flushing_pairs(windows: Sequence[tuple[str, WindowSample]]
                   ) -> list[tuple[WindowSample, WindowSample]]:
    """The pairs ``(disk, tape)`` of windows measured in :func:`window_order`: the
    n-th disk window with the n-th tape window (made one right after the other: disk
    tape, then tape disk, ...), as :func:`pytest_storagescale.paired.measure_alternating`
    pairs side A's n-th run with side B's; a window without its partner is left out."""
    unknown = sorted({label for label, _ in windows} - {"disk", "tape"})
    if unknown:
        raise ValueError(f"central-flushing windows labelled {unknown}: disk or tape only")
    disk = [sample for label, sample in windows if label == "disk"]
    tape = [sample for label, sample in windows if label == "tape"]
    return list(zip(disk, tape, strict=False))


@dataclass(frozen=True)
class Flushing:
    """The central-flushing comparison judged: the paired gate's :class:`StepGate` of
    tape (B) against disk (A) over the pairs of windows. The verdict is its write
    throughput's (the rate effect's, bytes per second): ``regressed`` when the
    interval of tape/disk lies wholly below ``1 - min_effect_rate`` (flushing cost the
    writers more than that share), ``improved`` wholly above ``1 / (1 -
    min_effect_rate)``, ``unchanged`` wholly between, ``inconclusive`` across a bound
    or with too few pairs. The p99 of the writes is shown, not judged."""

    gate: Any  # the paired gate's StepGate
    pairs: int

    @property
    def effect(self) -> Any:
        return self.gate.effects.get("rate_hz")

    @property
    def verdict(self) -> GateVerdict:
        effect = self.effect
        return effect.verdict if effect is not None else GateVerdict.INCONCLUSIVE

    def metrics(self) -> dict[str, float]:
        """``flush_ratio``, ``flush_ratio_low``, ``flush_ratio_high`` (NaN when not
        computed: too few pairs, which no rule accepts) and ``flush_regressed``."""
        effect = self.effect

        def number(value: float | None) -> float:
            return math.nan if value is None else float(value)

        return {"flush_ratio": number(effect.ratio if effect else None),
                "flush_ratio_low": number(effect.low if effect else None),
                "flush_ratio_high": number(effect.high if effect else None),
                "flush_regressed": float(self.verdict is GateVerdict.REGRESSED)}

    def text(self) -> str:
        """``tape/disk MB/s 0.76 [0.64-0.90] over 4 pairs: unchanged (95 % interval
        against the share flushing may cost, min_effect_rate 0.5: below 0.5 regressed,
        above 2 improved); write p99 tape/disk 1.45 [1.06-1.99] (shown, not judged)``;
        with too few pairs, the gate's reason."""
        effect = self.effect
        if effect is None or effect.low is None:
            return (f"tape/disk MB/s {effect.interval_text() if effect else '?'} over "
                    f"{self.pairs} pair{'s' * (self.pairs != 1)}: {self.verdict.value} "
                    f"({self.gate.reason})")
        share = effect.min_effect
        p99 = self.gate.effects.get("p99_s")
        latency = (f"; write p99 tape/disk {p99.interval_text()} (shown, not judged)"
                   if p99 is not None else "")
        return (f"tape/disk MB/s {effect.interval_text()} over {self.pairs} pairs: "
                f"{self.verdict.value} (95 % interval against the share flushing may "
                f"cost, min_effect_rate {share:g}: wholly below {1 - share:.2g} regressed, "
                f"wholly above {1 / (1 - share):.2g} improved){latency}")


def judge_flushing(windows: Sequence[tuple[str, WindowSample]],
                   settings: GateSettings | None = None) -> Flushing:
    """The central-flushing comparison of ``windows`` (label, sample), in the order
    they were measured: their pairs (:func:`flushing_pairs`) judged by the paired
    gate (:func:`pytest_storagescale.gate.judge_pairs`: the geometric mean of the
    pairs' tape/disk ratios with its bootstrap interval, ``settings``' minimum
    effects and confidence)."""
    pairs = flushing_pairs(windows)
    return Flushing(judge_pairs(pairs, settings=settings or GateSettings()), len(pairs))


def wait_flushed(control: Any, since: float, written: int, timeout: float) -> int:
    """Wait until the tape library logged ``written`` flushes (successful ``put``
    records) that began at or after ``since`` (a time.time()), at most ``timeout``
    seconds: how many were still missing then (0: all flushed)."""
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        done = sum(1 for record in control.records()
                   if record.get("op") == "put" and not record.get("error")
                   and record.get("started", 0) >= since)
        if done >= written or time.monotonic() >= deadline:
            return max(0, written - done)
        time.sleep(max(POLL_S, 1.0))


def stage(control: Any, interface: str, paths: list[str], timeout: float = WAIT_S) -> float:
    """Stage ``paths`` through ``interface`` in one request (SRM: one bringOnline a
    file, all asked before any is polled) and wait until each is on disk (then
    release them where the interface has a release): the seconds it took. A file
    dCache reports it cannot stage ends it at once (:class:`StageFailed`,
    :class:`LostOnTape`), a stage not done by ``timeout`` with a TimeoutError."""
    began = time.monotonic()
    deadline = began + timeout
    lost = _LostCheck(control, paths)
    if interface == "tape-rest":
        request = control.stage_tape_rest(paths)
        while True:
            files = control.tape_rest_files(request)
            states = {path: entry["state"] for path, entry in files.items()}
            if all(states.get(path) == "COMPLETED" for path in paths):
                break
            ended = {path: f"{entry['state']}: {entry['error'] or 'no error given'}"
                     for path, entry in files.items() if entry["state"] in ENDED}
            if ended:
                raise StageFailed(f"Tape REST stage {request}: {_some(ended)}")
            pending = [path for path in paths if states.get(path) != "COMPLETED"]
            lost.check(pending, f"Tape REST stage {request}",
                       lambda waiting: _cancel_tape_rest(control, request, waiting))
            if time.monotonic() > deadline:
                raise TimeoutError(f"Tape REST stage {request}: not staged in "
                                   f"{timeout:.0f} s: {_some(states)}")
            time.sleep(POLL_S)
        control.release_tape_rest(request, paths)
    elif interface == "srm":
        _bring_online(control, paths, deadline, lost)
    elif interface == "root":
        control.prepare_xrootd(paths)
        # 10.2.25's door answers OK and stages nothing (the files stayed on tape 4 min
        # and more): a stage that has not begun within ROOT_STAGE_S is a failure
        for path in paths:
            control.wait_locality(path, ON_DISK,
                                  max(1.0, min(deadline, began + ROOT_STAGE_S) - time.monotonic()))
    else:
        raise StorageScaleUsageError(f"unknown stage interface {interface!r}: "
                                     f"{', '.join(INTERFACES)}")
    for path in paths:
        locality = control.locality(path)
        if locality not in ON_DISK:
            raise AssertionError(f"{path}: staged through {interface}, but its locality is "
                                 f"{locality}")
    return time.monotonic() - began


def _some(by_path: dict[str, str], most: int = 3) -> str:
    """A few paths' states or errors (and how many more), for a message."""
    shown = "; ".join(f"{path}: {what}" for path, what in list(by_path.items())[:most])
    more = len(by_path) - most
    return shown + (f" (and {more} more)" if more > 0 else "")


def _cancel_tape_rest(control: Any, request: str, paths: list[str]) -> str:
    """Cancel ``paths`` of the Tape REST request: what dCache says of them then."""
    status = control.cancel_tape_rest(request, paths)
    try:
        states = control.poll_tape_rest(request)
    except Exception as exc:  # noqa: BLE001 - said in the message, the stage fails anyway
        return f"cancel answered {status}; the request could not be read after: {exc}"
    after = sorted({states.get(path, "?") for path in paths})
    return f"cancel answered {status}, the file state now {'/'.join(after)}"


class _LostCheck:
    """Whether dCache's billing recorded a failed restore with ``BROKEN_ON_TAPE`` for
    a file of the stage (read from the stage's start; the files' pnfsids looked up only
    once a failed restore with that code was recorded)."""

    def __init__(self, control: Any, paths: list[str]) -> None:
        self.control = control
        self.watch = control.restore_watch()
        self.pnfsids: dict[str, str] = {}

    def check(self, pending: list[str], what: str, cancel: Any) -> None:
        """Raise :class:`LostOnTape` when a file of ``pending`` is lost on tape, after
        ``cancel(<its paths>)`` (what it returns is said)."""
        lost_code = self.control.broken_on_tape
        if not any(record.code == lost_code for record in self.watch.failures()):
            return
        for path in pending:
            if path not in self.pnfsids:
                self.pnfsids[path] = str(self.control.attributes(path).get("pnfsId", ""))
        lost = self.watch.lost({self.pnfsids[path] for path in pending})
        if not lost:
            return
        by_path = {path: f"{self.pnfsids[path]}: {lost[self.pnfsids[path]].message}"
                   for path in pending if self.pnfsids[path] in lost}
        said = cancel(list(by_path))
        raise LostOnTape(
            f"{what}: dCache could not stage {len(by_path)} of {len(pending)} waiting "
            f"file(s), its restore failed with code {lost_code} (BROKEN_ON_TAPE: the "
            f"tape copy is gone): {_some(by_path)}. dCache keeps the request going (its "
            f"PinManager asks for the restore again every 30 s, for ever): {said}")


def _bring_online(control: Any, paths: list[str], deadline: float, lost: _LostCheck) -> None:
    """SRM bringOnline of each path, polled until all are online, then released."""
    stager = control.srm_stager()
    try:
        tokens = {path: stager.bring_online(path) for path in paths}
        waiting = [path for path, (_, done) in tokens.items() if not done]
        while waiting:
            lost.check(waiting, "srmBringOnline", lambda files: stager.abort(
                {path: tokens[path][0] for path in files}))
            if time.monotonic() > deadline:
                raise TimeoutError(f"srmBringOnline: {waiting[:3]} not online in time")
            time.sleep(POLL_S)
            waiting = [path for path in waiting if not stager.poll(path, tokens[path][0])]
        for path, (token, _) in tokens.items():
            stager.release(path, token)
    finally:
        stager.close()


OPERATIONS = (Flush(), Stage(), TapeWrite())
