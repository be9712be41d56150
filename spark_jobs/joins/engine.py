"""The join engine: incremental maintenance of a join result, one micro-batch at a time.

A join runs as a Spark streaming query: ``JoinJob.plan`` over both topics' records (validation, and
for most kinds their state operator in Spark's state store), then ``foreachBatch(JoinJob.process)``.
One module per kind (``table``, ``fk``, ``lists``, ``derive``, ``stream_table``, ``stream_stream``)
holds its engine class, and ``registry`` maps each kind of ``kinds.KINDS`` to it. Each micro-batch:

1. validates the records (null key, a json topic's value that is not a JSON object: quarantined);
2. applies them to the state (``state_store``: the Java operators of table, fk, list and derive;
   ``streams``: the stream kinds' event buffers and right-side history, in Delta tables);
3. finds the affected result keys / the events that can be decided now, recomputes exactly those, and
   merges (keyed results, on the executors: ``state_store``) or appends (stream kinds) them into the
   result;
4. publishes the result's changes as a topic when configured (the keyed kinds: every key the batch
   answered, before the result's commit), and records a metrics row (buffered:
   ``join_metrics`` gets the rows every ``METRICS_FLUSH_SECONDS`` and when the job stops).

This module holds what every kind shares: the projection (``select`` with Spark), the diff against
the result (the driver's pass of a batch with a poison pill), publishing, quarantine and metrics.

Exactly-once: every commit carries the Delta transaction ``(query id, batch id)``, so a replayed batch
(Spark replays the last one after a crash) skips every commit that already happened; the commits of a
batch are ordered so that whatever is recomputed on replay equals what the first attempt computed
(Spark's state store is versioned per batch: a replay starts from the version before it). Decisions
that depend on the world outside the batch (has the right side caught up?) are recorded by the
batch's first commit and reused on replay."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema
from pyspark.sql.utils import AnalysisException

from spark_jobs import faults
from spark_jobs.config import JoinSpec, PipelineConfig, TopicSpec
from spark_jobs.errors import UserError, spark_error
from spark_jobs.formats import Codec, Formats
from spark_jobs.joins import dropped
from spark_jobs.joins.dead_letters import DeadLetters, KafkaDeadLetters
from spark_jobs.joins.poison import Guarded, fails, guarded
from spark_jobs.layout import former_pending_table, join_table
from spark_jobs.runtime.profile import Phases
from spark_jobs.seams import fences
from spark_jobs.seams.delta import Lake, conform
from spark_jobs.seams.kafka import (
    Cluster,
    connect,
    ensure_topics,
    forget_publishers,
    producer_id,
    publish_frame,
    topic_ids,
)
from spark_jobs.seams.session import arrow_frame
from spark_jobs.system_tables import (
    JOIN_METRICS,
    JOIN_METRICS_SCHEMA,
    QUARANTINE,
    QUARANTINE_SCHEMA,
    ensure_join_metrics,
    ensure_quarantine,
)

TS = pa.timestamp("us", tz="UTC")
RECORD_FIELDS = [
    ("key", pa.binary()),
    ("value", pa.binary()),  # null = tombstone
    ("timestamp", TS),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
]
RECORD_COLUMNS = [name for name, _ in RECORD_FIELDS]
PUBLISHED = "__published"  # a projection's rows as the changelog's records (Projection.apply)
# join_metrics is appended at most this often (and when the job stops): a Delta commit per micro-batch
# for a row of counters would cost as much as the batch's result write. A continuous run appends them
# between micro-batches (spark_jobs.joins.runner); a micro-batch does only when they are this many
# intervals overdue (a stream that never idles)
METRICS_FLUSH_SECONDS = 30.0
OVERDUE = 4


@dataclass
class BatchMetrics:
    input_left: int = 0
    input_right: int = 0
    quarantined: int = 0
    ignored: int = 0
    skipped: int = 0  # stream kinds: null-key records their join type drops (KIP-962)
    affected_keys: int = 0
    upserted: int = 0
    deleted: int = 0
    appended: int = 0
    pending: int = 0
    null_keys: int = 0
    elements_joined: int = 0
    elements_retracted: int = 0
    elements_kept: int = 0
    published: int = 0  # records sent to the changelog topic (upserts and tombstones)
    # result rows answered (keyed: live rows; stream kinds: events) with both sides' records, or not
    # (table, fk and the stream kinds; not join_metrics columns)
    matched: int = 0
    unmatched: int = 0
    # the records the join did not use, by reason (spark_jobs.joins.dropped; not a join_metrics column)
    dropped: Counter[str] = field(default_factory=Counter)
    # where the batch's time went (the kinds that time their phases; not a join_metrics column)
    phases: Phases = field(default_factory=Phases)

    def text(self) -> str:
        text = (
            f"in {self.input_left}+{self.input_right}, quarantined {self.quarantined}, "
            f"affected {self.affected_keys}, upserted {self.upserted}, deleted {self.deleted}, "
            f"appended {self.appended}, pending {self.pending}"
        )
        if self.null_keys:
            text += f", null key {self.null_keys}"
        if self.skipped:
            text += f", skipped {self.skipped} (null key)"
        if self.elements_joined or self.elements_retracted or self.elements_kept:
            text += (
                f", elements joined {self.elements_joined}, retracted {self.elements_retracted}, "
                f"kept {self.elements_kept}"
            )
        return text


@dataclass(frozen=True)
class SideCodecs:
    """The record formats of a join's inputs by side (``left``, ``right``): their keys' and their
    values' codecs (:mod:`spark_jobs.formats`)."""

    keys: dict[str, Codec]
    values: dict[str, Codec]

    @classmethod
    def of(cls, formats: Formats, spec: JoinSpec) -> SideCodecs:
        return cls(
            {side: formats.codec(topic, "key") for side, topic in spec.sides},
            {side: formats.codec(topic, "value") for side, topic in spec.sides},
        )


