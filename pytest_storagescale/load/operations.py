"""The operations a load step repeats: stat, ls, mkdir, put, get, read, readv, delete,
write, auth (a new login per operation), and the composites ``mixed`` and
``ls_under_io`` (two kinds of clients at once).

Operations live in a registry: :func:`get_operation` finds one by the name a
thresholds section gives (``op = "get"``), :func:`register_operation` adds a site's
own, and installed packages add theirs through the entry-point group
``pytest_storagescale.operations`` (``name = "module:attr"``, an :class:`Operation`
instance or class), read on the first lookup. An operation declares its parameters
as :class:`Param` records; the section's values are validated by their kind.

An operation instance holds no state: a step plan carries it to spawned worker
processes together with the step's parameters and the context that
:meth:`Operation.prepare` returned. ``prepare`` runs once per step, untimed (it
creates the files a step reads), and gets what the test gave the step (its
:class:`StepContext`: doors by name, extra data); :meth:`Operation.run` is one
timed repetition by one client and returns the bytes it moved;
:meth:`Operation.observe`, once after the load in each process that ran clients, says
what the operation saw beyond latencies (summed over the processes and hosts, put
into the step's derived metrics before the rules).
"""

from __future__ import annotations

import functools
import inspect
import os
import random
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..drivers.base import Driver, RequestWalk
from ..drivers.grid import base36
from ..drivers.watch import parallel_map
from ..errors import StorageScaleUsageError
from ..registry import RegistrationError, Registry, Scope
from ..units import parse_byte_size

if TYPE_CHECKING:
    from ..drivers.spec import DriverSpec

__all__ = [
    "ENTRY_POINT_GROUP", "PARAM_KINDS", "Composite", "Operation", "Param", "StepContext",
    "get_operation",
    "operation_names", "register_operation",
]

#: entry-point group through which installed packages add operations
ENTRY_POINT_GROUP = "pytest_storagescale.operations"
#: ``bytes``: a size (``"10MB"``, ``4096``, 0 allowed); ``count``: a whole number >= 1;
#: ``flag``: true or false; ``choice``: one of the declared strings
PARAM_KINDS = ("bytes", "count", "flag", "choice")
#: the largest ``count`` a section gives an operation (entries, files its set-up makes)
MAX_PARAM_COUNT = 1_000_000


@functools.lru_cache(maxsize=8)
def payload(size: int) -> bytes:
    """Incompressible data of ``size`` bytes, made once per process and size."""
    return os.urandom(size)


def _round(value: float) -> int:
    """Half up: 2.5 -> 3 (``round`` would give 2)."""
    return int(value + 0.5)


@dataclass(frozen=True)
class StepContext:
    """What a test gives one step's operation (``storage_load.run(doors=...,
    context=...)``), handed to :meth:`~.operations.Operation.prepare` as ``step``:
    ``doors``, door name -> the picklable client spec of another door the clients also
    use (XCache in front of the endpoint); ``extra``, anything else by name (two client
    hosts' test areas). Frozen, and picklable as long as what it holds is: spawned
    client processes and cluster hosts get a copy of what ``prepare`` made of it."""

    doors: Mapping[str, DriverSpec] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def door(self, name: str, operation: str) -> DriverSpec:
        """The door ``name``; a usage error naming the operation that needs it."""
        try:
            return self.doors[name]
        except KeyError:
            given = ", ".join(self.doors) or "none"
            raise StorageScaleUsageError(
                f"{operation}: the step was given no {name!r} door (doors given: {given}). "
                f"Pass it with storage_load.run(..., doors={{{name!r}: spec}}).") from None


