"""The Kafka Streams peer and the product on the same topics give the same final result per key: the
foreign-key join of the marketplace pipeline and the list join of the people pipeline, on a few
hundred records with every kind of update (docs/benchmarks.md; the timing runs are
``make bench-peer``)."""

from __future__ import annotations

import random
from dataclasses import replace
from decimal import Decimal

from peerkit import Peer, table_results, topic_results, wait_equal

from spark_jobs.config import bundled_config_path, load_config
from spark_jobs.demo.data import encoded
from spark_jobs.formats import Formats
from spark_jobs.joins.runner import run_join
from spark_jobs.seams.kafka import connect, ensure_topics, produce


def _marketplace_waves(rng: random.Random) -> list[dict[str, list]]:
    merchants = [f"m{i}" for i in range(30)]  # m25..m29 never arrive: a left join keeps their products
    first = {
        "merchants": [(m, {"name": f"Merchant {m}", "city": rng.choice(["Oslo", "Bergen"])}) for m in merchants[:25]],
        "products": [
            (f"p{i}", {"title": f"Product {i}", "price": rng.randint(100, 9999) / 100}
             | ({} if i % 17 == 0 else {"merchant_id": rng.choice(merchants)}))
            for i in range(200)
        ],
    }  # fmt: skip
    second = {
        "products": [  # FK moves, a lost merchant, price changes, deletes
            *((f"p{i}", {"title": f"Product {i}*", "price": 1.5, "merchant_id": rng.choice(merchants)})
              for i in rng.sample(range(200), 40)),
            ("p3", {"title": "Product 3", "price": 2.0}),
            *((f"p{i}", None) for i in (5, 50, 150)),
            ("p500", {"title": "New", "price": 3.25, "merchant_id": "m1"}),
        ],
        "merchants": [  # renames fan out; a deleted merchant leaves its products without one
            ("m1", {"name": "Renamed m1", "city": "Trondheim"}),
            ("m2", {"name": "Renamed m2", "city": "Tromsø"}),
            ("m3", None),
            ("m27", {"name": "Late m27", "city": "Bodø"}),
        ],
    }  # fmt: skip
    return [first, second]


def _people_waves(rng: random.Random) -> list[dict[str, list]]:
    ids = [f"a{i}" for i in range(50)]  # a40..a49 never arrive: kept in place, unmatched
    first = {
        "addresses": [(a, {"street": f"Street {a}", "city": "Oslo"}) for a in ids[:40]],
        "persons": [
            (f"u{i}", {"name": f"Person {i}", "address_ids": [rng.choice(ids) for _ in range(i % 6)]})
            for i in range(60)
        ],
    }
    first["persons"].append(("dup", {"name": "Dup", "address_ids": ["a1", "a2", "a1"]}))
    second = {
        "persons": [  # appends, removals, reorders, an emptied list, deletes
            *(
                (f"u{i}", {"name": f"Person {i}", "address_ids": [rng.choice(ids) for _ in range(rng.randint(0, 7))]})
                for i in rng.sample(range(60), 25)
            ),
            ("dup", {"name": "Dup", "address_ids": ["a2", "a1"]}),
            ("u7", None),
        ],
        "addresses": [
            ("a1", {"street": "Moved 1", "city": "Bergen"}),
            ("a2", None),
            ("a45", {"street": "Late 45", "city": "Bodø"}),
        ],
    }  # fmt: skip
    return [first, second]


def test_the_kafka_streams_peer_and_the_product_give_equal_fk_and_list_results(spark, lake, tmp_path):
    market = load_config(bundled_config_path("marketplace.yaml"))
    people = load_config(bundled_config_path("people.yaml"))
    # the Kafka Streams peer reads JSON (Confluent's Protobuf serdes are not published where it is
    # built): the people pipeline's persons in JSON here; the product's formats have tests of their own
    persons = replace(people.topic("persons"), value_format="json", value_schema=None)
    people = replace(people, topics={**people.topics, "persons": persons})
    cluster = connect(market, lake.root)
    peer_out = {
        "fk": replace(market.topic("products"), name="peer_display_products", compacted=False),
        "list": replace(people.topic("persons"), name="peer_people_with_addresses", compacted=False),
    }
    for config in (market, people):
        ensure_topics(cluster, config.topics.values())
    ensure_topics(cluster, peer_out.values())
    rng = random.Random(18)
    waves = list(zip(_marketplace_waves(rng), _people_waves(rng), strict=True))

    def write(config, records) -> None:
        formats = Formats(config, lake.root, cluster.topic)
        for topic, items in records.items():
            produce(cluster, config.topic(topic), [encoded(formats, topic, items)], "murmur2")

    with (
        Peer("fk", cluster, "products", "merchants", peer_out["fk"].name, tmp_path / "peer") as fk,
        Peer("list", cluster, "persons", "addresses", peer_out["list"].name, tmp_path / "peer") as lists,
    ):
        for n, (market_wave, people_wave) in enumerate(waves, 1):
            write(market, market_wave)
            write(people, people_wave)
            for config, join in ((market, "display_products"), (people, "people_with_addresses")):
                run_join(spark, lake, config, join, once=True, log=lambda m: None)
            products = table_results(lake, "display_products")
            persons = table_results(lake, "people_with_addresses")
            # the product's result table, its changelog topic and the peer's output topic agree
            assert len(products) == (200 if n == 1 else 198) and len(persons) == (61 if n == 1 else 60)
            assert topic_results(cluster, market.topic("display_products_changelog")) == products
            fk_diff = wait_equal(products, lambda: topic_results(cluster, peer_out["fk"]), 120)
            assert fk_diff == [], f"wave {n}, fk join: " + "\n".join(fk_diff)
            list_diff = wait_equal(persons, lambda: topic_results(cluster, peer_out["list"]), 120)
            assert list_diff == [], f"wave {n}, list join: " + "\n".join(list_diff)
        assert fk.proc is not None and fk.proc.poll() is None and lists.proc is not None
    # the cases the data was built for are in the results
    assert products["p3"] == {"title": "Product 3", "price": Decimal("2.00")}  # no merchant_id any more
    assert products["p500"]["merchant"] == "Renamed m1" and "p5" not in products
    assert [e["id"] for e in persons["dup"]["addresses"]] == ["a2", "a1"]
    assert persons["dup"]["addresses"][0] == {"id": "a2", "matched": False}
    assert persons["dup"]["addresses"][1] == {
        "id": "a1",
        "matched": True,
        "street": "Moved 1",
        "city": "Bergen",
    }
