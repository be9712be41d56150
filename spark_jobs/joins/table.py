"""table: both sides' latest value per key, joined (docs/joins.md, "Semantics")."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec
from spark_jobs.join_kinds import SOURCES
from spark_jobs.joins.batch import latest, left_sources, right_versions, with_since
from spark_jobs.joins.engine import Projection
from spark_jobs.joins.state_store import StateStoreJob


class TableJob(StateStoreJob):
    """table: the Java operator ``lake.joins.TableJoin`` keeps each key's accepted version per side
    (the latest by timestamp, offset, then partition; a tombstone is a version without a value) and
    hands the batch one row per key that had records: both values after the batch, whether the join
    holds a row, whether the batch deleted a live left value."""

    operator = "TableJoin"

    @staticmethod
    def expected(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame, codecs):
        """table: both sides' latest live values per key, joined; the timestamp the latest of both
        sides' value times (a tombstone's too)."""
        lhs = latest(with_since(left))
        lhs = lhs.select("key", F.col("value").alias("left_value"), "since", *left_sources(lhs))
        rows = lhs.join(right_versions(right), "key", "full")
        has_left, has_right = F.col("left_value").isNotNull(), F.col("right_value").isNotNull()
        keep = {"inner": has_left & has_right, "left": has_left, "outer": has_left | has_right}[spec.type]
        rows = rows.filter(keep).select(
            "key",
            F.greatest("since", "right_since").alias("timestamp"),
            "left_value",
            "right_value",
            *SOURCES,
        )
        return rows, Projection(spark, codecs, spec).frame
