"""The Kafka seam (spark_jobs/seams/kafka.py): which cluster a pipeline reaches, Spark's client options, and
a transactional produce read back exactly, with an aborted one leaving nothing visible."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from spark_jobs.config import KafkaSpec, TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.layout import Layout
from spark_jobs.seams.kafka import (
    Cluster,
    connect,
    delete_topics,
    ensure_topics,
    offset_ranges,
    partition_counts,
    produce,
    producer_id,
    read,
    topic_ids,
    watermarks,
)
from spark_jobs.seams.partitioners import partition_for
from spark_jobs.seams.processes import write_state


class Config:
    """What connect() reads of a pipeline."""

    def __init__(self, kafka: KafkaSpec):
        self.kafka, self.source = kafka, "p.yaml"


def test_the_cluster_comes_from_the_pipeline_then_the_environment_then_the_embedded_broker(
    tmp_path, monkeypatch
):
    own = connect(Config(KafkaSpec("k1:9092", {"acks": "all"}, "dev.")), tmp_path)
    assert (own.bootstrap_servers, own.settings, own.origin, own.topic("t")) == (
        "k1:9092",
        {"acks": "all"},
        "p.yaml",
        "dev.t",
    )
    monkeypatch.setenv("LAKE_KAFKA_TOPIC_PREFIX", "")
    env = connect(Config(KafkaSpec()), tmp_path)
    assert (env.bootstrap_servers, env.origin) == (
        os.environ["LAKE_KAFKA_BOOTSTRAP"],
        "$LAKE_KAFKA_BOOTSTRAP",
    )
    monkeypatch.delenv("LAKE_KAFKA_BOOTSTRAP")
    # the lake root's embedded broker, found from its state file while its process lives
    Layout(tmp_path).kafka.mkdir()
    write_state(Layout(tmp_path).broker_state, {"pid": os.getpid(), "bootstrap_servers": "127.0.0.1:19"})
    embedded = connect(Config(KafkaSpec()), tmp_path)
    assert (embedded.bootstrap_servers, embedded.origin) == ("127.0.0.1:19", f"embedded broker of {tmp_path}")
    Layout(tmp_path).broker_state.unlink()
    with pytest.raises(
        UserError, match=r"^no Kafka cluster: p\.yaml names no kafka\.bootstrap_servers.*'lake kafka start'$"
    ):
        connect(Config(KafkaSpec()), tmp_path)


def test_a_shared_roots_transactional_ids_are_the_same_on_every_machine_a_local_roots_name_the_host(
    tmp_path, monkeypatch
):
    """The machine that takes a join over on an s3a root opens its changelog producers with the ids
    the old holder used, which fences the old holder's (its open transaction aborted, the next one
    refused); two hosts' local lakes at one path keep ids of their own."""
    ids = {}
    for host in ("machine-a", "machine-b"):
        monkeypatch.setattr("socket.gethostname", lambda host=host: host)
        ids[host] = (producer_id("s3a://lake/prod", "join", "j"), producer_id(tmp_path, "join", "j"))
    shared, local = zip(*ids.values(), strict=True)
    assert shared[0] == shared[1] and shared[0].startswith("lake-") and shared[0].endswith("-join-j")
    assert "machine" not in shared[0]
    assert local[0].startswith("lake-machine-a-") and local[1] == local[0].replace("machine-a", "machine-b")
    assert producer_id("s3a://lake/other", "join", "j") != shared[0]


def test_spark_gets_java_client_options_with_the_short_fetch_wait():
    scram = Cluster(
        "b:9093",
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u",
         "sasl.password": 'p"w', "ssl.ca.location": "/ca.pem"},
    )  # fmt: skip
    assert scram.spark_options() == {
        "kafka.bootstrap.servers": "b:9093",
        "kafka.fetch.max.wait.ms": "10",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": (
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p\\"w";'
        ),
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/ca.pem",
    }
    assert Cluster("b:9092", {"fetch.max.wait.ms": "50"}).spark_options()["kafka.fetch.max.wait.ms"] == "50"
    assert "sasl.jaas.config" not in scram.conf() and scram.conf()["sasl.username"] == "u"


def test_a_transaction_is_read_back_exactly_and_an_aborted_one_not_at_all():
    cluster = Cluster(os.environ["LAKE_KAFKA_BOOTSTRAP"], topic_prefix=os.environ["LAKE_KAFKA_TOPIC_PREFIX"])
    spec = TopicSpec("seam", 2)
    assert ensure_topics(cluster, [spec]) == [cluster.topic("seam")]
    assert ensure_topics(cluster, [spec]) == []  # there already
    assert partition_counts(cluster, [cluster.topic("seam")]) == {cluster.topic("seam"): 2}
    keys = pa.array([b"a", b"b", b"a"], pa.binary())
    values = pa.array([b"1", b"2", None], pa.binary())
    delivered = produce(cluster, spec, [(keys, values)], "murmur2", timestamp_ms=1_000)
    assert (delivered.records, delivered.tombstones, sum(delivered.per_partition)) == (3, 1, 3)

    def failing():
        yield pa.array([b"c"], pa.binary()), pa.array([b"3"], pa.binary())
        raise RuntimeError("the input broke")

    with pytest.raises(RuntimeError, match="the input broke"):
        produce(cluster, spec, failing(), "murmur2")
    records = [
        (m.key(), m.value(), m.partition(), m.offset(), m.timestamp()[1])
        for b in read(cluster, spec)
        for m in b
    ]
    # murmur2 puts a in partition 1, b in partition 0 (the Java client's placement); the aborted c is
    # not read, though its record and abort marker take offsets
    # in offset order per partition, where the Java client's murmur2 puts each key; the aborted
    # transaction's record is not read
    assert [partition_for(k, 2) for k in (b"a", b"b")] == [0, 0]
    assert sorted(records, key=lambda r: (r[2], r[3])) == [
        (b"a", b"1", 0, 0, 1000),
        (b"b", b"2", 0, 1, 1000),
        (b"a", None, 0, 2, 1000),
    ]
    assert watermarks(cluster, spec) == [(0, 4), (0, 0)]  # the end counts the commit marker
    assert offset_ranges(cluster, [spec]) == {"seam": [(0, 4), (0, 0)]}
    last_two = read(cluster, spec, lambda low, high: max(low, high - 2))  # offsets 2 and 3 (the marker)
    assert [(m.key(), m.offset()) for b in last_two for m in b] == [(b"a", 2)]
    first = topic_ids(cluster, [cluster.topic("seam")])
    delete_topics(cluster, [cluster.topic("seam")])
    assert partition_counts(cluster, [cluster.topic("seam")]) == {}
    ensure_topics(cluster, [spec])
    assert topic_ids(cluster, [cluster.topic("seam")]) != first  # a topic made again is another topic
