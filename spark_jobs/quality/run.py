"""A quality run: the suites' checks over the topics as Kafka holds them when the run starts.

A run takes the end offsets of every topic its checks read (``spark_jobs.topics.snapshots``) and reads the
topics from Kafka up to them: it answers for the topics as they are, never for an older copy, and
says which offsets it checked. Each check computes its findings with Spark and Great Expectations
validates them (:mod:`spark_jobs.quality.gx`). A check over a topic that holds no records fails and
says so: nothing was checked. Results go to ``summary.json``, a one-page ``summary.html``, every
run's own page, the ``quality_runs`` Delta table (one row per expectation, with its typed findings)
and the pipeline's report page (:mod:`spark_jobs.quality.pages`). One run at a time per lake.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from spark_jobs.config import PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.formats import Formats
from spark_jobs.layout import ReportFolder
from spark_jobs.quality.findings import as_row, offending
from spark_jobs.quality.gx import GreatExpectations, outcome, project_folder, unexpected_rows
from spark_jobs.quality.pages import docs_href, render_summary, write_report
from spark_jobs.quality.results import ExpectationResult, QualityReport
from spark_jobs.quality.suites import CHECKS, Check, Suite, load_suite
from spark_jobs.runtime import lineage
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import connect
from spark_jobs.seams.lineage import Run
from spark_jobs.system_tables import QUALITY_RUNS, QUALITY_RUNS_SCHEMA, ensure_quality_runs
from spark_jobs.topics.snapshots import Snapshot, SnapshotReader, offsets_text, take

DESCRIPTION_LIMIT = 20  # offending keys spelled out in the Data Docs description
SAMPLE = 50  # findings kept per expectation in quality_runs (with the total)


def _plain(total: int, items: list[str], what: str) -> str:
    if not total:
        return f"PASSED: no {what}."
    listed = "; ".join(items[:DESCRIPTION_LIMIT])
    more = f"; and {total - DESCRIPTION_LIMIT} more" if total > DESCRIPTION_LIMIT else ""
    return f"FAILED: {total} {_singular(what) if total == 1 else what}: {listed}{more}."


def _singular(what: str) -> str:
    """``foreign keys missing in m`` -> ``foreign key missing in m``: the first plural word."""
    words = what.split(" ")
    for i, word in enumerate(words):
        if word.endswith("s") and len(word) > 2:
            words[i] = word[:-1]
            break
    return " ".join(words)


def run_suites(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    suite_names: list[str] | None = None,
    report_dir: Path | None = None,
    log=print,
) -> QualityReport:
    names = suite_names or list(config.quality.suites)
    if not names:
        raise UserError(f"{config.source} declares no quality suites (quality.suites)")
    unknown = [n for n in names if n not in config.quality.suites]
    if unknown:
        raise UserError(
            f"unknown suite(s) {', '.join(unknown)} (declared: {', '.join(config.quality.suites) or 'none'})"
        )
    suites = [load_suite(config.quality.suites[n], config) for n in names]
    # one quality run at a time per lake: runs share the Great Expectations project
    with (
        lake.lock("quality", log),
        lineage.job_run(config, "quality", list, lambda: [lineage.table(lake, QUALITY_RUNS)]) as run,
    ):
        return _run_suites(spark, lake, config, suites, report_dir, log, run)


def _run_suites(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    suites: list[Suite],
    report_dir: Path | None,
    log,
    run: Run | None = None,
) -> QualityReport:
    folder = ReportFolder(report_dir.absolute()) if report_dir else lake.layout.report_folder
    folder.path.mkdir(parents=True, exist_ok=True)
    cluster = connect(config, lake.root)
    read = list(dict.fromkeys(t for suite in suites for t in suite.topics(config)))
    snapshot = take(cluster, [config.topic(t) for t in read])
    log(f"reading {snapshot.covers()} from Kafka at {cluster.bootstrap_servers}")
    formats = Formats(config, lake.root, cluster.topic)
    topics = SnapshotReader(spark, cluster, {t: config.topic(t) for t in read}, snapshot, formats)
    log("loading Great Expectations ...")
    run_id = str(uuid.uuid4())
    run_time = datetime.now(UTC)
    results: list[ExpectationResult] = []
    with project_folder(folder.path, lake.layout.staging / run_id) as project:
        gxr = GreatExpectations(project)
        try:
            for suite in suites:
                for check in suite.checks:
                    log(f"checking {suite.name} / {check.name} ...")
                    results += _run_check(spark, topics, config, gxr, suite, check)
        finally:
            topics.close()
        docs = gxr.docs_index()
    success = all(r.success for r in results)
    shown = docs if project == folder.path or not docs else str(folder.data_docs_index)
    report = QualityReport(run_id, run_time.isoformat(), config.name, success, results, shown, None)
    report.offsets_at = snapshot.taken_at.isoformat(timespec="seconds")
    report.offsets = {t: list(snapshot.ends[t]) for t in read}
    # every run keeps its own page (runs/<time>-<id>.html); summary.html/.json are the latest run
    page = folder.run_page(run_time, run_id)
    page.parent.mkdir(exist_ok=True)
    report.summary_html = str(page)
    for target in (page, folder.summary):
        target.write_text(render_summary(report, docs_href(docs, target, folder)), encoding="utf-8")
    as_json = json.dumps(report.as_dict(), indent=2)
    for target in (page.with_suffix(".json"), folder.summary_json):
        target.write_text(as_json, encoding="utf-8")
    _record(spark, lake, report, suites, snapshot)
    if run is not None:  # the lineage of the run: the topics it checked, each with its checks' verdicts
        run.inputs = [
            replace(
                lineage.topic(cluster, config, t, formats),
                assertions=tuple(
                    (f"{r.check}: {r.expectation}", r.success) for r in results if t in r.offsets
                ),
            )
            for t in read
        ]
    pipeline_page = write_report(lake, config, docs_href(docs, folder.pipeline_page(config.name), folder))
    log(f"report: {pipeline_page}")
    return report


def _run_check(
    spark, topics: SnapshotReader, config, gxr: GreatExpectations, suite: Suite, check: Check
) -> list[ExpectationResult]:
    asset = f"{suite.name}.{check.name}".replace(":", "_").replace(">", "").replace("+", "_")
    read = check.topics(config)
    offsets = {t: list(topics.snapshot.ends[t]) for t in read}
    empty = [t for t in read if topics.count(t) == 0]
    if empty:  # nothing to check: say so, never pass on it
        covers = "; ".join(offsets_text(t, offsets[t]) for t in empty)
        description = (
            f"NO DATA: {', '.join(empty)} hold(s) no records ({covers}); nothing was checked. Produce or "
            "backfill the topic first."
        )
        return [
            ExpectationResult(
                suite.name, check.name, description, description, False, "no records", 0, [], offsets
            )
        ]
    out: list[ExpectationResult] = []

    def finish(expectation: str, df: DataFrame, describe, what: str, extra: list | None = None, name=asset):
        df = df.persist()  # listed, counted and validated several times: compute the findings once
        try:
            total, found = offending(df, describe)
            description = f"{expectation} {_plain(total, [f.text for f in found], what)}"
            results = gxr.validate(name, df, [unexpected_rows("*", description), *(extra or [])])
        finally:
            df.unpersist()
        ok, observed = outcome(results)
        out.append(
            ExpectationResult(
                suite.name, check.name, expectation, description, ok, observed, total, found, offsets
            )
        )

    CHECKS[check.type].run(finish, asset, spark, topics, config, check.params, gxr)
    return out


def _record(
    spark: SparkSession, lake: Lake, report: QualityReport, suites: list[Suite], snapshot: Snapshot
) -> None:
    ensure_quality_runs(lake)
    versions = {s.name: s.version for s in suites}
    when = datetime.fromisoformat(report.run_time)
    rows = [
        {
            "run_id": report.run_id,
            "run_time": when,
            "pipeline": report.pipeline,
            "suite": r.suite,
            "suite_version": versions[r.suite],
            "check": r.check,
            "expectation": r.expectation,
            "success": r.success,
            "observed_value": r.observed_value,
            "offending_total": r.offending_total,
            "offending_sample": r.offending[:SAMPLE],
            "findings": [as_row(f) for f in r.findings[:SAMPLE]],
            "topic_offsets": list(r.offsets.items()),
            "offsets_at": snapshot.taken_at,
        }
        for r in report.results
    ]
    # from the driver, one run's rows are one data file: they read back in the suite's order
    lake.append(QUALITY_RUNS, pa.Table.from_pylist(rows, schema=QUALITY_RUNS_SCHEMA))
