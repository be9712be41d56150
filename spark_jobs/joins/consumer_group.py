"""A join's position as Kafka's own tools see it: its consumer group.

Spark's Kafka source reads assigned partitions and commits nothing to Kafka, so
``kafka-consumer-groups --describe``, Burrow, kafka-lag-exporter and a managed console see no consumer
for a join, and the most common alert of Kafka operations (lag) cannot be set on it. After each
micro-batch Spark has committed, the join commits the offsets that batch finished (from its
checkpoint, which stays the source of truth: the product never reads the group back) to a consumer
group, ``lake.<pipeline>.<join>`` unless the pipeline names another (``consumer_group:``, or
``false`` for none), with the topics' prefix in front (``kafka.topic_prefix``). A run also commits
the checkpoint's position when it starts, so a group left behind by a run killed between its
checkpoint and its commit is mended by the next one. A cluster that refuses (no ACL for the group)
is said once in the join's log; the join goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_jobs import checkpoints
from spark_jobs.errors import UserError
from spark_jobs.seams.kafka import Cluster, commit_group


class GroupPosition:
    """Commits the checkpoint's last committed offsets to ``group`` when Spark has committed a new
    micro-batch (``query``'s last progress), at most once per batch."""

    def __init__(self, cluster: Cluster, group: str | None, checkpoint: Path, log: Callable[[str], None]):
        self.cluster, self.group, self.checkpoint, self.log = cluster, group, checkpoint, log
        self.batch: int | None = None  # the last micro-batch whose offsets the group holds
        self.refused = False

    def sync(self, query: Any = None) -> None:
        """Commit the checkpoint's position unless the group holds it already (``query``: the running
        query, whose last progress says which batch Spark committed last)."""
        if self.group is None or self.refused:
            return
        progress = query.lastProgress if query is not None else None
        batch = progress["batchId"] if progress else None
        if query is not None and (batch is None or batch == self.batch):
            return  # the query has committed nothing new
        positions = checkpoints.committed_positions(self.checkpoint)
        if positions is None:
            return
        try:
            commit_group(self.cluster, self.group, positions)
        except UserError as exc:
            self.refused = True
            self.log(f"{exc}; Kafka's tools will not see this run's position (its checkpoint holds it)")
            return
        self.batch = batch
