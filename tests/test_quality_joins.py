"""Quality suites for the foreign-key and list joins: completeness over foreign keys and list elements,
and the right topic's placement that a Kafka Streams fk or list join relies on, on purpose-built
data with the exact findings."""

from __future__ import annotations

import uuid
import zlib

import pytest
from topickit import produce_lines

from spark_jobs.config import load_config
from spark_jobs.errors import UserError
from spark_jobs.quality.run import run_suites
from spark_jobs.quality.suites import load_suite
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.partitioners import partition_for

CONFIG = """
topics:
  products: {partitions: 3}
  merchants: {partitions: 2}
  persons: {partitions: 2}
  households: {partitions: 2}
  addresses: {partitions: 3}
lookups:
  merchants: {topic: merchants, joined_with: [products]}
  addresses: {topic: addresses, joined_with: [persons]}
joins:
  display: {kind: fk, left: products, right: merchants, foreign_key: merchant_id, type: left,
            select: {title: left.title}}
  people: {kind: list, left: persons, right: addresses, list: address_ids, select: {name: left.name},
           elements: {city: right.city}, as: addresses}
quality:
  suites:
    joins: suite.yaml
"""
SUITE = """
suite: joins
checks:
  - completeness: {join: display}
  - completeness: {join: people}
  - completeness: {stream: households, lookup: addresses, list: members, element_id: address.id}
  - co_partitioning: {join: display}
"""


class Topics:
    """Records on Kafka, one transaction per put, with the partition and offset each one got (a
    transaction's commit marker takes the next offset of every partition it wrote)."""

    def __init__(self, lake, config):
        self.lake, self.config = lake, config
        self.next: dict[tuple[str, int], int] = {}
        self.at: dict[tuple[str, str], list[tuple[int, int]]] = {}

    def put(self, topic: str, lines: list[tuple[str, str | None]], partitioner: str = "murmur2") -> None:
        spec = self.config.topic(topic)
        text = b"".join(f"{k}|{'' if v is None else v}\n".encode() for k, v in lines)
        produce_lines(self.lake, self.config, topic, text, partitioner=partitioner)
        written = set()
        for key, _ in lines:
            if partitioner == "murmur2":
                p = partition_for(key.encode(), spec.partitions)
            else:
                p = zlib.crc32(key.encode()) % spec.partitions
            o = self.next.get((topic, p), 0)
            self.next[(topic, p)] = o + 1
            self.at.setdefault((topic, key), []).append((p, o))
            written.add(p)
        for p in written:  # the commit marker
            self.next[(topic, p)] += 1

    def ref(self, topic: str, *refs: tuple[str, int]) -> str:
        """'first at partition P offset O, last at ...' over the given (key, version index) records."""
        places = sorted(self.at[(topic, key)][i] for key, i in refs)
        (fp, fo), (lp, lo) = places[0], places[-1]
        return f"first at partition {fp} offset {fo}, last at partition {lp} offset {lo}"


