"""``PipelineTestDriver``: a pipeline file's joins driven record by record, without a broker."""

from __future__ import annotations

import time

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


def test_a_steady_micro_batch_compiles_no_new_code(driver, spark):
    """Spark compiles a class per distinct piece of generated code and caches it (per class loader);
    a join's batches run the same plans, so once they ran, a batch of the same shape compiles nothing.
    With Spark's default cache of 100 classes every batch compiled its ~145 again (the JIT then
    never settles: docs/benchmarks.md, "The profile of a record's cost")."""
    compiled = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    d = driver
    d.pipe("merchants", key="m1", value={"name": "Acme"})
    per_batch = []
    for wave in range(5):
        for i in range(20):
            d.pipe("products", key=f"p{i}", value=product(f"t{wave}", "m1"))
        before = compiled.getCount()
        d.advance()
        per_batch.append(compiled.getCount() - before)
    # the counter counts in this JVM: a literal no plan had before is new code (the first batches'
    # classes may be cached already, by earlier tests of the same session)
    before = compiled.getCount()
    spark.range(1).selectExpr(f"id + {time.time_ns()}L AS x").collect()
    assert compiled.getCount() > before
    assert per_batch[-2:] == [0, 0], per_batch
    last = {"title": "t4", "merchant": "Acme"}
    assert sorted((r.key, r.value) for r in d.changelog("display")) == sorted(
        (f"p{i}", last) for i in range(20)
    )
    assert d.table("display") == {f"p{i}": last for i in range(20)}


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


CHAINED_PIPELINE = """
pipeline: driver-chained-test
topics:
  accounts: {partitions: 2}
  plans: {partitions: 2}
  events: {partitions: 2}
joins:
  mail:                   # publishes each account's mail at the account record's time
    kind: table
    left: accounts
    right: plans
    type: left
    select: {mail: left.mail, plan: right.name}
    publish: true
  events_with_mail:       # reads mail's changelog as of each event's time
    kind: stream-table
    left: events
    right: mail_changelog
    type: left
    select: {page: left.page, mail: right.mail}
"""


def test_a_stream_table_join_of_another_joins_changelog_answers_in_event_time(spark, tmp_path):
    """Events replayed late (their timestamps older than the processing) join the first join's
    changelog as of their own time: the changelog carries the results' event times, not the times
    its micro-batches ran."""
    (tmp_path / "pipeline.yaml").write_text(CHAINED_PIPELINE)
    with PipelineTestDriver(tmp_path / "pipeline.yaml", root=tmp_path / "lake", spark=spark) as d:
        d.pipe("accounts", key="u1", value={"mail": "old@example.com"}, timestamp=1_000)
        d.advance()
        assert d.changelog("mail") == [("u1", {"mail": "old@example.com", "plan": None}, 1_000)]
        d.pipe("accounts", key="u1", value={"mail": "new@example.com"}, timestamp=3_000)
        d.advance()
        assert d.changelog("mail") == [("u1", {"mail": "new@example.com", "plan": None}, 3_000)]
        # a replay of the events of that time, processed after both account versions
        d.pipe("events", key="u1", value={"page": "/a"}, timestamp=2_000)
        d.pipe("events", key="u1", value={"page": "/b"}, timestamp=4_000)
        d.advance()
        assert sorted(d.changes("events_with_mail"), key=lambda r: r.timestamp) == [
            ("u1", {"page": "/a", "mail": "old@example.com"}, 2_000),
            ("u1", {"page": "/b", "mail": "new@example.com"}, 4_000),
        ]


def test_a_bytes_key_is_piped_as_its_bytes_and_comes_back_as_them(driver):
    d = driver
    d.pipe("merchants", key="m1", value={"name": "Acme"}, timestamp=1_000)
    d.pipe("products", key=b"\xff\x01", value=product("Hammer", "m1"), timestamp=2_000)  # not UTF-8
    d.pipe("products", key=b"p2", value=product("Saw", "m1"), timestamp=2_000)
    d.advance()
    assert sorted(d.changelog("display"), key=lambda r: isinstance(r.key, bytes)) == [
        ("p2", {"title": "Saw", "merchant": "Acme"}, 2_000),  # UTF-8 bytes: text
        (b"\xff\x01", {"title": "Hammer", "merchant": "Acme"}, 2_000),
    ]
