"""``PipelineTestDriver``: a pipeline file's joins driven record by record, without a broker."""

from __future__ import annotations

import pytest

from spark_jobs.errors import UserError
from spark_jobs.testing import PipelineTestDriver

PIPELINE = """
pipeline: driver-test
topics:
  products: {partitions: 3}
  merchants: {partitions: 2}
joins:
  display:            # KIP-213: products enriched with their merchant, a left foreign-key join
    kind: fk
    left: products
    right: merchants
    foreign_key: merchant_id
    type: left
    select: {title: left.title, merchant: right.name}
    publish: true
  shelf:              # reads display's changelog topic
    kind: table
    left: display_changelog
    right: products
    type: inner
    select: {merchant: left.merchant, title: right.title}
"""


def product(title: str, merchant: str) -> dict:
    return {"title": title, "merchant_id": merchant}


@pytest.fixture
def driver(spark, tmp_path):
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    with PipelineTestDriver(tmp_path / "pipeline.yaml", root=tmp_path / "lake", spark=spark) as d:
        yield d


def test_the_fk_join_step_by_step_with_its_changelog_and_a_join_reading_it(driver):
    """Every output record carries its result's event time, as Kafka Streams gives it: the latest of
    its inputs' value times (a right tombstone's too); a changelog tombstone, its deleting record's."""
    d = driver
    d.pipe("merchants", key="m1", value={"name": "Acme"}, timestamp=1000)
    d.pipe("products", key="p1", value=product("Hammer", "m1"), timestamp=1000)
    d.pipe("products", key="p2", value=product("Saw", "m2"), timestamp=1000)  # m2 is not known yet
    d.advance()
    first = [
        ("p1", {"title": "Hammer", "merchant": "Acme"}, 1000),
        ("p2", {"title": "Saw", "merchant": None}, 1000),
    ]
    assert sorted(d.changes("display")) == first
    assert sorted(d.changelog("display")) == first
    assert d.changes("shelf") == []  # it sees display's changelog at the next advance

    d.pipe("merchants", key="m2", value={"name": "Bolt"}, timestamp=2000)
    d.advance()
    assert (
        d.changes("display") == d.changelog("display") == [("p2", {"title": "Saw", "merchant": "Bolt"}, 2000)]
    )
    assert sorted(d.changes("shelf")) == [  # display's changelog records of the first advance, at 1000
        ("p1", {"merchant": "Acme", "title": "Hammer"}, 1000),
        ("p2", {"merchant": None, "title": "Saw"}, 1000),
    ]

    d.pipe("products", key="p1", value=product("Hammer", "m2"), timestamp=3000)  # the foreign key moves
    d.advance()
    p1 = d.changelog("display")
    assert d.changes("display") == p1 == [("p1", {"title": "Hammer", "merchant": "Bolt"}, 3000)]
    assert p1[0].key == "p1" and p1[0].timestamp == 3000  # records have named fields too
    assert sorted(d.changes("shelf")) == [
        # p1's columns are the same, but its right record is newer: the row's time moves
        ("p1", {"merchant": "Acme", "title": "Hammer"}, 3000),
        ("p2", {"merchant": "Bolt", "title": "Saw"}, 2000),
    ]

    d.pipe("merchants", key="m2", value=None, timestamp=4000)  # both products lose their merchant
    d.advance()
    gone = [
        ("p1", {"title": "Hammer", "merchant": None}, 4000),
        ("p2", {"title": "Saw", "merchant": None}, 4000),
    ]
    assert sorted(d.changes("display")) == sorted(d.changelog("display")) == gone

    d.pipe("products", key="p1", value=None, timestamp=5000)
    d.pipe("products", key="ghost", value=None, timestamp=5000)  # a key the join never saw: nothing
    d.advance()
    assert d.changelog("display") == [("p1", None, 5000)]  # a tombstone, at its deleting record's time
    assert d.changes("display") == [("p1", None, 4000)]  # the table's delete: the row's last time
    assert sorted(d.changes("shelf"), key=lambda c: c[0]) == [
        ("p1", None, 3000),
        ("p2", {"merchant": None, "title": "Saw"}, 4000),
    ]
    assert d.table("display") == {"p2": {"title": "Saw", "merchant": None}}
    assert d.table("shelf") == {"p2": {"merchant": None, "title": "Saw"}}


def test_an_advance_with_nothing_piped_changes_nothing_and_names_are_checked(driver):
    d = driver
    d.advance()
    assert d.changes("display") == [] and d.changelog("display") == [] and d.table("display") == {}
    with pytest.raises(UserError, match="unknown topic 'orders'"):
        d.pipe("orders", key="o1", value={})
    with pytest.raises(UserError, match="unknown join 'nope'"):
        d.changes("nope")
    with pytest.raises(UserError, match="join shelf does not publish a changelog"):
        d.changelog("shelf")


INNER_PIPELINE = """
pipeline: driver-inner-test
topics:
  products: {partitions: 2}
  merchants: {partitions: 2}
joins:
  display:
    kind: fk
    left: products
    right: merchants
    foreign_key: merchant_id
    type: inner
    select: {title: left.title, merchant: right.name}
    publish: true
"""


def test_an_inner_join_publishes_a_tombstone_for_a_deleted_key_it_never_emitted(spark, tmp_path):
    (tmp_path / "pipeline.yaml").write_text(INNER_PIPELINE)
    with PipelineTestDriver(tmp_path / "pipeline.yaml", root=tmp_path / "lake", spark=spark) as d:
        d.pipe("products", key="p1", value={"title": "Saw", "merchant_id": "m9"}, timestamp=1)  # no m9
        d.advance()
        assert d.changes("display") == d.changelog("display") == []
        d.pipe("products", key="p1", value=None, timestamp=2)
        d.advance()
        assert d.changes("display") == []  # the result never held p1
        assert d.changelog("display") == [("p1", None, 2)]  # as Kafka Streams' foreign-key join sends
