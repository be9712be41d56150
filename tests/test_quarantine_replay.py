"""One place for dropped records, as a user runs it: a join with a dead-letter topic writes every record
it drops there (once, with the batch), and ``lake quarantine --replay`` puts the ones a fix can mend
back on their topic, once each, and no record whose key moved on."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from spark_jobs.cli import main
from spark_jobs.errors import UserError

PIPELINE = """
pipeline: replay-test
topics:
  orders: {partitions: 2}
  customers: {partitions: 2}
joins:
  enriched:                 # each order (an event) with its customer as of its time
    kind: stream-table
    left: orders
    right: customers
    type: left
    select: {n: "SELECT_N", level: right.level}
    dead_letter_topic: enriched_dropped
  latest:                   # the latest order of each key (takes orders as a table)
    kind: table
    left: orders
    right: customers
    type: left
    select: {n: "try_cast(left.n as int)"}
"""
CAST = (
    '[CAST_INVALID_INPUT] The value \'{}\' of the type "STRING" cannot be cast to "INT" because it is '
    "malformed. Correct the value as per the syntax, or change its target type."
)


def foreign_produce(opts: list[str], topic: str, key: bytes, value: bytes) -> None:
    """A record from a producer that is not the product (kcat, another service), as Kafka takes it."""
    from confluent_kafka import Producer

    from spark_jobs.config import load_config
    from spark_jobs.seams.kafka import connect

    cluster = connect(load_config(opts[3]), opts[1])
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "partitioner": "murmur2_random"})
    producer.produce(cluster.topic(topic), value, key)
    assert producer.flush(30) == 0


@pytest.fixture
def where(tmp_path):
    (tmp_path / "pipeline.yaml").write_text(PIPELINE.replace("SELECT_N", "cast(left.n as int)"))
    return tmp_path, ["--root", str(tmp_path / "lake"), "--config", str(tmp_path / "pipeline.yaml")]


def lake(capsys, opts, *args: str) -> list[str]:
    capsys.readouterr()
    assert main([*args, *opts]) == 0
    return capsys.readouterr().out.splitlines()


def events(capsys, opts) -> list[tuple[str, str, str]]:
    """``lake show enriched``: (key, n, level) of every event joined."""
    header, *rows = lake(capsys, opts, "show", "enriched")
    at = [header.split("\t").index(c) for c in ("key", "n", "level")]
    return sorted(tuple(row.split("\t")[i] for i in at) for row in rows)  # type: ignore[misc]


def test_dead_letters_and_a_replay_after_the_select_is_fixed(spark, where, capsys):
    folder, opts = where
    (folder / "customers.txt").write_text('o1;{"level": "gold"}\n')
    lake(capsys, opts, "produce", "customers", "-K", ";", str(folder / "customers.txt"))
    (folder / "orders.txt").write_text('o1;{"n": "1"}\no2;{"n": "abc"}\no4;{"n": "x"}\n')
    lake(capsys, opts, "produce", "orders", "-K", ";", str(folder / "orders.txt"))
    foreign_produce(opts, "orders", b"o3", b"not json")
    lake(capsys, opts, "run", "enriched", "--once")
    (folder / "orders.txt").write_text('o4;{"n": "4"}\n')  # o4 mended by its producer
    lake(capsys, opts, "produce", "orders", "-K", ";", str(folder / "orders.txt"))
    placed = [line.split() for line in lake(capsys, opts, "consume", "orders", "-f", "%k %p %o\\n")]
    at: dict[str, list[tuple[int, int]]] = {}
    for key, p, o in placed:
        at.setdefault(key, []).append((int(p), int(o)))
    lake(capsys, opts, "run", "enriched", "--once")
    assert events(capsys, opts) == [("o1", "1", "gold"), ("o4", "4", "")]

    # the dead-letter topic holds the three dropped records, their bytes as they came, and why
    letters = lake(capsys, opts, "consume", "enriched_dropped", "-f", "%k|%s|%h\\n")
    (p2,), (p3,), (p4, o4_newer) = at["o2"], at["o3"], at["o4"]
    poison = "select failed on the left record of result key '{}': " + CAST

    def headers(p: tuple[int, int], cause: str, message: str) -> str:
        return (
            f"__streams.errors.topic=orders,__streams.errors.partition={p[0]},__streams.errors.offset={p[1]},"
            f"__streams.errors.exception={cause},__streams.errors.message={message},lake.join=enriched,"
            "lake.batch="
        )

    expected = {
        "o2": ('{"n": "abc"}', headers(p2, "poison", poison.format("o2", "abc"))),
        "o3": ("not json", headers(p3, "undecodable", "value is not a JSON object (key 'o3')")),
        "o4": ('{"n": "x"}', headers(p4, "poison", poison.format("o4", "x"))),
    }
    assert len(letters) == 3
    for letter in letters:
        key, value, head = letter.split("|")
        assert (value, head.rsplit("lake.batch=", 1)[0] + "lake.batch=") == expected[key]
        assert head.rsplit("lake.batch=", 1)[1].endswith(":0")  # the join's first micro-batch

    # the select fixed: the poison pill o2 is replayed (a new event for enriched; for latest, which
    # takes orders as a table, the same value again); o3 still is not JSON; o4 has a newer record
    (folder / "pipeline.yaml").write_text(
        PIPELINE.replace("SELECT_N", "coalesce(try_cast(left.n as int), -1)")
    )
    said = lake(capsys, opts, "quarantine", "--replay", "--dry-run")
    assert said[0].startswith("quarantine of pipeline replay-test (table version ")
    assert said[0].endswith("): 3 record(s)")
    rows = {
        "o2": f"  orders[{p2[0]}] offset {p2[1]} [poison] of join:enriched: ",
        "o3": f"  orders[{p3[0]}] offset {p3[1]} [undecodable] of join:enriched: kept: it still does not "
        "decode (value is not a JSON object): mend topics.orders's format or the schema first",
        "o4": f"  orders[{p4[0]}] offset {p4[1]} [poison] of join:enriched: kept: a newer record of its key "
        f"follows it (offset {o4_newer[1]}): the copy would put the older value back",
    }
    order = sorted(rows, key=lambda k: at[k][0])
    assert said[1:] == [
        *[rows[k] + ("would be replayed" if k == "o2" else "") for k in order],
        "would replay 1 record(s) to orders, kept 2",
    ]

    said = lake(capsys, opts, "quarantine", "--replay")
    copies = [
        line.split()
        for line in lake(capsys, opts, "consume", "orders", "-f", "%k %p %o %h\\n")
        if "lake.replay.of=" in line
    ]
    assert copies == [["o2", str(p2[0]), copies[0][2], f"lake.replay.of=orders:{p2[0]}:{p2[1]}"]]
    copy = int(copies[0][2])
    assert said[1:] == [
        *[rows[k] + (f"replayed as offset {copy}" if k == "o2" else "") for k in order],
        "replayed 1 record(s) to orders, kept 2",
    ]
    lake(capsys, opts, "run", "enriched", "--once")
    assert events(capsys, opts) == [("o1", "1", "gold"), ("o2", "-1", ""), ("o4", "4", "")]

    # a second replay sends nothing again
    said = lake(capsys, opts, "quarantine", "--replay", "--reason", "poison")
    assert said[1:] == [
        *[
            rows["o2"] + f"kept: replayed already (the copy is offset {copy})" if k == "o2" else rows["o4"]
            for k in order
            if k != "o3"
        ],
        "replayed 0 record(s), kept 2",
    ]


def _row(job: str, topic: str | None, partition: int, offset: int, cause: str) -> dict:
    source = f"{topic}[{partition}]" if topic else "dump.csv"
    return {
        "job": job,
        "topic": topic,
        "partition": partition,
        "line": offset,
        "cause": cause,
        "source": source,
    }


def test_what_a_replay_keeps_and_why():
    """Every reason that is not a fault a fix can mend is kept, with the sentence saying why; a record
    that decodes now is replayed; one gone from its topic, or copied before, is not."""
    from spark_jobs.quarantine import KEPT, Found, Place, decide

    rows = [
        _row("join:t", "L", 0, 1, "null_key"),
        _row("join:fk", "P", 0, 2, "null_foreign_key"),
        _row("join:d", "P", 1, 3, "null_derived_key"),
        _row("join:li", "P", 1, 4, "no_list"),
        _row("backfill:accounts", None, 0, 7, "bad_line"),
        _row("join:t", "L", 1, 5, "undecodable"),  # decodes now (its schema registered since)
        _row("join:st", "L", 1, 5, "undecodable"),  # the same record, dropped by a second join
        _row("join:t", "L", 1, 6, "undecodable"),  # gone: compacted away
        _row("join:t", "L", 1, 8, "undecodable"),  # copied by an earlier replay
        _row("join:st", "E", 0, 9, "poison"),  # an event a stream join failed on, another stream join used
    ]
    record = (b"k", b"v", 1000, [])
    found = {
        Place("L", 1, 5): Found(record),
        Place("L", 1, 6): Found(),
        Place("L", 1, 8): Found(record, copy=12),
        Place("E", 0, 9): Found(record),
    }
    streams = {("join:st", "L"), ("join:st", "E"), ("join:ss", "E")}
    readers = {"L": ["join:t", "join:st"], "E": ["join:st", "join:ss"], "P": ["join:fk", "join:d", "join:li"]}
    verdicts = decide(rows, found, lambda job, topic: (job, topic) not in streams, readers.__getitem__)
    said = {(v.place.text() if v.place else "dump"): (v.replay, v.why) for v in verdicts}
    assert said == {
        "dump": (False, KEPT["bad_line"]),
        "L[0] offset 1": (False, KEPT["null_key"]),
        "P[0] offset 2": (False, KEPT["null_foreign_key"]),
        "P[1] offset 3": (False, KEPT["null_derived_key"]),
        "P[1] offset 4": (False, KEPT["no_list"]),
        "L[1] offset 5": (True, ""),
        "L[1] offset 6": (False, "gone from the topic (retention or compaction): there is nothing to replay"),
        "L[1] offset 8": (False, "replayed already (the copy is offset 12)"),
        "E[0] offset 9": (False, "an event join:ss used already: the copy would be a second one there"),
    }
    (both,) = [v for v in verdicts if v.place == Place("L", 1, 5)]
    assert both.jobs == ("join:st", "join:t") and both.record == record


def test_a_join_with_a_dead_letter_topic_writes_each_dropped_record_there(spark, tmp_path):
    from spark_jobs.testing import PipelineTestDriver

    (tmp_path / "pipeline.yaml").write_text(
        PIPELINE.replace("SELECT_N", "cast(left.n as int)").replace("latest:", "latest_unused:")
    )
    with PipelineTestDriver(tmp_path / "pipeline.yaml", root=tmp_path / "lake", spark=spark) as d:
        d.pipe("orders", key="o1", value={"n": "1"}, timestamp=1)
        d.pipe("orders", key="o2", value={"n": "abc"}, timestamp=2)
        d.advance()
        (letter,) = d.dead_letters("enriched")
        p = d.quarantined("enriched")
        assert letter.key == b"o2" and letter.value == b'{"n":"abc"}'
        assert letter.headers["__streams.errors.exception"] == "poison"
        assert letter.headers["__streams.errors.message"] == p[0][2]
        assert (letter.headers["__streams.errors.topic"], letter.headers["__streams.errors.offset"]) == (
            "orders",
            str(p[0][1]),
        )
        d.pipe("orders", key="o3", value={"n": "3"}, timestamp=3)
        d.advance()
        assert d.dead_letters("enriched") == []
        with pytest.raises(UserError, match="join latest_unused has no dead-letter topic"):
            d.dead_letters("latest_unused")


def test_a_replayed_batch_does_not_write_its_dead_letters_twice(tmp_path):
    """The batch that may be a replay (the first after a restart) finds its dead letters at the end of
    the topic when they went out before the crash, and sends none again; a new batch sends its own."""
    import pyarrow as pa

    from spark_jobs.config import load_config
    from spark_jobs.joins.dead_letters import KafkaDeadLetters
    from spark_jobs.seams.delta import Lake
    from spark_jobs.seams.kafka import connect, read
    from spark_jobs.system_tables import QUARANTINE_SCHEMA

    (tmp_path / "pipeline.yaml").write_text(PIPELINE.replace("SELECT_N", "left.n"))
    config, lake = load_config(tmp_path / "pipeline.yaml"), Lake(tmp_path / "lake")
    spec = config.join("enriched")
    row = {name: None for name in QUARANTINE_SCHEMA.names} | {
        "run_time": datetime(2026, 11, 29, tzinfo=UTC),
        "job": "join:enriched",
        "topic": "orders",
        "partition": 1,
        "line": 4,
        "key_hex": b"o9".hex(),
        "raw_hex": b"{".hex(),
        "cause": "undecodable",
        "reason": "value is not a JSON object (key 'o9')",
    }
    rows = pa.Table.from_pylist([row], QUARANTINE_SCHEMA)
    assert KafkaDeadLetters(config, lake.root, spec).send(rows, b"q:0", may_be_sent=True) == 1
    # a restarted job (a new writer) replays batch 0, then runs batch 1
    again = KafkaDeadLetters(config, lake.root, spec)
    assert again.send(rows, b"q:0", may_be_sent=True) == 0
    assert again.send(rows, b"q:1", may_be_sent=False) == 1
    cluster = connect(config, lake.root)
    sent = [m for batch in read(cluster, config.topic("enriched_dropped")) for m in batch]
    assert [(m.key(), m.value(), dict(m.headers())["lake.batch"]) for m in sent] == [
        (b"o9", b"{", b"q:0"),
        (b"o9", b"{", b"q:1"),
    ]
    assert dict(sent[0].headers())["__streams.errors.offset"] == b"4"
    assert sent[0].timestamp()[1] == int(datetime(2026, 11, 29, tzinfo=UTC).timestamp() * 1000)
