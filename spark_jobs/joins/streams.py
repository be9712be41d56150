"""What the stream kinds share: their progress per side and partition, the batch's recorded decision
(has a side read everything its topic holds?), the watermark, and appending decided events."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec
from spark_jobs.join_kinds import STREAM_STREAM
from spark_jobs.joins import dropped
from spark_jobs.joins.engine import (
    PUBLISHED,
    RECORD_COLUMNS,
    RECORD_FIELDS,
    TS,
    BatchMetrics,
    JoinJob,
    _meta_type,
    _without_published,
)
from spark_jobs.joins.poison import _quiet, is_data_error
from spark_jobs.layout import join_table
from spark_jobs.seams.delta import conform

SEQ = "__seq"  # a published event's place in its batch's order
STATE_SCHEMA = pa.schema(RECORD_FIELDS)
BAD_SCHEMA = pa.schema([("side", pa.string()), *RECORD_FIELDS, ("reason", pa.string())])
# the columns naming the records a row was computed from (spark_jobs.joins.poison)
BUFFER_SCHEMA = pa.schema([*RECORD_FIELDS, ("matched", pa.bool_())])
# Per side and partition: the next offset and the largest timestamp read so far; and on every row
# the batch that wrote it and its decision (has a side read all its topic holds? the watermark), so
# a replay of that batch decides the same. One overwrite per batch: a handful of rows.
DECISION_FIELDS = [
    ("query_id", pa.string()),
    ("batch_id", pa.int64()),
    ("left_caught_up", pa.bool_()),
    ("right_caught_up", pa.bool_()),
    ("watermark", TS),
]
PROGRESS_SCHEMA = pa.schema(
    [
        ("side", pa.string()),
        ("partition", pa.int32()),
        ("next_offset", pa.int64()),
        ("max_timestamp", TS),
        *DECISION_FIELDS,
    ]
)
DECISION_COLUMNS = [name for name, _ in DECISION_FIELDS]
# A stream-stream pair (or an unmatched event) before ``select``: meta columns, then both values.
PAIR_COLUMNS = [*STREAM_STREAM.meta_columns, "left_value", "right_value"]


class StreamJob(JoinJob):
    """A kind whose result is an append-only log of events (stream-table, stream-stream).

    A batch runs on the executors: the records, the state tables (Delta, owned by the job) and the
    result are Spark DataFrames, and every write is a Spark commit with the batch's txn. The driver
    holds only what is per partition or per batch: the progress per side and partition, and the
    batch's decision (has a side read all its topic holds?). Only a batch whose ``select`` fails on
    some record brings its decided rows to the driver, to bisect the failing ones out."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._progress_rows: pa.Table | None = None  # the progress table as this job last read or wrote it
        # a lake from before the decision moved into the progress table: add its columns
        self.lake.add_missing_columns(join_table(self.spec.name, "progress"), PROGRESS_SCHEMA)

    def _step(self, frame: DataFrame, txn: tuple[str, int], at: datetime, metrics: BatchMetrics) -> None:
        """A micro-batch of records with ``reason``: quarantine the bad ones, hand the rest to the
        kind's :meth:`_batch`."""
        rows = frame.persist()  # read by several jobs below
        try:
            self._records(rows, txn, at, metrics)
        finally:
            rows.unpersist()

    def _records(self, rows: DataFrame, txn: tuple[str, int], at: datetime, m: BatchMetrics) -> None:
        valid = F.col("reason").isNull()
        grouped = _arrow(
            rows.groupBy("side", "partition").agg(
                F.count(F.lit(1)).alias("n"),
                F.count_if(~valid).alias("bad"),
                F.count_if(valid & F.col("value").isNull()).alias("tombstones"),
                F.count_if(valid & F.col("value").isNotNull() & F.col("key").isNull()).alias("null_keys"),
                F.max("offset").alias("offset_max"),
                F.max("timestamp").alias("timestamp_max"),
            )
        )
        totals = {side: Counts() for side in ("left", "right")}
        for r in grouped.to_pylist():
            totals[r["side"]].add(r["n"], r["bad"], r["tombstones"], r["null_keys"])
        m.input_left, m.input_right = totals["left"].records, totals["right"].records
        m.quarantined = totals["left"].bad + totals["right"].bad
        if m.quarantined:
            bad = rows.filter(~valid).select("side", *RECORD_COLUMNS, "reason")
            self._quarantine(conform(_arrow(bad), BAD_SCHEMA, f"join {self.spec.name} input"), txn, at)
        drops = self._drops_null_keys()  # KIP-962: the events the join type drops, quarantined too
        m.skipped = sum(totals[side].null_keys for side in drops)
        if m.skipped:
            skipped = rows.filter(
                valid & F.col("value").isNotNull() & F.col("key").isNull() & F.col("side").isin(*drops)
            ).select(
                "side",
                *RECORD_COLUMNS,
                F.lit(f"null key: an event without a key, which the {self.spec.type} join drops").alias(
                    "reason"
                ),
            )
            self._quarantine(conform(_arrow(skipped), BAD_SCHEMA, f"join {self.spec.name} input"), txn, at)
        streams = self.null_key_sides  # a tombstone on a stream is no event: quarantined, as Kafka drops it
        if any(totals[side].tombstones for side in streams):
            tombstones = rows.filter(valid & F.col("value").isNull() & F.col("side").isin(*streams)).select(
                "side", *RECORD_COLUMNS, F.lit(f"null value: {dropped.NOT_AN_EVENT}").alias("reason")
            )
            self._quarantine(conform(_arrow(tombstones), BAD_SCHEMA, f"join {self.spec.name} input"), txn, at)
        decision = self._progress(grouped, txn)
        good = rows.filter(valid)
        sides = {side: good.filter(F.col("side") == side).select(RECORD_COLUMNS) for side in totals}
        self._batch(sides, totals, decision, txn, at, m)

    def _drops_null_keys(self) -> tuple[str, ...]:
        """The sides whose events with a null key the join type drops (KIP-962)."""
        return ()

    def _batch(
        self,
        sides: dict[str, DataFrame],
        totals: dict[str, Counts],
        decision: dict[str, Any],
        txn: tuple[str, int],
        at: datetime,
        m: BatchMetrics,
    ) -> None:
        """The kind's work on a batch's valid records per side (``totals``: their counts), with the
        batch's ``decision``."""
        raise NotImplementedError

    def _progress(self, grouped: pa.Table, txn: tuple[str, int]) -> dict[str, Any]:
        """Record the next offset (how far the batch has read, from :attr:`inputs`) and the largest
        timestamp seen per side and partition (``grouped``: the batch's largest per side and
        partition) with the batch's decision, in one commit; returns the decision. A replay of a
        batch whose commit is in reads the decision it recorded."""
        table = join_table(self.spec.name, "progress")
        if self._replay and self.lake.committed(table, txn):  # only the first batch of a run can be
            self._progress_rows = self.lake.read_arrow(table)
            recorded = self._progress_rows.slice(0, 1).select(DECISION_COLUMNS).to_pylist()
            if recorded and (recorded[0]["query_id"], recorded[0]["batch_id"]) == txn:
                return recorded[0] | {"recorded": True}
        if self._progress_rows is None:
            self._progress_rows = self.lake.read_arrow(table)
        best: dict[tuple[str, int], tuple[int, Any]] = {
            (r["side"], r["partition"]): (r["next_offset"], r["max_timestamp"])
            for r in self._progress_rows.to_pylist()
        }
        for r in grouped.to_pylist():
            k = (r["side"], r["partition"])
            off, ts = best.get(k, (0, None))
            best[k] = (off, ts if ts is not None and ts >= r["timestamp_max"] else r["timestamp_max"])
        if self.inputs is None:
            raise RuntimeError(f"join {self.spec.name}: a stream kind needs its inputs (JoinJob.inputs)")
        for side, offsets in self.inputs.read_to(txn[1]).items():
            for partition, offset in enumerate(offsets.tolist()):
                off, ts = best.get((side, partition), (0, None))
                if offset or (side, partition) in best:
                    best[(side, partition)] = (max(off, int(offset)), ts)
        decision = self._decide(txn, best)
        n = len(best)
        rows = pa.table(
            {
                "side": pa.array([k[0] for k in best], pa.string()),
                "partition": pa.array([k[1] for k in best], pa.int32()),
                "next_offset": pa.array([v[0] for v in best.values()], pa.int64()),
                "max_timestamp": pa.array([v[1] for v in best.values()], TS),
                **{c: pa.array([decision[c]] * n, t) for c, t in DECISION_FIELDS},
            },
            schema=PROGRESS_SCHEMA,
        )
        if n:  # nothing read yet: nothing to decide either
            if self.lake.overwrite(table, rows, txn=txn) is None:  # a replay: Delta holds the first attempt's
                self._progress_rows = None
            else:
                self._progress_rows = rows
        return decision

    def _decide(
        self, txn: tuple[str, int], progress: dict[tuple[str, int], tuple[int, Any]]
    ) -> dict[str, Any]:
        """Has each side read all its topic holds (``progress``: the next offset and largest timestamp
        per side and partition, against the topic's end offsets now), and the watermark."""
        assert self.inputs is not None
        # a kind without a right topic has nothing to wait for on that side
        decision: dict[str, Any] = {"query_id": txn[0], "batch_id": txn[1], "right_caught_up": True}
        maxima: dict[str, Any] = {}
        for side, name in self.spec.sides:
            topic = self.config.topic(name)
            seen = np.zeros(topic.partitions, dtype=np.int64)
            stamps = [ts for (s, _), (_, ts) in progress.items() if s == side and ts is not None]
            for (s, partition), (next_offset, _) in progress.items():
                if s == side and partition < topic.partitions:
                    seen[partition] = next_offset
            decision[f"{side}_caught_up"] = bool((seen >= self.inputs.ends(topic)).all())
            maxima[side] = max(stamps) if stamps else None
        decision["watermark"] = self._watermark(decision, maxima)
        return decision

    def _watermark(self, decision: dict[str, Any], maxima: dict[str, Any]) -> Any:
        return _watermark(decision, maxima)

    def _state(self, table: str, columns: list[str]) -> DataFrame:
        """A state table of the job, as Delta holds it now."""
        return self.lake.read(table).select(*columns)

    def _append_events(
        self, rows: DataFrame, order: list[str], txn: tuple[str, int], at: datetime, m: BatchMetrics
    ) -> None:
        """Stream kinds: append the decided rows (before ``select``) to the result in one commit, and
        publish them, in ``order``, when configured."""
        rows = rows.persist()  # select is evaluated for the append and for the changelog
        try:
            try:
                with _quiet():
                    version = self.lake.append(self.spec.name, self.projection.frame(rows), txn=txn)
                    published = self._events_published(rows, order) if self.spec.publish else None
            except Exception as exc:
                if not is_data_error(exc):
                    raise
                self.log(f"join {self.spec.name} batch {txn[1]}: select failed on some record; finding it")
                version, published = self._append_on_driver(rows, order, txn, at, m)
            if version is None and self._replay:  # a replayed batch whose commit is in already
                version = self.lake.committed_version(self.spec.name, txn)
            if version is not None:
                m.appended = int(
                    (self.lake.commit(self.spec.name, version).metrics or {}).get("numOutputRows", 0)
                )
            pair = _pair(rows.columns)  # none: a kind whose events have no right record
            if m.appended and pair and not m.matched + m.unmatched:  # (the driver's pass counts its own)
                both = functools.reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in pair])
                found = rows.agg(F.count_if(both)).first()
                m.matched = int((found[0] if found else 0) or 0)
                m.unmatched = m.appended - m.matched
            if published is not None and m.appended:
                self._publish(published, txn, [SEQ])
        finally:
            rows.unpersist()

    def _events_published(self, rows: DataFrame, order: list[str]) -> DataFrame:
        """The events' keys, their select columns as the changelog's records, their times (epoch
        ms), and their place in ``order`` (``SEQ``)."""
        out = self.projection.frame(rows)
        columns = [F.col(f"`{c}`") for c in self.spec.select]
        assert self.publish_value is not None  # a job that publishes
        record = self.publish_value(F.struct(*columns))
        sorted_rows = out.orderBy(*[F.col(c).asc_nulls_last() for c in order])
        times = [F.col(c) for c in self.time_columns]
        ms = F.unix_millis(F.greatest(*times) if len(times) > 1 else times[0]).alias("ts")
        events = sorted_rows.select("key", record.alias("v"), ms)
        return events.withColumn(SEQ, F.monotonically_increasing_id())  # after a sort: in its order

    def _append_on_driver(
        self, rows: DataFrame, order: list[str], txn: tuple[str, int], at: datetime, m: BatchMetrics
    ) -> tuple[int | None, DataFrame | None]:
        """The driver's pass of a batch whose ``select`` failed on some record: the failing rows are
        bisected out and quarantined, the rest appended."""
        arrow = conform(_arrow(rows), _rows_schema(rows.columns), f"join {self.spec.name}")
        out, _ = self._project(arrow, txn, at, m)
        if out.num_rows:
            out = out.sort_by([(c, "ascending") for c in order])
        version = self.lake.append(self.spec.name, _without_published(out), txn=txn) if out.num_rows else None
        pair = _pair(out.column_names)
        if pair and out.num_rows:
            both = functools.reduce(pc.and_, [pc.is_valid(out[c]) for c in pair])
            m.matched = int(pc.sum(both).as_py() or 0)
            m.unmatched = out.num_rows - m.matched
        published = None
        if self.spec.publish and out.num_rows:
            times = [out[c].combine_chunks().cast(TS).cast(pa.int64()) for c in self.time_columns]
            latest = pc.max_element_wise(*times, skip_nulls=True) if len(times) > 1 else times[0]
            events = {"key": out["key"], "v": out[PUBLISHED], "ts": pc.divide(latest, 1000)}
            published = self.lake.frame(pa.table({**events, SEQ: pa.array(np.arange(out.num_rows))}))
        return version, published


