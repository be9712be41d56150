"""Topics on Kafka: kcat-style produce and consume, offsets, tombstones, headers, placement,
atomicity, and the errors a user meets (partition counts, unknown topics, unreachable clusters)."""

from __future__ import annotations

import io
import time
import zlib

import pyarrow as pa
import pytest

from spark_jobs.config import KafkaSpec, PipelineConfig, TopicSpec, load_config
from spark_jobs.errors import UserError
from spark_jobs.seams.kafka import Cluster, connect, ensure_topics, produce, watermarks
from spark_jobs.seams.partitioners import partition_for
from spark_jobs.topics.produce_consume import consume, parse_format, produce_lines

SPEC = TopicSpec("t", partitions=3, key_format="string", value_format="string")


@pytest.fixture
def kc(lake) -> Cluster:
    config = PipelineConfig("test.yaml", "test", topics={"t": SPEC})
    return connect(config, lake.root)


def put(kc, text: bytes, spec=SPEC, **kw):
    return produce_lines(kc, spec, io.BytesIO(text), "input.txt", **kw)


def dump(kc, spec=SPEC, fmt="%k|%s|%p|%o\\n", **kw) -> str:
    out = io.BytesIO()
    consume(kc, spec, out, fmt=fmt, **kw)
    return out.getvalue().decode()


def test_produce_consume_round_trip_with_offsets_per_partition(kc):
    res = put(kc, b"a;1\nb;2\nc;3\na;4\n", key_sep=";", timestamp_ms=1_000)
    assert res.records == 4 and res.topic == kc.topic("t")
    res2 = put(kc, b"b;5\n", key_sep=";", timestamp_ms=2_000)
    assert res2.records == 1
    # offsets as Kafka gives them: each call is one transaction, whose commit marker takes an offset
    # in every partition it wrote to
    expected, offsets = [], [0, 0, 0]
    for batch in ([("a", "1"), ("b", "2"), ("c", "3"), ("a", "4")], [("b", "5")]):
        touched = set()
        for key, value in batch:
            p = partition_for(key.encode(), 3)
            expected.append((p, offsets[p], key, value))
            offsets[p] += 1
            touched.add(p)
        for p in touched:
            offsets[p] += 1
    assert res.per_partition == [sum(1 for p, *_ in expected[:4] if p == q) for q in range(3)]
    lines = [f"{k}|{v}|{p}|{o}" for p, o, k, v in sorted(expected)]
    assert dump(kc).splitlines() == lines
    assert [high for _, high in watermarks(kc, SPEC)] == offsets
    assert dump(kc, fmt="%t %T %K %S\\n", count=1) == f"{kc.topic('t')} 1000 1 1\n"


def test_tombstones_null_keys_headers_and_escapes(kc):
    put(kc, b"k;\n;v\nx;y\n", key_sep=";", null_empty=True)
    got = sorted(dump(kc, fmt="%k,%s,%K,%S\\n", null_as=b"NULL").splitlines())
    assert got == ["NULL,v,-1,1", "k,NULL,1,-1", "x,y,1,1"]
    assert parse_format("%k\\t%s\\\\%%\\n") == [("k",), "\t", ("s",), "\\%\n"]
    spec = TopicSpec("h", 1, value_format="string")
    produce(kc, spec, [(pa.array([b"k1"]), pa.array([None], pa.binary()))], headers=[("trace", b"abc")])
    assert dump(kc, spec, fmt="%k|%s|%h\\n", null_as=b"NULL") == "k1|NULL|trace=abc\n"


def test_without_key_separator_every_line_is_a_value(kc):
    put(kc, b"plain;text\nsecond\n")
    assert sorted(dump(kc, fmt="%K:%s\\n").splitlines()) == ["-1:plain;text", "-1:second"]


def test_consume_start_offsets_count_and_partition(kc):
    keys = [f"user_{i}" for i in range(30)]
    put(kc, "".join(f"{k};{i}\n" for i, k in enumerate(keys)).encode(), key_sep=";")
    per_part = {p: [k for k in keys if partition_for(k.encode(), 3) == p] for p in range(3)}
    assert dump(kc, fmt="%k\\n", partition=1).split() == per_part[1]
    assert dump(kc, fmt="%k\\n", partition=1, start="2").split() == per_part[1][2:]
    # -N counts back from the end offset, which is the transaction's commit marker
    assert dump(kc, fmt="%k\\n", start="-2").split() == [per_part[p][-1] for p in range(3)]
    assert dump(kc, fmt="%k\\n", start="end") == ""
    assert dump(kc, fmt="%k\\n", count=4).split() == (per_part[0] + per_part[1])[:4]
    with pytest.raises(UserError, match="bad start offset 'later'"):
        dump(kc, start="later")


