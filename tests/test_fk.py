"""The foreign-key join, rule by rule (docs/joins.md, "Foreign-key, list and derive joins"), through its real streaming query."""

from __future__ import annotations

import pytest
from joinkit import (
    KEYED_PIPELINE,
    SECOND,
    T0,
    Feeder,
    assert_oracle,
    changelog,
    crash_on_result_write,
    fk_rows,
    jv,
    produce,
    write_config,
)

from spark_jobs.joins import fk, state_store


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path, KEYED_PIPELINE)


def fk_changes(lake, name):
    feed = lake.changes_arrow(name).to_pylist()
    return sorted(
        (c["_change_type"], c["key"].decode(), c["lv"], c["rv"])
        for c in feed
        if c["_change_type"] != "update_preimage"
    )


def last_version_changes(lake, name):
    version = lake.version(name)
    feed = lake.changes_arrow(name, version, version).to_pylist()
    return sorted(
        (c["_change_type"], c["key"].decode()) for c in feed if c["_change_type"] != "update_preimage"
    )


def test_fk_left_before_right_and_right_before_left_both_end_joined(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "fk_inner")
    produce(lake, cfg, "P", [("p1", jv(v="mug", m="m1"), T0)])
    f.feed()
    assert fk_rows(lake, "fk_inner") == []  # nothing to join with yet
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0 + SECOND), ("m2", jv(v="bolt"), T0 + SECOND)])
    f.feed()
    assert fk_rows(lake, "fk_inner") == [("p1", "mug", "acme")]
    produce(lake, cfg, "P", [("p2", jv(v="pen", m="m2"), T0 + 2 * SECOND)])  # right was there first
    f.feed()
    assert fk_rows(lake, "fk_inner") == [("p1", "mug", "acme"), ("p2", "pen", "bolt")]
    assert_oracle(spark, lake, cfg, "fk_inner")


def test_fk_right_update_reemits_every_left_row_pointing_at_it_and_touches_no_other(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "fk_left")
    produce(lake, cfg, "P", [(f"p{i}", jv(v=f"item{i}", m="m1" if i < 5 else "m2"), T0) for i in range(8)])
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0), ("m2", jv(v="bolt"), T0)])
    f.feed()
    produce(lake, cfg, "M", [("m1", jv(v="acme inc"), T0 + SECOND)])
    m = f.feed()
    assert (m.affected_keys, m.upserted, m.deleted) == (5, 5, 0)  # the five subscribers, no scan
    assert last_version_changes(lake, "fk_left") == [("update_postimage", f"p{i}") for i in range(5)]
    assert fk_rows(lake, "fk_left") == sorted(
        [(f"p{i}", f"item{i}", "acme inc") for i in range(5)]
        + [(f"p{i}", f"item{i}", "bolt") for i in (5, 6, 7)]
    )
    published = changelog(lake, cfg, "fk_left_changelog")
    assert len(published) == 8 + 5
    assert_oracle(spark, lake, cfg, "fk_left")


def test_fk_change_moves_the_row_and_the_old_right_record_no_longer_affects_it(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "fk_inner")
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0), ("m2", jv(v="bolt"), T0)])
    produce(lake, cfg, "P", [("p1", jv(v="mug", m="m1"), T0)])
    f.feed()
    produce(lake, cfg, "P", [("p1", jv(v="mug", m="m2"), T0 + SECOND)])
    f.feed()
    assert fk_rows(lake, "fk_inner") == [("p1", "mug", "bolt")]
    produce(lake, cfg, "M", [("m1", jv(v="acme inc"), T0 + 2 * SECOND)])
    m = f.feed()
    assert (m.affected_keys, m.upserted, m.deleted) == (0, 0, 0)  # the stale subscription is skipped
    produce(lake, cfg, "M", [("m1", None, T0 + 3 * SECOND)])
    m = f.feed()
    assert (m.upserted, m.deleted) == (0, 0)
    assert fk_rows(lake, "fk_inner") == [("p1", "mug", "bolt")]
    assert_oracle(spark, lake, cfg, "fk_inner")