@dataclass(frozen=True)
class Param:
    """One parameter an operation reads from its thresholds section.

    ``kind`` says how a value is read and scaled (see :data:`PARAM_KINDS`); a
    ``choice`` lists its ``choices``. Declared once per operation class, e.g.
    ``Param("bytes", 1_000_000)`` or ``Param("choice", "none", ("none", "dsync"))``.
    """

    kind: str
    default: Any
    choices: tuple[str, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        # a bad declaration is a bug in the operation's code: fail where it is written
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"Param kind {self.kind!r}: valid kinds are {', '.join(PARAM_KINDS)}")
        if (self.kind == "choice") != bool(self.choices):
            raise ValueError(f"Param {self.kind}: choices are given for, and only for, a choice")
        try:
            self.parse(self.default, what="Param default")
        except StorageScaleUsageError as exc:
            raise ValueError(str(exc)) from None

    def parse(self, value: Any, *, what: str) -> Any:
        """The value a section gives, validated by kind; ``what`` names its key."""
        if self.kind == "bytes":
            return parse_byte_size(value, what=what)
        if self.kind == "count":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise StorageScaleUsageError(f"{what}: {value!r} must be a positive whole number.")
            if value > MAX_PARAM_COUNT:  # files a set-up makes: 10**12 never ends
                raise StorageScaleUsageError(
                    f"{what}: {value} is more than {MAX_PARAM_COUNT}; a step's set-up makes "
                    f"that many entries before it measures. Write e.g. 10 or 1000.")
            return value
        if self.kind == "flag":
            if not isinstance(value, bool):
                raise StorageScaleUsageError(f"{what}: {value!r} must be true or false.")
            return value
        if value not in self.choices:
            raise StorageScaleUsageError(
                f"{what}: unknown value {value!r}. Valid values: {', '.join(self.choices)}."
            )
        return value

    def scaled(self, value: Any, factor: float) -> Any:
        """``value`` for a run shrunk by ``factor``: sizes and counts times the factor
        (half up), a size at least 1 byte unless it was 0, a count at least 1; flags and
        choices unchanged."""
        if self.kind == "bytes":
            return max(1, _round(value * factor)) if value > 0 else 0
        if self.kind == "count":
            return max(1, _round(value * factor))
        return value


class Operation:
    """One kind of request a client repeats back to back."""

    name: ClassVar[str] = ""
    #: the keys allowed in its thresholds section besides the common ones
    parameters: ClassVar[Mapping[str, Param]] = {}
    #: sides of a composite step (``mixed``); empty for a plain operation
    sides: ClassVar[tuple[str, ...]] = ()
    #: its clients change settings of the whole client process, so they always run in
    #: spawned client processes (the ``processes`` executor), never in pytest's own
    own_processes: ClassVar[bool] = False
    #: what :meth:`run` names the entries it makes in the step's directory, beside the
    #: built-in ``c<client>-<iteration>``: regular expression -> kind (``file``; ``dir``,
    #: listed and emptied; ``leaf``, a file or an empty directory). The clean-up removes
    #: only what the set-up made and names matching these (``load.engine.remove_created``)
    made_names: ClassVar[Mapping[str, str]] = {}
    #: what its :meth:`prepare` returns cannot leave pytest's process (callables that
    #: kill and remount a client host): its clients run as threads of this process, and
    #: the ``processes`` executor and ``--storage-cluster`` refuse its steps before any
    #: load, in one sentence, instead of measuring nothing
    in_process: ClassVar[bool] = False

    @property
    def defaults(self) -> dict[str, Any]:
        """Every parameter's default value."""
        return {key: param.default for key, param in self.parameters.items()}

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(self.parameters)

    def parse_params(self, table: Mapping[str, Any], *, where: str) -> dict[str, Any]:
        """The defaults overridden by ``table``, each value validated by its kind."""
        params = self.defaults
        for key, value in table.items():
            param = self.parameters.get(key)
            if param is None:
                valid = ", ".join(self.parameters) or "none"
                raise StorageScaleUsageError(
                    f"{where}: unknown parameter {key!r} of operation {self.name!r}. "
                    f"Valid parameters: {valid}."
                )
            params[key] = param.parse(value, what=f"{where}.{key}")
        self.check_params(params, where=where)
        return params

    def check_params(self, params: dict[str, Any], *, where: str) -> None:
        """Reject parameter combinations the operation cannot run with."""

    def scaled_params(self, params: dict[str, Any], factor: float) -> dict[str, Any]:
        """``params`` shrunk by ``factor`` (see :meth:`Param.scaled`).

        When the shrunk combination fails :meth:`check_params` (a direct-I/O block
        size no longer a multiple of 4096), the first parameter, in declaration order,
        whose own value makes it valid again keeps that value; failing that, all do.
        """
        scaled = {
            key: self.parameters[key].scaled(value, factor) if key in self.parameters else value
            for key, value in params.items()
        }
        if self._valid(scaled):
            return scaled
        for key in self.parameters:
            if key in params and scaled[key] != params[key]:
                candidate = {**scaled, key: params[key]}
                if self._valid(candidate):
                    return candidate
        return dict(params)

    def _valid(self, params: dict[str, Any]) -> bool:
        try:
            self.check_params(params, where=self.name)
        except StorageScaleUsageError:
            return False
        return True

    def groups(self, clients: int) -> list[tuple[str, Operation, int]]:
        """The sides of a step at ``clients``: (side name, operation, client count)."""
        return [(self.name, self, clients)]

    def prepare(self, driver: Driver, workdir: str, params: dict, clients: int,
                step: StepContext | None = None) -> dict:
        """Create what the step reads (untimed); return a picklable context. ``step``:
        what the test gave the step (:class:`StepContext`; the engine passes it
        to a ``prepare`` that takes it, so the older four-argument form still works)."""
        driver.mkdir(workdir)
        return {"workdir": workdir, **params}

    def observe(self, context: dict) -> dict[str, float]:
        """What this process's clients saw beyond latencies and counts, called once
        after the load in each process that ran them (pytest's, each spawned client
        process, each cluster host) with the context :meth:`run` was given there.
        The engine sums the answers like the drivers' counters; the step's judge puts
        them into the record's derived metrics before the rules (a rule may name
        them once registered: ``pytest_storagescale_metrics``)."""
        return {}

    def cleanup(self, context: dict) -> None:
        """Remove local leftovers of the step (the remote workdir is removed by the caller)."""

    def before(self, driver: Driver, client: int, iteration: int, context: dict) -> None:
        """Untimed set-up of one repetition (e.g. the file ``delete`` removes)."""

    def run(self, driver: Driver, client: int, iteration: int, context: dict) -> int:
        raise NotImplementedError

    def walk(self, client: int, context: dict) -> RequestWalk | None:
        """What :meth:`run` repeats for ``client``, for a driver that can repeat it
        outside Python (:meth:`~pytest_storagescale.drivers.base.Driver.compiled_loop`);
        None: only :meth:`run` knows."""
        return None


