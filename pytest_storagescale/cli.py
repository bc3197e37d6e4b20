"""The ``storagescale`` command (``[project.scripts]``): what is done with results
files after the runs, without pytest.

``storagescale compare A.json B.json ...`` prints the gate's verdict (the last run
against the one before it), what changed, then the runs side by side (:mod:`.compare`);
``--html DIR`` writes the same page with each scan's runs overlaid; ``--accept FILE``
is the site's acceptance file of behaviour changes. It is a CI gate by itself: exit
status 1 when it lists a regression (a behaviour change not accepted, a rate or latency
regression, a failure of the later run), 0 when it lists none, 4 on bad input (a
missing or foreign file, one file only, a bad acceptance file: one paragraph on
stderr, as pytest's usage errors).

``storagescale tree write|verify`` writes a seeded tree of files before an upgrade and
checks it after (:mod:`.tree`; exit 0, 1 naming each bad file, 4 on bad input).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import StorageScaleUsageError
from .servers.xrootd_releases import use_client_release

#: pytest's exit statuses the command shares: a gate that failed, bad input
GATE_FAILED, USAGE_ERROR = 1, 4


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing its usage and exiting 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise StorageScaleUsageError(f"{self.prog}: {message}. See '{self.prog} --help'.")


def parser() -> argparse.ArgumentParser:
    top = _Parser(prog="storagescale", description="Work with pytest-storagescale "
                  "results files (--storage-results).")
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    compare = commands.add_parser(
        "compare", help="runs side by side: the seeds-style table, one column group per run",
        description="Judge the last run against the one before it (exit status 1 when a "
                    "behaviour change is not accepted, a step regressed or the later run "
                    "failed; 0 otherwise; 4 on bad input), then print the runs side by "
                    "side: per step succeeded (rate), p99, failed, hung and verdict of each "
                    "run, the rate's change, and the steps and checks whose outcome "
                    "changed. Give the earlier version first.")
    compare.add_argument("results", nargs="*", type=Path, metavar="RESULTS.json",
                         help="results files written with --storage-results")
    compare.add_argument("--html", type=Path, metavar="DIR",
                         help="also write DIR/index.html, each scan's runs overlaid")
    compare.add_argument("--accept", type=Path, metavar="FILE",
                         help="the site's acceptance file (TOML, [[accept]] tables): the "
                              "behaviour changes it lists with a reason do not fail the gate")
    from .tree import add_parser as add_tree_parser  # storagescale tree write|verify

    add_tree_parser(commands, _Parser)
    from .history.command import add_parser as add_history_parser  # storagescale history

    add_history_parser(commands, _Parser)
    return top


def compare_command(arguments: argparse.Namespace) -> int:
    from .compare import COMMAND, gate, load_runs, report_lines, write_page
    from .reporting.behaviour import load_acceptance

    acceptance = (load_acceptance(arguments.accept, f"{COMMAND} --accept")
                  if arguments.accept is not None else None)
    runs = load_runs(list(arguments.results))
    verdict = gate(runs, acceptance)
    for line in report_lines(runs, verdict):
        print(line)
    if arguments.html is not None:
        print(f"page: {write_page(arguments.html, runs, verdict)}")
    return 0 if verdict.passed else GATE_FAILED


def main(argv: list[str] | None = None) -> int:
    try:
        arguments = parser().parse_args(argv)
        use_client_release()  # STORAGESCALE_XROOTD_CLIENT: before any XRootD import
        return getattr(arguments, "handler", compare_command)(arguments)
    except StorageScaleUsageError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":  # pragma: no cover - python -m pytest_storagescale.cli
    sys.exit(main())
