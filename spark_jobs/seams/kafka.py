"""The Kafka seam: every conversation with a Kafka cluster goes through this module.

Python talks to Kafka with confluent-kafka (librdkafka); Spark's Kafka source and sink get their
options from :meth:`Cluster.spark_options`. Nothing else imports ``confluent_kafka``.

Which cluster: the pipeline file's ``kafka.bootstrap_servers``, else ``$LAKE_KAFKA_BOOTSTRAP``, else
the embedded broker of the lake root (``lake kafka start``). The pipeline's other ``kafka:`` settings
are client settings passed through (librdkafka's names); for Spark's Java client the few names that
differ are translated (``sasl.username`` / ``sasl.password`` become ``sasl.jaas.config``,
``ssl.ca.location`` a PEM trust store). A topic's Kafka name is ``topic_prefix`` (pipeline, else
``$LAKE_KAFKA_TOPIC_PREFIX``) plus its declared name.

Writes are transactional (idempotent producer, ``acks=all``): one call is one Kafka transaction, so
a bad line, an unreachable broker or a broker that dies mid-way leaves nothing visible to
``read_committed`` readers, which every reader of the product is.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from spark_jobs import faults
from spark_jobs.config import PipelineConfig, TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.layout import Layout
from spark_jobs.seams import partitioners
from spark_jobs.seams.processes import read_state
from spark_jobs.seams.storage import Root

FETCH_WAIT_MS = "10"  # Spark's Kafka reads: see Cluster.spark_options (a pipeline's own setting wins)
TIMEOUT_S = float(os.environ.get("LAKE_KAFKA_TIMEOUT", "15"))  # a request to an unreachable cluster
TRANSACTION_TIMEOUT_MS = 600_000  # a long backfill is one transaction (brokers allow 15 min)
# librdkafka's own names that Java clients (Spark) spell differently or do not know
_LIBRDKAFKA_ONLY = ("sasl.username", "sasl.password", "sasl.mechanisms", "ssl.ca.location")
_JAVA_ONLY = ("sasl.jaas.config", "ssl.truststore.location", "ssl.truststore.type", "ssl.truststore.password")

_REFUSED: dict[str, str] = {}  # host:port -> why that broker refused our login, from librdkafka's log


class _Refusals(logging.Handler):
    """librdkafka reports a refused login (SASL, TLS) only in its log and as a broken connection; this
    keeps the reason so the user's one-line error can say it."""

    PATTERN = re.compile(r"://([^/\s]+)/\S*: (?:SASL authentication error|SSL handshake failed)[^:]*: (.*)")

    def emit(self, record: logging.LogRecord) -> None:
        found = self.PATTERN.search(record.getMessage())
        if found:
            _REFUSED[found.group(1)] = found.group(2).split(" (after ")[0]


_quiet = logging.getLogger("lake.kafka")  # librdkafka's log lines; errors reach the user as exceptions
_quiet.addHandler(_Refusals())
_quiet.propagate = os.environ.get("LAKE_KAFKA_DEBUG") == "1"


