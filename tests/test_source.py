"""The ``delta`` Spark data source: batch reads, time travel, change feed, and streaming over versions."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.testing import assertDataFrameEqual

SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64()), ("p", pa.int32())])


def tbl(ids, vs, ps=None, gone=None):
    data = {"id": ids, "v": vs, "p": pa.array(ps or [0] * len(ids), pa.int32())}
    if gone is not None:
        data["gone"] = gone
    return pa.table(data)


@pytest.fixture
def t(lake):
    lake.create("t", SCHEMA, partition_by=["p"])
    lake.append("t", tbl(["a", "b"], [1, 2], [0, 1]))  # version 1
    return lake


def run_stream(spark, path, checkpoint, **options):
    """Run an availableNow query; return [(batch_id, sorted rows)] of the non-empty batches."""
    seen = []

    def collect(df, batch_id):
        got = sorted(tuple(r) for r in df.collect())
        if got:
            seen.append((batch_id, got))

    reader = spark.readStream.format("delta")
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load(str(path))
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return seen


def test_batch_read_and_time_travel(spark, t):
    t.merge("t", tbl(["a", "c"], [10, 3], [0, 1]), ["id"])  # version 2
    assertDataFrameEqual(t.read(spark, "t"), [("a", 10, 0), ("b", 2, 1), ("c", 3, 1)], checkRowOrder=False)
    assertDataFrameEqual(t.read(spark, "t", 1), [("a", 1, 0), ("b", 2, 1)])
    assert t.read(spark, "t").schema.simpleString() == "struct<id:string,v:bigint,p:int>"


def test_batch_change_feed_columns_and_range(spark, t):
    t.merge("t", tbl(["a", "b"], [10, 0], [0, 1], gone=[False, True]), ["id"], delete_column="gone")
    df = t.changes(spark, "t", 2)
    assert df.columns == ["id", "v", "p", "_change_type", "_commit_version", "_commit_timestamp"]
    assertDataFrameEqual(
        df.drop("_commit_timestamp"),
        [
            ("a", 1, 0, "update_preimage", 2),
            ("a", 10, 0, "update_postimage", 2),
            ("b", 2, 1, "delete", 2),
        ],
        checkRowOrder=False,
    )
    one = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1)
    assert one.option("endingVersion", 1).load(t.uri("t")).count() == 2


def test_stream_snapshot_then_appends_in_order(spark, t, tmp_path):
    ck = tmp_path / "ck"
    assert run_stream(spark, t.path("t"), ck) == [(0, [("a", 1, 0), ("b", 2, 1)])]
    t.append("t", tbl(["c"], [3]))  # v2
    t.append("t", tbl(["d", "e"], [4, 5], [1, 1]))  # v3
    assert run_stream(spark, t.path("t"), ck) == [(1, [("c", 3, 0), ("d", 4, 1), ("e", 5, 1)])]
    assert run_stream(spark, t.path("t"), ck) == []  # resumes where it stopped: nothing new


def test_stream_change_feed_delivers_merges_and_deletes_in_commit_order(spark, t, tmp_path):
    ck = tmp_path / "ck"
    first = run_stream(spark, t.path("t"), ck, readChangeFeed="true")
    assert [(b, [r[:5] for r in rows]) for b, rows in first] == [
        (0, [("a", 1, 0, "insert", 1), ("b", 2, 1, "insert", 1)])
    ]
    t.merge("t", tbl(["a"], [10]), ["id"])  # v2
    t.merge("t", tbl(["b"], [2], [1], gone=[True]), ["id"], delete_column="gone")  # v3
    t.append("t", tbl(["c"], [3]))  # v4
    batches = run_stream(spark, t.path("t"), ck, readChangeFeed="true", maxFilesPerTrigger="1")
    assert [[r[:5] for r in rows] for _, rows in batches] == [
        [("a", 1, 0, "update_preimage", 2), ("a", 10, 0, "update_postimage", 2)],
        [("b", 2, 1, "delete", 3)],
        [("c", 3, 0, "insert", 4)],
    ]
    assert [b for b, _ in batches] == [1, 2, 3]


def test_stream_from_starting_version_skips_the_snapshot(spark, t, tmp_path):
    t.append("t", tbl(["c"], [3]))  # v2
    got = run_stream(spark, t.path("t"), tmp_path / "ck", startingVersion="2")
    assert got == [(0, [("c", 3, 0)])]


def test_plain_stream_refuses_update_commits_unless_skipped(spark, t, tmp_path):
    ck = tmp_path / "ck"
    run_stream(spark, t.path("t"), ck)
    t.merge("t", tbl(["a"], [10]), ["id"])  # v2 rewrites a row
    t.append("t", tbl(["c"], [3]))  # v3
    with pytest.raises(Exception, match="updates or deletes rows"):
        run_stream(spark, t.path("t"), ck)
    skipped = run_stream(spark, t.path("t"), tmp_path / "ck2", startingVersion="2", skipChangeCommits="true")
    assert skipped == [(0, [("c", 3, 0)])]


def test_empty_table_reads_as_no_rows(spark, lake):
    lake.create("empty", SCHEMA, partition_by=["p"])
    assert lake.read(spark, "empty").collect() == []
    assert lake.read(spark, "empty").schema.simpleString() == "struct<id:string,v:bigint,p:int>"