@functools.lru_cache(maxsize=256)
def _takes_step(prepare: Any) -> bool:
    """Whether an operation's ``prepare`` takes the step context (``step`` or ``**``)."""
    try:
        parameters = inspect.signature(prepare).parameters
    except (TypeError, ValueError):
        return False
    return "step" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                       for p in parameters.values())


def prepare_step(operation: Operation, driver: Driver, workdir: str, params: dict,
                 clients: int, step: StepContext | None = None) -> dict:
    """``operation.prepare``, given ``step`` when it takes it (a site's operation
    written for the four-argument form is called with four)."""
    if _takes_step(type(operation).prepare):
        return operation.prepare(driver, workdir, params, clients,
                                 step=step if step is not None else StepContext())
    return operation.prepare(driver, workdir, params, clients)


def stays_in_process(operation: Operation) -> bool:
    """Whether ``operation`` (or a side of a composite) is :attr:`Operation.in_process`."""
    return operation.in_process or any(side.in_process for _, side, _ in operation.groups(1)
                                       if side is not operation)


def _sample_file(driver: Driver, path: str, size: int) -> None:
    driver.put(path, payload(size) if size else b"")


def _sample_files(driver: Driver, paths: list[str], size: int, parallel: int = 16) -> None:
    """Create many sample files with ``parallel`` uploads in flight (untimed set-up)."""
    # daemon threads: an upload the library never ends cannot hold up the exit
    parallel_map(lambda path: _sample_file(driver, path, size), paths, parallel, "prepare")


class Stat(Operation):
    """``stat`` of one existing file."""

    name = "stat"
    parameters = {"file_size": Param("bytes", 1024, description="size of the file stat-ed")}

    def prepare(self, driver, workdir, params, clients):
        context = super().prepare(driver, workdir, params, clients)
        context["target"] = f"{workdir}/stat-target"
        _sample_file(driver, context["target"], params["file_size"])
        return context

    def run(self, driver, client, iteration, context):
        driver.stat(context["target"])
        return 0

    def walk(self, client, context):
        return RequestWalk("stat", (context["target"],))