@pytest.fixture(scope="module")
def checked(spark, tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:  # the module's topics, apart from every test's
        env.setenv("LAKE_KAFKA_TOPIC_PREFIX", f"quality-joins-{uuid.uuid4().hex[:8]}.")
        return _checked(spark, tmp_path_factory)


def _checked(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("quality-joins")
    (root / "p.yaml").write_text(CONFIG)
    (root / "suite.yaml").write_text(SUITE)
    config = load_config(root / "p.yaml")
    lake = Lake(root / "lake")
    t = Topics(lake, config)
    t.put(
        "products",
        [
            ("p1", '{"title":"a","merchant_id":"m1"}'),
            ("p2", '{"title":"b","merchant_id":"m9"}'),  # moves to m1 below: m9 is no longer referenced
            ("p3", '{"title":"c","merchant_id":"m7"}'),
            ("p4", '{"title":"d","merchant_id":"m7"}'),
            ("p5", '{"title":"e"}'),  # no merchant: references nothing
            ("p6", '{"title":"f","merchant_id":"m8"}'),  # deleted below: references nothing
            ("p7", '{"title":"g","merchant_id":"m2"}'),  # the lookup's m2 has a BOM
        ],
    )
    t.put("products", [("p2", '{"title":"b","merchant_id":"m1"}'), ("p6", None)])
    # merchants written kcat-style: m1 lands where CRC32 puts it
    t.put("merchants", [("m1", '{"name":"One"}')], partitioner="consistent_random")
    t.put("merchants", [("\ufeffm2", '{"name":"Two"}'), ("m3", '{"name":"Three"}')])
    t.put(
        "persons",
        [
            ("ann", '{"name":"Ann","address_ids":["a1","a4","a4","a5"]}'),  # a4 twice: counts once
            ("bob", '{"name":"Bob","address_ids":["a4"]}'),
            ("cid", '{"name":"Cid","address_ids":[]}'),  # references nothing
            ("dan", '{"name":"Dan","address_ids":"a1"}'),  # not a list
            ("eve", '{"name":"Eve"}'),  # no list at all
        ],
    )
    t.put(
        "households",
        [
            ("h1", '{"members":[{"address":{"id":"a1"}},{"address":{"id":"a6"}},{"address":{}}]}'),
            ("h1", '{"members":[{"address":{"id":"a6"}}]}'),  # every record of a stream counts
        ],
    )
    t.put("addresses", [("a1", '{"city":"X"}'), ("a2", '{"city":"Y"}')])
    report = run_suites(spark, lake, config, report_dir=root / "reports", log=lambda m: None)
    return config, report, t, root


def result(report, check: str, start: str):
    found = [r for r in report.results if r.check == check and r.expectation.startswith(start)]
    assert len(found) == 1, [(r.check, r.expectation) for r in report.results]
    return found[0]


def test_fk_completeness_counts_each_products_current_merchant(checked):
    _, report, t, _ = checked
    r = result(report, "completeness:display:products->merchants", "Every foreign key")
    assert (
        r.expectation
        == "Every foreign key that products references exists in lookup merchants (join display)."
    )
    assert (r.success, r.offending_total) == (False, 2)
    assert r.offending == [
        f"m2 (referenced by 1 record(s) of products (keys p7), {t.ref('products', ('p7', 0))}; merchants has "
        "a key that differs from it only in invisible bytes (hex efbbbf6d32))",
        f"m7 (referenced by 2 record(s) of products (keys p3, p4), {t.ref('products', ('p3', 0), ('p4', 0))})",
    ]
    shape = result(report, "completeness:display:products->merchants", "Every record")
    assert (shape.success, shape.offending) == (True, [])


def test_list_completeness_counts_every_element_once_per_list(checked):
    _, report, t, _ = checked
    r = result(report, "completeness:people:persons->addresses", "Every list element")
    assert (r.success, r.offending_total) == (False, 2)
    assert r.offending == [
        f"a4 (referenced by 2 record(s) of persons (keys ann, bob), {t.ref('persons', ('ann', 0), ('bob', 0))})",
        f"a5 (referenced by 1 record(s) of persons (keys ann), {t.ref('persons', ('ann', 0))})",
    ]
    shape = result(report, "completeness:people:persons->addresses", "Every record")
    assert shape.expectation == "Every record of persons holds a list at 'address_ids' (join people)."
    (dp, do), (ep, eo) = t.at[("persons", "dan")][0], t.at[("persons", "eve")][0]
    assert shape.offending == [
        f"dan: the record at partition {dp} offset {do} of persons has no list at 'address_ids' "
        "(the join quarantines it)",
        f"eve: the record at partition {ep} offset {eo} of persons has no list at 'address_ids' "
        "(the join quarantines it)",
    ]


def test_list_completeness_follows_an_element_id_path_over_every_record(checked):
    _, report, t, _ = checked
    r = result(report, "completeness:households->addresses", "Every list element")
    assert r.offending == [
        f"a6 (referenced by 2 record(s) of households (keys h1), {t.ref('households', ('h1', 0), ('h1', 1))})"
    ]


def test_fk_join_placement_names_the_kcat_placed_merchant(checked):
    _, report, _, _ = checked
    r = result(report, "co_partitioning:display", "Every key")
    assert "where join display (fk) sends its subscriptions" in r.expectation
    kcat, java = zlib.crc32(b"m1") % 2, partition_for(b"m1", 2)
    assert kcat != java
    assert (r.success, r.offending) == (
        False,
        [f"m1: in merchants at partition {kcat} but murmur2 places it in {java}"],
    )


def test_bad_completeness_settings_are_one_line_errors(checked, tmp_path):
    config, _, _, _ = checked
    cases = {
        "completeness: {join: nope}": "checks.0.completeness.join: must name a join",
        "completeness: {join: display, stream: products}": "checks.0.completeness.stream: with join, the join says",
        "completeness: {stream: products, lookup: merchants, foreign_key: a, list: b}": "give either foreign_key or list",
        "completeness: {stream: products, lookup: merchants, element_id: a}": "element_id needs list",
        "co_partitioning: {join: nope}": "checks.0.co_partitioning.join: must name a join",
    }
    for check, words in cases.items():
        path = tmp_path / "s.yaml"
        path.write_text(f"suite: s\nchecks:\n  - {check}\n")
        with pytest.raises(UserError, match=words):
            load_suite(path, config)


def test_a_foreign_key_that_names_no_field_is_found(spark, tmp_path):
    (tmp_path / "p.yaml").write_text(
        CONFIG.replace("foreign_key: merchant_id", "foreign_key: merchant").replace(
            "joins: suite.yaml", "j: s.yaml"
        )
    )
    (tmp_path / "s.yaml").write_text("suite: j\nchecks:\n  - completeness: {join: display}\n")
    config = load_config(tmp_path / "p.yaml")
    lake = Lake(tmp_path / "lake")
    t = Topics(lake, config)
    t.put("products", [("p1", '{"merchant_id":"m1"}'), ("p2", '{"merchant_id":"m2"}')])
    t.put("merchants", [("m1", "{}")])
    report = run_suites(spark, lake, config, report_dir=tmp_path / "r", log=lambda m: None)
    shape = result(report, "completeness:display:products->merchants", "Every record")
    assert shape.offending == [
        "none of the 2 current record(s) of products has a value at foreign_key 'merchant': "
        "does it name a field of the value?"
    ]
    done = result(report, "completeness:display:products->merchants", "Every foreign key")
    assert (done.success, done.offending_total) == (True, 0)
