"""The kinds whose state is in Spark's state store: the join's plan groups the records into the kind's
Java operator (``lake.joins.<operator>``, under ``spark_jobs/joins/java``), which emits one row per
key whose joined row the batch changed; ``foreachBatch`` (:class:`StateStoreJob`) evaluates ``select``
over those rows and writes them into the result on the executors, in one commit, then publishes
that commit's change feed.

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
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.joins.engine import (
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


class StateStoreJob(JoinJob):
    """A kind whose state operator is Java, in Spark's state store (``operator``): the plan runs it over
    the valid records, and each batch writes the rows it emits for changed keys."""

    state_in_checkpoint = True
    publishes_projection = False  # the changelog is the result commit's change feed

    operator: str  # the Java operator: lake.joins.<operator>.apply(records, join type)
    # the operator's columns that ``select`` is evaluated over (besides live, changed, left_deleted)
    row_columns = ["key", "left_value", "__lp", "__lo", "right_value", "__rp", "__ro"]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._result_empty = self.lake.never_written(self.spec.name)  # a first load appends

    def plan(self, records: DataFrame) -> DataFrame:
        prepared = self._prepared(records)
        valid = prepared.filter(F.col("reason").isNull()).drop("reason")
        operator = getattr(self.spark._jvm.lake.joins, self.operator)  # type: ignore[union-attr]
        joined = DataFrame(operator.apply(valid._jdf, self.spec.type), self.spark)
        invalid = prepared.filter(F.col("reason").isNotNull())
        return joined.unionByName(invalid, allowMissingColumns=True)

    def _step(self, frame: DataFrame, txn: tuple[str, int], at: datetime, m: BatchMetrics) -> None:
        rows = frame.persist()  # read by several jobs below, and the state operator runs once
        try:
            self._keys(rows, txn, at, m)
        finally:
            rows.unpersist()

    def _keys(self, rows: DataFrame, txn: tuple[str, int], at: datetime, m: BatchMetrics) -> None:
        valid = F.col("reason").isNull()
        counts = [F.sum("n_left"), F.sum("n_right"), F.count_if(valid & F.col("changed"))]
        counts += [F.count_if(~valid), F.count_if(~valid & (F.col("side") == "left"))]
        counts += [
            F.count_if(valid & F.col("left_deleted")),
            F.count_if(valid & F.col("changed") & F.col("live")),
        ]
        extra = [c for c in OPERATOR_COUNTS if c in rows.columns]
        counts += [F.sum(c) for c in extra]
        with m.phases("read+state"):  # the batch's first job: the input, the state operator
            totals: Any = rows.agg(*counts).first() or []  # an aggregate has one row
        n_left, n_right, changed, n_bad, bad_left, n_deleted, n_live, *more = [int(v or 0) for v in totals]
        m.input_left, m.input_right = n_left + bad_left, n_right + n_bad - bad_left
        m.quarantined, m.affected_keys = n_bad, changed
        for column, value in zip(extra, more, strict=True):
            setattr(m, OPERATOR_COUNTS[column], value)
        if n_bad:
            self._quarantine(rows.filter(~valid).toArrow(), txn, at)
        if not changed:
            return
        keys = rows.filter(valid & F.col("changed")).select(*self.row_columns, "live", "left_deleted")
        version = None
        if n_live or not self._result_empty:  # into an empty result, no joined row writes nothing
            try:
                with _quiet(), m.phases("write"):
                    version = self._write_on_executors(keys, txn)
            except Exception as exc:
                if not is_data_error(exc):
                    raise
                self.log(f"join {self.spec.name} batch {txn[1]}: select failed on some record; finding it")
                version = self._write_on_driver(keys, m.affected_keys, txn, at, m)
        if version is None and self._replay:  # a replayed batch whose commit is in already
            version = self.lake.committed_version(self.spec.name, txn)
        with m.phases("publish"):
            left_deleted = pa.array([], pa.binary())
            if n_deleted and self.spec.publish and self.tombstones_follow_left:
                deleted = keys.filter(F.col("left_deleted")).select("key").toArrow()
                left_deleted = deleted["key"].combine_chunks()
            self._publish_commit(version, left_deleted, txn, at, m)

    # --- the executors' pass --------------------------------------------------------------------
    def result_frame(self, keys: DataFrame) -> DataFrame:
        """The result's rows (``select`` evaluated, by Spark) of the operator's rows ``keys``."""
        return self.projection.frame(keys.select(self.row_columns))

    def _write_on_executors(self, keys: DataFrame, txn: tuple[str, int]) -> int | None:
        live = self.result_frame(keys.filter(F.col("live")))
        if self._result_empty:  # nothing to update or delete: an append, far cheaper than a MERGE
            version = self.lake.append(self.spec.name, live, txn=txn)
        else:
            deletes = keys.filter(~F.col("live")).select("key")
            source = live.withColumn("__delete", F.lit(False)).unionByName(
                deletes.withColumn("__delete", F.lit(True)), allowMissingColumns=True
            )
            version = self.lake.merge(
                self.spec.name, source, ["key"], delete_column="__delete", txn=txn, skip_unchanged=True
            )
        self._result_empty = False
        return version

    # --- the driver's pass (only for a batch whose select failed on some record) ---------------------
    def _write_on_driver(
        self, keys: DataFrame, affected: int, txn: tuple[str, int], at: datetime, m: BatchMetrics
    ) -> int | None:
        """Evaluate ``select`` with the failing records bisected out (quarantined), diff the rest
        against the result and write the changes: the failing keys' results stay as they were."""
        parts = -(-affected // CHUNK_KEYS)
        changes = []
        for part in range(parts):
            chunk = keys if parts == 1 else keys.filter(F.pmod(F.xxhash64("key"), F.lit(parts)) == part)
            chunk_rows = chunk.toArrow()
            desired, failed = self._desired(chunk_rows.filter(chunk_rows["live"]), txn, at, m)
            changes.append(self._changes(desired, _without(chunk_rows["key"].combine_chunks(), failed)))
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
    def _publish_commit(
        self, version: int | None, left_deleted: pa.Array, txn: tuple[str, int], at: datetime, m: BatchMetrics
    ) -> None:
        """Count the batch's commit (its operation metrics) and, for a join that publishes, send its
        change feed: the upserted rows as JSON, a tombstone per deleted key, and one for each left key
        the batch deleted that the result did not hold (as Kafka Streams' foreign-key join does)."""
        changed = pa.array([], pa.binary())
        values = pa.array([], pa.binary())
        if version is not None:
            stats = self.lake.commit(self.spec.name, version).metrics or {}
            inserted = int(stats.get("numTargetRowsInserted", stats.get("numOutputRows", 0)))
            m.upserted = inserted + int(stats.get("numTargetRowsUpdated", 0))
            m.deleted = int(stats.get("numTargetRowsDeleted", 0))
            if self.spec.publish and (m.upserted or m.deleted):
                changed, values = self._commit_changes(version)
        silent = _without(left_deleted, changed)
        if len(changed) or len(silent):
            keys = pa.concat_arrays([changed, silent])
            self._publish(keys, pa.concat_arrays([values, pa.nulls(len(silent), pa.binary())]), txn, at)

    def _commit_changes(self, version: int) -> tuple[pa.Array, pa.Array]:
        """The keys a result commit changed and their new values as JSON (null: deleted), upserts
        first, each group by key."""
        meta = set(self.spec.join_kind.meta_columns)
        columns = [F.col(f"`{c}`") for c in self.result_schema.names if c not in meta]
        as_json = F.to_json(F.struct(*columns), {"ignoreNullFields": "false"}).cast("binary")
        deleted = F.col("_change_type") == "delete"
        feed = self.lake.changes(self.spec.name, version, version)
        out = (
            feed.filter(F.col("_change_type") != "update_preimage")
            .select("key", F.when(deleted, F.lit(None).cast("binary")).otherwise(as_json).alias("v"))
            .toArrow()
        )
        out = out.sort_by([("key", "ascending")]) if out.num_rows else out
        gone = pc.is_null(out["v"])
        ordered = pa.concat_tables([out.filter(pc.invert(gone)), out.filter(gone)])
        return ordered["key"].combine_chunks(), ordered["v"].combine_chunks()
