"""Thresholds folders made from the shipped ones, for the tests that run suites."""

from __future__ import annotations

import re
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
    listed = ", ".join(f'"{rule}"' for rule in rules)
    return (f'[storage]\nsystem = "xrootd"\nversions = ["*"]\n\n[defaults]\n'
            f'duration = "{duration}"\nwarmup = "0s"\nhang_timeout = "30s"\n\n'
            f'[ops.{op}]\nclients = [{clients}]\n[[ops.{op}.expect]]\nclients = "*"\n'
            f'rules = [{listed}]\n')