@dataclass(frozen=True)
class Cluster:
    """A Kafka cluster as the pipeline reaches it."""

    bootstrap_servers: str
    settings: dict[str, str] = field(default_factory=dict)  # client settings, librdkafka's names
    topic_prefix: str = ""
    origin: str = ""  # where the address came from, for messages

    def topic(self, name: str) -> str:
        """The Kafka name of a declared topic."""
        return self.topic_prefix + name

    def group(self, name: str) -> str:
        """The Kafka name of a consumer group the pipeline names: the topics' prefix in front, so
        each prefix (an environment on a shared cluster) has groups of its own."""
        return self.topic_prefix + name

    def conf(self, **extra: Any) -> dict[str, Any]:
        """confluent-kafka settings: the cluster, the pass-through settings, then ``extra``."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers, "logger": _quiet}
        conf.update({k: v for k, v in self.settings.items() if k not in _JAVA_ONLY})
        conf.update(extra)
        return conf

    def spark_options(self) -> dict[str, str]:
        """``kafka.*`` options of Spark's Kafka source and sink (a Java client)."""
        s = {k: v for k, v in self.settings.items() if k not in _LIBRDKAFKA_ONLY}
        mechanism = self.settings.get("sasl.mechanism") or self.settings.get("sasl.mechanisms")
        if mechanism:
            s["sasl.mechanism"] = mechanism
        user = self.settings.get("sasl.username")
        if user is not None and "sasl.jaas.config" not in s:
            module = (
                "org.apache.kafka.common.security.plain.PlainLoginModule"
                if (mechanism or "PLAIN").upper() == "PLAIN"
                else "org.apache.kafka.common.security.scram.ScramLoginModule"
            )
            password = self.settings.get("sasl.password", "").replace('"', '\\"')
            s["sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
        if "ssl.ca.location" in self.settings and "ssl.truststore.location" not in s:
            s["ssl.truststore.type"] = "PEM"
            s["ssl.truststore.location"] = self.settings["ssl.ca.location"]
        # A Spark task reads a known offset range, and the Java consumer's fetch waits up to
        # fetch.max.wait.ms (500 ms by default) for more bytes at its end: about 1 s per micro-batch of
        # a 4-partition topic on 2 cores, against 80 ms with 10 ms
        # (docs/benchmarks.md, "Against Kafka Streams").
        options = {"kafka.bootstrap.servers": self.bootstrap_servers}
        options["kafka.fetch.max.wait.ms"] = FETCH_WAIT_MS
        options.update({f"kafka.{k}": v for k, v in s.items()})
        return options

    def error(self, what: str, exc: BaseException | KafkaError | str) -> UserError:
        """A one-line user error naming the cluster and what was being done. A refused login shows
        up as a broken connection; librdkafka reports the reason separately, and it is used here."""
        reason = _reason(exc)
        refused = next(
            (_REFUSED[b.strip()] for b in self.bootstrap_servers.split(",") if b.strip() in _REFUSED), None
        )
        if refused and ("transport" in reason.lower() or "timed out" in reason.lower()):
            reason = refused
        return UserError(f"Kafka at {self.bootstrap_servers} ({self.origin}): {what}: {reason}")


def _reason(exc: BaseException | KafkaError | str) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        exc = exc.args[0]
    if isinstance(exc, KafkaError):
        text = exc.str() or exc.name()
        if exc.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN):
            return f"{text} (is the cluster reachable and the address right?)"
        return text
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def topic_prefix(config: PipelineConfig) -> str:
    """What the pipeline's topic names take in front on Kafka: ``kafka.topic_prefix``, else
    ``$LAKE_KAFKA_TOPIC_PREFIX``."""
    return config.kafka.topic_prefix or os.environ.get("LAKE_KAFKA_TOPIC_PREFIX", "")


def connect(config: PipelineConfig, root: Root | Path) -> Cluster:
    """The cluster the pipeline uses (see the module doc)."""
    prefix = topic_prefix(config)
    if config.kafka.bootstrap_servers:
        return Cluster(config.kafka.bootstrap_servers, config.kafka.settings, prefix, config.source)
    env = os.environ.get("LAKE_KAFKA_BOOTSTRAP")
    if env:
        return Cluster(env, config.kafka.settings, prefix, "$LAKE_KAFKA_BOOTSTRAP")
    embedded = read_state(Layout(root).broker_state)  # the lake root's broker (spark_jobs.seams.broker)
    if embedded is not None and embedded.get("bootstrap_servers"):
        return Cluster(
            embedded["bootstrap_servers"], config.kafka.settings, prefix, f"embedded broker of {root}"
        )
    raise UserError(
        f"no Kafka cluster: {config.source} names no kafka.bootstrap_servers, $LAKE_KAFKA_BOOTSTRAP is "
        f"not set, and the embedded broker of {root} is not running; start it with 'lake kafka start'"
    )


def broker_answers(bootstrap: str) -> bool:
    """True when a broker at ``bootstrap`` answers a metadata request within a second."""
    try:
        conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _quiet}
        AdminClient(conf).list_topics(timeout=1.0)
    except KafkaException:
        return False
    return True


# --- topics -----------------------------------------------------------------------------------------


def _admin(cluster: Cluster) -> AdminClient:
    try:
        return AdminClient(cluster.conf())
    except KafkaException as exc:  # a setting librdkafka does not know, a bad value
        raise cluster.error("bad client settings", exc) from None


def partition_counts(cluster: Cluster, names: Iterable[str] | None = None) -> dict[str, int]:
    """Partition count of each existing Kafka topic (of ``names``, or all)."""
    admin = _admin(cluster)
    try:
        meta = admin.list_topics(timeout=TIMEOUT_S)
    except KafkaException as exc:
        admin.poll(0.1)  # hands librdkafka's log lines (a refused login's reason) to the logger
        raise cluster.error("cannot read the cluster's topics", exc) from None
    wanted = set(names) if names is not None else None
    return {
        name: len(t.partitions)
        for name, t in meta.topics.items()
        if (wanted is None or name in wanted) and t.error is None
    }


