"""The kinds whose state is in Spark's state store: the join's plan groups the records into the kind's
Java operator (``lake.joins.<operator>``, under ``spark_jobs/joins/java``), which emits one row per
key whose joined row the batch changed; ``foreachBatch`` evaluates ``select`` over those rows, diffs
them against the result and writes the changes (:class:`StateStoreJob`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.joins.engine import (
    BatchMetrics,
    JoinJob,
    _without,
)

# counts a state operator may add to its rows, and the metric each one sums into
OPERATOR_COUNTS = {
    "n_null": "null_keys",
    "elements_joined": "elements_joined",
    "elements_retracted": "elements_retracted",
    "elements_kept": "elements_kept",
}
CHUNK_KEYS = 100_000  # result keys recomputed at a time: a hot key's fan-out is bounded in memory


class StateStoreJob(JoinJob):
    """A kind whose state operator is Java, in Spark's state store (``operator``): the plan runs it over
    the valid records, and each batch recomputes the rows it emits for changed keys."""

    state_in_checkpoint = True

    operator: str  # the Java operator: lake.joins.<operator>.apply(records, join type)
    # the operator's columns that ``select`` is evaluated over (besides live, changed, left_deleted)
    row_columns = ["key", "left_value", "__lp", "__lo", "right_value", "__rp", "__ro"]

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
        extra = [c for c in OPERATOR_COUNTS if c in rows.columns]
        counts += [F.sum(c) for c in extra]
        totals: Any = rows.agg(*counts).first() or []  # an aggregate has one row
        n_left, n_right, changed, n_bad, bad_left, *more = [int(v or 0) for v in totals]
        m.input_left, m.input_right = n_left + bad_left, n_right + n_bad - bad_left
        m.quarantined, m.affected_keys = n_bad, changed
        for column, value in zip(extra, more, strict=True):
            setattr(m, OPERATOR_COUNTS[column], value)
        if n_bad:
            self._quarantine(rows.filter(~valid).toArrow(), txn, at)
        if not changed:
            return
        parts = -(-m.affected_keys // CHUNK_KEYS)  # a hot key's fan-out is recomputed in bounded chunks
        keys = rows.filter(valid & F.col("changed")).select(*self.row_columns, "live", "left_deleted")
        changes, deleted = [], []
        for part in range(parts):
            chunk = keys if parts == 1 else keys.filter(F.pmod(F.xxhash64("key"), F.lit(parts)) == part)
            chunk_rows = chunk.toArrow()
            desired, failed = self._desired(chunk_rows.filter(chunk_rows["live"]), txn, at, m)
            deleted.append(chunk_rows.filter(chunk_rows["left_deleted"])["key"].combine_chunks())
            changes.append(self._changes(desired, _without(chunk_rows["key"].combine_chunks(), failed)))
        self._left_tombstones = pa.concat_arrays(deleted)
        self._write_changes(changes, txn, at, m)

    def _desired(
        self, live: pa.Table, txn: tuple[str, int], at: datetime, m: BatchMetrics
    ) -> tuple[pa.Table, pa.Array]:
        """The result rows of the operator's live rows, and the keys ``select`` failed on."""
        return self._project(live.select(self.row_columns), txn, at, m)
