"""What the benchmarks share: an embedded Kafka broker of their own, the test kits on sys.path, the
table-join workload of ``bench_joins``, and the product's join run as a timed
streaming query."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: joinkit, peerkit

# A left table join of two 4-partition topics whose JSON values carry "v".
TABLE_JOIN_PIPELINE = """
topics:
  left: {partitions: 4}
  right: {partitions: 4}
joins:
  bench: {kind: table, left: left, right: right, type: left, select: {lv: left.v, rv: right.v}}
"""


def values(tag: str, n: int) -> pa.Array:
    """``n`` JSON values ``{"v": "<tag><i>"}``."""
    return pa.array([f'{{"v":"{tag}{i}"}}'.encode() for i in range(n)], pa.binary())


def keys(ids: np.ndarray) -> pa.Array:
    """The keys ``c<id>`` of ``ids``."""
    return pa.array([f"c{i}".encode() for i in ids], pa.binary())


def committed_rows(table: Path, version: int, columns: list[str]) -> dict[str, list]:
    """``columns`` of the rows commit ``version`` of a Delta table wrote: its change-data files when
    it has any (a MERGE), else its data files (an append), read with pyarrow from the commit's log
    entry. No Spark job in the benchmark's process: it shares the cores with what it measures."""
    cdc, added = [], []
    for line in (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines():
        action = json.loads(line) if line.strip() else {}
        if "cdc" in action:
            cdc.append(action["cdc"]["path"])
        elif "add" in action and action["add"].get("dataChange", True):
            added.append(action["add"]["path"])
    out: dict[str, list] = {c: [] for c in columns}
    for path in cdc or added:
        rows = pq.read_table(table / unquote(path))
        if cdc:
            rows = rows.filter(pc.is_in(rows["_change_type"], pa.array(["insert", "update_postimage"])))
        for c in columns:
            out[c] += rows[c].to_pylist()
    return out


@contextmanager
def embedded_broker(root: Path) -> Iterator[str]:
    """Start a broker under ``root`` on a free loopback port; every Kafka client of this process (and
    of the processes it starts) uses it through $LAKE_KAFKA_BOOTSTRAP. Stopped on exit."""
    from spark_jobs.seams import broker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = broker.Broker(root).start(port)
    os.environ["LAKE_KAFKA_BOOTSTRAP"] = str(state.address)
    try:
        yield str(state.address)
    finally:
        broker.Broker(root).stop()


@contextmanager
def embedded_registry(root: Path) -> Iterator[str]:
    """Start a Schema Registry under ``root`` on a free loopback port; every registry client of this
    process (and of the processes it starts) uses it through $LAKE_SCHEMA_REGISTRY_URL."""
    from spark_jobs.seams import embedded_registry as registry

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = registry.Registry(root).start(port)
    os.environ["LAKE_SCHEMA_REGISTRY_URL"] = str(state.address)
    try:
        yield str(state.address)
    finally:
        registry.Registry(root).stop()


def produce_records(lake, config, topic: str, keys: pa.Array, values: pa.Array) -> None:
    """Records (binary keys and values) onto a topic of the benchmark's broker in one transaction,
    murmur2 like a Java client."""
    from spark_jobs.seams.kafka import connect, produce

    produce(connect(config, lake.root), config.topic(topic), [(keys, values)], "murmur2")


def kafka_records(spark, lake, config):
    """The oracle's reader: a topic's records from Kafka up to its end offsets now."""
    from spark_jobs.seams.kafka import connect
    from spark_jobs.topics.snapshots import records, take

    cluster = connect(config, lake.root)
    snapshot = take(cluster, config.topics.values())
    return lambda topic: records(spark, cluster, config.topic(topic), snapshot.ends[topic])


class Timed:
    """A streaming query whose batches are timed: produced -> result visible, and Spark's parts."""

    query: object
    visible_at = 0.0

    def wait(self) -> float:
        """Seconds from now until the result holds what is on the topics now."""
        started = time.perf_counter()
        self.query.processAllAvailable()  # type: ignore[attr-defined]
        return self.visible_at - started

    def parts(self, since: int) -> dict[str, float]:
        """Seconds per part of the batches after batch id ``since`` (from Spark's progress)."""
        total: dict[str, float] = {}
        for p in self.query.recentProgress:  # type: ignore[attr-defined]
            if p.batchId > since and p.numInputRows:
                for part, ms in p.durationMs.items():
                    total[part] = total.get(part, 0.0) + ms / 1000
        return total

    def last_batch(self) -> int:
        progress = self.query.lastProgress  # type: ignore[attr-defined]
        return progress.batchId if progress else -1


class EngineJoin(Timed):
    """The product's join, as the runner builds it: its Kafka topics streamed into ``JoinJob.plan``, then
    ``foreachBatch(JoinJob.process)``."""

    def __init__(self, spark, lake, config, root: Path, name: str = "bench"):
        from spark_jobs.joins.registry import job_for
        from spark_jobs.joins.runner import input_stream
        from spark_jobs.seams.kafka import connect

        self.lake, self.name = lake, name
        self.job = job_for(spark, lake, config, config.join(name), "bench")
        cluster = connect(config, lake.root)
        stream = self.job.plan(input_stream(spark, cluster, config, config.join(name)))
        self.query = (
            stream.writeStream.foreachBatch(self.sink)
            .option("checkpointLocation", str(root / f"{name}_checkpoint"))
            .trigger(processingTime="0 seconds")
            .start()
        )

    affected = 0  # result keys recomputed since the query started

    def sink(self, frame, batch_id: int) -> None:
        metrics = self.job.process(frame, batch_id)
        self.batches.append(metrics)
        self.affected += metrics.affected_keys
        self.visible_at = time.perf_counter()

    @property
    def batches(self) -> list:
        """The engine's metrics of every batch since the query started."""
        if "_batches" not in self.__dict__:
            self._batches: list = []
        return self._batches

    def rows(self) -> dict[bytes, tuple]:
        table = self.lake.read_arrow(self.name, columns=["key", "lv", "rv"]).to_pylist()
        return {bytes(r["key"]): (r["lv"], r["rv"]) for r in table}
