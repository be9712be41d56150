"""stream-table: each left event with the right side's value as of its timestamp (docs/joins.md,
"Semantics")."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec
from spark_jobs.joins.engine import RECORD_COLUMNS, BatchMetrics, Projection
from spark_jobs.joins.streams import STATE_SCHEMA, Counts, StreamJob, _stream_tables
from spark_jobs.layout import join_table

EVENT_ORDER = ["timestamp", "partition", "offset"]


class StreamTableJob(StreamJob):
    """stream-table: each left event with the right side's value as of its timestamp.

    State (Delta tables the job owns): ``__right_history``, every right record (appended), and
    ``__waiting``, the events still waiting for the right side (overwritten when it changes).

    With ``grace`` (KIP-923) an event waits until the stream's time (the largest left timestamp read)
    is at least its timestamp plus the grace, so a table update that arrives out of order within the
    grace still counts; without it, until the right side has passed its timestamp or read all it has.

    A left event with a null key (KIP-962) is decided at once: a left join emits it unmatched, an
    inner join skips it (counted); a right record with a null key cannot update the table and is
    quarantined."""

    null_key_sides = ("left",)

    @classmethod
    def _kind_tables(cls, spec: JoinSpec) -> dict[str, pa.Schema]:
        return _stream_tables(spec) | {
            join_table(spec.name, "right_history"): STATE_SCHEMA,
            join_table(spec.name, "waiting"): STATE_SCHEMA,
        }

    def _watermark(self, decision: dict[str, Any], maxima: dict[str, Any]) -> Any:  # noqa: ARG002
        """Without ``grace``: the right side's largest timestamp (its later records are not older).
        With it: the stream's time less the grace (an event at or before it is decided, KIP-923)."""
        if self.spec.grace_ms is None:
            return maxima["right"]
        stream_time = maxima["left"]
        return None if stream_time is None else stream_time - timedelta(milliseconds=self.spec.grace_ms)

    def _drops_null_keys(self) -> tuple[str, ...]:
        # a null key matches nothing: an inner join skips the event, a left join emits it unmatched
        return ("left",) if self.spec.type == "inner" else ()

    def _batch(
        self,
        sides: dict[str, DataFrame],
        totals: dict[str, Counts],
        decision: dict[str, Any],
        txn: tuple[str, int],
        at: datetime,
        m: BatchMetrics,
    ) -> None:
        name = self.spec.name
        m.ignored = totals["left"].tombstones
        if totals["right"].valid:
            self.lake.append(join_table(name, "right_history"), sides["right"], txn=txn)
        events = sides["left"].filter(F.col("value").isNotNull()).withColumn("__old", F.lit(False))
        pending = self._state(join_table(name, "waiting"), RECORD_COLUMNS).withColumn("__old", F.lit(True))
        watermark = decision.get("watermark")
        if self.spec.grace_ms is not None:  # the stream's time alone decides (a --once run holds the rest)
            ready = F.col("timestamp") <= F.lit(watermark) if watermark is not None else F.lit(False)
        elif decision["right_caught_up"]:
            ready = F.lit(True)
        elif watermark is not None:
            ready = F.col("timestamp") < F.lit(watermark)
        else:
            ready = F.lit(False)
        ready = ready | F.col("key").isNull()  # no table record can ever match a null key
        # each event once (a replay may see it in the batch and among the pending ones)
        candidates = (
            events.unionByName(pending)
            .groupBy("partition", "offset")
            .agg(*[F.first(c).alias(c) for c in ("key", "value", "timestamp")], F.max("__old").alias("__old"))
            .withColumn("__ready", ready)
            .persist()
        )
        try:
            ready_now, old = F.col("__ready"), F.col("__old")
            counts: Any = candidates.agg(
                F.count_if(ready_now),
                F.count_if(~ready_now),
                F.count_if((ready_now & old) | (~ready_now & ~old)),
            ).first()
            n_ready, n_waiting, n_changed = (int(v or 0) for v in counts)
            m.affected_keys, m.pending = n_ready, n_waiting
            if n_ready:
                self._append_events(self._as_of(candidates.filter("__ready")), EVENT_ORDER, txn, at, m)
            if n_changed:  # an event decided that was waiting, or a new one that waits
                waiting = candidates.filter(~F.col("__ready")).select(RECORD_COLUMNS)
                self.lake.overwrite(join_table(name, "waiting"), waiting, txn=txn)
        finally:
            candidates.unpersist()

    def _as_of(self, events: DataFrame) -> DataFrame:
        """Each event with the right side's value as of its timestamp (equal timestamps count as
        earlier); ``right_value`` null when there is none or it was deleted."""
        base = events.select(
            "key",
            F.col("value").alias("left_value"),
            "timestamp",
            "partition",
            "offset",
        )
        history = self._state(join_table(self.spec.name, "right_history"), RECORD_COLUMNS).select(
            F.col("key").alias("__hk"),
            F.col("value").alias("__rv"),
            F.col("timestamp").alias("__rts"),
            F.col("partition").alias("__hp"),
            F.col("offset").alias("__ho"),
        )
        matches = base.join(
            history, (F.col("key") == F.col("__hk")) & (F.col("__rts") <= F.col("timestamp")), "left"
        )
        best = matches.groupBy(*base.columns).agg(
            F.max_by(F.struct("__rv", "__hp", "__ho"), F.struct("__rts", "__ho")).alias("__r")
        )
        rows = best.select(
            *base.columns,
            F.col("partition").alias("left_partition"),
            F.col("offset").alias("left_offset"),
            F.col("__r.__rv").alias("right_value"),
            # the matched right record (null: none, or a tombstone: no value to show)
            F.when(F.col("__r.__rv").isNotNull(), F.col("__r.__hp")).alias("right_partition"),
            F.when(F.col("__r.__rv").isNotNull(), F.col("__r.__ho")).alias("right_offset"),
        )
        if self.spec.type == "inner":
            rows = rows.filter(F.col("right_value").isNotNull())
        return rows

    @staticmethod
    def expected(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame, codecs):
        """stream-table: each left event with the right value as of its timestamp (events still waiting
        for the right side to be read are the engine's, not yet in the result)."""
        events = left.filter(F.col("value").isNotNull()).alias("l")
        r = right.alias("r")
        cond = (F.col("l.key") == F.col("r.key")) & (F.col("r.timestamp") <= F.col("l.timestamp"))
        joined = events.join(r, cond, "left")
        order = Window.partitionBy("l.partition", "l.offset").orderBy(
            F.col("r.timestamp").desc_nulls_last(), F.col("r.offset").desc_nulls_last()
        )
        rows = (
            joined.withColumn("_rn", F.row_number().over(order))
            .filter("_rn = 1")
            .select(
                F.col("l.key").alias("key"),
                F.col("l.timestamp").alias("timestamp"),
                F.col("l.partition").alias("partition"),
                F.col("l.offset").alias("offset"),
                F.col("l.value").alias("left_value"),
                F.col("r.value").alias("right_value"),
                F.when(F.col("r.value").isNotNull(), F.col("r.partition")).alias("right_partition"),
                F.when(F.col("r.value").isNotNull(), F.col("r.offset")).alias("right_offset"),
            )
        )
        if spec.type == "inner":
            rows = rows.filter(F.col("right_value").isNotNull())
        waiting = lake.read(join_table(spec.name, "waiting")).select("partition", "offset")
        return rows.join(waiting, ["partition", "offset"], "left_anti"), Projection(spark, codecs, spec).frame
