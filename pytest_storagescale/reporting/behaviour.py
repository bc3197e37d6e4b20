"""Behaviour changes against a baseline, and the site's acceptance of them.

A run compared with a baseline (``--storage-baseline``, ``storagescale compare``)
fails its gate when a check behaves differently from the baseline's run, until the
site's own acceptance file (``--storage-accept FILE``, ``compare --accept FILE``) lists
the change with a reason. The thresholds files' ``[known_issues]`` describe what a
version does (the check is ``xfailed``); they do not approve the change: a check that
passed on the baseline and is ``xfailed`` now is a change.

What is a change (:func:`outcome_changes`, :func:`step_changes`):

- a test whose outcome was ``passed`` (or ``xpassed``) in the baseline and is
  ``failed``, ``error`` or ``xfailed`` now: it **fails** the gate unless accepted;
- any other outcome change (``passed -> skipped``, ``xfailed -> passed``, ``failed ->
  xfailed``, ``-> interrupted``) is a **note**: said, never failing;
- a load step (matched by its section, concurrency, label, side and door) that meets
  an error kind (``errors``: ``timeout``, ``permission``...) its baseline step did not
  meet, or is throttled (HTTP 429/503) where its baseline step was not: it **fails**
  the gate unless accepted (``from = "none"``, ``to = "error:timeout"`` or
  ``to = "throttled"``);
- a test of the baseline this run did not run is not a change (a run of a subset).

The acceptance file (TOML; :func:`load_acceptance`)::

    [[accept]]
    test = "*test_dcache_behaviour.py::*::test_prepare_stage[root]"
    from = "passed"              # optional: any outcome
    to = "xfailed"
    reason = "11.2's xrootd door refuses kXR_prepare; we do not stage over xroot"
    who = "storage team"         # optional
    when = 2026-11-28            # optional

``test`` is the pytest node id (a load step's: its test's node id); ``*`` matches any
text, nothing else is special (``[root]`` is literal). A bad file is one usage error
(exit status 4) naming the file, the entry and the fix.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import StorageScaleUsageError
from ..records import StepRecord
from .results import InputFileError, read_input_file

#: outcomes that show the behaviour the check wants, and those that do not
GOOD, BAD = ("passed", "xpassed"), ("failed", "error", "xfailed")
#: every outcome a results file records (``not run``: the test is absent)
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "interrupted",
            "not run")
#: a step change's ``from``; its ``to`` is ``error:<kind>`` or ``throttled``
NONE, THROTTLED, ERROR_PREFIX = "none", "throttled", "error:"
#: the keys of an acceptance entry
ENTRY_KEYS = {"test", "from", "to", "reason", "who", "when"}
#: at most this many entries in an acceptance file
MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class Change:
    """One behaviour change: the test (node id), its outcome before and after, what
    the new run said of it (``cause``), whether it fails the gate (else a note), and
    the acceptance entry's reason when the site accepted it."""

    test: str
    before: str
    after: str
    fails: bool
    cause: str = ""
    #: a load step's name (``stat at 50 clients``); "" for a test's outcome
    step: str = ""
    accepted: str = ""

    @property
    def blocking(self) -> bool:
        """It fails the gate: a failing change no acceptance entry lists."""
        return self.fails and not self.accepted

    def text(self) -> str:
        """``<test>: passed -> xfailed: <cause> (accepted: <reason>)``."""
        where = f"{self.test} ({self.step})" if self.step else self.test
        cause = f": {self.cause.splitlines()[0]}" if self.cause.strip() else ""
        accepted = f" (accepted: {self.accepted})" if self.accepted else ""
        return f"{where}: {self.before} -> {self.after}{cause}{accepted}"

    def to_json(self) -> dict[str, Any]:
        return {"test": self.test, "step": self.step, "from": self.before,
                "to": self.after, "fails": self.fails, "cause": self.cause,
                "accepted": self.accepted or None}


def outcome_changes(before: Mapping[str, str], after: Mapping[str, str],
                    causes: Mapping[str, str] | None = None) -> list[Change]:
    """The tests whose outcome differs (``before``, ``after``: node id -> outcome);
    a test only in ``after`` is new, one only in ``before`` was not run (no change)."""
    changes = []
    for test, now in after.items():
        was = before.get(test)
        if was is None or was == now:
            continue
        changes.append(Change(test, was, now, fails=was in GOOD and now in BAD,
                              cause=(causes or {}).get(test, "")))
    return changes


