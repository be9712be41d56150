"""Benchmark: foreign-key and list joins under the micro-batches the issue names, against recomputing
the whole join in the same run.

FK: 1,000,000 products / 100,000 merchants; merchant m0 is referenced by 100,000 products (the hot
key), the other 900,000 products point at random other merchants.
  - fan-out: a batch with one update of m0 (100,000 result rows change);
  - a batch of 1,000 random product updates (a tenth of them move to another merchant).
List: 100,000 persons x 10 address ids into 200,000 addresses, plus one person with 10,000 addresses.
  - a batch of 1,000 address updates (every person holding one is re-enriched);
  - the 10,000-address person gains one address: the goal is one element joined, not 10,000.
Each join runs as ``lake run`` runs it: its Kafka topics streamed into the join's plan (its state
operators in Spark's state store), then ``foreachBatch`` of the engine; a batch is timed from the
produce to the result visible, with the result rows changed per second and the work counters
of ``join_metrics``. The baseline: the whole join recomputed from the topics with Spark (the oracle)
and written over a table, as a stateless job would every batch. ``--hot-million`` adds the extreme
skew case: 1,000,000 products all pointing at one merchant, and that merchant updated (with the peak
memory of the Python driver and of the Spark JVM during that batch). `make bench` runs it; usage:
bench_keyed.py [--hot-million].
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pyarrow as pa
from benchkit import EngineJoin, embedded_broker, kafka_records, produce_records  # (and tests/ on sys.path)

from spark_jobs.config import load_config
from spark_jobs.joins.engine import BatchMetrics
from spark_jobs.joins.oracle import expected
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.session import get_spark

CONFIG = """
topics:
  products: {partitions: 4}
  merchants: {partitions: 4}
  persons: {partitions: 4}
  addresses: {partitions: 4}
joins:
  fk: {kind: fk, left: products, right: merchants, foreign_key: m, type: left, select: {title: left.t, merchant: right.n}}
  people: {kind: list, left: persons, right: addresses, list: ids, select: {name: left.n}, elements: {city: right.c}}
"""


def jvm_pid(spark) -> int:
    return spark.sparkContext._gateway.proc.pid


def peak_mb(pid: int | str = "self") -> float:
    """Peak resident memory of a process (VmHWM) since it started or since :func:`reset_peaks`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peaks(*pids: int | str) -> None:
    """Start the peak resident memory (VmHWM) of these processes over from their current size."""
    for pid in pids:
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def encode(items) -> pa.Array:
    return pa.array([s.encode() for s in items], pa.binary())


def json_values(rows) -> pa.Array:
    return pa.array([json.dumps(r, separators=(",", ":")).encode() for r in rows], pa.binary())


class Bench:
    def __init__(self, spark, root: Path):
        os.environ["LAKE_KAFKA_TOPIC_PREFIX"] = f"{root.name}."  # each run's topics of its own
        (root / "p.yaml").write_text(CONFIG)
        self.spark, self.root = spark, root
        self.config, self.lake = load_config(root / "p.yaml"), Lake(root / "lake")
        self.engines: dict[str, EngineJoin] = {}

    def produce(self, topic: str, keys, values) -> None:
        produce_records(self.lake, self.config, topic, encode(keys), json_values(values))

    def run(self, name: str) -> tuple[float, BatchMetrics]:
        """Seconds from now (just after the produce) until join ``name``'s result is visible,
        and the engine's metrics of those batches summed. The first call starts the join's query."""
        started = time.perf_counter()
        engine = self.engines.get(name)
        if engine is None:
            engine = self.engines[name] = EngineJoin(self.spark, self.lake, self.config, self.root, name)
        before = len(engine.batches)
        engine.query.processAllAvailable()
        total = BatchMetrics()
        for m in engine.batches[before:]:
            for f in fields(BatchMetrics):
                if isinstance(getattr(m, f.name), int):  # the counters (not the phases' timings)
                    setattr(total, f.name, getattr(total, f.name) + getattr(m, f.name))
        return engine.visible_at - started, total

    def stop(self) -> None:
        for engine in self.engines.values():
            engine.query.stop()

    def recompute(self, name: str) -> tuple[float, int]:
        self.lake.create(f"{name}_recomputed", pa.schema(self.lake.read_arrow(name).schema))
        started = time.perf_counter()
        table = expected(
            self.spark, self.lake, self.config, name, kafka_records(self.spark, self.lake, self.config)
        )
        self.lake.overwrite(f"{name}_recomputed", table)
        return time.perf_counter() - started, table.num_rows


def report(label: str, seconds: float, m, baseline: float | None = None, extra: str = "") -> None:
    changed = m.upserted + m.deleted
    line = (
        f"{label}: {seconds:6.2f} s, {changed:,} result rows changed ({changed / seconds:,.0f} rows/s), "
        f"affected keys {m.affected_keys:,}"
    )
    if m.elements_joined or m.elements_kept or m.elements_retracted:
        line += (
            f", elements joined {m.elements_joined:,} / kept {m.elements_kept:,} / "
            f"retracted {m.elements_retracted:,}"
        )
    if baseline:
        line += f"; whole-join recompute {baseline:.1f} s = {baseline / seconds:.1f}x this batch"
    print(line + extra, flush=True)


