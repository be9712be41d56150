"""Benchmark: the table join and the fk join with their lake root on S3, next to the same joins on a
local root, in the same run.

The S3 store is the embedded one (``lake s3``: S3Proxy on loopback, its filesystem backend on this
machine's disk), so the figures are what the S3 protocol costs (requests, their round trips, Delta's
log on an object store), not a network's latency. For each join and root: left 100,000 / right
10,000 keys loaded, the first micro-batch (everything), then BATCHES waves of 1,000 left + 100 right
changes, timed from the produce to the result visible (the batch's Delta commit), as ``lake run``
runs the join. The fk join's left records point at a right key each (``fk``: ten per right key), so
a right change reaches ten results. For S3, Spark's S3A connector counts its requests (LIST, HEAD, GET, PUT, DELETE, COPY) per
wave; the result table's data files and log entries are counted at the end (Delta writes a log
checkpoint every 10 commits). Usage: bench_s3.py [BATCHES] [--big | --small] (1,000,000 / 100,000
or 10,000 / 1,000 keys).
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
from benchkit import TABLE_JOIN_PIPELINE, EngineJoin, embedded_broker, keys, produce_records, values

from spark_jobs.config import load_config
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.session import get_spark, use_root

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
BATCHES = int(ARGS[0]) if ARGS else 10
BIG = "--big" in sys.argv[1:]
SMALL = "--small" in sys.argv[1:]  # 10,000 / 1,000 keys: a quick look, not a figure
BUCKET = "bench"
# S3A's request counters (IOStatistics) summed per wave
REQUESTS = {
    "LIST": ("object_list_request",),
    "HEAD": ("object_metadata_request",),
    "GET": ("action_http_get_request",),
    "PUT": ("object_put_request", "object_multipart_initiated"),
    "DELETE": ("object_delete_request", "object_bulk_delete_request"),
    "COPY": ("object_copy_requests",),
}


FK_JOIN_PIPELINE = """
topics:
  left: {partitions: 4}
  right: {partitions: 4}
joins:
  bench: {kind: fk, left: left, right: right, foreign_key: fk, type: left, select: {lv: left.v, rv: right.v}}
"""
PIPELINES = {"table": TABLE_JOIN_PIPELINE, "fk": FK_JOIN_PIPELINE}


def left_values(kind: str, tag: str, ids: np.ndarray, right_keys: int) -> pa.Array:
    """The left records' values: ``{"v"}``, and for the fk join the right key each points at."""
    if kind == "table":
        return values(tag, len(ids))
    return pa.array([f'{{"v":"{tag}{i}","fk":"c{i % right_keys}"}}'.encode() for i in ids], pa.binary())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def s3a_requests(spark) -> dict[str, int]:
    """S3A's request counts so far, for the bench bucket's file system (one per JVM: the executors
    of a local master share it)."""
    jvm = spark._jvm
    fs = jvm.org.apache.hadoop.fs.Path(f"s3a://{BUCKET}/").getFileSystem(spark._jsc.hadoopConfiguration())
    counters = fs.getIOStatistics().counters()
    return {what: sum(int(counters.get(n) or 0) for n in names) for what, names in REQUESTS.items()}


