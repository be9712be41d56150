"""What the DAGs' Python tasks do when they run (the DAG files only reference these functions).

None of them starts Spark: Spark work goes through ``spark-submit`` (the SparkSubmitOperator tasks),
and these tasks read what those wrote, decide, and start or stop the detached join jobs. Each Spark
task of a run writes its JSON summary under ``<root>/_airflow/<dag_id>/<run_id>/`` so that the next
task reads that run's result, not another run's.

Failures a person must act on raise ``AirflowFailException`` (no retry: the data will not change by
waiting) with a one-line message; the details are in the task log.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

from spark_jobs.errors import UserError
from spark_jobs.layout import Layout
from spark_jobs.seams.lineage import PARENT_ENV, ROOT_PARENT_ENV
from spark_jobs.seams.storage import append_line

log = logging.getLogger(__name__)

QUALITY_JSON = "quality.json"
BACKFILL_JSON = "backfill.json"


def run_dir_template(root: str) -> str:
    """This DAG run's folder as a Jinja template (for a task's templated arguments)."""
    return str(Layout(root).airflow_run("{{ dag.dag_id }}", "{{ run_id }}"))


def run_dir(root: str, context: dict) -> Any:
    """The folder :func:`run_dir_template` renders to for this task's DAG run."""
    return Layout(root).airflow_run(context["dag"].dag_id, context["run_id"])


def _fail(message: str):
    from airflow.sdk.exceptions import AirflowFailException

    log.error(message)
    return AirflowFailException(message)


def _skip(message: str):
    from airflow.sdk.exceptions import AirflowSkipException

    log.info(message)
    return AirflowSkipException(message)


def _read_json(path: Any, what: str) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(f"{path}: the {what} task wrote no summary (see its log)") from None


def _lake(config_path: str, root: str):
    from spark_jobs.config import load_config
    from spark_jobs.seams.delta import Lake

    return load_config(config_path), Lake(root)


# --- the quality gate -----------------------------------------------------------------------------


def quality_lines(report: dict, root: str) -> list[str]:
    """The suite's plain-words summary, one line per expectation, then where the pages are: on disk,
    and served by Airflow (the lake_reports plugin) at the UI's address."""
    from spark_jobs.orchestration.reports import report_url

    lines = [
        f"{'PASS' if r['success'] else 'FAIL'}  {r['suite']} / {r['check']}: {r['description']}"
        for r in report["results"]
    ]
    lines.append(f"report: {report.get('summary_html')}")
    base = os.environ.get("AIRFLOW__API__BASE_URL") or "http://localhost:8080"
    url = report_url(report.get("summary_html"), root, base)
    if url:
        lines.append(f"report in the browser: {url}")
    pipeline_page = Layout(root).report_folder.pipeline_page(str(report.get("pipeline")))
    pipeline_url = report_url(str(pipeline_page), root, base)
    if pipeline_url:
        lines.append(
            f"the pipeline's report (history, missing and misplaced keys, quarantine): {pipeline_url}"
        )
    if report.get("data_docs"):
        lines.append(f"Data Docs: {report['data_docs']}")
    return lines


def quality_gate(root: str, config_path: str | None = None, **context: Any) -> dict:
    """Pass when every expectation of the run's suites passed; otherwise fail the run with the
    failed checks' plain-words summary, the report's path, and one missing or misplaced key as
    ``lake explain`` explains it."""
    report = _read_json(run_dir(root, context) / QUALITY_JSON, "run_quality_suites")
    for line in quality_lines(report, root):
        log.info(line)
    failed = [r for r in report["results"] if not r["success"]]
    if failed:
        summary = " | ".join(f"{r['check']}: {r['description']}" for r in failed)
        example = _example_key(config_path, failed)
        raise _fail(
            f"quality gate FAILED ({len(failed)} check(s)): {summary} -- report: {report['summary_html']}"
            + (f" -- e.g. {example}" if example else "")
        )
    log.info("quality gate passed: %d check(s), run %s", len(report["results"]), report["run_id"])
    return {"run_id": report["run_id"], "checks": len(report["results"]), "report": report["summary_html"]}


def _example_key(config_path: str | None, failed: list[dict]) -> str | None:
    """The first missing or misplaced key of the failed checks, with its explanation."""
    from spark_jobs.config import load_config
    from spark_jobs.quality.pages import Explainer

    if config_path is None:
        return None
    explainer = Explainer(load_config(config_path))
    for result in failed:
        for finding in result.get("findings") or []:
            if result["check"].startswith("completeness:"):
                why = explainer.missing(result, finding)
            else:
                placements = finding.get("placements") or []
                why = explainer.misplaced(finding, placements[0]) if placements else None
            if why:
                return f"{finding['key']}: {why}"
    return None