def commit_group(cluster: Cluster, group: str, positions: dict[str, dict[int, int]]) -> None:
    """Set the consumer group ``group``'s committed offsets to ``positions`` ({Kafka topic: {partition:
    next offset to read}}), as a consumer of the group would commit them: what Kafka's own tools
    (``kafka-consumer-groups --describe``), lag exporters and managed consoles read. The group has no
    members (the product's readers are Spark's, which join no group), so the offsets are altered
    through the admin API; a group with active members refuses it. A one-line error naming the group
    when the cluster refuses (an ACL without Read on the group, say)."""
    wanted = [TopicPartition(t, p, o) for t, by in sorted(positions.items()) for p, o in sorted(by.items())]
    if not wanted:
        return
    admin = _admin(cluster)
    try:
        done = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, wanted)])
        answer = done[group].result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        raise cluster.error(f"cannot commit the offsets of consumer group {group}", exc) from None
    failed = next((tp for tp in answer.topic_partitions or [] if tp.error is not None), None)
    if failed is not None:
        raise cluster.error(
            f"cannot commit the offsets of consumer group {group} ({failed.topic} [{failed.partition}])",
            failed.error,
        )


def timestamp_range(cluster: Cluster, name: str) -> tuple[int, int] | None:
    """The record timestamps (epoch ms) the broker accepts on topic ``name`` now: its
    ``message.timestamp.before.max.ms`` and ``after.max.ms`` around the current time (Kafka 4
    refuses timestamps more than an hour ahead by default); None when the broker stamps records
    itself (``LogAppendTime``) or does not let this client read the topic's settings."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    try:
        admin = _admin(cluster)  # held until the answer is in: a dropped client cancels its requests
        entries = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    except KafkaException:  # no DescribeConfigs right on a secured cluster: the broker still checks
        return None
    values = {key: entry.value for key, entry in entries.items()}
    if values.get("message.timestamp.type") == "LogAppendTime":
        return None
    now = int(time.time() * 1000)
    before = int(values.get("message.timestamp.before.max.ms") or 2**63 - 1)
    after = int(values.get("message.timestamp.after.max.ms") or 2**63 - 1)
    return max(0, now - before), min(2**63 - 1, now + after)


def _iso(epoch_ms: int) -> str:
    try:
        return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError):
        return "the far future"


def ensure_topics(cluster: Cluster, specs: Iterable[TopicSpec]) -> list[str]:
    """Create the declared topics that do not exist yet (lookup and changelog topics compacted); a
    topic whose partition count differs from the declaration is an error naming both, because changing
    it would move keys to other partitions. Returns the Kafka names created."""
    specs = list(specs)
    existing = partition_counts(cluster, [cluster.topic(s.name) for s in specs])
    for spec in specs:
        have = existing.get(cluster.topic(spec.name))
        if have is not None and have != spec.partitions:
            raise UserError(
                f"topic {cluster.topic(spec.name)} has {have} partitions on Kafka at "
                f"{cluster.bootstrap_servers} "
                f"but the pipeline declares {spec.partitions} (topics.{spec.name}.partitions); the product "
                f"never changes a topic's partition count, since that moves keys to other partitions: "
                f"declare {have}, or repartition into a new topic"
            )
    missing = [s for s in specs if cluster.topic(s.name) not in existing]
    if not missing:
        return []
    new = [
        NewTopic(
            cluster.topic(s.name),
            num_partitions=s.partitions,
            replication_factor=-1,  # the cluster's default.replication.factor
            config={"cleanup.policy": "compact"} if s.compacted else {},
        )
        for s in missing
    ]
    created = []
    admin = _admin(cluster)  # kept alive until every future has its answer
    for name, future in admin.create_topics(new, request_timeout=TIMEOUT_S).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:  # created meanwhile by another process
                continue
            raise cluster.error(f"cannot create topic {name}", exc) from None
    _wait_for_metadata(cluster, created)
    return created


def _wait_for_metadata(cluster: Cluster, names: list[str]) -> None:
    """A created topic takes a moment to appear in the metadata with a leader for every partition."""
    deadline = time.monotonic() + TIMEOUT_S
    admin = _admin(cluster)
    while names:
        topics = admin.list_topics(timeout=TIMEOUT_S).topics
        if all(
            n in topics
            and topics[n].error is None
            and all(p.leader >= 0 for p in topics[n].partitions.values())
            for n in names
        ):
            return
        if time.monotonic() > deadline:
            raise cluster.error(f"topics {', '.join(names)} were created but have no leader yet", "timed out")
        time.sleep(0.1)


def delete_topics(cluster: Cluster, names: list[str]) -> None:
    if not names:
        return
    admin = _admin(cluster)  # kept alive until every future has its answer
    for name, future in admin.delete_topics(names, request_timeout=TIMEOUT_S).items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise cluster.error(f"cannot delete topic {name}", exc) from None
    # until the deletion has reached the metadata, a topic created under the same name would look like
    # the old one, and records produced to it would go with it
    deadline = time.monotonic() + TIMEOUT_S * 4
    while set(partition_counts(cluster, names)):
        if time.monotonic() > deadline:
            raise cluster.error(f"topics {', '.join(names)} were deleted but are still listed", "timed out")
        time.sleep(0.1)


def require_topic(cluster: Cluster, spec: TopicSpec) -> None:
    """An error naming the topic when it does not exist on the cluster (or has another partition
    count than declared)."""
    have = partition_counts(cluster, [cluster.topic(spec.name)]).get(cluster.topic(spec.name))
    if have is None:
        raise UserError(
            f"topic {cluster.topic(spec.name)} does not exist on Kafka at {cluster.bootstrap_servers} "
            f"({cluster.origin}); it is created by 'lake produce', 'lake backfill' or 'lake topics --create'"
        )
    if have != spec.partitions:
        ensure_topics(cluster, [spec])  # raises the partition-count error


def watermarks(cluster: Cluster, spec: TopicSpec) -> list[tuple[int, int]]:
    """(low, high) offset of every partition: the first offset still in the log and the next one."""
    return offset_ranges(cluster, [spec])[spec.name]


def offset_ranges(cluster: Cluster, specs: Iterable[TopicSpec]) -> dict[str, list[tuple[int, int]]]:
    """Per declared topic, (low, high) of each of its Kafka partitions, asked of one consumer: the
    first offset still in the log, and the end as ``read_committed`` readers see it (the last stable
    offset: records of an open transaction are beyond it). A topic missing on the cluster has no
    partitions; a partition beyond the declared count is listed too (the caller decides)."""
    specs = list(specs)
    names = [cluster.topic(s.name) for s in specs]
    counts = partition_counts(cluster, names)
    consumer = _consumer(cluster)
    try:
        return {
            spec.name: [
                _watermark(cluster, consumer, TopicPartition(name, p)) for p in range(counts.get(name, 0))
            ]
            for spec, name in zip(specs, names, strict=True)
        }
    finally:
        consumer.close()


class RecordClock:
    """How far partitions go and when their records were written, for a job's lag probe: one
    consumer (``read_committed``) kept open between calls, created on first use. Not thread-safe."""

    LOOKBACK = 16  # offsets read back from an end for its last record (transaction markers between)

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = _consumer(self.cluster)
        return self._consumer

    def watermarks(self, name: str, partitions: int) -> list[tuple[int, int]]:
        """(low, high) of partitions 0..``partitions``-1 of Kafka topic ``name``."""
        return [_watermark(self.cluster, self.consumer, TopicPartition(name, p)) for p in range(partitions)]

    def time_before(self, name: str, partition: int, offset: int, low: int) -> int | None:
        """The timestamp (epoch ms) of the last committed record before ``offset`` (None: none among
        the ``LOOKBACK`` offsets before it, or the partition starts there)."""
        start = max(low, offset - self.LOOKBACK)
        if start >= offset:
            return None
        last = None
        try:
            for m in _from_offset(self.cluster, self.consumer, name, partition, start):
                if cast(int, m.offset()) >= offset:
                    break
                last = m.timestamp()[1]
                if m.offset() == offset - 1:
                    break
        except KafkaException as exc:
            raise self.cluster.error(f"reading {name}[{partition}]", exc) from None
        finally:
            self.consumer.unassign()
        return last

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def topic_ids(cluster: Cluster, names: Iterable[str]) -> dict[str, str]:
    """Kafka name -> the topic's id (a UUID the cluster gives a topic when it is created: a topic
    deleted and created again under the same name has a new one). Missing topics are left out."""
    names = list(names)
    existing = partition_counts(cluster, names)
    wanted = [n for n in names if n in existing]
    if not wanted:
        return {}
    admin = _admin(cluster)
    out = {}
    for name, future in admin.describe_topics(TopicCollection(wanted), request_timeout=TIMEOUT_S).items():
        try:
            out[name] = str(future.result().topic_id)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:  # deleted meanwhile
                continue
            raise cluster.error(f"cannot describe topic {name}", exc) from None
    return out


_TRANSIENT = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)


def _watermark(cluster: Cluster, consumer: Consumer, tp: TopicPartition) -> tuple[int, int]:
    """(low, high) of one partition; a leader being elected (a new or recreated topic) is waited for."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=TIMEOUT_S)
            return int(low), int(high)
        except KafkaException as exc:
            if exc.args[0].code() not in _TRANSIENT or time.monotonic() > deadline:
                raise cluster.error(f"cannot read the offsets of {tp.topic}[{tp.partition}]", exc) from None
            time.sleep(0.1)


