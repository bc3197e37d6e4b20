"""The report without Allure: one self-contained HTML page (``--storage-report DIR``):
the run's verdict first (pytest's exit status, so a failed functional check makes it
FAILED as it makes the exit status 1), the run's facts (storage and version, endpoint,
run id, date, thresholds, plan scale), every test (load, functional, conformance),
failures first with their causes, then the seeds-style table of the load steps, every
scan's plot and every step's timeline and latency ECDF (PNG inlined); plus the table
as CSV. Also the per-step table snippets that the Allure attachments reuse."""

from __future__ import annotations

import base64
import csv
import html
import io
import time
from pathlib import Path

from ..records import RunInfo, StepRecord
from ..redact import redact_html, redact_text
from . import plots
from .behaviour import BehaviourGate
from .outcomes import RunSummary
from .table import csv_rows, format_failures, saturation_note, table_order, table_rows

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #eee; }
td:first-child, td:last-child { text-align: left; }
tr.fail td:last-child, tr.error td:last-child { color: #b00; font-weight: bold; }
tr.pass td:last-child { color: #070; }
h1.verdict { padding: 0.2em 0.5em; color: #fff; background: #b00; display: inline-block; }
h1.verdict.passed { background: #070; }
table.facts th, table.facts td, table.tests th, table.tests td { text-align: left; }
table.tests tr.failed td:first-child, table.tests tr.error td:first-child,
table.tests tr.xpassed td:first-child { color: #b00; font-weight: bold; }
table.tests tr.passed td:first-child { color: #070; }
td.cause { white-space: pre-wrap; font-family: monospace; overflow-wrap: anywhere; }
table.tests td.cause { color: #222; font-weight: normal; }
table.tests { table-layout: fixed; width: 100%; }
table.tests th:nth-child(1) { width: 6em; }
table.tests th:nth-child(2) { width: 7em; }
table.tests th:nth-child(3) { width: 30%; }
table.tests td { overflow-wrap: anywhere; vertical-align: top; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; }
img { max-width: 100%; }
.steps { display: flex; flex-wrap: wrap; gap: 1em; }
"""


def table_html(steps: list[StepRecord], main_door: str = "") -> str:
    """The table as an HTML ``<table>``; each row's class is its step's verdict (a door
    column as in :func:`~.table.format_table`; the client CPU column always, with the
    note under the table when a step saturated its client host)."""
    columns, per_step = table_rows(steps, main_door, client_column=True)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for step, rows in zip(steps, per_step, strict=True):
        for row in rows:
            cells = "".join(f"<td>{html.escape(cell)}</td>" for cell in row)
            body.append(f'<tr class="{html.escape(str(step.verdict))}">{cells}</tr>')
    note = "".join(f"<p>{html.escape(line)}</p>" for line in saturation_note(steps))
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{note}"


def table_csv(steps: list[StepRecord], main_door: str = "") -> str:
    """The table as CSV, header first: plain numbers under metric-named columns
    (:func:`~.table.csv_rows`)."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(csv_rows(steps, main_door))
    return buffer.getvalue()


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _when(started: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))


def _facts(run: RunInfo | None, summary: RunSummary) -> list[tuple[str, str]]:
    """The run's facts under the verdict: storage and version, endpoint, run id, date,
    thresholds and plan scale (those known without a load step: endpoint, run, date)."""
    facts = []
    if run is not None:
        source = f" ({run.version_source})" if run.version_source else ""
        facts.append(("storage", f"{run.system} {run.version}{source}"))
    facts += [("endpoint", run.endpoint if run is not None else summary.endpoint),
              ("run id", summary.run_id), ("started", _when(summary.started))]
    if run is not None:
        facts += [("thresholds", f"{run.thresholds_file} ({run.thresholds_reason})"),
                  ("plan scale", f"{run.scale:g}")]
    return facts


def _head(run: RunInfo | None, summary: RunSummary) -> list[str]:
    """The verdict first (pytest's exit status and the counts), then the run's facts."""
    name = f"{run.system} {run.version}" if run is not None else summary.endpoint
    verdict = html.escape(summary.verdict)
    facts = "".join(f"<tr><th>{html.escape(key)}</th><td>{html.escape(value)}</td></tr>"
                    for key, value in _facts(run, summary))
    return [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>storagescale {verdict}: {html.escape(name)}</title><style>{_STYLE}</style>"
        "</head><body>",
        f"<h1 class='verdict {_css(summary.verdict)}'>{verdict}</h1>",
        f"<p class='counts'>{html.escape(summary.counts_text)} (pytest exit status "
        f"{summary.exit_status})</p>",
        f"<table class='facts'>{facts}</table>",
    ]


def _css(outcome: str) -> str:
    return outcome.lower().replace(" ", "-")


def tests_html(summary: RunSummary) -> str:
    """Every test, failures first, with its kind and the failure's cause."""
    if not summary.tests:
        return "<p>no test reported an outcome</p>"
    rows = "".join(
        f"<tr class='{_css(test.outcome)}'><td>{html.escape(test.outcome)}</td>"
        f"<td>{html.escape(test.kind)}</td><td>{html.escape(test.nodeid)}</td>"
        f"<td class='cause'>{html.escape(test.cause)}</td></tr>" for test in summary.tests)
    return ("<table class='tests'><tr><th>outcome</th><th>kind</th><th>test</th>"
            f"<th>cause</th></tr>{rows}</table>")


def gate_html(gate: BehaviourGate | None) -> list[str]:
    """The behaviour gate against the baseline, under the verdict (nothing without a
    baseline): its headline, then each change, the blocking ones first."""
    if gate is None:
        return []
    state = "passed" if gate.passed else "failed"
    return [f"<h2>Against the baseline</h2><p class='gate {state}'>"
            f"{html.escape(gate.headline())}</p>",
            f"<pre>{html.escape(chr(10).join(gate.lines()[1:]))}</pre>"]


def write_report(directory: Path, run: RunInfo | None, steps: list[StepRecord],
                 summary: RunSummary, gate: BehaviourGate | None = None) -> Path:
    """Write ``index.html`` and ``table.csv`` into ``directory``; return the page. The
    page states the run's verdict first (``summary``: pytest's exit status), its
    baseline and behaviour gate (``gate``: None without a baseline), then every test,
    failures first with their causes, then the load steps (``run`` is None when no
    step ran)."""
    directory.mkdir(parents=True, exist_ok=True)
    steps = table_order(steps)  # as the terminal's table: by test, then concurrency
    parts = [*_head(run, summary), *gate_html(gate), "<h2>Tests</h2>", tests_html(summary)]
    main_door = run.door if run is not None else ""
    if steps:
        parts += ["<h2>Load steps</h2>", table_html(steps, main_door)]
    failures = format_failures(steps, main_door)
    if failures:  # what went wrong, without opening the JSON
        parts += ["<h2>Why</h2>", f"<pre>{html.escape(chr(10).join(failures))}</pre>"]
    parts += _plots(steps)
    parts.append("</body></html>")
    page = directory / "index.html"
    # the causes quote servers and client libraries: no credential in the files
    page.write_text(redact_html("\n".join(parts)), encoding="utf-8")
    (directory / "table.csv").write_text(redact_text(table_csv(steps, main_door)),
                                         encoding="utf-8")
    return page


def _plots(steps: list[StepRecord]) -> list[str]:
    """Each scan's plot, then each measured step's timeline and ECDF (and hosts)."""
    parts = []
    scans = plots.scans(steps)
    if scans:
        parts.append("<h2>Scans</h2>")
    for section, scan in scans.items():
        parts.append(f"<h3>{html.escape(section)}</h3>")
        parts.append(_img(plots.scan_png(scan), f"scan {section}"))
    measured = [step for step in steps if step.measured]
    if measured:
        parts.append("<h2>Each step</h2>")
    for step in measured:
        title = step.title
        parts.append(f"<h3>{html.escape(title)}</h3><div class='steps'>")
        parts.append(_img(plots.timeline_png(step), f"timeline {title}"))
        parts.append(_img(plots.ecdf_png(step), f"latency ECDF {title}"))
        if step.hosts:  # a cluster step: rate per client host
            parts.append(_img(plots.hosts_png(step), f"per host {title}"))
        parts.append("</div>")
    return parts