def test_fk_left_delete_and_right_delete_for_inner_and_left(spark, lake, cfg):
    feeders = {n: Feeder(spark, lake, cfg, n) for n in ("fk_inner", "fk_left")}
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0)])
    produce(lake, cfg, "P", [("p1", jv(v="mug", m="m1"), T0), ("p2", jv(v="pen", m="m1"), T0)])
    for f in feeders.values():
        f.feed()
    produce(lake, cfg, "P", [("p2", None, T0 + SECOND)])  # left delete
    produce(lake, cfg, "M", [("m1", None, T0 + SECOND)])  # right delete
    for f in feeders.values():
        f.feed()
    assert fk_rows(lake, "fk_inner") == []
    assert fk_rows(lake, "fk_left") == [("p1", "mug", None)]
    assert fk_changes(lake, "fk_inner") == [
        ("delete", "p1", "mug", "acme"),
        ("delete", "p2", "pen", "acme"),
        ("insert", "p1", "mug", "acme"),
        ("insert", "p2", "pen", "acme"),
    ]
    produce(lake, cfg, "M", [("m1", jv(v="acme again"), T0 + 2 * SECOND)])  # the right row comes back
    for f in feeders.values():
        f.feed()
    assert fk_rows(lake, "fk_inner") == fk_rows(lake, "fk_left") == [("p1", "mug", "acme again")]
    for name in feeders:
        assert_oracle(spark, lake, cfg, name)


def test_fk_null_foreign_key_is_counted_for_inner_and_emitted_with_a_null_right_side_for_left(
    spark, lake, cfg
):
    feeders = {n: Feeder(spark, lake, cfg, n) for n in ("fk_inner", "fk_left")}
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0)])
    produce(
        lake,
        cfg,
        "P",
        [("p1", jv(v="mug", m=None), T0), ("p2", jv(v="pen"), T0), ("p3", jv(v="cap", m="m1"), T0)],
    )
    metrics = {n: f.feed() for n, f in feeders.items()}
    assert metrics["fk_inner"].null_keys == 2 and metrics["fk_left"].null_keys == 2
    assert fk_rows(lake, "fk_inner") == [("p3", "cap", "acme")]
    assert fk_rows(lake, "fk_left") == [("p1", "mug", None), ("p2", "pen", None), ("p3", "cap", "acme")]
    for f in feeders.values():
        f.query.stop()  # a job's metrics rows reach join_metrics when it stops (or every 30 s)
    rows = lake.read_arrow("join_metrics", columns=["join", "null_keys"]).to_pylist()
    assert sorted((r["join"], r["null_keys"]) for r in rows) == [("fk_inner", 2), ("fk_left", 2)]
    for name in feeders:
        assert_oracle(spark, lake, cfg, name)


def test_fk_repeated_identical_updates_change_nothing(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "fk_left")
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0)])
    produce(lake, cfg, "P", [("p1", jv(v="mug", m="m1"), T0)])
    f.feed()
    versions = (lake.version("fk_left"), len(changelog(lake, cfg, "fk_left_changelog")))
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0 + SECOND)])
    produce(lake, cfg, "P", [("p1", jv(v="mug", m="m1"), T0 + SECOND)])
    m = f.feed()
    assert (m.upserted, m.deleted) == (0, 0)
    assert (lake.version("fk_left"), len(changelog(lake, cfg, "fk_left_changelog"))) == versions


