"""`lake explain` as a user runs it: the CLI on a fresh lake root, after the commands that made the
result (`lake demo --topics-only`, `lake produce`, `lake run`, `lake topic repartition`), with exact
expected answers. The commands run through the CLI's entry point in the test's process, on its Spark
session (test_cli.py runs `lake explain` on the demo's lake too)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from spark_jobs.cli import main

T0 = 1767225600000  # 2026-01-01T00:00:00Z
WHEN = "2026-01-01T00:00:00.000+00:00"


@pytest.fixture
def lake(spark, capsys, monkeypatch):
    """``lake --root ROOT ARGS...`` (stdin: ``stdin``) -> (exit code, stdout, stderr)."""

    def run(root: Path, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
        code = main(["--root", str(root), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def explained(lake, root: Path, *args: str) -> dict:
    code, out, err = lake(root, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def sources(answer: dict) -> list[tuple]:
    return [(s["role"], s["topic"], s["partition"], s["offset"], s["value"]) for s in answer["sources"][0]]


@pytest.mark.slow
@pytest.mark.integration
def test_a_null_email_is_explained_before_the_backfill_after_a_kcat_backfill_and_after_the_repair(
    lake, tmp_path
):
    root = tmp_path / "lake"
    assert lake(root, "demo", "--topics-only")[0] == 0
    assert lake(root, "run", "consents_with_mail", "--once")[0] == 0

    # before the backfill: the e-mail is null, as the accounts topic has no record of user_10
    code, out, err = lake(root, "explain", "consents_with_mail", "user_10")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1] == (
        "the join has read customer_consents up to offsets [2, 4, 6, 2], customer_accounts up to offsets "
        "[2, 3, 5, 2]"
    )
    assert lines[2] == (
        'row: timestamp="2026-01-01T00:00:00+00:00", customerId="user_10", retargeter1=true, '
        "retargeter2=false, contactMailAddress=null"
    )
    assert lines[3] == (
        f"  left: customer_consents partition 1 offset 2, {WHEN}, key user_10: "
        '{"consents": {"retargeter1": true, "retargeter2": false}, "customerId": "user_10", '
        '"hashedCustomerId": "a8f5206313287ac5"}'
    )
    assert lines[4] == (
        "  right: no record with key user_10 in customer_accounts up to its end offsets [2, 3, 5, 2] "
        "(murmur2 puts it in partition 1); fix: lake backfill accounts"
    )
    assert lines[5:7] == [
        "history (newest first, 1 of 1):",
        lines[6].split(" insert: ")[0]
        + ' insert: timestamp="2026-01-01T00:00:00+00:00", customerId="user_10", retargeter1=true, '
        "retargeter2=false, contactMailAddress=null; from left partition 1 offset 2, right none",
    ]
    assert lines[7] == "gate: no quality run has named user_10"

    # a kcat-style backfill: the record lands where librdkafka's consistent_random puts the key
    line = '{"customerId": "user_10", "contactMailAddress": "user10@example.com"}'
    code, _, err = lake(
        root, "produce", "customer_accounts", "-K", ";", "--partitioner", "consistent_random",
        "--timestamp", str(T0 + 1000), stdin=f"user_10;{line}\n",
    )  # fmt: skip
    assert code == 0, err
    assert lake(root, "run", "consents_with_mail", "--once")[0] == 0
    answer = explained(lake, root, "explain", "consents_with_mail", "user_10")
    assert answer["rows"][0]["contactMailAddress"] == "user10@example.com"
    right = answer["sources"][0][1]
    assert (right["role"], right["topic"], right["partition"], right["offset"]) == (
        "right",
        "customer_accounts",
        0,
        2,
    )
    assert right["placement"] == (
        "MISPLACED: in partition 0, but murmur2 (the topic's partitioner) puts this key in partition 1 "
        "(written with consistent_random): the product's joins find it, a Kafka Streams or ksqlDB join of the "
        "topic misses it; fix: lake topic repartition customer_accounts"
    )
    assert [(h["change"], h["sources"]) for h in answer["history"]] == [
        ("update", {"left_partition": 1, "left_offset": 2, "right_partition": 0, "right_offset": 2}),
        ("insert", {"left_partition": 1, "left_offset": 2, "right_partition": None, "right_offset": None}),
    ]
    assert answer["reasons"] == []

    # the repair: the topic rewritten with its partitioner, the join rebuilt from it
    assert lake(root, "topic", "repartition", "customer_accounts")[0] == 0
    assert lake(root, "run", "consents_with_mail", "--once", "--reset")[0] == 0
    answer = explained(lake, root, "explain", "consents_with_mail", "user_10")
    assert sources(answer) == [
        (
            "left",
            "customer_consents",
            1,
            2,
            {
                "consents": {"retargeter1": True, "retargeter2": False},
                "customerId": "user_10",
                "hashedCustomerId": "a8f5206313287ac5",
            },
        ),
        (
            "right",
            "customer_accounts",
            1,
            2,
            {"contactMailAddress": "user10@example.com", "customerId": "user_10"},
        ),
    ]
    assert [s["placement"] for s in answer["sources"][0]] == [None, None]
    assert answer["rows"][0]["timestamp"] == "2026-01-01T00:00:01+00:00"


PIPELINE = """
pipeline: shop
topics:
  products: {partitions: 2, value: json}
  merchants: {partitions: 2, value: json}
  persons: {partitions: 2, value: json}
  addresses: {partitions: 2, value: json}
