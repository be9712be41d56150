"""Join semantics, rule by rule, through the engine's micro-batch entry point (``JoinJob.process``)."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest
from joinkit import SECOND, T0, Feeder, changelog, produce, result_rows, write_config

from spark_jobs.errors import UserError
from spark_jobs.joins.oracle import audit, expected
from spark_jobs.joins.registry import job_for
from spark_jobs.joins.runner import reset_join
from spark_jobs.partitioners import partition_for
from spark_jobs.system_tables import QUARANTINE


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path)


def changes(lake, name):
    feed = lake.changes_arrow(name).to_pylist()
    return [(c["_change_type"], c["key"].decode(), c["lv"], c["rv"]) for c in feed]


def assert_oracle(spark, lake, cfg, name):
    report = audit(spark, lake, cfg, name)
    assert report.clean, report.text()


def test_bad_select_expression_is_a_user_error_with_its_line(spark, lake, tmp_path):
    config = write_config(
        tmp_path,
        "topics:\n  L: {partitions: 1}\n  R: {partitions: 1}\njoins:\n  j:\n    kind: table\n"
        "    left: L\n    right: R\n    select:\n      a: left.v\n      b: nosuch(right.v)\n",
    )
    with pytest.raises(UserError, match=r"pipeline.yaml:11: joins.j.select.b: .*nosuch"):
        job_for(spark, lake, config, config.join("j"), "q")


# --- table-table --------------------------------------------------------------------------------
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
    assert (metrics.affected_keys, metrics.upserted, metrics.deleted) == (1, 0, 0)
    assert (lake.version("t_left"), len(changelog(lake, cfg, "t_left_changelog"))) == before
    assert changes(lake, "t_left") == [("insert", "a", "a1", "r1")]


def test_table_join_collapses_a_key_within_one_batch_and_keeps_the_latest_by_timestamp(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "t_left")
    # offsets say v3 is last, but timestamps say v2 is the latest
    produce(lake, cfg, "L", [("a", "v1", T0), ("a", "v2", T0 + 5 * SECOND), ("a", "v3", T0 + 1 * SECOND)])
    f.feed()
    assert result_rows(lake, "t_left") == [("a", "v2", None)]
    assert changes(lake, "t_left") == [("insert", "a", "v2", None)]
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


# --- exactly-once -------------------------------------------------------------------------------
def test_a_replayed_batch_changes_nothing(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "t_left")
    produce(lake, cfg, "L", [("a", "a1", T0)])
    produce(lake, cfg, "R", [("a", "r1", T0)])
    f.feed()
    tables = ["t_left", "t_left__published", "join_metrics"]
    before = {t: lake.version(t) for t in tables}, len(changelog(lake, cfg, "t_left_changelog"))
    f.replay_last()  # Spark reruns the batch from its state before it, with the same batch id
    assert ({t: lake.version(t) for t in tables}, len(changelog(lake, cfg, "t_left_changelog"))) == before
    assert changes(lake, "t_left") == [("insert", "a", "a1", "r1")]


def test_a_crash_between_commits_then_replay_gives_the_result_once(spark, lake, cfg, monkeypatch):
    f = Feeder(spark, lake, cfg, "t_left")
    produce(lake, cfg, "L", [("a", "a1", T0), ("b", "b1", T0)])
    produce(lake, cfg, "R", [("a", "r1", T0)])
    real_merge = lake.merge

    def crash_on_result(name, *args, **kwargs):
        if name == "t_left":
            raise RuntimeError("killed")
        return real_merge(name, *args, **kwargs)

    monkeypatch.setattr(lake, "merge", crash_on_result)
    with pytest.raises(RuntimeError, match="killed"):
        f.feed()  # state and changelog topic committed, result not
    monkeypatch.setattr(lake, "merge", real_merge)
    f.restart()
    assert result_rows(lake, "t_left") == [("a", "a1", "r1"), ("b", "b1", None)]
    assert sorted(changes(lake, "t_left")) == [("insert", "a", "a1", "r1"), ("insert", "b", "b1", None)]
    assert len(changelog(lake, cfg, "t_left_changelog")) == 2
    assert_oracle(spark, lake, cfg, "t_left")


# --- quarantine ---------------------------------------------------------------------------------
def test_null_keys_and_unparseable_values_are_quarantined_and_counted(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "t_left")
    produce(lake, cfg, "L", [(None, "x", T0), ("a", b"{not json", T0), ("b", b"[1, 2]", T0), ("c", "c1", T0)])
    metrics = f.feed()
    assert (metrics.input_left, metrics.quarantined, metrics.upserted) == (4, 3, 1)
    assert result_rows(lake, "t_left") == [("c", "c1", None)]
    rows = sorted((r["job"], r["source"][:2], r["reason"]) for r in lake.read_arrow(QUARANTINE).to_pylist())
    assert rows == [
        ("join:t_left", "L[", "null key"),
        ("join:t_left", "L[", "value is not a JSON object (key 'a')"),
        ("join:t_left", "L[", "value is not a JSON object (key 'b')"),
    ]
    assert_oracle(spark, lake, cfg, "t_left")


# --- stream-table -------------------------------------------------------------------------------
def test_stream_table_joins_each_event_with_the_table_as_of_its_time(spark, lake, cfg):
    inner, left = Feeder(spark, lake, cfg, "st_inner"), Feeder(spark, lake, cfg, "st_left")
    produce(
        lake,
        cfg,
        "R",
        [("a", "r1", T0 + 10), ("a", "r2", T0 + 20), ("a", None, T0 + 30), ("b", "rb", T0 + 20)],
    )
    produce(
        lake,
        cfg,
        "L",
        [
            ("a", "e0", T0 + 5),  # before any right value
            ("a", "e1", T0 + 10),  # equal timestamp: the right update counts as earlier
            ("a", "e2", T0 + 25),
            ("a", "e3", T0 + 35),  # after the right tombstone
            ("b", "eb", T0 + 40),
            ("c", "ec", T0 + 40),  # never on the right side
            ("a", None, T0 + 41),  # a tombstone on the stream side is not an event
        ],
    )
    m = inner.feed()
    left.feed()
    assert m.ignored == 1
    assert result_rows(lake, "st_inner") == [("a", "e1", "r1"), ("a", "e2", "r2"), ("b", "eb", "rb")]
    assert result_rows(lake, "st_left") == [
        ("a", "e0", None),
        ("a", "e1", "r1"),
        ("a", "e2", "r2"),
        ("a", "e3", None),
        ("b", "eb", "rb"),
        ("c", "ec", None),
    ]
    # a later right update emits nothing
    produce(lake, cfg, "R", [("c", "rc", T0 + 50)])
    assert left.feed().appended == 0
    assert len(result_rows(lake, "st_left")) == 6
    assert_oracle(spark, lake, cfg, "st_left")


def test_stream_table_events_wait_until_the_right_side_has_caught_up(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "st_left")
    produce(lake, cfg, "L", [("a", "e1", T0 + 20)])
    produce(lake, cfg, "R", [("a", "r1", T0 + 10), ("a", "r2", T0 + 30)])
    rows = f.pending_records()
    left_only = rows.filter(pc.equal(rows["side"], "left"))
    # the right topic holds records this batch does not have: the event waits
    m = f.feed(left_only)
    assert (m.appended, m.pending) == (0, 1)
    assert result_rows(lake, "st_left") == []
    m = f.feed()
    assert (m.appended, m.pending) == (1, 0)
    assert result_rows(lake, "st_left") == [("a", "e1", "r1")]


# --- stream-stream ------------------------------------------------------------------------------
def test_stream_stream_pairs_within_the_window_and_emits_the_unmatched_when_it_closes(spark, lake, cfg):
    feeders = {n: Feeder(spark, lake, cfg, n) for n in ("ss_inner", "ss_left", "ss_outer")}
    produce(lake, cfg, "L", [("a", "l1", T0), ("a", "l2", T0 + 4 * SECOND), ("b", "lb", T0 + 5 * SECOND)])
    produce(
        lake,
        cfg,
        "R",
        [
            ("a", "r1", T0 + 10 * SECOND),  # within 10 s of l1 and l2
            ("a", "r2", T0 + 12 * SECOND),  # only within l2's window
            ("c", "rc", T0 + 13 * SECOND),
            ("z", "rz", T0 + 60 * SECOND),  # moves the watermark past every window above
        ],
    )
    for f in feeders.values():
        f.feed()
    pairs = [("a", "l1", "r1"), ("a", "l2", "r1"), ("a", "l2", "r2")]
    assert result_rows(lake, "ss_inner") == pairs
    assert result_rows(lake, "ss_left") == sorted([*pairs, ("b", "lb", None)])
    # rz's own window is still open: not emitted yet
    assert result_rows(lake, "ss_outer") == sorted([*pairs, ("b", "lb", None), ("c", None, "rc")])
    for name in feeders:
        assert_oracle(spark, lake, cfg, name)


def test_stream_stream_output_is_the_same_for_any_batch_split(spark, lake, cfg, tmp_path):
    produce(lake, cfg, "L", [("a", "l1", T0), ("a", "l2", T0 + 8 * SECOND), ("b", "lb", T0 + 9 * SECOND)])
    produce(
        lake,
        cfg,
        "R",
        [("a", "r1", T0 + 1 * SECOND), ("b", "rb", T0 + 30 * SECOND), ("a", "r2", T0 + 40 * SECOND)],
    )
    one = Feeder(spark, lake, cfg, "ss_outer")
    one.feed()
    all_in_one = result_rows(lake, "ss_outer")
    reset_join(lake, cfg, "ss_outer")
    split = Feeder(spark, lake, cfg, "ss_outer")
    rows = split.pending_records()
    for i in range(rows.num_rows):
        split.feed(rows.slice(i, 1))
    # l1-r2 and lb-rb are too far apart; lb's window has closed (watermark 40 s), rb's and r2's not
    assert (
        result_rows(lake, "ss_outer")
        == all_in_one
        == [("a", "l1", "r1"), ("a", "l2", "r1"), ("b", "lb", None)]
    )


def test_expected_matches_for_a_fresh_lake(spark, lake, cfg):
    Feeder(spark, lake, cfg, "t_outer")
    assert expected(spark, lake, cfg, "t_outer").num_rows == 0
