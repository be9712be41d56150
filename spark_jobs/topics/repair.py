"""Repairing a Kafka topic written with a foreign partitioner: ``lake topic repartition``.

Records in Kafka stay where they were produced, so a topic backfilled kcat-style (CRC32) keeps its
misplaced keys until it is rewritten. ``repartition`` replaces the topic with a corrected copy under
the same name, in steps that survive a crash at any point:

1. under the topic's exclusive lock (``lake produce`` and ``lake backfill`` of the topic wait), read
   every committed record up to the end;
2. produce them, in per-key order and with their timestamps and headers, into a staging topic
   ``<topic>.repartition`` placed by the right partitioner (one transaction), and note that the copy is
   complete (``<root>/_repair/<topic>.json``);
3. delete the topic, create it again with the same partition count and settings, and copy the staging
   topic into it partition by partition (one transaction); then delete the staging topic.

A rerun after a crash resumes at the step it stopped in; the staging topic is never deleted before
the topic holds the copy. Offsets are renumbered, so everything that keeps positions in the topic
must start over: its bronze table is rebuilt here (one Delta overwrite, which the lookup tables notice
and rebuild from), the joins reading it are named (``lake run JOIN --once --reset``; a join started
on its old checkpoint sees the topic's new id and says so), and the rewrite is refused while one of
them, or a continuous ingest of the topic, runs. Producers outside the product
(kcat, Java clients) are not covered by the lock: stop them while the topic is replaced.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession

from spark_jobs.config import PipelineConfig, TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.runtime.jobs import ingest_job, running_jobs
from spark_jobs.seams import partitioners
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import (
    Cluster,
    connect,
    delete_topics,
    ensure_topics,
    partition_counts,
    produce,
    read,
)
from spark_jobs.topics.ingest import rebuild_bronze
from spark_jobs.topics.produce_consume import producing
from spark_jobs.topics.snapshots import take

STAGING_SUFFIX = ".repartition"


def dependents(config: PipelineConfig, topic: str) -> list[str]:
    """Jobs that read ``topic`` and keep positions in it."""
    jobs = [f"lookup:{lk.name}" for lk in config.lookups.values() if lk.topic == topic]
    jobs += [join.job for join in config.joins.values() if topic in (join.left, join.right)]
    return jobs


@dataclass
class RepartitionResult:
    topic: str
    partitioner: str
    records: int
    moved: int
    replaced: bool
    restart: list[str]
    read: str = ""  # the offsets of the topic the copy was read up to (empty: a resumed copy)


@dataclass
class _Records:
    keys: pa.Array
    values: pa.Array
    partitions: np.ndarray
    timestamps: list[int]
    headers: list

    @property
    def count(self) -> int:
        return len(self.keys)


def _read_all(cluster: Cluster, spec: TopicSpec, as_topic: str | None = None) -> _Records:
    """Every committed record, in per-key order: each partition's records in offset order, the
    partitions merged by time (a key written to two partitions by two partitioners keeps the order in
    which it was written; ties go by partition, then offset)."""
    read_spec = spec if as_topic is None else TopicSpec(as_topic, spec.partitions)
    keys, values, parts, stamps, heads, order = [], [], [], [], [], []
    latest: dict[int, int] = {}  # per partition, the largest timestamp so far (offset order stays)
    for batch in read(cluster, read_spec):
        for m in batch:
            ts, p = m.timestamp()[1], cast(int, m.partition())
            running = latest[p] = max(latest.get(p, ts), ts)
            keys.append(m.key())
            values.append(m.value())
            parts.append(p)
            stamps.append(ts)
            heads.append(m.headers())
            order.append((running, p, m.offset()))
    ranked = sorted(range(len(keys)), key=order.__getitem__)
    return _Records(
        pa.array([keys[i] for i in ranked], pa.binary()),
        pa.array([values[i] for i in ranked], pa.binary()),
        np.array([parts[i] for i in ranked], dtype=np.int32),
        [stamps[i] for i in ranked],
        [heads[i] for i in ranked],
    )


def _marker(lake: Lake, topic: str):
    return lake.layout.repair_marker(topic)


def repartition(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    topic: str,
    partitioner: str | None = None,
    log=lambda _: None,
) -> RepartitionResult:
    spec = config.topic(topic)
    chosen = partitioners.check_partitioner(partitioner or spec.partitioner)
    cluster = connect(config, lake.root)
    restart = dependents(config, topic)
    readers = [*restart, ingest_job(config).id]
    running = {job: pid for job, pid in running_jobs(lake).items() if job in readers}
    if running:
        names = ", ".join(f"{job} (pid {pid})" for job, pid in sorted(running.items()))
        raise UserError(f"refusing to rewrite {topic}: jobs reading it are running: {names}; stop them first")
    staging = cluster.topic(topic + STAGING_SUFFIX)
    marker = _marker(lake, topic)
    with producing(lake, topic, exclusive=True, log=log) as transactional_id:
        state = json.loads(marker.read_text()) if marker.exists() else {}
        if state.get("step") not in ("copied", "replaced"):  # step 1-2 (again, after a crash in them)
            delete_topics(cluster, [staging])
            read = take(cluster, [spec]).covers()
            log(f"reading {read} ...")
            records = _read_all(cluster, spec)
            placed = partitioners.partitions(records.keys, spec.partitions, chosen)
            moved = int(np.count_nonzero(placed != records.partitions))
            if moved == 0:
                marker.unlink(missing_ok=True)
                return RepartitionResult(topic, chosen, records.count, 0, False, restart, read)
            log(
                f"copying {records.count:,} records of {cluster.topic(topic)} into {staging} "
                f"with {chosen} ..."
            )
            _create_like(cluster, spec, staging)
            batch = (records.keys, records.values, records.timestamps, records.headers)
            produce(
                cluster,
                TopicSpec(staging.removeprefix(cluster.topic_prefix), spec.partitions),
                [batch],
                chosen,
                transactional_id=transactional_id,
            )
            state = {
                "step": "copied",
                "records": records.count,
                "moved": moved,
                "partitioner": chosen,
                "read": read,
            }
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps(state))
        if state["step"] == "copied":  # step 3
            # the copy is placed already, and each key's records sit in one of its partitions in order
            copy = _read_all(cluster, spec, as_topic=staging.removeprefix(cluster.topic_prefix))
            if copy.count != state["records"]:
                raise UserError(
                    f"the staging topic {staging} holds {copy.count:,} records, not the {state['records']:,} "
                    f"copied into it; {cluster.topic(topic)} was left as it is"
                )
            _replace(cluster, spec, copy, state["partitioner"], transactional_id, log)
            state["step"] = "replaced"
            marker.write_text(json.dumps(state))
        delete_topics(cluster, [staging])
        log(f"rebuilding the bronze table {topic} from the new topic ...")
        rebuild_bronze(spark, lake, config, spec)
        marker.unlink(missing_ok=True)
    return RepartitionResult(
        topic, state["partitioner"], state["records"], state["moved"], True, restart, state.get("read", "")
    )


def _replace(
    cluster: Cluster,
    spec: TopicSpec,
    copy: _Records,
    partitioner: str,
    transactional_id: str,
    log,
    attempts: int = 3,
) -> None:
    """Delete the topic, create it again and produce the copy into it; the result is read back and
    compared with the copy (per partition), and the step is repeated when they differ, so the staging
    topic is only ever deleted after the topic holds every record."""
    name = cluster.topic(spec.name)
    want = np.bincount(copy.partitions, minlength=spec.partitions).tolist()
    for attempt in range(1, attempts + 1):
        log(f"replacing {name} with the copy ...")
        delete_topics(cluster, [name])
        _create_like(cluster, spec, name)
        records = (copy.keys, copy.values, copy.timestamps, copy.headers)
        produce(cluster, spec, [records], partitioner, transactional_id=transactional_id)
        got = [0] * spec.partitions
        for batch in read(cluster, spec):
            for m in batch:
                got[cast(int, m.partition())] += 1
        if got == want:
            return
        log(f"attempt {attempt}: {name} holds {got} records per partition, not {want}; again")
    raise UserError(
        f"{name} did not take the copy after {attempts} attempts; the copy stays in "
        f"{name}{STAGING_SUFFIX}: rerun 'lake topic repartition {spec.name}'"
    )


def _create_like(cluster: Cluster, spec: TopicSpec, name: str, timeout: float = 60.0) -> None:
    """Create ``name`` with ``spec``'s partitions and settings; a topic still being deleted under that
    name is waited for."""
    target = TopicSpec(name.removeprefix(cluster.topic_prefix), spec.partitions, compacted=spec.compacted)
    deadline = time.monotonic() + timeout
    while True:
        try:
            ensure_topics(cluster, [target])
            if name in partition_counts(cluster, [name]):
                return
        except UserError as exc:
            if "marked for deletion" not in str(exc) and "already exists" not in str(exc):
                raise
        if time.monotonic() > deadline:
            raise UserError(f"topic {name} could not be created again within {timeout:g} s")
        time.sleep(0.2)
