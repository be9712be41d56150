"""The kinds whose state is in Spark's state store: the join's plan groups the records into the kind's
Java operator (``lake.joins.<operator>``, under ``spark_jobs/joins/java``), which emits one row per
key whose joined row the batch changed; ``foreachBatch`` (:class:`StateStoreJob`) evaluates ``select``
over those rows, publishes them (a join with ``publish``) and then writes them into the result on the
executors, in one commit. The topic comes first because it is where a change is seen soonest: the
result's commit (a ``MERGE``) is the batch's most expensive step.

The write is one ``MERGE`` whose source is the operator's rows after ``select`` (a row equal to the
result's leaves it untouched; a key without a joined row deletes it), or an append while the result
is empty (a first load). Nothing is collected to the driver and the result is not read back for a
diff. Only when that pass fails with a data error (a ``select`` that fails for some record: a bad
cast, a division by zero) is the batch redone on the driver, where :mod:`spark_jobs.joins.poison`
bisects the rows, quarantines the ones to blame and writes the rest."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs import faults
from spark_jobs.joins.behind import DELETE, TableBehind
from spark_jobs.joins.engine import (
    OVERDUE,
    BatchMetrics,
    Changes,
    JoinJob,
    _deletes_table,
    _without,
)
from spark_jobs.joins.poison import _quiet, is_data_error

# counts a state operator may add to its rows, and the metric each one sums into
OPERATOR_COUNTS = {
    "n_null": "null_keys",
    "elements_joined": "elements_joined",
    "elements_retracted": "elements_retracted",
    "elements_kept": "elements_kept",
}
CHUNK_KEYS = 100_000  # the driver's pass recomputes this many result keys at a time (bounded memory)
DEAD = pa.schema([("key", pa.binary()), ("ts", pa.int64())])  # the changelog's tombstones


def _dead(keys: pa.Array, rows: pa.Table) -> pa.Table:
    """Tombstones for ``keys``, each with its deleting record's time (epoch ms) from ``rows`` (the
    operator's rows that are not live: ``key``, ``timestamp``)."""
    if not len(keys):
        return DEAD.empty_table()
    times = rows["timestamp"].combine_chunks().cast(pa.timestamp("us", tz="UTC"))
    ms = pc.divide(times.cast(pa.int64()), 1000)
    found = pc.take(ms, pc.index_in(keys, rows["key"].combine_chunks()))
    return pa.table({"key": keys, "ts": found.cast(pa.int64())}, schema=DEAD)


