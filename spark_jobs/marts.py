"""The dbt seam: dbt-spark in session mode over the lake, and SQL over the marts it builds.

``lake dbt ARGS`` builds this process's Spark session with the lake's persistent catalog (see
``session.catalog_conf``), registers every Delta table of the lake as a global temporary view read by
the ``delta`` data source (``global_temp.<table>``: the dbt sources), then runs dbt in the same
process; dbt-spark's session connection finds that session with ``getOrCreate()``. The marts are
tables of that catalog (``marts.<name>``, data under ``<root>/warehouse``), so ``lake sql`` (or any
session built with ``get_spark(catalog=root)``) reads them in a new process.

Why views and not catalog tables for the sources: Spark does not hand a Python data source the
options of a catalog table (``CREATE TABLE ... USING delta LOCATION ...`` reads with no path), so the
lake's tables can only be seen by SQL as session views.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from spark_jobs.errors import UserError
from spark_jobs.lake import Lake
from spark_jobs.layout import Layout
from spark_jobs.system_tables import ensure_quality_runs, ensure_quarantine

PROJECT_DIR = Path(__file__).resolve().parents[1] / "dbt"
MARTS_SCHEMA = "marts"
CATALOG_LOCK = "catalog"  # the catalog's embedded Derby serves one process at a time


def project_dir() -> Path:
    """The dbt project: ``LAKE_DBT_PROJECT`` or the repository's ``dbt/``."""
    path = Path(os.environ.get("LAKE_DBT_PROJECT") or PROJECT_DIR)
    if not (path / "dbt_project.yml").is_file():
        raise UserError(f"no dbt project at {path} (dbt_project.yml missing; set LAKE_DBT_PROJECT)")
    return path


def register_lake_views(spark, lake: Lake) -> list[str]:
    """Every Delta table under the lake root as a global temporary view of the same name."""
    names = lake.tables()
    for name in names:
        spark.read.format("delta").load(lake.uri(name)).createOrReplaceGlobalTempView(name)
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

    from spark_jobs.session import get_spark

    log(f"starting Spark with the lake's catalog ({lake.root / 'catalog'}) ...")
    spark = get_spark(app_name="dbt", catalog=lake.root)  # first: the lake's writes use this session
    ensure_system_tables(lake)
    names = register_lake_views(spark, lake)
    log(f"{len(names)} lake tables visible to dbt as global_temp.<table>")
    if not spark.catalog.databaseExists(MARTS_SCHEMA):  # (Hive logs an ERROR for IF NOT EXISTS hits)
        spark.sql(f"CREATE SCHEMA {MARTS_SCHEMA}")
    work = Layout(lake.root).dbt
    argv = [
        *args,
        "--project-dir",
        str(project),
        "--profiles-dir",
        str(project),
        "--target-path",
        str(work / "target"),
        "--log-path",
        str(work / "logs"),
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


def query(lake: Lake, sql: str, log: Callable[[str], None] = print) -> tuple[list[str], list[dict]]:
    """(columns, rows) of ``sql`` over the marts (``marts.<name>``) and the lake's tables
    (``global_temp.<name>``)."""
    import logging

    from pyspark.logger import PySparkLogger

    from spark_jobs.session import get_spark

    # a bad query is reported once, as the one-line error below, not also as PySpark's JSON log record
    PySparkLogger.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    with lake.lock(CATALOG_LOCK, log):
        log("starting Spark with the lake's catalog ...")
        spark = get_spark(app_name="sql", catalog=lake.root)
        if "global_temp" in sql.lower():  # registering every lake table takes seconds: only when asked
            register_lake_views(spark, lake)
        try:
            frame = spark.sql(sql)
            return frame.columns, [r.asDict(recursive=True) for r in frame.collect()]
        except Exception as exc:  # a bad query is the user's: say what Spark said, in one line
            from pyspark.errors import PySparkException

            if isinstance(exc, PySparkException):
                raise UserError(f"query failed: {str(exc).strip().splitlines()[0]}") from exc
            raise