# --- the continuous joins -------------------------------------------------------------------------


def connection_master(conn_id: str) -> str:
    """The Spark master an Airflow connection names, read the way SparkSubmitHook reads it."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
        master = conn.host
    else:
        master = f"{conn.conn_type}://{conn.host or ''}"
    return f"{master}:{conn.port}" if conn.port else master


def _chosen_joins(config, context: dict) -> list[str]:
    chosen = (context.get("params") or {}).get("join", "all")
    return list(config.joins) if chosen in (None, "all") else [chosen]


def lineage_env(context: Any) -> dict[str, str]:
    """The OpenLineage parent of the jobs a task starts (``spark_jobs.seams.lineage``): the task's run,
    and its DAG run as the root, as Airflow's OpenLineage provider names them."""
    try:
        from airflow.providers.openlineage.plugins.macros import lineage_parent_id, lineage_root_parent_id

        ti = context["ti"]
        return {PARENT_ENV: lineage_parent_id(ti), ROOT_PARENT_ENV: lineage_root_parent_id(ti)}
    except Exception as exc:  # noqa: BLE001 - lineage is a side channel: the task goes on
        log.warning("no OpenLineage parent for the jobs this task starts: %s", exc)
        return {}


def ensure_joins_running(config_path: str, root: str, conn_id: str, trigger: float, **context: Any) -> dict:
    """Start the pipeline's continuous ingest (the lake's bronze mirror), then each join's continuous
    job (with its ``table_every`` setting), unless they run (then they are left alone). The jobs run
    detached from this worker, registered with pid and heartbeat under ``<root>/_jobs``. Each job is
    logged as it registers; one that does not start fails the task (after the others are logged), and
    the task's retry leaves the ones that did start alone."""
    from spark_jobs.joins.supervise import launch_ingest, launch_join

    config, lake = _lake(config_path, root)
    if not config.joins:
        log.info("pipeline %s declares no joins", config.name)
        return {}
    env = {"LAKE_SPARK_MASTER": connection_master(conn_id), **lineage_env(context)}
    joins = _chosen_joins(config, context)
    launches = [launch_ingest(lake, config_path, config, env=env)]
    launches += [launch_join(lake, config_path, config.join(name), trigger, env=env) for name in joins]
    outcome, failed = {}, []
    for name, launch in zip(["ingest", *joins], launches, strict=True):
        try:
            state = launch.wait()
        except UserError as exc:
            log.error("%s", exc)
            failed.append(str(exc))
            continue
        verb = "started" if state.changed else "already running, left alone"
        log.info(
            "%s: %s (pid %s, master %s); log %s",
            state.label,
            verb,
            state.pid,
            env["LAKE_SPARK_MASTER"],
            state.log,
        )
        outcome[name] = {"pid": state.pid, "started": state.changed}
    if failed:
        raise UserError(f"{len(failed)} of {len(launches)} job(s) did not start: " + "; ".join(failed))
    return outcome


def joins_caught_up(config_path: str, root: str, **context: Any) -> bool:
    """True when every join of the pipeline has processed all of its input topics' records (the
    sensor's poke)."""
    from spark_jobs.joins.runner import status

    config, lake = _lake(config_path, root)
    rows = status(lake, config)
    if rows and rows[0]["kafka_error"]:
        log.info("cannot ask Kafka: %s", rows[0]["kafka_error"])
        return False
    behind = {row["join"]: {side: n for side, n in row["records_behind"].items() if n} for row in rows}
    behind = {join: sides for join, sides in behind.items() if sides}
    if behind:
        log.info("still behind (records per input): %s", behind)
    return not behind


def stop_joins(config_path: str, root: str, **context: Any) -> dict:
    """Stop the joins' jobs after their current micro-batch (maintenance); stopping all of them
    stops the pipeline's continuous ingest too."""
    from spark_jobs.joins.supervise import stop_ingest, stop_join

    config, lake = _lake(config_path, root)
    states = {name: stop_join(lake, config.join(name)) for name in _chosen_joins(config, context)}
    if (context.get("params") or {}).get("join", "all") in (None, "all"):
        states["ingest"] = stop_ingest(lake, config)
    for state in states.values():
        log.info("%s: %s", state.label, f"stopped (pid {state.pid})" if state.changed else "was not running")
    return {name: {"pid": state.pid, "stopped": state.changed} for name, state in states.items()}