class List(Operation):
    """``ls`` of a directory with ``entries`` files (the seeds' ``lcg-ls`` of a test dir)."""

    name = "ls"
    parameters = {"entries": Param("count", 10, description="files in the listed directory")}

    def prepare(self, driver, workdir, params, clients):
        context = super().prepare(driver, workdir, params, clients)
        context["target"] = f"{workdir}/ls-dir"
        driver.mkdir(context["target"])
        _sample_files(driver, [f"{context['target']}/entry-{i:05d}"
                               for i in range(params["entries"])], 0)
        return context

    def run(self, driver, client, iteration, context):
        names = driver.ls(context["target"])
        if len(names) != context["entries"]:
            raise ValueError(f"ls returned {len(names)} entries, expected {context['entries']}")
        return 0


class Auth(Operation):
    """A new connection with a new login name that authenticates, then a ``stat`` of the
    step's directory: seed 003's "authentications/s" (one ``xrdcp`` per file, each a
    login). The security protocol is the session's (driver option
    ``security_protocol``). Needs a driver that can log in again (``new_login``: the
    ``xrootd`` driver); the login names are unique within the step."""

    name = "auth"
    # new_login shortens the XRootD client's DataServerTTL for the process: with a 1 s
    # TTL the 5.5.3 client's idle-connection teardown can deadlock the whole client
    # (xrootd/xrootd#1883: PostMaster::ForceDisconnect from Stream::OnReadTimeout), so
    # that never happens in pytest's process (a deadlocked child's clients are hung)
    own_processes = True

    def prepare(self, driver, workdir, params, clients):
        if not callable(getattr(driver, "new_login", None)):
            raise StorageScaleUsageError(
                f"the auth operation logs in again for every operation, which the "
                f"{driver.name} driver cannot do: run it over root:// with the xrootd "
                f"driver (--storage-driver xrootd).")
        context = super().prepare(driver, workdir, params, clients)
        # 2 letters of this step in every login name: no name of an earlier step whose
        # connection is still open is used again
        context["login_prefix"] = "".join(random.choices("abcdefghijklmnopqrstuvwxyz", k=2))
        return context

    def before(self, driver, client, iteration, context):
        # untimed: a new client object; the connection is made by the timed request
        driver.new_login(f"{context['login_prefix']}{base36(client % 36**2):0>2}"
                         f"{base36(iteration % 36**4):0>4}")

    def run(self, driver, client, iteration, context):
        driver.stat(context["workdir"])
        return 0


class MakeDir(Operation):
    """``mkdir`` of a new directory per repetition."""

    name = "mkdir"

    def run(self, driver, client, iteration, context):
        driver.mkdir(f"{context['workdir']}/c{client:05d}-{iteration:07d}")
        return 0


class Put(Operation):
    """Write a new ``file_size`` file per repetition (xrdcp / lcg-cp to the storage)."""

    name = "put"
    parameters = {"file_size": Param("bytes", 1_000_000, description="size of each new file")}

    def run(self, driver, client, iteration, context):
        path = f"{context['workdir']}/c{client:05d}-{iteration:07d}"
        return driver.put(path, payload(context["file_size"]))


def _get_file(workdir: str, index: int) -> str:
    """The ``index``-th of the files a ``get`` step reads."""
    return f"{workdir}/file-{index:05d}"


class Get(Operation):
    """Read a whole file. Client ``c`` at repetition ``r`` reads file
    ``(c + r * clients) % files``, so the clients walk through all files; ``files = 1``
    is the hot-file case. ``to_disk = true`` copies to local disk like ``lcg-cp``."""

    name = "get"
    parameters = {
        "file_size": Param("bytes", 1_000_000, description="size of each file read"),
        "files": Param("count", 10, description="distinct files the clients walk through"),
        "to_disk": Param("flag", False, description="copy to local disk, like lcg-cp"),
    }

    def prepare(self, driver, workdir, params, clients):
        context = super().prepare(driver, workdir, params, clients)
        _sample_files(driver, [_get_file(workdir, i) for i in range(params["files"])],
                      params["file_size"])
        context["clients"] = clients
        if params["to_disk"]:
            context["local_dir"] = tempfile.mkdtemp(prefix="storagescale-get-")
        return context

    def cleanup(self, context):
        if context.get("local_dir"):
            shutil.rmtree(context["local_dir"], ignore_errors=True)

    def run(self, driver, client, iteration, context):
        index = (client + iteration * context["clients"]) % context["files"]
        source = _get_file(context["workdir"], index)
        local = (
            os.path.join(context["local_dir"], f"c{client:05d}") if context.get("local_dir")
            else None
        )
        moved = driver.get(source, local)
        if moved != context["file_size"]:
            raise ValueError(f"get {source}: {moved} bytes, expected {context['file_size']}")
        return moved

    def walk(self, client, context):
        if context.get("local_dir"):  # a copy to local disk: only run() writes one
            return None
        files = tuple(_get_file(context["workdir"], i) for i in range(context["files"]))
        return RequestWalk("get", files, client, context["clients"], context["file_size"])


