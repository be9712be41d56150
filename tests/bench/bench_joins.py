"""Benchmark: the table-table join under steady micro-batches, against recomputing the whole join.

For left 1,000,000 keys / right 100,000 keys, and again at 100,000 / 10,000: load the topics, run the
first micro-batch (everything), then BATCHES micro-batches of 1,000 left + 100 right changes each
(random keys, new values), with the join running as ``lake run`` runs it (its Kafka topics streamed into
the engine's plan and ``foreachBatch``), and report the median time from the produce to the result
visible. A 10,000-key round first warms the JVM and the Python workers and is not reported. The baseline, measured in the same run at each size: recompute the whole join from the topics
with Spark (latest value per key of both topics, join, select) and overwrite a result table, as a job
without incremental state would every batch. `make bench` runs it (and `make bench-cluster` on the standalone cluster, without the deletion-vector
run); usage: bench_joins.py [BATCHES] [--no-deletion-vectors].
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchkit import (  # (and tests/ on sys.path)
    TABLE_JOIN_PIPELINE,
    EngineJoin,
    embedded_broker,
    kafka_records,
    keys,
    produce_records,
    values,
)

from spark_jobs.config import load_config
from spark_jobs.joins.oracle import expected
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.session import get_spark

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
BATCHES = int(ARGS[0]) if ARGS else 10
WITH_DV = "--no-deletion-vectors" not in sys.argv[1:]  # bench-cluster leaves the DV run out


DV_DEFAULT = "spark.databricks.delta.properties.defaults.enableDeletionVectors"


def run_size(spark, root: Path, left_keys: int, right_keys: int, deletion_vectors: bool = False) -> dict:
    """One size; ``deletion_vectors``: the tables made with Delta's deletion vectors, so that a MERGE
    marks the replaced rows instead of rewriting their files."""
    spark.conf.set(DV_DEFAULT, str(deletion_vectors).lower())
    os.environ["LAKE_KAFKA_TOPIC_PREFIX"] = f"{root.name}."  # each size's topics of its own
    (root / "p.yaml").write_text(TABLE_JOIN_PIPELINE)
    config = load_config(root / "p.yaml")
    lake = Lake(root / "lake")
    rng = np.random.default_rng(42)
    produce_records(lake, config, "left", keys(np.arange(left_keys)), values("l", left_keys))
    produce_records(lake, config, "right", keys(np.arange(right_keys)), values("r", right_keys))
    join = EngineJoin(spark, lake, config, root)
    first = join.wait()
    latencies = []
    for b in range(1, BATCHES + 1):
        before = join.affected  # before the appends: the query may finish a batch before wait()
        produce_records(
            lake, config, "left", keys(rng.choice(left_keys, 1000, replace=False)), values(f"l{b}-", 1000)
        )
        produce_records(
            lake, config, "right", keys(rng.choice(right_keys, 100, replace=False)), values(f"r{b}-", 100)
        )
        latencies.append(join.wait())  # a wave may be one micro-batch or two (left, then right)
        assert join.affected - before >= 1000
    join.query.stop()
    job = join.job
    # baseline: the whole join recomputed from the topics and written, as a stateless job would
    recompute = []
    schema = job.result_schema
    lake.create("bench_recomputed", schema)
    for _ in range(3):
        started = time.perf_counter()
        table = expected(spark, lake, config, "bench", kafka_records(spark, lake, config))
        lake.overwrite("bench_recomputed", table)
        recompute.append(time.perf_counter() - started)
    result_rows = lake.read_arrow("bench").num_rows
    assert result_rows == table.num_rows == left_keys
    return {
        "left": left_keys,
        "right": right_keys,
        "first": first,
        "median": statistics.median(latencies),
        "p90": sorted(latencies)[int(0.9 * (len(latencies) - 1))],
        "recompute": statistics.median(recompute),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, embedded_broker(Path(tmp) / "kafka"):
        sizes(get_spark(app_name="bench-joins"))


def sizes(spark) -> None:
    spark.range(1).collect()
    with tempfile.TemporaryDirectory() as tmp:  # warm-up (JIT, Python workers), not reported
        run_size(spark, Path(tmp), 10_000, 1_000)
    results = []
    sizes = [(100_000, False), (1_000_000, False)] + ([(1_000_000, True)] if WITH_DV else [])
    print(f"Spark master: {spark.sparkContext.master}", flush=True)
    for left_keys, dv in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            r = run_size(spark, Path(tmp), left_keys, left_keys // 10, deletion_vectors=dv)
        results.append(r)
        print(
            f"table join left {r['left']:>9,} / right {r['right']:>7,} keys"
            f"{' (deletion vectors)' if dv else ''}: first batch {r['first']:6.1f} s; "
            f"steady batch (1,000 left + 100 right changes) median {r['median']:.2f} s, p90 {r['p90']:.2f} s; "
            f"whole-join recompute {r['recompute']:.1f} s ({r['recompute'] / r['median']:.1f}x the batch)",
            flush=True,
        )
    small, big = results[:2]
    if WITH_DV:
        big_dv = results[2]
        print(
            f"deletion vectors at 1M keys: median batch {big_dv['median']:.2f} s against {big['median']:.2f} s "
            f"copy-on-write ({big['median'] / big_dv['median']:.2f}x)"
        )
    print(
        f"growth: 10x more data -> {big['median'] / small['median']:.2f}x the median batch latency (goal <= 1.5x); "
        f"at 1M keys the incremental batch is {big['recompute'] / big['median']:.1f}x faster than recomputing "
        f"(goal >= 10x)"
    )


if __name__ == "__main__":
    main()
