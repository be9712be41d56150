"""The lake's system tables, described once: their schemas and how they are created (their names are
the layout's, ``spark_jobs.layout``).

- ``quarantine``: every input a job rejected (a backfill's bad dump line, a join's record whose value
  does not parse), with the job, where it came from, its bytes in hex and the reason.
- ``quality_runs``: every quality run, one row per expectation, with up to 50 findings (in words and
  typed) and the topics' offsets it checked.
- ``join_metrics``: one row per join micro-batch (inputs, outputs, pending, duration).
"""

from __future__ import annotations

import pyarrow as pa

from spark_jobs.layout import JOIN_METRICS, QUALITY_RUNS, QUARANTINE
from spark_jobs.seams.delta import Lake

# a quality finding as a typed row (spark_jobs.quality.findings builds them)
OFFSET_TYPE = pa.struct([("partition", pa.int32()), ("offset", pa.int64())])
PLACEMENT_TYPE = pa.struct(
    [
        ("topic", pa.string()),
        ("partitions", pa.list_(pa.int32())),
        ("expected_partition", pa.int32()),
        ("partitioner", pa.string()),
    ]
)
FINDING_TYPE = pa.struct(
    [
        ("text", pa.string()),
        ("problem", pa.string()),
        ("key", pa.string()),
        ("key_hex", pa.string()),
        ("topic", pa.string()),
        ("records", pa.int64()),
        ("offsets", pa.list_(OFFSET_TYPE)),
        ("placements", pa.list_(PLACEMENT_TYPE)),
    ]
)


QUARANTINE_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("run_time", pa.timestamp("us", tz="UTC")),
        ("job", pa.string()),  # e.g. backfill:accounts
        ("source", pa.string()),
        ("line", pa.int64()),
        ("raw_hex", pa.string()),
        ("reason", pa.string()),
        # a join's record: its topic, partition (``line``: its offset), key and why in one word
        # (spark_jobs.joins.dropped.REASONS); a backfill's line: its cause is bad_line
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("key_hex", pa.string()),
        ("cause", pa.string()),
    ]
)

QUALITY_RUNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("run_time", pa.timestamp("us", tz="UTC")),
        ("pipeline", pa.string()),
        ("suite", pa.string()),
        ("suite_version", pa.int64()),
        ("check", pa.string()),
        ("expectation", pa.string()),
        ("success", pa.bool_()),
        ("observed_value", pa.string()),
        ("offending_total", pa.int64()),
        ("offending_sample", pa.list_(pa.string())),
        # the same findings typed (spark_jobs.quality.findings): key, topic, offsets, placements
        ("findings", pa.list_(FINDING_TYPE)),
        # what the check read: each of its topics' end offset per partition, taken at offsets_at
        ("topic_offsets", pa.map_(pa.string(), pa.list_(pa.int64()))),
        ("offsets_at", pa.timestamp("us", tz="UTC")),
    ]
)

JOIN_METRICS_SCHEMA = pa.schema(
    [
        ("join", pa.string()),
        ("query_id", pa.string()),
        ("batch_id", pa.int64()),
        ("started_at", pa.timestamp("us", tz="UTC")),
        ("duration_ms", pa.float64()),
        ("input_left", pa.int64()),
        ("input_right", pa.int64()),
        ("quarantined", pa.int64()),
        ("ignored", pa.int64()),  # tombstones on the stream side of a stream join
        ("affected_keys", pa.int64()),  # table: keys recomputed; stream kinds: events decided
        ("upserted", pa.int64()),
        ("deleted", pa.int64()),
        ("appended", pa.int64()),
        ("pending", pa.int64()),  # stream kinds: events waiting (for the right side / their window)
        ("null_keys", pa.int64()),  # fk / derive: live left rows whose foreign / derived key is null
        ("elements_joined", pa.int64()),  # list: elements looked up in the right table (added, updated)
        ("elements_retracted", pa.int64()),  # list: elements removed from their lists
        ("elements_kept", pa.int64()),  # list: elements of recomputed rows reused without a lookup
        ("skipped", pa.int64()),  # stream kinds: null-key records the join type drops (KIP-962)
    ]
)


def ensure_quarantine(lake: Lake) -> None:
    """The one quarantine table every job (backfills, joins) writes its rejected input to."""
    lake.create(QUARANTINE, QUARANTINE_SCHEMA, description="rejected input lines, with the reason")
    lake.add_missing_columns(QUARANTINE, QUARANTINE_SCHEMA)  # lakes made before a column existed


def ensure_quality_runs(lake: Lake) -> None:
    lake.create(QUALITY_RUNS, QUALITY_RUNS_SCHEMA, description="every quality run, per expectation")
    lake.add_missing_columns(QUALITY_RUNS, QUALITY_RUNS_SCHEMA)  # lakes made before a column existed


def ensure_join_metrics(lake: Lake) -> None:
    lake.create(JOIN_METRICS, JOIN_METRICS_SCHEMA, description="one row per join micro-batch")
    lake.add_missing_columns(JOIN_METRICS, JOIN_METRICS_SCHEMA)  # lakes made before a column existed
