"""The data-quality report a person opens when a run fails: one HTML page per pipeline.

``<root>/reports/quality/<pipeline>.html`` shows the latest run of each suite, the keys missing in a
lookup (with where they are referenced), the misplaced keys with the partition they are in and the
one their partitioner gives, the quarantined records of the pipeline's backfills and joins, and a
small chart of failed expectations per run over time from ``quality_runs``. It links each run's own
page and Great Expectations Data Docs for the full validation results. ``index.html`` beside it lists
the pipelines. Written after every quality run and by ``lake report``; it reads the Delta tables
through Spark (delta-spark), and holds no script: what it says is in the HTML itself. The missing
and misplaced keys come from the typed findings ``quality_runs`` keeps (:mod:`.findings`).

Each run also has its own page (``runs/<time>-<id>.html``, and ``summary.html`` for the latest): each
expectation, passed or failed, with its findings in words (:func:`render_summary`).
"""

from __future__ import annotations

import html
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_jobs.config import PipelineConfig
from spark_jobs.layout import ReportFolder
from spark_jobs.quality.results import QualityReport
from spark_jobs.seams.delta import Lake
from spark_jobs.system_tables import QUALITY_RUNS, QUARANTINE
from spark_jobs.topics.diagnose import Explainer
from spark_jobs.topics.snapshots import offsets_text

CHART_RUNS = 30  # runs shown in the chart
QUARANTINE_ROWS = 100  # quarantined records listed (with the total)


def pipeline_jobs(config: PipelineConfig) -> set[str]:
    """The quarantine's ``job`` values that belong to this pipeline."""
    return {f"backfill:{name}" for name in config.lookups} | {spec.job for spec in config.joins.values()}


def _rows(lake: Lake, table: str) -> list[dict]:
    return lake.read_arrow(table).to_pylist() if lake.exists(table) else []


def latest_per_suite(runs: list[dict]) -> dict[str, list[dict]]:
    """Each suite's expectations from its newest run."""
    newest: dict[str, tuple[datetime, str]] = {}
    for r in runs:
        seen = newest.get(r["suite"])
        if seen is None or (r["run_time"], r["run_id"]) > seen:
            newest[r["suite"]] = (r["run_time"], r["run_id"])
    return {
        suite: [r for r in runs if r["suite"] == suite and r["run_id"] == run_id]
        for suite, (_, run_id) in sorted(newest.items())
    }


def failures_per_run(runs: list[dict]) -> list[tuple[datetime, str, int, int]]:
    """(run time, run id, failed expectations, expectations) per run, oldest first."""
    per: dict[str, list] = {}
    for r in runs:
        entry = per.setdefault(r["run_id"], [r["run_time"], r["run_id"], 0, 0])
        entry[2] += 0 if r["success"] else 1
        entry[3] += 1
    return [tuple(v) for v in sorted(per.values())]  # type: ignore[misc]


def write_report(lake: Lake, config: PipelineConfig, data_docs: str | None = None) -> Path:
    """Write the pipeline's report page (and the index of pipelines); returns the page's path."""
    folder = lake.layout.report_folder
    path = folder.pipeline_page(config.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    every_run = _rows(lake, QUALITY_RUNS)  # read once: this page's runs and the index's
    runs = [r for r in every_run if r["pipeline"] == config.name]
    jobs = pipeline_jobs(config)
    quarantined = [q for q in _rows(lake, QUARANTINE) if q["job"] in jobs]
    quarantined.sort(key=lambda q: (q["run_time"], q["source"] or "", q["line"] or 0), reverse=True)
    docs = data_docs or (folder.href(folder.data_docs_index) if folder.data_docs_index.is_file() else None)
    run_pages = {r["run_id"]: folder.run_page(r["run_time"], r["run_id"]) for r in runs}
    pages = {run_id: folder.href(page) for run_id, page in run_pages.items() if page.is_file()}
    page = render(config.name, runs, quarantined, docs, datetime.now(UTC), pages, Explainer(config))
    path.write_text(page, encoding="utf-8")
    _write_index(folder, every_run)
    return path


def _write_index(folder: ReportFolder, runs: list[dict]) -> None:
    """``index.html``: a section per pipeline with a report page (its status in the latest run of
    each suite, the failing checks with their first findings, a link to the page), from ``runs``,
    every pipeline's rows of ``quality_runs``."""
    pages = folder.pipeline_pages()
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Data quality</title>{STYLE}</head>",
        "<body><h1>Data quality reports</h1>",
        f"<p class='muted'>{len(pages)} pipeline(s). Each section is the latest run of the pipeline's "
        "suites; its page has the missing and misplaced keys, the quarantine and the history.</p>",
    ]
    for page in pages:
        parts += _pipeline_section(page.stem, [r for r in runs if r["pipeline"] == page.stem])
    parts.append("<p><a href='summary.html'>The latest quality run</a></p></body></html>")
    folder.index.write_text("\n".join(parts), encoding="utf-8")