joins:
  display:
    kind: fk
    left: products
    right: merchants
    foreign_key: merchant_id
    type: left
    select: {title: left.title, merchant: right.name}
  display_sql:  # the same foreign key as Spark SQL over left: explain computes it as the join does
    kind: fk
    left: products
    right: merchants
    foreign_key: "concat('m', substring(left.merchant_id, 2))"
    type: left
    select: {title: left.title, merchant: right.name}
  homes:
    kind: list
    left: persons
    right: addresses
    list: address_ids
    type: left
    select: {name: left.name}
    elements: {city: right.city}
"""


@pytest.mark.slow
@pytest.mark.integration
def test_a_deleted_merchant_and_an_address_that_never_arrived_are_explained(lake, tmp_path):
    root = tmp_path / "lake"
    cfg = tmp_path / "shop.yaml"
    cfg.write_text(PIPELINE)
    opts = ("--config", str(cfg))

    def produce(topic: str, *lines: str) -> None:
        code, _, err = lake(root, *opts, "produce", topic, "-K", ";", "-Z", "--timestamp", str(T0),
                            stdin="".join(f"{line}\n" for line in lines))  # fmt: skip
        assert code == 0, err

    produce("merchants", 'm1;{"name": "Acme"}')
    produce("merchants", "m1;")  # deleted
    produce("products", 'p1;{"title": "Hammer", "merchant_id": "m1"}')
    produce("addresses", 'a1;{"city": "Oslo"}')
    produce("persons", 'ann;{"name": "Ann", "address_ids": ["a1", "a9"]}')
    for join in ("display", "display_sql", "homes"):
        assert lake(root, *opts, "run", join, "--once")[0] == 0

    for join in ("display", "display_sql"):
        answer = explained(lake, root, *opts, "explain", join, "p1")
        assert answer["rows"] == [
            {"timestamp": "2026-01-01T00:00:00+00:00", "title": "Hammer", "merchant": None}
        ]
        assert [r["text"] for r in answer["reasons"]] == [
            "the key m1 was deleted: a tombstone at merchants partition 0 offset 2 (2026-01-01T00:00:00.000+00:00)"
        ]

    code, out, err = lake(root, *opts, "explain", "display", "p9")  # in neither the result nor a topic
    assert (code, out) == (2, "")
    assert err.strip().endswith(
        "join display: no row for key p9 and no record with this key on either side: products up to its end "
        "offsets [2, 0] (murmur2 puts it in partition 0)"
    )

    answer = explained(lake, root, *opts, "explain", "homes", "ann")
    assert sources(answer) == [
        ("left", "persons", 0, 0, {"name": "Ann", "address_ids": ["a1", "a9"]}),
        ("element a1", "addresses", 1, 0, {"city": "Oslo"}),
    ]
    assert [(r["side"], r["text"]) for r in answer["reasons"]] == [
        (
            "element a9",
            "no record with key a9 in addresses up to its end offsets [0, 2] (murmur2 puts it in partition 0)",
        )
    ]


def test_explain_refuses_an_unknown_join_and_a_join_that_never_ran_in_one_line(lake, tmp_path):
    root = tmp_path / "lake"
    cfg = tmp_path / "shop.yaml"
    cfg.write_text(PIPELINE)
    code, out, err = lake(root, "--config", str(cfg), "explain", "nope", "k")
    assert (code, out) == (2, "")
    assert err.strip().endswith(
        f"unknown join 'nope': not declared in {cfg} (declared: display, display_sql, homes)"
    )
    code, out, err = lake(root, "--config", str(cfg), "explain", "display", "p1")
    assert (code, out) == (2, "")
    assert err.strip().endswith("join display has never run (no result table): run 'lake run display --once'")
    code, _, err = lake(root, "--config", str(cfg), "explain", "display", "zz", "--key-hex")
    assert code == 2 and "--key-hex: 'zz' is not hex" in err


def _compact_soon(topic: str) -> None:
    """Make the broker compact ``topic`` within seconds (a closed segment every 100 ms, any dirt
    cleanable), as a lookup topic is compacted in the long run."""
    import os

    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": os.environ["LAKE_KAFKA_BOOTSTRAP"]})
    settings = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": "100",
    }
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in settings.items()]
    for future in admin.incremental_alter_configs(
        [ConfigResource("topic", topic, incremental_configs=entries)]
    ).values():
        future.result(30)
    # the log cleaner looks for work every 15 s by default: every second here
    (broker_id,) = admin.list_topics(timeout=30).brokers
    broker = ConfigResource("broker", str(broker_id), incremental_configs=[
        ConfigEntry("log.cleaner.backoff.ms", "1000", incremental_operation=AlterConfigOpType.SET)
    ])  # fmt: skip
    for future in admin.incremental_alter_configs([broker]).values():
        future.result(30)


@pytest.mark.slow
@pytest.mark.integration
def test_a_record_compacted_away_under_its_identical_successor_is_explained_by_the_successor(lake, tmp_path):
    """The product's merchant was written, then written again with the same value: the row names the
    first record (the one that began the value). Once compaction removes it, explain says so and
    shows the key's newest record, which the join has read, instead of only 'no longer on Kafka'."""
    import os
    import time

    from spark_jobs.config import load_config
    from spark_jobs.seams.kafka import connect, fetch

    root = tmp_path / "lake"
    cfg = tmp_path / "shop.yaml"
    cfg.write_text(PIPELINE)
    opts = ("--config", str(cfg))

    def produce(topic: str, line: str, ms: int) -> None:
        code, _, err = lake(
            root, *opts, "produce", topic, "-K", ";", "--timestamp", str(ms), stdin=line + "\n"
        )
        assert code == 0, err

    produce("merchants", 'm1;{"name": "Acme"}', T0)
    produce("products", 'p1;{"title": "Hammer", "merchant_id": "m1"}', T0)
    assert lake(root, *opts, "run", "display", "--once")[0] == 0
    before = explained(lake, root, *opts, "explain", "display", "p1")
    (first,) = [s for s in before["sources"][0] if s["role"] == "right"]
    _compact_soon(f"{os.environ['LAKE_KAFKA_TOPIC_PREFIX']}merchants")
    produce("merchants", 'm1;{"name": "Acme"}', T0 + 1000)  # the same value again
    time.sleep(0.5)  # the next record rolls the segment: the first two become cleanable
    produce("merchants", 'm1;{"name": "Acme"}', T0 + 2000)
    assert lake(root, *opts, "run", "display", "--once")[0] == 0  # reads both: no change to the row
    config = load_config(cfg)
    cluster = connect(config, root)
    place = ("merchants", first["partition"], first["offset"])
    deadline = time.monotonic() + 120
    while fetch(cluster, [place]):  # until the broker's log cleaner has removed the first record
        assert time.monotonic() < deadline, "the topic was not compacted within 120 s"
        time.sleep(1)

    answer = explained(lake, root, *opts, "explain", "display", "p1")
    (right,) = [s for s in answer["sources"][0] if s["role"] == "right"]
    assert (right["partition"], right["offset"], right["gone"]) == (first["partition"], first["offset"], True)
    later = right["successor"]
    assert (later["key"], later["value"], later["timestamp"]) == (
        "m1",
        {"name": "Acme"},
        "2026-01-01T00:00:02.000+00:00",
    )
    assert later["offset"] > first["offset"] and answer["rows"][0]["merchant"] == "Acme"
    code, out, _ = lake(root, *opts, "explain", "display", "p1")
    assert (
        f"  right: merchants partition {first['partition']} offset {first['offset']} (no longer on Kafka: "
        f"compacted or past retention)\n      its key's newest record: offset {later['offset']}, "
        '2026-01-01T00:00:02.000+00:00, key m1: {"name": "Acme"}, which the join has read: the same value '
        "written again (the row names the record that began the value), and compaction kept only this newest one"
    ) in out, out


