"""Backfills: only changes are written, idempotent, dry runs write nothing, bad lines are quarantined."""

from __future__ import annotations

import io
import json
import zlib

import pytest

from spark_jobs.config import load_config
from spark_jobs.demo.data import write_demo_topics
from spark_jobs.errors import UserError
from spark_jobs.formats import Formats
from spark_jobs.lookups.backfill import run_backfill
from spark_jobs.seams.kafka import connect, watermarks
from spark_jobs.seams.partitioners import partition_for
from spark_jobs.system_tables import QUARANTINE
from spark_jobs.topics.ingest import catch_up, mirrored_up_to
from spark_jobs.topics.lookup_tables import lookup_position, lookup_table, refresh_lookup
from spark_jobs.topics.produce_consume import consume, produce_lines


def quiet(_msg):
    return None


def account(n, mail=None):
    return json.dumps(
        {"customerId": f"user_{n}", "contactMailAddress": mail or f"user{n}@example.com"},
        separators=(",", ":"),
    )


def lookup_rows(lake, config):
    table = lake.read_arrow(lookup_table(config.lookup("accounts")))
    return {r["key"].decode(): r["value"].decode() for r in table.to_pylist()}


def topic_records(lake, config, topic="customer_accounts"):
    out = io.BytesIO()
    consume(connect(config, lake.root), config.topic(topic), out, fmt="%k|%p|%o|%s\\n")
    return out.getvalue().decode().splitlines()


def kafka_ends(lake, config, topic="customer_accounts"):
    return watermarks(connect(config, lake.root), config.topic(topic))


@pytest.fixture
def demo(lake, demo_config, cluster):
    write_demo_topics(cluster, Formats(demo_config, lake.root, cluster.topic))
    return lake, demo_config


def versions(lake):
    return {t: lake.version(t) for t in lake.tables()}


def test_backfill_adds_missing_accounts_then_is_idempotent(spark, demo):
    lake, config = demo
    first = run_backfill(spark, lake, config, "accounts", log=quiet)
    assert (first.lines, first.new, first.changed, first.unchanged, first.rejected, first.written) == (
        10,
        2,
        0,
        8,
        0,
        2,
    )
    assert first.partitioner == "murmur2"
    assert lookup_rows(lake, config) == {f"user_{n}": account(n) for n in range(1, 11)}
    added = [r for r in topic_records(lake, config) if r.startswith(("user_9|", "user_10|"))]
    assert sorted(added) == sorted(
        f"user_{n}|{partition_for(f'user_{n}'.encode(), 4)}|{off}|{account(n)}"
        # after user_2,3,4,7 in p2 and user_5,6 in p1, each followed by the demo's commit marker
        for n, off in ((9, 5), (10, 3))
    )
    ends = kafka_ends(lake, config)
    before = versions(lake), ends
    again = run_backfill(spark, lake, config, "accounts", log=quiet)
    assert (again.new, again.changed, again.unchanged, again.written) == (0, 0, 10, 0)
    assert (versions(lake), kafka_ends(lake, config)) == before
    # it says what it compared the dump with: the topic on Kafka as the comparison started
    shown = ", ".join(str(high) for _, high in ends)
    assert again.compared_with.startswith(f"customer_accounts up to offsets [{shown}] (taken ")
    # and that the lookup table is complete up to the topic's end, also when it wrote nothing
    assert again.lookup_up_to == [high for _, high in ends]
    assert again.text().endswith(f"{again.compared_with}; lookup table up to offsets [{shown}]")


def test_changed_values_and_duplicate_lines_last_wins(spark, demo, tmp_path):
    lake, config = demo
    dump = tmp_path / "d.txt"
    dump.write_text(
        'user_1;"new1@example.com"\nuser_11;"first@example.com"\nuser_2;"user2@example.com"\nuser_11;"last@example.com"\n'
    )
    s = run_backfill(spark, lake, config, "accounts", source=str(dump), log=quiet)
    assert (s.lines, s.new, s.changed, s.unchanged, s.duplicates, s.written) == (4, 1, 1, 1, 1, 2)
    rows = lookup_rows(lake, config)
    assert rows["user_1"] == account(1, "new1@example.com")
    assert rows["user_11"] == account(11, "last@example.com")
    assert len(rows) == 9