def test_fk_hot_key_fans_out_on_the_executors_and_the_driver_pass_goes_in_bounded_chunks(
    spark, lake, cfg, monkeypatch
):
    monkeypatch.setattr(state_store, "CHUNK_KEYS", 4_000)
    f = Feeder(spark, lake, cfg, "fk_inner")
    n = 20_000
    produce(
        lake, cfg, "P", [(f"p{i:05d}", jv(v=str(i), m="hot" if i % 10 else "cold"), T0) for i in range(n)]
    )
    produce(lake, cfg, "M", [("hot", jv(v="h1"), T0), ("cold", jv(v="c1"), T0)])
    f.feed()
    sizes = []
    real = fk.FkJob._project

    def spy(self, rows, *args, **kwargs):
        sizes.append(rows.num_rows)
        return real(self, rows, *args, **kwargs)

    def right_values(expected_hot):
        table = lake.read_arrow("fk_inner")
        rv = dict(zip(table["lv"].to_pylist(), table["rv"].to_pylist(), strict=True))
        assert len(rv) == n and all(rv[str(i)] == (expected_hot if i % 10 else "c1") for i in range(n))

    monkeypatch.setattr(fk.FkJob, "_project", spy)
    produce(lake, cfg, "M", [("hot", jv(v="h2"), T0 + SECOND)])
    m = f.feed()
    assert sizes == []  # the 18,000 subscribers' rows are evaluated and merged by Spark, not the driver
    assert (m.affected_keys, m.upserted, m.deleted) == (18_000, 18_000, 0)
    right_values("h2")

    # the driver's pass (a batch whose select failed for some record) recomputes in bounded chunks
    def failed(*args, **kwargs):
        raise RuntimeError("select failed for some record")

    monkeypatch.setattr(state_store.StateStoreJob, "_write_on_executors", failed)
    monkeypatch.setattr(state_store, "is_data_error", lambda exc: isinstance(exc, RuntimeError))
    produce(lake, cfg, "M", [("hot", jv(v="h3"), T0 + 2 * SECOND)])
    m = f.feed()
    # 18,000 subscribers, in five chunks (by a hash of the key) of at most 4,000
    assert len(sizes) == 5 and sum(sizes) == 18_000 and max(sizes) <= 4_000, sizes
    assert (m.affected_keys, m.upserted, m.deleted) == (18_000, 18_000, 0)
    right_values("h3")
    assert_oracle(spark, lake, cfg, "fk_inner")


def test_fk_state_is_in_the_checkpoint_and_a_restarted_query_keeps_the_subscriptions(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "fk_inner")
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0), ("m2", jv(v="bolt"), T0)])
    for i in range(4):  # p1 moves between m1 and m2; p2 stays on m1
        produce(lake, cfg, "P", [("p1", jv(v=f"mug{i}", m="m1" if i % 2 else "m2"), T0 + i * SECOND)])
        f.feed()
    produce(lake, cfg, "P", [("p2", jv(v="pen", m="m1"), T0 + 5 * SECOND)])
    f.feed()
    assert [t for t in ("fk_inner__left", "fk_inner__subs", "fk_inner__right") if lake.exists(t)] == []
    f.restart()
    produce(lake, cfg, "M", [("m1", jv(v="acme inc"), T0 + 9 * SECOND)])
    m = f.feed()
    assert (m.affected_keys, m.upserted) == (2, 2)
    assert fk_rows(lake, "fk_inner") == [("p1", "mug3", "acme inc"), ("p2", "pen", "acme inc")]
    produce(lake, cfg, "M", [("m2", jv(v="bolt inc"), T0 + 9 * SECOND)])
    m = f.feed()
    assert (m.affected_keys, m.upserted) == (0, 0)  # p1 left m2
    assert_oracle(spark, lake, cfg, "fk_inner")


def test_fk_crash_between_commits_then_replay_gives_the_result_once(spark, lake, cfg, monkeypatch):
    f = Feeder(spark, lake, cfg, "fk_left")
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0)])
    produce(lake, cfg, "P", [("p1", jv(v="mug", m="m1"), T0)])
    f.feed()
    produce(lake, cfg, "M", [("m1", jv(v="acme inc"), T0 + SECOND)])
    produce(lake, cfg, "P", [("p2", jv(v="pen", m="m1"), T0 + SECOND)])
    crash = crash_on_result_write(monkeypatch, lake, "fk_left")
    with pytest.raises(RuntimeError, match="killed"):
        f.feed()
    crash.undo()
    f.restart()  # Spark reruns the failed batch
    f.replay_last()  # and running it once more changes nothing
    assert fk_rows(lake, "fk_left") == [("p1", "mug", "acme inc"), ("p2", "pen", "acme inc")]
    assert len(changelog(lake, cfg, "fk_left_changelog")) == 3
    assert_oracle(spark, lake, cfg, "fk_left")
