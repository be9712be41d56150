"""Benchmark: where the join engine's state should live (issue 16's design question, measured).

The same table-table left join (``lv = left.v, rv = right.v``) over the same bronze tables, two ways:

- **engine**: today's engine (``JoinJob.process``): the batch collected to the driver, state and
  result in Delta tables written by delta-rs (append-only state log read by key, one result merge).
- **tws**: Spark's own state store: a streaming query over the two bronze tables,
  ``groupBy("key").transformWithState`` (the Row API, RocksDB provider) keeping the latest left and
  right record per key on the executors, then ``foreachBatch``: ``select`` and one Delta MERGE of the
  changed keys into the result through Delta's Spark SQL, idempotent on replay (``txnAppId``/``txnVersion``).

This is a measuring prototype for the design decision, not the product's engine: the processor here
covers the left table join only. For left 1,000,000 / right 100,000 keys (and 100,000 / 10,000):
the first batch (everything), then BATCHES waves of 1,000 left + 100 right changes on random keys.
Reported per wave: the engine's ``process`` time; for tws the time from the bronze append to the
result visible (``processAllAvailable``) and Spark's own ``triggerExecution`` split into its parts.
Both results are compared with the batch join at the end. Usage: bench_state.py [BATCHES] [--small].
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from benchkit import TABLE_JOIN_PIPELINE, keys, values  # (and tests/ on sys.path)
from bronzekit import append_bronze
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from spark_jobs.config import load_config
from spark_jobs.joins.keyed import job_for
from spark_jobs.lake import Lake
from spark_jobs.session import arrow_frame, get_spark

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
BATCHES = int(ARGS[0]) if ARGS else 8
SIZES = [(100_000, 10_000)] if "--small" in sys.argv else [(100_000, 10_000), (1_000_000, 100_000)]
PAIR = StructType(  # both sides' latest record in one state value: one read and one write per key
    [
        StructField(f"{side}_{field}", kind)
        for side in ("left", "right")
        for field, kind in (("value", BinaryType()), ("ts", LongType()), ("offset", LongType()))
    ]
)
OUTPUT = "key binary, left_value binary, right_value binary, live boolean"


class LatestPerSide(StatefulProcessor):
    """Per key: the latest left and right record (by timestamp, then offset); emits the key's pair
    once per batch when either side changed. ``live``: the left side exists (a left join's row)."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.pair = handle.getValueState("pair", PAIR)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:  # noqa: N802, ARG002
        stored = self.pair.get()
        current = list(stored) if stored is not None else [None] * 6
        changed = False
        for row in rows:
            at = 0 if row.side == "left" else 3
            if current[at + 1] is None or (row.ts, row.offset) > (current[at + 1], current[at + 2]):
                current[at : at + 3] = [row.value, row.ts, row.offset]
                changed = True
        if not changed:
            return
        self.pair.update(tuple(current))
        yield Row(key=key[0], left_value=current[0], right_value=current[3], live=current[1] is not None)

    def close(self) -> None:
        pass


def side(lake: Lake, spark, topic: str) -> DataFrame:
    return (
        spark.readStream.format("delta")
        .load(lake.uri(topic))
        .select(F.lit(topic).alias("side"), "key", "value", F.unix_micros("timestamp").alias("ts"), "offset")
    )


class TwsJoin:
    """The prototype: the streaming query, its sink, and the parts of each batch's time."""

    def __init__(self, spark, lake: Lake, root: Path):
        self.spark, self.lake, self.path = spark, lake, str(root / "tws_result")
        self.merged_at = 0.0
        self.timing = dict.fromkeys(
            [
                "state (transformWithState)",
                "result MERGE (delta-spark)",
                "alternative: append of the changes (delta-spark)",
            ],
            0.0,
        )
        (spark.createDataFrame([], "key binary, lv string, rv string").write.format("delta").save(self.path))
        stream = side(lake, spark, "left").unionByName(side(lake, spark, "right"))
        changed = stream.groupBy("key").transformWithState(LatestPerSide(), OUTPUT, "Update", "None")
        self.query = (
            changed.writeStream.foreachBatch(self.sink)
            .option("checkpointLocation", str(root / "tws_checkpoint"))
            .trigger(processingTime="0 seconds")
            .start()
        )

    def sink(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        batch.persist()
        batch.count()  # the state operator runs here
        merge_started = time.perf_counter()
        self.timing["state (transformWithState)"] += merge_started - started
        rows = batch.select(
            "key",
            "live",
            F.get_json_object(F.col("left_value").cast("string"), "$.v").alias("lv"),
            F.get_json_object(F.col("right_value").cast("string"), "$.v").alias("rv"),
        )
        batch.sparkSession.conf.set("spark.databricks.delta.write.txnAppId", "bench-tws")
        batch.sparkSession.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        rows.createOrReplaceTempView("tws_changes")
        try:
            batch.sparkSession.sql(
                f"""MERGE INTO delta.`{self.path}` t USING tws_changes s ON t.key = s.key
                WHEN MATCHED AND NOT s.live THEN DELETE
                WHEN MATCHED AND s.live THEN UPDATE SET lv = s.lv, rv = s.rv
                WHEN NOT MATCHED AND s.live THEN INSERT (key, lv, rv) VALUES (s.key, s.lv, s.rv)"""
            )
        finally:
            batch.sparkSession.conf.unset("spark.databricks.delta.write.txnAppId")
            batch.sparkSession.conf.unset("spark.databricks.delta.write.txnVersion")
        self.merged_at = time.perf_counter()  # the result is visible from here
        self.timing["result MERGE (delta-spark)"] += self.merged_at - merge_started
        append_started = time.perf_counter()  # the alternative: the changes appended to a log
        rows.write.format("delta").mode("append").option("txnAppId", "bench-tws").option(
            "txnVersion", batch_id
        ).save(self.path + "_changes")
        self.timing["alternative: append of the changes (delta-spark)"] += (
            time.perf_counter() - append_started
        )
        batch.unpersist()

    def wait(self) -> float:
        """Seconds from now until the last result MERGE of what is in bronze now."""
        started = time.perf_counter()
        self.query.processAllAvailable()
        return self.merged_at - started

    def parts(self, since: int) -> dict[str, float]:
        """Seconds per part of the batches after batch id ``since`` (from Spark's progress)."""
        total: dict[str, float] = {}
        for p in self.query.recentProgress:
            if p.batchId > since and p.numInputRows:
                for part, ms in p.durationMs.items():
                    total[part] = total.get(part, 0.0) + ms / 1000
        return total

    def rows(self) -> dict[bytes, tuple]:
        table = self.spark.read.format("delta").load(self.path).toArrow().to_pylist()
        return {bytes(r["key"]): (r["lv"], r["rv"]) for r in table}


def run_size(spark, root: Path, left_keys: int, right_keys: int) -> dict:
    (root / "p.yaml").write_text(TABLE_JOIN_PIPELINE)
    config = load_config(root / "p.yaml")
    lake = Lake(root / "lake")
    rng = np.random.default_rng(42)
    append_bronze(lake, config.topic("left"), keys(np.arange(left_keys)), values("l", left_keys))
    append_bronze(lake, config.topic("right"), keys(np.arange(right_keys)), values("r", right_keys))
    job = job_for(spark, lake, config, config.join("bench"), "bench")
    seen = {"left": 0, "right": 0}

    def unread() -> pa.Table:
        parts = []
        for s in ("left", "right"):
            rows = lake.changes_arrow(s, seen[s] + 1).select(
                ["key", "value", "timestamp", "partition", "offset"]
            )
            seen[s] = lake.version(s)
            parts.append(rows.add_column(0, "side", pa.array([s] * rows.num_rows, pa.string())))
        return pa.concat_tables(parts)

    started = time.perf_counter()
    job.process(arrow_frame(spark, unread()), 0)
    engine_first = time.perf_counter() - started
    tws = TwsJoin(spark, lake, root)
    tws_first = tws.wait()
    tws.timing = dict.fromkeys(tws.timing, 0.0)
    last_batch = tws.query.lastProgress.batchId if tws.query.lastProgress else -1
    engine, tws_waves = [], []
    for b in range(1, BATCHES + 1):
        append_bronze(
            lake,
            config.topic("left"),
            keys(rng.choice(left_keys, 1000, replace=False)),
            values(f"l{b}-", 1000),
        )
        append_bronze(
            lake,
            config.topic("right"),
            keys(rng.choice(right_keys, 100, replace=False)),
            values(f"r{b}-", 100),
        )
        tws_waves.append(tws.wait())  # the query runs while the engine waits its turn
        frame = arrow_frame(spark, unread())
        started = time.perf_counter()
        job.process(frame, b)
        engine.append(time.perf_counter() - started)
    parts = tws.parts(last_batch) | tws.timing
    tws.query.stop()
    mine = tws.rows()
    theirs = {
        bytes(r["key"]): (r["lv"], r["rv"])
        for r in lake.read_arrow("bench", columns=["key", "lv", "rv"]).to_pylist()
    }
    assert mine == theirs and len(mine) == left_keys, "the two results differ"
    return {
        "left": left_keys,
        "right": right_keys,
        "engine_first": engine_first,
        "tws_first": tws_first,
        "engine": statistics.median(engine),
        "tws": statistics.median(tws_waves),
        "tws_max": max(tws_waves),
        "parts": {k: v / BATCHES for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
    }


def main() -> None:
    spark = get_spark(app_name="bench-state")
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    spark.range(1).collect()
    with tempfile.TemporaryDirectory() as tmp:  # warm-up (JIT, Python workers), not reported
        run_size(spark, Path(tmp), 10_000, 1_000)
    for left_keys, right_keys in SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            r = run_size(spark, Path(tmp), left_keys, right_keys)
        parts = ", ".join(f"{k} {v:.2f} s" for k, v in r["parts"].items() if v >= 0.01)
        print(
            f"left {r['left']:>9,} / right {r['right']:>7,} keys: first batch engine {r['engine_first']:.1f} s, "
            f"tws {r['tws_first']:.1f} s; wave of 1,000 + 100 changes: engine batch median {r['engine']:.2f} s, "
            f"tws append -> visible median {r['tws']:.2f} s (max {r['tws_max']:.2f} s, "
            f"{r['tws'] / r['engine']:.2f}x the engine); tws per wave: {parts}; results equal",
            flush=True,
        )


if __name__ == "__main__":
    main()
