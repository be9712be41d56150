"""table: both sides' latest value per key, joined (docs/joins.md, "Semantics")."""

from __future__ import annotations

from spark_jobs.joins.state_store import StateStoreJob


class TableJob(StateStoreJob):
    """table: the Java operator ``lake.joins.TableJoin`` keeps each key's accepted version per side
    (the latest by timestamp, offset, then partition; a tombstone is a version without a value) and
    hands the batch one row per key that had records: both values after the batch, whether the join
    holds a row, whether the batch deleted a live left value."""

    operator = "TableJoin"
