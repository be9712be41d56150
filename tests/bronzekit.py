"""Bronze rows without a broker: the join engine's own tests (and its benchmarks) feed it exact
micro-batches from a topic's bronze table, written here the way ``lake ingest`` mirrors Kafka records
(Kafka's columns, offsets continuing each partition, placed by the Java client's murmur2). Everything
that goes through Kafka (produce, consume, ingest, backfill, repair, the CLI and the DAGs) is tested
on the session's embedded broker instead."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from spark_jobs import partitioners
from spark_jobs.config import TopicSpec
from spark_jobs.ingest import TOPIC_SCHEMA, ensure_bronze, next_offsets
from spark_jobs.lake import Lake


def append_bronze(
    lake: Lake,
    spec: TopicSpec,
    keys: pa.Array,
    values: pa.Array,
    timestamp_ms: int = 0,
    partitioner: str = "murmur2",
) -> int | None:
    """Append records (binary keys and values, null value = tombstone) in one Delta commit; returns
    the table version."""
    ensure_bronze(lake, spec)
    part = partitioners.partitions(keys, spec.partitions, partitioner)
    nxt = next_offsets(lake, spec)
    offsets = np.empty(len(part), dtype=np.int64)
    for p in range(spec.partitions):
        mask = part == p
        offsets[mask] = np.arange(nxt[p], nxt[p] + int(mask.sum()))
    n = len(keys)
    table = pa.table(
        {
            "key": keys.cast(pa.binary()),
            "value": values.cast(pa.binary()),
            "topic": pa.array([spec.name] * n, pa.string()),
            "partition": pa.array(part, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.array(np.full(n, timestamp_ms * 1000, dtype=np.int64)).cast(
                TOPIC_SCHEMA.field("timestamp").type
            ),
            "timestampType": pa.array(np.zeros(n, dtype=np.int32)),
            "headers": pa.array([[]] * n, TOPIC_SCHEMA.field("headers").type),
        },
        schema=TOPIC_SCHEMA,
    )
    return lake.append(spec.name, table)


def append_lines(
    lake: Lake, spec: TopicSpec, lines: bytes, sep: str = "|", partitioner: str = "murmur2"
) -> None:
    """kcat-style ``key SEP value`` lines into a bronze table, unchecked (bad input stays bad)."""
    from spark_jobs.topics import parse_lines, split_lines

    parsed = parse_lines(split_lines(lines), sep, False, "test", 1)
    append_bronze(lake, spec, parsed.keys, parsed.values, partitioner=partitioner)
