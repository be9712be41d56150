"""Repairing a topic written with a foreign partitioner.

Records in an append-only log stay where they were written. ``repartition`` is the lakehouse twin of
producing a clean copy of the topic: it rewrites the topic as one atomic Delta commit with every
record placed by the right partitioner, per-key order kept, offsets renumbered from 0. Jobs reading
the topic must then restart from scratch (their offsets no longer apply): they are named, and the
rewrite is refused while one of them is running.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs import partitioners
from spark_jobs.config import PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.lake import Lake
from spark_jobs.topics import TOPIC_SCHEMA, assign_offsets, ensure_topic


def dependents(config: PipelineConfig, topic: str) -> list[str]:
    """Jobs that read ``topic`` and keep positions in it."""
    jobs = [f"lookup:{lk.name}" for lk in config.lookups.values() if lk.topic == topic]
    jobs += [join.job for join in config.joins.values() if topic in (join.left, join.right)]
    return jobs


def running_jobs(lake: Lake) -> dict[str, int]:
    """Jobs registered as running under ``<root>/_jobs/<job>.json`` whose process is alive."""
    alive: dict[str, int] = {}
    folder = lake.root / "_jobs"
    if not folder.is_dir():
        return alive
    for entry in folder.glob("*.json"):
        try:
            info = json.loads(entry.read_text())
            pid = int(info["pid"])
            os.kill(pid, 0)
        except (ValueError, KeyError, OSError):
            continue
        alive[info.get("job", entry.stem)] = pid
    return alive


def last_rewrite(lake: Lake, topic: str) -> int:
    """The newest version that replaced rows (0 when the log was only ever appended to)."""
    return max(lake.rewrites(topic, 1, lake.version(topic)), default=0)


@dataclass
class RepartitionResult:
    topic: str
    partitioner: str
    records: int
    moved: int
    version: int | None
    restart: list[str]


def repartition(
    lake: Lake, config: PipelineConfig, topic: str, partitioner: str | None = None
) -> RepartitionResult:
    spec = config.topic(topic)
    chosen = partitioners.check_partitioner(partitioner or spec.partitioner)
    ensure_topic(lake, spec)
    restart = dependents(config, topic)
    running = {job: pid for job, pid in running_jobs(lake).items() if job in restart}
    if running:
        names = ", ".join(f"{job} (pid {pid})" for job, pid in sorted(running.items()))
        raise UserError(f"refusing to rewrite {topic}: jobs reading it are running: {names}; stop them first")
    start = last_rewrite(lake, topic)
    changes = lake.changes_arrow(topic, start)
    rows = changes.filter(pc.equal(changes["_change_type"], "insert"))
    rows = rows.sort_by(
        [("_commit_version", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )
    keys = rows.column("key").combine_chunks().cast(pa.binary())
    old = rows.column("partition").to_numpy()
    new = partitioners.partitions(keys, spec.partitions, chosen)
    offsets, _ = assign_offsets(new, np.zeros(spec.partitions, dtype=np.int64))
    table = pa.table(
        {
            "key": keys,
            "value": rows.column("value").cast(pa.binary()),
            "topic": rows.column("topic").cast(pa.string()),
            "partition": pa.array(new, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": rows.column("timestamp"),
            "timestampType": rows.column("timestampType"),
            "headers": rows.column("headers").cast(TOPIC_SCHEMA.field("headers").type),
        },
        schema=TOPIC_SCHEMA,
    )
    moved = int(np.count_nonzero(old != new))
    version = lake.overwrite(topic, table) if moved else None
    return RepartitionResult(topic, chosen, table.num_rows, moved, version, restart)
