"""The list join's scenarios as a peer list-join project tests its topology: each through
``PipelineTestDriver`` (the public test driver), graded on what the join publishes to its changelog
topic, with the exact records expected in order. A person holds a list of address ids; the result is
the person with each address enriched (``matched`` says whether the address exists)."""

from __future__ import annotations

import pytest

from spark_jobs.testing import PipelineTestDriver

PIPELINE = """
pipeline: list-scenarios
topics:
  persons: {partitions: 2}
  addresses: {partitions: 3}
joins:
  people:
    kind: list
    left: persons
    right: addresses
    list: address_ids
    select: {name: left.name}
    elements: {city: right.city}
    as: addresses
    publish: true
"""


@pytest.fixture
def d(spark, tmp_path):
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    with PipelineTestDriver(tmp_path / "pipeline.yaml", root=tmp_path / "lake", spark=spark) as driver:
        yield driver


def person(name: str, *ids: str) -> dict:
    return {"name": name, "address_ids": list(ids)}


def at(address: str, city: str | None) -> dict:
    return {"id": address, "matched": city is not None, "city": city}


def result(name: str, *addresses: dict) -> dict:
    return {"name": name, "addresses": list(addresses)}


def step(d: PipelineTestDriver) -> list:
    """One advance; what the join published to its changelog topic, which here always equals what it
    wrote to its result table."""
    d.advance()
    published = d.changelog("people")
    assert sorted(d.changes("people"), key=str) == sorted(published, key=str)
    return published


def test_the_addresses_arrive_before_the_person(d):
    d.pipe("addresses", key="a1", value={"city": "Oslo"}, timestamp=1)
    d.pipe("addresses", key="a2", value={"city": "Bergen"}, timestamp=1)
    assert step(d) == []  # nobody references them yet
    d.pipe("persons", key="ann", value=person("Ann", "a2", "a1"), timestamp=2)
    assert step(d) == [("ann", result("Ann", at("a2", "Bergen"), at("a1", "Oslo")), 2)]


def test_the_person_arrives_before_the_addresses(d):
    d.pipe("persons", key="ann", value=person("Ann", "a1", "a2"), timestamp=1)
    assert step(d) == [("ann", result("Ann", at("a1", None), at("a2", None)), 1)]
    d.pipe("addresses", key="a2", value={"city": "Bergen"}, timestamp=2)
    assert step(d) == [("ann", result("Ann", at("a1", None), at("a2", "Bergen")), 2)]
    d.pipe("addresses", key="a1", value={"city": "Oslo"}, timestamp=3)
    assert step(d) == [("ann", result("Ann", at("a1", "Oslo"), at("a2", "Bergen")), 3)]
    assert d.table("people") == {"ann": result("Ann", at("a1", "Oslo"), at("a2", "Bergen"))}


def test_elements_added_to_and_removed_from_the_list(d):
    for key, city in (("a1", "Oslo"), ("a2", "Bergen"), ("a3", "Tromsø")):
        d.pipe("addresses", key=key, value={"city": city}, timestamp=1)
    d.pipe("persons", key="ann", value=person("Ann", "a1"), timestamp=1)
    assert step(d) == [("ann", result("Ann", at("a1", "Oslo")), 1)]
    d.pipe("persons", key="ann", value=person("Ann", "a1", "a3", "a2"), timestamp=2)  # two added
    assert step(d) == [("ann", result("Ann", at("a1", "Oslo"), at("a3", "Tromsø"), at("a2", "Bergen")), 2)]
    d.pipe("persons", key="ann", value=person("Ann", "a2"), timestamp=3)  # a1 and a3 removed
    assert step(d) == [("ann", result("Ann", at("a2", "Bergen")), 3)]
    d.pipe("persons", key="ann", value=person("Ann"), timestamp=4)  # an empty list keeps the person
    assert step(d) == [("ann", result("Ann"), 4)]
    # a removed address changing no longer touches the person
    d.pipe("addresses", key="a1", value={"city": "Drammen"}, timestamp=5)
    assert step(d) == []


def test_another_field_of_the_person_changes(d):
    d.pipe("addresses", key="a1", value={"city": "Oslo"}, timestamp=1)
    d.pipe("persons", key="ann", value=person("Ann", "a1", "a9"), timestamp=1)
    assert step(d) == [("ann", result("Ann", at("a1", "Oslo"), at("a9", None)), 1)]
    d.pipe("persons", key="ann", value=person("Anne", "a1", "a9"), timestamp=2)
    assert step(d) == [("ann", result("Anne", at("a1", "Oslo"), at("a9", None)), 2)]
    # the same value again: published again (as Kafka Streams' joins forward every left update), while
    # the result table, already holding it, does not change; its time is still the value's (2)
    d.pipe("persons", key="ann", value=person("Anne", "a1", "a9"), timestamp=3)
    d.advance()
    assert d.changelog("people") == [("ann", result("Anne", at("a1", "Oslo"), at("a9", None)), 2)]
    assert d.changes("people") == []


def test_an_address_is_updated_then_deleted_for_every_person_listing_it(d):
    d.pipe("addresses", key="a1", value={"city": "Oslo"}, timestamp=1)
    d.pipe("persons", key="ann", value=person("Ann", "a1"), timestamp=1)
    d.pipe("persons", key="bob", value=person("Bob", "a1", "a1"), timestamp=1)  # listed twice
    d.pipe("persons", key="cy", value=person("Cy"), timestamp=1)
    assert sorted(step(d)) == [
        ("ann", result("Ann", at("a1", "Oslo")), 1),
        ("bob", result("Bob", at("a1", "Oslo"), at("a1", "Oslo")), 1),
        ("cy", result("Cy"), 1),
    ]
    d.pipe("addresses", key="a1", value={"city": "Oslo sentrum"}, timestamp=2)
    assert sorted(step(d)) == [
        ("ann", result("Ann", at("a1", "Oslo sentrum")), 2),
        ("bob", result("Bob", at("a1", "Oslo sentrum"), at("a1", "Oslo sentrum")), 2),
    ]
    d.pipe("addresses", key="a1", value=None, timestamp=3)  # deleted: the elements stay, unmatched
    assert sorted(step(d)) == [
        # the address's tombstone is the latest input of both rows
        ("ann", result("Ann", at("a1", None)), 3),
        ("bob", result("Bob", at("a1", None), at("a1", None)), 3),
    ]


def test_the_person_is_deleted_and_a_tombstone_for_a_person_never_seen_is_forwarded(d):
    d.pipe("addresses", key="a1", value={"city": "Oslo"}, timestamp=1)
    d.pipe("persons", key="ann", value=person("Ann", "a1"), timestamp=1)
    assert step(d) == [("ann", result("Ann", at("a1", "Oslo")), 1)]
    d.pipe("persons", key="ann", value=None, timestamp=2)
    d.pipe("persons", key="zed", value=None, timestamp=2)  # never seen
    d.advance()
    assert d.changelog("people") == [("ann", None, 2), ("zed", None, 2)]  # the tombstones' own times
    assert d.changes("people") == [("ann", None, 1)]  # the table had no row for zed; ann's was of 1
    assert d.table("people") == {}
    d.pipe("persons", key="ann", value=None, timestamp=3)  # deleted already: no second tombstone
    assert step(d) == []
    # the deleted person's address changing emits nothing; the person coming back is joined afresh
    d.pipe("addresses", key="a1", value={"city": "Bergen"}, timestamp=4)
    assert step(d) == []
    d.pipe("persons", key="ann", value=person("Ann", "a1"), timestamp=5)
    assert step(d) == [("ann", result("Ann", at("a1", "Bergen")), 5)]
