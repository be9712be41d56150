"""The storage seam: atomic writes, merges with deletes, time travel, change feed, exactly-once."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_jobs.errors import UserError

SCHEMA = pa.schema([("id", pa.string()), ("v", pa.int64())])


def rows(lake, name, version=None):
    return sorted(lake.read_arrow(name, version).to_pylist(), key=lambda r: r["id"])


def changes(lake, name, start=0):
    t = lake.changes_arrow(name, start)
    return sorted(
        (r["_commit_version"], r["_change_type"], r["id"], r["v"])
        for r in t.select(["_commit_version", "_change_type", "id", "v"]).to_pylist()
    )


@pytest.fixture
def table(lake):
    lake.create("t", SCHEMA)
    lake.append("t", pa.table({"id": ["a", "b"], "v": [1, 2]}))
    return "t"


def test_new_root_is_empty_and_create_is_idempotent(lake):
    assert lake.tables() == []
    lake.create("t", SCHEMA)
    lake.create("t", SCHEMA)
    assert lake.tables() == ["t"]
    assert lake.version("t") == 0
    assert lake.read_arrow("t").num_rows == 0


def test_append_merge_delete_and_time_travel(lake, table):
    v = lake.merge(
        "t",
        pa.table({"id": ["a", "c", "b"], "v": [10, 3, 0], "gone": [False, False, True]}),
        ["id"],
        delete_column="gone",
    )
    assert v == 2
    assert rows(lake, "t") == [{"id": "a", "v": 10}, {"id": "c", "v": 3}]
    assert rows(lake, "t", 1) == [{"id": "a", "v": 1}, {"id": "b", "v": 2}]
    assert changes(lake, "t") == [
        (1, "insert", "a", 1),
        (1, "insert", "b", 2),
        (2, "delete", "b", 2),
        (2, "insert", "c", 3),
        (2, "update_postimage", "a", 10),
        (2, "update_preimage", "a", 1),
    ]


def test_delete_of_missing_key_inserts_nothing(lake, table):
    lake.merge("t", pa.table({"id": ["zz"], "v": [0], "gone": [True]}), ["id"], delete_column="gone")
    assert rows(lake, "t") == [{"id": "a", "v": 1}, {"id": "b", "v": 2}]


def test_overwrite_is_one_commit(lake, table):
    assert lake.overwrite("t", pa.table({"id": ["x"], "v": [9]})) == 2
    assert rows(lake, "t") == [{"id": "x", "v": 9}]
    assert rows(lake, "t", 1) == [{"id": "a", "v": 1}, {"id": "b", "v": 2}]


def test_replayed_batch_is_skipped(lake, table):
    txn = ("job-1", 7)
    assert lake.append("t", pa.table({"id": ["c"], "v": [3]}), txn=txn) == 2
    assert lake.append("t", pa.table({"id": ["c"], "v": [3]}), txn=txn) is None
    assert lake.merge("t", pa.table({"id": ["a"], "v": [5]}), ["id"], txn=("job-1", 6)) is None
    assert lake.version("t") == 2
    assert rows(lake, "t") == [{"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "c", "v": 3}]
    # the next batch id goes through, and another application is independent
    assert lake.merge("t", pa.table({"id": ["a"], "v": [5]}), ["id"], txn=("job-1", 8)) == 3
    assert lake.append("t", pa.table({"id": ["d"], "v": [4]}), txn=("job-2", 0)) == 4
    assert lake.committed("t", ("job-1", 8)) and not lake.committed("t", ("job-1", 9))


def test_schema_mismatch_and_duplicate_keys_are_rejected(lake, table):
    with pytest.raises(ValueError, match="missing: \\['v'\\]"):
        lake.append("t", pa.table({"id": ["c"]}))
    with pytest.raises(ValueError, match="several rows for one key"):
        lake.merge("t", pa.table({"id": ["a", "a"], "v": [1, 2]}), ["id"])
    assert lake.version("t") == 1


def test_unknown_table_and_version(lake, table):
    with pytest.raises(UserError, match="unknown table 'nope'"):
        lake.read_arrow("nope")
    with pytest.raises(UserError, match="no version 99"):
        lake.read_arrow("t", 99)


def test_concurrent_writers_all_land(lake, table):
    from concurrent.futures import ThreadPoolExecutor

    def write(i):
        return lake.merge("t", pa.table({"id": [f"k{i}"], "v": [i]}), ["id"])

    with ThreadPoolExecutor(4) as pool:
        versions = list(pool.map(write, range(8)))
    assert sorted(versions) == list(range(2, 10))
    assert [r["id"] for r in rows(lake, "t")] == ["a", "b"] + [f"k{i}" for i in range(8)]


def test_lock_makes_a_second_holder_wait_and_says_so(tmp_path):
    import threading

    from spark_jobs.seams.delta import Lake

    lake = Lake(tmp_path / "lake")
    events: list[str] = []
    waiting = threading.Event()

    def second():
        with lake.lock("quality", log=lambda m: (events.append(m), waiting.set())):
            events.append("second holds")

    with lake.lock("quality"):
        events.append("first holds")
        thread = threading.Thread(target=second)
        thread.start()
        assert waiting.wait(10)
        events.append("first releases")
    thread.join(10)
    assert events == [
        "first holds",
        "waiting for another process to finish quality ...",
        "first releases",
        "second holds",
    ]
    with lake.lock("quality"):  # free again, and a different name never waits on it
        with lake.lock("lookup-accounts"):
            pass


@pytest.mark.parametrize("limit", [1_000, 1])  # the IN-list path and the scan path
def test_read_keys_returns_the_rows_of_the_values_with_the_asked_columns(lake, monkeypatch, limit):
    import spark_jobs.seams.delta as lake_module

    monkeypatch.setattr(lake_module, "KEY_LOOKUP_LIMIT", limit)
    lake.create("k", SCHEMA)
    lake.append("k", pa.table({"id": ["a", "b", "c"], "v": [1, 2, 3]}))
    got = lake.read_keys("k", "id", pa.array(["c", "a", "zz"]), columns=["v"])
    assert got.schema.names == ["v"] and sorted(got["v"].to_pylist()) == [1, 3]
    assert sorted(lake.read_keys("k", "v", pa.array([2]))["id"].to_pylist()) == ["b"]


def test_add_missing_columns_evolves_an_older_table(lake, table):
    wider = SCHEMA.append(pa.field("extra", pa.int64()))
    assert lake.add_missing_columns("t", wider) == ["extra"]
    assert lake.add_missing_columns("t", wider) == []
    assert rows(lake, "t") == [{"id": "a", "v": 1, "extra": None}, {"id": "b", "v": 2, "extra": None}]


def test_arrow_frame_keeps_the_rows_after_an_empty_record_batch(spark):
    from spark_jobs.seams.session import arrow_frame

    empty = pa.table({"id": pa.array([], pa.string()), "v": pa.array([], pa.int64())})
    table = pa.concat_tables(
        [pa.table({"id": ["a", "b"], "v": [1, 2]}), empty, pa.table({"id": ["c"], "v": [3]})]
    )
    assert [b.num_rows for b in table.to_batches()] == [2, 0, 1]
    assert sorted(r["id"] for r in arrow_frame(spark, table).collect()) == ["a", "b", "c"]


# --- writes through Delta's Spark integration ------------------------------------------------
def test_a_spark_frame_is_written_by_delta_spark_on_the_executors_once_per_txn(spark, lake):
    lake.create("t", SCHEMA)
    frame = spark.createDataFrame([("b", 2), ("a", 1)], "id string, v int")  # v is cast to the table's long
    assert lake.append("t", frame, txn=("app", 1)) == 1
    assert lake.append("t", frame, txn=("app", 1)) is None  # a replayed batch
    assert rows(lake, "t") == [{"id": "a", "v": 1}, {"id": "b", "v": 2}]
    assert lake.txn_version("t", "app") == 1 and lake.txn_version("t", "other") is None
    assert lake.commit("t", 1).operation == "WRITE"

    source = spark.createDataFrame(
        [("a", 10, False), ("b", None, True), ("c", 3, False), ("d", 4, True)],
        "id string, v long, gone boolean",
    )
    assert lake.merge("t", source, ["id"], delete_column="gone", txn=("app", 2)) == 2
    assert lake.merge("t", source, ["id"], delete_column="gone", txn=("app", 2)) is None
    assert rows(lake, "t") == [{"id": "a", "v": 10}, {"id": "c", "v": 3}]  # d: a delete of nothing
    assert lake.commit("t", 2).operation == "MERGE"
    assert changes(lake, "t", 2) == [
        (2, "delete", "b", 2),
        (2, "insert", "c", 3),
        (2, "update_postimage", "a", 10),
        (2, "update_preimage", "a", 1),
    ]

    assert lake.overwrite("t", spark.createDataFrame([("z", 26)], "id string, v long")) == 3
    assert rows(lake, "t") == [{"id": "z", "v": 26}]
    assert rows(lake, "t", 2) == [{"id": "a", "v": 10}, {"id": "c", "v": 3}]  # time travel


def test_a_spark_frame_with_other_columns_is_refused_before_anything_is_written(spark, lake):
    lake.create("t", SCHEMA)
    with pytest.raises(
        ValueError,
        match=r"append into t: columns do not match the table \(missing: \['v'\], unexpected: \['w'\]\)",
    ):
        lake.append("t", spark.createDataFrame([("a", 1)], "id string, w long"))
    assert lake.version("t") == 0
