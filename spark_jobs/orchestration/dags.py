"""The DAG factory: four DAGs per pipeline file, built from its config (docs/airflow.md).

- ``<pipeline>_pipeline``: backfill every lookup -> run the quality suites -> the quality gate ->
  make sure the continuous joins run. Scheduled (``airflow.schedule``).
- ``<pipeline>_manual_backfill``: a person's backfill of one lookup, with a form of typed params;
  then the suites and a summary; an Asset event for the lookup it changed.
- ``<pipeline>_quality``: the suites on a schedule and whenever a lookup Asset changes.
- ``<pipeline>_streams``: health check (scheduled), start and stop of the continuous joins.

Building them is cheap and has no side effects: the pipeline YAML is read, nothing else (no Spark, no
lake access, no Great Expectations). Spark work is ``spark-submit`` of ``lake`` commands through
the SparkSubmitOperator; the Python tasks are in :mod:`spark_jobs.orchestration.tasks`.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime, timedelta
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.python import BranchPythonOperator, PythonOperator
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import DAG, Asset, AssetAny, AssetOrTimeSchedule, CronTriggerTimetable, Param
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from spark_jobs.config import PARTITIONERS, PipelineConfig, load_config
from spark_jobs.errors import UserError
from spark_jobs.layout import QUALITY_RUNS, QUARANTINE, lookup_table
from spark_jobs.orchestration import tasks
from spark_jobs.orchestration.environment import unique_pipelines
from spark_jobs.seams.session import submit_conf
from spark_jobs.seams.storage import Root, resolve_root

APPLICATION = str(Path(__file__).resolve().parents[1] / "_submit" / "lake_app.py")
START_DATE = datetime(2026, 1, 1)
JOIN_TRIGGER_SECONDS = 5.0
JOINS_CATCH_UP_TIMEOUT = 30 * 60


def lookup_asset(config: PipelineConfig, root: str, lookup: str) -> Asset:
    """The Asset of a lookup's Delta table (what data-aware DAGs wait for)."""
    where = root if "://" in root else f"file://{root}"
    return Asset(name=f"{config.name}.lookup_{lookup}", uri=f"{where}/tables/lookup_{lookup}", group="lake")


class LakeSubmitOperator(SparkSubmitOperator):
    """``spark-submit`` of a ``lake`` command. A user error of ``lake`` (exit 2: bad input, unknown
    name, a dump with too many bad lines) fails the task at once with its one-line message: retrying
    would not fix it. Other failures (Spark, the machine) are retried with backoff."""

    def execute(self, context):
        self.env_vars = {**(self.env_vars or {}), **tasks.lineage_env(context)}  # the job's lineage parent
        try:
            return super().execute(context)
        except AirflowException as err:
            code = re.search(r"Error code is: (\d+)", str(err))
            if code and int(code.group(1)) == UserError.exit_code:
                lines = [line for line in str(err).splitlines() if line.startswith("lake: error:")]
                raise AirflowFailException(lines[-1] if lines else "lake: user error (see the log)") from None
            raise