def test_missing_only_writes_new_keys_and_counts_changed_ones(spark, demo, tmp_path):
    """What the scheduled pipeline run does: the topic may hold a newer value than the dump."""
    lake, config = demo
    dump = tmp_path / "d.txt"
    dump.write_text('user_1;"old1@example.com"\nuser_11;"user11@example.com"\n')
    s = run_backfill(spark, lake, config, "accounts", source=str(dump), missing_only=True, log=quiet)
    assert (s.lines, s.new, s.changed, s.unchanged, s.written) == (2, 1, 1, 0, 1)
    assert (
        "1 new keys, 1 changed (not written: the topic may be newer than the dump), 0 unchanged" in s.text()
    )
    rows = lookup_rows(lake, config)
    assert (rows["user_1"], rows["user_11"]) == (account(1), account(11))


def test_dry_run_reports_the_same_counts_and_writes_nothing(spark, demo):
    lake, config = demo
    before = versions(lake), kafka_ends(lake, config)
    s = run_backfill(spark, lake, config, "accounts", dry_run=True, log=quiet)
    assert (s.new, s.changed, s.unchanged, s.written, s.lookup_up_to) == (2, 0, 8, 2, None)
    assert "dry run: nothing written" in s.text()
    assert (versions(lake), kafka_ends(lake, config)) == before
    assert not lake.exists(lookup_table(config.lookup("accounts")))


BAD_DUMP = (
    b'user_1;"user1@example.com"\n'
    b"no separator here\n"
    b';"empty@example.com"\n'
    b"user_12;{not json\n"
    b'\xffuser;"x@example.com"\n'
    b'user_13;"user13@example.com"\n'
)


def test_rejects_above_max_commit_nothing_at_all(spark, demo, tmp_path):
    lake, config = demo
    dump = tmp_path / "bad.txt"
    dump.write_bytes(BAD_DUMP)
    before = kafka_ends(lake, config)
    with pytest.raises(
        UserError,
        match=r"4 rejected line\(s\), more than --max-rejects 3; nothing was written \(first: line 2: no separator ';'\)",
    ):
        run_backfill(spark, lake, config, "accounts", source=str(dump), max_rejects=3, log=quiet)
    assert kafka_ends(lake, config) == before  # the topic untouched
    assert not lake.exists(QUARANTINE)
    assert not lake.exists(lookup_table(config.lookup("accounts")))  # nothing of the lake either


def test_rejects_within_max_are_quarantined_with_line_and_bytes(spark, demo, tmp_path):
    lake, config = demo
    dump = tmp_path / "bad.txt"
    dump.write_bytes(BAD_DUMP)
    s = run_backfill(spark, lake, config, "accounts", source=str(dump), max_rejects=4, log=quiet)
    assert (s.lines, s.rejected, s.new, s.unchanged, s.written) == (6, 4, 1, 1, 1)
    q = sorted(lake.read_arrow(QUARANTINE).to_pylist(), key=lambda r: r["line"])
    assert [(r["line"], r["reason"], r["raw_hex"], r["job"]) for r in q] == [
        (2, "no separator ';'", b"no separator here".hex().upper(), "backfill:accounts"),
        (3, "empty key", b';"empty@example.com"'.hex().upper(), "backfill:accounts"),
        (4, "value is not valid JSON", b"user_12;{not json".hex().upper(), "backfill:accounts"),
        (5, "not valid UTF-8", b'\xffuser;"x@example.com"'.hex().upper(), "backfill:accounts"),
    ]
    assert all(r["source"] == str(dump) for r in q) and len({r["run_id"] for r in q}) == 1
    assert lookup_rows(lake, config)["user_13"] == account(13)


def test_partitioner_follows_joined_topics_unless_overridden(spark, demo):
    lake, config = demo
    s = run_backfill(spark, lake, config, "accounts", partitioner="consistent_random", log=quiet)
    assert s.partitioner == "consistent_random"
    placed = {r.split("|")[0]: int(r.split("|")[1]) for r in topic_records(lake, config)}
    assert placed["user_10"] == zlib.crc32(b"user_10") % 4 == 0
    assert placed["user_9"] == zlib.crc32(b"user_9") % 4


