"""Thresholds files: the test plan and the pass/fail rules for one storage version range.

A file says which concurrencies each section's operation is scanned at and what
must hold at each of them::

    [storage]
    system = "xrootd"
    versions = ["5.5.*"]

    [defaults]
    duration = "60s"
    warmup = "5s"
    hang_timeout = "60s"

    [ops.stat]
    clients = [5, 50, 600]

    [[ops.stat.expect]]
    clients = "<=100"
    rules = ["rate_hz >= 4", "failed == 0", "hung == 0"]

A section may scan offered rates instead (an open loop, see :mod:`.load.open_loop`)::

    [ops.stat]
    arrival_rate = ["50/s", "500/s"]
    arrivals = "poisson"         # or "constant" (the default)
    max_in_flight = 200          # the cap on requests in flight (default 100)

    [[ops.stat.expect]]          # no clients/arrival_rate key: every step
    rules = ["failed == 0", "dropped == 0", "achieved_hz >= 0.95 * offered_hz"]

A section runs the operation of its name, or the one ``op = "get"`` names. Files
are validated when loaded; every problem is a :class:`ThresholdsError` that names
the file, the key and what is valid. :meth:`ThresholdSet.scaled` shrinks a plan for
a quick smoke run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import math
import operator
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import StorageScaleUsageError, ThresholdsError
from .gate import (
    DEFAULT_LATENCY_FLOOR_S,
    DEFAULT_MIN_EFFECT_P99,
    DEFAULT_MIN_EFFECT_RATE,
    DEFAULT_PAIRED_BUDGET,
)
from .limits import check_clients
from .load.plan import ARRIVALS
from .metrics import known_metrics
from .units import parse_duration

if TYPE_CHECKING:
    from .load.operations import Operation
    from .records import RuleCheck

__all__ = [
    "COMPARISONS", "DEFAULT_RULES", "ClientSelector", "Expectation", "RecoveryPlan", "Rule",
    "SectionPlan", "ThresholdSet", "evaluate", "load_thresholds", "parse_rule",
    "parse_selector", "select_thresholds",
]

COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt,
    "==": operator.eq,
}
DEFAULT_KEYS = ("duration", "warmup", "hang_timeout")
#: a section's minimum effects for the gate against a baseline (gate.py): a step whose
#: rate is lower by (p99 higher by) more than this, at 95 % confidence, regressed; a
#: latency below ``latency_floor`` (a duration, 0: none) on both sides is not judged;
#: a paired step inconclusive is measured until each side measured ``paired_budget``
#: times its duration
GATE_KEYS = ("min_effect_rate", "min_effect_p99", "latency_floor", "paired_budget")
#: keys an ``[ops.<section>]`` table may hold besides its operation's parameters
SECTION_KEYS = ("op", "clients", "expect", "operations", "tries", "min_operations",
                "clients_per_host", "arrival_rate", "arrivals", "max_in_flight",
                *GATE_KEYS, *DEFAULT_KEYS)
#: an open-loop section's cap on requests in flight when it does not say
DEFAULT_MAX_IN_FLIGHT = 100
#: the offered rates an open loop takes (requests a second): one an hour at least, a
#: million at most (more than any run's client hosts send; 1e308/s was printed whole)
MIN_ARRIVAL_RATE, MAX_ARRIVAL_RATE = 1 / 3600, 1_000_000.0
#: the largest whole number a section's count takes (``operations``, ``min_operations``,
#: ``clients_per_host``); ``tries`` at most MAX_TRIES
MAX_COUNT, MAX_TRIES = 10**9, 1000
#: an offered rate: ``"500/s"``, ``"30/min"`` (or a number: per second)
_RATE_RE = re.compile(r"\s*(\d+(?:\.\d+)?(?:e[-+]?\d+)?)\s*/\s*(s|min)\s*")
#: keys of a recovery probe section (see ``StorageLoad.recovery``)
RECOVERY_KEYS = ("overload_clients", "overload_duration", "recover_fraction", "recover_within")
#: rules that judge every step unless an ``expect`` block selecting its concurrency
#: names their metric (``hung <= 2`` replaces ``hung == 0``): no client may hang, no
#: client host may be lost (a cluster step that lost a host measured fewer clients)
DEFAULT_RULES = ("hung == 0", "lost == 0")
#: the shortest step a scaled plan runs (a shorter unscaled one stays as it is)
MIN_SCALED_DURATION_S = 1.0
_NUMBER = r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
_METRIC = r"[A-Za-z_][\w.]*"
_RULE_RE = re.compile(
    rf"^\s*({_METRIC})\s*(>=|<=|==|>|<)\s*"
    rf"(?:({_NUMBER})\s*(?:\*\s*({_METRIC}))?|({_METRIC}))\s*$"
)


@dataclass(frozen=True)
class Rule:
    """``<metric> <comparison> <number>``, e.g. ``rate_hz >= 4``; or relative to the
    same step of a baseline run: ``rate_hz >= 0.9 * baseline``, ``hung <= baseline``
    (then ``limit`` is the factor)."""

    metric: str
    comparison: str
    limit: float
    text: str
    relative: bool = False
    #: another metric of the same step the limit is a factor of (``achieved_hz >= 0.95
    #: * offered_hz``; None: a number or the baseline)
    reference: str | None = None

    def resolve(self, baseline: float | None) -> float | None:
        """The number to compare with; None for a relative rule without a baseline."""
        if not self.relative:
            return self.limit
        return None if baseline is None else self.limit * baseline

    def holds(self, observed: float, baseline: float | None = None) -> bool:
        limit = self.resolve(baseline)
        return limit is not None and COMPARISONS[self.comparison](observed, limit)


def parse_rule(text: str, *, sides: tuple[str, ...] = (), where: str = "rule") -> Rule:
    """Parse one rule; ``sides`` are the prefixes a mixed step allows. The metric must
    be measured or registered (:func:`~pytest_storagescale.metrics.register_metric`)."""
    match = _RULE_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise ThresholdsError(
            f"{where}: cannot read rule {text!r}. Write '<metric> <comparison> <number>', "
            f"e.g. 'rate_hz >= 4', or relative to a baseline run: 'rate_hz >= 0.9 * baseline'"
            f", 'hung <= baseline', or to another metric of the step: 'achieved_hz >= 0.95 "
            f"* offered_hz'; comparisons: {', '.join(COMPARISONS)}."
        )
    metric, comparison, number, times, bare_other = match.groups()
    other = times or bare_other
    relative = other == "baseline"
    reference = other if other and not relative else None
    number = number if number is not None else "1"
    _check_metric(metric, text, sides, where)
    if reference:
        _check_metric(reference, text, sides, where, hint=(
            f" On the right of the comparison: '<number> * baseline' (relative to a "
            f"baseline run, e.g. '{metric} {comparison} {number} * baseline') or "
            f"'<number> * <metric>' (another metric of the step)."))
    limit = float(number)
    if not math.isfinite(limit):  # 1e400: no measurement reaches it, none exceeds it
        raise ThresholdsError(
            f"{where}: the number {number} in rule {text!r} is beyond what a float holds "
            f"(about 1.8e308): a limit no measurement can reach or exceed makes a check "
            f"that cannot fail. Write the limit the metric should meet, e.g. "
            f"'rate_hz >= 4'.")
    return Rule(metric, comparison, limit, text.strip(), relative, reference)


def _check_metric(metric: str, text: str, sides: tuple[str, ...], where: str,
                  hint: str = "") -> None:
    side, _, bare = metric.rpartition(".")
    known = known_metrics()
    if bare not in known:
        raise ThresholdsError(
            f"{where}: unknown metric {bare!r} in {text!r}. Known metrics: {', '.join(known)}. "
            f"A suite can register a derived metric with the pytest_storagescale_metrics hook."
            + hint
        )
    if side and side not in sides:
        valid = ", ".join(sides) if sides else "none for this operation"
        raise ThresholdsError(
            f"{where}: unknown side {side!r} in {text!r}. Sides: {valid}."
        )


@functools.cache
def default_rules() -> tuple[Rule, ...]:
    """:data:`DEFAULT_RULES`, parsed."""
    return tuple(parse_rule(text, where="default rule") for text in DEFAULT_RULES)


@dataclass(frozen=True)
class ClientSelector:
    """Which concurrencies (an open-loop section's: offered rates) an ``expect`` block
    applies to."""

    text: str
    test: Callable[[float], bool] = field(compare=False)

    def __call__(self, clients: float) -> bool:
        return self.test(clients)


def parse_selector(value: Any, *, where: str) -> ClientSelector:
    """An int, a list of ints, ``"<=N"``, ``">=N"``, ``"A..B"`` or ``"*"``."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, int):
        number: int = value
        return ClientSelector(str(number), lambda c: c == number)
    if isinstance(value, list) and value and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        chosen = frozenset(value)
        return ClientSelector(str(value), lambda c: c in chosen)
    if isinstance(value, str):
        text = value.strip()
        if text in ("*", "all"):
            return ClientSelector(text, lambda c: True)
        if m := re.fullmatch(r"(<=|>=|<|>)\s*(\d+)", text):
            comparison, limit = COMPARISONS[m.group(1)], int(m.group(2))
            return ClientSelector(text, lambda c: comparison(c, limit))
        if m := re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", text):
            low, high = int(m.group(1)), int(m.group(2))
            return ClientSelector(text, lambda c: low <= c <= high)
    raise ThresholdsError(
        f"{where}: cannot read client selector {value!r}. Write an int (50), a list "
        f"([25, 50]), '<=100', '>=600', '100..400' or '*'."
    )


def parse_rate(value: Any, *, where: str) -> float:
    """An offered rate: ``"500/s"``, ``"30/min"``, or a number (per second), from
    :data:`MIN_ARRIVAL_RATE` to :data:`MAX_ARRIVAL_RATE`."""
    rate = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rate = float(value)
    elif isinstance(value, str) and (m := _RATE_RE.fullmatch(value)):
        rate = float(m.group(1)) / (60.0 if m.group(2) == "min" else 1.0)
    if rate is None or not rate > 0:
        raise ThresholdsError(
            f"{where}: cannot read arrival rate {value!r}. Write requests per second as "
            f"\"500/s\" (or per minute, \"30/min\"), more than 0.")
    if not MIN_ARRIVAL_RATE <= rate <= MAX_ARRIVAL_RATE:  # inf and 1e308/s too
        raise ThresholdsError(
            f"{where}: arrival rate {value!r} is {'above' if rate > 1 else 'below'} what "
            f"an open loop offers: from one request an hour (\"0.0167/min\") to "
            f"{MAX_ARRIVAL_RATE:.0f} a second (\"{MAX_ARRIVAL_RATE:.0f}/s\"). Write the "
            f"rate to offer, e.g. \"500/s\" or \"30/min\".")
    return rate


def parse_rate_selector(value: Any, *, where: str) -> ClientSelector:
    """Which offered rates an open-loop ``expect`` block applies to: a rate
    (``"50/s"``), a list of rates, ``"<=100/s"``, ``">=100/s"`` or ``"*"``."""
    if isinstance(value, str) and value.strip() in ("*", "all"):
        return ClientSelector(value.strip(), lambda r: True)
    if isinstance(value, list) and value:
        rates = frozenset(parse_rate(v, where=where) for v in value)
        return ClientSelector(str(value), lambda r: r in rates)
    if isinstance(value, str) and (m := re.fullmatch(r"\s*(<=|>=|<|>)(.+)", value)):
        comparison, limit = COMPARISONS[m.group(1)], parse_rate(m.group(2), where=where)
        return ClientSelector(value.strip(), lambda r: comparison(r, limit))
    rate = parse_rate(value, where=where)
    return ClientSelector(str(value), lambda r: r == rate)


@dataclass(frozen=True)
class Expectation:
    """The rules that hold for the concurrencies (or, in an open-loop section, the
    offered rates) its selector picks."""

    clients: ClientSelector
    rules: tuple[Rule, ...]


# --- plans and scaling -------------------------------------------------------------

def _check_factor(factor: Any, what: str) -> float:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise StorageScaleUsageError(
            f"{what}: {factor!r} is not a scale factor. Give a number with 0 < factor <= 1, "
            f"e.g. 0.1 for a quick smoke run (1 runs the thresholds file's full plan)."
        )
    return float(factor)


def _scaled_time(seconds: float, factor: float) -> float:
    return max(min(seconds, MIN_SCALED_DURATION_S), seconds * factor)


def _scaled_count(count: int, factor: float) -> int:
    return max(1, int(count * factor + 0.5))  # half up: 2.5 -> 3


@dataclass(frozen=True)
class RecoveryPlan:
    """A recovery probe's settings: overload at ``overload_clients`` for
    ``overload_duration``, then probe until the rate is back to ``recover_fraction``
    of the rate before, for at most ``recover_within`` seconds."""

    overload_clients: int
    overload_duration: float
    recover_fraction: float
    recover_within: float

    def scaled(self, factor: float) -> RecoveryPlan:
        """The overload's time and clients shrunk like a section's (see
        :meth:`SectionPlan.scaled`); the fraction and ``recover_within`` unchanged:
        how long the storage may take to come back is a deadline, like the rule
        ``recovery_s <= N`` that judges it, not a workload (a shrunk window reported
        a storage that recovered within the rule's time as never recovered)."""
        factor = _check_factor(factor, "recovery scale factor")
        if factor == 1:
            return self
        return RecoveryPlan(
            overload_clients=_scaled_count(self.overload_clients, factor),
            overload_duration=_scaled_time(self.overload_duration, factor),
            recover_fraction=self.recover_fraction,
            recover_within=self.recover_within,
        )


@dataclass(frozen=True)
class SectionPlan:
    """One ``[ops.<name>]`` section's scan: its operation, concurrencies, timings,
    parameters and expectations."""

    #: the section's name, ``[ops.<name>]`` (the results' ``op`` key)
    name: str
    #: the engine operation it runs: the section name unless ``op =`` says
    operation: str
    clients: tuple[int, ...]
    duration: float
    warmup: float
    hang_timeout: float
    params: dict[str, Any]
    expectations: tuple[Expectation, ...]
    #: the step ends after this many operations (TOML ``operations``); 0: no bound
    max_operations: int = 0
    #: how often ``StorageLoad.repeat`` runs the step (for mean and error bar)
    tries: int = 1
    #: recovery probe settings; None for a plain step
    recovery: RecoveryPlan | None = None
    #: a step (each side of a composite one) that completed fewer operations than
    #: this measured nothing a verdict can rest on: its verdict is ``error``
    min_operations: int = 1
    #: a scaled plan's client count -> the file's count whose rules judge it
    judged_as: Mapping[int, int] = field(default_factory=dict)
    #: on a cluster (--storage-cluster): this many clients per host (0: spread evenly)
    clients_per_host: int = 0
    #: an open-loop section's offered rates (requests/s; empty: a closed loop, scanned
    #: over ``clients``), their schedule and the cap on requests in flight
    arrival_rates: tuple[float, ...] = ()
    arrivals: str = "constant"
    max_in_flight: int = 0
    #: the gate's minimum effects (``min_effect_rate``, ``min_effect_p99``)
    min_effect_rate: float = DEFAULT_MIN_EFFECT_RATE
    min_effect_p99: float = DEFAULT_MIN_EFFECT_P99
    #: the gate's latency floor in seconds (``latency_floor``; 0: every latency judged)
    latency_floor: float = DEFAULT_LATENCY_FLOOR_S
    #: a paired step's budget, times its duration a side (``paired_budget``)
    paired_budget: float = DEFAULT_PAIRED_BUDGET

    @property
    def open_loop(self) -> bool:
        return bool(self.arrival_rates)

    def rules_for(self, clients: int, rate: float = 0.0) -> list[Rule]:
        """The rules of every expectation that selects ``clients`` (for a scaled plan:
        the file's concurrency it stands for; an open-loop step: that selects its
        offered ``rate``), then the :data:`DEFAULT_RULES` on a metric none of them
        names (on the step or on one of its sides)."""
        clients = self.judged_as.get(clients, clients)
        chosen = rate if rate else clients
        rules = [r for e in self.expectations if e.clients(chosen) for r in e.rules]
        named = {rule.metric.rpartition(".")[2] for rule in rules}
        return rules + [rule for rule in default_rules() if rule.metric not in named]

    def scaled(self, factor: float) -> SectionPlan:
        """The plan shrunk for a quick run; ``factor`` 1 returns this plan.

        - ``duration``, ``overload_duration``: times the factor, at least
          :data:`MIN_SCALED_DURATION_S` (1 s), never longer than unscaled; a
          count-bounded section's duration (its cap: the step ends at its count)
          shrinks only as much as its count did, so the time the file gives an
          operation stays (8 flushes in 10 min keep 75 s for the 1 left at 0.1, not 60 s);
        - ``warmup``: times the factor (0 stays 0);
        - ``clients``, ``overload_clients``: times the factor rounded half up, at
          least 1, repeated counts dropped (first kept); each is judged by the rules of
          the count it stands for (:attr:`judged_as`);
        - byte sizes: times the factor, at least 1 byte (0 stays 0); counts (files,
          entries, chunks) and ``max_operations``: times the factor, at least 1
          (``max_operations`` 0, no bound, stays 0); flags and choices unchanged;
          when the shrunk parameters fail the operation's checks, the parameter
          that breaks them keeps its value (:meth:`Operation.scaled_params`);
        - ``hang_timeout`` and ``recover_within`` (deadlines, not workloads),
          ``tries`` and the rules: unchanged; an open loop's ``arrival_rate`` and
          ``max_in_flight`` too (a rate is not a size: a shorter step at the same rate).
        """
        from .load.operations import get_operation

        factor = _check_factor(factor, f"[ops.{self.name}] scale factor")
        if factor == 1:
            return self
        judged_as: dict[int, int] = {}
        for clients in self.clients:
            judged_as.setdefault(
                _scaled_count(clients, factor), self.judged_as.get(clients, clients)
            )
        max_operations = (_scaled_count(self.max_operations, factor)
                          if self.max_operations else 0)
        # the cap of a count-bounded step: its count's share, at least 1 of its operations
        share = max_operations / self.max_operations if self.max_operations else factor
        return dataclasses.replace(
            self,
            clients=tuple(judged_as),
            duration=_scaled_time(self.duration, min(1.0, max(factor, share))),
            warmup=self.warmup * factor,
            params=get_operation(self.operation).scaled_params(self.params, factor),
            max_operations=max_operations,
            recovery=self.recovery.scaled(factor) if self.recovery else None,
            judged_as=judged_as,
        )


@dataclass(frozen=True)
class ThresholdSet:
    """A loaded, validated thresholds file."""

    path: Path
    system: str
    versions: tuple[str, ...]
    sections: dict[str, SectionPlan]
    #: why this file was chosen, for the header and the table
    reason: str = ""
    #: the factor the file's plan was shrunk by (1: as written)
    scale: float = 1.0
    #: ``[known_issues]``: functional check (``name`` or ``name[door]``) -> why it is
    #: known to fail on these versions
    known_issues: Mapping[str, str] = field(default_factory=dict)

    def section(self, name: str) -> SectionPlan | None:
        return self.sections.get(name)

    def known_issue(self, check: str, door: str | None = None) -> str | None:
        """Why ``check`` is known to fail on these versions (through ``door``: an entry
        ``check[door]`` wins over ``check``), or None."""
        if door is not None and f"{check}[{door}]" in self.known_issues:
            return self.known_issues[f"{check}[{door}]"]
        return self.known_issues.get(check)

    def scaled(self, factor: float, *, what: str = "scale factor") -> ThresholdSet:
        """Every section shrunk by ``factor`` (see :meth:`SectionPlan.scaled`);
        ``what`` names the setting in the error for a bad factor."""
        factor = _check_factor(factor, what)
        if factor == 1:
            return self
        return dataclasses.replace(
            self,
            sections={name: plan.scaled(factor) for name, plan in self.sections.items()},
            scale=self.scale * factor,
        )


# --- loading -----------------------------------------------------------------------

def _where(path: Path, key: str) -> str:
    return f"{path}: {key}"


def _check_keys(table: dict, allowed: tuple[str, ...], path: Path, key: str) -> None:
    for name in table:
        if name not in allowed:
            raise ThresholdsError(
                f"{_where(path, key)}: unknown key {name!r}. Valid keys: {', '.join(allowed)}."
            )


def _duration(value: Any, path: Path, key: str) -> float:
    try:
        return parse_duration(value, what=_where(path, key))
    except StorageScaleUsageError as exc:
        raise ThresholdsError(str(exc)) from None


def _timing(name: str, value: Any, path: Path, key: str) -> float:
    """A duration; a warm-up may also be zero."""
    if name == "warmup" and value in (0, "0", "0s"):
        return 0.0
    return _duration(value, path, key)


def _whole_number(table: dict, name: str, default: int, minimum: int, path: Path,
                  key: str, hint: str, maximum: int = MAX_COUNT) -> int:
    value = table.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ThresholdsError(f"{_where(path, f'{key}.{name}')}: must be {hint}.")
    if value > maximum:
        raise ThresholdsError(f"{_where(path, f'{key}.{name}')}: {value} is more than "
                              f"{maximum}; it must be {hint}.")
    return value


def load_thresholds(path: Path, *, reason: str = "", steps: bool = True) -> ThresholdSet:
    """Read and validate one thresholds file; ``steps=False`` reads only its storage and
    ``[known_issues]`` (another system's file, whose rules may name metrics that only
    its own suite registers)."""
    data = _read_toml(path)
    _check_keys(data, ("storage", "defaults", "ops", "known_issues"), path, "top level")
    system, versions = _storage(data.get("storage"), path)
    sections = {}
    if steps:
        defaults = _defaults(data.get("defaults", {}), path)
        sections = _sections(data.get("ops", {}), path, defaults)
    return ThresholdSet(path, system, versions, sections, reason,
                        known_issues=_known_issues(data.get("known_issues", {}), path))


def _known_issues(table: Any, path: Path) -> dict[str, str]:
    """The ``[known_issues]`` table: check name (or ``name[door]``) -> reason."""
    if not isinstance(table, dict):
        raise ThresholdsError(f"{_where(path, 'known_issues')}: must be a table of "
                              f"\"<check>\" = \"<why it fails on these versions>\".")
    for check, reason in table.items():
        # a door: its name, or a load door through another client (``dcap+dccp``)
        if not re.fullmatch(r"\w+(\[[\w.+-]+\])?", check) or not (
                isinstance(reason, str) and reason.strip()):
            raise ThresholdsError(
                f"{_where(path, f'[known_issues].{check}')}: write \"<check>\" = \"<reason>\" "
                f"with a check name such as \"readv_overlapping\" (or \"readv_overlapping[root]\""
                f" for one door, \"overwrite[dcap+dccp]\" for a load door through another "
                f"client) and a non-empty reason, e.g. the storage's answer."
            )
    return dict(table)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ThresholdsError(f"{path}: cannot read thresholds file: {exc.strerror}.") from None
    except UnicodeDecodeError as exc:
        raise ThresholdsError(_not_utf8(path, exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ThresholdsError(f"{path}: not valid TOML: {exc}. Fix the syntax.") from None


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> str:
    """Where the first byte that is not UTF-8 is: line, column and byte offset."""
    before = exc.object[:exc.start]
    line = before.count(b"\n") + 1
    column = exc.start - (before.rfind(b"\n") + 1) + 1
    byte = exc.object[exc.start:exc.start + 1]
    return (f"{path}: line {line}, column {column} (byte {exc.start}): the byte 0x{byte.hex()} "
            f"is not UTF-8; a thresholds file is TOML, which is UTF-8 (comments too). "
            f"Re-save it as UTF-8, e.g. iconv -f latin1 -t utf-8.")


def _storage(storage: Any, path: Path) -> tuple[str, tuple[str, ...]]:
    """The ``[storage]`` table: system name and version patterns."""
    if not isinstance(storage, dict):
        raise ThresholdsError(
            f"{path}: missing [storage] table. Add [storage] with system = \"xrootd\" and "
            f"versions = [\"5.5.*\"]."
        )
    _check_keys(storage, ("system", "versions", "description"), path, "[storage]")
    system = storage.get("system")
    versions = storage.get("versions")
    if not isinstance(system, str) or not system:
        raise ThresholdsError(
            f"{_where(path, '[storage].system')}: must be a name, e.g. \"dcache\"."
        )
    if not (isinstance(versions, list) and versions and all(isinstance(v, str) for v in versions)):
        raise ThresholdsError(
            f"{_where(path, '[storage].versions')}: must be a list of version patterns, "
            f"e.g. [\"9.2.*\"] or [\"*\"] for a fallback."
        )
    return system, tuple(versions)


def _defaults(table: Any, path: Path) -> dict[str, float]:
    """The ``[defaults]`` timings every section inherits."""
    if not isinstance(table, dict):
        raise ThresholdsError(
            f"{_where(path, 'defaults')}: must be a table: [defaults] with "
            f"{', '.join(DEFAULT_KEYS)}."
        )
    _check_keys(table, DEFAULT_KEYS, path, "[defaults]")
    defaults = {"duration": 60.0, "warmup": 0.0, "hang_timeout": 60.0}
    for name, value in table.items():
        defaults[name] = _timing(name, value, path, f"[defaults].{name}")
    return defaults


def _sections(table: Any, path: Path, defaults: dict[str, float]) -> dict[str, SectionPlan]:
    if not isinstance(table, dict):
        raise ThresholdsError(f"{_where(path, 'ops')}: must be a table of [ops.<op>] sections.")
    return {name: _section(name, section, path, defaults) for name, section in table.items()}


def _section(name: str, table: Any, path: Path, defaults: dict[str, float]) -> SectionPlan:
    """One ``[ops.<name>]`` section."""
    key = f"[ops.{name}]"
    if not isinstance(table, dict):
        raise ThresholdsError(f"{_where(path, key)}: must be a table.")
    operation = _section_operation(name, table, path, key)
    _check_keys(table, (*SECTION_KEYS, *RECOVERY_KEYS, *operation.param_names), path, key)
    max_operations = _whole_number(
        table, "operations", 0, 0, path, key, "a whole number of operations (the step ends "
        "when that many were done), e.g. operations = 450",
    )
    recovery = _recovery(table, path, key)
    tries = _whole_number(table, "tries", 1, 1, path, key,
                          "a whole number of repetitions, e.g. tries = 10", MAX_TRIES)
    min_operations = _whole_number(
        table, "min_operations", 1, 1, path, key, "a whole number of operations a step must "
        "complete for a verdict, e.g. min_operations = 100 (p99 needs at least 100)",
    )
    clients_per_host = _whole_number(
        table, "clients_per_host", 0, 0, path, key, "a whole number of clients each host of "
        "a --storage-cluster runs, e.g. clients_per_host = 100 (default: spread evenly)",
    )
    rates, arrivals, max_in_flight = _open_loop(table, operation, path, key)
    clients = () if rates else _clients(table.get("clients"), path, key)
    timings = {
        timing: _timing(timing, table[timing], path, f"{key}.{timing}") if timing in table
        else defaults[timing]
        for timing in DEFAULT_KEYS
    }
    return SectionPlan(
        name=name,
        operation=operation.name,
        clients=clients,
        duration=timings["duration"],
        warmup=timings["warmup"],
        hang_timeout=timings["hang_timeout"],
        params=_params(operation, table, path, key),
        expectations=_expectations(name, table.get("expect", []), operation.sides, path,
                                   open_loop=bool(rates)),
        max_operations=max_operations,
        tries=tries,
        recovery=recovery,
        min_operations=min_operations,
        clients_per_host=clients_per_host,
        arrival_rates=rates, arrivals=arrivals, max_in_flight=max_in_flight,
        min_effect_rate=_min_effect(table, "min_effect_rate", DEFAULT_MIN_EFFECT_RATE, 1.0,
                                    path, key, "0.15 (a rate 15 % lower regressed)"),
        min_effect_p99=_min_effect(table, "min_effect_p99", DEFAULT_MIN_EFFECT_P99, 100.0,
                                   path, key, "0.25 (a p99 25 % higher regressed)"),
        latency_floor=_latency_floor(table, path, key),
        paired_budget=_paired_budget(table, path, key),
    )


def _paired_budget(table: dict, path: Path, key: str) -> float:
    """A paired step's budget: 1 to 100 times its duration a side."""
    value = table.get("paired_budget", DEFAULT_PAIRED_BUDGET)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 100:
        raise ThresholdsError(
            f"{_where(path, f'{key}.paired_budget')}: must be a number from 1 to 100 (times "
            f"the step's duration each side may measure while the paired gate is "
            f"inconclusive), e.g. paired_budget = 10; got {value!r}.")
    return float(value)


def _latency_floor(table: dict, path: Path, key: str) -> float:
    """The gate's latency floor: a duration (``"1ms"``), 0 for none; at most 60 s."""
    if "latency_floor" not in table:
        return DEFAULT_LATENCY_FLOOR_S
    value = table["latency_floor"]
    if value in (0, "0", "0s", "0ms") and not isinstance(value, bool):
        return 0.0
    floor = _duration(value, path, f"{key}.latency_floor")
    if floor > 60:
        raise ThresholdsError(f"{_where(path, f'{key}.latency_floor')}: {value!r} is longer "
                              f"than 60 s; write the latency below which the gate does not "
                              f"judge p50 and p99, e.g. latency_floor = \"1ms\" (0: none).")
    return floor


def _min_effect(table: dict, name: str, default: float, below: float, path: Path, key: str,
                example: str) -> float:
    """A minimum effect of the gate: a fraction above 0 (a rate's below 1)."""
    value = table.get(name, default)
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not 0 < value < below):
        raise ThresholdsError(
            f"{_where(path, f'{key}.{name}')}: must be a number above 0 and below "
            f"{below:g}, e.g. {name} = {example}; got {value!r}.")
    return float(value)


def _open_loop(table: dict, operation: Operation, path: Path, key: str
               ) -> tuple[tuple[float, ...], str, int]:
    """An open-loop section's offered rates, schedule and cap (none: a closed loop)."""
    if "arrival_rate" not in table:
        extra = [name for name in ("arrivals", "max_in_flight") if name in table]
        if extra:
            raise ThresholdsError(f"{_where(path, key)}: {', '.join(extra)} belong to an "
                                  f"open-loop section; add arrival_rate = [\"50/s\", ...] "
                                  f"(or remove them).")
        return (), "constant", 0
    if "clients" in table:
        raise ThresholdsError(
            f"{_where(path, key)}: give either clients (a closed loop: each client sends "
            f"its next request when the last one returned) or arrival_rate (an open loop: "
            f"requests at a fixed rate, max_in_flight the cap), not both.")
    if operation.sides:
        raise ThresholdsError(
            f"{_where(path, key)}: arrival_rate works with one-sided operations; "
            f"{operation.name} has sides ({', '.join(operation.sides)}): scan it with "
            f"clients, or give each side its own open-loop section.")
    where = _where(path, f"{key}.arrival_rate")
    value = table["arrival_rate"]
    if not isinstance(value, list) or not value:
        raise ThresholdsError(f"{where}: must be a list of offered rates, e.g. "
                              f"arrival_rate = [\"2/s\", \"5/s\", \"50/s\"].")
    rates = tuple(dict.fromkeys(parse_rate(v, where=where) for v in value))
    arrivals = table.get("arrivals", "constant")
    if arrivals not in ARRIVALS:
        raise ThresholdsError(f"{_where(path, f'{key}.arrivals')}: {arrivals!r} is not a "
                              f"schedule; write arrivals = \"constant\" (every 1/rate s) or "
                              f"\"poisson\" (random gaps of mean 1/rate s).")
    cap = _whole_number(table, "max_in_flight", DEFAULT_MAX_IN_FLIGHT, 1, path, key,
                        "a whole number of requests in flight at most (the clients the "
                        "engine may use), e.g. max_in_flight = 200")
    try:
        check_clients(cap, what=_where(path, f"{key}.max_in_flight"))
    except StorageScaleUsageError as exc:
        raise ThresholdsError(str(exc)) from None
    return rates, arrivals, cap


def _section_operation(name: str, table: dict, path: Path, key: str) -> Operation:
    """The operation a section runs: ``op = "get"`` or its own name."""
    from .load.operations import get_operation, operation_names

    operation = table.get("op", name)
    known = operation_names()
    if operation not in known:
        what = f"op = {operation!r}" if "op" in table else f"operation {name!r}"
        raise ThresholdsError(
            f"{_where(path, key)}: unknown {what}. Known operations: {', '.join(known)}. "
            f"A section with another name says which it runs: op = \"get\"."
        )
    return get_operation(operation)


def _clients(clients: Any, path: Path, key: str) -> tuple[int, ...]:
    if not (isinstance(clients, list) and clients and all(
        isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in clients
    )):
        raise ThresholdsError(
            f"{_where(path, key + '.clients')}: must be a list of positive client counts, "
            f"e.g. clients = [5, 50, 200]."
        )
    try:
        for count in clients:
            check_clients(count, what=_where(path, key + ".clients"))
    except StorageScaleUsageError as exc:
        raise ThresholdsError(str(exc)) from None
    return tuple(clients)


def _params(operation: Operation, table: dict, path: Path, key: str) -> dict[str, Any]:
    try:
        return operation.parse_params(
            {k: v for k, v in table.items() if k in operation.param_names},
            where=_where(path, key),
        )
    except StorageScaleUsageError as exc:
        raise ThresholdsError(str(exc)) from None


def _expectations(name: str, expect: Any, sides: tuple[str, ...],
                  path: Path, *, open_loop: bool = False) -> tuple[Expectation, ...]:
    if not isinstance(expect, list):
        raise ThresholdsError(
            f"{_where(path, f'[ops.{name}].expect')}: write expectations as "
            f"[[ops.{name}.expect]] blocks with clients and rules."
        )
    return tuple(
        _expectation(block, sides, path, f"[ops.{name}.expect][{index}]", open_loop)
        for index, block in enumerate(expect)
    )


def _expectation(block: Any, sides: tuple[str, ...], path: Path, key: str,
                 open_loop: bool = False) -> Expectation:
    """One ``[[ops.<name>.expect]]`` block: a client selector (an open-loop section's:
    a rate selector, ``arrival_rate``) and its rules; without one, every step."""
    where = _where(path, key)
    if not isinstance(block, dict):
        raise ThresholdsError(f"{where}: must be a table with clients and rules.")
    scan = "arrival_rate" if open_loop else "clients"
    _check_keys(block, (scan, "rules"), path, key)
    selector = (parse_rate_selector(block.get(scan, "*"), where=f"{where}.{scan}")
                if open_loop else
                parse_selector(block.get("clients", "*"), where=f"{where}.clients"))
    rules = block.get("rules")
    if not isinstance(rules, list) or not rules:
        raise ThresholdsError(
            f"{where}.rules: must be a non-empty list, e.g. rules = [\"hung == 0\"]."
        )
    return Expectation(selector, tuple(
        parse_rule(rule, sides=sides, where=f"{where}.rules[{i}]")
        for i, rule in enumerate(rules)
    ))


def _recovery(table: dict, path: Path, key: str) -> RecoveryPlan | None:
    """A recovery probe's settings (all four keys or none)."""
    present = [k for k in RECOVERY_KEYS if k in table]
    if not present:
        return None
    missing = [k for k in RECOVERY_KEYS if k not in table]
    if missing:
        raise ThresholdsError(
            f"{_where(path, key)}: a recovery probe needs {', '.join(RECOVERY_KEYS)}; "
            f"missing {', '.join(missing)}."
        )
    overload = table["overload_clients"]
    if not isinstance(overload, int) or isinstance(overload, bool) or overload < 1:
        raise ThresholdsError(
            f"{_where(path, key + '.overload_clients')}: must be a client count, e.g. 600."
        )
    fraction = table["recover_fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not (
        0 < fraction <= 1
    ):
        raise ThresholdsError(
            f"{_where(path, key + '.recover_fraction')}: {fraction!r} must be a fraction of the "
            f"rate before the overload, between 0 and 1, e.g. 0.8."
        )
    return RecoveryPlan(
        overload_clients=overload,
        overload_duration=_duration(table["overload_duration"], path,
                                    key + ".overload_duration"),
        recover_fraction=float(fraction),
        recover_within=_duration(table["recover_within"], path, key + ".recover_within"),
    )


# --- choosing a file ---------------------------------------------------------------

def _specificity(pattern: str) -> int:
    """More literal characters = more specific; ``*`` alone is the weakest."""
    return sum(1 for ch in pattern if ch not in "*?[]")


def select_thresholds(root: Path, system: str, version: str, *,
                      steps: bool = True) -> ThresholdSet:
    """Pick the thresholds file for ``system`` at ``version``.

    ``root`` is a file (used as given) or a folder laid out as ``<system>/*.toml``.
    Among the files whose ``versions`` patterns match, the most specific pattern wins.
    ``steps=False``: only the storage and ``[known_issues]`` of each file are read.
    """
    if root.is_file():
        ts = load_thresholds(root, steps=steps)
        reason = "given by --storage-thresholds"
        if not any(fnmatch.fnmatchcase(version, p) for p in ts.versions):
            reason += f"; its versions {list(ts.versions)} do not include {version}"
        return dataclasses.replace(ts, reason=reason)
    folder = root / system
    if not folder.is_dir():
        available = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        raise ThresholdsError(
            f"{folder}: no thresholds folder for storage system {system!r}. "
            + (f"Systems with thresholds here: {', '.join(available)}. " if available
               else f"{root} has no <system>/*.toml folders. ")
            + "Pass --storage-system or --storage-thresholds PATH."
        )
    candidates = _candidates(folder, system, version, steps)
    candidates.sort(key=lambda c: -c[0])
    top_score, pattern, chosen = candidates[0]
    ties = [c for c in candidates[1:] if c[0] == top_score]
    if ties:
        names = ", ".join(str(c[2].path.name) for c in [candidates[0], *ties])
        raise ThresholdsError(
            f"{folder}: version {version!r} matches equally specific patterns in several "
            f"files ({names}). Make one pattern more specific."
        )
    return dataclasses.replace(chosen, reason=f"matched version {version} with pattern {pattern!r}")


def _candidates(folder: Path, system: str, version: str,
                steps: bool = True) -> list[tuple[int, str, ThresholdSet]]:
    """The files of ``folder`` whose versions match, with their best pattern's score."""
    files = sorted(folder.glob("*.toml"))
    candidates = []
    for path in files:
        ts = load_thresholds(path, steps=steps)
        matching = [p for p in ts.versions if fnmatch.fnmatchcase(version, p)]
        if matching:
            best = max(matching, key=_specificity)
            candidates.append((_specificity(best), best, ts))
    if not candidates:
        listed = "; ".join(
            f"{p.name}: {', '.join(load_thresholds(p, steps=False).versions)}" for p in files
        ) or "none"
        raise ThresholdsError(
            f"{folder}: no thresholds file matches {system} version {version!r} "
            f"(files and their versions: {listed}). Add a file for this version, a fallback "
            f"with versions = [\"*\"], or pass --storage-version."
        )
    return candidates


# --- judging -----------------------------------------------------------------------

def evaluate(
    rules: list[Rule], metric: Callable[[str], float],
    baseline: Callable[[str], float | None] | None = None,
) -> list[RuleCheck]:
    """Check every rule against ``metric(name)``; relative rules against
    ``baseline(name)`` (the same step of an earlier run), when there is one. The step
    passes when no check's ``passed`` is False (:func:`~.records.all_passed`)."""
    from .records import RuleCheck  # records import the engine's statistics

    checks = []
    for rule in rules:
        observed = metric(rule.metric)
        base = baseline(rule.metric) if (rule.relative and baseline is not None) else None
        limit = (rule.limit * metric(rule.reference) if rule.reference is not None
                 else rule.resolve(base))
        passed = None if limit is None else COMPARISONS[rule.comparison](observed, limit)
        checks.append(RuleCheck(rule=rule.text, metric=rule.metric,
                                comparison=rule.comparison, limit=limit, observed=observed,
                                passed=passed, baseline=base, relative=rule.relative))
    return checks
