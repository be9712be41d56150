"""Lookup tables: a lookup's compacted topic kept as a Delta table ``lookup_<name>`` with the latest
value per key (tombstones delete), part of the lake's queryable mirror of Kafka (dbt's sources read
them). ``lake ingest`` refreshes a lookup's table after mirroring its topic into bronze.

A refresh applies the bronze table's change feed since the last refresh; the last bronze version
applied is recorded in the lookup table itself (a Delta ``txn`` of application ``lookup:<name>``), so
a refresh is exactly-once and a crash between writes is repaired by the next run. A rewritten bronze
table (``lake topic repartition``) rebuilds the lookup from scratch.

The checks and joins do not read these tables: they read the topics on Kafka.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark_jobs.seams import layout
from spark_jobs.seams.config import LookupSpec
from spark_jobs.seams.delta import Lake

LOOKUP_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("topic_version", pa.int64()),
    ]
)


def lookup_table(lookup: LookupSpec) -> str:
    return layout.lookup_table(lookup.name)


def ensure_lookup(lake: Lake, lookup: LookupSpec) -> None:
    lake.create(lookup_table(lookup), LOOKUP_SCHEMA, description=f"latest value per key of {lookup.topic}")


def refresh_lookup(spark: SparkSession, lake: Lake, lookup: LookupSpec) -> int:
    """Apply the records the topic's bronze table got since the last refresh; returns the keys
    merged. One refresh of a lookup at a time (two ingests may overlap)."""
    with lake.lock(f"lookup-{lookup.name}"):
        return _refresh_lookup(spark, lake, lookup)


def _refresh_lookup(spark: SparkSession, lake: Lake, lookup: LookupSpec) -> int:
    ensure_lookup(lake, lookup)
    if not lake.exists(lookup.topic):  # nothing mirrored yet
        return 0
    table = lookup_table(lookup)
    app = f"lookup:{lookup.name}"
    applied = lake.txn_version(table, app)
    current = lake.version(lookup.topic)
    if applied is not None and applied >= current:
        return 0
    start = 0 if applied is None else applied + 1
    if lake.rewrites(lookup.topic, start, current):
        # the topic was rewritten (e.g. repartitioned): offsets no longer apply, rebuild from scratch
        return _rebuild_lookup(spark, lake, lookup, current)
    changes = lake.changes(lookup.topic, start, current)
    latest = _latest_per_key(changes.filter(F.col("_change_type") == "insert"), current)
    rows = latest.withColumn("_delete", F.col("value").isNull()).persist()
    try:
        merged = rows.count()
        if merged:
            lake.merge(table, rows, ["key"], delete_column="_delete", txn=(app, current))
        return merged
    finally:
        rows.unpersist()


def _latest_per_key(records: DataFrame, version: int) -> DataFrame:
    order = Window.partitionBy("key").orderBy(
        F.col("_commit_version").desc(), F.col("timestamp").desc(), F.col("offset").desc()
    )
    return (
        records.filter(F.col("key").isNotNull())
        .withColumn("_rn", F.row_number().over(order))
        .filter("_rn = 1")
        .select("key", "value", "partition", "offset", "timestamp", F.lit(version).alias("topic_version"))
    )


def _topic_latest(spark: SparkSession, lake: Lake, topic: str, version: int) -> DataFrame:
    """The latest live value per key of a topic as of ``version`` (tombstoned keys left out)."""
    snapshot = lake.read(topic, version).withColumn("_commit_version", F.lit(version))
    return _latest_per_key(snapshot, version).filter(F.col("value").isNotNull())


def _rebuild_lookup(spark: SparkSession, lake: Lake, lookup: LookupSpec, current: int) -> int:
    latest = _topic_latest(spark, lake, lookup.topic, current).persist()
    try:
        lake.overwrite(lookup_table(lookup), latest, txn=(f"lookup:{lookup.name}", current))
        return latest.count()
    finally:
        latest.unpersist()