def _pair(columns: list[str]) -> list[str]:
    """The provenance columns an event row fills when it holds both sides' records (stream-table: its
    right record's; stream-stream: both sides')."""
    return [c for c in ("left_offset", "right_offset") if c in columns]


@dataclass
class Counts:
    """A side's records in a batch: all, quarantined, valid tombstones, and events with a null key."""

    records: int = 0
    bad: int = 0
    tombstones: int = 0
    null_keys: int = 0

    def add(self, records: int, bad: int, tombstones: int, null_keys: int = 0) -> None:
        self.records += records
        self.bad += bad
        self.tombstones += tombstones
        self.null_keys += null_keys

    @property
    def valid(self) -> int:
        return self.records - self.bad


def _arrow(frame: DataFrame) -> pa.Table:
    """A small DataFrame on the driver, its timestamps in UTC."""
    table = frame.toArrow()
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(i, field.name, table[field.name].cast(TS))
    return table


def _rows_schema(columns: list[str]) -> pa.Schema:
    """The Arrow schema of a kind's rows before ``select`` (meta columns, values, blame columns)."""

    def kind(column: str) -> pa.DataType:
        return pa.binary() if column.endswith("value") else _meta_type(column)

    return pa.schema([(c, kind(c)) for c in columns])


def _stream_tables(spec: JoinSpec) -> dict[str, pa.Schema]:
    """The stream kinds' progress per side and partition, and each batch's recorded decisions."""
    return {join_table(spec.name, "progress"): PROGRESS_SCHEMA}


def _watermark(decision: dict[str, Any], maxima: dict[str, Any]) -> Any:
    """Event time below which no more records are expected: a side still reading holds it back to
    its largest timestamp (its later records are not older); a side that has read everything does not
    hold it back. When both have, it is the largest timestamp seen."""
    bounds = [maxima[s] for s in ("left", "right") if not decision[f"{s}_caught_up"]]
    if bounds:
        return None if any(b is None for b in bounds) else min(bounds)
    seen = [v for v in maxima.values() if v is not None]
    return max(seen) if seen else None
