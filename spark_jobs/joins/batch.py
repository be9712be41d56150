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
    nothing, as the engine keeps it; a tombstone is a value, null), and ``from_partition`` /
    ``from_offset``, that first record's place (a result row's provenance). Exact when each key's
    records arrive in timestamp order."""
    order = Window.partitionBy("key").orderBy(*ORDER)
    previous = F.lag("value").over(order)
    first = F.row_number().over(order) == 1
    start = first | ~previous.eqNullSafe(F.col("value"))
    began = F.when(start, F.struct("timestamp", "partition", "offset"))
    running = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return (
        records.withColumn("__start", F.last(began, ignorenulls=True).over(running))
        .withColumns(
            {
                "since": F.col("__start.timestamp"),
                "from_partition": F.col("__start.partition"),
                "from_offset": F.col("__start.offset"),
            }
        )
        .drop("__start")
    )


def live(records: DataFrame) -> DataFrame:
    """Each key's latest record, when it is not a tombstone."""
    return latest(records).filter(F.col("value").isNotNull())


def right_versions(right: DataFrame) -> DataFrame:
    """The right side's latest record per key, a tombstone too: ``right_value`` (null for a
    tombstone), ``right_since`` (its value time), and ``right_partition`` / ``right_offset`` (the
    record its value came from; null for a tombstone)."""
    has_value = F.col("value").isNotNull()
    return latest(with_since(right)).select(
        "key",
        F.col("value").alias("right_value"),
        F.col("since").alias("right_since"),
        F.when(has_value, F.col("from_partition")).alias("right_partition"),
        F.when(has_value, F.col("from_offset")).alias("right_offset"),
    )


def left_sources(records: DataFrame) -> list:
    """``left_partition`` / ``left_offset`` of :func:`with_since`'s records: where each left value
    came from (null for a tombstone)."""
    has_value = F.col("value").isNotNull()
    return [
        F.when(has_value, F.col("from_partition")).alias("left_partition"),
        F.when(has_value, F.col("from_offset")).alias("left_offset"),
    ]
