"""Lookup tables and backfills.

A lookup is a compacted topic read as a table: ``<lookup>`` holds the latest value per key, tombstones
delete. It is refreshed incrementally from the topic's change feed; the last topic version applied is
recorded in the lookup table itself (a Delta ``txn`` of application ``lookup:<name>``), so a refresh is
exactly-once and a crash between writes is repaired by the next run.

A backfill loads a dump into the lookup's Kafka topic, producing only records that change something (a
new key, or a value different from the lookup's current one; JSON compared by content; with
``missing_only`` only new keys) in one Kafka transaction (idempotent
producer, ``acks=all``), with the partitioner of the topics the lookup is joined with unless told
otherwise; then it ingests the topic into bronze and refreshes the lookup. Bad lines go to the
``quarantine`` table.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from spark_jobs import partitioners
from spark_jobs.config import LookupSpec, PipelineConfig
from spark_jobs.dumps import parse_dump, read_lines
from spark_jobs.errors import UserError
from spark_jobs.ingest import ensure_bronze, kafka_records, sync_bronze
from spark_jobs.kafka import connect, partition_counts, produce
from spark_jobs.lake import Lake
from spark_jobs.system_tables import QUARANTINE, ensure_quarantine
from spark_jobs.topics import producing

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
    return f"lookup_{lookup.name}"


def ensure_lookup(lake: Lake, config: PipelineConfig, lookup: LookupSpec) -> None:
    ensure_bronze(lake, config.topics[lookup.topic])
    lake.create(lookup_table(lookup), LOOKUP_SCHEMA, description=f"latest value per key of {lookup.topic}")


def refresh_lookup(spark: SparkSession, lake: Lake, config: PipelineConfig, lookup: LookupSpec) -> int:
    """Apply the topic's records committed since the last refresh; returns the keys merged.
    One refresh of a lookup at a time (a backfill and a quality run may overlap)."""
    with lake.lock(f"lookup-{lookup.name}"):
        return _refresh_lookup(spark, lake, config, lookup)


def _refresh_lookup(spark: SparkSession, lake: Lake, config: PipelineConfig, lookup: LookupSpec) -> int:
    ensure_lookup(lake, config, lookup)
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


@dataclass
class BackfillSummary:
    lookup: str
    topic: str
    source: str
    partitioner: str
    dry_run: bool
    missing_only: bool = False  # changed keys are counted, not written (the topic may be newer)
    lines: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    duplicates: int = 0  # good lines whose key appears again later in the dump (the last one wins)
    rejected: int = 0
    written: int = 0
    topic_version: int | None = None
    seconds: float = 0.0
    rejects_sample: list[dict] | None = None

    def text(self) -> str:
        verb = "would write" if self.dry_run else "wrote"
        return (
            f"backfill {self.lookup} from {self.source} ({self.partitioner}): {self.lines:,} lines read, "
            f"{self.new:,} new keys, {self.changed:,} changed"
            + (
                " (not written: the topic may be newer than the dump)"
                if self.missing_only and self.changed
                else ""
            )
            + f", {self.unchanged:,} unchanged, "
            f"{self.duplicates:,} superseded duplicates, {self.rejected:,} rejected; {verb} "
            f"{self.written:,} records to {self.topic}"
            + (f" (version {self.topic_version})" if self.topic_version is not None else "")
            + f" in {self.seconds:.1f}s"
            + (" [dry run: nothing written]" if self.dry_run else "")
        )

    def as_dict(self) -> dict:
        return asdict(self)


def run_backfill(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    lookup_name: str,
    source: str | None = None,
    separator: str | None = None,
    partitioner: str | None = None,
    dry_run: bool = False,
    max_rejects: int = 0,
    missing_only: bool = False,
    log=print,
) -> BackfillSummary:
    """Produce the dump's keys that the lookup's topic lacks or holds with another value (only the
    lacking ones with ``missing_only``: what a scheduled run does, since the topic may hold a newer
    value than a dump exported earlier), then ingest the topic and refresh the lookup table."""
    started = time.perf_counter()
    lookup = config.lookup(lookup_name)
    topic = config.topics[lookup.topic]
    spec = lookup.backfill
    path = source or (str(spec.source) if spec.source else None)
    if path is None:
        raise UserError(f"lookup '{lookup.name}' declares no backfill source: give one with --from FILE")
    if not Path(path).is_file():
        raise UserError(f"{path}: no such file")
    chosen = partitioners.check_partitioner(partitioner or config.lookup_partitioner(lookup))
    summary = BackfillSummary(lookup.name, topic.name, str(path), chosen, dry_run, missing_only)

    cluster = connect(config, lake.root)
    if not dry_run:
        # catch up first: compare with the topic's real latest state
        sync_bronze(spark, lake, config, [topic.name], log=log)
        refresh_lookup(spark, lake, config, lookup)
    log(f"reading {path} ...")
    parsed = parse_dump(read_lines(spark, str(path)), spec, separator, topic.key_format, topic.value_format)
    parsed = parsed.persist()
    try:
        counts = parsed.agg(F.count("*").alias("lines"), F.count("reason").alias("rejected")).first()
        assert counts is not None  # an aggregate without grouping always has one row
        summary.lines, summary.rejected = int(counts["lines"]), int(counts["rejected"])
        current = _current_values(spark, lake, config, lookup, from_topic=dry_run)
        rejects = parsed.filter(F.col("reason").isNotNull())
        if summary.rejected:
            rejects = _name_plain_keys(rejects, current)
        sample = rejects.orderBy("line").limit(5).select("line", "reason", F.hex("raw").alias("raw_hex"))
        summary.rejects_sample = [r.asDict() for r in sample.collect()]
        good = parsed.filter(F.col("reason").isNull())
        last = good.groupBy("key").agg(F.max_by("value", "line").alias("value"), F.max("line").alias("line"))
        diff = (
            last.alias("d")
            .join(current.alias("c"), F.col("d.key") == F.col("c.key"), "left")
            .select(
                F.col("d.key").alias("key"),
                F.col("d.value").alias("value"),
                F.col("d.line").alias("line"),
                F.when(F.col("c.key").isNull(), "new")
                .when(
                    _comparable(F.col("c.value"), topic.value_format).eqNullSafe(
                        _comparable(F.col("d.value"), topic.value_format)
                    ),
                    "unchanged",
                )
                .otherwise("changed")
                .alias("change"),
            )
        )
        diff = diff.persist()
        by_change = {
            r["change"]: r["n"] for r in diff.groupBy("change").agg(F.count("*").alias("n")).collect()
        }
        summary.new = int(by_change.get("new", 0))
        summary.changed = int(by_change.get("changed", 0))
        summary.unchanged = int(by_change.get("unchanged", 0))
        summary.duplicates = (
            summary.lines - summary.rejected - summary.new - summary.changed - summary.unchanged
        )
        if summary.rejected > max_rejects:
            first = summary.rejects_sample[0] if summary.rejects_sample else {}
            raise UserError(
                f"{path}: {summary.rejected:,} rejected line(s), more than --max-rejects {max_rejects}; "
                f"nothing was written (first: line {first.get('line')}: {first.get('reason')})"
            )
        write = ["new"] if missing_only else ["new", "changed"]
        if dry_run:
            summary.written = summary.new + (0 if missing_only else summary.changed)
            summary.seconds = time.perf_counter() - started
            return summary
        to_write = diff.filter(F.col("change").isin(write)).orderBy("line").select("key", "value")
        records = to_write.toArrow()
        if records.num_rows:
            log(f"producing {records.num_rows:,} records to {cluster.topic(topic.name)} with {chosen} ...")
            with producing(lake, topic.name, log=log) as transactional_id:
                result = produce(
                    cluster,
                    topic,
                    [(records.column("key").combine_chunks(), records.column("value").combine_chunks())],
                    chosen,
                    transactional_id=transactional_id,
                )
            summary.written = result.records
        if summary.rejected:
            _quarantine(lake, f"backfill:{lookup.name}", rejects)
        if records.num_rows:
            sync_bronze(spark, lake, config, [topic.name], log=log)
            summary.topic_version = lake.version(topic.name)
        refresh_lookup(spark, lake, config, lookup)
        diff.unpersist()
    finally:
        parsed.unpersist()
    summary.seconds = time.perf_counter() - started
    return summary


def _name_plain_keys(rejects: DataFrame, current: DataFrame) -> DataFrame:
    """A line rejected for a key with invisible bytes (``"m2"``, ``m2 ``, a BOM) says which key of the
    topic it differs from only in them, when there is one: never matched silently, always named."""
    plain = rejects.select("plain_key").where(F.col("plain_key").isNotNull()).distinct()
    known = current.select(F.col("key").alias("plain_key")).join(F.broadcast(plain), "plain_key")
    named = rejects.join(known.withColumn("_known", F.lit(True)), "plain_key", "left")
    hint = F.concat(F.lit("; the topic has the key '"), F.col("plain_key").cast("string"), F.lit("'"))
    return named.withColumn(
        "reason", F.when(F.col("_known"), F.concat(F.col("reason"), hint)).otherwise(F.col("reason"))
    ).drop("_known")


def _comparable(value: Column, value_format: str) -> Column:
    """A topic value as the backfill compares it: JSON by content (key order, spacing and number
    spelling do not make a change), anything else by its bytes."""
    if value_format != "json":
        return value
    return F.coalesce(F.to_json(F.try_parse_json(value.cast("string"))).cast("binary"), value)


def _current_values(
    spark: SparkSession, lake: Lake, config: PipelineConfig, lookup: LookupSpec, from_topic: bool
) -> DataFrame:
    """The latest value per key: the refreshed lookup table, or (read-only, for dry runs) read from
    the Kafka topic itself with a Spark batch query."""
    if not from_topic:
        return lake.read(lookup_table(lookup)).select("key", "value")
    cluster = connect(config, lake.root)
    name = cluster.topic(lookup.topic)
    if name not in partition_counts(cluster, [name]):
        return spark.createDataFrame([], "key binary, value binary")
    records = kafka_records(spark, cluster, lookup.topic).withColumn("_commit_version", F.lit(0))
    return _latest_per_key(records, 0).filter(F.col("value").isNotNull()).select("key", "value")


def _quarantine(lake: Lake, job: str, rejects: DataFrame) -> None:
    ensure_quarantine(lake)
    rows = rejects.select(
        F.lit(str(uuid.uuid4())).alias("run_id"),
        F.lit(datetime.now(UTC)).alias("run_time"),
        F.lit(job).alias("job"),
        "source",
        "line",
        F.hex("raw").alias("raw_hex"),
        "reason",
    )
    lake.append(QUARANTINE, rows)
