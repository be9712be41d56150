"""Lookup tables: a lookup's compacted topic kept as a Delta table ``lookup_<name>`` with the latest
value per key (tombstones delete), part of the lake's queryable mirror of Kafka (dbt's sources read
them). ``lake ingest`` refreshes a lookup's table after mirroring its topic into bronze.

A refresh applies the bronze table's change feed since the last refresh; the last bronze version
applied is recorded in the lookup table itself (a Delta ``txn`` of application ``lookup:<name>``), so
a refresh is exactly-once and a crash between writes is repaired by the next run. A rewritten bronze
table (``lake topic repartition``) rebuilds the lookup from scratch.

Every refresh, one that finds nothing new too, then records how far the table goes in Kafka's terms
(``<root>/_checkpoints/lookups/<name>.json``): the offsets its topic's mirror had reached before the
refresh read the bronze table, a lower bound of what the table holds. ``lake status`` and ``lake
topics`` compare them with the topic's end offsets (:func:`lookup_lag`), so a lookup left behind (a
crash between a backfill's write and its refresh, a topic written by another producer) shows.

The checks and joins do not read these tables: they read the topics on Kafka.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark_jobs import faults, layout
from spark_jobs.config import LookupSpec, PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import connect, offset_ranges
from spark_jobs.seams.storage import write_whole

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


def refresh_lookup(spark: SparkSession, lake: Lake, lookup: LookupSpec, covers: list[int] | None) -> int:
    """Apply the records the topic's bronze table got since the last refresh; returns the keys
    merged. ``covers``: the Kafka offsets the bronze table was complete up to before this call
    (``spark_jobs.topics.ingest.mirrored_up_to``; None: not mirrored yet), recorded as the table's
    position once it holds them. One refresh of a lookup at a time (two ingests may overlap)."""
    with lake.lock(f"lookup-{lookup.name}"):
        merged = _refresh_lookup(spark, lake, lookup)
        faults.point("refresh")  # the table is refreshed, its position not yet recorded
        if covers is not None:
            _record_position(lake, lookup, covers)
        return merged


@dataclass(frozen=True)
class LookupLag:
    """How far a lookup's table is behind its topic: ``up_to`` the offsets it is complete up to (None:
    never refreshed), ``ends`` the topic's end offsets on Kafka (None: unknown), ``behind`` the
    difference summed over the partitions (records, and transaction markers among them)."""

    lookup: str
    table: str
    topic: str
    up_to: list[int] | None
    recorded_at: str | None
    ends: list[int] | None
    behind: int | None

    def text(self) -> str:
        where = (
            f"up to offsets {self.up_to} (refreshed {self.recorded_at})"
            if self.up_to is not None
            else "never refreshed"
        )
        lag = "" if self.behind is None else f", {self.behind:,} records behind {self.topic}"
        fix = "; 'lake ingest' brings it up to the topic" if self.behind else ""
        return f"lookup {self.lookup} ({self.table}): {where}{lag}{fix}"


def lookup_position(lake: Lake, lookup: LookupSpec) -> tuple[list[int], str] | None:
    """The offsets the lookup's table is complete up to, and when its last refresh recorded them."""
    try:
        data = json.loads(lake.layout.lookup_position(lookup.name).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return [int(o) for o in data["offsets"]], str(data["recorded_at"])


def lookup_lag(lake: Lake, lookup: LookupSpec, ends: list[int] | None) -> LookupLag:
    """The lookup's position against its topic's end offsets ``ends`` (None: Kafka was not asked)."""
    position = lookup_position(lake, lookup)
    up_to, at = position if position is not None else (None, None)
    behind = None
    if ends is not None:
        done = up_to or []
        behind = sum(max(0, end - (done[p] if p < len(done) else 0)) for p, end in enumerate(ends))
    return LookupLag(lookup.name, lookup_table(lookup), lookup.topic, up_to, at, ends, behind)


def lookup_lags(lake: Lake, config: PipelineConfig) -> tuple[list[LookupLag], str | None]:
    """Every lookup of the pipeline against its topic on Kafka, and why Kafka could not be asked
    (None: it was; the lags then leave ``behind`` out)."""
    ends: dict[str, list[int]] = {}
    error = None
    try:
        topics = sorted({lk.topic for lk in config.lookups.values()})
        ranges = offset_ranges(connect(config, lake.root), [config.topic(t) for t in topics])
        ends = {t: [high for _, high in r] for t, r in ranges.items()}
    except UserError as exc:
        error = str(exc)
    lags = [
        lookup_lag(lake, lk, ends.get(lk.topic) if error is None else None) for lk in config.lookups.values()
    ]
    return lags, error


def _record_position(lake: Lake, lookup: LookupSpec, covers: list[int]) -> None:
    at = datetime.now(UTC).isoformat(timespec="seconds")
    write_whole(lake.layout.lookup_position(lookup.name), json.dumps({"offsets": covers, "recorded_at": at}))


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
