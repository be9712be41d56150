"""What every join kind's engine does alike: `select` checked up front, replays and crashes between
commits, quarantine, and the oracle on a fresh lake."""

from __future__ import annotations

import pyarrow as pa
import pytest
from joinkit import (
    T0,
    Feeder,
    assert_oracle,
    changelog,
    crash_on_result_write,
    produce,
    result_changes,
    result_rows,
    write_config,
)

from spark_jobs.errors import UserError
from spark_jobs.joins.oracle import consumed_records, expected
from spark_jobs.joins.registry import job_for
from spark_jobs.joins.streams import STATE_SCHEMA
from spark_jobs.system_tables import QUARANTINE


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path)


def test_bad_select_expression_is_a_user_error_with_its_line(spark, lake, tmp_path):
    config = write_config(
        tmp_path,
        "topics:\n  L: {partitions: 1}\n  R: {partitions: 1}\njoins:\n  j:\n    kind: table\n"
        "    left: L\n    right: R\n    select:\n      a: left.v\n      b: nosuch(right.v)\n",
    )
    with pytest.raises(UserError, match=r"pipeline.yaml:11: joins.j.select.b: .*nosuch"):
        job_for(spark, lake, config, config.join("j"), "q")


def test_a_replayed_batch_changes_nothing(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "t_left")
    produce(lake, cfg, "L", [("a", "a1", T0)])
    produce(lake, cfg, "R", [("a", "r1", T0)])
    f.feed()
    before = lake.version("t_left"), len(changelog(lake, cfg, "t_left_changelog"))
    f.replay_last()  # Spark reruns the batch from its state before it, with the same batch id
    assert (lake.version("t_left"), len(changelog(lake, cfg, "t_left_changelog"))) == before
    assert result_changes(lake, "t_left") == [("insert", "a", "a1", "r1")]
    f.query.stop()  # the metrics rows go to join_metrics when the job stops: the batch's once
    metrics = lake.read_arrow("join_metrics", columns=["join", "query_id", "batch_id", "input_left"])
    assert metrics.to_pylist() == [
        {"join": "t_left", "query_id": "test-query", "batch_id": 0, "input_left": 1}
    ]


def test_a_crash_between_commits_then_replay_gives_the_result_once(spark, lake, cfg, monkeypatch):
    f = Feeder(spark, lake, cfg, "t_left")
    produce(lake, cfg, "L", [("a", "a1", T0), ("b", "b1", T0)])
    produce(lake, cfg, "R", [("a", "r1", T0)])
    crash = crash_on_result_write(monkeypatch, lake, "t_left")
    with pytest.raises(RuntimeError, match="killed"):
        f.feed()  # state and changelog topic committed, result not
    crash.undo()
    f.restart()
    assert result_rows(lake, "t_left") == [("a", "a1", "r1"), ("b", "b1", None)]
    assert sorted(result_changes(lake, "t_left")) == [
        ("insert", "a", "a1", "r1"),
        ("insert", "b", "b1", None),
    ]
    assert len(changelog(lake, cfg, "t_left_changelog")) == 2
    assert_oracle(spark, lake, cfg, "t_left")


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


def test_expected_matches_for_a_fresh_lake(spark, lake, cfg):
    Feeder(spark, lake, cfg, "t_outer")
    records, read = consumed_records(spark, lake, cfg, cfg.join("t_outer"))
    assert read == "L up to offsets [0, 0], R up to offsets [0, 0]"
    assert expected(spark, lake, cfg, "t_outer", records).num_rows == 0


def test_a_former_pending_table_gets_the_name_of_what_it_holds(spark, lake, cfg):
    """Before a stream-table's waiting events and a keyed join's parked rows had names of their own,
    both were <join>__pending: the job renames it when it starts, its rows kept."""
    row = {"key": b"k", "value": b"v", "timestamp": None, "partition": 0, "offset": 7}
    for join in ("st_left", "t_left"):
        lake.create(f"{join}__pending", STATE_SCHEMA)
        lake.append(f"{join}__pending", pa.Table.from_pylist([row], STATE_SCHEMA))
    job_for(spark, lake, cfg, cfg.join("st_left"), "q")
    keyed = job_for(spark, lake, cfg, cfg.join("t_left"), "q")
    assert not lake.exists("st_left__pending") and not lake.exists("t_left__pending")
    for table in ("st_left__waiting", "t_left__parked"):
        assert [(r["key"], r["offset"]) for r in lake.read_arrow(table).to_pylist()] == [(b"k", 7)]
    assert keyed.behind.parked == 1  # the keyed join sees the parked row: its table catches up with it
