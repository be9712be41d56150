"""Poison pills: a record on which a join's ``select`` fails at run time is quarantined, and the join
goes on (``spark_jobs.joins.poison``)."""

from __future__ import annotations

import json

import pytest

from spark_jobs.seams import partitioners
from spark_jobs.testing import PipelineTestDriver

PIPELINE = """
pipeline: poison
topics:
  orders: {partitions: 2}
  customers: {partitions: 2}
  products: {partitions: 2}
  merchants: {partitions: 2}
joins:
  enriched:               # a table join; the coalesce makes a column Spark calls non-nullable
    kind: table
    left: orders
    right: customers
    type: left
    select: {n: cast(left.n as int), level: "coalesce(cast(right.level as int), 0)"}
    publish: true
  display:                # a foreign-key join
    kind: fk
    left: products
    right: merchants
    foreign_key: merchant_id
    type: left
    select: {title: left.title, rating: cast(right.rating as int)}
"""


@pytest.fixture
def driver(spark, tmp_path):
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    with PipelineTestDriver(tmp_path / "pipeline.yaml", root=tmp_path / "lake", spark=spark) as d:
        yield d


def where(topic: str, key: str) -> str:
    return f"{topic}[{partitioners.partition_for(key.encode(), 2, 'murmur2')}]"


def offset_of(key: str, piped_before: list[str]) -> int:
    """A record's offset in a 2-partition topic: the records piped before it into its partition."""
    return sum(where("t", k) == where("t", key) for k in piped_before)


def test_a_failing_select_quarantines_the_record_keeps_the_result_and_the_join_goes_on(driver):
    d = driver
    d.pipe("orders", key="o1", value={"n": "1"}, timestamp=1)
    d.pipe("orders", key="o2", value={"n": "abc"}, timestamp=1)  # cast('abc' AS int) fails
    d.pipe("orders", key="o3", value={"n": "3"}, timestamp=1)
    d.pipe("customers", key="o3", value={"level": "gold"}, timestamp=1)  # fails on the right side
    d.advance()
    assert d.changes("enriched") == d.changelog("enriched") == [("o1", {"n": 1, "level": 0}, 1)]
    cast = '[CAST_INVALID_INPUT] The value \'{}\' of the type "STRING" cannot be cast to "INT" because it is malformed. Correct the value as per the syntax, or change its target type.'
    assert sorted(d.quarantined("enriched")) == sorted(
        [
            (
                where("orders", "o2"),
                offset_of("o2", ["o1"]),
                "select failed on the left record of result key 'o2': " + cast.format("abc"),
            ),
            (
                where("customers", "o3"),
                0,
                "select failed on the right record of result key 'o3': " + cast.format("gold"),
            ),
        ]
    )

    d.pipe("orders", key="o1", value={"n": "one"}, timestamp=2)  # a poisoned update: o1 stays as it was
    d.pipe("customers", key="o3", value={"level": "2"}, timestamp=2)  # the right side mends o3
    d.advance()
    assert d.changes("enriched") == [("o3", {"n": 3, "level": 2}, 2)]
    assert [reason.split(":")[0] for _, _, reason in d.quarantined("enriched")] == [
        "select failed on the left record of result key 'o1'"
    ]
    assert d.table("enriched") == {"o1": {"n": 1, "level": 0}, "o3": {"n": 3, "level": 2}}

    d.pipe("orders", key="o3", value=None, timestamp=3)  # a delete of a row with a non-nullable column
    d.advance()
    assert d.changes("enriched") == [("o3", None, 2)]  # the deleted row's time
    assert d.changelog("enriched") == [("o3", None, 3)]  # the tombstone's: the deleting record's
    assert d.quarantined("enriched") == []


def test_a_poisoned_right_record_of_a_foreign_key_join_leaves_its_products_as_they_were(driver):
    d = driver
    d.pipe("merchants", key="m1", value={"rating": "5"}, timestamp=1)
    d.pipe("products", key="p1", value={"title": "Hammer", "merchant_id": "m1"}, timestamp=1)
    d.pipe("products", key="p2", value={"title": "Saw", "merchant_id": "m1"}, timestamp=1)
    d.advance()
    assert sorted(d.changes("display")) == [
        ("p1", {"title": "Hammer", "rating": 5}, 1),
        ("p2", {"title": "Saw", "rating": 5}, 1),
    ]
    d.pipe("merchants", key="m1", value={"rating": "five"}, timestamp=2)
    d.pipe("products", key="p3", value={"title": "Drill", "merchant_id": "m2"}, timestamp=2)
    d.advance()
    assert d.changes("display") == [("p3", {"title": "Drill", "rating": None}, 2)]
    assert sorted((s, o, r.split(":")[0]) for s, o, r in d.quarantined("display")) == [
        (where("merchants", "m1"), 1, "select failed on the right record of result key 'p1'"),
        (where("merchants", "m1"), 1, "select failed on the right record of result key 'p2'"),
    ]
    assert d.table("display") == {
        "p1": {"title": "Hammer", "rating": 5},
        "p2": {"title": "Saw", "rating": 5},
        "p3": {"title": "Drill", "rating": None},
    }


def test_lake_audit_leaves_out_and_names_the_keys_the_select_fails_on(spark, tmp_path, capsys):
    """Through the CLI: the fk join's audit with a poisoned merchant compares every other key and
    names the two products it could not compare, instead of failing on the select itself."""
    from spark_jobs.cli import main

    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    opts = ["--root", str(tmp_path / "lake"), "--config", str(tmp_path / "pipeline.yaml")]
    (tmp_path / "merchants.txt").write_text('m1;{"rating":"5"}\nm2;{"rating":"4"}\n')
    (tmp_path / "products.txt").write_text(
        'p1;{"title":"Hammer","merchant_id":"m1"}\np2;{"title":"Saw","merchant_id":"m1"}\n'
        'p3;{"title":"Drill","merchant_id":"m2"}\n'
    )
    (tmp_path / "poison.txt").write_text('m1;{"rating":"five"}\n')
    for topic, path in (("merchants", "merchants.txt"), ("products", "products.txt")):
        assert main([*opts, "produce", topic, str(tmp_path / path), "-K", ";"]) == 0
    assert main([*opts, "run", "display", "--once"]) == 0
    assert main([*opts, "produce", "merchants", str(tmp_path / "poison.txt"), "-K", ";"]) == 0
    assert main([*opts, "run", "display", "--once"]) == 0
    capsys.readouterr()
    assert main([*opts, "audit", "display"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "audit display: 3 result rows, 1 expected by the batch join of products up to offsets [4, 0], "
        "merchants up to offsets [4, 2] (2 key(s) not compared, as the select fails on their records, "
        "which the join quarantines: p1, p2): identical"
    ]
    assert main([*opts, "audit", "display", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "join": "display",
        "clean": True,
        "expected_rows": 1,
        "actual_rows": 3,
        "differing_keys": [],
        "not_compared_keys": ["p1", "p2"],
        "unordered_keys": [],
        "unordered_columns": [
            "timestamp",
            "left_partition",
            "left_offset",
            "right_partition",
            "right_offset",
        ],
        "read": "products up to offsets [4, 0], merchants up to offsets [4, 2]",
    }