def test_consistent_random_places_like_kcat_and_murmur2_random_like_java(kc):
    keys = [f"user_{i}" for i in range(1, 11)]
    lines = "".join(f"{k};x\n" for k in keys).encode()
    put(kc, lines, key_sep=";", partitioner="consistent_random")
    got = dict(line.split(",") for line in dump(kc, fmt="%k,%p\\n").splitlines())
    assert got == {k: str(zlib.crc32(k.encode()) % 3) for k in keys}
    java = TopicSpec("j", 4, value_format="string")
    put(kc, lines, spec=java, key_sep=";", partitioner="murmur2_random")
    got = dict(line.split(",") for line in dump(kc, java, fmt="%k,%p\\n").splitlines())
    # docs/demo.md's table of the seed's keys: where the Java client puts them in 4 partitions
    assert got == {
        "user_1": "3", "user_2": "2", "user_3": "2", "user_4": "2", "user_5": "1",
        "user_6": "1", "user_7": "2", "user_8": "0", "user_9": "2", "user_10": "1",
    }  # fmt: skip


@pytest.mark.parametrize(
    "text,spec,message",
    [
        (b"a;1\nno separator\n", SPEC, "input.txt:2: no key separator ';'"),
        (b"a;1\n\xffb;2\n", SPEC, "input.txt:2: key is not valid UTF-8"),
        (
            b'a;{"x":1}\nb;{oops\n',
            TopicSpec("t", 3, value_format="json"),
            "input.txt:2: value is not valid JSON",
        ),
    ],
)
def test_bad_input_names_the_line_and_writes_nothing(kc, text, spec, message):
    put(kc, b"ok;1\n", key_sep=";")
    with pytest.raises(UserError, match=message):
        put(kc, text, spec=spec, key_sep=";")
    assert dump(kc, fmt="%k\\n") == "ok\n"  # the aborted transaction is invisible


def test_bytes_keys_accept_any_bytes(kc):
    spec = TopicSpec("t", 3, key_format="bytes", value_format="string")
    put(kc, b"\x00\x00\x00\x00\x01user_1;v\n", spec=spec, key_sep=";")
    assert dump(kc, spec, fmt="%k\\n").encode() == b"\x00\x00\x00\x00\x01user_1\n"


def test_large_input_spans_chunks_with_correct_line_numbers(kc, monkeypatch):
    import spark_jobs.topics.produce_consume as topics

    monkeypatch.setattr(topics, "CHUNK_BYTES", 64)
    text = b"".join(b"key_%03d;value\n" % i for i in range(100)) + b"broken\n"
    with pytest.raises(UserError, match="input.txt:101: no key separator"):
        put(kc, text, key_sep=";")
    assert dump(kc) == ""  # records of the first blocks were sent, then aborted with the transaction
    res = put(kc, text[: -len(b"broken\n")], key_sep=";")
    assert res.records == 100 and sum(res.per_partition) == 100
    assert dump(kc, fmt="%o\\n", partition=0).split() == [str(i) for i in range(res.per_partition[0])]


def test_declared_partition_count_must_match_the_broker(kc):
    ensure_topics(kc, [SPEC])
    with pytest.raises(UserError) as err:
        ensure_topics(kc, [TopicSpec("t", 5)])
    assert str(err.value) == (
        f"topic {kc.topic('t')} has 3 partitions on Kafka at {kc.bootstrap_servers} but the pipeline "
        "declares 5 (topics.t.partitions); the product never changes a topic's partition count, since "
        "that moves keys to other partitions: declare 3, or repartition into a new topic"
    )


def test_consuming_an_unknown_topic_names_it(kc):
    with pytest.raises(UserError, match=rf"topic {kc.topic('nope')} does not exist on Kafka at "):
        dump(kc, TopicSpec("nope", 1))


def test_unreachable_cluster_is_one_line(monkeypatch, lake):
    monkeypatch.setattr("spark_jobs.seams.kafka.TIMEOUT_S", 2.0)
    closed = Cluster("127.0.0.1:1", origin="test")
    with pytest.raises(UserError) as err:
        put(closed, b"a;1\n", key_sep=";")
    text = str(err.value)
    assert (
        text.startswith("Kafka at 127.0.0.1:1 (test): cannot read the cluster's topics: ")
        and "\n" not in text
    )


