"""The list join, rule by rule (docs/joins.md, "Foreign-key, list and derive joins"), through its real streaming query."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from joinkit import (
    KEYED_PIPELINE,
    SECOND,
    T0,
    Feeder,
    assert_oracle,
    jv,
    list_rows,
    produce,
    write_config,
)

from spark_jobs.system_tables import QUARANTINE


@pytest.fixture
def cfg(tmp_path):
    return write_config(tmp_path, KEYED_PIPELINE)


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
            "timestamp": datetime.fromtimestamp(T0 / 1000, UTC),  # the person's and the addresses'
            "left_partition": 0,  # the person's record, and each address's (8 has none)
            "left_offset": 0,
            "element_sources": [
                {"id": "7", "partition": 0, "offset": 0},
                {"id": "8", "partition": None, "offset": None},
            ],
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