class Projection:
    """``select`` evaluated by Spark over ``left`` / ``right`` built from the record values, as each
    side's value codec decodes them: a json topic's value becomes ``map<string,string>``
    (``left.email``; nested objects stay JSON text), a string topic's ``struct<value>``
    (``left.value``), a registry format's the typed record (``left.consents.retargeter2``). A missing
    side is null.
    """

    def __init__(self, spark: SparkSession, codecs: SideCodecs, spec: JoinSpec):
        self.spark = spark
        self.spec = spec
        self.meta = list(spec.join_kind.meta_columns)
        self.codecs = codecs.values
        empty = pa.table(
            {
                **{c: pa.array([], _meta_type(c)) for c in self.meta},
                **{f"{side}_value": pa.array([], pa.binary()) for side in self.codecs},
            }
        )
        self.output_schema = self._check(empty)

    def _side(self, side: str) -> Any:
        return self.codecs[side].column(F.col(f"{side}_value"))

    def _frame(self, rows: pa.Table | DataFrame) -> DataFrame:
        df = arrow_frame(self.spark, rows) if isinstance(rows, pa.Table) else rows
        return df.select(*self.meta, *[self._side(side).alias(side) for side in self.codecs])

    def frame(self, rows: DataFrame) -> DataFrame:
        """The result's columns of a Spark DataFrame of meta columns, ``left_value``, ``right_value``."""
        return self._frame(rows).selectExpr(*self.meta, *self._exprs())

    def _exprs(self) -> list[str]:
        return [f"({expr}) AS `{col}`" for col, expr in self.spec.select.items()]

    def _check(self, empty: pa.Table) -> pa.Schema:
        frame = self._frame(empty)
        for col, expr in self.spec.select.items():
            try:
                _ = frame.selectExpr(f"({expr}) AS `{col}`").schema  # analysis happens here
            except AnalysisException as exc:  # ParseException is one
                raise UserError(f"{self.spec.where[col]}: {spark_error(exc)}") from None
        schema = to_arrow_schema(frame.selectExpr(*self.meta, *self._exprs()).schema, timezone="UTC")
        return pa.schema([f.with_nullable(True) for f in schema])  # a delete carries nulls

    def apply(self, rows: pa.Table, publish: Callable[[Any], Any] | None = None) -> pa.Table:
        """Rows with the meta columns, ``left_value`` and ``right_value`` -> the result's columns (and
        with ``publish``, the job's changelog writer, ``__published``: the select columns as the
        changelog's record)."""
        if rows.num_rows == 0:
            out = self.output_schema.empty_table()
            return out.append_column(PUBLISHED, pa.array([], pa.binary())) if publish else out
        frame = self._frame(rows).selectExpr(*self.meta, *self._exprs())
        if publish:
            cols = [F.col(f"`{c}`") for c in self.spec.select]
            frame = frame.withColumn(PUBLISHED, publish(F.struct(*cols)))
        out = frame.toArrow()
        schema = (
            self.output_schema.append(pa.field(PUBLISHED, pa.binary())) if publish else self.output_schema
        )
        return conform(out, schema, f"join {self.spec.name}")


