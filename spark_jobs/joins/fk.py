"""fk: a foreign-key table-table join, keyed by the left key (docs/joins.md, "Foreign-key, list and derive
joins")."""

from __future__ import annotations

from pyspark.sql import DataFrame
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

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # an inner join's left record with a null foreign key joins nothing; a left join keeps it
        self.null_keys_dropped_as = "null_foreign_key" if self.spec.type == "inner" else None

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