def run_root(spark, kind: str, where: str, scratch: Path, lake_root, checkpoints, left_keys: int) -> dict:
    right_keys = left_keys // 10
    os.environ["LAKE_KAFKA_TOPIC_PREFIX"] = f"{where}-{scratch.name}."
    (scratch / "p.yaml").write_text(PIPELINES[kind])
    config = load_config(scratch / "p.yaml")
    lake = Lake(lake_root)
    use_root(spark, lake.root)  # the session was built before the root was known
    rng = np.random.default_rng(42)
    everyone = np.arange(left_keys)
    produce_records(lake, config, "left", keys(everyone), left_values(kind, "l", everyone, right_keys))
    produce_records(lake, config, "right", keys(np.arange(right_keys)), values("r", right_keys))
    join = EngineJoin(spark, lake, config, checkpoints)
    first = join.wait()
    on_s3 = lake.root.on_object_storage
    latencies, waves = [], []
    for b in range(1, BATCHES + 1):
        before_keys = join.affected
        before = s3a_requests(spark) if on_s3 else {}
        changed = rng.choice(left_keys, 1000, replace=False)
        produce_records(lake, config, "left", keys(changed), left_values(kind, f"l{b}-", changed, right_keys))
        produce_records(
            lake, config, "right", keys(rng.choice(right_keys, 100, replace=False)), values(f"r{b}-", 100)
        )
        latencies.append(join.wait())
        assert join.affected - before_keys >= 1000
        if on_s3:
            after = s3a_requests(spark)
            waves.append({k: after[k] - before[k] for k in after})
    join.query.stop()
    assert lake.read_arrow("bench", columns=["key"]).num_rows == left_keys
    table = lake.path("bench")
    log = [p.name for p in (table / "_delta_log").iterdir()]
    data_files = spark.read.format("delta").load(str(table)).inputFiles()
    return {
        "kind": kind,
        "where": where,
        "first": first,
        "median": statistics.median(latencies),
        "p90": sorted(latencies)[int(0.9 * (len(latencies) - 1))],
        "requests": {k: statistics.median(w[k] for w in waves) for k in REQUESTS} if waves else {},
        "commits": sum(n.endswith(".json") and not n.startswith("_") for n in log),
        "log_checkpoints": sum(n.endswith(".checkpoint.parquet") for n in log),
        "data_files": len(data_files),
    }


def main() -> None:
    from spark_jobs.seams import embedded_s3

    left_keys = 1_000_000 if BIG else 10_000 if SMALL else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = embedded_s3.S3Store(work / "store").start(_free_port(), buckets=(BUCKET,))
        # the way a user's own store is reached, and before Spark starts (S3A reads them)
        os.environ.update(
            {
                "AWS_ENDPOINT_URL": str(store.address),
                "AWS_ACCESS_KEY_ID": str(store.details["access_key"]),
                "AWS_SECRET_ACCESS_KEY": str(store.details["secret_key"]),
                "AWS_REGION": embedded_s3.REGION,
                "LAKE_WORK": str(work / "work"),
            }
        )
        try:
            with embedded_broker(work / "kafka"):
                spark = get_spark(app_name="bench-s3")
                spark.range(1).collect()
                for kind in PIPELINES:
                    results = []
                    for where in ("warm-up", "local", "s3"):
                        scratch = Path(tempfile.mkdtemp(dir=tmp))
                        if where == "s3":
                            root = f"s3a://{BUCKET}/{scratch.name}/lake"
                            checkpoints = Lake(root).layout.root
                        else:
                            root, checkpoints = str(scratch / "lake"), scratch
                        size = 10_000 if where == "warm-up" else left_keys
                        r = run_root(spark, kind, where, scratch, root, checkpoints, size)
                        if where != "warm-up":
                            results.append(r)
                            report(r, left_keys)
                    local, s3 = results
                    print(
                        f"{kind} join, S3 against local disk: first batch {s3['first'] / local['first']:.2f}x, "
                        f"steady batch median {s3['median'] / local['median']:.2f}x "
                        f"({s3['median'] - local['median']:+.2f} s per wave)",
                        flush=True,
                    )
        finally:
            embedded_s3.S3Store(work / "store").stop()


def report(r: dict, left_keys: int) -> None:
    requests = ", ".join(f"{k} {v:g}" for k, v in r["requests"].items()) if r["requests"] else "-"
    print(
        f"{r['kind']} join on {r['where']:>5} root, left {left_keys:,} / right {left_keys // 10:,} keys: first batch "
        f"{r['first']:.1f} s; steady wave (1,000 left + 100 right changes) median {r['median']:.2f} s, "
        f"p90 {r['p90']:.2f} s; S3 requests per wave (median): {requests}; result table: "
        f"{r['data_files']} data files, {r['commits']} commits, {r['log_checkpoints']} log checkpoint(s)",
        flush=True,
    )


if __name__ == "__main__":
    main()
