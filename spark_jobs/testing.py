"""Testing a pipeline file without a broker: ``PipelineTestDriver`` (Kafka Streams' TopologyTestDriver,
for this product's joins).

```python
from spark_jobs.testing import PipelineTestDriver

with PipelineTestDriver("pipeline.yaml", root=tmp_path) as d:   # one Spark session, no broker
    d.pipe("products", key="p1", value={"merchant_id": "m1"}, timestamp=1000)  # value=None: tombstone
    d.pipe("clicks", key=None, value={"page": "/"})   # key=None: a null key
    d.advance()                      # every join processes what was piped since the last advance
    d.changes("display_products")    # [Record(key, value, timestamp), ...] emitted by that advance
    d.changelog("display_products")  # [Record(key, value, timestamp), ...] it would publish to Kafka
    d.table("display_products")      # {key: value_dict} the result table now holds
    d.quarantined("display_products")  # [(topic[partition], offset, reason), ...] set aside by it
    d.dead_letters("display_products")  # [DeadLetter(key, value, headers), ...] (dead_letter_topic)
```

The driver runs each join as ``lake run`` does: a Spark streaming query of the join's plan
(``JoinJob.plan``: its state operator in Spark's state store) with ``foreachBatch(JoinJob.process)``
(:class:`JoinQuery`); only the Kafka ends are swapped. ``pipe`` stands in for a producer: at
``advance`` the piped records join their topic's in-memory log (:class:`TopicLog`: placed by the
topic's partitioner, offsets continuing per partition, as Kafka would), then each join gets everything
new on its inputs as one micro-batch, from an in-memory source instead of Kafka. A join's published
changelog is kept in memory instead of going to Kafka, and piped into its topic, so a join reading it
sees it at the next ``advance``; so are a join's dead letters (``dead_letter_topic``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from spark_jobs import checkpoints
from spark_jobs.config import PipelineConfig, RegistrySpec, TopicSpec, load_config
from spark_jobs.errors import UserError
from spark_jobs.formats import Codec, Formats, codec_class
from spark_jobs.joins import dead_letters
from spark_jobs.joins.engine import RECORD_FIELDS, BatchMetrics, Changelog, Inputs
from spark_jobs.layout import QUARANTINE
from spark_jobs.seams import partitioners
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.schema_registry import Registry
from spark_jobs.seams.storage import remove_tree


class Record(NamedTuple):
    """One output record: ``key`` (text; bytes when it is not UTF-8; None for a null key),
    ``value`` (the row's columns as a dict; None for a delete or tombstone) and ``timestamp``
    (epoch ms: the result's event time, as the changelog record carries it). A plain 3-tuple too:
    ``key, value, timestamp = record``."""

    key: str | bytes | None
    value: dict | None
    timestamp: int | None


RECORDS_SCHEMA = pa.schema(RECORD_FIELDS)  # key, value, timestamp, partition, offset


class TopicLog:
    """A topic's records kept in memory the way Kafka keeps them: each placed by the topic's
    partitioner, offsets continuing in each partition."""

    def __init__(self, spec: TopicSpec):
        self.spec = spec
        self._parts: list[pa.Table] = []
        self._next = np.zeros(spec.partitions, dtype=np.int64)

    def append(self, keys: pa.Array, values: pa.Array, timestamp_ms: int | np.ndarray = 0) -> pa.Table:
        """Add records (binary keys and values, null value = tombstone) in order; returns them with
        their partitions and offsets."""
        part = partitioners.partitions(keys, self.spec.partitions, self.spec.partitioner)
        offsets = np.empty(len(part), dtype=np.int64)
        for p in range(self.spec.partitions):
            mask = part == p
            offsets[mask] = np.arange(self._next[p], self._next[p] + int(mask.sum()))
            self._next[p] += int(mask.sum())
        stamps = np.broadcast_to(np.asarray(timestamp_ms, dtype=np.int64) * 1000, (len(keys),))
        rows = pa.table(
            {
                "key": keys.cast(pa.binary()),
                "value": values.cast(pa.binary()),
                "timestamp": pa.array(stamps).cast(RECORDS_SCHEMA.field("timestamp").type),
                "partition": pa.array(part, pa.int32()),
                "offset": pa.array(offsets, pa.int64()),
            },
            schema=RECORDS_SCHEMA,
        )
        self._parts.append(rows)
        return rows

    @property
    def rows(self) -> pa.Table:
        return pa.concat_tables(self._parts) if self._parts else RECORDS_SCHEMA.empty_table()

    def ends(self) -> np.ndarray:
        """The next offset of each partition."""
        return self._next.copy()


class MemoryInputs(Inputs):
    """A :class:`JoinQuery`'s inputs: how far each micro-batch has read is what had been fed to the
    query by then (per side and partition, the offset after the last record fed); how far the
    topics go is ``ends`` (the caller's records)."""

    def __init__(self, ends: Callable[[TopicSpec], np.ndarray]):
        self._ends = ends
        self.fed: dict[str, dict[int, int]] = {}  # side -> partition -> next offset, of all rows fed
        self._by_batch: dict[int, dict[str, np.ndarray]] = {}

    def feeding(self, rows: pa.Table) -> None:
        for side, p, o in zip(
            rows["side"].to_pylist(), rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True
        ):
            read = self.fed.setdefault(side, {})
            read[p] = max(read.get(p, 0), o + 1)

    def read_to(self, batch_id: int) -> dict[str, np.ndarray]:
        if batch_id not in self._by_batch:  # a replayed batch read what it read the first time
            self._by_batch[batch_id] = {
                side: np.array([read.get(p, 0) for p in range(max(read, default=-1) + 1)], dtype=np.int64)
                for side, read in self.fed.items()
            }
        return self._by_batch[batch_id]

    def ends(self, topic: TopicSpec) -> np.ndarray:
        return self._ends(topic)


# the records a join's plan reads: both topics' records with the side they come from
RECORDS = "side string, key binary, value binary, timestamp timestamp, partition int, offset long"


class JoinQuery:
    """One join run as ``lake run`` runs it, a streaming query of ``JoinJob.plan`` with
    ``foreachBatch(JoinJob.process)`` and a checkpoint of its own, over an in-memory source
    the caller feeds instead of the topics. :meth:`feed` hands it records as one micro-batch."""

    def __init__(
        self,
        spark: Any,
        lake: Lake,
        config: PipelineConfig,
        name: str,
        query_id: str,
        ends: Callable[[TopicSpec], np.ndarray] | None = None,
        formats: Formats | None = None,
    ):
        """``ends(topic)``: how far the caller's records of a topic go (the next offset of each
        partition), which the stream kinds compare with what they have read; ``formats``: the
        records' codecs (by default the pipeline's)."""

        from pyspark.sql import DataFrame

        from spark_jobs.joins.registry import job_for

        self.spark, self.lake, self.name = spark, lake, name
        self.job = job_for(spark, lake, config, config.join(name), query_id, formats=formats)
        self.inputs = MemoryInputs(ends or (lambda topic: np.zeros(topic.partitions, dtype=np.int64)))
        self.job.inputs = self.inputs
        self.checkpoint = lake.layout.driver_checkpoint(name)
        remove_tree(self.checkpoint)  # the source starts empty: so does the query
        empty = spark.createDataFrame([], RECORDS)
        self._columns = empty.columns
        schema = spark._jsparkSession.parseDataType(empty.schema.json())
        self._source = spark._jvm.lake.joins.MemorySource(spark._jsparkSession, schema)
        self._frame = DataFrame(self._source.frame(), spark)
        self._query: Any = None
        self._error: BaseException | None = None
        self.metrics: BatchMetrics | None = None  # of the last micro-batch
        self.batch_id = -1  # of the last micro-batch

    def _batch(self, frame: Any, batch_id: int) -> None:
        try:
            self.metrics = self.job.process(frame, batch_id)
            self.batch_id = batch_id
        except BaseException as exc:
            self._error = exc
            raise

    def start(self) -> None:
        """Start the query (again after a failure: Spark reruns the batch that did not commit)."""
        for other in self.spark.streams.active:  # a query of the same join from an earlier driver
            if other.name == f"test_{self.name}":
                other.stop()
        writer = self.job.plan(self._frame).writeStream.queryName(f"test_{self.name}")
        writer = writer.foreachBatch(self._batch).option("checkpointLocation", str(self.checkpoint))
        self._query = writer.start()

    def feed(self, rows: pa.Table) -> BatchMetrics | None:
        """Process ``rows`` (``side`` and the record columns) as the next micro-batch; returns its
        metrics. A failure in the batch is raised as itself and stops the query."""
        from spark_jobs.seams.session import arrow_frame

        if self._query is None or not self._query.isActive:
            self.start()
        self.inputs.feeding(rows)
        self._source.add(arrow_frame(self.spark, rows.select(self._columns))._jdf)
        self._wait()
        return self.metrics

    def restart(self) -> BatchMetrics | None:
        """Start the stopped query again and wait until it has caught up (the replay of a batch
        that failed, as after a crash)."""
        self.start()
        self._wait()
        return self.metrics

    def replay_last(self) -> BatchMetrics | None:
        """Run the last committed micro-batch again, as Spark does after a crash between the batch's
        writes and its entry in the checkpoint's commit log."""
        self.stop()
        checkpoints.forget_commit(self.checkpoint, self.batch_id)
        return self.restart()

    def _wait(self) -> None:
        from pyspark.errors import StreamingQueryException

        self._error = None
        try:
            self._query.processAllAvailable()
        except StreamingQueryException as exc:
            error, self._error = self._error, None
            if error is not None:
                raise error from None
            raise RuntimeError(f"join {self.name}: {str(exc).strip().splitlines()[0]}") from exc

    def stop(self) -> None:
        if self._query is not None:
            self._query.stop()
        self.job.flush_metrics()


def _encode(value: Any, what: str, codec: Codec) -> bytes | None:
    try:
        return codec.encode_given(value)
    except ValueError as exc:
        raise UserError(f"{what}: {exc}") from None


def _key_out(key: bytes | None) -> str | bytes | None:
    """A key as the driver gives it back: text, or the bytes themselves when they are not UTF-8."""
    if key is None:
        return None
    try:
        return key.decode()
    except UnicodeDecodeError:
        return key


def _text(key: bytes | str | None) -> str:
    if key is None:
        return "null"
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else key


def _event_ms(row: dict, times: tuple[str, ...]) -> int | None:
    """A result row's event time in epoch ms: the latest of its ``times`` columns (None: none set)."""
    stamps = [row[c] for c in times if row[c] is not None]
    return int(max(stamps).timestamp() * 1000) if stamps else None


class _MemoryChangelog(Changelog):
    """A join's changelog kept by the driver (``PipelineTestDriver.changelog``) instead of Kafka."""

    def __init__(self, out: dict[str, list[Record]], join: str, codec: Codec):
        self.out = out.setdefault(join, [])
        self.tags: set[bytes] = set()
        self.codec = codec  # the changelog's values: JSON, or a registry format's framed records

    def send(self, records: Any, tag: bytes, may_be_sent: bool, order: Any = ()) -> int:
        if may_be_sent and tag in self.tags:
            return 0
        # in ``order``, else the upserts then the tombstones, each in key order (as a test expects them)
        sort = [F.col(c) for c in order] or [F.col("v").isNull(), F.col("key")]
        rows = records.orderBy(*sort).select("key", "v", "ts").collect()
        self.tags.add(tag)
        self.out.extend(
            Record(_key_out(r.key), None if r.v is None else self.codec.decode(bytes(r.v)), r.ts)
            for r in rows
        )
        return len(rows)


class DeadLetter(NamedTuple):
    """A record a join wrote to its dead-letter topic: the dropped record's ``key`` and ``value``
    bytes, and its ``headers`` (``__streams.errors.topic``, ``.partition``, ``.offset``,
    ``.exception``: the reason in one word, ``.message``; ``lake.join``, ``lake.batch``)."""

    key: bytes | None
    value: bytes | None
    headers: dict[str, str]


class _MemoryDeadLetters(dead_letters.DeadLetters):
    """A join's dead letters kept by the driver (``PipelineTestDriver.dead_letters``) instead of Kafka."""

    def __init__(self, out: dict[str, list[DeadLetter]], join: str):
        self.out = out.setdefault(join, [])
        self.join = join
        self.tags: set[bytes] = set()

    def send(self, rows: pa.Table, tag: bytes, may_be_sent: bool) -> int:
        if may_be_sent and tag in self.tags:
            return 0
        self.tags.add(tag)
        keys, values, heads = dead_letters.records(rows, self.join, tag)
        for key, value, head in zip(keys.to_pylist(), values.to_pylist(), heads, strict=True):
            self.out.append(DeadLetter(key, value, {k: v.decode() for k, v in head}))
        return rows.num_rows


def _formats(config: PipelineConfig, lake: Lake) -> Formats:
    """The pipeline's codecs with an in-process registry (``mock://``): each Schema Registry topic's
    schema file registered under its subject, as Kafka Streams' tests use a mock registry."""
    import uuid

    registry = Registry(
        RegistrySpec(f"mock://pipeline-test-driver-{uuid.uuid4().hex}"), "the pipeline test driver"
    )
    formats = Formats(config, lake.root, lambda name: name, registry)
    changelogs = {join.publish for join in config.joins.values()}  # their schemas are derived
    for topic, spec in config.topics.items():
        for part in ("key", "value"):
            fmt = spec.format_of(part)
            if not codec_class(fmt).registered or topic in changelogs:
                continue
            if spec.schema_file_of(part) is None:
                raise UserError(
                    f"topics.{topic}.{part}: the test driver reads {fmt} schemas from files, and this "
                    f"topic names none: give {part}: {{format: {fmt}, schema: FILE}}"
                )
            formats.writing(topic, part, None)
    return formats


class PipelineTestDriver:
    """A pipeline's joins driven record by record, in one Spark session, without Kafka."""

    def __init__(self, pipeline: str | Path, root: str | Path, spark: Any = None):
        from spark_jobs.seams.session import get_spark

        self.config: PipelineConfig = load_config(pipeline)
        self.lake = Lake(root)
        self.spark = spark or get_spark(app_name="pipeline-test-driver", root=self.lake.root)
        self.formats = _formats(self.config, self.lake)
        self._piped: dict[str, list[tuple[bytes | None, bytes | None, int]]] = {}
        self._clock = 0  # the timestamp of a record piped without one: the latest seen
        self._logs: dict[str, TopicLog] = {}  # topic -> what was piped into it, as Kafka would keep it
        self._seen: dict[tuple[str, str], np.ndarray] = {}  # (join, topic): next offset per partition
        self._changes: dict[str, list[Record]] = {}
        self._changelog: dict[str, list[Record]] = {}
        self._dead_letters: dict[str, list[DeadLetter]] = {}
        self._ran: dict[str, int] = {}  # join -> its last micro-batch, when the last advance ran one
        self.queries: dict[str, JoinQuery] = {}
        for name in self.config.joins:
            query = JoinQuery(
                self.spark, self.lake, self.config, name, f"test-driver-{name}", self._ends, self.formats
            )
            publish = self.config.join(name).publish
            if publish:
                codec = self.formats.codec(publish, "value")
                query.job.changelog = _MemoryChangelog(self._changelog, name, codec)
            if self.config.join(name).dead_letter_topic:
                query.job.dead_letters = _MemoryDeadLetters(self._dead_letters, name)
            self.queries[name] = query

    def _log(self, topic: str) -> TopicLog:
        if topic not in self._logs:
            self._logs[topic] = TopicLog(self.config.topic(topic))
        return self._logs[topic]

    def _ends(self, topic: TopicSpec) -> np.ndarray:
        return self._log(topic.name).ends()

    def __enter__(self) -> PipelineTestDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the joins' queries (the Spark session is shared, the lake stays for inspection)."""
        for query in self.queries.values():
            query.stop()

    # --- input ------------------------------------------------------------------------------------
    def pipe(self, topic: str, key: str | bytes | None, value: Any, timestamp: int | None = None) -> None:
        """Hand one record to ``topic`` (declared in the pipeline): ``key`` text (UTF-8), bytes (as
        they are) or None (a null key: placed round-robin, as a producer does); ``value`` a dict
        (JSON), str or bytes, or None for a tombstone; ``timestamp`` in epoch ms (default: the
        latest piped)."""
        self.config.topic(topic)  # an unknown topic is a clear error
        if timestamp is None:
            timestamp = self._clock
        self._clock = max(self._clock, timestamp)
        what = f"topic {topic}, key {_text(key)}"
        raw_key = _encode(key, what, self.formats.codec(topic, "key"))
        encoded = _encode(value, what, self.formats.codec(topic, "value"))
        self._piped.setdefault(topic, []).append((raw_key, encoded, int(timestamp)))

    def advance(self) -> None:
        """Add what was piped to its topics, then run every join once on everything new on its
        inputs (one micro-batch each, in the pipeline's order)."""
        piped, self._piped = self._piped, {}
        for topic, records in piped.items():
            keys = pa.array([k for k, _, _ in records], pa.binary())
            values = pa.array([v for _, v, _ in records], pa.binary())
            stamps = np.array([t for _, _, t in records], dtype=np.int64)
            self._log(topic).append(keys, values, stamps)
        self._changes, self._ran = {}, {}
        for published in self._changelog.values():
            published.clear()
        for letters in self._dead_letters.values():
            letters.clear()
        for name, query in self.queries.items():
            spec = self.config.join(name)
            before = self.lake.version(name) if self.lake.exists(name) else None
            parts = []
            for side, topic in spec.sides:
                new = self._unread(name, topic)
                parts.append(new.add_column(0, "side", pa.array([side] * new.num_rows, pa.string())))
            rows = pa.concat_tables(parts)
            if rows.num_rows:
                query.feed(rows)
                self._ran[name] = query.batch_id
            self._changes[name] = self._emitted(name, before)
        for name, published in self._changelog.items():  # read by the joins downstream, next time
            for key, value, timestamp in published:
                self.pipe(str(self.config.join(name).publish), key, value, timestamp)

    def _unread(self, join: str, topic: str) -> pa.Table:
        """The records of ``topic`` that ``join`` has not read yet, in partition and offset order."""
        spec = self.config.topic(topic)
        rows = self._log(topic).rows
        seen = self._seen.setdefault((join, topic), np.zeros(spec.partitions, dtype=np.int64))
        if rows.num_rows:
            start = pa.array(seen[rows["partition"].to_numpy(zero_copy_only=False)])
            rows = rows.filter(pc.greater_equal(rows["offset"], start))
        rows = rows.sort_by([("partition", "ascending"), ("offset", "ascending")])
        for p, o in zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True):
            seen[p] = max(seen[p], o + 1)
        return rows

    def _emitted(self, name: str, before: int | None) -> list[Record]:
        if not self.lake.exists(name) or self.lake.version(name) == before:
            return []
        feed = self.lake.changes_arrow(name, 0 if before is None else before + 1)
        columns = self._value_columns(name)
        times = self._time_columns(name)
        out: list[Record] = []
        for row in feed.to_pylist():
            change = row["_change_type"]
            if change == "update_preimage":
                continue
            value = None if change == "delete" else {c: row[c] for c in columns}
            out.append(Record(_key_out(row["key"]), value, _event_ms(row, times)))
        return out

    def _time_columns(self, name: str) -> tuple[str, ...]:
        """The result columns whose latest is a row's event time."""
        return self.queries[name].job.time_columns

    def _value_columns(self, name: str) -> list[str]:
        """The result's columns besides its meta columns (the engine knows them: no table read)."""
        meta = set(self.config.join(name).join_kind.meta_columns)
        return [c for c in self.queries[name].job.result_schema.names if c not in meta]

    # --- output -----------------------------------------------------------------------------------
    def changes(self, join: str) -> list[Record]:
        """The changes the last ``advance`` made to the join's result table, in order: a
        :class:`Record` (key, the row's value columns, its timestamp) for an upsert or an appended
        event, (key, None, the deleted row's timestamp) for a delete."""
        self.config.join(join)
        return list(self._changes.get(join, []))

    def changelog(self, join: str) -> list[Record]:
        """What the last ``advance`` would have published to the join's changelog topic (joins with
        ``publish``), in order: :class:`Record` (key, the value decoded, the record's timestamp), the
        value None for a tombstone (its timestamp: the deleting record's)."""
        if not self.config.join(join).publish:
            raise UserError(f"join {join} does not publish a changelog (set publish: true in the pipeline)")
        return list(self._changelog.get(join, []))

    def dead_letters(self, join: str) -> list[DeadLetter]:
        """What the last ``advance`` would have written to the join's dead-letter topic (joins with
        ``dead_letter_topic``): every record it did not use, as :class:`DeadLetter`."""
        if not self.config.join(join).dead_letter_topic:
            raise UserError(
                f"join {join} has no dead-letter topic (set dead_letter_topic: NAME in the pipeline)"
            )
        return list(self._dead_letters.get(join, []))

    def quarantined(self, join: str) -> list[tuple[str, int, str]]:
        """The records the last ``advance`` quarantined for ``join`` (a record that is not JSON, a
        null key, a record its ``select`` failed on): (topic[partition], offset, reason)."""
        self.config.join(join)
        if not self.lake.exists(QUARANTINE):
            return []
        if join not in self._ran:
            return []
        rows = self.lake.read_arrow(QUARANTINE, columns=["run_id", "source", "line", "reason"])
        run = f"test-driver-{join}:{self._ran[join]}"
        return [(r["source"], r["line"], r["reason"]) for r in rows.to_pylist() if r["run_id"] == run]

    def table(self, join: str) -> dict[str | bytes | None, dict]:
        """The join's result table now: key -> the row's value columns (for stream kinds, whose
        result is a log of events, the latest event per key by its time)."""
        self.config.join(join)
        if not self.lake.exists(join):
            return {}
        columns = self._value_columns(join)
        times = self._time_columns(join)
        rows = self.lake.read_arrow(join).to_pylist()
        rows.sort(key=lambda r: _event_ms(r, times) or 0)  # the latest wins
        return {_key_out(r["key"]): {c: r[c] for c in columns} for r in rows}
