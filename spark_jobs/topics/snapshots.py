"""Topics as they are now, and Spark reading them.

A :class:`Snapshot` holds the end offsets of some topics, taken at one moment as ``read_committed``
readers see them (each partition's last stable offset). A command that answers about a topic takes
one when it starts, reads the records up to it and says which offsets it answered for: ``lake
check`` (the quality suites), ``lake audit``, the diff of ``lake backfill``. So an answer never
comes from an older copy of a topic, and records produced while it runs do not change it.

:func:`records` reads a topic up to given offsets with Spark's Kafka source in a batch query;
:func:`stream` is that source as a stream (the joins read their topics with it, the ingest mirrors
them into bronze with it). Both give Spark's Kafka columns (:data:`RECORD_SCHEMA`): ``key``,
``value`` (null: a tombstone), ``topic`` (the Kafka name), ``partition``, ``offset``, ``timestamp``,
``timestampType`` and ``headers``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from spark_jobs.config import TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.formats import Formats
from spark_jobs.seams.kafka import Cluster, offset_ranges

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
RECORD_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", HEADER_TYPE),
    ]
)
COLUMNS = RECORD_SCHEMA.names
_DDL = (
    "key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)


@dataclass(frozen=True)
class Snapshot:
    """End offsets of declared topics at ``taken_at``: per topic, the offset after the last committed
    record of each partition (transaction markers take offsets too). A topic not on the cluster has
    no partitions and is listed in ``missing``."""

    taken_at: datetime
    ends: dict[str, tuple[int, ...]]
    missing: tuple[str, ...] = field(default=())

    def covers(self, topics: Iterable[str] | None = None) -> str:
        """``customer_consents up to offsets [3, 2, 5, 0]; ... (taken 2026-...Z)``: what an answer
        about these topics read."""
        names = list(self.ends) if topics is None else list(dict.fromkeys(topics))
        parts = [offsets_text(t, self.ends.get(t, ())) for t in names]
        return f"{'; '.join(parts)} (taken {self.taken_at.isoformat(timespec='seconds')})"

    def as_dict(self) -> dict[str, Any]:
        return {"taken_at": self.taken_at.isoformat(), "ends": {t: list(e) for t, e in self.ends.items()}}


def offsets_text(topic: str, ends: Sequence[int]) -> str:
    if not ends:
        return f"{topic} (not on the cluster)"
    return f"{topic} up to offsets [{', '.join(str(int(e)) for e in ends)}]"


def take(cluster: Cluster, specs: Iterable[TopicSpec]) -> Snapshot:
    """The topics' end offsets now. A topic whose partition count differs from its declaration is an
    error naming both (its keys would not be where the checks and joins expect them)."""
    specs = list(dict.fromkeys(specs))
    ranges = offset_ranges(cluster, specs)
    for spec in specs:
        have = len(ranges[spec.name])
        if have and have != spec.partitions:
            raise UserError(
                f"topic {cluster.topic(spec.name)} has {have} partitions on Kafka at "
                f"{cluster.bootstrap_servers} but the pipeline declares {spec.partitions} "
                f"(topics.{spec.name}.partitions)"
            )
    return Snapshot(
        datetime.now(UTC),
        {s.name: tuple(high for _, high in ranges[s.name]) for s in specs},
        tuple(s.name for s in specs if not ranges[s.name]),
    )


def records(spark: SparkSession, cluster: Cluster, spec: TopicSpec, ends: Sequence[int]) -> DataFrame:
    """The committed records of a topic from its beginning up to ``ends`` (the next offset per
    partition), as a Spark DataFrame of :data:`RECORD_SCHEMA`'s columns. Re-read from Kafka by every
    Spark action on it: persist it when it is read more than once."""
    if not any(ends):
        return spark.createDataFrame([], _DDL)
    name = cluster.topic(spec.name)
    until = {name: {str(p): int(end) for p, end in enumerate(ends)}}
    reader = (
        spark.read.format("kafka")
        .options(**cluster.spark_options())
        .option("subscribe", name)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", json.dumps(until))
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
    )
    return reader.load().select(*COLUMNS)


def stream(
    spark: SparkSession,
    cluster: Cluster,
    specs: Sequence[TopicSpec],
    starting: str = "earliest",
    max_records: int | None = None,
    headers: bool = False,
) -> DataFrame:
    """The topics' committed records as a stream (Spark's Kafka source subscribed to all of them;
    its checkpoint keeps each partition's next offset). ``starting`` is where a new checkpoint
    begins (``earliest``, or Spark's JSON of offsets); ``max_records`` caps the offsets one
    micro-batch reads (``maxOffsetsPerTrigger``). A record deleted by retention before it was read,
    or offsets that moved back (a topic deleted and created again), fail the query: nothing is
    skipped silently."""
    reader = (
        spark.readStream.format("kafka")
        .options(**cluster.spark_options())
        .option("subscribe", ",".join(cluster.topic(s.name) for s in specs))
        .option("startingOffsets", starting)
        .option("kafka.isolation.level", "read_committed")
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true" if headers else "false")
    )
    if max_records:
        reader = reader.option("maxOffsetsPerTrigger", max_records)
    frame = reader.load()
    return frame.select(*(COLUMNS if headers else [c for c in COLUMNS if c != "headers"]))


class SnapshotReader:
    """A snapshot's topics as Spark DataFrames for one command's many questions: each topic read from
    Kafka once (persisted until :meth:`close`), its record count, and its latest value per key."""

    def __init__(
        self,
        spark: SparkSession,
        cluster: Cluster,
        specs: dict[str, TopicSpec],
        snapshot: Snapshot,
        formats: Formats,
    ):
        self.spark, self.cluster, self.specs, self.snapshot = spark, cluster, specs, snapshot
        self.formats = formats  # the topics' codecs (spark_jobs.formats)
        self._frames: dict[str, DataFrame] = {}
        self._counts: dict[str, int] = {}

    def records(self, topic: str) -> DataFrame:
        """Every committed record of ``topic`` up to the snapshot."""
        if topic not in self._frames:
            frame = records(self.spark, self.cluster, self.specs[topic], self.snapshot.ends[topic])
            self._frames[topic] = frame.persist()
        return self._frames[topic]

    def keyed(self, topic: str) -> DataFrame:
        """The topic's records with keys, each with ``logical`` (the key the joins compare: a Schema
        Registry framed key decoded, else the key's bytes), ``key_id`` (the key's schema id, null
        when it is not framed) and ``key_problem`` (why a registry-format key does not decode)."""
        from pyspark.sql import functions as F

        from spark_jobs.formats import framing

        rows = self.records(topic).filter(F.col("key").isNotNull())
        codec = self.formats.codec(topic, "key")
        if not codec.registered:
            return rows.select(
                "*", F.col("key").alias("logical"), framing.schema_id(F.col("key")).alias("key_id"),
                F.lit(None).cast("string").alias("key_problem"),
            )  # fmt: skip
        codec.learn(rows, "key")
        problem = codec.problem(F.col("key"))
        return rows.select(
            "*",
            F.when(problem.isNull(), codec.key_bytes(F.col("key"))).otherwise(F.col("key")).alias("logical"),
            framing.schema_id(F.col("key")).alias("key_id"),
            problem.alias("key_problem"),
        )

    def count(self, topic: str) -> int:
        if topic not in self._counts:
            self._counts[topic] = self.records(topic).count()
        return self._counts[topic]

    def latest(self, topic: str) -> DataFrame:
        """The topic read as a table: per key its latest record (by timestamp, then offset), unless
        that is a tombstone (``key``, ``value``, ``partition``, ``offset``, ``timestamp``)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        newest = Window.partitionBy("key").orderBy(F.desc("timestamp"), F.desc("offset"), F.desc("partition"))
        rows = self.records(topic).filter(F.col("key").isNotNull())
        rows = rows.withColumn("__n", F.row_number().over(newest)).filter("__n = 1")
        return rows.filter(F.col("value").isNotNull()).select(
            "key", "value", "partition", "offset", "timestamp"
        )

    def close(self) -> None:
        for frame in self._frames.values():
            frame.unpersist()
        self._frames.clear()