@pytest.mark.slow
@pytest.mark.integration
def test_a_stream_joins_events_are_explained_newest_first_by_offset_as_a_number(lake, tmp_path):
    """Twelve events of one key at one time: explain shows the newest first by offset as a number (11,
    10, 9; as text 9 would come before 10 and --limit would drop the newest), in the rows and in the
    history of the commit that wrote them all."""
    root = tmp_path / "lake"
    cfg = tmp_path / "shop.yaml"
    cfg.write_text(
        PIPELINE
        + "  clicks_m:\n    kind: stream-table\n    left: clicks\n    right: merchants\n    type: left\n"
        + "    select: {page: left.page, merchant: right.name}\n"
    )
    cfg.write_text(
        cfg.read_text().replace("topics:\n", "topics:\n  clicks: {partitions: 2, value: json}\n", 1)
    )
    opts = ("--config", str(cfg))
    lines = "".join(f'm1;{{"page": "/p{n}"}}\n' for n in range(12))
    code, _, err = lake(root, *opts, "produce", "clicks", "-K", ";", "--timestamp", str(T0), stdin=lines)
    assert code == 0, err
    assert lake(root, *opts, "run", "clicks_m", "--once")[0] == 0
    answer = explained(lake, root, *opts, "explain", "clicks_m", "m1", "--limit", "3")
    assert [(s[0]["offset"], r["page"]) for r, s in zip(answer["rows"], answer["sources"], strict=True)] == [
        (11, "/p11"),
        (10, "/p10"),
        (9, "/p9"),
    ]
    assert answer["history_total"] == 12
    assert [(h["sources"]["offset"], h["row"]["page"]) for h in answer["history"]] == [
        (11, "/p11"),
        (10, "/p10"),
        (9, "/p9"),
    ]