INDEX_FINDINGS = 3  # findings shown per failing check on the index


def _pipeline_section(pipeline: str, runs: list[dict]) -> list[str]:
    latest = [r for rows in latest_per_suite(runs).values() for r in rows]
    out = [
        f"<section class='pipeline' id='pipeline-{_e(pipeline)}'>",
        f"<h2><a href='{_e(pipeline)}.html'>{_e(pipeline)}</a></h2>",
        _status(runs, latest),
    ]
    if latest:
        newest = max(r["run_time"] for r in latest)
        out.append(f"<p class='muted'>Latest run: {_when(newest)}.</p>")
    failing = [r for r in latest if not r["success"]]
    if failing:
        out.append("<ul class='failing'>")
        for r in failing:
            items = "; ".join(_e(item) for item in r["offending_sample"][:INDEX_FINDINGS])
            more = r["offending_total"] - min(len(r["offending_sample"]), INDEX_FINDINGS)
            tail = f" (and {more} more)" if more > 0 else ""
            out.append(f"<li><strong>{_e(r['check'])}</strong>: {items}{tail}</li>")
        out.append("</ul>")
    out.append("</section>")
    return out


def _status(runs: list[dict], latest: list[dict], attrs: str = "") -> str:
    """The one status line of a pipeline: no run yet, failing (how many), or passing."""
    failing = [r for r in latest if not r["success"]]
    if not runs:
        return f"<p {attrs}class='status'><strong>No quality run yet</strong> for this pipeline.</p>"
    if failing:
        return (
            f"<p {attrs}class='status bad'><strong>FAILING: {len(failing)} of {len(latest)} "
            "expectations failed in the latest run of their suite.</strong></p>"
        )
    return (
        f"<p {attrs}class='status ok'><strong>PASSING: all {len(latest)} expectations passed in "
        "the latest run of their suite.</strong></p>"
    )


PASSED = "<span class='ok'>PASSED</span>"
FAILED = "<span class='bad'>FAILED</span>"
STYLE = (
    "<style>body{font-family:sans-serif;max-width:64em;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:.3em .6em;"
    "text-align:left;vertical-align:top}th{background:#f3f3f3}.ok{color:#176f2c}.bad{color:#b00020}"
    "code{background:#f3f3f3}.muted{color:#666}svg text{font-size:11px;fill:#333}</style>"
)


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _when(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render(
    pipeline: str,
    runs: list[dict],
    quarantined: list[dict],
    data_docs: str | None,
    generated: datetime,
    pages: dict[str, str] | None = None,
    explainer: Explainer | None = None,
) -> str:
    pages = pages or {}
    latest = latest_per_suite(runs)
    latest_rows = [r for rows in latest.values() for r in rows]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Data quality report: {_e(pipeline)}</title>{STYLE}</head><body>",
        f"<h1>Data quality report: pipeline {_e(pipeline)}</h1>",
        f"<p class='muted'>Generated {_when(generated)} from the lake's quality_runs and quarantine "
        "tables.</p>",
    ]
    parts.append(_status(runs, latest_rows, "id='status' "))
    if data_docs:
        parts.append(
            f"<p>Full validation results: <a id='data-docs' href='{_e(data_docs)}'>"
            "Great Expectations Data Docs</a></p>"
        )

    parts.append("<h2 id='latest'>Latest run of each suite</h2>")
    if latest:
        parts.append(
            "<table><tr><th>Suite</th><th>Run</th><th>Check</th><th>Result</th><th>Offending</th>"
            "<th>Read from Kafka up to</th></tr>"
        )
        for suite, rows in latest.items():
            first = rows[0]
            run = _when(first["run_time"])
            page = pages.get(first["run_id"])
            run = f"<a href='{_e(page)}'>{run}</a>" if page else run
            for i, r in enumerate(rows):
                result = (
                    "<span class='ok'>PASSED</span>" if r["success"] else "<span class='bad'>FAILED</span>"
                )
                head = (
                    f"<td rowspan='{len(rows)}'>{_e(suite)} (v{_e(r['suite_version'])})</td>"
                    f"<td rowspan='{len(rows)}'>{run}</td>"
                    if i == 0
                    else ""
                )
                parts.append(
                    f"<tr>{head}<td>{_e(r['check'])}<br>"
                    f"<span class='muted'>{_e(r['expectation'])}</span></td>"
                    f"<td>{result}</td><td>{_e(r['offending_total'])}</td><td>{_offsets(r)}</td></tr>"
                )
        parts.append("</table>")
    else:
        parts.append("<p>No suite has run.</p>")

    parts += _missing_section(latest_rows, explainer)
    parts += _misplaced_section(latest_rows, explainer)
    parts += _quarantine_section(quarantined)
    parts += _chart_section(failures_per_run(runs))
    parts.append("</body></html>")
    return "\n".join(parts)


