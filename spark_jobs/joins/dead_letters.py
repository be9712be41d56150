"""A join's dead-letter topic (``dead_letter_topic:``): every record the join does not use, also on Kafka.

The quarantine table keeps every dropped record (:mod:`spark_jobs.joins.dropped`); a join with a
dead-letter topic also writes each of them there, in the micro-batch that drops it, as Kafka Streams'
dead-letter queue does (KIP-1034): the record's own key and value bytes (for a record ``select``
fails on, the key is the result key it failed for), and headers naming where it came from and why:

- ``__streams.errors.topic``, ``__streams.errors.partition``, ``__streams.errors.offset``: the
  input record (its topic as the pipeline names it);
- ``__streams.errors.exception``: the reason in one word (``undecodable``, ``null_key``, ...);
- ``__streams.errors.message``: the sentence the quarantine keeps;
- ``lake.join`` and ``lake.batch``: the join and its micro-batch.

A batch's dead letters go out in one Kafka transaction before the batch's quarantine commit; a batch
that may be a replay (the first after a restart) first looks for its tag at the end of the topic and
sends nothing when its dead letters went out before the crash: each is written once.
"""

from __future__ import annotations

import pyarrow as pa

from spark_jobs.config import JoinSpec, PipelineConfig
from spark_jobs.layout import Root
from spark_jobs.seams.kafka import (
    BATCH_HEADER,
    Cluster,
    TransactionalProducer,
    connect,
    ensure_topics,
    producer_id,
    tagged,
)

HEADERS = ("topic", "partition", "offset", "exception", "message")


class DeadLetters:
    """Where a join's dead letters go: ``send`` a batch's quarantine rows, tagged with the batch; with
    ``may_be_sent`` (a replay), nothing when they already went out. Returns the records sent."""

    def send(self, rows: pa.Table, tag: bytes, may_be_sent: bool) -> int:
        raise NotImplementedError


def records(
    rows: pa.Table, join: str, tag: bytes
) -> tuple[pa.Array, pa.Array, list[list[tuple[str, bytes]]]]:
    """The dead-letter records of quarantine rows: keys, values and each record's headers."""
    keys = pa.array(
        [bytes.fromhex(h) if h is not None else None for h in rows["key_hex"].to_pylist()], pa.binary()
    )
    values = pa.array([bytes.fromhex(h) if h else None for h in rows["raw_hex"].to_pylist()], pa.binary())
    heads = []
    for row in rows.select(["topic", "partition", "line", "cause", "reason"]).to_pylist():
        said = (row["topic"], row["partition"], row["line"], row["cause"], row["reason"])
        heads.append(
            [(f"__streams.errors.{name}", str(v).encode()) for name, v in zip(HEADERS, said, strict=True)]
            + [("lake.join", join.encode()), (BATCH_HEADER, tag)]
        )
    return keys, values, heads


class KafkaDeadLetters(DeadLetters):
    """The join's dead-letter topic on Kafka, written by the driver (a batch drops few records)."""

    def __init__(self, config: PipelineConfig, root: Root, spec: JoinSpec):
        self.config, self.root, self.spec = config, root, spec
        self.topic = config.topic(spec.dead_letter_topic or "")
        self._cluster: Cluster | None = None
        self._producer: TransactionalProducer | None = None

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = connect(self.config, self.root)
        return self._cluster

    def send(self, rows: pa.Table, tag: bytes, may_be_sent: bool) -> int:
        if rows.num_rows == 0:
            return 0
        if self._producer is None:  # the join's one writer: a restarted job fences its predecessor
            ensure_topics(self.cluster, [self.topic])
            tid = producer_id(self.root, "dead-letters", self.spec.name)
            self._producer = TransactionalProducer(self.cluster, self.topic, transactional_id=tid)
        if may_be_sent and tagged(self.cluster, self.topic, tag):
            return 0
        keys, values, heads = records(rows, self.spec.name, tag)
        stamps = [int(t.timestamp() * 1000) for t in rows["run_time"].to_pylist()]
        return self._producer.produce([(keys, values, stamps, heads)]).records
