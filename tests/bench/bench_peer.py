"""Benchmark: the product's foreign-key join against Kafka Streams, the peer a user would pick
instead (``tests/bench/peer``: the KIP-213 left join, exactly-once v2, commit 100 ms, 2 stream threads).

Same broker (an embedded KRaft broker of its own), same data, same machine, one run. Each system gets
its own copy of the topics (4 partitions each, the same records in the same order, produced by one
idempotent librdkafka producer with murmur2, as a Java client places them) and is measured alone:
first the peer, then the product, so neither takes the other's cores. Workloads, on PRODUCTS products
(default 1,000,000) and PRODUCTS / 10 merchants:

- initial load: both topics filled, then the system started; seconds until every product's result
  with its merchant is visible;
- freshness: 8 waves of 1,000 product updates, produce start -> all 1,000 visible (p50, max);
- fan-out: one merchant renamed -> all its products visible with the new name;
- burst: 50,000 product updates produced at once -> all visible (changes/s end to end);
- CPU seconds and peak resident memory of the system's processes over the whole run.

"Visible" is where a user reads the result: for the peer its output topic (read committed), for the
product its Delta result table (each commit's change-data or data files read with pyarrow; no Spark
job in this process). The product runs as a user runs it: ``lake ingest --continuous`` (Kafka ->
bronze) and ``lake run display_products --continuous``, both with TRIGGER seconds.
At the end the final result per key of both systems must be equal (the first differing keys are
printed otherwise). Run with ``make bench-peer``; PEER_PRODUCTS sets the size.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from benchkit import committed_rows, embedded_broker

from spark_jobs.config import load_config
from spark_jobs.kafka import connect, ensure_topics, produce
from spark_jobs.lake import Lake

PRODUCTS = int(os.environ.get("PEER_PRODUCTS", "1000000"))
MERCHANTS = max(PRODUCTS // 10, 1)
WAVES, WAVE = 8, 1000
BURST = min(50_000, PRODUCTS)
TRIGGER = os.environ.get("PEER_TRIGGER", "0.1")
TIMEOUT = 900

PIPELINE = """
pipeline: peer_bench
topics:
  products: {partitions: 4}
  merchants: {partitions: 4}
joins:
  display_products:
    kind: fk
    left: products
    right: merchants
    foreign_key: merchant_id
    type: left
    select:
      title: left.title
      price: cast(left.price AS decimal(10,2))
      merchant_id: left.merchant_id
      merchant: right.name
      merchant_city: right.city
"""


def product_values(ids: np.ndarray, title: str, merchant_of: np.ndarray) -> pa.Array:
    """``{"title": "<title><id>", "price": 9.99, "merchant_id": "m<merchant>"}`` per id."""
    tid = pc.cast(pa.array(ids), pa.string())
    mid = pc.cast(pa.array(merchant_of), pa.string())
    parts = [f'{{"title":"{title}', tid, '","price":9.99,"merchant_id":"m', mid, '"}']
    return pc.cast(pc.binary_join_element_wise(*parts, ""), pa.binary())


def prefixed(prefix: str, ids: np.ndarray) -> pa.Array:
    return pc.cast(pc.binary_join_element_wise(prefix, pc.cast(pa.array(ids), pa.string()), ""), pa.binary())


def merchant_values(ids: np.ndarray, name: str = "M") -> pa.Array:
    mid = pc.cast(pa.array(ids), pa.string())
    return pc.cast(pc.binary_join_element_wise(f'{{"name":"{name}', mid, '","city":"Oslo"}', ""), pa.binary())


class Seen:
    """When each (title, merchant) result first became visible."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, tokens, now: float) -> None:
        with self.lock:
            for token in tokens:
                self.at.setdefault(token, now)

    def wait(self, tokens: list[str], started: float, what: str) -> list[float]:
        """Seconds from ``started`` until each token was seen (waits for all of them)."""
        deadline = time.time() + TIMEOUT
        while True:
            with self.lock:
                missing = sum(1 for t in tokens if t not in self.at)
            if not missing:
                with self.lock:
                    return [self.at[t] - started for t in tokens]
            if time.time() > deadline:
                raise SystemExit(f"{what}: {missing:,} results not visible after {TIMEOUT} s")
            time.sleep(0.02)