def _meta_type(column: str) -> pa.DataType:
    if column.endswith("key"):
        return pa.binary()
    if column.endswith("timestamp"):
        return TS
    if column.endswith("partition"):
        return pa.int32()
    return pa.int64()


def side_records(frame: DataFrame, side: str) -> DataFrame:
    """A topic's records as the engine takes them: ``side`` (left | right) and the record columns."""
    return frame.select(F.lit(side).alias("side"), *RECORD_COLUMNS)


def prepare(frame: DataFrame, codecs: SideCodecs, null_key_sides: tuple[str, ...] = ()) -> DataFrame:
    """Add ``reason`` (why a record goes to quarantine, else null: a null key, a key or value its
    codec cannot decode) to a batch of both topics' records (``side``, ``key``, ``value``,
    ``timestamp``, ``partition``, ``offset``), and make ``key`` the logical key the join compares (a
    Schema Registry framed key decoded: the same key framed or plain is one key). A null key on a
    side of ``null_key_sides`` (a stream join's streams: KIP-962) is an event, not a fault."""
    key, value, side = F.col("key"), F.col("value"), F.col("side")
    streams = side.isin(*null_key_sides) if null_key_sides else F.lit(False)
    reason = F.when(key.isNull() & ~streams, F.lit("null key"))
    for name in codecs.keys:
        reason = reason.when((side == name) & codecs.keys[name].problem(key).isNotNull(), F.concat(
            F.lit("key: "), codecs.keys[name].problem(key)
        ))  # fmt: skip
        reason = reason.when(
            (side == name) & codecs.values[name].problem(value).isNotNull(),
            codecs.values[name].problem(value),
        )
    logical = key
    for name, codec in codecs.keys.items():
        if codec.registered:
            logical = F.when(side == name, codec.key_bytes(key)).otherwise(logical)
    return frame.select("side", logical.alias("key"), *RECORD_COLUMNS[1:], reason.alias("reason"))


