"""Benchmark: the state operator of the joins, a Java stateful processor against the same in Python.

Issue 16's design question was where the join state should live; the first measurement (README)
compared the Delta-table engine with a PySpark ``transformWithState`` and found PySpark paying about
0.2 ms per key. The engine now keeps its state in Spark's state store with a Java processor. This
benchmark runs the same table-table left join (``lv = left.v, rv = right.v``) over the same data two
ways, each alone on its own lake:

- **engine**: the product's join as ``lake run`` runs it: the bronze tables streamed, ``JoinJob.plan``
  (the Java ``lake.joins.TableJoin`` processor, RocksDB), ``foreachBatch(JoinJob.process)``: select,
  the result's changes merged and the metrics written;
- **python**: the same state shape as a PySpark ``StatefulProcessor`` (Row API, RocksDB), then one
  Delta MERGE of the changed keys through Delta's Spark SQL (``txnAppId``/``txnVersion``).

For left 1,000,000 / right 100,000 keys (and 100,000 / 10,000): the first batch (everything), then
BATCHES waves of 1,000 left + 100 right changes on random keys, each timed from the bronze append to
the result visible (``processAllAvailable``), with Spark's own split of the batch time. The two
results are compared at the end. Usage: bench_state.py [BATCHES] [--small].
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from benchkit import TABLE_JOIN_PIPELINE, EngineJoin, Timed, keys, values  # (and tests/ on sys.path)
from bronzekit import append_bronze
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from spark_jobs.config import load_config
from spark_jobs.lake import Lake
from spark_jobs.session import get_spark

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


class PythonJoin(Timed):
    """The PySpark processor, then one Delta MERGE of the changed keys per batch."""

    def __init__(self, spark, lake: Lake, config, root: Path):  # noqa: ARG002
        self.spark, self.path = spark, str(root / "python_result")
        (spark.createDataFrame([], "key binary, lv string, rv string").write.format("delta").save(self.path))
        stream = side(lake, spark, "left").unionByName(side(lake, spark, "right"))
        changed = stream.groupBy("key").transformWithState(LatestPerSide(), OUTPUT, "Update", "None")
        self.query = (
            changed.writeStream.foreachBatch(self.sink)
            .option("checkpointLocation", str(root / "python_checkpoint"))
            .trigger(processingTime="0 seconds")
            .start()
        )

    def sink(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.select(
            "key",
            "live",
            F.get_json_object(F.col("left_value").cast("string"), "$.v").alias("lv"),
            F.get_json_object(F.col("right_value").cast("string"), "$.v").alias("rv"),
        )
        batch.sparkSession.conf.set("spark.databricks.delta.write.txnAppId", "bench-python")
        batch.sparkSession.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        rows.createOrReplaceTempView("python_changes")
        try:
            batch.sparkSession.sql(
                f"""MERGE INTO delta.`{self.path}` t USING python_changes s ON t.key = s.key
                WHEN MATCHED AND NOT s.live THEN DELETE
                WHEN MATCHED AND s.live THEN UPDATE SET lv = s.lv, rv = s.rv
                WHEN NOT MATCHED AND s.live THEN INSERT (key, lv, rv) VALUES (s.key, s.lv, s.rv)"""
            )
        finally:
            batch.sparkSession.conf.unset("spark.databricks.delta.write.txnAppId")
            batch.sparkSession.conf.unset("spark.databricks.delta.write.txnVersion")
        self.visible_at = time.perf_counter()

    def rows(self) -> dict[bytes, tuple]:
        table = self.spark.read.format("delta").load(self.path).toArrow().to_pylist()
        return {bytes(r["key"]): (r["lv"], r["rv"]) for r in table}


def run_size(spark, root: Path, system: type[Timed], left_keys: int, right_keys: int) -> dict:
    (root / "p.yaml").write_text(TABLE_JOIN_PIPELINE)
    config = load_config(root / "p.yaml")
    lake = Lake(root / "lake")
    rng = np.random.default_rng(42)  # the same data for both systems
    append_bronze(lake, config.topic("left"), keys(np.arange(left_keys)), values("l", left_keys))
    append_bronze(lake, config.topic("right"), keys(np.arange(right_keys)), values("r", right_keys))
    join = system(spark, lake, config, root)  # type: ignore[call-arg]
    first = join.wait()
    since = join.last_batch()
    waves = []
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
        waves.append(join.wait())
    parts = join.parts(since)
    join.query.stop()  # type: ignore[attr-defined]
    return {
        "first": first,
        "wave": statistics.median(waves),
        "max": max(waves),
        "parts": {k: v / BATCHES for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
        "rows": join.rows(),  # type: ignore[attr-defined]
    }


def main() -> None:
    spark = get_spark(app_name="bench-state")
    spark.range(1).collect()
    for system in (EngineJoin, PythonJoin):  # warm-up (JIT, Python workers), not reported
        with tempfile.TemporaryDirectory() as tmp:
            run_size(spark, Path(tmp), system, 10_000, 1_000)
    for left_keys, right_keys in SIZES:
        figures = {}
        for name, system in (("engine", EngineJoin), ("python", PythonJoin)):
            with tempfile.TemporaryDirectory() as tmp:
                figures[name] = run_size(spark, Path(tmp), system, left_keys, right_keys)
        engine, python = figures["engine"], figures["python"]
        assert engine["rows"] == python["rows"] and len(engine["rows"]) == left_keys, "the two results differ"
        print(
            f"left {left_keys:>9,} / right {right_keys:>7,} keys: first batch engine {engine['first']:.1f} s, "
            f"python {python['first']:.1f} s ({python['first'] / engine['first']:.1f}x); wave of 1,000 + 100 "
            f"changes, append -> visible: engine median {engine['wave']:.2f} s (max {engine['max']:.2f} s), "
            f"python median {python['wave']:.2f} s (max {python['max']:.2f} s, "
            f"{python['wave'] / engine['wave']:.1f}x); results equal",
            flush=True,
        )
        for name in ("engine", "python"):
            parts = ", ".join(f"{k} {v:.2f} s" for k, v in figures[name]["parts"].items() if v >= 0.01)
            print(f"  {name} per wave: {parts}", flush=True)


if __name__ == "__main__":
    main()