# --- producing --------------------------------------------------------------------------------------


@dataclass
class Delivered:
    """What one transactional produce wrote."""

    topic: str
    records: int = 0
    tombstones: int = 0
    per_partition: list[int] = field(default_factory=list)
    seconds: float = 0.0


def produce(
    cluster: Cluster,
    spec: TopicSpec,
    batches: Iterable[tuple],
    partitioner: str | None = None,
    timestamp_ms: int | None = None,
    progress: Callable[[int], None] | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    transactional_id: str | None = None,
) -> Delivered:
    """Produce (key, value) array pairs (binary, null value = tombstone), or (keys, values,
    timestamps in ms, headers[, partitions]) tuples for a copy of records (each to the partition
    given, else where the partitioner puts it), to a declared topic as one
    Kafka transaction, placed by librdkafka's own partitioner (``murmur2_random`` like the Java client,
    or ``consistent_random`` like kcat). ``batches`` is consumed lazily; an exception it raises, or any
    delivery failure, aborts the transaction, so nothing of the call becomes visible.

    ``transactional_id`` (see ``producer_id``) should be stable for one writer: a process that died
    mid-transaction leaves it open on the broker, holding back ``read_committed`` readers of its
    partitions until ``transaction.timeout.ms``; the next producer with the same id aborts it at once.
    Without one, a fresh random id is used. A writer that produces again and again keeps a
    :class:`TransactionalProducer` instead."""
    writer = TransactionalProducer(cluster, spec, partitioner, transactional_id)
    try:
        return writer.produce(batches, timestamp_ms, progress, headers)
    finally:
        writer.close()


