"""fk: a foreign-key table-table join, keyed by the left key (docs/joins.md, "Foreign-key, list and derive
joins")."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.joins.batch import live, right_values
from spark_jobs.joins.engine import Projection
from spark_jobs.joins.keyed import KeyedJob
from spark_jobs.joins.state_store import StateStoreJob
from spark_jobs.seams.config import JoinSpec


class FkJob(KeyedJob, StateStoreJob):
    """fk: the KIP-213 shape in Spark's state store (``lake.joins.FkJoin``, Java): the left side by its
    key, subscriptions routed to the foreign key, the right side and its subscribers by foreign key; a
    right change is answered for exactly the left keys that point at it."""

    operator = "FkJoin"

    @staticmethod
    def expected(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame, codecs):
        """fk: each live left record with the right value of the key its foreign key names."""
        rows = live(left).select("key", F.col("value").alias("left_value"), F.col("by").alias("fk"))
        rhs = right_values(right).withColumnRenamed("key", "fk")
        rows = rows.join(rhs, "fk", "inner" if spec.type == "inner" else "left").drop("fk")
        return rows, Projection(spark, codecs, spec).frame
