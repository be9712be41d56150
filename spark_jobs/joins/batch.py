"""What the kinds' oracles (``expected``) are written with: a topic's records as a table, each key's
latest record, as a plain batch join would read them (docs/joins.md, "Semantics")."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F


def latest(records: DataFrame) -> DataFrame:
    """Each key's latest record, by timestamp, then offset."""
    order = Window.partitionBy("key").orderBy(F.col("timestamp").desc(), F.col("offset").desc())
    return records.withColumn("_rn", F.row_number().over(order)).filter("_rn = 1").drop("_rn")


def live(records: DataFrame) -> DataFrame:
    """Each key's latest record, when it is not a tombstone."""
    return latest(records).filter(F.col("value").isNotNull())


def right_values(right: DataFrame) -> DataFrame:
    """The right side's live value per key, as ``right_value``."""
    return live(right).select("key", F.col("value").alias("right_value"))
