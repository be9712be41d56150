"""The table–table join, rule by rule (docs/joins.md, "Semantics"), through its real streaming query."""

from __future__ import annotations

import json

import pytest
from joinkit import (
    SECOND,
    T0,
    Feeder,
    assert_oracle,
    changelog,
    produce,
    result_changes,
    result_rows,
    write_config,
)

from spark_jobs.seams.partitioners import partition_for


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path)


def test_table_join_rules_step_by_step(spark, lake, cfg):
    feeders = {n: Feeder(spark, lake, cfg, n) for n in ("t_inner", "t_left", "t_outer")}

    def step(topic, records, want):
        produce(lake, cfg, topic, records)
        for name, f in feeders.items():
            f.feed()
            assert result_rows(lake, name) == want[name], name

    t = T0
    # left before right: left/outer keep the row with a null right side, inner has nothing
    step(
        "L", [("a", "a1", t)], {"t_inner": [], "t_left": [("a", "a1", None)], "t_outer": [("a", "a1", None)]}
    )
    # right arrives: every type joins
    step("R", [("a", "r1", t + 1)], {n: [("a", "a1", "r1")] for n in feeders})
    # right before left for another key: only outer shows it
    step(
        "R",
        [("b", "rb", t + 2)],
        {
            "t_inner": [("a", "a1", "r1")],
            "t_left": [("a", "a1", "r1")],
            "t_outer": [("a", "a1", "r1"), ("b", None, "rb")],
        },
    )
    step("L", [("b", "b1", t + 3)], {n: [("a", "a1", "r1"), ("b", "b1", "rb")] for n in feeders})
    # an update on either side re-emits with the other side's current value
    step("R", [("a", "r2", t + 4)], {n: [("a", "a1", "r2"), ("b", "b1", "rb")] for n in feeders})
    # right tombstone: inner removes, left keeps with null, outer keeps the left side
    step(
        "R",
        [("a", None, t + 5)],
        {
            "t_inner": [("b", "b1", "rb")],
            "t_left": [("a", "a1", None), ("b", "b1", "rb")],
            "t_outer": [("a", "a1", None), ("b", "b1", "rb")],
        },
    )
    # left tombstone: inner/left remove, outer keeps the right side
    step(
        "L",
        [("b", None, t + 6)],
        {"t_inner": [], "t_left": [("a", "a1", None)], "t_outer": [("a", "a1", None), ("b", None, "rb")]},
    )
    for name in feeders:
        assert_oracle(spark, lake, cfg, name)


def test_table_join_repeated_identical_updates_change_nothing(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "t_left")
    produce(lake, cfg, "L", [("a", "a1", T0)])
    produce(lake, cfg, "R", [("a", "r1", T0)])
    f.feed()
    before = lake.version("t_left"), len(changelog(lake, cfg, "t_left_changelog"))
    produce(lake, cfg, "L", [("a", "a1", T0 + 1)])
    produce(lake, cfg, "R", [("a", "r1", T0 + 1)])
    metrics = f.feed()
    assert (metrics.affected_keys, metrics.upserted, metrics.deleted) == (0, 0, 0)
    assert (lake.version("t_left"), len(changelog(lake, cfg, "t_left_changelog"))) == before
    assert result_changes(lake, "t_left") == [("insert", "a", "a1", "r1")]


def test_table_join_collapses_a_key_within_one_batch_and_keeps_the_latest_by_timestamp(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "t_left")
    # offsets say v3 is last, but timestamps say v2 is the latest
    produce(lake, cfg, "L", [("a", "v1", T0), ("a", "v2", T0 + 5 * SECOND), ("a", "v3", T0 + 1 * SECOND)])
    f.feed()
    assert result_rows(lake, "t_left") == [("a", "v2", None)]
    assert result_changes(lake, "t_left") == [("insert", "a", "v2", None)]
    produce(lake, cfg, "L", [("a", "old", T0 + 2 * SECOND)])  # older than the state: ignored
    f.feed()
    assert result_rows(lake, "t_left") == [("a", "v2", None)]
    assert_oracle(spark, lake, cfg, "t_left")


def test_table_join_with_an_empty_right_side_and_a_tombstone_for_a_never_seen_key(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "t_inner")
    g = Feeder(spark, lake, cfg, "t_left")
    produce(lake, cfg, "L", [("a", "a1", T0), ("z", None, T0)])
    f.feed()
    g.feed()
    assert result_rows(lake, "t_inner") == []
    assert result_rows(lake, "t_left") == [("a", "a1", None)]
    assert lake.changes_arrow("t_inner").num_rows == 0


def test_a_right_tombstone_of_a_key_never_on_the_right_counts_in_the_row_time_whatever_the_batches(
    spark, lake, cfg
):
    """A right tombstone for a key the right side never had is a record of that key: the left row
    answers again with its time, whether it came in the left record's batch or a later one (as Kafka
    Streams' join answers the tombstone it forwards)."""
    apart = Feeder(spark, lake, cfg, "t_left")  # one micro-batch per record
    together = Feeder(spark, lake, cfg, "t_outer")  # both records in one micro-batch
    produce(lake, cfg, "L", [("a", "a1", T0)])
    apart.feed()
    produce(lake, cfg, "R", [("a", None, T0 + SECOND)])
    apart.feed()
    together.feed()
    for name in ("t_left", "t_outer"):
        (row,) = lake.read_arrow(name).to_pylist()
        assert (row["key"], row["lv"], row["rv"]) == (b"a", "a1", None)
        assert int(row["timestamp"].timestamp() * 1000) == T0 + SECOND, name
        assert_oracle(spark, lake, cfg, name)
    assert [c[0] for c in result_changes(lake, "t_left")] == ["insert", "update_preimage", "update_postimage"]


def test_string_values_are_left_value_and_right_value(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "t_string")
    produce(lake, cfg, "L", [("a", "a1", T0)])
    produce(lake, cfg, "S", [("a", b"plain text", T0)])
    f.feed()
    assert result_rows(lake, "t_string", ("key", "lv", "rv", "both")) == [
        ("a", "a1", "plain text", "a1/plain text")
    ]


def test_publish_writes_the_changelog_as_a_co_partitioned_topic_with_tombstones(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "t_left")
    produce(lake, cfg, "L", [("a", "a1", T0), ("b", "b1", T0)])
    f.feed()
    produce(lake, cfg, "L", [("b", None, T0 + 1)])
    f.feed()
    records = sorted(changelog(lake, cfg, "t_left_changelog"), key=lambda r: (r["key"], r["offset"]))
    got = [(r["key"], r["partition"], r["value"]) for r in records]
    assert got == (
        [
            (
                b"a",
                partition_for(b"a", 2),
                json.dumps({"lv": "a1", "rv": None}, separators=(",", ":")).encode(),
            ),
            (
                b"b",
                partition_for(b"b", 2),
                json.dumps({"lv": "b1", "rv": None}, separators=(",", ":")).encode(),
            ),
            (b"b", partition_for(b"b", 2), None),
        ]
    )