def _offsets(row: dict) -> str:
    """The topics a check read and each one's end offset per partition, as of the run's snapshot."""
    read = row.get("topic_offsets")
    if not read:
        return "<span class='muted'>not recorded</span>"
    at = f"<br><span class='muted'>taken {_when(row['offsets_at'])}</span>" if row.get("offsets_at") else ""
    items = "<br>".join(f"<code>{_e(offsets_text(topic, ends))}</code>" for topic, ends in read)
    return items + at


def _findings(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(expectation row, finding) of each typed finding the rows keep."""
    return [(r, f) for r in rows for f in r.get("findings") or []]


def _untyped(rows: list[dict]) -> list[tuple[dict, str]]:
    """(expectation row, finding in words) of rows from before ``quality_runs`` kept typed findings."""
    return [(r, item) for r in rows if r.get("findings") is None for item in r["offending_sample"]]


def _why(text: str | None) -> str:
    return f"<td class='why'>{_e(text)}</td>" if text else "<td class='muted'>-</td>"


def _missing_section(rows: list[dict], explainer: Explainer | None) -> list[str]:
    out = ["<h2 id='missing'>Missing keys</h2>"]
    checks = [r for r in rows if r["check"].startswith("completeness:")]
    found = _findings(checks)
    older = _untyped(checks)
    if not found and not older:
        out.append("<p>None: every referenced key exists in its lookup.</p>")
        return out
    total = sum(r["offending_total"] for r in checks)
    listed = len(found) + len(older)
    out.append(f"<p>{total} key(s) referenced but missing in their lookup (first {listed} listed).</p>")
    out.append(
        "<table><tr><th>Key</th><th>Check</th><th>Where it is referenced</th><th>Why (lake explain)</th></tr>"
    )
    for r, f in found:
        why = _why(explainer.missing(r, f) if explainer else None)
        out.append(
            f"<tr><td><code>{_e(f['key'])}</code></td><td>{_e(r['check'])}</td><td>{_e(f['problem'])}</td>"
            f"{why}</tr>"
        )
    out.append("</table>")
    out += [f"<p>{_e(r['check'])}: {_e(item)}</p>" for r, item in older]
    return out


def _misplaced_section(rows: list[dict], explainer: Explainer | None) -> list[str]:
    out = ["<h2 id='misplaced'>Misplaced keys</h2>"]
    placement = [r for r in rows if r["check"].startswith("co_partitioning:")]
    found = [(f, p) for _, f in _findings(placement) for p in f["placements"] or []]
    # partition-count mismatches, keys in different partitions only, and rows from before typed findings
    other = [(r, f["text"]) for r, f in _findings(placement) if not f["placements"]] + _untyped(placement)
    if not found and not other:
        out.append("<p>None: every key sits in the partition its partitioner gives, in every topic.</p>")
        return out
    if found:
        out.append(
            "<table><tr><th>Key</th><th>Topic</th><th>Is in partition</th><th>Belongs in partition</th>"
            "<th>Partitioner</th><th>Why (lake explain)</th></tr>"
        )
        for f, p in found:
            partitions = ",".join(str(n) for n in p["partitions"])
            why = _why(explainer.misplaced(f, p) if explainer else None)
            out.append(
                f"<tr><td><code>{_e(f['key'])}</code></td><td>{_e(p['topic'])}</td><td>{_e(partitions)}</td>"
                f"<td>{_e(p['expected_partition'])}</td><td>{_e(p['partitioner'])}</td>{why}</tr>"
            )
        out.append("</table>")
    for r, item in other:
        out.append(f"<p>{_e(r['check'])}: {_e(item)}</p>")
    return out


def _quarantine_section(rows: list[dict]) -> list[str]:
    out = ["<h2 id='quarantine'>Quarantined records</h2>"]
    if not rows:
        out.append("<p>None: no input line or record of this pipeline was rejected.</p>")
        return out
    shown = rows[:QUARANTINE_ROWS]
    more = f", newest {len(shown)} listed" if len(rows) > len(shown) else ""
    out.append(f"<p>{len(rows)} record(s) rejected by this pipeline's backfills and joins{more}.</p>")
    out.append(
        "<table><tr><th>When</th><th>Job</th><th>Source : line</th><th>Reason</th><th>Raw bytes</th></tr>"
    )
    for q in shown:
        raw = bytes.fromhex(q["raw_hex"] or "")
        text = repr(raw)[2:-1]
        where = f"{q['source']}:{q['line']}" if q["line"] is not None else q["source"]
        out.append(
            f"<tr><td>{_when(q['run_time'])}</td><td>{_e(q['job'])}</td><td>{_e(where)}</td>"
            f"<td>{_e(q['reason'])}</td><td><code>{_e(text[:200])}</code></td></tr>"
        )
    out.append("</table>")
    return out


def _chart_section(per_run: list[tuple[datetime, str, int, int]]) -> list[str]:
    out = ["<h2 id='failures-over-time'>Failed expectations per run</h2>"]
    if not per_run:
        out.append("<p>No runs yet.</p>")
        return out
    shown = per_run[-CHART_RUNS:]
    width, height, top, bottom, left = 640, 180, 10, 40, 36
    peak = max(max(total for *_, total in shown), 1)
    slot = (width - left) / len(shown)
    bar = max(min(slot * 0.7, 40), 2)
    plot = height - top - bottom
    svg = [
        f"<svg id='failures-chart' role='img' width='{width}' height='{height}' "
        f"aria-label='failed expectations in each of the last {len(shown)} runs'>",
        f"<line x1='{left}' y1='{top + plot}' x2='{width}' y2='{top + plot}' stroke='#999'/>",
        f"<text x='{left - 6}' y='{top + 4}' text-anchor='end'>{peak}</text>",
        f"<text x='{left - 6}' y='{top + plot}' text-anchor='end'>0</text>",
    ]
    for i, (when, _run_id, failed, total) in enumerate(shown):
        x = left + i * slot + (slot - bar) / 2
        h = plot * failed / peak
        colour = "#b00020" if failed else "#176f2c"
        label = f"{_when(when)}: {failed} of {total} failed"
        svg.append(
            f"<rect class='run' data-failed='{failed}' x='{x:.1f}' y='{top + plot - max(h, 2):.1f}' "
            f"width='{bar:.1f}' height='{max(h, 2):.1f}' fill='{colour}'><title>{_e(label)}</title></rect>"
        )
        if len(shown) <= 12 or i in (0, len(shown) - 1):
            svg.append(
                f"<text x='{x + bar / 2:.1f}' y='{height - bottom + 14}' text-anchor='middle'>"
                f"{when.astimezone(UTC).strftime('%m-%d %H:%M')}</text>"
            )
    svg.append("</svg>")
    out.append("".join(svg))
    last = shown[-1]
    out.append(
        f"<p class='muted'>Red bars: runs with failed expectations (height = how many); green: runs that "
        f"passed. Latest run: {last[2]} of {last[3]} failed.</p>"
    )
    return out


# --- a run's own page ----------------------------------------------------------------------------


def docs_href(docs: str | None, page: Any, folder: ReportFolder) -> str | None:
    """The Data Docs link as seen from ``page`` of ``folder``: relative, so it works on disk
    (file://), when the reports are served over http (the Airflow UI's "Data quality" view) and on
    an object store. ``docs``: the site Great Expectations built (in the folder's ``gx/``)."""
    if not docs or not docs.startswith("file://"):
        return docs
    return folder.link(page, folder.data_docs_index)


def render_summary(report: QualityReport, docs_href: str | None = None) -> str:
    """The page a person opens first: each expectation, passed or failed, with the offending keys."""
    status = "All checks passed" if report.success else "Some checks FAILED"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Data quality: {html.escape(report.pipeline)}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        ".ok{color:#176f2c}.bad{color:#b00020}li{margin:.2em 0}code{background:#f3f3f3}</style>",
        "</head><body>",
        f"<h1>Data quality: pipeline {html.escape(report.pipeline)}</h1>",
        f"<p class='{'ok' if report.success else 'bad'}'><strong>{status}</strong> "
        f"(run {html.escape(report.run_id)} at {html.escape(report.run_time)})</p>",
        f"<p>Checked the topics as Kafka held them: <code>{html.escape(report.covers())}</code></p>",
    ]
    docs_href = docs_href or report.data_docs
    if docs_href:
        parts.append(
            f"<p>Full validation results: <a href='{html.escape(docs_href)}'>"
            "Great Expectations Data Docs</a></p>"
        )
    for r in report.results:
        cls = "ok" if r.success else "bad"
        parts.append(
            f"<h2 class='{cls}'>{'PASSED' if r.success else 'FAILED'}: {html.escape(r.expectation)}</h2>"
        )
        parts.append(
            f"<p>Suite <code>{html.escape(r.suite)}</code>, check <code>{html.escape(r.check)}</code></p>"
        )
        if r.offending_total:
            shown = len(r.offending)
            head = f"{r.offending_total} offending" + (
                f" (first {shown} listed)" if shown < r.offending_total else ""
            )
            parts.append(f"<p>{head}:</p><ul>")
            parts += [f"<li>{html.escape(item)}</li>" for item in r.offending]
            parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
