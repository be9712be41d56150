"""What the kinds' oracles (``expected``) are written with: a topic's records as a table, each key's
latest record, as a plain batch join would read them (docs/joins.md, "Semantics")."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

ORDER = ["timestamp", "offset", "partition"]  # a key's records, oldest first (the engine's order)


def latest(records: DataFrame) -> DataFrame:
    """Each key's latest record, by timestamp, then offset."""
    order = Window.partitionBy("key").orderBy(*[F.col(c).desc() for c in ORDER])
    return records.withColumn("_rn", F.row_number().over(order)).filter("_rn = 1").drop("_rn")


def with_since(records: DataFrame) -> DataFrame:
    """Each record with ``since``: when its key's value became the one it holds, the timestamp of
    the first record of the run of equal values it ends (a later record with the same value changes
    nothing, as the engine keeps it; a tombstone is a value, null). Exact when each key's records
    arrive in timestamp order."""
    order = Window.partitionBy("key").orderBy(*ORDER)
    previous = F.lag("value").over(order)
    first = F.row_number().over(order) == 1
    starts = F.when(first | ~previous.eqNullSafe(F.col("value")), F.col("timestamp"))
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return (
        records.withColumn("__start", starts)
        .withColumn("since", F.max("__start").over(running))
        .drop("__start")
    )


def live(records: DataFrame) -> DataFrame:
    """Each key's latest record, when it is not a tombstone."""
    return latest(records).filter(F.col("value").isNotNull())


def right_values(right: DataFrame) -> DataFrame:
    """The right side's live value per key, as ``right_value``."""
    return live(right).select("key", F.col("value").alias("right_value"))


def right_versions(right: DataFrame) -> DataFrame:
    """The right side's latest record per key, a tombstone too: ``right_value`` (null for a
    tombstone) and ``right_since`` (its value time)."""
    return latest(with_since(right)).select(
        "key", F.col("value").alias("right_value"), F.col("since").alias("right_since")
    )
