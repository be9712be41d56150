"""table: both sides' latest value per key, joined (docs/joins.md, "Semantics")."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.joins.batch import live, right_values
from spark_jobs.joins.engine import Projection
from spark_jobs.joins.state_store import StateStoreJob
from spark_jobs.seams.config import JoinSpec


class TableJob(StateStoreJob):
    """table: the Java operator ``lake.joins.TableJoin`` keeps each key's accepted version per side
    (the latest by timestamp, offset, then partition; a tombstone is a version without a value) and
    hands the batch one row per key that had records: both values after the batch, whether the join
    holds a row, whether the batch deleted a live left value."""

    operator = "TableJoin"

    @staticmethod
    def expected(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame, codecs):
        """table: both sides' latest live values per key, joined."""
        how = {"inner": "inner", "left": "left", "outer": "full"}[spec.type]
        lhs = live(left).select("key", F.col("value").alias("left_value"))
        return lhs.join(right_values(right), "key", how), Projection(spark, codecs, spec).frame
