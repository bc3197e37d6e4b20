"""Run one load step: C clients repeat an operation back to back for a duration.

The step is closed-loop, like the seeds' batch jobs: every client starts its next
operation as soon as the last one ended. Timeline of a step (wall clock)::

    logins ── start_at ── warm-up ── measure_from ── duration ── end_at ── drain (<= hang_timeout)

Every client connects and logs in first (``Driver.connect``; at most ``hang_timeout``,
a login stuck longer is a hung client); the clock starts when all have, so C logins
at once (which a server's listen queue may drop) are not measured as the operation.

Only operations that *complete* inside ``[measure_from, end_at]`` count: ``rate_hz =
succeeded / duration``. An operation still running ``hang_timeout`` after it started
marks its client **hung**; the client is abandoned (threads) or killed with its
process (processes), so a frozen server cannot stop a step from ending by
``end_at + hang_timeout``. A count-bounded step (``max_operations``) ends as soon as
its operations are done, and is measured over the time they took.

Every other call to the storage has a deadline too (:mod:`.watch`): a probe before
the set-up (``hang_timeout``: after a step whose clients hung, a frozen storage makes
the next step an error within seconds instead of a wait), the set-up and the
clean-up (each request ``hang_timeout`` + the native-timeout margin, enforced even
when the client library ignores its timeout). Ctrl-C stops the clients within about
a second, cleans up, and raises :class:`StepInterrupted` with what was measured.

The pieces: :mod:`.plan` (the step as data), :mod:`.clients` (client threads and the
coordinator that watches them), :mod:`.executors` (threads, or spawned processes),
:mod:`.stats` (what is measured and how it merges), :mod:`.watch` (deadlines on the
engine's own requests). Here: probe, prepare, run, clean up.
"""

from __future__ import annotations

import posixpath
import re
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from ..drivers.base import MTIME_SLACK, CreatedPaths, Driver
from ..drivers.registry import start_early_drivers
from ..drivers.watch import DeadlineExceeded, RequestWatch, parallel_map, run_bounded
from ..errors import (
    StorageError,
    StorageNotFound,
    StorageScaleUsageError,
    StorageTimeout,
    StorageUnreachable,
)
from .clients import LoadInterrupted
from .executors import EXECUTORS, Accumulators, ClientsCrashed, Executor, observed_of
from .operations import prepare_step, stays_in_process
from .plan import StepClock, StepPlan, StepProgress
from .stats import ClientUsage, SideAccumulator, SideResult, StepResult

#: the watchdog waits this much longer than the native timeout, so that a library
#: that keeps its timeouts reports its own error first
WATCHDOG_MARGIN = 2.0
#: after Ctrl-C or SIGTERM, how long the storage may take to answer the probe before
#: the step's clean-up (seconds): a frozen storage is left to the session's end
INTERRUPT_PROBE = 1.0
#: the failure classes after which the next step's clients log in afresh
LOST_CONNECTION_CLASSES = frozenset({"unreachable"})


class StepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a step: its clients were stopped and the step cleaned up;
    ``result`` holds what was measured until then."""

    def __init__(self, result: StepResult) -> None:
        super().__init__("step interrupted")
        self.result = result


def run_step(
    plan: StepPlan, *, executor: str | Executor = "threads", keep_workdir: bool = False,
    progress: Callable[[StepProgress], None] | None = None,
    observe: Callable[[], AbstractContextManager] | None = None,
) -> StepResult:
    """Probe, prepare, run and clean up one step; return what it measured. ``observe``
    (the servers' side, :class:`~pytest_storagescale.load.server_monitor.ServerWatch`) is
    entered right before the clients start, after the set-up, and left once they are
    done, before the clean-up.

    After a step that left hung clients, lost its connections (``unreachable``
    failures: the storage restarted) or could not run, the driver forgets its
    connections, so that the next clients log in afresh, as a new client would."""
    if stays_in_process(plan.operation):
        refuse_out_of_process(plan.operation, executor if isinstance(executor, str)
                              else "cluster")
        executor = "threads"  # auto: never spawned, whatever the driver would like
    elif executor in ("threads", "auto") and getattr(plan.operation, "own_processes", False):
        executor = "processes"  # the operation changes process-wide client settings
    try:
        execute = executor if callable(executor) else EXECUTORS[executor]  # cluster
    except KeyError:
        raise ValueError(f"unknown executor {executor!r}; executors: "
                         f"{', '.join(EXECUTORS)}") from None
    try:
        result = _run(plan, execute, keep_workdir, progress, observe)
    except BaseException:
        plan.driver.driver_class.forget_connections()
        raise
    if result.total.hung or LOST_CONNECTION_CLASSES & set(result.total.errors):
        plan.driver.driver_class.forget_connections()
    return result


def refuse_out_of_process(operation, executor: str, where: str = "") -> None:
    """A usage error when ``executor`` would run an operation that stays in process
    (:attr:`~.operations.Operation.in_process`) outside pytest's process (``where``:
    the test that asks for it)."""
    if executor in ("threads", "auto"):
        return
    elsewhere = ("on the cluster's hosts (--storage-cluster)" if executor == "cluster"
                 else "in spawned client processes (--storage-executor processes)")
    raise StorageScaleUsageError(
        f"{where + ': ' if where else ''}operation {operation.name!r} runs only in "
        f"pytest's own process (what its set-up holds cannot be sent elsewhere), so it "
        f"cannot run {elsewhere}: run it with --storage-executor threads or auto and no "
        f"--storage-cluster, or deselect its tests.")


def service_deadline(plan: StepPlan) -> float:
    """How long one set-up or clean-up request may take before it is abandoned."""
    return plan.client_timeout + WATCHDOG_MARGIN


def probe(watch: RequestWatch, plan: StepPlan, why: str,
          deadline: float | None = None) -> None:
    """One ``stat`` of the step's parent directory, answered within ``deadline``
    (default ``hang_timeout``; any answer, a refusal too); else
    :class:`DeadlineExceeded` saying ``why`` the probe was sent."""
    deadline = plan.hang_timeout if deadline is None else min(deadline, plan.hang_timeout)
    parent = posixpath.dirname(plan.workdir.rstrip("/")) or "/"

    def stat() -> None:
        try:
            watch.driver.stat(parent)
        except StorageError:
            pass  # an answer: the set-up reports a refusal with its own words

    try:
        run_bounded(stat, watch, deadline, "probe")
    except DeadlineExceeded as exc:
        exc.message = (f"the storage did not answer a probe (stat) within "
                       f"{deadline:g} s {why}"
                       f"{'; the step was not run' if why.startswith('before') else ''}")
        exc.args = (str(exc),)
        raise


def _run(plan: StepPlan, execute, keep_workdir: bool,
         progress: Callable[[StepProgress], None] | None,
         observe: Callable[[], AbstractContextManager] | None = None) -> StepResult:
    operation = plan.operation
    # before this process holds a threads executor's thousands of descriptors (a
    # client process of the processes executor runs one step: it needs none of this)
    start_early_drivers()
    coordinator = plan.driver.connect("coordinator", timeout=plan.client_timeout)
    # what the set-up makes is recorded; the clients' files are known by their names
    coordinator.created = CreatedPaths(plan.workdir, step_generated)
    watch = RequestWatch(coordinator)
    try:
        probe(watch, plan, "before the step's set-up")
        params = {**operation.defaults, **plan.params}
        context = run_bounded(
            lambda: prepare_step(operation, coordinator, plan.workdir, params, plan.clients,
                                 plan.step),
            watch, service_deadline(plan), "set-up")
        plan.driver.driver_class.before_load(plan.driver.options)  # e.g. a build, untimed
        interrupted: LoadInterrupted | None = None
        usage: ClientUsage | None = None
        crashed: ClientsCrashed | None = None
        try:
            with observe() if observe is not None else nullcontext():
                clock, accumulators, *measured = execute(plan, context, progress)
            usage = measured[0] if measured else None
        except LoadInterrupted as exc:
            interrupted = exc
            clock, accumulators, usage = exc.clock, exc.accumulators, exc.usage
        except ClientsCrashed as exc:  # the step's error, once its directory is removed
            crashed, accumulators = exc, {}
        finally:
            operation.cleanup(context)
        hung = interrupted is None and any(a.hung for a in accumulators.values())
        cleanup_error = None if keep_workdir else _clean(watch, plan, hung,
                                                         interrupted is not None)
    finally:
        coordinator.close()
    if crashed is not None:
        raise crashed
    result = _result(plan, clock, accumulators, cleanup_error, interrupted is not None)
    result.client = usage
    if interrupted is not None:
        raise StepInterrupted(result) from None
    return result


def _clean(watch: RequestWatch, plan: StepPlan, hung: bool,
           interrupted: bool = False) -> str | None:
    """Remove the step's directory, every request bounded; after a step whose clients
    hung, only when the storage answers a probe (else the session's clean-up at the
    end removes it); after Ctrl-C or SIGTERM, only when it answers one within
    :data:`INTERRUPT_PROBE` (a frozen storage must not hold up the exit)."""
    try:
        if interrupted:
            probe(watch, plan, "after the step was interrupted", INTERRUPT_PROBE)
        elif hung:
            probe(watch, plan, "after the step's clients hung")
        return run_bounded(lambda: cleanup_tree(watch.driver, plan.workdir,
                                                created=watch.driver.created), watch,
                           service_deadline(plan), "clean-up")
    except DeadlineExceeded as exc:
        return f"{exc} (the run directory is removed at the end of the session)"


def _result(plan: StepPlan, clock: StepClock, accumulators: Accumulators,
            cleanup_error: str | None, interrupted: bool = False) -> StepResult:
    duration = plan.duration
    if plan.max_operations or interrupted:  # measured until the count, or until Ctrl-C
        duration = max(max((a.measured_s for a in accumulators.values()), default=0), 1e-6)
    sides = {
        side: SideResult.from_accumulator(
            accumulators.get(side) or SideAccumulator(clock.seconds), count, duration,
            offered_hz=plan.arrival_rate)
        for side, _, count in plan.operation.groups(plan.clients)
    }
    return StepResult(
        operation=plan.operation.name, clients=plan.clients, started=clock.start_at,
        ended=time.time(), duration_s=duration, warmup_s=plan.warmup, sides=sides,
        cleanup_error=cleanup_error, interrupted=interrupted,
        observed=observed_of(accumulators),
    )


def cleanup_tree(driver: Driver, path: str, *, parallel: int = 16,
                 not_before: float | None = None,
                 created: CreatedPaths | None = None) -> str | None:
    """Remove a step's directory; the driver's guard keeps this inside the test area.

    The entries are removed by ``parallel`` requests in flight (a put scan leaves
    tens of thousands of files), in daemon threads: a request the library never
    ends cannot hold up the exit. Returns the error text when the storage refused,
    reported with the step. No file older than ``not_before`` (by default the run's
    start, :meth:`~pytest_storagescale.drivers.base.Driver.run_started`) is deleted.

    Only what the run made is removed (:func:`remove_created`): the entries
    ``created`` recorded, or by default the names the operations generate."""
    try:
        if not_before is None:  # asked before the walk deletes the owner file
            not_before = driver.run_started()
        return remove_created(driver, created or CreatedPaths(path, step_generated),
                              not_before, parallel)
    except StorageNotFound:
        return None
    except StorageError as exc:
        return str(exc)
    return None


# -- removing only what the run made -------------------------------------------------
#: a step's directory in the run directory: ``<section>-c<clients>-<worker>-<n>``
STEP_DIRECTORY = re.compile(r"[A-Za-z_][\w-]*-c\d+-[\w.]+-\d{3,}")
#: what the built-in operations name what they make in a step's directory (from the
#: client and sequence numbers, or fixed): the kinds of :class:`CreatedPaths`
GENERATED_NAMES = (
    ("leaf", re.compile(r"c\d+-\d+")),  # put, delete, write: files; mkdir: directories
    ("file", re.compile(r"stat-target|read-target|file-\d{5}|entry-\d{5}")),
    ("dir", re.compile(r"ls-dir")),
)


def _registered() -> list:
    from .operations import get_operation, operation_names

    return [get_operation(name) for name in operation_names()]


def _side_names() -> frozenset[str]:
    return frozenset(side for operation in _registered() for side in operation.sides)


def _site_kind(name: str) -> str | None:
    """The kind a registered operation's ``made_names`` gives ``name`` (None: none)."""
    return next((kind for operation in _registered()
                 for pattern, kind in operation.made_names.items()
                 if re.fullmatch(pattern, name)), None)