def _kinds(step: StepRecord) -> tuple[set[str], int]:
    """A step's error kinds and throttled operations, over its sides."""
    kinds: set[str] = set()
    throttled = 0
    for side in step.sides.values():
        kinds |= {kind for kind, count in side.errors.items() if count}
        throttled += side.throttled
    return kinds, throttled


def step_changes(before: Iterable[StepRecord], after: Iterable[StepRecord]) -> list[Change]:
    """Load steps that meet an error kind, or throttling, their baseline step (same
    :attr:`StepRecord.key`) did not; a step the baseline lacks is new (no change)."""
    base = {step.key: step for step in before}
    base_door_less = {step.key[:4]: step for step in base.values() if not step.door}
    changes = []
    for step in after:
        old = base.get(step.key) or base_door_less.get(step.key[:4])
        if old is None or not step.measured or not old.measured:
            continue
        (kinds, throttled), (old_kinds, old_throttled) = _kinds(step), _kinds(old)
        examples = {kind: example for side in step.sides.values()
                    for kind, example in side.error_examples.items()}
        for kind in sorted(kinds - old_kinds - {THROTTLED}):
            changes.append(Change(step.test, NONE, f"{ERROR_PREFIX}{kind}", fails=True,
                                  cause=examples.get(kind, ""), step=step.title))
        if throttled and not old_throttled:
            changes.append(Change(step.test, NONE, THROTTLED, fails=True,
                                  cause=f"{throttled} operations throttled",
                                  step=step.title))
    return changes


# -- the acceptance file ----------------------------------------------------------------

@dataclass(frozen=True)
class Accepted:
    """One entry of an acceptance file."""

    test: str
    to: str
    reason: str
    before: str = "*"
    who: str = ""
    when: str = ""

    def matches(self, change: Change) -> bool:
        return (_pattern(self.test).fullmatch(change.test) is not None
                and _pattern(self.before).fullmatch(change.before) is not None
                and _pattern(self.to).fullmatch(change.after) is not None)

    def text(self) -> str:
        by = ", ".join(part for part in (self.who, self.when) if part)
        return f"{self.reason}" + (f" ({by})" if by else "")


def _pattern(text: str) -> re.Pattern[str]:
    """``*`` matches any text; every other character is itself (``[root]`` too)."""
    return re.compile(".*".join(re.escape(part) for part in text.split("*")), re.DOTALL)


@dataclass(frozen=True)
class Acceptance:
    """A site's acceptance file: the changes it accepts, each with its reason."""

    path: Path | None = None
    entries: tuple[Accepted, ...] = field(default_factory=tuple)

    def __str__(self) -> str:  # the header's ``storage_accept: FILE (n entries)``
        return f"{self.path} ({len(self.entries)} accepted changes)"

    def judge(self, changes: Iterable[Change]) -> list[Change]:
        """``changes`` with the reason of the first entry that lists each failing one."""
        judged = []
        for change in changes:
            entry = next((e for e in self.entries if change.fails and e.matches(change)),
                         None)
            judged.append(change if entry is None else
                          replace(change, accepted=entry.text()))
        return judged


def _bad(source: str, path: Path, what: str) -> StorageScaleUsageError:
    return StorageScaleUsageError(
        f"{source} {path}: {what}. An acceptance file is TOML with one [[accept]] table per "
        f"accepted change: test = \"<node id, * for any text>\", to = \"<outcome now>\", "
        f"reason = \"<why the site accepts it>\" (optional: from, who, when); see "
        f"docs/upgrade.md.")


