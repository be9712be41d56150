"""The join kinds' engines: one class per kind of ``spark_jobs.join_kinds.KINDS``, one module each."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.config import JoinSpec, PipelineConfig
from spark_jobs.formats import Formats
from spark_jobs.joins.derive import DeriveJob
from spark_jobs.joins.engine import (
    JoinJob,
)
from spark_jobs.joins.fk import FkJob
from spark_jobs.joins.lists import ListJob
from spark_jobs.joins.stream_stream import StreamStreamJob
from spark_jobs.joins.stream_table import StreamTableJob
from spark_jobs.joins.table import TableJob


def job_for(
    spark: SparkSession,
    lake: Any,
    config: PipelineConfig,
    spec: JoinSpec,
    query_id: Any,
    log: Any = None,
    formats: Formats | None = None,
) -> JoinJob:
    """The engine for a join's kind (``formats``: its inputs' codecs; by default the pipeline's)."""
    cls = JOBS[spec.kind]
    if log is None:
        return cls(spark, lake, config, spec, query_id, formats=formats)
    return cls(spark, lake, config, spec, query_id, log, formats=formats)


# The engine class of every kind of spark_jobs.join_kinds.KINDS.
JOBS: dict[str, type[JoinJob]] = {
    "table": TableJob,
    "stream-table": StreamTableJob,
    "stream-stream": StreamStreamJob,
    "fk": FkJob,
    "list": ListJob,
    "derive": DeriveJob,
}
