"""``grace`` on a stream-table join (KIP-923), through the public test driver: an event waits until
the stream's time has passed its timestamp plus the grace, so a table update that arrives out of
order within the grace counts, and one that arrives after it does not; without ``grace`` an event is
decided once the table side has read all it has."""

from __future__ import annotations

from spark_jobs.testing import PipelineTestDriver

PIPELINE = """
pipeline: grace
topics:
  orders: {partitions: 2}
  prices: {partitions: 2}
joins:
  priced:
    kind: stream-table
    left: orders
    right: prices
    type: left
    grace: 10 seconds
    select: {order: left.id, price: right.eur}
  priced_at_once:
    kind: stream-table
    left: orders
    right: prices
    type: left
    select: {order: left.id, price: right.eur}
"""


def test_a_table_update_out_of_order_counts_inside_the_grace_and_not_after_it(spark, tmp_path):
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    with PipelineTestDriver(tmp_path / "pipeline.yaml", root=tmp_path / "lake", spark=spark) as d:
        d.pipe("prices", key="tea", value={"eur": "1"}, timestamp=1_000)
        d.pipe("orders", key="tea", value={"id": "o1"}, timestamp=5_000)
        d.advance()
        assert d.changes("priced") == []  # stream time 5 s: o1 waits until 15 s
        assert d.queries["priced"].metrics.pending == 1
        assert d.changes("priced_at_once") == [("tea", {"order": "o1", "price": "1"}, 5_000)]

        # a price of 4 s arrives late, inside o1's grace; o2 at 16 s moves the stream past 15 s
        d.pipe("prices", key="tea", value={"eur": "2"}, timestamp=4_000)
        d.pipe("orders", key="tea", value={"id": "o2"}, timestamp=16_000)
        d.advance()
        assert d.changes("priced") == [("tea", {"order": "o1", "price": "2"}, 5_000)]
        assert d.queries["priced"].metrics.pending == 1  # o2 waits until 26 s
        assert d.changes("priced_at_once") == [("tea", {"order": "o2", "price": "2"}, 16_000)]

        # a price of 4.5 s arrives after o1 was decided (outside its grace), inside o2's
        d.pipe("prices", key="tea", value={"eur": "3"}, timestamp=4_500)
        d.pipe("orders", key="tea", value={"id": "o3"}, timestamp=30_000)
        d.advance()
        assert d.changes("priced") == [("tea", {"order": "o2", "price": "3"}, 16_000)]
        assert d.queries["priced"].metrics.pending == 1  # o3
        assert d.changes("priced_at_once") == [("tea", {"order": "o3", "price": "3"}, 30_000)]
        assert d.table("priced") == {"tea": {"order": "o2", "price": "3"}}  # the latest event decided
        # o1 kept the price it was decided with
        rows = d.lake.read_arrow("priced", columns=["order", "price"]).to_pylist()
        assert sorted((r["order"], r["price"]) for r in rows) == [("o1", "2"), ("o2", "3")]