def check_health(config_path: str, root: str, max_records_behind: int, **context: Any) -> str:
    """Fail (so the failure callbacks alert) when a join is down, stuck, or too far behind."""
    from spark_jobs.joins.supervise import health

    config, lake = _lake(config_path, root)
    joins = _chosen_joins(config, context)
    problems = health(lake, config, max_records_behind, joins)
    if problems:
        raise _fail(f"{len(problems)} problem(s): " + "; ".join(problems))
    message = f"healthy: {', '.join(joins) or 'no joins'} (limit {max_records_behind} records behind)"
    log.info(message)
    return message


def choose_action(**context: Any) -> str:
    """The streams DAG's branch: the task named by the ``action`` param (``health`` when scheduled)."""
    return {"start": "start_joins", "stop": "stop_joins"}.get(context["params"]["action"], "check_health")


# --- the manual backfill --------------------------------------------------------------------------


def backfill_args(config_path: str, root: str, **context: Any) -> list[str]:
    """Check the trigger's params and turn them into the ``lake backfill`` arguments."""
    from spark_jobs.config import load_config
    from spark_jobs.lookups.dumps import dump_source

    params = context["params"]
    config = load_config(config_path)
    try:
        config.lookup(params["lookup"])
        source = params.get("source") or None
        if source and not (source.startswith("/") or "://" in source):
            raise UserError(f"source must be an absolute path, a file:// or an s3a:// URI, got {source!r}")
        source = dump_source(source) if source else None
    except UserError as err:
        raise _fail(f"params: {err}") from None
    args = ["backfill", params["lookup"], "--root", root, "--config", config_path]
    args += ["--summary-json", str(run_dir(root, context) / BACKFILL_JSON)]
    if source:
        args += ["--from", source]
    if params.get("partitioner") not in (None, "", "default"):
        args += ["--partitioner", params["partitioner"]]
    if params.get("dry_run"):
        args.append("--dry-run")
    args += ["--max-rejects", str(int(params.get("max_rejects") or 0))]
    log.info("lake %s", " ".join(args))
    return args


def report_backfill(root: str, **context: Any) -> dict:
    """Say what the backfill did and what the suites found; fail when a suite failed."""
    summary = _read_json(run_dir(root, context) / BACKFILL_JSON, "backfill")
    verb = "would write" if summary["dry_run"] else "wrote"
    log.info(
        "backfill %s from %s (%s): %d new, %d changed, %d unchanged, %d rejected; %s %d records to %s%s",
        summary["lookup"],
        summary["source"],
        summary["partitioner"],
        summary["new"],
        summary["changed"],
        summary["unchanged"],
        summary["rejected"],
        verb,
        summary["written"],
        summary["topic"],
        " [dry run: nothing written]" if summary["dry_run"] else "",
    )
    gate = quality_gate(root, **context)
    keys = ("lookup", "source", "dry_run", "new", "changed", "unchanged", "rejected", "written")
    return {**{k: summary[k] for k in keys}, "quality": gate}


def publish_lookup(root: str, lookup: str, **context: Any) -> str:
    """Succeed (so Airflow records an event on this task's lookup Asset) only when this run's
    backfill changed that lookup: wrote to its topic, or brought its table up to records a crashed
    run had written; skip otherwise."""
    params = context["params"]
    if params["lookup"] != lookup:
        raise _skip(f"this run backfilled {params['lookup']}, not {lookup}")
    summary = _read_json(run_dir(root, context) / BACKFILL_JSON, "backfill")
    if summary["dry_run"] or not (summary["written"] or summary["lookup_changed"]):
        raise _skip(f"lookup {lookup} unchanged ({'dry run' if summary['dry_run'] else 'nothing written'})")
    if not summary["written"]:
        return f"lookup {lookup}: its table caught up with records already on the topic"
    return f"lookup {lookup}: {summary['written']} records written"


# --- alerts ---------------------------------------------------------------------------------------


def alert_on_failure(root: str, context: dict) -> None:
    """The DAGs' ``on_failure_callback``: one ERROR line in the task log and one JSON line in
    ``<root>/_airflow/alerts.jsonl`` (hook a notifier in here: e-mail, Slack, a pager)."""
    ti = context.get("task_instance") or context.get("ti")
    error = context.get("exception")
    alert = {
        "at": datetime.now(UTC).isoformat(),
        "dag_id": getattr(ti, "dag_id", None),
        "task_id": getattr(ti, "task_id", None),
        "run_id": context.get("run_id"),
        "try_number": getattr(ti, "try_number", None),
        "error": str(error).splitlines()[0] if error else None,
    }
    log.error("ALERT %s.%s failed: %s", alert["dag_id"], alert["task_id"], alert["error"])
    append_line(Layout(root).alerts, json.dumps(alert))