def token(title, merchant) -> str:
    return f"{title}|{merchant or ''}"


TITLE, MERCHANT = re.compile(rb'"title":"([^"]*)"'), re.compile(rb'"merchant":"([^"]*)"')


def follow_topic(bootstrap: str, topic: str, seen: Seen, final: dict, stop: threading.Event) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{time.time()}", "isolation.level": "read_committed",
         "enable.auto.commit": False, "fetch.wait.max.ms": 10}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    try:
        while not stop.is_set():
            messages = consumer.consume(10_000, 0.05)
            now = time.time()
            tokens = []
            for m in messages:
                if m.error():
                    continue
                key, value = m.key(), m.value()
                if value is None:
                    final.pop(key, None)
                    continue
                final[key] = value  # decoded once at the end: this thread shares the cores it measures
                title, merchant = TITLE.search(value), MERCHANT.search(value)
                tokens.append(token(title and title[1].decode(), merchant and merchant[1].decode()))
            seen.add(tokens, now)
    finally:
        consumer.close()


def follow_table(lake: Lake, table: str, seen: Seen, stop: threading.Event) -> None:
    version = 0
    while not stop.is_set():
        if lake.exists(table):
            while lake.version(table) >= version:
                now = time.time()
                rows = committed_rows(lake.path(table), version, ["title", "merchant"])
                seen.add([token(t, m) for t, m in zip(rows["title"], rows["merchant"], strict=True)], now)
                version += 1
        time.sleep(0.02)


class Workload:
    """The records both systems get, in the same order, into their own copy of the topics."""

    def __init__(self, cluster, config, prefix: str):
        self.cluster, self.config, self.prefix = cluster, config, prefix
        self.titles: dict[int, str] = {}  # product -> its title after the waves (default t<i>)

    def put(self, topic: str, keys: pa.Array, values: pa.Array) -> None:
        produce(
            self.cluster,
            replace(self.config.topic(topic), name=self.prefix + topic),
            [(keys, values)],
            "murmur2",
        )

    def initial(self) -> list[str]:
        merchants = np.arange(MERCHANTS)
        self.put("merchants", prefixed("m", merchants), merchant_values(merchants))
        ids = np.arange(PRODUCTS)
        self.merchant_of = ids % MERCHANTS
        self.put("products", prefixed("p", ids), product_values(ids, "t", self.merchant_of))
        return [token(f"t{i}", f"M{i % MERCHANTS}") for i in range(PRODUCTS)]

    def wave(self, n: int) -> list[str]:
        ids = np.sort(np.random.default_rng(n).choice(PRODUCTS, WAVE, replace=False))
        self.put("products", prefixed("p", ids), product_values(ids, f"w{n}-", self.merchant_of[ids]))
        self.titles.update((int(i), f"w{n}-{i}") for i in ids)
        return [token(f"w{n}-{i}", f"M{self.merchant_of[i]}") for i in ids]

    def fan_out(self) -> list[str]:
        m = 7 % MERCHANTS
        self.put("merchants", prefixed("m", np.array([m])), merchant_values(np.array([m]), "Renamed"))
        products = np.flatnonzero(self.merchant_of == m)
        self.renamed = m
        return [token(self.titles.get(int(i), f"t{i}"), f"Renamed{m}") for i in products]

    def burst(self) -> list[str]:
        ids = np.arange(BURST)
        self.put("products", prefixed("p", ids), product_values(ids, "b", self.merchant_of[ids]))
        return [token(f"b{i}", self._merchant(i)) for i in ids]

    def _merchant(self, i: int) -> str:
        m = int(self.merchant_of[i])
        return f"Renamed{m}" if m == self.renamed else f"M{m}"


def run_workloads(work: Workload, seen: Seen, start_system, figures: dict) -> None:
    expected = work.initial()
    started = time.time()
    start_system()
    figures["initial load, s"] = max(seen.wait(expected, started, "initial load"))
    waves = []
    for n in range(1, WAVES + 1):
        t0 = time.time()
        waves.append(max(seen.wait(work.wave(n), t0, f"wave {n}")))
        time.sleep(0.5)
    figures["waves of 1,000: p50, s"] = float(np.percentile(waves, 50))
    figures["waves of 1,000: max, s"] = max(waves)
    t0 = time.time()
    figures["fan-out of one merchant, s"] = max(seen.wait(work.fan_out(), t0, "fan-out"))
    t0 = time.time()
    took = max(seen.wait(work.burst(), t0, "burst"))
    figures[f"burst of {BURST:,}: changes/s"] = BURST / took


