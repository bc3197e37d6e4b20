"""The ``storagescale`` command (``[project.scripts]``): what is done with results
files after the runs, without pytest.

``storagescale compare A.json B.json ...`` prints the runs side by side
(:mod:`.compare`); ``--html DIR`` writes the page with each scan's runs overlaid.
Bad input (a missing or foreign file, one file only) is one paragraph on stderr and
exit status 4, as pytest's usage errors; a comparison is exit status 0 whatever the
runs' verdicts (the runs themselves gated).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import StorageScaleUsageError

#: pytest's exit status for a usage error, which the command's bad input shares
USAGE_ERROR = 4


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
        description="Print two or more runs side by side: per step succeeded (rate), p99, "
                    "failed, hung and verdict of each run, the rate's change, and the steps "
                    "and checks whose outcome changed. Give the earlier version first.")
    compare.add_argument("results", nargs="*", type=Path, metavar="RESULTS.json",
                         help="results files written with --storage-results")
    compare.add_argument("--html", type=Path, metavar="DIR",
                         help="also write DIR/index.html, each scan's runs overlaid")
    return top


def compare_command(arguments: argparse.Namespace) -> int:
    from .compare import load_runs, report_lines, write_page

    runs = load_runs(list(arguments.results))
    for line in report_lines(runs):
        print(line)
    if arguments.html is not None:
        print(f"page: {write_page(arguments.html, runs)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        arguments = parser().parse_args(argv)
        return compare_command(arguments)
    except StorageScaleUsageError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":  # pragma: no cover - python -m pytest_storagescale.cli
    sys.exit(main())