class TransactionalProducer:
    """One writer's transactional producer for one topic, kept open between transactions (starting
    one costs a broker round trip per step: ``init_transactions``, the topic check)."""

    def __init__(
        self,
        cluster: Cluster,
        spec: TopicSpec,
        partitioner: str | None = None,
        transactional_id: str | None = None,
    ):
        self.cluster, self.spec = cluster, spec
        self.chosen = partitioners.check_partitioner(partitioner or spec.partitioner)
        self.name = cluster.topic(spec.name)
        self.transactional_id = transactional_id or f"lake-produce-{self.name}-{uuid.uuid4().hex[:12]}"
        self._producer: Producer | None = None

    def _open(self) -> Producer:
        if self._producer is not None:
            return self._producer
        ensure_topics(self.cluster, [self.spec])
        try:
            producer = Producer(
                self.cluster.conf(
                    **{
                        "partitioner": partitioners.LIBRDKAFKA[self.chosen],
                        "enable.idempotence": True,
                        "acks": "all",
                        "transactional.id": self.transactional_id,
                        "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                        "linger.ms": 10,
                        "queue.buffering.max.messages": 500_000,
                    }
                )
            )
        except KafkaException as exc:
            raise self.cluster.error("bad client settings", exc) from None
        try:
            _riding_failover(producer.init_transactions)
        except KafkaException as exc:
            raise self.cluster.error(f"cannot start a transaction to produce to {self.name}", exc) from None
        self._producer = producer
        return producer

    def close(self) -> None:
        """Forget the producer (the next transaction opens a new one)."""
        self._producer = None

    def produce(
        self,
        batches: Iterable[tuple],
        timestamp_ms: int | None = None,
        progress: Callable[[int], None] | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Delivered:
        """The batches as one transaction (see :func:`produce`); visible to ``read_committed``
        readers when this returns."""
        started = time.perf_counter()
        cluster, spec, name = self.cluster, self.spec, self.name
        if timestamp_ms is not None and not 0 <= timestamp_ms < 2**63:
            raise UserError(f"timestamp {timestamp_ms} is out of range (epoch milliseconds, 0 .. 2^63-1)")
        producer = self._open()
        if timestamp_ms is not None:  # the broker would refuse each record with a vague reason
            bounds = timestamp_range(cluster, name)
            if bounds is not None and not bounds[0] <= timestamp_ms <= bounds[1]:
                low, high = (_iso(b) for b in bounds)
                raise UserError(
                    f"timestamp {timestamp_ms} is outside what topic {name} accepts now: {bounds[0]} .. "
                    f"{bounds[1]} epoch ms ({low} .. {high}; its message.timestamp.before.max.ms and "
                    "after.max.ms); nothing was sent"
                )
        result = Delivered(name, per_partition=[0] * spec.partitions)
        failures: list[KafkaError] = []
        last = [-1] * spec.partitions  # per partition, the offset of the last record delivered

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                failures.append(err)
            else:
                p = cast(int, msg.partition())
                result.per_partition[p] += 1
                last[p] = max(last[p], cast(int, msg.offset()))

        try:
            _riding_failover(lambda _: producer.begin_transaction())
        except KafkaException as exc:
            self.close()
            raise cluster.error(f"cannot start a transaction to produce to {name}", exc) from None
        try:
            for batch in batches:
                keys, values = batch[0], batch[1]
                stamps = batch[2] if len(batch) > 2 else None  # type: ignore[misc]
                heads = batch[3] if len(batch) > 3 else None  # type: ignore[misc]
                places = batch[4] if len(batch) > 4 else None  # type: ignore[misc]
                _send(producer, name, keys, values, timestamp_ms, headers, delivered, stamps, heads, places)
                result.records += len(keys)
                result.tombstones += values.null_count
                if progress:
                    progress(len(keys))
                if failures:
                    break
            waited = TIMEOUT_S * 4
            remaining = producer.flush(waited)
            if failures:
                raise cluster.error(f"producing to {name} failed, nothing was committed", failures[0])
            if remaining:
                unsent = f"{remaining} record(s) not acknowledged within {waited:g} s (is the broker down?)"
                raise cluster.error(f"producing to {name} failed, nothing was committed", unsent)
            faults.point("produce")  # every record on the broker, the transaction open
            _riding_failover(producer.commit_transaction, waited)
            _await_visible(cluster, spec, last)
            faults.point("commit")  # the transaction is committed and visible
        except BaseException as exc:
            try:
                producer.abort_transaction(TIMEOUT_S)
            except KafkaException:
                pass  # the broker is gone: the transaction times out there, unseen by read_committed readers
            self.close()  # a producer in an unknown state is not reused
            if isinstance(exc, KafkaException):
                raise cluster.error(f"producing to {name} failed, nothing was committed", exc) from None
            raise
        result.seconds = time.perf_counter() - started
        return result


def _riding_failover(call: Callable[[float], Any], budget: float = TIMEOUT_S * 4) -> Any:
    """``call(timeout)``, called again while it fails with an error Kafka calls retriable, for up to
    ``budget`` seconds: a broker that dies takes its transaction coordinators with it, and the
    cluster takes a few seconds to notice (``broker.session.timeout.ms``, 9 s by default) and elect
    new ones from the replicas. librdkafka says "retry call to resume" then, and the same call on
    the same producer goes on where it stopped."""
    deadline = time.monotonic() + budget
    while True:
        try:
            return call(max(min(TIMEOUT_S, deadline - time.monotonic()), 1.0))
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.retriable()) or time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def publish_frame(
    cluster: Cluster,
    spec: TopicSpec,
    records: Any,  # a Spark DataFrame: key, v (null: a tombstone), ts (epoch ms) and the order columns
    transactional_id: str,
    tag: bytes,
    may_be_sent: bool,
    topic_id: str,
    order: Sequence[str] = (),
) -> Delivered:
    """Publish a Spark DataFrame's records to a declared topic from the executors, exactly once per
    ``tag``: one Kafka transaction per partition of the topic, written by the one task that holds that
    partition's records (murmur2 of the key, as Kafka's producer places them), with the transactional
    id ``<transactional_id>-<partition>``: a task that replaces another fences it. With
    ``may_be_sent`` (a replay), or in a retried task, a partition whose last records carry ``tag``
    already got them and is skipped. Each partition's records go in ``order`` (else any). Visible to
    ``read_committed`` readers when this returns. ``topic_id``: the existing topic's
    (:func:`topic_ids`; a writer that publishes again and again asks once), so that the executors'
    producers of a recreated topic are new ones. The writer is ``lake.kafka.ChangelogWriter``."""
    from py4j.protocol import Py4JJavaError
    from pyspark.sql import DataFrame

    started = time.perf_counter()
    name = cluster.topic(spec.name)
    conf = {k.removeprefix("kafka."): v for k, v in cluster.spark_options().items()}
    conf.update({"transaction.timeout.ms": str(TRANSACTION_TIMEOUT_MS), "linger.ms": "5"})
    conf.setdefault("batch.size", "262144")
    spark = records.sparkSession
    writer = spark._jvm.lake.kafka.ChangelogWriter  # type: ignore[union-attr]
    try:
        sent = DataFrame(
            writer.publish(
                records._jdf,
                conf,
                name,
                topic_id,
                spec.partitions,
                transactional_id,
                tag.decode(),
                may_be_sent,
                ",".join(order),
            ),
            spark,
        ).collect()
    except Py4JJavaError as exc:
        raise cluster.error(f"cannot publish to {name}", _java_reason(exc)) from None
    result = Delivered(name, per_partition=[0] * spec.partitions)
    last = [-1] * spec.partitions
    for row in sent:
        result.per_partition[row.partition] = row.records
        if not row.already_sent:
            last[row.partition] = row.last_offset
    result.records = sum(result.per_partition)
    _await_visible(cluster, spec, last)
    result.seconds = time.perf_counter() - started
    return result