def start_lake(root: Path, config_path: Path, *args: str) -> subprocess.Popen:
    log = open(root.parent / f"{args[0]}.log", "wb")  # noqa: SIM115 - lives as long as the job
    return subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), "--config", str(config_path), *args],
        stdout=log, stderr=log, start_new_session=True,
    )  # fmt: skip


def main() -> None:
    from peerkit import Peer, clean, differences, table_results, tree_usage

    with tempfile.TemporaryDirectory() as tmp, embedded_broker(Path(tmp) / "kafka") as bootstrap:
        tmp = Path(tmp)
        os.environ["LAKE_KAFKA_TOPIC_PREFIX"] = ""
        (tmp / "peer_bench.yaml").write_text(PIPELINE)
        config = load_config(tmp / "peer_bench.yaml")
        root = tmp / "lake"
        cluster = connect(config, root)
        ensure_topics(cluster, config.topics.values())
        copies = [replace(s, name="peer_" + s.name) for s in config.topics.values()]
        out = replace(copies[0], name="peer_out", compacted=False)
        ensure_topics(cluster, [*copies, out])
        figures: dict[str, dict] = {"peer": {}, "product": {}}
        print(
            f"{PRODUCTS:,} products, {MERCHANTS:,} merchants, 4 partitions; machine: {os.cpu_count()} cores"
        )

        # --- the peer, alone -----------------------------------------------------------------
        seen, final, stop = Seen(), {}, threading.Event()
        follower = threading.Thread(target=follow_topic, args=(bootstrap, "peer_out", seen, final, stop))
        follower.start()
        peer = Peer("fk", cluster, "peer_products", "peer_merchants", "peer_out", tmp / "peer")
        try:
            run_workloads(Workload(cluster, config, "peer_"), seen, peer.__enter__, figures["peer"])
            cpu, peak = peer.usage()
            figures["peer"]["CPU, s"], figures["peer"]["peak memory, MB"] = cpu, peak / 1e6
        finally:
            peer.__exit__(None, None, None)
            stop.set()
            follower.join()
        print("peer:", {k: round(v, 2) for k, v in figures["peer"].items()}, flush=True)

        # --- the product, alone --------------------------------------------------------------
        lake = Lake(root)
        seen, stop, jobs = Seen(), threading.Event(), []
        follower = threading.Thread(target=follow_table, args=(lake, "display_products", seen, stop))
        follower.start()

        def start_product() -> None:
            config_path = tmp / "peer_bench.yaml"
            jobs.append(start_lake(root, config_path, "ingest", "--continuous", "--trigger", TRIGGER))
            jobs.append(
                start_lake(root, config_path, "run", "display_products", "--continuous", "--trigger", TRIGGER)
            )

        try:
            run_workloads(Workload(cluster, config, ""), seen, start_product, figures["product"])
            cpu, peak = tree_usage([j.pid for j in jobs])
            figures["product"]["CPU, s"], figures["product"]["peak memory, MB"] = cpu, peak / 1e6
        finally:
            stop.set()
            follower.join()
            for job in jobs:
                job.send_signal(signal.SIGTERM)
            for job in jobs:
                job.wait(timeout=180)

        # --- the same final result per key ------------------------------------------------------
        ours = table_results(lake, "display_products")
        peer_final = {k.decode(): clean(json.loads(v, parse_float=Decimal)) for k, v in final.items()}
        diff = differences(ours, peer_final)
        print(f"\nfinal results: product {len(ours):,} keys, peer {len(final):,} keys: "
              + ("equal" if not diff else "DIFFERENT\n  " + "\n  ".join(diff)))  # fmt: skip

        print("\n| workload | Kafka Streams | product | product / peer |\n|---|---|---|---|")
        for name, theirs in figures["peer"].items():
            mine = figures["product"][name]
            print(f"| {name} | {theirs:,.2f} | {mine:,.2f} | {mine / theirs:.2f}x |")
        if diff:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