class JoinJob:
    """One join's engine: ``process(frame, batch_id)`` per micro-batch (``foreachBatch``)."""

    # A result keyed like the left topic publishes a tombstone for every left delete (a tombstone
    # after a live value), also when the result held nothing for that key (an inner join without a
    # match), as Kafka Streams' foreign-key join does; a tombstone for a key not live is not sent.
    tombstones_follow_left = True
    # The kind's state is in Spark's state store, under the query's checkpoint (not in Delta tables).
    state_in_checkpoint = False
    # The changelog is the projection's rows with ``__published`` (the stream kinds' events); the state-store
    # kinds publish the rows their operator answered instead.
    publishes_projection = True
    # The result's columns whose latest is a row's event time, the changelog record's timestamp (as
    # Kafka Streams gives a join result: a keyed result's ``timestamp``, its inputs' latest value time;
    # a stream-table result's, its event's; a stream-stream pair's, the later of its two records').
    time_columns: tuple[str, ...] = ("timestamp",)
    # The sides whose records are events that may have a null key (KIP-962: a stream join's streams);
    # elsewhere a null key cannot be stored by key and the record is quarantined, as Kafka drops it.
    null_key_sides: tuple[str, ...] = ()

    @staticmethod
    def expected(
        spark: SparkSession,
        lake: Lake,
        config: PipelineConfig,
        spec: JoinSpec,
        left: DataFrame,
        right: Any,  # None for a kind without a right topic (derive)
        codecs: SideCodecs,
    ) -> tuple[DataFrame, Callable[[DataFrame], DataFrame]]:
        """The kind's oracle (:mod:`spark_jobs.joins.oracle`): from the topics' valid records per side
        (the left with what the kind reads from it: ``by``, ``items``, ``ids``), the joined rows as a
        plain batch join would give them, and the projection (with the inputs' ``codecs``) that makes
        them result rows. Every kind writes its own; a kind without one is an error, never another
        kind's."""
        raise NotImplementedError(f"join kind {spec.kind} has no oracle")

    @classmethod
    def state_tables(cls, spec: JoinSpec) -> dict[str, pa.Schema]:
        """The job-owned tables of a join besides its result, with their schemas."""
        return cls._kind_tables(spec)

    @classmethod
    def _kind_tables(cls, spec: JoinSpec) -> dict[str, pa.Schema]:  # noqa: ARG003 (kinds override)
        return {}  # a state-store kind keeps its state under the query's checkpoint

    def __init__(
        self,
        spark: SparkSession,
        lake: Lake,
        config: PipelineConfig,
        spec: JoinSpec,
        query_id: str | Callable[[], str],
        log: Callable[[str], None] = lambda _: None,
        formats: Formats | None = None,
    ):
        self.spark, self.lake, self.config, self.spec, self.log = spark, lake, config, spec, log
        self._query_id = query_id
        self.formats = formats or Formats(config, lake.root)
        self.codecs = SideCodecs.of(self.formats, spec)
        self.projection = self._projection()
        self.result_schema = self.projection.output_schema
        # the changelog's records from the result's struct of select columns (None: no changelog)
        self.publish_value = self._publisher()
        self.tables = self.state_tables(spec)
        adopt_former_names(lake, spec, self.tables, log)
        self._quarantined: list[pa.Table] = []  # the batch's quarantine rows (written once, at its end)
        self._last_batch: int | None = None  # the last batch this process started (None: none yet)
        self._replay = True  # the batch in progress may be a replay (the first after a (re)start)
        self._publishing: bytes | None = None  # the tag of the last batch whose publish started
        self._sent = 0  # changelog records the batch in progress has sent
        self._metric_rows: list[dict[str, Any]] = []  # not yet in join_metrics
        self._metrics_flushed = time.monotonic()
        # where the changelog goes (spark_jobs.testing's driver keeps it in memory instead of Kafka)
        self.changelog: Changelog = KafkaChangelog(self)
        # where the dropped records also go (dead_letter_topic; the test driver keeps them in memory)
        self.dead_letters: DeadLetters | None = (
            KafkaDeadLetters(config, lake.root, spec) if spec.dead_letter_topic else None
        )
        # how far the inputs go (asked by the stream kinds): the runner's Kafka, or a test's records
        self.inputs: Inputs | None = None
        self._create_tables()

    # --- setup ------------------------------------------------------------------------------
    def _create_tables(self) -> None:
        for name, schema in self.tables.items():
            self.lake.create(name, schema, change_feed=False, description=f"state of join {self.spec.name}")
        ensure_quarantine(self.lake)
        ensure_join_metrics(self.lake)
        self.lake.create(self.spec.name, self.result_schema, description=f"result of join {self.spec.name}")
        existing = self.lake.schema(self.spec.name)
        required = [f.name for f in existing if not f.nullable]
        if required:  # written before results were nullable: a delete's row of nulls would not fit
            table = f"delta.`{self.lake.uri(self.spec.name)}`"
            for column in required:
                self.spark.sql(f"ALTER TABLE {table} ALTER COLUMN `{column}` DROP NOT NULL")
            existing = self.lake.schema(self.spec.name)
        missing = [c for c in self.spec.join_kind.meta_columns if c not in existing.names]
        if missing:  # written by a release before results kept their provenance
            raise UserError(
                f"join {self.spec.name}: the result table has no {', '.join(missing)} (written by an "
                f"earlier release, before results kept the input records they came from); rebuild it "
                f"from the topics: lake run {self.spec.name} --once --reset"
            )
        if _columns(existing) != _columns(self.result_schema):
            raise UserError(
                f"join {self.spec.name}: the result table's columns ({', '.join(existing.names)}) differ "
                f"from the configured select ({', '.join(self.result_schema.names)}); "
                f"rerun with --reset to rebuild it"
            )

    def _projection(self) -> Any:
        return Projection(self.spark, self.codecs, self.spec)

    def _publisher(self) -> Callable[[Any], Any] | None:
        """The changelog's writer (JSON, or a registry format whose schema is derived from the
        result's columns and registered now: a refusal is one line before anything is written)."""
        if not self.spec.publish:
            return None
        from pyspark.sql.pandas.types import from_arrow_schema

        meta = set(self.spec.join_kind.meta_columns)
        value = pa.schema([f for f in self.result_schema if f.name not in meta])
        return self.formats.publisher(self.spec.publish, from_arrow_schema(value))

    @property
    def query_id(self) -> str:
        return self._query_id() if callable(self._query_id) else self._query_id

    # --- the micro-batch --------------------------------------------------------------------
    def plan(self, records: DataFrame) -> DataFrame:
        """The streaming part of the join over both topics' records (``side`` and the record
        columns), ahead of ``foreachBatch``: what :meth:`process` gets per micro-batch. Here the
        records with ``reason``; a kind whose state lives in Spark's state store adds its operator."""
        return self._prepared(records)

    def process(self, frame: DataFrame, batch_id: int) -> BatchMetrics:
        """Run one micro-batch of :meth:`plan`'s output."""
        started = time.perf_counter()
        started_at = datetime.now(UTC)
        txn = (self.query_id, int(batch_id))
        # Spark reruns a batch only after a restart, with the id it had: ids only grow otherwise
        self._replay = self._last_batch is None or batch_id <= self._last_batch
        self._last_batch = int(batch_id)
        metrics = BatchMetrics()
        self._sent = 0
        self._step(frame, txn, started_at, metrics)
        metrics.published = self._sent
        metrics.dropped = Counter(c for t in self._quarantined for c in t["cause"].to_pylist())
        if self._quarantined:  # one commit for the batch's bad records and poison pills
            with metrics.phases("quarantine"):
                rows = pa.concat_tables(self._quarantined)
                if self.dead_letters is not None:  # before the commit: a replay finds them out already
                    self.dead_letters.send(rows, f"{txn[0]}:{txn[1]}".encode(), self._replay)
                self.lake.append(QUARANTINE, rows, txn=txn)
            self._quarantined.clear()
        duration = (time.perf_counter() - started) * 1000
        with metrics.phases("metrics"):
            self._metrics(metrics, txn, started_at, duration)
        phases = f": {metrics.phases.text()}" if metrics.phases.ms else ""
        self.log(f"join {self.spec.name} batch {batch_id}: {metrics.text()} ({duration:.0f} ms{phases})")
        return metrics

    def _step(self, frame: DataFrame, txn: tuple[str, int], at: datetime, metrics: BatchMetrics) -> None:
        """The kind's work on a micro-batch of :meth:`plan`'s output."""
        raise NotImplementedError(f"join kind {self.spec.kind}: use spark_jobs.joins.registry.job_for(...)")

    def _prepared(self, frame: DataFrame) -> DataFrame:
        """The batch with ``reason`` (and, for the kinds that need them, the left records' keys)."""
        return prepare(frame, self.codecs, self.null_key_sides)

    def _project(
        self, rows: pa.Table, txn: tuple[str, int], at: datetime, m: BatchMetrics, elements: Any = None
    ) -> tuple[pa.Table, pa.Array]:
        """``rows``' result rows (``select`` evaluated), and the keys of the rows it failed on: those
        rows' records are quarantined with the error and their keys' results stay as they were
        (:mod:`spark_jobs.joins.poison`). A list join's ``elements`` go with their rows."""
        publish = self.publish_value if self.publishes_projection else None

        def evaluate(part: pa.Table) -> pa.Table:
            if elements is None:
                return self.projection.apply(part, publish)
            mine = elements.filter(pc.is_in(elements["key"], part["key"]))
            return self.projection.apply(part, mine)  # a list join: it publishes its commits

        result = guarded(evaluate, rows)
        if result.failed.num_rows:
            m.quarantined += result.failed.num_rows
            self._quarantine_poison(result, evaluate, txn, at)
        return result.output, pc.unique(result.failed["key"].combine_chunks())

    def _changes(self, desired: pa.Table, keys: pa.Array) -> Changes:
        """The upserts (new or different rows of ``desired``) and deletes (result keys among ``keys``
        that ``desired`` no longer has) that make the result hold ``desired`` for ``keys``."""
        current = self.lake.read_keys(self.spec.name, "key", keys)
        return _diff(desired, current, self.result_schema.names)

    # --- shared writes ----------------------------------------------------------------------------
    def _publish(self, records: DataFrame, txn: tuple[str, int], order: Sequence[str] = ()) -> None:
        """The batch's changes to the changelog (``key``, ``v``: null for a tombstone, ``ts``: the
        result's timestamp in epoch ms), each partition's in ``order``, tagged with the batch: a
        replayed batch (only the first after a restart can be one) sends nothing that got out before
        the crash."""
        # a record without a time (none expected) gets its producer's clock; no literal of the moment
        # here, which would make every batch's plan new code for Spark to compile
        records = records.withColumn("ts", F.col("ts").cast("long"))
        tag = f"{txn[0]}:{txn[1]}".encode()
        # tried before in this batch (a select failed in it): some partitions may have gone out
        tried, self._publishing = self._publishing == tag, tag
        self._sent += self.changelog.send(records, tag, self._replay or tried, order)
        faults.point("publish")

    def _quarantine(self, bad: pa.Table, txn: tuple[str, int], at: datetime) -> None:
        if bad.num_rows == 0:
            return
        topics = pc.if_else(pc.equal(bad["side"], "left"), self.spec.left, self.spec.right)
        source = pc.binary_join_element_wise(topics, "[", pc.cast(bad["partition"], pa.string()), "]", "")
        keys = pc.fill_null(pc.cast(bad["key"], pa.string(), safe=False), "")
        rows = pa.table(
            {
                "run_id": pa.array([f"{txn[0]}:{txn[1]}"] * bad.num_rows, pa.string()),
                "run_time": pa.array([at] * bad.num_rows, TS),
                "job": pa.array([self.spec.job] * bad.num_rows, pa.string()),
                "source": source,
                "line": bad["offset"],
                "raw_hex": pc.fill_null(_hex(bad["value"]), ""),
                "reason": pc.if_else(
                    pc.is_null(bad["key"]),
                    bad["reason"],
                    pc.binary_join_element_wise(bad["reason"], " (key '", keys, "')", ""),
                ),
                "topic": topics,
                "partition": bad["partition"],
                "key_hex": _hex(bad["key"]),
                "cause": pa.array([dropped.reason_of(r) for r in bad["reason"].to_pylist()], pa.string()),
            }
        )
        self._quarantined.append(rows.cast(QUARANTINE_SCHEMA))

    def _quarantine_poison(
        self, result: Guarded, evaluate: Callable, txn: tuple[str, int], at: datetime
    ) -> None:
        """One quarantine row per row ``select`` failed on, naming the record to blame: the right
        side's when the row evaluates without it, else the left side's."""
        rows = []
        for i, error in enumerate(result.errors):
            row = result.failed.slice(i, 1)
            side = "left"
            if "right_value" in row.column_names and row["right_value"][0].is_valid:
                without_right = row.set_column(
                    row.schema.get_field_index("right_value"), "right_value", pa.nulls(1, pa.binary())
                )
                side = "left" if fails(evaluate, without_right) else "right"
            record = row.to_pylist()[0]
            value = record.get(f"{side}_value")
            topic = self.spec.left if side == "left" else self.spec.right
            key = record["key"].decode("utf-8", "replace")
            rows.append(
                {
                    "run_id": f"{txn[0]}:{txn[1]}",
                    "run_time": at,
                    "job": self.spec.job,
                    "source": f"{topic}[{record.get(f'{side}_partition')}]",
                    "line": record.get(f"{side}_offset"),
                    "raw_hex": value.hex() if value is not None else "",
                    "reason": f"select failed on the {side} record of result key '{key}': {error}",
                    "topic": topic,
                    "partition": record.get(f"{side}_partition"),
                    "key_hex": record["key"].hex(),
                    "cause": "poison",
                }
            )
        self._quarantined.append(pa.Table.from_pylist(rows, QUARANTINE_SCHEMA))

    def _metrics(self, m: BatchMetrics, txn: tuple[str, int], at: datetime, duration_ms: float) -> None:
        if (
            self._replay
            and self._metric_rows == []
            and self.lake.committed(JOIN_METRICS, self._metrics_txn(txn))
        ):
            return  # a replayed batch whose row went out with the last flush before the crash
        self._metric_rows.append(
            {
                "join": self.spec.name,
                "query_id": txn[0],
                "batch_id": txn[1],
                "started_at": at,
                "duration_ms": duration_ms,
                **{f.name: getattr(m, f.name) for f in JOIN_METRICS_SCHEMA if hasattr(m, f.name)},
            }
        )
        if self.metrics_due(OVERDUE * METRICS_FLUSH_SECONDS):
            self.flush_metrics()

    def metrics_due(self, after: float = METRICS_FLUSH_SECONDS) -> bool:
        """Buffered metrics rows waited ``after`` seconds since the last flush."""
        return bool(self._metric_rows) and time.monotonic() - self._metrics_flushed >= after

    def flush_metrics(self) -> None:
        """Append the buffered metrics rows to ``join_metrics`` in one commit, under the txn of the
        last of them (a replay of a batch already flushed is not recorded twice)."""
        rows, self._metric_rows = self._metric_rows, []
        self._metrics_flushed = time.monotonic()
        if rows:
            txn = self._metrics_txn((rows[-1]["query_id"], rows[-1]["batch_id"]))
            self.lake.append(JOIN_METRICS, pa.Table.from_pylist(rows, JOIN_METRICS_SCHEMA), txn=txn)

    def _metrics_txn(self, txn: tuple[str, int]) -> tuple[str, int]:
        """Every join appends to the one join_metrics table: its txn names the join too."""
        return f"{self.spec.name}:{txn[0]}", txn[1]


