"""``lake diagnose``: two topics compared on Kafka, read-only, with exact findings."""

from __future__ import annotations

import json
import zlib

import pyarrow as pa
import pytest

from spark_jobs.cli import main
from spark_jobs.config import TopicSpec
from spark_jobs.seams.kafka import produce, watermarks
from spark_jobs.seams.partitioners import partition_for

USERS = [f"user_{i}".encode() for i in range(1, 21)]


def put(cluster, name: str, partitions: int, keys: list[bytes | None], partitioner: str = "murmur2") -> str:
    """Produce one record per key (value {"n": i}) to a topic of its own; returns its Kafka name."""
    spec = TopicSpec(name, partitions)
    values = [json.dumps({"n": i}).encode() for i in range(len(keys))]
    produce(cluster, spec, [(pa.array(keys, pa.binary()), pa.array(values, pa.binary()))], partitioner)
    return cluster.topic(name)


def diagnose(capsys, *args: str) -> tuple[int, dict]:
    code = main(["diagnose", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def keys_of(finding: dict) -> list[str]:
    return sorted(r["key"] for r in finding["sample"])


def test_a_java_placed_topic_and_a_kcat_placed_one_name_exactly_the_misplaced_keys(cluster, capsys):
    java = put(cluster, "consents", 4, USERS)
    kcat = put(cluster, "accounts", 4, USERS, partitioner="consistent_random")
    moved = sorted(k.decode() for k in USERS if zlib.crc32(k) % 4 != partition_for(k, 4))
    assert 0 < len(moved) < len(USERS)
    code, found = diagnose(capsys, java, kcat, "--sample", "50")
    assert code == 1
    a, b = found["topics"]
    assert (a["topic"], a["partitions"], a["records"], a["keys"]) == (java, 4, 20, 20)
    assert a["partitioners"]["murmur2"] == {"keys": 20, "share": 1.0}
    assert a["partitioners"]["crc32"]["keys"] == 20 - len(moved)
    assert a["fits"] == "murmur2"
    assert a["misplaced"]["count"] == 0
    assert b["partitioners"]["crc32"] == {"keys": 20, "share": 1.0}
    assert b["fits"] == "crc32"
    assert b["misplaced"]["count"] == len(moved)
    assert keys_of(b["misplaced"]) == moved
    for row in b["misplaced"]["sample"]:
        key = row["key"].encode()
        assert (row["partition"], row["expected"]) == (zlib.crc32(key) % 4, partition_for(key, 4))
    assert found["partition_differs"]["count"] == len(moved)
    assert keys_of(found["partition_differs"]) == moved
    row = found["partition_differs"]["sample"][0]
    assert row[java] == partition_for(row["key"].encode(), 4)
    assert row[kcat] == zlib.crc32(row["key"].encode()) % 4
    assert (found["co_partitioned"], found["clean"], found["same_partition_count"]) == (False, True, True)
    assert a["only_in_this_topic"]["count"] == b["only_in_this_topic"]["count"] == 0
    # the same, in words
    assert main(["diagnose", java, kcat, "--sample", "50"]) == 1
    out = capsys.readouterr().out
    assert f"{kcat}: {len(moved)} keys not where murmur2 puts them:" in out
    assert f"  {moved[0]}: partition " in out
    assert f"{java} and {kcat}: NOT co-partitioned, keys clean" in out
    # with crc32 expected, the Java-placed topic is the misplaced one
    code, found = diagnose(capsys, java, kcat, "--partitioner", "crc32")
    assert found["topics"][0]["misplaced"]["count"] == len(moved)
    assert found["topics"][1]["misplaced"]["count"] == 0


def test_two_clean_co_partitioned_topics_exit_0_and_missing_keys_are_named(cluster, capsys):
    stream = put(cluster, "orders", 3, [*USERS[:5], USERS[0], None])  # user_1 twice, one keyless record
    lookup = put(cluster, "customers", 3, [*USERS[1:5], USERS[9]])
    code, found = diagnose(capsys, stream, lookup)
    assert code == 0
    a, b = found["topics"]
    assert (a["records"], a["keys"], a["null_keys"]) == (7, 5, 1)
    assert a["fits"] == b["fits"] in ("murmur2", "both")
    assert (found["co_partitioned"], found["clean"]) == (True, True)
    assert a["only_in_this_topic"]["count"] == 1
    assert [r["key"] for r in a["only_in_this_topic"]["sample"]] == ["user_1"]
    assert a["only_in_this_topic"]["sample"][0]["partition"] == partition_for(b"user_1", 3)
    assert [r["key"] for r in b["only_in_this_topic"]["sample"]] == ["user_10"]
    assert found["partition_differs"]["count"] == 0


def test_key_hygiene_names_framed_quoted_spaced_and_bom_keys_with_a_hex_dump(cluster, capsys):
    framed = b"\x00\x00\x00\x00\x07user_1"
    keys = [framed, b'"user_2"', b"user_3 ", b"\xef\xbb\xbfuser_4", b"user_5", b"\xffuser_6"]
    topic = put(cluster, "dirty", 2, keys)
    clean = put(cluster, "clean", 2, [b"user_1", b"user_2", b"user_3", b"user_4", b"user_5"])
    code, found = diagnose(capsys, clean, topic)
    assert code == 1
    assert (found["co_partitioned"], found["clean"]) == (True, False)
    hygiene = found["topics"][1]["hygiene"]
    assert {name: f["count"] for name, f in hygiene.items()} == {
        "not_utf8": 1,
        "framed": 1,
        "bom": 1,
        "quoted": 1,
        "whitespace": 1,
        "control": 1,  # the framing's zero bytes
    }
    assert (
        hygiene["framed"]["problem"]
        == "the key starts with Schema Registry framing (0x00 + 4-byte schema id)"
    )
    assert hygiene["framed"]["sample"][0]["hex"] == "00 00 00 00 07 75 73 65 72 5f 31 | .....user_1"
    assert hygiene["bom"]["sample"][0]["hex"] == "ef bb bf 75 73 65 72 5f 34 | ...user_4"
    assert hygiene["quoted"]["sample"][0]["key"] == '"user_2"'
    assert hygiene["whitespace"]["sample"][0]["key"] == "'user_3 '"
    assert hygiene["not_utf8"]["sample"][0]["hex"] == "ff 75 73 65 72 5f 36 | .user_6"
    assert found["topics"][0]["hygiene"] == {}
    # keys that differ only in invisible bytes are not the same key
    assert found["topics"][0]["only_in_this_topic"]["count"] == 4
    assert keys_of(found["topics"][0]["only_in_this_topic"]) == ["user_1", "user_2", "user_3", "user_4"]


def test_different_partition_counts_are_not_co_partitioned(cluster, capsys):
    a = put(cluster, "six", 6, USERS[:8])
    b = put(cluster, "four", 4, USERS[:8])
    code, found = diagnose(capsys, a, b)
    assert code == 1
    assert (found["same_partition_count"], found["co_partitioned"]) == (False, False)
    assert [t["partitions"] for t in found["topics"]] == [6, 4]
    differ = sorted(k.decode() for k in USERS[:8] if partition_for(k, 6) != partition_for(k, 4))
    assert keys_of(found["partition_differs"]) == differ
    assert main(["diagnose", a, b]) == 1
    assert "partition counts differ (" in capsys.readouterr().out


def test_diagnose_writes_nothing_and_bad_input_is_one_line(cluster, capsys):
    a = put(cluster, "left", 2, USERS[:3])
    b = put(cluster, "right", 2, USERS[:3])
    ends = [watermarks(cluster, TopicSpec(n, 2)) for n in ("left", "right")]
    assert main(["diagnose", a, b]) == 0
    assert [watermarks(cluster, TopicSpec(n, 2)) for n in ("left", "right")] == ends  # nothing written
    capsys.readouterr()
    assert main(["diagnose", a, cluster.topic("nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lake: error: topic ") and f"{cluster.topic('nope')} does not exist on Kafka" in err
    assert "\n" not in err
    assert main(["diagnose", a, a]) == 2
    assert "two different topics" in capsys.readouterr().err
    assert main(["diagnose", a, b, "-X", "nonsense"]) == 2
    assert "-X nonsense: expected NAME=VALUE" in capsys.readouterr().err
    assert main(["diagnose", a, b, "--sample", "0"]) == 2


@pytest.mark.parametrize("settings", [["-X", "security.protocol=PLAINTEXT"]])
def test_diagnose_takes_a_bootstrap_address_and_client_settings(cluster, capsys, settings):
    a = put(cluster, "x", 2, USERS[:4])
    b = put(cluster, "y", 2, USERS[:4])
    code, found = diagnose(capsys, a, b, "--bootstrap", cluster.bootstrap_servers, *settings)
    assert code == 0
    assert [t["keys"] for t in found["topics"]] == [4, 4]