class _Builder:
    """Shared pieces of one pipeline's DAGs."""

    def __init__(self, config_path: Path, root: Root | Path):
        self.config = load_config(config_path)
        self.config_path = str(config_path)
        self.root = str(root)
        self.af = self.config.airflow
        self.tags = ["lakehouse", f"pipeline:{self.config.name}"]

    def default_args(self) -> dict:
        return {
            "owner": self.af.owner,
            "retries": self.af.retries,
            "retry_delay": timedelta(seconds=self.af.retry_delay_seconds),
            "retry_exponential_backoff": 2.0,
            "max_retry_delay": timedelta(minutes=30),
            "on_failure_callback": functools.partial(tasks.alert_on_failure, self.root),
        }

    def dag(self, suffix: str, schedule, doc: str, kind: str, **kwargs) -> DAG:
        return DAG(
            dag_id=f"{self.config.name}_{suffix}",
            description=f"{self.config.name}: {doc.splitlines()[0]}",
            doc_md=doc,
            schedule=schedule,
            start_date=START_DATE,
            catchup=False,
            max_active_runs=1,
            default_args=self.default_args(),
            tags=[*self.tags, kind],
            **kwargs,
        )

    def spark(self, task_id: str, args, doc: str, **kwargs) -> SparkSubmitOperator:
        """A ``lake`` command submitted to the pipeline's Spark connection (retried with backoff)."""
        return LakeSubmitOperator(
            task_id=task_id,
            application=APPLICATION,
            application_args=args,
            conn_id=self.af.spark_conn_id,
            conf=submit_conf(resolve_root(self.root)),  # with an object store's settings
            name=f"{self.config.name}-{task_id}",
            spark_binary="spark-submit",
            doc_md=doc,
            **kwargs,
        )

    def common(self) -> list[str]:
        return ["--root", self.root, "--config", self.config_path]

    def python(self, task_id: str, func, doc: str, retries: int = 0, **kwargs) -> PythonOperator:
        """A short task in the worker (no Spark). Decisions are not retried: waiting changes nothing."""
        return PythonOperator(task_id=task_id, python_callable=func, doc_md=doc, retries=retries, **kwargs)

    def run_suites(self) -> SparkSubmitOperator:
        summary = tasks.run_dir_template(self.root) + f"/{tasks.QUALITY_JSON}"
        return self.spark(
            "run_quality_suites",
            ["check", *self.common(), "--exit-zero", "--summary-json", summary],
            "Runs every quality suite of the pipeline (completeness of the lookups, co-partitioning "
            "of joined topics, key format) with Great Expectations. Records the run in `quality_runs`, "
            "writes the summary page and the Data Docs under `<root>/reports/quality`. Passing or not "
            "is decided by the next task.",
        )

    def dbt_selection(self) -> list[str]:
        """``--select`` of the dbt models over this pipeline's tables (its lookups and join results)
        and the lake's shared ones (quality runs, quarantine). Models of other pipelines are left to
        their own DAGs, so a lake without them builds cleanly."""
        tables = [lookup_table(name) for name in self.config.lookups] + list(self.config.joins)
        return [
            "--select",
            *[f"source:lake.{t}+" for t in [*tables, QUALITY_RUNS, QUARANTINE]],
        ]

    def gate(self) -> PythonOperator:
        return self.python(
            "quality_gate",
            tasks.quality_gate,
            "**The gate.** Passes only when every expectation passed. On failure the log lists each "
            "check in plain words (e.g. the missing keys and where they are referenced) with the path "
            "of the report page and the Data Docs, and one example key as `lake explain` explains it; "
            "nothing downstream runs.",
            op_kwargs={"root": self.root, "config_path": self.config_path},
        )


def pipeline_dag(b: _Builder) -> DAG:
    config = b.config
    doc = (
        f"Backfill, check, then stream: the main run of pipeline `{config.name}`.\n\n"
        f"{config.description}\n\n"
        "1. **backfill_&lt;lookup&gt;**: produces each lookup's missing entities from its dump to its "
        "Kafka topic, with the partitioner of the topics it is joined with (values the topic holds "
        "are kept: it may be newer than the dump), compared with the topic as Kafka holds it.\n"
        "2. **run_quality_suites**: completeness, co-partitioning, key format, over the topics read "
        "from Kafka up to their end offsets as the run starts (the report names them).\n"
        "3. **quality_gate**: fails the run, with the plain-words summary and the report path, when a "
        "check failed. Then the joins are *not* started.\n"
        "4. **ensure_joins_running**: starts the pipeline's continuous ingest (Kafka → bronze, the "
        "lake's mirror) and each continuous join that is not running; running ones are left alone.\n"
        "5. **wait_joins_caught_up**: waits until the joins have processed every record of their "
        "topics.\n"
        "6. **dbt_build**: `lake dbt build` of the pipeline's dbt models (staging views, marts, tests).\n\n"
        f"Config: `{b.config_path}`; lake root: `{b.root}`."
    )
    with b.dag(
        "pipeline", config.airflow.schedule, doc, "pipeline", is_paused_upon_creation=b.af.paused_at_creation
    ) as dag:
        backfills = [
            b.spark(
                f"backfill_{name}",
                ["backfill", name, "--missing-only", *b.common()],
                f"Backfills lookup `{name}` (topic `{lookup.topic}`) from "
                f"`{lookup.backfill.source or '(no source configured)'}`: the keys the topic lacks. A "
                "key the topic holds with another value is counted, not overwritten, since the topic may "
                "be newer than the dump (the manual backfill DAG applies changes).",
            )
            for name, lookup in config.lookups.items()
            if lookup.backfill.source is not None
        ]
        suites = b.run_suites()
        gate = b.gate()
        ensure = b.python(
            "ensure_joins_running",
            tasks.ensure_joins_running,
            "Starts the pipeline's continuous ingest (Kafka → bronze: the lake's mirror, which the joins "
            "do not need: they read Kafka), then each continuous join that is not running: detached, "
            "supervised processes with pid and heartbeat under `<root>/_jobs`. Running ones are left "
            f"alone, so re-runs never start a second copy. Joins: {', '.join(config.joins) or 'none'}.",
            retries=b.af.retries,
            op_kwargs={
                "config_path": b.config_path,
                "root": b.root,
                "conn_id": b.af.spark_conn_id,
                "trigger": JOIN_TRIGGER_SECONDS,
            },
        )
        caught_up = PythonSensor(
            task_id="wait_joins_caught_up",
            python_callable=tasks.joins_caught_up,
            op_kwargs={"config_path": b.config_path, "root": b.root},
            poke_interval=3,
            timeout=JOINS_CATCH_UP_TIMEOUT,
            mode="poke",  # a short wait; keeps `airflow dags test` simple
            doc_md="Waits until every join has processed all of its input topics (0 records behind), so the "
            "marts are built from caught-up results. Fails after "
            f"{JOINS_CATCH_UP_TIMEOUT // 60} minutes, naming the joins still behind.",
        )
        dbt = b.spark(
            "dbt_build",
            ["dbt", "--root", b.root, "build", *b.dbt_selection()],
            "`lake dbt build` of this pipeline's models (dbt-spark, session mode, in one spark-submit): "
            "staging views, the marts (tables under `<root>/warehouse`) and their tests, including the "
            "relationships tests that restate completeness. A failing test fails the task.",
            retries=0,  # a failing data test is not fixed by running it again
        )
        if backfills:
            backfills >> suites
        suites >> gate >> ensure >> caught_up >> dbt
    return dag