def test_csv_and_jsonl_dumps(spark, lake, tmp_path):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(
        "topics:\n  people: {partitions: 3}\n"
        "lookups:\n"
        "  by_csv: {topic: people, backfill: {format: csv, separator: ',', key_field: id, value_field: name,"
        " value: {id: key, name: value}}}\n"
        "  by_jsonl: {topic: people, backfill: {format: jsonl, key_field: id, value_field: profile, value_format: json}}\n"
    )
    config = load_config(cfg)
    csv = tmp_path / "people.csv"
    csv.write_text("id,name\np1,Ann\np2,Bob\np3\n")
    s = run_backfill(spark, lake, config, "by_csv", source=str(csv), max_rejects=1, log=quiet)
    assert (s.lines, s.new, s.rejected) == (3, 2, 1)  # the header is line 1; "p3" has no name
    jl = tmp_path / "people.jsonl"
    jl.write_text(
        '{"id": "p1", "profile": {"name": "Ann"}}\n{"id": "p4", "profile": {"name": "Dee"}}\nnot json\n'
    )
    s2 = run_backfill(spark, lake, config, "by_jsonl", source=str(jl), max_rejects=1, log=quiet)
    assert (s2.lines, s2.new, s2.changed, s2.rejected) == (3, 1, 1, 1)
    q = lake.read_arrow(QUARANTINE).to_pylist()
    assert sorted((r["job"], r["line"], r["reason"]) for r in q) == [
        ("backfill:by_csv", 4, "no 'name' column value"),
        ("backfill:by_jsonl", 3, "line is not a JSON object"),
    ]


def test_the_ingest_refreshes_the_lookup_table_with_tombstones_and_updates(spark, demo):
    lake, config = demo
    catch_up(spark, lake, config, ["customer_accounts"])
    assert len(lookup_rows(lake, config)) == 8
    spec = config.topic("customer_accounts")
    produce_lines(
        connect(config, lake.root),
        spec,
        io.BytesIO(f"user_1;\nuser_2;{account(2, 'b@x.org')}\n".encode()),
        "-",
        key_sep=";",
        null_empty=True,
    )
    catch_up(spark, lake, config, ["customer_accounts"])  # mirrors the two, refreshes the lookup
    rows = lookup_rows(lake, config)
    assert "user_1" not in rows and rows["user_2"] == account(2, "b@x.org") and len(rows) == 7
    lookup = config.lookup("accounts")
    assert refresh_lookup(spark, lake, lookup, mirrored_up_to(lake, spec)) == 0  # nothing new
    position = lookup_position(lake, lookup)
    assert position is not None and position[0] == [high for _, high in kafka_ends(lake, config)]


def test_a_bom_and_crlf_line_ends_never_end_up_in_keys_or_values(spark, demo, tmp_path):
    lake, config = demo
    dump = tmp_path / "windows.dump"
    dump.write_bytes(b'\xef\xbb\xbfuser_9;"user9@example.com"\r\nuser_10;"user10@example.com"\r\n')
    s = run_backfill(spark, lake, config, "accounts", source=str(dump), log=quiet)
    assert (s.lines, s.new, s.rejected) == (2, 2, 0)
    rows = lookup_rows(lake, config)
    assert rows["user_9"] == account(9) and rows["user_10"] == account(10)
    assert sorted(rows) == sorted(f"user_{n}" for n in range(1, 11))


def test_json_values_compare_by_content_not_by_key_order_or_spacing(spark, lake, tmp_path):
    """The merchants topic holds m1 as a producer wrote it ({"name", "city"}, compact); the dump
    spells it with spaces and the keys in another order: unchanged. m2 is new, m4's city changed."""
    from spark_jobs.config import bundled_config_path
    from spark_jobs.demo.data import encoded
    from spark_jobs.seams.kafka import ensure_topics, produce

    config = load_config(bundled_config_path("marketplace.yaml"))
    cluster = connect(config, lake.root)
    ensure_topics(cluster, config.topics.values())
    held = [("m1", {"name": "Acme Tools", "city": "Oslo"}), ("m4", {"name": "Dune", "city": "Bodø"})]
    produce(
        cluster,
        config.topic("merchants"),
        [encoded(Formats(config, lake.root, cluster.topic), "merchants", held)],
        "murmur2",
    )
    dump = tmp_path / "merchants.dump"
    dump.write_text(
        'm1;{ "city" : "Oslo", "name": "Acme Tools" }\n'
        'm2;{"name": "Bolt Supplies", "city": "Bergen"}\n'
        'm4;{"name": "Dune", "city": "Tromsø"}\n'
    )
    s = run_backfill(spark, lake, config, "merchants", source=str(dump), log=quiet)
    assert (s.lines, s.new, s.changed, s.unchanged, s.written) == (3, 1, 1, 1, 2)
    written: dict[str, list[str]] = {}
    for record in topic_records(lake, config, "merchants"):
        key, _, _, value = record.split("|", 3)
        written.setdefault(key, []).append(value)
    assert written == {
        "m1": ['{"name":"Acme Tools","city":"Oslo"}'],  # not written again
        "m2": ['{"city":"Bergen","name":"Bolt Supplies"}'],
        "m4": [
            '{"name":"Dune","city":"Bod\\u00f8"}',
            '{"city":"Tromsø","name":"Dune"}',
        ],  # json.dumps escapes
    }