class Inputs:
    """How far a join's inputs go, as the stream kinds ask when they decide whether a side has read
    everything its topic holds: ``read_to(batch_id)``, per side, the next offset of each partition
    that micro-batch has read up to; ``ends(topic)``, the topic's end offsets now."""

    def read_to(self, batch_id: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def ends(self, topic: TopicSpec) -> np.ndarray:
        raise NotImplementedError


class Changelog:
    """Where a join's changelog goes: ``send`` a batch's changes (a DataFrame of ``key``, ``v``: null
    for a tombstone, ``ts``: each record's timestamp in epoch ms, its result's event time; sent in
    ``order`` per key, else in any) tagged with the batch; with ``may_be_sent`` (a replay), what
    already went out under the tag is not sent again."""

    def send(self, records: DataFrame, tag: bytes, may_be_sent: bool, order: Sequence[str] = ()) -> int:
        """The number of records sent (none of those already out)."""
        raise NotImplementedError


def adopt_former_names(
    lake: Lake, spec: JoinSpec, tables: dict[str, Any], log: Callable[[str], None]
) -> None:
    """A lake from before a join's tables had distinct names keeps ``<join>__pending``: a
    stream-table's waiting events (the kind owns ``__waiting`` now), else a keyed join's parked result
    rows (``__parked``). Give it its name."""
    former = former_pending_table(spec.name)
    if not lake.exists(former):
        return
    waiting = join_table(spec.name, "waiting")
    new = waiting if waiting in tables else join_table(spec.name, "parked")
    lake.rename(former, new)
    log(f"join {spec.name}: table {former} is called {new} now (renamed)")


class KafkaChangelog(Changelog):
    """The changelog topic on Kafka, written by the executors (:func:`publish_frame`): per batch, one
    transaction per partition, murmur2 like the left topic, every record with the batch in a header."""

    def __init__(self, job: JoinJob):
        self.job = job
        self._cluster: Cluster | None = None  # connected on first use
        self._topic_id: str | None = None  # the changelog topic's, asked on first use

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = connect(self.job.config, self.job.lake.root)
            # producers an earlier job of this join left in this process were fenced by later ones
            forget_publishers(self.job.spark, self.transactional_id)
        return self._cluster

    @property
    def transactional_id(self) -> str:
        """The join's (one running job per join: a restarted one fences its predecessor's tasks)."""
        return producer_id(self.job.lake.root, "join", self.job.spec.name)

    def send(self, records: DataFrame, tag: bytes, may_be_sent: bool, order: Sequence[str] = ()) -> int:
        topic = self.job.config.topic(self.job.spec.publish or "")
        if self._topic_id is None:  # created when missing, once per job
            ensure_topics(self.cluster, [topic])
            name = self.cluster.topic(topic.name)
            self._topic_id = topic_ids(self.cluster, [name]).get(name, "")
        fences.check(str(self.job.lake.root))  # a lease that may have lapsed: no transaction starts
        tid = self.transactional_id
        return publish_frame(
            self.cluster, topic, records, tid, tag, may_be_sent, self._topic_id, order
        ).records


def _columns(schema: pa.Schema) -> list[tuple[str, str]]:
    """Names and Spark types of a table's columns (nested fields' nullability aside: a Delta table
    keeps its columns nullable, the projection may not)."""
    return [(f.name, from_arrow_type(f.type).simpleString()) for f in schema]


def _without_published(table: pa.Table) -> pa.Table:
    """``Projection.apply(..., publish)`` output without its changelog records."""
    return table.drop_columns([c for c in table.column_names if c == PUBLISHED])


def _without(keys: pa.Array, dropped: pa.Array) -> pa.Array:
    return keys.filter(pc.invert(pc.is_in(keys, dropped))) if len(dropped) else keys


def _hex(values: Any) -> Any:
    return pa.array([v.hex() if v is not None else None for v in values.to_pylist()], pa.string())


def _deletes_table(keys: pa.Array, schema: pa.Schema) -> pa.Table:
    n = len(keys)
    cols = {f.name: (keys if f.name == "key" else pa.nulls(n, f.type)) for f in schema}
    return pa.table(cols, schema=schema).append_column("__delete", pa.array(np.ones(n, dtype=bool)))


@dataclass
class Changes:
    """What makes the result hold the desired rows of some keys: ``upserts`` (new or different rows)
    and ``deletes`` (keys to remove)."""

    upserts: pa.Table
    deletes: pa.Array


def _diff(desired: pa.Table, current: pa.Table, columns: list[str]) -> Changes:
    """Rows of ``desired`` that are new or differ from ``current`` (by key), and the keys of
    ``current`` that ``desired`` no longer has."""
    if current.num_rows == 0:
        return Changes(desired, pa.array([], pa.binary()))
    have = {r["key"]: r for r in current.select(columns).to_pylist()}
    want = desired.select(columns).to_pylist()
    keep = [have.get(r["key"]) != r for r in want]
    wanted = {r["key"] for r in want}
    gone = [k for k in have if k not in wanted]
    return Changes(desired.filter(pa.array(keep, pa.bool_())), pa.array(gone, pa.binary()))