def _backfill_params(lookups: list[str]) -> dict[str, Param]:
    """The manual backfill's form: which lookup, from which dump, how, and how many bad lines."""
    return {
        "lookup": Param(
            lookups[0] if lookups else "",
            type="string",
            enum=lookups or [""],
            title="Lookup",
            description="The lookup to backfill.",
        ),
        "source": Param(
            "",
            type="string",
            title="Dump file or URI",
            description=(
                "An absolute path, a file:// or an s3a:// URI. Empty: the dump named in the pipeline config."
            ),
        ),
        "partitioner": Param(
            "default",
            type="string",
            enum=["default", *PARTITIONERS],
            title="Partitioner override",
            description="default: the partitioner of the topics the lookup is joined with (murmur2 for "
            "Java clients). Override only if you know the consumers' partitioner.",
        ),
        "dry_run": Param(
            False, type="boolean", title="Dry run", description="Only count what would change; write nothing."
        ),
        "max_rejects": Param(
            0,
            type="integer",
            minimum=0,
            title="Bad lines allowed",
            description="Fail (writing nothing) when the dump has more bad lines than this. Accepted bad "
            "lines are quarantined and counted, never dropped silently.",
        ),
    }


def manual_backfill_dag(b: _Builder) -> DAG:
    config = b.config
    lookups = list(config.lookups)
    doc = (
        f"A person's backfill of one lookup of pipeline `{config.name}`, then the quality suites.\n\n"
        "Trigger it with the form (*Trigger DAG*) or `airflow dags trigger "
        f'{config.name}_manual_backfill --conf \'{{"lookup": "{lookups[0] if lookups else "NAME"}", '
        '"dry_run": true}\'`. The log of **report** says what changed (new / changed / unchanged / '
        "rejected) and what the suites found; the run fails when a suite fails. A real (not dry) "
        "backfill that wrote records updates the lookup's Asset, which runs the quality DAG."
    )
    params = _backfill_params(lookups)
    with b.dag("manual_backfill", None, doc, "backfill", params=params, is_paused_upon_creation=False) as dag:
        args = b.python(
            "validate_params",
            tasks.backfill_args,
            "Checks the params (the lookup exists, the dump file exists) and builds the `lake backfill` "
            "command line.",
            op_kwargs={"config_path": b.config_path, "root": b.root},
        )
        backfill = b.spark(
            "backfill",
            args.output,
            "Runs `lake backfill` with the params: only keys that are new or changed are written, in one "
            "commit; bad lines are quarantined and counted.",
        )
        publish = [
            b.python(
                f"publish_lookup_{name}",
                tasks.publish_lookup,
                f"Records an update of the Asset of lookup `{name}` when this run wrote to it (skipped "
                "otherwise), so data-aware DAGs such as the quality DAG run after it.",
                op_kwargs={"root": b.root, "lookup": name},
                outlets=[lookup_asset(config, b.root, name)],
            )
            for name in lookups
        ]
        suites = b.run_suites()
        report = b.python(
            "report",
            tasks.report_backfill,
            "The backfill's summary (new / changed / unchanged / rejected) and the suites' results; "
            "fails when a suite failed, with the report path.",
            op_kwargs={"root": b.root},
        )
        args >> backfill >> suites >> report
        backfill >> publish
    return dag


