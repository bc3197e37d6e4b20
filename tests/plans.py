"""Thresholds folders made from the shipped ones, for the tests that run suites."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHIPPED_XROOTD = REPO / "thresholds" / "xrootd" / "5.x.toml"


def shipped_known_issues() -> str:
    """The shipped xrootd plan's [known_issues] table (its lines, without the header)."""
    return SHIPPED_XROOTD.read_text().split("[known_issues]")[1]


def xrootd_plan(tmp_path: Path, known_issues: str = "") -> Path:
    """A thresholds folder holding the shipped xrootd plan with ``known_issues`` as its
    [known_issues] table (none by default: every check judged as it is)."""
    text = SHIPPED_XROOTD.read_text().split("[known_issues]")[0]
    folder = tmp_path / "thr" / "xrootd"
    folder.mkdir(parents=True)
    (folder / "5.x.toml").write_text(text + "[known_issues]\n" + known_issues)
    return folder.parent


#: a rule on how fast the storage answered (a step's or a side's rate, MB/s or
#: latency percentile), as written in a ``rules = [...]`` list
_SPEED_RULE = re.compile(r'"(?:\w+\.)?(?:rate_hz|mb_s|p\d+_s) [<>]=? [^"]*",?\s*')


def mechanism_plan(tmp_path: Path) -> Path:
    """A thresholds folder holding the shipped xrootd plan, known issues kept, without
    its speed rules (rate, MB/s, latency floors): for tests of something else (reports,
    outcomes) that a loaded machine's speed must not decide."""
    text = _SPEED_RULE.sub("", SHIPPED_XROOTD.read_text())
    folder = tmp_path / "mech" / "xrootd"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "5.x.toml").write_text(text)
    return folder.parent


def one_step_plan(op: str, rules: tuple[str, ...] = ("failed == 0",), clients: int = 1,
                  duration: str = "1s") -> str:
    """A thresholds file (for ``thresholds_dir``) with one section ``op``: ``clients``
    clients for ``duration``, no warm-up, judged by ``rules``."""
    return plan(op_section(op, clients, rules), duration=duration, warmup="0s")


#: the rules of a step that must lose no client
NO_LOSS = ("failed == 0", "hung == 0", "lost == 0")


def plan(*sections: str, system: str = "xrootd", duration: str = "1s", warmup: str = "0.2s",
         hang_timeout: str = "30s") -> str:
    """A thresholds file for ``system`` (any version): the steps' [defaults], then
    ``sections`` (:func:`op_section`)."""
    return (f'[storage]\nsystem = "{system}"\nversions = ["*"]\n\n[defaults]\n'
            f'duration = "{duration}"\nwarmup = "{warmup}"\nhang_timeout = "{hang_timeout}"\n'
            + "".join(sections))


def op_section(name: str, clients: int | Sequence[int], rules: Sequence[str] = NO_LOSS,
               **settings: str | int | bool) -> str:
    """[ops.<name>]: a step at each number of ``clients``, with ``settings`` (``entries=10``,
    ``op="get"``, ``clients_per_host=2`` ...), judged by ``rules`` at every step."""
    counts = [clients] if isinstance(clients, int) else list(clients)
    lines = [f"\n[ops.{name}]", f"clients = [{', '.join(str(c) for c in counts)}]",
             *(f"{key} = {_toml(value)}" for key, value in settings.items()),
             "", f"[[ops.{name}.expect]]", 'clients = "*"',
             f"rules = [{', '.join(json.dumps(rule) for rule in rules)}]"]
    return "\n".join(lines) + "\n"


def _toml(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, int) else json.dumps(value)


def scan_suite(*ops: str) -> str:
    """A suite with one test per op, ``test_<op>_scan``: its steps (the plan's section
    ``op``), run by ``storage_load``."""
    return "import pytest\n" + "".join(
        f'\n@pytest.mark.storagescale_op("{op}")\n'
        f"def test_{op}_scan(storage_load, storage_clients):\n    storage_load.run()\n"
        for op in ops)


def write_suite(directory: Path, suite: str, plan_text: str) -> None:
    """``suite`` as ``directory/test_suite.py`` and ``plan_text`` as the xrootd plan of
    the thresholds folder ``directory/thr`` (``--storage-thresholds=thr`` from there)."""
    (directory / "test_suite.py").write_text(suite)
    folder = directory / "thr" / "xrootd"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "any.toml").write_text(plan_text)