def fk(spark, root: Path, products: int = 1_000_000, merchants: int = 100_000, hot: int = 100_000) -> None:
    b = Bench(spark, root)
    rng = np.random.default_rng(7)
    fks = np.concatenate([np.zeros(hot, dtype=np.int64), rng.integers(1, merchants, products - hot)])
    rng.shuffle(fks)
    b.produce(
        "products",
        [f"p{i}" for i in range(products)],
        [{"t": f"title{i}", "m": f"m{f}"} for i, f in enumerate(fks)],
    )
    b.produce(
        "merchants", [f"m{i}" for i in range(merchants)], [{"n": f"merchant{i}"} for i in range(merchants)]
    )
    seconds, m = b.run("fk")
    report(f"fk {products:,} products / {merchants:,} merchants, first batch (everything)", seconds, m)
    baseline, rows = b.recompute("fk")
    assert rows == products
    # fan-out: one update of the merchant 100,000 products point at
    b.produce("merchants", ["m0"], [{"n": "merchant0 renamed"}])
    seconds, m = b.run("fk")
    assert m.upserted == hot, m
    report(f"fk fan-out: 1 update of a merchant referenced by {hot:,} products", seconds, m, baseline)
    # 1,000 random product updates, a tenth of them moving to another merchant
    ids = rng.choice(products, 1000, replace=False)
    moved = rng.random(1000) < 0.1
    values = [
        {"t": f"title{i} v2", "m": f"m{rng.integers(1, merchants) if mv_ else fks[i]}"}
        for i, mv_ in zip(ids, moved, strict=True)
    ]
    b.produce("products", [f"p{i}" for i in ids], values)
    seconds, m = b.run("fk")
    assert m.upserted == 1000, m
    report("fk 1,000 random product updates (100 FK changes)", seconds, m, baseline)
    result = b.lake.read_arrow("fk")
    assert result.num_rows == products
    b.stop()


def fk_hot_million(spark, root: Path) -> None:
    b = Bench(spark, root)
    n = 1_000_000
    b.produce("products", [f"p{i}" for i in range(n)], [{"t": f"title{i}", "m": "m0"} for i in range(n)])
    b.produce("merchants", ["m0"], [{"n": "merchant0"}])
    seconds, m = b.run("fk")
    report("fk hot key: 1,000,000 products on one merchant, first batch", seconds, m)
    b.produce("merchants", ["m0"], [{"n": "merchant0 renamed"}])
    reset_peaks("self", jvm_pid(spark))
    seconds, m = b.run("fk")
    assert m.upserted == n, m
    report(
        "fk hot key: that merchant updated (1,000,000 rows, merged on the executors)",
        seconds,
        m,
        extra=(
            f"; peak RSS during the batch: Python driver {peak_mb():,.0f} MB, "
            f"Spark JVM {peak_mb(jvm_pid(spark)):,.0f} MB"
        ),
    )
    b.stop()


def lists(spark, root: Path, persons: int = 100_000, per: int = 10, addresses: int = 200_000) -> None:
    b = Bench(spark, root)
    rng = np.random.default_rng(11)
    lists_ = rng.integers(0, addresses, (persons, per))
    big = [int(a) for a in rng.choice(addresses, 10_000, replace=False)]
    keys = [f"u{i}" for i in range(persons)] + ["big"]
    values = [{"n": f"person{i}", "ids": [f"a{a}" for a in row]} for i, row in enumerate(lists_)]
    values.append({"n": "big", "ids": [f"a{a}" for a in big]})
    b.produce("persons", keys, values)
    b.produce("addresses", [f"a{i}" for i in range(addresses)], [{"c": f"city{i}"} for i in range(addresses)])
    seconds, m = b.run("people")
    report(
        f"list {persons:,} persons x {per} + one with 10,000 / {addresses:,} addresses, first batch",
        seconds,
        m,
    )
    baseline, rows = b.recompute("people")
    assert rows == persons + 1
    ids = rng.choice(addresses, 1000, replace=False)
    b.produce("addresses", [f"a{i}" for i in ids], [{"c": f"city{i} v2"} for i in ids])
    seconds, m = b.run("people")
    report("list 1,000 address updates", seconds, m, baseline)
    extra = next(a for a in range(addresses) if a not in set(big))
    b.produce("persons", ["big"], [{"n": "big", "ids": [f"a{a}" for a in [*big, extra]]}])
    seconds, m = b.run("people")
    assert (m.elements_joined, m.elements_kept) == (1, 10_000), m
    report("list the 10,000-address person gains one address", seconds, m, baseline)
    row = b.lake.read_keys("people", "key", pa.array([b"big"])).to_pylist()[0]
    assert len(row["elements"]) == 10_001 and row["elements"][-1]["city"] == f"city{extra}"
    b.stop()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, embedded_broker(Path(tmp) / "kafka"):
        runs(get_spark(app_name="bench-keyed"))


def runs(spark) -> None:
    spark.range(1).collect()
    with tempfile.TemporaryDirectory() as tmp:  # warm-up (JIT, Python workers), not reported
        fk(spark, Path(tmp), 20_000, 2_000, 2_000)
    with tempfile.TemporaryDirectory() as tmp:
        fk(spark, Path(tmp))
    with tempfile.TemporaryDirectory() as tmp:
        lists(spark, Path(tmp))
    if "--hot-million" in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            fk_hot_million(spark, Path(tmp))


if __name__ == "__main__":
    main()
