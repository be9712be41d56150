"""Bronze rows without a broker: the join engine's own tests (and its benchmarks) feed it exact
micro-batches from a topic's bronze table, written the way ``lake ingest`` mirrors Kafka records
(``spark_jobs.testing.append_bronze``: Kafka's columns, offsets continuing each partition). Everything
that goes through Kafka (produce, consume, ingest, backfill, repair, the CLI and the DAGs) is tested
on the session's embedded broker instead."""

from __future__ import annotations

import pyarrow as pa

from spark_jobs import testing
from spark_jobs.config import TopicSpec
from spark_jobs.lake import Lake


def append_bronze(
    lake: Lake,
    spec: TopicSpec,
    keys: pa.Array,
    values: pa.Array,
    timestamp_ms: int = 0,
    partitioner: str = "murmur2",
) -> int | None:
    """Append records (binary keys and values, null value = tombstone) in one Delta commit, placed by
    the Java client's murmur2 unless told otherwise; returns the table version."""
    return testing.append_bronze(lake, spec, keys, values, timestamp_ms, partitioner)


def append_lines(
    lake: Lake, spec: TopicSpec, lines: bytes, sep: str = "|", partitioner: str = "murmur2"
) -> None:
    """kcat-style ``key SEP value`` lines into a bronze table, unchecked (bad input stays bad)."""
    from spark_jobs.topics import parse_lines, split_lines

    parsed = parse_lines(split_lines(lines), sep, False, "test", 1)
    append_bronze(lake, spec, parsed.keys, parsed.values, partitioner=partitioner)
