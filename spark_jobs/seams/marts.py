"""The dbt seam: dbt-spark in session mode over the lake, and SQL over the lake and the marts.

``lake dbt ARGS`` and ``lake sql`` build this process's Spark session with the lake's persistent
catalog (see ``session.catalog_conf``) and register every Delta table under the lake root as an
external catalog table of schema ``lake`` (``lake.<table>``, ``CREATE TABLE ... USING delta LOCATION``:
Delta's own Spark source reads it, so ``spark.read.table("lake.<table>")`` works in any session with
that catalog). dbt then runs in the same process (dbt-spark's session connection finds the session with
``getOrCreate()``): its sources are those tables, its staging models plain catalog views
(``staging.<model>``), its marts Delta tables (``marts.<name>``, data under ``<root>/warehouse``).
The catalog is embedded Derby, which serves one process at a time: the commands take turns on the
lake's ``catalog`` lock.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from spark_jobs.errors import UserError
from spark_jobs.joins.behind import current_views
from spark_jobs.seams.delta import Lake
from spark_jobs.system_tables import ensure_quality_runs, ensure_quarantine

PROJECT_DIR = Path(__file__).resolve().parents[2] / "dbt"
MARTS_SCHEMA = "marts"
LAKE_SCHEMA = "lake"  # the lake's own tables, registered in the catalog
CATALOG_LOCK = "catalog"  # the catalog's embedded Derby serves one process at a time


def project_dir() -> Path:
    """The dbt project: ``LAKE_DBT_PROJECT`` or the repository's ``dbt/``."""
    path = Path(os.environ.get("LAKE_DBT_PROJECT") or PROJECT_DIR)
    if not (path / "dbt_project.yml").is_file():
        raise UserError(f"no dbt project at {path} (dbt_project.yml missing; set LAKE_DBT_PROJECT)")
    return path


def register_lake_tables(spark, lake: Lake) -> list[str]:
    """Every Delta table under the lake root as the external table ``lake.<table>`` of the session's
    catalog (created once; a table gone from the lake, e.g. after ``--reset``, is dropped from the
    catalog, never its data), and the current view ``lake.<join>__current`` of each join whose result
    table is written behind its changelog (``spark_jobs.joins.behind``)."""
    if not spark.catalog.databaseExists(LAKE_SCHEMA):  # (Hive logs an ERROR for IF NOT EXISTS hits)
        spark.sql(f"CREATE SCHEMA {LAKE_SCHEMA} COMMENT 'the Delta tables under the lake root'")
    names = lake.tables()
    views = current_views(lake, LAKE_SCHEMA)
    listed = [t for t in spark.catalog.listTables(LAKE_SCHEMA) if not t.isTemporary]
    known = {t.name for t in listed if t.tableType != "VIEW"}
    for name in sorted({t.name for t in listed if t.tableType == "VIEW"} - set(views)):
        spark.sql(f"DROP VIEW {LAKE_SCHEMA}.`{name}`")
    for name in sorted(known - set(names)):
        spark.sql(f"DROP TABLE {LAKE_SCHEMA}.`{name}`")  # external: the data stays where it was
    for name in names:
        if name not in known:
            location = lake.uri(name).replace("'", "\\'")
            spark.sql(f"CREATE TABLE {LAKE_SCHEMA}.`{name}` USING delta LOCATION '{location}'")
    for name, sql in views.items():  # anew each time: the result's columns may have changed
        spark.sql(f"CREATE OR REPLACE VIEW {LAKE_SCHEMA}.`{name}` AS {sql}")
    return names


def ensure_system_tables(lake: Lake) -> None:
    """The quarantine and quality-runs tables exist (empty) before anything reads them."""
    ensure_quarantine(lake)
    ensure_quality_runs(lake)


def run_dbt(lake: Lake, args: Sequence[str], log: Callable[[str], None] = print) -> int:
    """Run ``dbt ARGS`` on the lake (target and logs under ``<root>/dbt``); dbt's exit code."""
    project = project_dir()
    if not args:
        raise UserError("give a dbt command, e.g. 'lake dbt build' or 'lake dbt build --select +optout_feed'")
    with lake.lock(CATALOG_LOCK, log):
        return _run_dbt(lake, project, args, log)


def _run_dbt(lake: Lake, project: Path, args: Sequence[str], log: Callable[[str], None]) -> int:
    from dbt.cli.main import dbtRunner

    from spark_jobs.seams.session import get_spark

    log(f"starting Spark with the lake's catalog ({lake.layout.catalog}) ...")
    spark = get_spark(app_name="dbt", catalog=lake.root)  # first: the lake's writes use this session
    ensure_system_tables(lake)
    names = register_lake_tables(spark, lake)
    log(f"{len(names)} lake tables in the catalog as {LAKE_SCHEMA}.<table>")
    if not spark.catalog.databaseExists(MARTS_SCHEMA):  # (Hive logs an ERROR for IF NOT EXISTS hits)
        spark.sql(f"CREATE SCHEMA {MARTS_SCHEMA}")
    argv = [
        *args,
        "--project-dir",
        str(project),
        "--profiles-dir",
        str(project),
        "--target-path",
        str(lake.layout.dbt_target),
        "--log-path",
        str(lake.layout.dbt_logs),
    ]
    os.environ.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")  # no network calls home
    # dbt's semaphores are released when this process exits directly (cli.entry); the resource
    # tracker's "leaked semaphore" warning at that moment is noise, not a leak worth reporting
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:multiprocessing.resource_tracker")
    if not sys.stdout.isatty():  # plain text in logs and pipes
        os.environ.setdefault("DBT_USE_COLORS", "false")
    result = dbtRunner().invoke(argv)
    if result.exception is not None:  # dbt could not run at all (bad arguments, broken project)
        raise UserError(f"dbt {' '.join(args)}: {str(result.exception).strip().splitlines()[0]}")
    return 0 if result.success else 1


def query(
    lake: Lake, sqls: list[str], log: Callable[[str], None] = print
) -> list[tuple[list[str], list[dict]]]:
    """(columns, rows) of each query of ``sqls`` over the marts (``marts.<name>``) and the lake's tables
    (``lake.<name>``), in one Spark session; a failing query fails them all, naming which it was."""
    import logging

    from pyspark.logger import PySparkLogger

    from spark_jobs.seams.session import get_spark

    # a bad query is reported once, as the one-line error below, not also as PySpark's JSON log record
    PySparkLogger.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    with lake.lock(CATALOG_LOCK, log):
        log("starting Spark with the lake's catalog ...")
        spark = get_spark(app_name="sql", catalog=lake.root)
        register_lake_tables(spark, lake)  # new tables only: the catalog keeps the others
        answers = []
        for n, sql in enumerate(sqls, 1):
            try:
                frame = spark.sql(sql)
                answers.append((frame.columns, [r.asDict(recursive=True) for r in frame.collect()]))
            except Exception as exc:  # a bad query is the user's: say what Spark said, in one line
                from pyspark.errors import PySparkException

                if isinstance(exc, PySparkException):
                    which = f"query {n} of {len(sqls)}" if len(sqls) > 1 else "query"
                    raise UserError(f"{which} failed: {str(exc).strip().splitlines()[0]}") from exc
                raise
        return answers