class StateStoreJob(JoinJob):
    """A kind whose state operator is Java, in Spark's state store (``operator``): the plan runs it over
    the valid records, and each batch writes the rows it emits for changed keys."""

    state_in_checkpoint = True
    publishes_projection = False  # it publishes its operator's answers (:meth:`_publish_answers`)

    operator: str  # the Java operator: lake.joins.<operator>.apply(records, join type)
    # the operator's columns that ``select`` is evaluated over (besides live, changed, left_deleted)
    row_columns = [
        "key",
        "timestamp",
        "left_value",
        "left_partition",
        "left_offset",
        "right_value",
        "right_partition",
        "right_offset",
    ]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._result_empty = self.lake.never_written(self.spec.name)  # a first load appends
        self._published = False  # the batch in progress has sent its changelog
        # > 0: the result table is written behind the topic, at most this often (spark_jobs.joins.behind)
        self.table_every = 0.0
        self.behind = TableBehind(self.lake, self.spec.name, self.result_schema, self.log)

    def plan(self, records: DataFrame) -> DataFrame:
        prepared = self._prepared(records)
        valid = prepared.filter(F.col("reason").isNull()).drop("reason")
        operator = getattr(self.spark._jvm.lake.joins, self.operator)  # type: ignore[union-attr]
        joined = DataFrame(operator.apply(valid._jdf, self.spec.type), self.spark)
        # the operator's result timestamp (microseconds) as the result's ``timestamp``
        joined = joined.withColumn("timestamp", F.timestamp_micros("ts")).drop("ts")
        invalid = prepared.filter(F.col("reason").isNotNull())
        out = joined.unionByName(invalid, allowMissingColumns=True)
        noted = self._joins_nothing()
        if noted is None:
            return out
        # copies of the valid records that join nothing, to quarantine (the state took them above)
        reason, unused = noted
        copies = valid.filter(unused).withColumns({"reason": reason, "noted": F.lit(True)})
        return out.unionByName(copies, allowMissingColumns=True)

    def _joins_nothing(self) -> tuple[Column, Column] | None:
        """The kind's valid records that its state takes but that give no result row, as (the
        quarantine reason, which records); None for a kind without such records."""
        return None

    def _step(self, frame: DataFrame, txn: tuple[str, int], at: datetime, m: BatchMetrics) -> None:
        if self.behind.held and not self.table_every:  # rows a run with --table-every left behind
            self.fold(keep=False)  # this run writes the result itself: nothing may stay pending
        rows = frame.persist()  # read by several jobs below, and the state operator runs once
        try:
            self._keys(rows, txn, at, m)
        finally:
            rows.unpersist()

    def _keys(self, rows: DataFrame, txn: tuple[str, int], at: datetime, m: BatchMetrics) -> None:
        valid = F.col("reason").isNull()
        # a quarantined copy of a record the state took (counted once, as the input it is)
        bad = ~valid & ~F.coalesce(F.col("noted"), F.lit(False)) if "noted" in rows.columns else ~valid
        counts = [F.sum("n_left"), F.sum("n_right"), F.count_if(valid & F.col("changed"))]
        counts += [F.count_if(bad), F.count_if(bad & (F.col("side") == "left")), F.count_if(~valid)]
        counts += [
            F.count_if(valid & F.col("left_deleted")),
            F.count_if(valid & F.col("changed") & F.col("live")),
        ]
        both = "right_value" in self.row_columns  # table, fk: a row is matched or not
        if both:
            whole = F.col("left_value").isNotNull() & F.col("right_value").isNotNull()
            counts.append(F.count_if(valid & F.col("changed") & F.col("live") & whole))
        extra = [c for c in OPERATOR_COUNTS if c in rows.columns]
        counts += [F.sum(c) for c in extra]
        with m.phases("read+state"):  # the batch's first job: the input, the state operator
            totals: Any = rows.agg(*counts).first() or []  # an aggregate has one row
        n_left, n_right, changed, n_bad, bad_left, n_out, n_deleted, n_live, *more = [
            int(v or 0) for v in totals
        ]
        if both:
            matched, *more = more
            m.matched, m.unmatched = matched, n_live - matched
        m.input_left, m.input_right = n_left + bad_left, n_right + n_bad - bad_left
        m.quarantined, m.affected_keys = n_bad, changed
        for column, value in zip(extra, more, strict=True):
            setattr(m, OPERATOR_COUNTS[column], value)
        if n_out:
            self._quarantine(rows.filter(~valid).toArrow(), txn, at)
        if not changed:
            return
        keys = rows.filter(valid & F.col("changed")).select(*self.row_columns, "live", "left_deleted")
        self._published = False
        version = None
        if n_live or n_deleted or not self._result_empty:  # into an empty result, no live row: nothing
            try:
                with _quiet():
                    live = self.result_frame(keys.filter(F.col("live")))
                    if self.spec.publish:  # first: the topic is where a change is seen soonest
                        live = live.persist()  # published, then written: select evaluated once
                        with m.phases("publish"):
                            self._publish_answers(live, keys, n_live > 0, n_live < changed, txn)
                    # parked for the table's next catch-up; a first load (nothing to merge) goes in
                    park = self.table_every and (self.behind.waiting or not self._result_empty)
                    try:
                        if park:
                            with m.phases("write"):
                                self.behind.add(self._source(keys, live), txn)
                        elif n_live or not self._result_empty:
                            with m.phases("write"):
                                version = self._write_on_executors(keys, live, txn)
                            faults.point("write")
                    finally:
                        live.unpersist()
            except Exception as exc:
                if not is_data_error(exc):
                    raise
                self.log(f"join {self.spec.name} batch {txn[1]}: select failed on some record; finding it")
                version = self._write_on_driver(keys, m.affected_keys, txn, at, m)
        if version is None and self._replay and not self.table_every:  # its commit is in already
            version = self.lake.committed_version(self.spec.name, txn)
        self._count_commit(version, m)
        if self.table_every and self.behind.due(OVERDUE * self.table_every):  # a stream that never idles
            with m.phases("write"):
                self.fold(m)

    def fold(self, m: BatchMetrics | None = None, keep: bool = True) -> None:
        """Bring the result table up to date with the pending rows (``--table-every``); the commit's
        counts go into ``m`` (the batch that folded) when given. ``keep``: the pending table keeps
        this fold's rows for the current view's readers (false: before the result is written
        directly, which a pending row must not shadow)."""
        version = self.behind.fold(self.query_id, self._result_empty, keep)
        if version is not None:
            self._result_empty = False
            if m is not None:
                self._count_commit(version, m)

    # --- the executors' pass --------------------------------------------------------------------
    def result_frame(self, keys: DataFrame) -> DataFrame:
        """The result's rows (``select`` evaluated, by Spark) of the operator's rows ``keys``."""
        return self.projection.frame(keys.select(self.row_columns))

    def _write_on_executors(self, keys: DataFrame, live: DataFrame, txn: tuple[str, int]) -> int | None:
        """Write the result rows ``live`` (of the operator's live rows) and delete the keys of its
        rows that are not live: one commit."""
        if self._result_empty:  # nothing to update or delete: an append, far cheaper than a MERGE
            version = self.lake.append(self.spec.name, live, txn=txn)
        else:
            source = self._source(keys, live)
            version = self.lake.merge(
                self.spec.name, source, ["key"], delete_column=DELETE, txn=txn, skip_unchanged=True
            )
        self._result_empty = False
        return version

    @staticmethod
    def _source(keys: DataFrame, live: DataFrame) -> DataFrame:
        """The batch's result rows: ``live`` with ``__delete`` false, and a row with ``__delete``
        true for the key of each operator row that is not live."""
        deletes = keys.filter(~F.col("live")).select("key").withColumn(DELETE, F.lit(True))
        return live.withColumn(DELETE, F.lit(False)).unionByName(deletes, allowMissingColumns=True)

    # --- the driver's pass (only for a batch whose select failed on some record) ---------------------
    def _write_on_driver(
        self, keys: DataFrame, affected: int, txn: tuple[str, int], at: datetime, m: BatchMetrics
    ) -> int | None:
        """Evaluate ``select`` with the failing records bisected out (quarantined), diff the rest
        against the result, publish, and write the changes: the failing keys' results stay as they were."""
        if self.behind.held:  # the diff below is against the result: bring it up to date first
            self.fold(keep=False)
        parts = -(-affected // CHUNK_KEYS)
        changes, answered, left_deleted, times = [], [], [], []
        for part in range(parts):
            chunk = keys if parts == 1 else keys.filter(F.pmod(F.xxhash64("key"), F.lit(parts)) == part)
            chunk_rows = chunk.toArrow()
            desired, failed = self._desired(chunk_rows.filter(chunk_rows["live"]), txn, at, m)
            answered.append(desired)
            changes.append(self._changes(desired, _without(chunk_rows["key"].combine_chunks(), failed)))
            times.append(chunk_rows.filter(pc.invert(chunk_rows["live"])).select(["key", "timestamp"]))
            if self.tombstones_follow_left:
                left_deleted.append(chunk_rows.filter(chunk_rows["left_deleted"])["key"].combine_chunks())
        if self.spec.publish and not self._published:  # a batch publishes once, before its write
            rows = pa.concat_tables(answered)
            upserts = self._changelog_records(self.lake.frame(rows)) if rows.num_rows else None
            gone = pa.concat_arrays([c.deletes for c in changes] + left_deleted)
            self._send(upserts, _dead(pc.unique(gone) if len(gone) else gone, pa.concat_tables(times)), txn)
        return self._write_changes(changes, txn)

    def _desired(
        self, live: pa.Table, txn: tuple[str, int], at: datetime, m: BatchMetrics
    ) -> tuple[pa.Table, pa.Array]:
        """The result rows of the operator's live rows, and the keys ``select`` failed on."""
        return self._project(live.select(self.row_columns), txn, at, m)

    def _write_changes(self, changes: list[Changes], txn: tuple[str, int]) -> int | None:
        upserts = pa.concat_tables([c.upserts for c in changes])
        deletes = pa.concat_arrays([c.deletes for c in changes])
        if not upserts.num_rows and not len(deletes):
            return None
        rows = pa.concat_tables(
            [
                upserts.append_column("__delete", pa.array(np.zeros(upserts.num_rows, dtype=bool))),
                _deletes_table(deletes, self.result_schema),
            ]
        )
        self._result_empty = False
        return self.lake.merge(self.spec.name, rows, ["key"], delete_column="__delete", txn=txn)

    # --- the changelog ----------------------------------------------------------------------------
    def _publish_answers(
        self, live: DataFrame, keys: DataFrame, some_live: bool, some_dead: bool, txn: tuple[str, int]
    ) -> None:
        """Publish the batch's answers before the result is written, so that the topic shows a change
        one Delta commit sooner: every live row the operator answered (as JSON; a left update whose
        row did not change is published again, as Kafka Streams' foreign-key join does), then a
        tombstone for every key that lost its row: each left key the batch deleted (also when the
        result held nothing for it, as Kafka Streams does) and each other key the result holds."""
        dead = DEAD.empty_table()
        if some_dead:
            gone = keys.filter(~F.col("live")).select("key", "left_deleted", "timestamp").toArrow()
            keys_gone = gone["key"].combine_chunks()
            follow = gone["left_deleted"].combine_chunks()
            if not self.tombstones_follow_left:
                follow = pa.array(np.zeros(len(keys_gone), dtype=bool))
            others = keys_gone.filter(pc.invert(follow))
            held = pa.array([], pa.binary())
            if len(others) and not self._result_empty:
                held = self.lake.read_keys(self.spec.name, "key", others, ["key"])["key"].combine_chunks()
            live_behind, dead_behind = self.behind.latest(others)  # rows not in the table yet
            if len(live_behind) or len(dead_behind):
                held = _without(pa.concat_arrays([held, live_behind]), dead_behind)
                held = pc.unique(held)
            dead = _dead(pa.concat_arrays([keys_gone.filter(follow), held]), gone)
        self._send(self._changelog_records(live) if some_live else None, dead, txn)

    def _changelog_records(self, rows: DataFrame) -> DataFrame:
        """``key``, ``v`` (the row's select columns as the changelog's record) and ``ts`` (its
        timestamp, epoch ms) of result rows."""
        meta = set(self.spec.join_kind.meta_columns)
        columns = [F.col(f"`{c}`") for c in self.result_schema.names if c not in meta]
        assert self.publish_value is not None  # a job that publishes
        record = self.publish_value(F.struct(*columns))
        return rows.select("key", record.alias("v"), F.unix_millis("timestamp").alias("ts"))

    def _send(self, upserts: DataFrame | None, dead: pa.Table, txn: tuple[str, int]) -> None:
        """The batch's changelog: the upserts and a tombstone per ``dead`` key (``key``, ``ts``), each
        record with its result's timestamp, published by the executors (a key has one record in a
        batch, so their order does not matter)."""
        records = upserts
        if dead.num_rows:
            tombstones = self.lake.frame(dead).select("key", F.lit(None).cast("binary").alias("v"), "ts")
            records = tombstones if records is None else records.unionByName(tombstones)
        if records is not None:
            self._publish(records, txn)
        self._published = True

    def _count_commit(self, version: int | None, m: BatchMetrics) -> None:
        """The batch's upserted and deleted rows, from its result commit's operation metrics."""
        if version is None:
            return
        stats = self.lake.commit(self.spec.name, version).metrics or {}
        inserted = int(stats.get("numTargetRowsInserted", stats.get("numOutputRows", 0)))
        m.upserted = inserted + int(stats.get("numTargetRowsUpdated", 0))
        m.deleted = int(stats.get("numTargetRowsDeleted", 0))