def quality_dag(b: _Builder) -> DAG:
    config = b.config
    assets = [lookup_asset(config, b.root, name) for name in config.lookups]
    schedule: object = b.af.quality_schedule
    if assets:
        on_assets = AssetAny(*assets)
        schedule = (
            AssetOrTimeSchedule(
                timetable=CronTriggerTimetable(b.af.quality_schedule, timezone="UTC"), assets=on_assets
            )
            if b.af.quality_schedule
            else on_assets
        )
    doc = (
        f"The quality suites of pipeline `{config.name}`, on a schedule (`{b.af.quality_schedule}`) and "
        "whenever a lookup's Asset is updated. It never starts anything: its result is the "
        "`quality_runs` table, the summary page and the Data Docs under `<root>/reports/quality`; "
        "the run fails (and alerts) when a check fails."
    )
    with b.dag("quality", schedule, doc, "quality", is_paused_upon_creation=False) as dag:
        b.run_suites() >> b.gate()
    return dag


def streams_dag(b: _Builder) -> DAG:
    config = b.config
    joins = list(config.joins)
    doc = (
        f"The continuous joins of pipeline `{config.name}` ({', '.join(joins) or 'none'}).\n\n"
        f"Scheduled (`{b.af.health_schedule}`) it checks their health and that of the pipeline's "
        "continuous ingest (Kafka → bronze): the run fails, and the failure callbacks alert, when a job "
        "is down, has stopped heartbeating, or an input is more than "
        f"{b.af.max_records_behind} records behind. Triggered with `action` = `start` it starts the "
        "ingest and the joins that are not running (never a second copy); `stop` stops them after their "
        "current micro-batch, for maintenance (the ingest only when `join` is `all`)."
    )
    params = {
        "action": Param("health", type="string", enum=["health", "start", "stop"], title="Action"),
        "join": Param(
            "all", type="string", enum=["all", *joins], title="Join", description="all: every join"
        ),
    }
    common = {"config_path": b.config_path, "root": b.root}
    with b.dag(
        "streams",
        b.af.health_schedule,
        doc,
        "streams",
        params=params,
        is_paused_upon_creation=b.af.paused_at_creation,
    ) as dag:
        choose = BranchPythonOperator(
            task_id="choose_action",
            python_callable=tasks.choose_action,
            doc_md="Picks the task the `action` param names (`health` on scheduled runs).",
            retries=0,
        )
        health = b.python(
            "check_health",
            tasks.check_health,
            "Fails when a join is down, stuck, or its input is too many versions behind.",
            op_kwargs={**common, "max_records_behind": b.af.max_records_behind},
        )
        start = b.python(
            "start_joins",
            tasks.ensure_joins_running,
            "Starts the pipeline's continuous ingest and the chosen joins that are not running; running "
            "ones are left alone.",
            retries=b.af.retries,
            op_kwargs={**common, "conn_id": b.af.spark_conn_id, "trigger": JOIN_TRIGGER_SECONDS},
        )
        stop = b.python(
            "stop_joins",
            tasks.stop_joins,
            "Stops the chosen joins after their current micro-batch (and the ingest, for `all`).",
            op_kwargs=common,
        )
        choose >> [health, start, stop]
    return dag


def build_dags(root: str | None = None, config: str | None = None) -> dict[str, DAG]:
    """All DAGs of every configured pipeline (``$LAKE_PIPELINES``), keyed by dag_id."""
    lake_root = resolve_root(root)
    dags: dict[str, DAG] = {}
    for path in unique_pipelines(config):
        b = _Builder(path, lake_root)
        for make in (pipeline_dag, manual_backfill_dag, quality_dag, streams_dag):
            dag = make(b)
            dags[dag.dag_id] = dag
    return dags
