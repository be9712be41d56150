"""stream-stream: every left/right pair of one key within the window (docs/joins.md, "Semantics")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec
from spark_jobs.join_kinds import STREAM_STREAM
from spark_jobs.joins.engine import RECORD_COLUMNS, BatchMetrics, Projection
from spark_jobs.joins.streams import BUFFER_SCHEMA, PAIR_COLUMNS, Counts, StreamJob, _stream_tables
from spark_jobs.layout import join_table

SIDES = ("left", "right")


class StreamStreamJob(StreamJob):
    """stream-stream: every left/right pair of one key within the window.

    State (Delta tables the job owns): ``__left_buffer`` and ``__right_buffer``, each side's events
    whose window is still open, with whether they have been paired yet (overwritten when they
    change)."""

    time_columns = ("left_timestamp", "right_timestamp")
    # KIP-962: an event with a null key pairs with nothing; it leaves at once, emitted unmatched by the
    # sides the join type keeps (left: the left's; outer: both), skipped (counted) otherwise
    null_key_sides = ("left", "right")

    @classmethod
    def _kind_tables(cls, spec: JoinSpec) -> dict[str, pa.Schema]:
        return _stream_tables(spec) | {
            join_table(spec.name, "left_buffer"): BUFFER_SCHEMA,
            join_table(spec.name, "right_buffer"): BUFFER_SCHEMA,
        }

    def _batch(
        self,
        sides: dict[str, DataFrame],
        totals: dict[str, Counts],
        decision: dict[str, Any],
        txn: tuple[str, int],
        at: datetime,
        m: BatchMetrics,
    ) -> None:
        name, window = self.spec.name, int(self.spec.window_ms or 0) * 1000  # microseconds
        m.ignored = totals["left"].tombstones + totals["right"].tombstones
        new = {
            side: sides[side]
            .filter(F.col("value").isNotNull())
            .withColumns({"matched": F.lit(False), "__old": F.lit(False)})
            for side in SIDES
        }
        old = {
            side: self._state(join_table(name, f"{side}_buffer"), [*RECORD_COLUMNS, "matched"]).withColumn(
                "__old", F.lit(True)
            )
            for side in SIDES
        }
        paired = (
            _window_pairs(new["left"], old["right"].unionByName(new["right"]), window)
            .unionByName(_window_pairs(old["left"], new["right"], window))
            .persist()
        )
        cached = [paired]
        try:
            rows = {}
            for side in SIDES:
                rows[side] = _side_rows(old[side], new[side], paired, side, decision.get("watermark"), window)
                cached.append(rows[side].persist())
            counts = _count(rows)
            m.pending = counts["left"]["kept"] + counts["right"]["kept"]
            if counts["left"]["hit"] or any(counts[s]["closed"] for s in SIDES if self._keeps(s)):
                out_rows = paired
                for side in filter(self._keeps, SIDES):
                    closed = rows[side].filter(F.col("__expires") & ~F.col("matched"))
                    out_rows = out_rows.unionByName(_unmatched(closed, side))
                self._append_events(out_rows, list(STREAM_STREAM.meta_columns[1:]), txn, at, m)
                m.affected_keys = m.appended
            for side in SIDES:
                if counts[side]["changed"]:  # else the buffer holds what it held
                    buffer = rows[side].filter(~F.col("__expires")).select(*RECORD_COLUMNS, "matched")
                    self.lake.overwrite(join_table(name, f"{side}_buffer"), buffer, txn=txn)
        finally:
            for frame in cached:
                frame.unpersist()

    def _drops_null_keys(self) -> tuple[str, ...]:
        return tuple(side for side in SIDES if not self._keeps(side))

    def _keeps(self, side: str) -> bool:
        """Does the join type emit this side's events that found no pair?"""
        return self.spec.type == "outer" or (side == "left" and self.spec.type == "left")

    @staticmethod
    def expected(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame, codecs):
        """stream-stream: every pair within the window, and the events of the kept sides whose window
        had closed by the last batch's watermark without a pair."""
        return _expected_pairs(lake, spec, left, right), Projection(spark, codecs, spec).frame


def _side_rows(
    old: DataFrame, new: DataFrame, paired: DataFrame, side: str, watermark: Any, window_us: int
) -> DataFrame:
    """A side's buffered and new events, each with whether it is paired now (``__hit``), has ever
    been (``matched``), was buffered before (``__old``) and leaves the buffer as its window closed
    (``__expires``: no later record can pair with it once the watermark is past its window)."""
    hits = (
        paired.select(F.col(f"{side}_partition").alias("__p"), F.col(f"{side}_offset").alias("__o"))
        .distinct()
        .withColumn("__hit", F.lit(True))
    )
    hit = (F.col("partition") == F.col("__p")) & (F.col("offset") == F.col("__o"))
    expires = F.col("key").isNull()  # a null key pairs with nothing: its window is closed at once
    if watermark is not None:
        closed = F.unix_micros("timestamp") + F.lit(window_us) < F.unix_micros(F.lit(watermark))
        expires = expires | closed
    return (
        old.unionByName(new)
        .join(hits, hit, "left")
        .select(
            F.lit(side).alias("__side"),
            *RECORD_COLUMNS,
            (F.col("matched") | F.coalesce(F.col("__hit"), F.lit(False))).alias("matched"),
            F.coalesce(F.col("__hit"), F.lit(False)).alias("__hit"),
            F.col("matched").alias("__was_matched"),
            "__old",
        )
        .withColumn("__expires", expires)
    )


