"""Foreign-key, list and derive joins, rule by rule (DOMAIN.md §4-§6), through ``JoinJob.process``."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
from joinkit import (
    KEYED_PIPELINE,
    SECOND,
    T0,
    Feeder,
    changelog,
    derive_rows,
    fk_rows,
    jv,
    list_rows,
    model_derive,
    model_fk,
    model_list,
    produce,
    topic_history,
    write_config,
)

from spark_jobs.errors import UserError
from spark_jobs.joins import fk, state_store
from spark_jobs.joins.oracle import audit
from spark_jobs.joins.registry import job_for
from spark_jobs.lake import Lake
from spark_jobs.system_tables import QUARANTINE


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path, KEYED_PIPELINE)


def assert_oracle(spark, lake, cfg, name):
    report = audit(spark, lake, cfg, name)
    assert report.clean, report.text()


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


# --- config -----------------------------------------------------------------------------------------


def test_bad_foreign_key_and_element_expressions_are_user_errors_with_their_line(spark, tmp_path):
    base = "topics:\n  P: {partitions: 1}\n  M: {partitions: 1}\njoins:\n  j:\n    kind: fk\n    left: P\n    right: M\n"
    (tmp_path / "a.yaml").write_text(base + "    foreign_key: nosuch(left.m)\n    select: {a: left.v}\n")
    from spark_jobs.config import load_config

    cfg = load_config(tmp_path / "a.yaml")
    with pytest.raises(UserError, match=r"a.yaml:9: joins.j.foreign_key: .*nosuch"):
        job_for(spark, Lake(tmp_path / "lake"), cfg, cfg.join("j"), "q")
    text = (
        "topics:\n  P: {partitions: 1}\n  M: {partitions: 1}\njoins:\n  j:\n    kind: list\n    left: P\n"
        "    right: M\n    list: ids\n    elements: {a: right.nope.deeper}\n"
    )
    (tmp_path / "b.yaml").write_text(text)
    cfg = load_config(tmp_path / "b.yaml")
    with pytest.raises(UserError, match=r"b.yaml:10: joins.j.elements.a: "):
        job_for(spark, Lake(tmp_path / "lake2"), cfg, cfg.join("j"), "q")


# --- foreign-key join ---------------------------------------------------------------------------
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
    row = lake.read_arrow("join_metrics").filter(
        pc.equal(lake.read_arrow("join_metrics")["join"], "fk_inner")
    )
    assert row["null_keys"].to_pylist() == [2]
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


def test_fk_hot_key_is_recomputed_in_bounded_chunks(spark, lake, cfg, monkeypatch):
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

    monkeypatch.setattr(fk.FkJob, "_project", spy)
    produce(lake, cfg, "M", [("hot", jv(v="h2"), T0 + SECOND)])
    m = f.feed()
    # 18,000 subscribers, in five chunks (by a hash of the key) of at most 4,000
    assert len(sizes) == 5 and sum(sizes) == 18_000 and max(sizes) <= 4_000, sizes
    assert (m.affected_keys, m.upserted, m.deleted) == (18_000, 18_000, 0)
    table = lake.read_arrow("fk_inner")
    rv = dict(zip(table["lv"].to_pylist(), table["rv"].to_pylist(), strict=True))
    assert len(rv) == n and all(rv[str(i)] == ("h2" if i % 10 else "c1") for i in range(n))
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
    real_merge = lake.merge

    def crash_on_result(name, *args, **kwargs):
        if name == "fk_left":
            raise RuntimeError("killed")
        return real_merge(name, *args, **kwargs)

    monkeypatch.setattr(lake, "merge", crash_on_result)
    with pytest.raises(RuntimeError, match="killed"):
        f.feed()
    monkeypatch.setattr(lake, "merge", real_merge)
    f.restart()  # Spark reruns the failed batch
    f.replay_last()  # and running it once more changes nothing
    assert fk_rows(lake, "fk_left") == [("p1", "mug", "acme inc"), ("p2", "pen", "acme inc")]
    assert len(changelog(lake, cfg, "fk_left_changelog")) == 3
    assert_oracle(spark, lake, cfg, "fk_left")


# --- list join ----------------------------------------------------------------------------------
def test_list_keeps_order_and_duplicates_and_flags_unmatched_elements(spark, lake, cfg):
    feeders = {n: Feeder(spark, lake, cfg, n) for n in ("list_left", "list_inner")}
    produce(lake, cfg, "A", [("a1", jv(v="oslo"), T0), ("a2", jv(v="rome"), T0)])
    produce(
        lake,
        cfg,
        "PE",
        [("ann", jv(v="Ann", ids=["a2", "a9", "a1", "a2"]), T0), ("bob", jv(v="Bob", ids=[]), T0)],
    )
    m = feeders["list_left"].feed()
    feeders["list_inner"].feed()
    assert (m.elements_joined, m.elements_retracted, m.elements_kept) == (3, 0, 0)  # distinct (row, id)
    assert list_rows(lake, "list_left") == [
        (
            "ann",
            "Ann",
            [("a2", True, "rome"), ("a9", False, None), ("a1", True, "oslo"), ("a2", True, "rome")],
        ),
        ("bob", "Bob", []),
    ]
    assert list_rows(lake, "list_inner") == [
        ("ann", "Ann", [("a2", True, "rome"), ("a1", True, "oslo"), ("a2", True, "rome")]),
        ("bob", "Bob", []),
    ]
    for name in feeders:
        assert_oracle(spark, lake, cfg, name)


def test_list_right_records_arriving_before_or_after_the_left_row(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "list_left")
    produce(lake, cfg, "A", [("a1", jv(v="oslo"), T0)])
    produce(lake, cfg, "PE", [("ann", jv(v="Ann", ids=["a1", "a2"]), T0)])
    f.feed()
    assert list_rows(lake, "list_left") == [("ann", "Ann", [("a1", True, "oslo"), ("a2", False, None)])]
    produce(lake, cfg, "A", [("a2", jv(v="rome"), T0 + SECOND)])
    m = f.feed()
    assert (m.affected_keys, m.elements_joined, m.elements_kept) == (1, 1, 1)
    assert list_rows(lake, "list_left") == [("ann", "Ann", [("a1", True, "oslo"), ("a2", True, "rome")])]
    assert_oracle(spark, lake, cfg, "list_left")


def test_list_adding_and_removing_elements_joins_only_the_added_and_retracts_the_removed(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "list_left")
    produce(lake, cfg, "A", [(f"a{i}", jv(v=f"city{i}"), T0) for i in range(6)])
    produce(lake, cfg, "PE", [("ann", jv(v="Ann", ids=["a0", "a1", "a2", "a3"]), T0)])
    f.feed()
    produce(lake, cfg, "PE", [("ann", jv(v="Ann", ids=["a0", "a4", "a2", "a3"]), T0 + SECOND)])
    m = f.feed()
    assert (m.elements_joined, m.elements_retracted, m.elements_kept) == (1, 1, 3)
    assert list_rows(lake, "list_left") == [
        (
            "ann",
            "Ann",
            [("a0", True, "city0"), ("a4", True, "city4"), ("a2", True, "city2"), ("a3", True, "city3")],
        )
    ]
    produce(lake, cfg, "A", [("a1", jv(v="moved"), T0 + 2 * SECOND)])  # no longer in the list
    m = f.feed()
    assert (m.affected_keys, m.upserted, m.elements_joined) == (0, 0, 0)
    produce(lake, cfg, "PE", [("ann", jv(v="Ann B.", ids=["a0", "a4", "a2", "a3"]), T0 + 3 * SECOND)])
    m = f.feed()  # another left field changed: no element is joined again
    assert (m.upserted, m.elements_joined, m.elements_retracted, m.elements_kept) == (1, 0, 0, 4)
    assert list_rows(lake, "list_left")[0][1] == "Ann B."
    assert_oracle(spark, lake, cfg, "list_left")


def test_list_right_updated_and_deleted(spark, lake, cfg):
    feeders = {n: Feeder(spark, lake, cfg, n) for n in ("list_left", "list_inner")}
    produce(lake, cfg, "A", [("a1", jv(v="oslo"), T0), ("a2", jv(v="rome"), T0)])
    produce(
        lake, cfg, "PE", [("ann", jv(v="Ann", ids=["a1", "a2"]), T0), ("bob", jv(v="Bob", ids=["a2"]), T0)]
    )
    for f in feeders.values():
        f.feed()
    produce(lake, cfg, "A", [("a2", jv(v="roma"), T0 + SECOND), ("a1", None, T0 + SECOND)])
    m = feeders["list_left"].feed()
    feeders["list_inner"].feed()
    assert (m.affected_keys, m.elements_joined, m.elements_kept) == (2, 3, 0)
    assert list_rows(lake, "list_left") == [
        ("ann", "Ann", [("a1", False, None), ("a2", True, "roma")]),
        ("bob", "Bob", [("a2", True, "roma")]),
    ]
    assert list_rows(lake, "list_inner") == [
        ("ann", "Ann", [("a2", True, "roma")]),
        ("bob", "Bob", [("a2", True, "roma")]),
    ]
    for name in feeders:
        assert_oracle(spark, lake, cfg, name)


def test_list_left_delete_and_a_tombstone_for_a_never_seen_key(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "list_left")
    produce(lake, cfg, "A", [("a1", jv(v="oslo"), T0)])
    produce(lake, cfg, "PE", [("ann", jv(v="Ann", ids=["a1"]), T0)])
    f.feed()
    produce(lake, cfg, "PE", [("ann", None, T0 + SECOND), ("ghost", None, T0 + SECOND)])
    m = f.feed()
    assert (m.deleted, m.upserted, m.elements_retracted) == (1, 0, 1)
    assert list_rows(lake, "list_left") == []
    produce(lake, cfg, "A", [("a1", jv(v="bergen"), T0 + 2 * SECOND)])  # nobody holds a1 any more
    m = f.feed()
    assert (m.affected_keys, m.upserted) == (0, 0)
    assert_oracle(spark, lake, cfg, "list_left")


def test_list_object_elements_use_element_id_and_a_value_without_a_list_is_quarantined(spark, lake, tmp_path):
    from joinkit import write_config as wc

    cfg = wc(
        tmp_path,
        """
