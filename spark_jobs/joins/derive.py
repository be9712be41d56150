"""derive: a lookup keyed by a value of its master topic (docs/joins.md, "Foreign-key, list and
derive joins")."""

from __future__ import annotations

from spark_jobs.joins.keyed import KeyedJob
from spark_jobs.joins.state_store import StateStoreJob

# Which of the master records holding one derived key wins (the oracle's order; DeriveJoin.java's
# ``Holders`` compares the same way). Offsets order records within a partition only, so equal
# timestamps in different partitions fall back to the partition number.
NEWEST = ["timestamp", "partition", "offset"]


class DeriveJob(KeyedJob, StateStoreJob):
    """derive: the master records by key, each holding its derived key; per derived key its holders
    (``lake.joins.DeriveJoin``, Java), and the newest of them is the derived row."""

    operator = "DeriveJoin"
    row_columns = ["key", "master_key", "left_value", "__lp", "__lo"]
    tombstones_follow_left = False  # its result is keyed by the derived key, not the left topic's