def _count(rows: dict[str, DataFrame]) -> dict[str, dict[str, int]]:
    """One job counts both sides: kept in the buffer, closed unmatched, paired now, and how many
    buffered events the batch changes (closed, or paired for the first time) or adds."""
    was, expires = F.col("__old"), F.col("__expires")
    newly = F.col("__hit") & ~F.col("__was_matched")
    counted = (
        rows["left"]
        .unionByName(rows["right"])
        .groupBy("__side")
        .agg(
            F.count_if(~expires).alias("kept"),
            F.count_if(expires & ~F.col("matched")).alias("closed"),
            F.count_if(F.col("__hit")).alias("hit"),
            F.count_if((was & (expires | newly)) | (~was & ~expires)).alias("changed"),
        )
    )
    counts = {side: {"kept": 0, "closed": 0, "hit": 0, "changed": 0} for side in SIDES}
    for r in counted.collect():
        counts[r["__side"]] = r.asDict()
    return counts


def _window_pairs(left: DataFrame, right: DataFrame, window_us: int) -> DataFrame:
    """Every (left, right) pair with the same key and |timestamps| <= window."""
    lhs, rhs = _as_side(left, "left", "__lk"), _as_side(right, "right", "__rk")
    gap = F.abs(F.unix_micros("left_timestamp") - F.unix_micros("right_timestamp"))
    pairs = lhs.join(rhs, (F.col("__lk") == F.col("__rk")) & (gap <= F.lit(window_us)), "inner")
    return pairs.withColumnRenamed("__lk", "key").select(PAIR_COLUMNS)


def _as_side(records: DataFrame, side: str, key: str) -> DataFrame:
    """A side's records with their columns named for a pair (``left_value``, ``left_timestamp`` ...),
    the key as ``key``."""
    columns = [F.col(c).alias(f"{side}_{c}") for c in ("value", "timestamp", "partition", "offset")]
    return records.select(F.col("key").alias(key), *columns)


def _unmatched(rows: DataFrame, side: str) -> DataFrame:
    """A side's events without a pair, as pairs with the other side's columns null."""
    other = "right" if side == "left" else "left"
    columns: dict[str, Column] = {
        "key": F.col("key"),
        f"{side}_timestamp": F.col("timestamp"),
        f"{side}_partition": F.col("partition"),
        f"{side}_offset": F.col("offset"),
        f"{other}_timestamp": F.lit(None).cast("timestamp"),
        f"{other}_partition": F.lit(None).cast("int"),
        f"{other}_offset": F.lit(None).cast("bigint"),
        f"{side}_value": F.col("value"),
        f"{other}_value": F.lit(None).cast("binary"),
    }
    return rows.select(*[columns[c].alias(c) for c in PAIR_COLUMNS])


def _expected_pairs(lake: Any, spec: JoinSpec, left: DataFrame, right: DataFrame) -> DataFrame:
    """The oracle's pairs: every left/right pair of one key within the window, then (left and outer
    joins) each kept side's event with no pair whose window closed before the last batch's watermark."""
    window_us = int(spec.window_ms or 0) * 1000
    cols = ["key", "timestamp", "partition", "offset", "value"]
    lhs = left.filter(F.col("value").isNotNull()).select(*[F.col(c).alias(f"left_{c}") for c in cols])
    rhs = right.filter(F.col("value").isNotNull()).select(*[F.col(c).alias(f"right_{c}") for c in cols])
    gap = F.abs(F.unix_micros("left_timestamp") - F.unix_micros("right_timestamp"))
    pairs = lhs.join(rhs, (F.col("left_key") == F.col("right_key")) & (gap <= window_us), "inner")
    out = [
        F.coalesce("left_key", "right_key").alias("key"),
        *[F.col(f"{s}_{c}") for s in ("left", "right") for c in ("timestamp", "partition", "offset")],
        F.col("left_value"),
        F.col("right_value"),
    ]
    result = pairs.select(*out)
    progress = lake.read_arrow(join_table(spec.name, "progress"), columns=["watermark"])  # the last batch's
    last = progress["watermark"][0].as_py() if progress.num_rows else None
    if spec.type != "inner":
        sides = [("left", lhs, rhs)] + ([("right", rhs, lhs)] if spec.type == "outer" else [])
        for side, mine, other in sides:
            o = "right" if side == "left" else "left"
            near = F.abs(F.unix_micros(f"{side}_timestamp") - F.unix_micros(f"{o}_timestamp")) <= window_us
            lonely = mine.join(other, (F.col(f"{side}_key") == F.col(f"{o}_key")) & near, "left_anti")
            expired = F.col(f"{side}_key").isNull()  # KIP-962: a null key's event leaves at once
            if last is not None:
                closed = F.unix_micros(f"{side}_timestamp") + window_us < F.lit(int(last.timestamp() * 1e6))
                expired = expired | closed
            lonely = lonely.filter(expired)
            for c in ("key", "timestamp", "partition", "offset", "value"):
                lonely = lonely.withColumn(f"{o}_{c}", F.lit(None).cast(mine.schema[f"{side}_{c}"].dataType))
            result = result.unionByName(lonely.select(*out))
    return result