STREAMS = """
pipeline: streams
topics:
  views: {partitions: 2, value: json}
  clicks: {partitions: 2, value: json}
  profiles: {partitions: 2, value: json}
joins:
  view_clicks:
    kind: stream-stream
    left: views
    right: clicks
    type: left
    window: 10 seconds
    select: {page: left.page, what: right.what}
  by_name:
    kind: derive
    left: profiles
    key: name
    select: {id: "cast(master_key as string)"}
"""


@pytest.mark.slow
@pytest.mark.integration
def test_stream_stream_and_derive_rows_are_explained_and_a_deleted_topic_is_one_line(lake, tmp_path):
    import os

    from confluent_kafka.admin import AdminClient

    from spark_jobs.seams.partitioners import partition_for

    root = tmp_path / "lake"
    cfg = tmp_path / "streams.yaml"
    cfg.write_text(STREAMS)
    opts = ("--config", str(cfg))

    def produce(topic: str, line: str, ms: int) -> None:
        code, _, err = lake(
            root, *opts, "produce", topic, "-K", ";", "--timestamp", str(ms), stdin=line + "\n"
        )
        assert code == 0, err

    produce("views", 'u1;{"page": "/home"}', T0)
    produce("clicks", 'u1;{"what": "buy"}', T0 + 2000)
    produce("views", 'u2;{"page": "/faq"}', T0)
    produce("views", 'u3;{"page": "/later"}', T0 + 60_000)  # past the window: u2's view is emitted unmatched
    produce("profiles", 'p7;{"name": "Ann"}', T0)
    for join in ("view_clicks", "by_name"):
        assert lake(root, *opts, "run", join, "--once")[0] == 0

    answer = explained(lake, root, *opts, "explain", "view_clicks", "u1")
    assert answer["rows"] == [
        {"left_timestamp": "2026-01-01T00:00:00+00:00", "right_timestamp": "2026-01-01T00:00:02+00:00",
         "page": "/home", "what": "buy"}
    ]  # fmt: skip
    u1, u2 = partition_for(b"u1", 2), partition_for(b"u2", 2)
    assert sources(answer) == [
        ("left", "views", u1, 0, {"page": "/home"}),
        ("right", "clicks", u1, 0, {"what": "buy"}),
    ]
    answer = explained(lake, root, *opts, "explain", "view_clicks", "u2")  # a view without a click
    assert sources(answer) == [("left", "views", u2, 2 if u2 == u1 else 0, {"page": "/faq"})]
    ends = [2 if p == u1 else 0 for p in range(2)]
    reason = (
        f"no record with key u2 in clicks up to its end offsets {ends} (murmur2 puts it in partition {u2})"
    )
    assert [(r["side"], r["text"]) for r in answer["reasons"]] == [("right", reason)]
    answer = explained(lake, root, *opts, "explain", "by_name", "Ann")  # the derived row and its master
    assert answer["rows"] == [{"timestamp": "2026-01-01T00:00:00+00:00", "master_key": "p7", "id": "p7"}]
    assert [(s["role"], s["topic"], s["key"], s["value"]) for s in answer["sources"][0]] == [
        ("left", "profiles", "p7", {"name": "Ann"})
    ]

    admin = AdminClient({"bootstrap.servers": os.environ["LAKE_KAFKA_BOOTSTRAP"]})
    clicks = f"{os.environ['LAKE_KAFKA_TOPIC_PREFIX']}clicks"
    admin.delete_topics([clicks])[clicks].result(30)
    code, out, err = lake(root, *opts, "explain", "view_clicks", "u1")
    assert (code, out) == (2, "")
    assert err.strip().splitlines()[-1] == (
        f"lake: error: join view_clicks: topic {clicks} is not on Kafka at {os.environ['LAKE_KAFKA_BOOTSTRAP']} "
        "(deleted since the join read it?): its records cannot be shown"
    )