def load_acceptance(path: Path, source: str = "--storage-accept") -> Acceptance:
    """Read and check the acceptance file ``path`` (bounded like a results file)."""
    try:
        text = read_input_file(path).decode("utf-8")
        document = tomllib.loads(text)
    except InputFileError as exc:
        raise _bad(source, path, str(exc)) from None
    except UnicodeDecodeError:
        raise _bad(source, path, "it is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise _bad(source, path, f"not valid TOML ({exc})") from None
    except RecursionError:
        raise _bad(source, path, "it is nested too deep") from None
    unknown = set(document) - {"accept"}
    if unknown:
        raise _bad(source, path, f"unknown table or key {sorted(unknown)[0]!r}")
    listed = document.get("accept", [])
    if not isinstance(listed, list) or not all(isinstance(e, dict) for e in listed):
        raise _bad(source, path, "'accept' must be [[accept]] tables")
    if len(listed) > MAX_ENTRIES:
        raise _bad(source, path, f"{len(listed)} entries, more than {MAX_ENTRIES}")
    return Acceptance(path, tuple(_entry(source, path, index, entry)
                                  for index, entry in enumerate(listed, 1)))


def _entry(source: str, path: Path, index: int, entry: dict[str, Any]) -> Accepted:
    where = f"[[accept]] number {index}"
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise _bad(source, path, f"{where}: unknown key {sorted(unknown)[0]!r} (keys: "
                                 f"{', '.join(sorted(ENTRY_KEYS))})")
    for key in ("test", "to", "reason"):
        value = entry.get(key)
        if not isinstance(value, str) or not value.strip():
            raise _bad(source, path, f"{where}: {key!r} is missing or empty; every entry "
                                     f"names the test, the outcome it has now and the reason")
    for key in ("from", "to"):
        value = entry.get(key, "*")
        if not isinstance(value, str) or not _known(value):
            raise _bad(source, path, f"{where}: {key} = {value!r} is not an outcome: write "
                                     f"one of {', '.join(OUTCOMES)}, or for a load step "
                                     f"'{NONE}', '{THROTTLED}' or '{ERROR_PREFIX}<kind>' "
                                     f"(* for any)")
    who, when = entry.get("who", ""), entry.get("when", "")
    if not isinstance(who, str):
        raise _bad(source, path, f"{where}: who = {who!r} must be text")
    return Accepted(test=entry["test"].strip(), to=entry["to"].strip(),
                    reason=" ".join(entry["reason"].split()),
                    before=str(entry.get("from", "*")).strip(),
                    who=who, when=str(when))


def _known(value: str) -> bool:
    value = value.strip()
    if value in (*OUTCOMES, NONE, THROTTLED, "*"):
        return True
    return bool(re.fullmatch(r"error:[\w.*-]+", value))


# -- the verdict ------------------------------------------------------------------------

@dataclass(frozen=True)
class BehaviourGate:
    """The behaviour part of the gate: every change found, judged."""

    baseline: str
    changes: tuple[Change, ...]
    accept_file: str = ""
    #: the baseline holds its tests' outcomes (a results file of an earlier release
    #: does not: the checks' outcomes are then not compared, only load steps')
    outcomes_known: bool = True

    @property
    def blocking(self) -> list[Change]:
        return [change for change in self.changes if change.blocking]

    @property
    def passed(self) -> bool:
        return not self.blocking

    def headline(self) -> str:
        """``gate: 2 behaviour changes not accepted`` (or how many were accepted)."""
        blocking = len(self.blocking)
        accepted = sum(1 for change in self.changes if change.accepted)
        if blocking:
            return (f"gate: {blocking} behaviour change{'s' * (blocking != 1)} not "
                    f"accepted (against {self.baseline})")
        if accepted:
            return (f"gate: {accepted} behaviour change{'s' * (accepted != 1)} against "
                    f"{self.baseline}, each accepted by {self.accept_file}")
        if not self.outcomes_known:
            return (f"gate: no load step's behaviour changed against {self.baseline}; the "
                    f"checks' outcomes were not compared (the baseline holds none: written "
                    f"before they were kept)")
        return f"gate: no behaviour change against {self.baseline}"

    def lines(self) -> list[str]:
        """What a reader needs: the blocking changes, then the accepted, then the notes."""
        out = [self.headline()]
        blocking = self.blocking
        accepted = [c for c in self.changes if c.accepted]
        notes = [c for c in self.changes if not c.fails]
        if blocking:
            out.append("  not accepted (list them in an acceptance file, --storage-accept, "
                       "with a reason, to accept them):")
            out += [f"    {change.text()}" for change in blocking]
        if accepted:
            out.append("  accepted:")
            out += [f"    {change.text()}" for change in accepted]
        if notes:
            out.append("  notes (do not fail the gate):")
            out += [f"    {change.text()}" for change in notes]
        return out

    def to_json(self) -> dict[str, Any]:
        return {"verdict": "passed" if self.passed else "failed", "baseline": self.baseline,
                "accept_file": self.accept_file or None,
                "outcomes_compared": self.outcomes_known,
                "changes": [change.to_json() for change in self.changes]}