def test_timestamps_out_of_range_and_refused_topic_names(kc):
    with pytest.raises(UserError, match="timestamp -5 is out of range"):
        put(kc, b"a;1\n", key_sep=";", timestamp_ms=-5)
    dotted = Cluster(kc.bootstrap_servers, topic_prefix="", origin="test")
    with pytest.raises(UserError, match=r"cannot create topic \.\.: .*"):
        ensure_topics(dotted, [TopicSpec("..", 1)])


def test_client_settings_pass_through_sasl(kafka, tmp_path, monkeypatch):
    """The pipeline's kafka: section reaches librdkafka (and Spark) unchanged: the broker's SASL/PLAIN
    listener accepts the right password and refuses a wrong one with one line."""
    from conftest import SASL_PASSWORD, SASL_USER

    monkeypatch.setenv("KAFKA_TEST_PASSWORD", SASL_PASSWORD)

    def pipeline(password: str) -> PipelineConfig:
        path = tmp_path / "sasl.yaml"
        path.write_text(
            "kafka:\n"
            f"  bootstrap_servers: {kafka.details['sasl_bootstrap_servers']}\n"
            "  security.protocol: SASL_PLAINTEXT\n"
            "  sasl.mechanism: PLAIN\n"
            f"  sasl.username: {SASL_USER}\n"
            f"  sasl.password: {password}\n"
            "topics:\n  s: {partitions: 2, value: string}\n"
        )
        return load_config(path)

    good = pipeline("${KAFKA_TEST_PASSWORD}")
    assert good.kafka.settings["sasl.password"] == SASL_PASSWORD
    cluster = connect(good, tmp_path)
    assert cluster.bootstrap_servers == kafka.details["sasl_bootstrap_servers"]
    put(cluster, b"k;v\n", spec=good.topic("s"), key_sep=";")
    assert dump(cluster, good.topic("s"), fmt="%k=%s\\n") == "k=v\n"
    assert cluster.spark_options()["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{SASL_USER}" password="{SASL_PASSWORD}";'
    )
    bad = connect(pipeline("wrong"), tmp_path)
    with pytest.raises(UserError) as err:
        dump(bad, good.topic("s"))
    assert "Authentication failed" in str(err.value) and "\n" not in str(err.value)


def test_a_config_without_a_cluster_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.delenv("LAKE_KAFKA_BOOTSTRAP")
    config = PipelineConfig("p.yaml", "p", kafka=KafkaSpec(), topics={"t": SPEC})
    with pytest.raises(
        UserError,
        match=r"no Kafka cluster: p.yaml names no kafka.bootstrap_servers, .* start it with 'lake kafka start'",
    ):
        connect(config, tmp_path)


@pytest.mark.slow
def test_a_broker_that_dies_mid_produce_is_one_line_and_nothing_is_visible(tmp_path, monkeypatch):
    """A broker of its own (the session's must live): SIGKILL it after the first 1,000 records of a
    transaction were sent, then start it again; read_committed readers see none of them."""
    import os
    import signal
    import socket

    from spark_jobs.seams import broker, kafka

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "own-broker"
    state = broker.Broker(home).start(port)
    monkeypatch.setenv("LAKE_KAFKA_BOOTSTRAP", str(state.address))
    monkeypatch.setattr(kafka, "TIMEOUT_S", 3.0)
    config = PipelineConfig("test.yaml", "test", topics={"t": SPEC})
    cluster = connect(config, tmp_path / "lake")
    ensure_topics(cluster, [SPEC])

    def in_the_log() -> int:
        """Records in the topic's log, committed or not (a read_uncommitted client's end offsets)."""
        from confluent_kafka import Consumer, TopicPartition

        client = Consumer(
            {
                "bootstrap.servers": str(state.address),
                "group.id": "x",
                "isolation.level": "read_uncommitted",
            }
        )
        try:
            return sum(
                client.get_watermark_offsets(TopicPartition(cluster.topic("t"), p), timeout=10)[1]
                for p in range(SPEC.partitions)
            )
        finally:
            client.close()

    def batches():
        yield pa.array([f"k{i}".encode() for i in range(1000)]), pa.array([b"v"] * 1000)
        deadline = time.monotonic() + 30
        while in_the_log() < 1000 and time.monotonic() < deadline:  # sent, not committed
            time.sleep(0.05)
        os.kill(state.pid, signal.SIGKILL)
        yield pa.array([b"late"]), pa.array([b"v"])

    writer = kafka.producer_id(tmp_path / "lake", "t", "0")
    try:
        with pytest.raises(UserError) as caught:
            produce(cluster, SPEC, batches(), transactional_id=writer)
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(
            f"Kafka at {str(state.address)} ($LAKE_KAFKA_BOOTSTRAP): producing to {cluster.topic('t')} "
            "failed, nothing was committed: 1 record(s) not acknowledged within 12 s (is the broker down?)"
        )
        broker.Broker(home).start(port)
        assert in_the_log() >= 1000  # the records are in the log
        assert dump(kc=cluster) == ""  # ... and read_committed readers see none of them
        # the next produce with the writer's id aborts the open transaction at once: readers move on
        # (with a new id they would wait for transaction.timeout.ms, 10 minutes)
        produce(cluster, SPEC, [(pa.array([b"next"]), pa.array([b"v"]))], transactional_id=writer)
        assert dump(kc=cluster, fmt="%k=%s\\n") == "next=v\n"
    finally:
        broker.Broker(home).stop()


