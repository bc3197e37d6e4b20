"""The report without Allure: one self-contained HTML page (``--storage-report DIR``)
with the seeds-style table, every scan's plot and every step's timeline and latency
ECDF (PNG inlined), plus the table as CSV. Also the per-step table snippets that the
Allure attachments reuse."""

from __future__ import annotations

import base64
import csv
import html
import io
from pathlib import Path

from ..records import RunInfo, StepRecord
from . import plots
from .table import format_failures, saturation_note, table_rows

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #eee; }
td:first-child, td:last-child { text-align: left; }
tr.fail td:last-child, tr.error td:last-child { color: #b00; font-weight: bold; }
tr.pass td:last-child { color: #070; }
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
    """The table as CSV, header first (with the client CPU column)."""
    columns, per_step = table_rows(steps, main_door, client_column=True)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(columns)
    for rows in per_step:
        writer.writerows(rows)
    return buffer.getvalue()


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _head(run: RunInfo) -> list[str]:
    system, version = html.escape(run.system), html.escape(run.version)
    return [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>storagescale: {system} {version}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{system} {version}</h1><p>endpoint {html.escape(run.endpoint)}<br>thresholds "
        f"{html.escape(run.thresholds_file)} ({html.escape(run.thresholds_reason)})</p>",
    ]


def write_report(directory: Path, run: RunInfo, steps: list[StepRecord]) -> Path:
    """Write ``index.html`` and ``table.csv`` into ``directory``; return the page."""
    directory.mkdir(parents=True, exist_ok=True)
    parts = [*_head(run), "<h2>Steps</h2>", table_html(steps, run.door)]
    failures = format_failures(steps, run.door)
    if failures:  # what went wrong, without opening the JSON
        parts += ["<h2>Why</h2>", f"<pre>{html.escape(chr(10).join(failures))}</pre>"]
    parts.append("<h2>Scans</h2>")
    for section, scan in plots.scans(steps).items():
        parts.append(f"<h3>{html.escape(section)}</h3>")
        parts.append(_img(plots.scan_png(scan), f"scan {section}"))
    parts.append("<h2>Each step</h2>")
    for step in steps:
        if not step.measured:
            continue
        title = step.title
        parts.append(f"<h3>{html.escape(title)}</h3><div class='steps'>")
        parts.append(_img(plots.timeline_png(step), f"timeline {title}"))
        parts.append(_img(plots.ecdf_png(step), f"latency ECDF {title}"))
        if step.hosts:  # a cluster step: rate per client host
            parts.append(_img(plots.hosts_png(step), f"per host {title}"))
        parts.append("</div>")
    parts.append("</body></html>")
    page = directory / "index.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    (directory / "table.csv").write_text(table_csv(steps, run.door), encoding="utf-8")
    return page