class Read(Operation):
    """Open, read ``read_size`` bytes at a random offset, close."""

    name = "read"
    parameters = {
        "file_size": Param("bytes", 10_000_000, description="size of the file read"),
        "read_size": Param("bytes", 65536, description="bytes per read"),
    }

    def prepare(self, driver, workdir, params, clients):
        context = super().prepare(driver, workdir, params, clients)
        context["target"] = f"{workdir}/read-target"
        _sample_file(driver, context["target"], params["file_size"])
        return context

    def run(self, driver, client, iteration, context):
        size = context["read_size"]
        rng = random.Random(client * 1_000_003 + iteration)
        offset = rng.randrange(0, max(1, context["file_size"] - size))
        return len(driver.read(context["target"], offset, size))


class ReadV(Read):
    """Open, one vector read of ``chunks`` x ``chunk_size`` at random offsets, close.

    The chunks are distinct, non-overlapping and sorted, as an application's read-ahead
    asks for them (XRootD 5.5.3 answers a vector read naming the same chunk twice
    with "Invalid response", which would be measured as a storage failure)."""

    name = "readv"
    parameters = {
        "file_size": Param("bytes", 10_000_000, description="size of the file read"),
        "chunks": Param("count", 16, description="chunks per vector read"),
        "chunk_size": Param("bytes", 4096, description="bytes per chunk"),
    }

    def check_params(self, params, *, where):
        if params["file_size"] // max(params["chunk_size"], 1) < params["chunks"]:
            raise StorageScaleUsageError(
                f"{where}: {params['chunks']} chunks of {params['chunk_size']} bytes do not "
                f"fit in a {params['file_size']}-byte file; raise file_size or lower chunks."
            )

    def run(self, driver, client, iteration, context):
        size = context["chunk_size"]
        rng = random.Random(client * 1_000_003 + iteration)
        slots = sorted(rng.sample(range(context["file_size"] // size), context["chunks"]))
        return driver.readv(context["target"], [(slot * size, size) for slot in slots])


class Delete(Operation):
    """Delete a file (created untimed just before)."""

    name = "delete"

    def before(self, driver, client, iteration, context):
        driver.put(self._path(client, iteration, context), b"")

    def _path(self, client, iteration, context):
        return f"{context['workdir']}/c{client:05d}-{iteration:07d}"

    def run(self, driver, client, iteration, context):
        driver.delete(self._path(client, iteration, context))
        return 0


class Write(Operation):
    """Sequential write of a new ``file_size`` file in ``block_size`` blocks, like
    ``dd if=/dev/zero of=... bs=64k oflag=direct|dsync`` (seed 001). ``sync`` other
    than ``none`` needs a POSIX mount (``file://``)."""

    name = "write"
    parameters = {
        "file_size": Param("bytes", 100_000_000, description="size of each new file"),
        "block_size": Param("bytes", 65536, description="bytes per write call"),
        "sync": Param("choice", "none", ("none", "dsync", "direct"),
                      description="open flag: none, O_DSYNC or O_DIRECT"),
    }

    def check_params(self, params, *, where):
        if params["sync"] == "direct" and params["block_size"] % 4096:
            raise StorageScaleUsageError(
                f"{where}: direct I/O needs block_size in multiples of 4096 bytes, not "
                f"{params['block_size']}."
            )

    def run(self, driver, client, iteration, context):
        path = f"{context['workdir']}/c{client:05d}-{iteration:07d}"
        return driver.write_sequential(path, payload(context["file_size"]),
                                       context["block_size"], context["sync"])


class Composite(Operation):
    """Several operations at once, ``clients`` on each side (``side_ops``: side ->
    operation); the section's parameters go to every side that knows them."""

    side_ops: ClassVar[dict[str, str]] = {}

    @property
    def sides(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self.side_ops)

    def groups(self, clients):
        return [(side, get_operation(op), clients) for side, op in self.side_ops.items()]

    def _side_params(self, operation: Operation, params: dict) -> dict:
        return {**operation.defaults,
                **{k: v for k, v in params.items() if k in operation.param_names}}

    def check_params(self, params, *, where):
        for side, operation, _ in self.groups(1):
            operation.check_params(self._side_params(operation, params), where=f"{where} ({side})")

    def prepare(self, driver, workdir, params, clients, step=None):
        super().prepare(driver, workdir, params, clients)
        context = {"workdir": workdir}
        for side, operation, _ in self.groups(clients):
            context[side] = prepare_step(
                operation, driver, f"{workdir}/{side}", self._side_params(operation, params),
                clients, step)
        return context

    def cleanup(self, context):
        for side, operation, _ in self.groups(1):
            operation.cleanup(context[side])


class Mixed(Composite):
    """Readers (``get``) and writers (``put``) at once, ``clients`` on each side."""

    name = "mixed"
    side_ops = {"readers": "get", "writers": "put"}
    parameters = {
        "file_size": Param("bytes", 1_000_000, description="size of each file read or written"),
        "files": Param("count", 10, description="distinct files the readers walk through"),
    }


class ListUnderWrites(Composite):
    """Listers (``ls`` of a directory) while writers (``put``) fill a sibling one:
    seed 001's ``ls`` taking minutes while I/O runs."""

    name = "ls_under_io"
    side_ops = {"listers": "ls", "writers": "put"}
    parameters = {
        "file_size": Param("bytes", 10_000_000, description="size of each file written"),
        "entries": Param("count", 100, description="files in the listed directory"),
    }


def _check_operation(operation: object) -> None:
    if not isinstance(operation, Operation):
        raise RegistrationError(
            f"register_operation: {operation!r} is not an Operation instance; pass one, "
            f"e.g. register_operation(MyOperation())."
        )
    for key, param in operation.parameters.items():
        if not isinstance(param, Param):
            raise RegistrationError(
                f"register_operation: {type(operation).__name__}.parameters[{key!r}] is "
                f"{param!r}; declare it as a Param, e.g. Param(\"bytes\", 1_000_000)."
            )


#: the operations by name (pytest_storagescale/registry.py: a package's entry points are
#: all loaded at the first lookup, so that a broken one fails every lookup until fixed)
OPERATIONS: Registry[Operation] = Registry(
    "operation", adder="register_operation",
    name_hint='Set name = "copy" (letters, digits, _ and -).', check=_check_operation,
    coerce=lambda target: target() if isinstance(target, type) else target,
    entry_points=ENTRY_POINT_GROUP, eager_entry_points=True,
    unknown_hint=f"A site adds one with register_operation() or the {ENTRY_POINT_GROUP} "
                 f"entry-point group.",
)


def register_operation(operation: Operation, *, replace: bool = False,
                       scope: Scope | None = None) -> None:
    """Make ``operation`` available to thresholds sections under its ``name`` (in
    ``scope`` only: what a session's ``pytest_storagescale_operations`` hook gives).

    An operation of the same class (by module and name: a conftest imported again)
    takes the place of the one registered; another operation under a taken name is
    refused unless ``replace`` is true.
    """
    OPERATIONS.add(operation, replace=replace, scope=scope)


def get_operation(name: str) -> Operation:
    """The registered operation ``name``."""
    return OPERATIONS.get(name)


def operation_names() -> tuple[str, ...]:
    """The registered operations' names: the built-in ones first."""
    return OPERATIONS.names()


for _operation in (Stat(), List(), MakeDir(), Put(), Get(), Read(), ReadV(), Delete(), Write(),
                   Auth(), Mixed(), ListUnderWrites()):
    register_operation(_operation)