def _java_reason(exc: Any) -> str:
    """The innermost cause's message of a Java exception that reached Python (a failed Spark job)."""
    cause = exc.java_exception
    while cause.getCause() is not None:
        cause = cause.getCause()
    return f"{cause.getClass().getSimpleName()}: {cause.getMessage()}"


def forget_publishers(spark: Any, transactional_id: str) -> None:
    """Close the executors' kept producers of :func:`publish_frame` under ``transactional_id`` (in
    this process: a local Spark's executors; a cluster's close theirs when their application ends)."""
    spark._jvm.lake.kafka.ChangelogWriter.forget(transactional_id)


def producer_id(root: Any, *names: str) -> str:
    """A transactional id that is the same every time one writer of a lake root runs (e.g.
    ``("join", "consents_enriched")``, or a topic and a producer slot), and differs between lake
    roots that share a cluster. A root on an object store is one lake whichever machine writes it:
    its ids are the same on every machine, so the producers of a job's new holder (another machine,
    after the lease lapsed) fence those of the old one, whose open transaction is aborted and whose
    next one is refused. A local folder is one machine's: its ids name the host too, so that two
    hosts' lakes at the same path do not fence each other."""
    text = str(root)
    shared = "://" in text
    where = hashlib.sha1((text if shared else str(Path(text).resolve())).encode()).hexdigest()[:10]
    return "-".join(["lake", *([] if shared else [socket.gethostname()]), where, *names])