def test_dump_keys_with_invisible_bytes_are_quarantined_and_name_the_key_they_resemble(spark, lake, tmp_path):
    """A dump key that differs from a topic key only in invisible bytes is never matched silently (nor
    written as a key of its own): its line is rejected with the rule it breaks and the key it
    resembles, when the topic has one."""
    from spark_jobs.config import bundled_config_path
    from spark_jobs.demo.data import encoded
    from spark_jobs.seams.kafka import ensure_topics, produce

    config = load_config(bundled_config_path("marketplace.yaml"))
    cluster = connect(config, lake.root)
    ensure_topics(cluster, config.topics.values())
    produce(
        cluster,
        config.topic("merchants"),
        [
            encoded(
                Formats(config, lake.root, cluster.topic),
                "merchants",
                [("m1", {"name": "Acme", "city": "Oslo"})],
            )
        ],
        "murmur2",
    )
    dump = tmp_path / "merchants.dump"
    value = b'{"name": "X", "city": "Y"}'
    dump.write_bytes(
        b'"m1";' + value + b"\n"  # JSON-quoted
        + b"m1 ;" + value + b"\n"  # a trailing space
        + b"\xef\xbb\xbfm3;" + value + b"\n"  # a byte order mark inside the file, no such key
        + b"m2\x00;" + value + b"\n"  # a control byte
        + b"m2;" + value + b"\n"
    )  # fmt: skip
    before = kafka_ends(lake, config, "merchants")
    with pytest.raises(
        UserError, match=r"4 rejected line\(s\), more than --max-rejects 3; nothing was written"
    ):
        run_backfill(spark, lake, config, "merchants", source=str(dump), max_rejects=3, log=quiet)
    assert kafka_ends(lake, config, "merchants") == before

    s = run_backfill(spark, lake, config, "merchants", source=str(dump), max_rejects=4, log=quiet)
    assert (s.lines, s.rejected, s.new, s.written) == (5, 4, 1, 1)
    quarantined = sorted(lake.read_arrow(QUARANTINE).to_pylist(), key=lambda r: r["line"])
    assert [(r["line"], r["reason"]) for r in quarantined] == [
        (1, "key is wrapped in double quotes (JSON-encoded string); the topic has the key 'm1'"),
        (2, "key has leading or trailing whitespace; the topic has the key 'm1'"),
        (3, "key starts with a byte order mark (EF BB BF)"),
        (4, "key contains control characters"),
    ]
    assert [r.split("|")[0] for r in topic_records(lake, config, "merchants")] == ["m1", "m2"]


def test_two_backfills_of_one_dump_at_once_write_it_once(spark, demo, tmp_path):
    """Started together (two people, or a manual run beside a scheduled one), backfills of one lookup
    take turns: the second compares the dump with the topic as the first left it and writes nothing."""
    import threading

    lake, config = demo
    before = topic_records(lake, config)
    dump = tmp_path / "accounts.dump"
    dump.write_text("".join(f'user_{n};"user{n}@example.com"\n' for n in range(101, 601)))
    results: list = [None, None]

    def run(i: int) -> None:
        try:
            results[i] = run_backfill(spark, lake, config, "accounts", source=str(dump), log=quiet)
        except Exception as exc:  # noqa: BLE001 - shown by the assertion below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert sorted((r.new, r.unchanged, r.written) for r in results) == [(0, 500, 0), (500, 0, 500)], results
    records = topic_records(lake, config)
    assert len(records) == len(before) + 500  # each key once
    assert sorted(r.split("|")[0] for r in records if r not in before) == sorted(
        f"user_{n}" for n in range(101, 601)
    )
    rows = lookup_rows(lake, config)
    assert {k: v for k, v in rows.items() if int(k[5:]) > 100} == {
        f"user_{n}": account(n) for n in range(101, 601)
    }