topics:
  PE: {partitions: 1}
  A: {partitions: 1}
joins:
  homes:
    kind: list
    left: PE
    right: A
    list: addresses
    element_id: ref.id
    select: {name: left.name}
    elements: {kind: element.kind, city: right.city}
""",
    )
    f = Feeder(spark, lake, cfg, "homes")
    produce(lake, cfg, "A", [("7", jv(city="Oslo"), T0)])
    produce(
        lake,
        cfg,
        "PE",
        [
            (
                "ann",
                jv(
                    name="Ann",
                    addresses=[{"kind": "home", "ref": {"id": 7}}, {"kind": "work", "ref": {"id": 8}}],
                ),
                T0,
            ),
            ("bob", jv(name="Bob", addresses="none"), T0),
            ("cy", jv(name="Cy"), T0),
        ],
    )
    m = f.feed()
    assert m.quarantined == 2
    rows = lake.read_arrow("homes").to_pylist()
    assert rows == [
        {
            "key": b"ann",
            "name": "Ann",
            "elements": [
                {"id": "7", "matched": True, "kind": "home", "city": "Oslo"},
                {"id": "8", "matched": False, "kind": "work", "city": None},
            ],
        }
    ]
    reasons = sorted(lake.read_arrow(QUARANTINE)["reason"].to_pylist())
    assert reasons == [
        "value has no list at 'addresses' (key 'bob')",
        "value has no list at 'addresses' (key 'cy')",
    ]
    assert_oracle(spark, lake, cfg, "homes")


# --- derive ---------------------------------------------------------------------------------------
def test_derive_follows_its_master_insert_update_delete(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "derive")
    produce(lake, cfg, "M", [("m1", jv(v="a@x", n=1), T0), ("m2", jv(v="b@x", n=2), T0)])
    f.feed()
    assert derive_rows(lake) == [("a@x", "m1", 1), ("b@x", "m2", 2)]
    produce(lake, cfg, "M", [("m1", jv(v="c@x", n=1), T0 + SECOND)])  # update: old row out, new in
    m = f.feed()
    assert (m.upserted, m.deleted) == (1, 1)
    assert derive_rows(lake) == [("b@x", "m2", 2), ("c@x", "m1", 1)]
    produce(lake, cfg, "M", [("m2", None, T0 + 2 * SECOND)])
    f.feed()
    assert derive_rows(lake) == [("c@x", "m1", 1)]
    assert_oracle(spark, lake, cfg, "derive")


def test_derive_never_deletes_a_row_a_newer_update_wrote(spark, lake, cfg):
    f = Feeder(spark, lake, cfg, "derive")
    produce(lake, cfg, "M", [("m1", jv(v="a@x", n=1), T0)])
    f.feed()
    # m2 takes a@x (newer) in the same batch in which m1 moves away from it
    produce(
        lake, cfg, "M", [("m2", jv(v="a@x", n=2), T0 + 2 * SECOND), ("m1", jv(v="z@x", n=1), T0 + SECOND)]
    )
    f.feed()
    assert derive_rows(lake) == [("a@x", "m2", 2), ("z@x", "m1", 1)]
    # and across batches: m3 takes z@x, then m1's older move away from z@x arrives late
    produce(lake, cfg, "M", [("m3", jv(v="z@x", n=3), T0 + 5 * SECOND)])
    f.feed()
    produce(lake, cfg, "M", [("m1", jv(v="y@x", n=1), T0 + 4 * SECOND)])
    f.feed()
    assert derive_rows(lake) == [("a@x", "m2", 2), ("y@x", "m1", 1), ("z@x", "m3", 3)]
    # two masters holding one value: the newest wins; when it leaves, the other one is the row again
    produce(lake, cfg, "M", [("m2", jv(v="y@x", n=2), T0 + 6 * SECOND)])
    f.feed()
    assert derive_rows(lake) == [("y@x", "m2", 2), ("z@x", "m3", 3)]
    produce(lake, cfg, "M", [("m2", None, T0 + 7 * SECOND)])
    f.feed()
    assert derive_rows(lake) == [("y@x", "m1", 1), ("z@x", "m3", 3)]
    assert derive_rows(lake) == model_derive(topic_history(lake, "M"))
    assert_oracle(spark, lake, cfg, "derive")


def test_models_agree_with_the_engine_on_a_mixed_history(spark, lake, cfg):
    names = ("fk_inner", "fk_left", "list_left", "list_inner", "derive")
    feeders = {n: Feeder(spark, lake, cfg, n) for n in names}
    produce(lake, cfg, "M", [("m1", jv(v="acme"), T0), ("m2", jv(v="bolt"), T0)])
    produce(lake, cfg, "P", [("p1", jv(v="mug", m="m1"), T0), ("p2", jv(v="pen", m="m3"), T0)])
    produce(lake, cfg, "A", [("a1", jv(v="oslo"), T0)])
    produce(lake, cfg, "PE", [("ann", jv(v="Ann", ids=["a1", "a2"]), T0)])
    for f in feeders.values():
        f.feed()
    p, m = topic_history(lake, "P"), topic_history(lake, "M")
    pe, a = topic_history(lake, "PE"), topic_history(lake, "A")
    assert fk_rows(lake, "fk_inner") == model_fk(p, m, "inner") == [("p1", "mug", "acme")]
    assert fk_rows(lake, "fk_left") == model_fk(p, m, "left")
    assert list_rows(lake, "list_left") == model_list(pe, a, "left")
    assert list_rows(lake, "list_inner") == model_list(pe, a, "inner")
    assert derive_rows(lake) == model_derive(m) == [("acme", "m1", None), ("bolt", "m2", None)]