def _await_visible(cluster: Cluster, spec: TopicSpec, last: list[int]) -> None:
    """Return once ``read_committed`` readers see the committed records: the commit markers are
    written to the partitions just after the commit, and until then the end offsets lag behind."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        ends = [high for _, high in watermarks(cluster, spec)]
        if all(end > offset + 1 for end, offset in zip(ends, last, strict=True) if offset >= 0):
            return
        if time.monotonic() > deadline:
            raise cluster.error(
                f"records committed to {cluster.topic(spec.name)} did not become visible", "timed out"
            )
        time.sleep(0.02)


BATCH_HEADER = "lake.batch"  # the micro-batch a join's record was written by (its changelog's, dead letters')
TAIL_DEPTH = 8  # offsets read back per partition to find a batch's records (they count commit markers)


def tagged(cluster: Cluster, spec: TopicSpec, tag: bytes) -> bool:
    """Whether a committed record among the last offsets of one of the topic's partitions carries
    ``tag`` in its ``lake.batch`` header: a writer that commits one transaction per batch, and checks
    before it sends a batch that may be a replay, finds its last batch there when it went out."""
    start = lambda low, high: max(low, high - TAIL_DEPTH)  # noqa: E731
    for records in read(cluster, spec, start=start):
        for m in records:
            if (BATCH_HEADER, tag) in (m.headers() or []):
                return True
    return False


def _send(
    producer: Producer,
    topic: str,
    keys: pa.Array,
    values: pa.Array,
    timestamp_ms: int | None,
    headers: list[tuple[str, bytes]] | None,
    delivered: Callable[[KafkaError | None, Message], None],
    stamps: list[int] | None = None,
    heads: list[list[tuple[str, bytes]] | None] | None = None,
    places: list[int] | None = None,
) -> None:
    extra: dict[str, Any] = {"on_delivery": delivered}
    if timestamp_ms is not None:
        extra["timestamp"] = timestamp_ms
    if headers:
        extra["headers"] = headers
    send = producer.produce
    for i, (key, value) in enumerate(zip(keys.to_pylist(), values.to_pylist(), strict=True)):
        if stamps is not None:  # per-record timestamps and headers (a copy of another topic's records)
            extra["timestamp"] = stamps[i]
            extra["headers"] = heads[i] if heads is not None and heads[i] else headers
        if places is not None:  # a record put back where it was (lake quarantine --replay)
            extra["partition"] = places[i]
        while True:
            try:
                send(topic, value, key, **extra)
                break
            except BufferError:  # the local queue is full: let librdkafka deliver some
                producer.poll(0.05)
    producer.poll(0)


# --- consuming --------------------------------------------------------------------------------------


def _consumer(cluster: Cluster) -> Consumer:
    try:
        return Consumer(
            cluster.conf(
                **{
                    # offsets are assigned, never committed: the group is only librdkafka's requirement
                    "group.id": f"lake-read-{uuid.uuid4().hex[:12]}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    # a fetch refused right after a topic was (re)created must not jump to the end
                    "auto.offset.reset": "earliest",
                    "fetch.max.bytes": 52428800,
                    # a fetch at a partition's end waits this long for more (500 ms by default), and the
                    # next partition's first fetch waits behind it
                    "fetch.wait.max.ms": 10,
                }
            )
        )
    except KafkaException as exc:
        raise cluster.error("bad client settings", exc) from None


def read(
    cluster: Cluster,
    spec: TopicSpec,
    start: Callable[[int, int], int] | None = None,
    partitions: Iterable[int] | None = None,
    batch: int = 10_000,
    after: Sequence[int] | None = None,
) -> Iterator[list[Message]]:
    """The committed records of a topic up to its end as the call starts, partition by partition in
    offset order, in lists of at most ``batch``. ``start(low, high)`` gives each partition's first
    offset (default: the beginning), or ``after`` the first offset of each partition. No consumer
    group offsets are read or written."""
    name = cluster.topic(spec.name)
    require_topic(cluster, spec)
    consumer = _consumer(cluster)
    try:
        wanted = list(range(spec.partitions) if partitions is None else partitions)
        # every partition's range first: asked between assignments, each took a quarter second
        ranges = {p: _watermark(cluster, consumer, TopicPartition(name, p)) for p in wanted}
        for p in wanted:
            low, high = ranges[p]
            first = low if start is None else max(start(low, high), low)
            if after is not None and p < len(after):
                first = max(first, int(after[p]))
            if first >= high:
                continue
            consumer.assign([TopicPartition(name, p, first)])
            done = False
            deadline = time.monotonic() + TIMEOUT_S
            while not done:
                # consume() waits until it has ``batch`` records or the timeout passes: keep it short,
                # librdkafka fetches ahead meanwhile (0.1 s cost 0.2 s per partition of a small topic)
                messages = consumer.consume(num_messages=batch, timeout=0.01)
                if not messages:
                    # past the last record there may only be transaction markers (or aborted records)
                    position = consumer.position([TopicPartition(name, p)])[0].offset
                    if position >= high:
                        break
                    if time.monotonic() > deadline:
                        raise cluster.error(
                            f"reading {name}[{p}] stalled at offset {first}", "no records arrived"
                        )
                    continue
                deadline = time.monotonic() + TIMEOUT_S
                out = []
                for m in messages:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            done = done or m.partition() == p
                            continue
                        raise cluster.error(f"reading {name}[{p}]", err)
                    if m.partition() != p or cast(int, m.offset()) < first:
                        continue  # a record of the previous assignment, or one read again after a reset
                    out.append(m)
                    first = cast(int, m.offset()) + 1
                    if first >= high:
                        done = True
                        break
                if out:
                    yield out
            consumer.unassign()
    except KafkaException as exc:
        raise cluster.error(f"reading {name}", exc) from None
    finally:
        consumer.close()


def _from_offset(
    cluster: Cluster, consumer: Consumer, name: str, partition: int, start: int
) -> Iterator[Message]:
    """One partition's committed records from ``start`` on, until its end (only transaction markers or
    aborted records left) or the client's timeout; the consumer is left assigned to it."""
    consumer.assign([TopicPartition(name, partition, start)])
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        m = consumer.poll(0.05)
        if m is None:
            continue
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return
            raise cluster.error(f"reading {name}[{partition}]", err)
        if m.partition() == partition:
            yield m


def fetch(cluster: Cluster, places: Iterable[tuple[str, int, int]]) -> dict[tuple[str, int, int], Message]:
    """The committed records at ``places`` (declared topic, partition, offset), each read with one
    assign and seek. A place whose record is gone (compacted or deleted by retention, or past the
    end) is left out of the answer."""
    wanted = sorted(set(places))
    found: dict[tuple[str, int, int], Message] = {}
    if not wanted:
        return found
    consumer = _consumer(cluster)
    try:
        for topic, partition, offset in wanted:
            name = cluster.topic(topic)
            low, high = _watermark(cluster, consumer, TopicPartition(name, partition))
            if not low <= offset < high:
                continue
            for m in _from_offset(cluster, consumer, name, partition, offset):
                if cast(int, m.offset()) >= offset:
                    if m.offset() == offset:  # a later offset: this one was compacted away
                        found[(topic, partition, offset)] = m
                    break
            consumer.unassign()
    except KafkaException as exc:
        raise cluster.error("reading records by offset", exc) from None
    finally:
        consumer.close()
    return found
