"""The stream–table join (docs/joins.md, "Semantics"), through its real streaming query."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
from joinkit import T0, Feeder, assert_oracle, produce, result_rows, write_config


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path)


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
    n = left.feed()
    assert m.ignored == 1 and m.dropped == {"null_value": 1}  # the stream's tombstone: quarantined
    (dropped,) = [q for q in lake.read_arrow("quarantine").to_pylist() if q["job"] == "join:st_inner"]
    assert (dropped["topic"], dropped["cause"], dropped["reason"]) == (
        "L",
        "null_value",
        "null value: a tombstone on a stream is not an event (key 'a')",
    )
    assert (m.matched, m.unmatched, n.matched, n.unmatched) == (3, 0, 3, 3)  # the metrics' row outcomes
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