def step_generated(parts: tuple[str, ...]) -> str | None:
    """The kind of ``parts`` below a step's directory, as the operations name them: a
    side's directory (``readers``...), ``ls-dir``, and the names of
    :data:`GENERATED_NAMES` in them."""
    *parents, name = parts
    sides = _side_names()
    chain = parents[1:] if parents and parents[0] in sides else parents
    if chain not in ([], ["ls-dir"]):
        return None
    if not parents and name in sides:
        return "dir"
    return next((kind for kind, pattern in GENERATED_NAMES if pattern.fullmatch(name)),
                None) or _site_kind(name)


def run_generated(parts: tuple[str, ...]) -> str | None:
    """The kind of ``parts`` below a run directory: step directories and their content."""
    if not STEP_DIRECTORY.fullmatch(parts[0]):
        return None
    return "dir" if len(parts) == 1 else step_generated(parts[1:])


class _Removal:
    """One removal of what a run made: what was removed, and what was left, and why."""

    def __init__(self, driver: Driver, created: CreatedPaths, not_before: float | None,
                 parallel: int) -> None:
        self.driver, self.created, self.not_before = driver, created, not_before
        self.parallel = parallel
        self.left: list[str] = []
        self._lock = threading.Lock()

    def leave(self, path: str, why: str) -> None:
        with self._lock:
            self.left.append(f"{path} ({why})")

    def _left_below(self, path: str) -> bool:
        prefix = path.rstrip("/") + "/"
        with self._lock:
            return any(left.startswith(prefix) for left in self.left)

    def directory(self, path: str) -> bool:
        """Remove what the run made in ``path``, then ``path`` (rmdir); False when
        something was left in it. ``rmdir`` first: only a real directory is refused as
        *not empty* (a link to one answers *not a directory*), and only then listed."""
        try:
            self.driver.rmdir(path)
            return True
        except StorageNotFound:
            return True
        except StorageError as exc:
            if isinstance(exc, (StorageTimeout, StorageUnreachable)):
                raise
            if not self.driver.may_be_a_link(exc):
                self.leave(path, f"rmdir refused: {exc.message}: not entered")
                return False
            if not self.driver._not_empty(exc):
                self.leave(path, f"made as a directory, not removable as one ({exc.message}),"
                                 f" possibly a link to a directory outside: not entered")
                return False
        entries = []
        for name in self.driver.ls(path):
            child = f"{path.rstrip('/')}/{name}"
            if name in (".", "..") or "/" in name or not name:
                self.leave(child, "not a name inside the directory: refused")
            elif child == self.created.owner:
                continue  # removed last, once nothing else is left
            else:  # an unknown directory may still go with rmdir (a test's emptied one)
                entries.append((child, self.created.kind(child) or "unknown"))
        parallel_map(lambda entry: self.entry(*entry), entries, self.parallel, "cleanup")
        if self._left_below(path):  # (what other directories' threads left is not its)
            return False
        if self.created.owner and posixpath.dirname(self.created.owner) == path.rstrip("/"):
            self.driver.delete(self.created.owner)
        self.driver.rmdir(path)
        return True

    def entry(self, path: str, kind: str) -> None:
        try:
            info = self.driver.stat(path)
        except StorageNotFound:
            return
        if kind == "dir":
            if not info.is_dir:
                self.leave(path, "made as a directory, now a file: not deleted")
            else:
                self.directory(path)
        elif info.is_dir:
            self._leaf_directory(path, kind)
        elif kind == "unknown":
            self.leave(path, "not made by this run")
        else:
            self._file(path, info)

    def _leaf_directory(self, path: str, kind: str) -> None:
        if kind == "file":
            self.leave(path, "written as a file, now a directory: not entered")
            return
        if kind == "unknown" and posixpath.dirname(path) != self.created.root:
            # only a folder a test emptied (functional/, conformance/) is tried; deeper
            # down it may be reached through a link a server followed (davs:// lists
            # through one): never even rmdir there
            self.leave(path, "not made by this run: not entered")
            return
        try:
            self.driver.rmdir(path)  # never listed: rmdir only (a link is not removed)
        except StorageNotFound:
            pass
        except StorageError as exc:
            whose = ("not made by this run" if kind == "unknown"
                     else "a directory the run did not fill")
            self.leave(path, f"{whose}, not removable with rmdir: not entered ({exc.message})")

    def _file(self, path: str, info) -> None:
        size = self.created.sizes.get(path)
        if size is not None and info.size != size:
            self.leave(path, f"{info.size} bytes where this run wrote {size}: not deleted")
        elif (self.not_before is not None and info.modified is not None
              and info.modified < self.not_before - MTIME_SLACK):
            self.leave(path, "older than this run, possibly a link to a file outside the "
                             "test area: not deleted")
        else:
            self.driver.delete(path)


def remove_created(driver: Driver, created: CreatedPaths, not_before: float | None,
                   parallel: int = 16) -> str | None:
    """Remove what the run made below ``created.root``, bottom-up: a directory it made
    is listed and emptied of the entries it made (names recorded, or generated by
    its operations), then removed with ``rmdir``; a file it wrote is deleted when its
    size is the size written and it is not older than ``not_before``. Anything else
    is left and named (the text returned; None: all removed)."""
    removal = _Removal(driver, created, not_before, parallel)
    try:
        removal.directory(created.root)
    except StorageNotFound:
        pass
    if not removal.left:
        return None
    root = created.root.rstrip("/")
    if removal.left[0].startswith(f"{root} ("):  # refused at once: nothing was listed
        return f"{root} not removed: {removal.left[0][len(root) + 2:-1]}. Check it by hand"
    shown = "; ".join(sorted(removal.left)[:10]) + (
        f"; and {len(removal.left) - 10} more" if len(removal.left) > 10 else "")
    return (f"{created.root} not removed: it holds {len(removal.left)} entr"
            f"{'y' if len(removal.left) == 1 else 'ies'} this run did not make or cannot "
            f"recognise, left untouched: {shown}. Check and remove them by hand")
