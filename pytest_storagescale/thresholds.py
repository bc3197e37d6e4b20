"""Thresholds files: the test plan and the pass/fail rules for one storage version range.

A file says which concurrencies each operation is scanned at and what must hold at
each of them::

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

Files are validated when loaded; every problem is a :class:`ThresholdsError` that
names the file, the key and what is valid.
"""

from __future__ import annotations

import fnmatch
import operator
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import parse_duration
from .errors import StorageScaleUsageError, ThresholdsError

#: metrics a rule may name; a mixed step prefixes them with its side (``readers.mb_s``)
METRICS = (
    "rate_hz", "rate_per_min", "mb_s", "mbit_s", "succeeded", "failed", "hung", "error_ratio",
    "mean_s", "p50_s", "p90_s", "p99_s", "max_s",
    # derived by a suite from several steps: mixed vs separate throughput, recovery
    # time, same-file vs distinct-file transfer time
    "mix_ratio", "recovery_s", "hot_ratio",
    # over a section's repeated tries (``tries = 10``): the seeds' error bars
    "mb_s_mean", "mb_s_stddev", "rate_hz_mean", "rate_hz_stddev",
)
COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt,
    "==": operator.eq,
}
DEFAULT_KEYS = ("duration", "warmup", "hang_timeout")
#: keys an ``[ops.<name>]`` table may hold besides the per-op parameters
OP_KEYS = ("op", "clients", "expect", "operations", "tries", *DEFAULT_KEYS)
#: keys of a recovery probe section (see ``StorageLoad.recovery``)
RECOVERY_KEYS = ("overload_clients", "overload_duration", "recover_fraction", "recover_within")
_NUMBER = r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
_RULE_RE = re.compile(
    rf"^\s*([A-Za-z_][\w.]*)\s*(>=|<=|==|>|<)\s*"
    rf"(?:({_NUMBER})\s*(\*\s*baseline)?|(baseline))\s*$"
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

    def resolve(self, baseline: float | None) -> float | None:
        """The number to compare with; None for a relative rule without a baseline."""
        if not self.relative:
            return self.limit
        return None if baseline is None else self.limit * baseline

    def holds(self, observed: float, baseline: float | None = None) -> bool:
        limit = self.resolve(baseline)
        return limit is not None and COMPARISONS[self.comparison](observed, limit)


def parse_rule(text: str, *, sides: tuple[str, ...] = (), where: str = "rule") -> Rule:
    """Parse one rule; ``sides`` are the prefixes a mixed step allows."""
    match = _RULE_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise ThresholdsError(
            f"{where}: cannot read rule {text!r}. Write '<metric> <comparison> <number>', "
            f"e.g. 'rate_hz >= 4', or relative to a baseline run: 'rate_hz >= 0.9 * baseline'"
            f", 'hung <= baseline'; comparisons: {', '.join(COMPARISONS)}."
        )
    metric, comparison, number, times_baseline, bare_baseline = match.groups()
    relative = bool(times_baseline or bare_baseline)
    number = number if number is not None else "1"
    side, _, bare = metric.rpartition(".")
    known = ", ".join(METRICS)
    if bare not in METRICS:
        raise ThresholdsError(
            f"{where}: unknown metric {bare!r} in {text!r}. Known metrics: {known}."
        )
    if side and side not in sides:
        valid = ", ".join(sides) if sides else "none for this operation"
        raise ThresholdsError(
            f"{where}: unknown side {side!r} in {text!r}. Sides: {valid}."
        )
    return Rule(metric, comparison, float(number), text.strip(), relative)


@dataclass(frozen=True)
class ClientSelector:
    """Which concurrencies an ``expect`` block applies to."""

    text: str
    test: Callable[[int], bool] = field(compare=False)

    def __call__(self, clients: int) -> bool:
        return self.test(clients)


def parse_selector(value: Any, *, where: str) -> ClientSelector:
    """An int, a list of ints, ``"<=N"``, ``">=N"``, ``"A..B"`` or ``"*"``."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, int):
        return ClientSelector(str(value), lambda c, v=value: c == v)
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


@dataclass(frozen=True)
class Expectation:
    """The rules that hold for the concurrencies its selector picks."""

    clients: ClientSelector
    rules: tuple[Rule, ...]


@dataclass(frozen=True)
class OpPlan:
    """One operation's scan: concurrencies, timings, parameters and expectations."""

    name: str
    clients: tuple[int, ...]
    duration: float
    warmup: float
    hang_timeout: float
    params: dict[str, Any]
    expectations: tuple[Expectation, ...]
    #: the engine operation this section runs (the section name unless ``op =`` says)
    operation: str = ""
    #: the step does this many operations and ends (count bound), 0: no bound
    operations: int = 0
    #: how often ``StorageLoad.repeat`` runs the step (for mean and error bar)
    tries: int = 1
    #: recovery probe settings (overload_clients, overload_duration, recover_fraction,
    #: recover_within), empty for a plain step
    recovery: dict[str, Any] = field(default_factory=dict)

    def rules_for(self, clients: int) -> list[Rule]:
        return [r for e in self.expectations if e.clients(clients) for r in e.rules]


@dataclass(frozen=True)
class ThresholdSet:
    """A loaded, validated thresholds file."""

    path: Path
    system: str
    versions: tuple[str, ...]
    ops: dict[str, OpPlan]
    #: why this file was chosen, for the header and the table
    reason: str = ""

    def op(self, name: str) -> OpPlan | None:
        return self.ops.get(name)


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


def load_thresholds(path: Path, *, reason: str = "") -> ThresholdSet:
    """Read and validate one thresholds file."""
    from .load.operations import OPERATIONS  # the op registry defines per-op parameters

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ThresholdsError(f"{path}: cannot read thresholds file: {exc.strerror}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ThresholdsError(f"{path}: not valid TOML: {exc}. Fix the syntax.") from None

    _check_keys(data, ("storage", "defaults", "ops"), path, "top level")
    storage = data.get("storage")
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

    defaults_table = data.get("defaults", {})
    _check_keys(defaults_table, DEFAULT_KEYS, path, "[defaults]")
    defaults = {"duration": 60.0, "warmup": 0.0, "hang_timeout": 60.0}
    for key, value in defaults_table.items():
        defaults[key] = (
            0.0 if key == "warmup" and value in (0, "0", "0s")
            else _duration(value, path, f"[defaults].{key}")
        )

    ops_table = data.get("ops", {})
    if not isinstance(ops_table, dict):
        raise ThresholdsError(f"{_where(path, 'ops')}: must be a table of [ops.<op>] sections.")
    ops = {}
    for name, table in ops_table.items():
        key = f"[ops.{name}]"
        if not isinstance(table, dict):
            raise ThresholdsError(f"{_where(path, key)}: must be a table.")
        op_name = table.get("op", name)
        if op_name not in OPERATIONS:
            what = f"op = {op_name!r}" if "op" in table else f"operation {name!r}"
            raise ThresholdsError(
                f"{_where(path, key)}: unknown {what}. Known operations: "
                f"{', '.join(OPERATIONS)}. A section with another name says which it runs: "
                f"op = \"get\"."
            )
        operation = OPERATIONS[op_name]
        _check_keys(table, (*OP_KEYS, *RECOVERY_KEYS, *operation.param_names), path, key)
        count_bound = table.get("operations", 0)
        if not isinstance(count_bound, int) or isinstance(count_bound, bool) or count_bound < 0:
            raise ThresholdsError(
                f"{_where(path, key + '.operations')}: must be a whole number of operations "
                f"(the step ends when that many were done), e.g. operations = 450."
            )
        recovery = _recovery(table, path, key)
        tries = table.get("tries", 1)
        if not isinstance(tries, int) or isinstance(tries, bool) or tries < 1:
            raise ThresholdsError(
                f"{_where(path, key + '.tries')}: must be a whole number of repetitions, "
                f"e.g. tries = 10."
            )
        clients = table.get("clients")
        if not (isinstance(clients, list) and clients and all(
            isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in clients
        )):
            raise ThresholdsError(
                f"{_where(path, key + '.clients')}: must be a list of positive client counts, "
                f"e.g. clients = [5, 50, 200]."
            )
        timings = {}
        for timing in DEFAULT_KEYS:
            if timing in table:
                value = table[timing]
                timings[timing] = (
                    0.0 if timing == "warmup" and value in (0, "0", "0s")
                    else _duration(value, path, f"{key}.{timing}")
                )
            else:
                timings[timing] = defaults[timing]
        try:
            params = operation.parse_params(
                {k: v for k, v in table.items() if k in operation.param_names},
                where=_where(path, key),
            )
        except StorageScaleUsageError as exc:
            raise ThresholdsError(str(exc)) from None
        expect = table.get("expect", [])
        if not isinstance(expect, list):
            raise ThresholdsError(
                f"{_where(path, key + '.expect')}: write expectations as [[ops.{name}.expect]] "
                f"blocks with clients and rules."
            )
        expectations = []
        for index, block in enumerate(expect):
            where = _where(path, f"[ops.{name}.expect][{index}]")
            if not isinstance(block, dict):
                raise ThresholdsError(f"{where}: must be a table with clients and rules.")
            _check_keys(block, ("clients", "rules"), path, f"[ops.{name}.expect][{index}]")
            selector = parse_selector(block.get("clients", "*"), where=f"{where}.clients")
            rules = block.get("rules")
            if not isinstance(rules, list) or not rules:
                raise ThresholdsError(
                    f"{where}.rules: must be a non-empty list, e.g. rules = [\"hung == 0\"]."
                )
            parsed = tuple(
                parse_rule(rule, sides=operation.sides, where=f"{where}.rules[{i}]")
                for i, rule in enumerate(rules)
            )
            expectations.append(Expectation(selector, parsed))
        ops[name] = OpPlan(
            name=name,
            clients=tuple(clients),
            duration=timings["duration"],
            warmup=timings["warmup"],
            hang_timeout=timings["hang_timeout"],
            params=params,
            expectations=tuple(expectations),
            operation=op_name,
            operations=count_bound,
            tries=tries,
            recovery=recovery,
        )
    return ThresholdSet(path, system, tuple(versions), ops, reason)


def _recovery(table: dict, path: Path, key: str) -> dict[str, Any]:
    """Validate a recovery probe's keys (all or none)."""
    present = [k for k in RECOVERY_KEYS if k in table]
    if not present:
        return {}
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
    return {
        "overload_clients": overload,
        "overload_duration": _duration(table["overload_duration"], path,
                                       key + ".overload_duration"),
        "recover_fraction": float(fraction),
        "recover_within": _duration(table["recover_within"], path, key + ".recover_within"),
    }


def _specificity(pattern: str) -> int:
    """More literal characters = more specific; ``*`` alone is the weakest."""
    return sum(1 for ch in pattern if ch not in "*?[]")


def select_thresholds(root: Path, system: str, version: str) -> ThresholdSet:
    """Pick the thresholds file for ``system`` at ``version``.

    ``root`` is a file (used as given) or a folder laid out as ``<system>/*.toml``.
    Among the files whose ``versions`` patterns match, the most specific pattern wins.
    """
    if root.is_file():
        ts = load_thresholds(root)
        reason = "given by --storage-thresholds"
        if not any(fnmatch.fnmatchcase(version, p) for p in ts.versions):
            reason += f"; its versions {list(ts.versions)} do not include {version}"
        return ThresholdSet(ts.path, ts.system, ts.versions, ts.ops, reason=reason)
    folder = root / system
    if not folder.is_dir():
        available = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        raise ThresholdsError(
            f"{folder}: no thresholds folder for storage system {system!r}. "
            + (f"Systems with thresholds here: {', '.join(available)}. " if available
               else f"{root} has no <system>/*.toml folders. ")
            + "Pass --storage-system or --storage-thresholds PATH."
        )
    files = sorted(folder.glob("*.toml"))
    candidates = []
    for path in files:
        ts = load_thresholds(path)
        matching = [p for p in ts.versions if fnmatch.fnmatchcase(version, p)]
        if matching:
            best = max(matching, key=_specificity)
            candidates.append((_specificity(best), best, ts))
    if not candidates:
        listed = "; ".join(
            f"{p.name}: {', '.join(load_thresholds(p).versions)}" for p in files
        ) or "none"
        raise ThresholdsError(
            f"{folder}: no thresholds file matches {system} version {version!r} "
            f"(files and their versions: {listed}). Add a file for this version, a fallback "
            f"with versions = [\"*\"], or pass --storage-version."
        )
    candidates.sort(key=lambda c: -c[0])
    top_score, pattern, chosen = candidates[0]
    ties = [c for c in candidates[1:] if c[0] == top_score]
    if ties:
        names = ", ".join(str(c[2].path.name) for c in [candidates[0], *ties])
        raise ThresholdsError(
            f"{folder}: version {version!r} matches equally specific patterns in several "
            f"files ({names}). Make one pattern more specific."
        )
    return ThresholdSet(
        chosen.path, chosen.system, chosen.versions, chosen.ops,
        reason=f"matched version {version} with pattern {pattern!r}",
    )


@dataclass(frozen=True)
class Check:
    """One rule checked: ``passed`` is None when a relative rule had no baseline
    (reported, not failed)."""

    rule: Rule
    observed: float
    limit: float | None
    passed: bool | None
    baseline: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule.text, "metric": self.rule.metric,
            "comparison": self.rule.comparison, "limit": self.limit,
            "observed": self.observed, "passed": self.passed, "baseline": self.baseline,
            "relative": self.rule.relative,
        }


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one step's metrics against its rules."""

    verdict: str  # "pass" | "fail"
    checks: tuple[Check, ...]

    @property
    def violations(self) -> list[str]:
        return [
            f"{c.rule.text} (observed {c.observed:.6g}"
            + (f", baseline {c.baseline:.6g})" if c.rule.relative else ")")
            for c in self.checks if c.passed is False
        ]


def evaluate(
    rules: list[Rule], metrics: Callable[[str], float],
    baseline: Callable[[str], float | None] | None = None,
) -> Verdict:
    """Check every rule against ``metrics(name)``; relative rules against
    ``baseline(name)`` (the same step of an earlier run), when there is one."""
    checks = []
    for rule in rules:
        observed = metrics(rule.metric)
        base = baseline(rule.metric) if (rule.relative and baseline is not None) else None
        limit = rule.resolve(base)
        passed = None if limit is None else COMPARISONS[rule.comparison](observed, limit)
        checks.append(Check(rule, observed, limit, passed, base))
    ok = all(check.passed is not False for check in checks)
    return Verdict("pass" if ok else "fail", tuple(checks))