def test_producers_get_stable_transactional_ids_one_per_concurrent_writer(lake):
    from spark_jobs.topics.produce_consume import producing

    with producing(lake, "t") as first:
        with producing(lake, "t") as second, producing(lake, "u") as other:
            assert len({first, second, other}) == 3
    with producing(lake, "t") as again:
        assert again == first  # the next writer after one that died takes over its transactions
    assert first.startswith("lake-") and first.endswith("-t-0") and second.endswith("-t-1")


def test_produce_drops_a_bom_and_crlf_line_ends_through_the_cli(lake, tmp_path, capsys):
    """A file saved by a Windows editor: the BOM is not part of the first key, nor CR of any value."""
    from spark_jobs.cli import main

    path = tmp_path / "accounts.txt"
    path.write_bytes(b'\xef\xbb\xbfuser_1;{"customerId": "user_1"}\r\nuser_2;{"customerId": "user_2"}\r\n')
    assert main(["--root", str(lake.root), "produce", "customer_accounts", str(path), "-K", ";"]) == 0
    capsys.readouterr()
    assert main(["--root", str(lake.root), "consume", "customer_accounts", "-f", "%k|%s|%S\\n"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == [
        'user_1|{"customerId": "user_1"}|24',
        'user_2|{"customerId": "user_2"}|24',
    ]


def test_a_timestamp_the_topic_refuses_is_one_line_before_anything_is_sent(kc):
    """Kafka 4 refuses timestamps more than an hour ahead (message.timestamp.after.max.ms): the
    range is named before a record goes out, and the topic stays empty."""
    with pytest.raises(
        UserError, match=r"timestamp 99999999999999999 is outside what topic .* accepts now: "
    ):
        put(kc, b"a;1\n", key_sep=";", timestamp_ms=99_999_999_999_999_999)
    ahead = int(time.time() * 1000) + 7_200_000
    with pytest.raises(UserError, match=r"after\.max\.ms\); nothing was sent"):
        put(kc, b"a;1\n", key_sep=";", timestamp_ms=ahead)
    assert dump(kc) == ""
    assert put(kc, b"a;1\n", key_sep=";", timestamp_ms=1_000).records == 1  # an old one is accepted


def test_a_lake_root_that_cannot_be_written_is_one_line_and_nothing_is_sent(lake, tmp_path, capsys):
    """A root whose path runs through a file (as a read-only or full root does, the first write
    fails): one line naming the path and the fix, exit 1, and nothing on the topic."""
    from spark_jobs.cli import main

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    path = tmp_path / "in.txt"
    path.write_text("user_1;{}\n")
    root = blocker / "lake"
    assert main(["--root", str(root), "produce", "customer_consents", str(path), "-K", ";"]) == 1
    assert capsys.readouterr().err == (
        f"lake: error: cannot write {root}/_locks: a part of the path is a file, not a folder; "
        "give a writable lake root with --root or $LAKE_ROOT\n"
    )
    # nothing reached Kafka: not even the topic was created
    assert main(["--root", str(lake.root), "consume", "customer_consents"]) == 2
    assert "customer_consents does not exist on Kafka" in capsys.readouterr().err
