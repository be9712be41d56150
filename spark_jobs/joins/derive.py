"""derive: a lookup keyed by a value of its master topic (docs/joins.md, "Foreign-key, list and
derive joins")."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec
from spark_jobs.joins.batch import live, with_since
from spark_jobs.joins.engine import Projection
from spark_jobs.joins.keyed import KeyedJob
from spark_jobs.joins.state_store import StateStoreJob

# Which of the master records holding one derived key wins (the oracle's order; DeriveJoin.java's
# ``Holders`` compares the same way). Offsets order records within a partition only, so equal
# timestamps in different partitions fall back to the partition number.
NEWEST = ["timestamp", "partition", "offset"]


class DeriveJob(KeyedJob, StateStoreJob):
    """derive: the master records by key, each holding its derived key; per derived key its holders
    (``lake.joins.DeriveJoin``, Java), and the newest of them is the derived row."""

    operator = "DeriveJoin"

    def _joins_nothing(self) -> tuple[Column, Column] | None:
        unused = (F.col("side") == "left") & F.col("value").isNotNull() & F.col("by").isNull()
        return F.lit(f"null derived key: the record derives no key ({self.spec.by} is null)"), unused

    row_columns = ["key", "timestamp", "master_key", "left_value", "left_partition", "left_offset"]
    tombstones_follow_left = False  # its result is keyed by the derived key, not the left topic's

    @staticmethod
    def expected(spark, lake, config, spec: JoinSpec, left: DataFrame, right: None, codecs):
        """derive: per derived key, the newest live master record that derives it."""
        newest = Window.partitionBy("by").orderBy(*[F.col(c).desc() for c in NEWEST])
        rows = (
            live(with_since(left))
            .filter(F.col("by").isNotNull())
            .withColumn("_rn", F.row_number().over(newest))
            .filter("_rn = 1")
            .select(
                F.col("by").alias("key"),
                F.col("since").alias("timestamp"),
                F.col("key").alias("master_key"),
                F.col("value").alias("left_value"),
                F.col("from_partition").alias("left_partition"),
                F.col("from_offset").alias("left_offset"),
            )
        )
        return rows, Projection(spark, codecs, spec).frame
