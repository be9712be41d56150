"""fk: a foreign-key table-table join, keyed by the left key (docs/joins.md, "Foreign-key, list and derive
joins")."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec
from spark_jobs.join_kinds import SOURCES
from spark_jobs.joins.batch import left_sources, live, right_versions, with_since
from spark_jobs.joins.engine import Projection
from spark_jobs.joins.keyed import KeyedJob
from spark_jobs.joins.state_store import StateStoreJob


class FkJob(KeyedJob, StateStoreJob):
    """fk: the KIP-213 shape in Spark's state store (``lake.joins.FkJoin``, Java): the left side by its
    key, subscriptions routed to the foreign key, the right side and its subscribers by foreign key; a
    right change is answered for exactly the left keys that point at it."""

    operator = "FkJoin"

    def _joins_nothing(self) -> tuple[Column, Column] | None:
        if self.spec.type != "inner":  # a left join keeps the record, with null right columns
            return None
        unused = (F.col("side") == "left") & F.col("value").isNotNull() & F.col("by").isNull()
        reason = f"null foreign key: an inner join drops a record whose foreign key ({self.spec.by}) is null"
        return F.lit(reason), unused

    @staticmethod
    def expected(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame, codecs):
        """fk: each live left record with the right value of the key its foreign key names; the
        timestamp the latest of the left value's time and that right record's (a tombstone's too)."""
        lhs = live(with_since(left))
        rows = lhs.select(
            "key", F.col("value").alias("left_value"), F.col("by").alias("fk"), "since", *left_sources(lhs)
        )
        rows = rows.join(right_versions(right).withColumnRenamed("key", "fk"), "fk", "left")
        if spec.type == "inner":
            rows = rows.filter(F.col("right_value").isNotNull())
        rows = rows.select(
            "key",
            F.greatest("since", "right_since").alias("timestamp"),
            "left_value",
            "right_value",
            *SOURCES,
        )
        return rows, Projection(spark, codecs, spec).frame
