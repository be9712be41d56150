"""Benchmark: the product's foreign-key and list joins against Kafka Streams, the peer a user would pick
instead (``tests/bench/peer``: exactly-once v2, commit 100 ms, 2 stream threads).

Same broker (an embedded KRaft broker of its own), same data, same machine, one run. Each system gets
its own copy of the topics (4 partitions each, the same records in the same order, produced by one
idempotent librdkafka producer with murmur2, as a Java client places them) and is measured alone:
per join, first the peer, then the product, so neither takes the other's cores.

The fk join (``display_products``, the KIP-213 left join) on PRODUCTS products (default 1,000,000)
and PRODUCTS / 10 merchants:

- initial load: both topics filled, then the system started; seconds until every product's result
  with its merchant is visible;
- freshness: 8 waves of 1,000 product updates, produce start -> all 1,000 visible (p50, max);
- fan-out: one merchant renamed -> all its products visible with the new name;
- burst: 50,000 product updates produced at once -> all visible (changes/s end to end), three times,
  their median.

The list join (``people_with_addresses``) on PERSONS persons (default 100,000) with 10 address ids
each, PERSONS addresses (each on 10 lists), and one person with a 10,000-element list:

- initial load: every person's list visible with every element's street;
- +1 element: the 10,000-element list grows by one -> the new element visible with its street;
- address updates: 1,000 addresses get a new street -> every list holding one shows it.

And for each join and system: CPU seconds and peak resident memory of its processes.

``fk-avro``: the same fk workload with the products' and merchants' values in Avro through a Schema
Registry (an embedded one of its own), the product alone, against the product's own JSON figures
of the same run: what the format costs a record (the records' values are the same; the
changelog is JSON in both, so the same reader sees them).

``fk`` runs with the join's Prometheus endpoint scraped every SCRAPE_EVERY seconds (1 s: fifteen times
what a Prometheus' default asks), ``fk-no-metrics`` the same workload with ``metrics: false``, the
product alone on its own copy of the topics: what serving and answering scrapes costs, in CPU and in
the burst's rate, in the same run.

``fk-baseline``: the same fk workload run by the product at PEER_BASELINE (default: the commit before
the results kept provenance), checked out in a git worktree that shares this checkout's locked
environment, on its own copy of the topics: what a change costs a record, in the same run.

After the scenarios (with ``fk``): ``lake explain display_products KEY`` timed as a user waits for it,
with the lake root's Spark Connect server up, five times for each of three keys, each answer checked.

"Visible" is where a user reads the result: for the peer its output topic (read committed); for the
product its changelog topic (read committed, the same reader) and, beside it, its Delta result table
(each commit's change-data or data files read with pyarrow; no Spark job in this process), which
``--table-every TABLE_EVERY`` writes behind the topic. A workload starts when the previous one is
visible in both. Arguments name the joins to run (``fk``, ``list``; default both). The product runs as a
user runs it: ``lake run <join> --continuous`` (the join reads its Kafka topics) with TRIGGER seconds
and ``LAKE_PROFILE=1``: the profile of each workload (where its time goes, from the job's log:
``spark_jobs.runtime.profile``) is printed after the table. At the end the final result per key of the peer must equal the product's
result table and its changelog topic (the first differing keys are printed otherwise). Run with
``make bench-peer``; PEER_PRODUCTS and PEER_PERSONS set the sizes, PEER_TRIGGER the product's trigger,
PEER_TABLE_EVERY its ``--table-every`` (default 5 s). With PEER_JFR=<folder>, the product's JVM
records with Java Flight Recorder there, and each workload's profile is printed
(``jfr_profile.py``: JIT and GC CPU, what the Java samples were doing, the hottest methods).
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
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from benchkit import committed_rows, embedded_broker, embedded_registry

from spark_jobs.config import load_config
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import connect, ensure_topics, produce

PRODUCTS = int(os.environ.get("PEER_PRODUCTS", "1000000"))
MERCHANTS = max(PRODUCTS // 10, 1)
WAVES, WAVE = 8, 1000
BURST = min(50_000, PRODUCTS)
BURSTS = 3  # the burst's figure is their median: one burst moves by 20 % between runs
PERSONS = int(os.environ.get("PEER_PERSONS", "100000"))
LIST = 10  # address ids per person
ADDRESSES = PERSONS  # each address on LIST persons' lists
BIG = min(10_000, ADDRESSES - 1)  # the long list: a0 .. a<BIG-1>, then + a<BIG>
ADDRESS_UPDATES = min(1000, ADDRESSES)
TRIGGER = os.environ.get("PEER_TRIGGER", "0.1")
TABLE_EVERY = os.environ.get("PEER_TABLE_EVERY", "5")
# the product to measure this checkout against, in the same run (fk-baseline): by default the last
# commit before the results kept their input records' offsets (provenance, issue 48)
BASELINE = os.environ.get("PEER_BASELINE", "84ac4cf")
JFR = os.environ.get("PEER_JFR")  # a folder: the product's JVM records a flight recording there
TIMEOUT = 900

# the fk join both benchmarks run (bench_soak too): the KIP-213 left join of products on merchants
FK_JOIN = """\
  display_products:
    kind: fk
    left: products
    right: merchants
    foreign_key: merchant_id
    type: left
    publish: true
    select:
      title: left.title
      price: cast(left.price AS decimal(10,2))
      merchant_id: left.merchant_id
      merchant: right.name
      merchant_city: right.city
"""

PIPELINE = (
    """
pipeline: peer_bench
topics:
  products: {partitions: 4}
  merchants: {partitions: 4}
  persons: {partitions: 4}
  addresses: {partitions: 4}
  products_avro: {partitions: 4, value: {format: avro, schema: product.avsc}}
  merchants_avro: {partitions: 4, value: {format: avro, schema: merchant.avsc}}
joins:
"""
    + FK_JOIN
    + """\
  display_products_avro:
    kind: fk
    left: products_avro
    right: merchants_avro
    foreign_key: merchant_id
    type: left
    publish: true
    select:
      title: left.title
      price: cast(left.price AS decimal(10,2))
      merchant_id: left.merchant_id
      merchant: right.name
      merchant_city: right.city
  people_with_addresses:
    kind: list
    left: persons
    right: addresses
    list: address_ids
    publish: true
    select:
      name: left.name
    elements:
      street: right.street
      city: right.city
    as: addresses
"""
)


def _text(ids: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(ids), pa.string())


def _string(*parts) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _binary(*parts) -> pa.Array:
    return pc.cast(_string(*parts), pa.binary())


def prefixed(prefix: str, ids: np.ndarray) -> pa.Array:
    return _binary(prefix, _text(ids))


def product_values(ids: np.ndarray, title: str, merchant_of: np.ndarray) -> pa.Array:
    """``{"title": "<title><id>", "price": 9.99, "merchant_id": "m<merchant>"}`` per id."""
    return _binary(
        f'{{"title":"{title}', _text(ids), '","price":9.99,"merchant_id":"m', _text(merchant_of), '"}'
    )


def merchant_values(ids: np.ndarray, name: str = "M") -> pa.Array:
    return _binary(f'{{"name":"{name}', _text(ids), '","city":"Oslo"}')


def address_values(ids: np.ndarray, street: str = "S") -> pa.Array:
    return _binary(f'{{"street":"{street}', _text(ids), '","city":"Oslo"}')


def person_values(ids: np.ndarray, lists: np.ndarray) -> pa.Array:
    """``{"name": "P<id>", "address_ids": ["a<i>", ...]}`` per id and row of ``lists``."""
    elements = [_string('"a', _text(lists[:, j]), '"') for j in range(lists.shape[1])]
    joined = pc.binary_join_element_wise(*elements, ",") if len(elements) > 1 else elements[0]
    return _binary('{"name":"P', _text(ids), '","address_ids":[', joined, "]}")


class Seen:
    """When each result token (what a visible result row shows) first became visible."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()

    def add(self, tokens, now: float) -> None:
        with self.lock:
            for token in tokens:
                self.at.setdefault(token, now)

    def wait(self, tokens: list[str], started: float, what: str) -> float:
        """Seconds from ``started`` until the last of ``tokens`` was seen (waits for all of them)."""
        deadline = time.time() + TIMEOUT
        missing = list(tokens)
        while True:
            with self.lock:
                missing = [t for t in missing if t not in self.at]
                if not missing:
                    return max(self.at[t] for t in tokens) - started
            if time.time() > deadline:
                raise SystemExit(f"{what}: {len(missing):,} results not visible after {TIMEOUT} s")
            time.sleep(0.02)


# --- what a result row shows, read from the peer's topic (bytes) or the product's table (columns) --
TITLE, MERCHANT = re.compile(rb'"title":"([^"]*)"'), re.compile(rb'"merchant":"([^"]*)"')
STREET = re.compile(rb'"street":"([^"]*)"')


def fk_token(title, merchant) -> str:
    return f"{title}|{merchant or ''}"


def fk_topic_tokens(key: bytes, value: bytes) -> list[str]:
    title, merchant = TITLE.search(value), MERCHANT.search(value)
    return [fk_token(title and title[1].decode(), merchant and merchant[1].decode())]


def fk_table_tokens(rows: dict[str, list]) -> list[str]:
    return [fk_token(t, m) for t, m in zip(rows["title"], rows["merchant"], strict=True)]


def list_topic_tokens(key: bytes, value: bytes) -> list[str]:
    person = key.decode()
    return [f"{person}|{street.decode()}" for street in STREET.findall(value)]


def list_table_tokens(rows: dict[str, list]) -> list[str]:
    return [
        f"{key.decode()}|{e['street']}"
        for key, elements in zip(rows["key"], rows["addresses"], strict=True)
        for e in elements or []
        if e.get("street") is not None
    ]


def follow_topic(
    bootstrap: str, topic: str, tokens_of, seen: Seen, final: dict, stop: threading.Event
) -> None:
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
                tokens += tokens_of(key, value)
            seen.add(tokens, now)
    finally:
        consumer.close()


def follow_table(
    lake: Lake, table: str, columns: list[str], tokens_of, seen: Seen, stop: threading.Event
) -> None:
    version = 0
    while not stop.is_set():
        if lake.exists(table):
            while lake.version(table) >= version:
                now = time.time()
                seen.add(tokens_of(committed_rows(lake.path(table), version, columns)), now)
                version += 1
        time.sleep(0.02)


# --- the workloads: the records both systems get, in the same order, into their own topics ------
class Workload:
    def __init__(self, cluster, config, prefix: str):
        self.cluster, self.config, self.prefix = cluster, config, prefix
        self.windows: dict[str, list[tuple[float, float]]] = {}  # workload -> (start, all visible)

    def put(self, topic: str, keys: pa.Array, values: pa.Array) -> None:
        produce(
            self.cluster,
            replace(self.config.topic(topic), name=self.prefix + topic),
            [(keys, values)],
            "murmur2",
        )

    def visible(self, seen: Seen, table: Seen | None) -> None:
        """Where results are seen: ``seen`` (the output topic), and ``table`` (the product's result
        table, which a run with --table-every writes behind its topic)."""
        self.seen, self.table = seen, table

    def timed(self, name: str, records: Callable[[], list[str]]) -> tuple[float, float | None]:
        """Seconds from producing ``records()`` until all are on the topic, and in the table (None:
        no table). A workload starts when the previous one is visible in both."""
        started = time.time()
        tokens = records()
        took = self.seen.wait(tokens, started, name)
        self.windows.setdefault(name, []).append((started, started + took))
        return took, (self.table.wait(tokens, started, f"{name} (table)") if self.table else None)

    def load(self, start_system: Callable[[], None]) -> tuple[float, float | None]:
        """The initial load: the topics filled, then the system started; until all is visible."""
        expected = self.initial()
        started = time.time()
        start_system()
        took = self.seen.wait(expected, started, f"{self.join}: initial load")
        self.windows["initial load"] = [(started, started + took)]
        behind = (
            self.table.wait(expected, started, f"{self.join}: initial load (table)") if self.table else None
        )
        return took, behind


def record(figures: dict[str, dict], name: str, times, reduce=lambda t: t) -> None:
    """A figure for the topic (``figures["topic"]``) and, when measured, for the table."""
    pairs = times if isinstance(times, list) else [times]
    for i, where in enumerate(("topic", "table")):
        values = [pair[i] for pair in pairs if pair[i] is not None]
        if values and where in figures:
            figures[where][name] = reduce(values if isinstance(times, list) else values[0])


class FkWorkload(Workload):
    left, right, join = "products", "merchants", "display_products"
    label = "fk"

    def __init__(self, *args):
        super().__init__(*args)
        self.titles: dict[int, str] = {}  # product -> its title after the waves (default t<i>)

    def initial(self) -> list[str]:
        merchants = np.arange(MERCHANTS)
        self.put("merchants", prefixed("m", merchants), merchant_values(merchants))
        ids = np.arange(PRODUCTS)
        self.merchant_of = ids % MERCHANTS
        self.put("products", prefixed("p", ids), product_values(ids, "t", self.merchant_of))
        return [fk_token(f"t{i}", f"M{i % MERCHANTS}") for i in range(PRODUCTS)]

    def wave(self, n: int) -> list[str]:
        ids = np.sort(np.random.default_rng(n).choice(PRODUCTS, WAVE, replace=False))
        self.put("products", prefixed("p", ids), product_values(ids, f"w{n}-", self.merchant_of[ids]))
        self.titles.update((int(i), f"w{n}-{i}") for i in ids)
        return [fk_token(f"w{n}-{i}", f"M{self.merchant_of[i]}") for i in ids]

    def fan_out(self) -> list[str]:
        m = 7 % MERCHANTS
        self.put("merchants", prefixed("m", np.array([m])), merchant_values(np.array([m]), "Renamed"))
        products = np.flatnonzero(self.merchant_of == m)
        self.renamed = m
        return [fk_token(self.titles.get(int(i), f"t{i}"), f"Renamed{m}") for i in products]

    def burst(self, n: int) -> list[str]:
        ids = np.arange(BURST)
        self.put("products", prefixed("p", ids), product_values(ids, f"b{n}-", self.merchant_of[ids]))
        return [fk_token(f"b{n}-{i}", self._merchant(i)) for i in ids]

    def _merchant(self, i: int) -> str:
        m = int(self.merchant_of[i])
        return f"Renamed{m}" if m == self.renamed else f"M{m}"

    def run(self, start_system: Callable[[], None], figures: dict[str, dict]) -> None:
        record(figures, f"{self.label}: initial load, s", self.load(start_system))
        waves = []
        for n in range(1, WAVES + 1):
            waves.append(self.timed("waves", lambda n=n: self.wave(n)))
            time.sleep(0.5)
        record(figures, f"{self.label}: waves of 1,000: p50, s", waves, lambda v: float(np.percentile(v, 50)))
        record(figures, f"{self.label}: waves of 1,000: max, s", waves, max)
        record(figures, f"{self.label}: fan-out of one merchant, s", self.timed("fan-out", self.fan_out))
        bursts = []
        for n in range(1, BURSTS + 1):
            bursts.append(self.timed("burst", lambda n=n: self.burst(n)))
            time.sleep(0.5)
        record(
            figures,
            f"{self.label}: burst of {BURST:,}: changes/s, median of {BURSTS}",
            bursts,
            lambda t: float(np.median([BURST / x for x in t])),
        )


PRODUCT_AVRO = {
    "type": "record",
    "name": "Product",
    "fields": [
        {"name": "title", "type": "string"},
        {"name": "price", "type": "double"},
        {"name": "merchant_id", "type": "string"},
    ],
}
MERCHANT_AVRO = {
    "type": "record",
    "name": "Merchant",
    "fields": [{"name": "name", "type": "string"}, {"name": "city", "type": "string"}],
}


class FkAvroWorkload(FkWorkload):
    """The fk workload with Avro values: the same records, framed with the topics' schemas."""

    left, right, join = "products_avro", "merchants_avro", "display_products_avro"
    label = "fk-avro"

    def put(self, topic: str, keys: pa.Array, values: pa.Array) -> None:
        from spark_jobs.formats import Formats

        topic = f"{topic}_avro"
        if not hasattr(self, "formats"):  # the registry: $LAKE_SCHEMA_REGISTRY_URL (benchkit)
            self.formats = Formats(self.config, Path("."))
        codec = self.formats.writing(topic, "value", None)
        framed = pa.array([codec.encode(json.loads(v)) for v in values.to_pylist()], pa.binary())
        super().put(topic, keys, framed)


class ListWorkload(Workload):
    left, right, join = "persons", "addresses", "people_with_addresses"

    def initial(self) -> list[str]:
        addresses = np.arange(ADDRESSES)
        self.put("addresses", prefixed("a", addresses), address_values(addresses))
        ids = np.arange(PERSONS)
        self.lists = (LIST * ids[:, None] + np.arange(LIST)) % ADDRESSES  # person -> its address ids
        self.put("persons", prefixed("u", ids), person_values(ids, self.lists))
        self.put("persons", pa.array([b"big"]), person_values(np.array([0]), np.arange(BIG)[None, :]))
        tokens = [f"u{i}|S{a}" for i, row in enumerate(self.lists.tolist()) for a in row]
        return tokens + [f"big|S{a}" for a in range(BIG)]

    def grow(self) -> list[str]:
        self.put("persons", pa.array([b"big"]), person_values(np.array([0]), np.arange(BIG + 1)[None, :]))
        return [f"big|S{BIG}"]

    def update_addresses(self) -> list[str]:
        changed = np.sort(np.random.default_rng(99).choice(ADDRESSES, ADDRESS_UPDATES, replace=False))
        self.put("addresses", prefixed("a", changed), address_values(changed, "R"))
        persons, positions = np.nonzero(np.isin(self.lists, changed))
        tokens = [
            f"u{p}|R{self.lists[p, j]}" for p, j in zip(persons.tolist(), positions.tolist(), strict=True)
        ]
        return tokens + [f"big|R{a}" for a in changed.tolist() if a <= BIG]

    def run(self, start_system: Callable[[], None], figures: dict[str, dict]) -> None:
        record(figures, "list: initial load, s", self.load(start_system))
        time.sleep(0.5)
        record(figures, f"list: +1 element to a {BIG:,} list, s", self.timed("+1 element", self.grow))
        time.sleep(0.5)
        name = f"list: {ADDRESS_UPDATES:,} address updates, s"
        record(figures, name, self.timed("address updates", self.update_addresses))


class FkBaselineWorkload(FkWorkload):
    """The fk workload for the product at BASELINE (its own copy of the topics, its own lake root)."""

    label = "fk-baseline"


@dataclass
class Scenario:
    workload: type[Workload]
    topology: str
    topic_tokens: Callable
    table_columns: list[str]
    table_tokens: Callable
    peer: bool = True  # the peer runs it too (fk-avro: the product alone, against its own JSON run)
    baseline: bool = False  # the product at BASELINE runs it, from a git worktree
    prefix: str = ""  # its copy of the topics on Kafka
    root: str = "lake"  # its lake root, under the benchmark's folder
    metrics: bool = True  # the join serves its Prometheus metrics (the pipeline's default)
    scrape_every: float = 0.0  # > 0: a scraper asks its endpoint this often while the workload runs


SCRAPE_EVERY = float(os.environ.get("PEER_SCRAPE_EVERY", "1"))  # seconds between scrapes of fk's endpoint
SCENARIOS = {
    "fk": Scenario(
        FkWorkload, "fk", fk_topic_tokens, ["title", "merchant"], fk_table_tokens, scrape_every=SCRAPE_EVERY
    ),
    "fk-no-metrics": Scenario(
        FkWorkload,
        "fk",
        fk_topic_tokens,
        ["title", "merchant"],
        fk_table_tokens,
        peer=False,
        prefix="nom_",
        root="lake-no-metrics",
        metrics=False,
    ),
    "list": Scenario(ListWorkload, "list", list_topic_tokens, ["key", "addresses"], list_table_tokens),
    "fk-avro": Scenario(
        FkAvroWorkload, "fk", fk_topic_tokens, ["title", "merchant"], fk_table_tokens, peer=False
    ),
    "fk-baseline": Scenario(
        FkBaselineWorkload,
        "fk",
        fk_topic_tokens,
        ["title", "merchant"],
        fk_table_tokens,
        peer=False,
        baseline=True,
        prefix="base_",
        root="lake-baseline",
    ),  # fmt: skip
}

# --- the product at BASELINE: what a change costs, measured in the same run -----------------------
REPO = Path(__file__).resolve().parents[2]
LOCKS = ["requirements.lock", "pyproject.toml", "infra/setup.sh", "infra/jvm", "tests/bench/peer/pom.xml"]


def baseline_checkout(tmp: Path) -> Path:
    """The product at BASELINE in a git worktree under ``tmp``, its Java built by its own
    ``infra/setup.sh``, sharing this checkout's locked environment (``.venv``, ``.jvm``, ``.tools``:
    refused when BASELINE locks another one)."""
    git = ["git", "-C", str(REPO)]
    if subprocess.run(
        [*git, "rev-parse", "--verify", "-q", f"{BASELINE}^{{commit}}"], capture_output=True
    ).returncode:
        raise SystemExit(f"PEER_BASELINE {BASELINE}: not a commit of {REPO} (a git clone is needed)")
    if subprocess.run([*git, "diff", "--quiet", BASELINE, "HEAD", "--", *LOCKS]).returncode:
        raise SystemExit(
            f"PEER_BASELINE {BASELINE}: its locked environment differs from this checkout's "
            f"({', '.join(LOCKS)}): pick a revision with the same locks"
        )
    where = tmp / "baseline"
    subprocess.run([*git, "worktree", "add", "--detach", "-q", str(where), BASELINE], check=True)
    for shared in (".venv", ".jvm", ".tools"):
        (where / shared).symlink_to(REPO / shared)
    print(f"baseline: the product at {BASELINE} in {where}, building its Java (infra/setup.sh)", flush=True)
    subprocess.run(["bash", str(where / "infra" / "setup.sh")], check=True)
    return where


def remove_checkout(where: Path) -> None:
    if where.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], check=False)


# --- the profile: where a product wave's time goes, from the jobs' logs ---------------------------
PROFILE = re.compile(r"^profile (\S+) batch (\d+) at ([\d.]+) rows (\d+) ms (\{.*\})$")
JOIN_LINE = re.compile(r"^join (\S+) batch (\d+): .*\((\d+) ms(?:: (.*))?\)$")
# a micro-batch's Spark phases, in the order they run. A keyed join publishes inside addBatch, before
# its write: the write and what follows it are after the result is seen on the topic
SPARK_PHASES = ["latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch", "commitOffsets"]


@dataclass
class Batch:
    query: str
    batch: int
    start: float
    ms: dict[str, int]
    engine: dict[str, float]  # a join's own phases inside addBatch

    @property
    def visible(self) -> float:
        """When its output was visible: before the checkpoint's commit log entry."""
        return self.start + (self.ms.get("triggerExecution", 0) - self.ms.get("commitOffsets", 0)) / 1000


def read_batches(*logs: Path) -> list[Batch]:
    batches, engine = [], {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            found = PROFILE.match(line.strip())
            if found:
                query, batch, start, _, ms = found.groups()
                batches.append(Batch(query, int(batch), float(start), json.loads(ms), {}))
            found = JOIN_LINE.match(line.strip())
            if found and found.group(4):
                phases = dict(p.rsplit(" ", 1) for p in found.group(4).split(", "))
                engine[(f"join_{found.group(1)}", int(found.group(2)))] = {
                    k: float(v) for k, v in phases.items()
                }
    for b in batches:
        b.engine = engine.get((b.query, b.batch), {})
    return batches


def _phases(label: str, batches: list[Batch]) -> dict[str, float]:
    """The batches' Spark phases summed (a join's addBatch split into the engine's own phases)."""
    out: dict[str, float] = {}
    for phase in SPARK_PHASES:
        total = float(sum(b.ms.get(phase, 0) for b in batches))
        engine: dict[str, float] = {}
        for b in batches:
            for k, v in b.engine.items():
                engine[k] = engine.get(k, 0.0) + v
        if phase == "addBatch" and engine:
            for k, v in engine.items():
                out[f"{label} addBatch: {k}"] = v
            out[f"{label} addBatch: the rest"] = total - sum(engine.values())
        else:
            out[f"{label} {phase}"] = total
    rest = sum(b.ms.get("triggerExecution", 0) for b in batches) - sum(out.values())
    out[f"{label} the rest of the trigger"] = rest
    return out


def profile(batches: list[Batch], windows: list[tuple[float, float]], join: str) -> dict[str, float]:
    """Per window (produce start -> all visible), where its time went; the median over the windows, in
    ms: the join's micro-batches that start in it, their Spark phases (addBatch split into the engine's
    own), and the gap before the first (the trigger wait and the source's polling; for an initial load,
    also the job's start). The join's last batch goes on after its publish (its write, metrics,
    commit): a row says how long."""
    rows = []
    for start, seen in windows:
        joins = [b for b in batches if start <= b.start <= seen and b.query == join]
        if not joins:
            continue
        row = {"produce -> the join's batch starts": (joins[0].start - start) * 1000}
        row |= _phases("join", joins)
        end = joins[-1].start + joins[-1].ms.get("triggerExecution", 0) / 1000
        row["(seen on the topic -> the join's batch ends: its write and what follows)"] = (end - seen) * 1000
        row["all: produce -> seen"] = (seen - start) * 1000
        row["(join micro-batches)"] = len(joins)
        rows.append(row)
    names = list(dict.fromkeys(k for r in rows for k in r))
    return {k: float(np.median([r.get(k, 0.0) for r in rows])) for k in names}


def start_lake(
    log: Path, root: Path, config_path: Path, *args: str, checkout: Path | None = None, prefix: str = ""
) -> subprocess.Popen:
    """``lake ARGS`` as a job of its own; ``checkout``: the product of another checkout (its code and
    its Java), on the topics named with ``prefix``."""
    out = log.open("wb")  # lives as long as the job
    env = {**os.environ, "LAKE_PROFILE": "1", "LAKE_KAFKA_TOPIC_PREFIX": prefix}
    if checkout:
        env["PYTHONPATH"] = str(checkout)
    if JFR:  # the job's JVM records with Java Flight Recorder into JFR/<log name>.jfr
        Path(JFR).mkdir(parents=True, exist_ok=True)
        recording = Path(JFR).resolve() / f"{log.stem}.jfr"
        env["JAVA_TOOL_OPTIONS"] = (
            f"-XX:StartFlightRecording=filename={recording},settings=profile,dumponexit=true"
        )
    return subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), "--config", str(config_path), *args],
        stdout=out, stderr=out, start_new_session=True, env=env, cwd=checkout,
    )  # fmt: skip


def run_scenario(
    name: str, scenario: Scenario, tmp: Path, bootstrap: str, cluster, config, figures, finals
) -> dict:
    if scenario.peer:
        _run_peer(name, scenario, tmp, bootstrap, cluster, config, figures, finals)
    return _run_product(name, scenario, tmp, bootstrap, cluster, config, figures, finals)


def _run_peer(
    name: str, scenario: Scenario, tmp: Path, bootstrap: str, cluster, config, figures, finals
) -> None:
    from peerkit import Peer

    work = scenario.workload
    seen, final, stop = Seen(), {}, threading.Event()
    out = f"peer_{work.join}"
    follower = threading.Thread(
        target=follow_topic, args=(bootstrap, out, scenario.topic_tokens, seen, final, stop)
    )
    follower.start()
    peer = Peer(scenario.topology, cluster, "peer_" + work.left, "peer_" + work.right, out, tmp / "peer")
    try:
        peer_work = work(cluster, config, "peer_")
        peer_work.visible(seen, None)
        peer_work.run(peer.__enter__, {"topic": figures["peer"]})
        cpu, peak = peer.usage()
        figures["peer"][f"{name}: CPU, s"], figures["peer"][f"{name}: peak memory, MB"] = cpu, peak / 1e6
    finally:
        peer.__exit__(None, None, None)
        stop.set()
        follower.join()
    finals[name] = final
    print(
        f"peer, {name}:",
        {k: round(v, 2) for k, v in figures["peer"].items() if k.startswith(name)},
        flush=True,
    )


def _run_product(
    name: str, scenario: Scenario, tmp: Path, bootstrap: str, cluster, config, figures, finals
) -> dict:
    from peerkit import tree_usage

    work = scenario.workload
    root = tmp / scenario.root
    lake = Lake(root)
    checkout = baseline_checkout(tmp) if scenario.baseline else None
    seen, table_seen, stop, jobs = Seen(), Seen(), threading.Event(), []
    args = (lake, work.join, scenario.table_columns, scenario.table_tokens, table_seen, stop)
    followers = [threading.Thread(target=follow_table, args=args)]
    changelog = f"{scenario.prefix}{work.join}_changelog"
    published: dict = {}
    followers.append(
        threading.Thread(
            target=follow_topic, args=(bootstrap, changelog, scenario.topic_tokens, seen, published, stop)
        )
    )
    for follower in followers:
        follower.start()
    logs = [tmp / f"run-{name}.log"]

    def start_product() -> None:
        config_path = tmp / ("peer_bench.yaml" if scenario.metrics else "peer_bench_no_metrics.yaml")
        jobs.append(
            start_lake(
                logs[0],
                root,
                config_path,
                "run",
                work.join,
                "--continuous",
                "--trigger",
                TRIGGER,
                "--table-every",
                TABLE_EVERY,
                checkout=checkout,
                prefix=scenario.prefix,
            )  # fmt: skip
        )

    workload = work(cluster, config, scenario.prefix)
    workload.label = name  # its figures under its scenario's name (fk and fk-no-metrics share a workload)
    scrapes: list[float] = []  # seconds each scrape took
    if scenario.scrape_every:
        scraper = threading.Thread(
            target=scrape, args=(lake, work.join, scenario.scrape_every, scrapes, stop)
        )
        followers.append(scraper)
        scraper.start()
    try:
        workload.visible(seen, table_seen)
        workload.run(start_product, {"topic": figures["product"], "table": figures["table"]})
        if scenario.scrape_every:
            figures["product"][f"{name}: scrapes"] = len(scrapes)
            figures["product"][f"{name}: scrape p50, ms"] = (
                float(np.median(scrapes) * 1000) if scrapes else 0.0
            )
        cpu, peak = tree_usage([j.pid for j in jobs])
        figures["product"][f"{name}: CPU, s"], figures["product"][f"{name}: peak memory, MB"] = (
            cpu,
            peak / 1e6,
        )
    finally:
        stop.set()
        for follower in followers:
            follower.join()
        for job in jobs:
            job.send_signal(signal.SIGTERM)
        for job in jobs:
            job.wait(timeout=180)
        if checkout:
            remove_checkout(checkout)
    print(
        f"product, {name}:",
        {k: round(v, 2) for k, v in figures["product"].items() if k.startswith(name)},
        flush=True,
    )
    finals[f"{name} changelog"] = published
    if JFR:  # the job's JVM, per workload: JIT and GC CPU, and what its Java samples were doing
        import jfr_profile

        recording = jfr_profile.read(Path(JFR).resolve() / f"{logs[0].stem}.jfr")
        spans = {f"{name}: {w}": jfr_profile.window(recording, s) for w, s in workload.windows.items()}
        print(f"\nthe product's JVM, {name} (Java Flight Recorder)\n" + jfr_profile.table(spans), flush=True)
    batches = read_batches(*logs)
    return {
        f"{name}: {workload_name}": profile(batches, windows, f"join_{work.join}")
        for workload_name, windows in workload.windows.items()
    }


def scrape(lake: Lake, join: str, every: float, took: list[float], stop: threading.Event) -> None:
    """Scrape the running join's Prometheus endpoint (its ``metrics_url``, as ``lake status --json``
    gives it) every ``every`` seconds until ``stop``, as Prometheus would; each scrape's seconds."""
    import urllib.request

    url = None
    while not stop.wait(every):
        if url is None:
            try:
                url = json.loads(lake.layout.job_entry(join).read_text()).get("metrics_url")
            except (OSError, ValueError):
                continue
            if url is None:
                continue
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                answer.read()
        except OSError:
            url = None  # the job restarted (or stopped): ask its entry again
            continue
        took.append(time.perf_counter() - started)


# --- lake explain on the fk result, as a user runs it with the services up -----------------------
EXPLAIN_RUNS = 5


def time_explain(tmp: Path) -> dict[str, list[float]]:
    """Seconds per ``lake explain display_products KEY`` (the whole command, as a user waits for it)
    on the fk result, with the lake root's Spark Connect server up beside the benchmark's broker and
    registry (what ``lake up`` starts), for: a product the waves, the fan-out and the bursts changed
    (its row, its two records, a history of several changes), one unchanged since the first load, and
    a key on neither side (its one-line error, after a scan of both topics). Each answer is checked."""

    def lake(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "spark_jobs.cli", "--root", str(tmp / "lake")]
        command += ["--config", str(tmp / "peer_bench.yaml"), *args]
        return subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "LAKE_KAFKA_TOPIC_PREFIX": ""}
        )

    started = lake("connect", "start")
    if started.returncode:
        raise SystemExit(f"lake connect start: {started.stderr.strip()[-500:]}")
    m = 7 % MERCHANTS
    last = PRODUCTS - 1
    cases = {  # what -> (key, exit code, what the answer must say)
        f"p{m}: changed by waves, the fan-out and {BURSTS} bursts": (
            f"p{m}", 0, [f'title="b{BURSTS}-{m}"', f'merchant="Renamed{m}"', "history (newest first"]
        ),
        f"p{last}: unchanged since the first load": (f"p{last}", 0, [f'title="t{last}"', f'merchant="M{last % MERCHANTS}"']),
        "nokey: on neither side (both topics scanned)": ("nokey", 2, ["no record with this key on either side"]),
    }  # fmt: skip
    times: dict[str, list[float]] = {}
    shown = ""  # the first case's answer, printed as a user sees it
    try:
        for what, (key, code, says) in cases.items():
            for _ in range(EXPLAIN_RUNS):
                t0 = time.time()
                answer = lake("explain", "display_products", key)
                times.setdefault(what, []).append(time.time() - t0)
                text = answer.stdout + answer.stderr
                if answer.returncode != code or not all(s in text for s in says):
                    raise SystemExit(f"lake explain display_products {key}: exit {answer.returncode}, expected "
                                     f"{code} saying {says}:\n{text[-3000:]}")  # fmt: skip
                shown = shown or answer.stdout
            print(f"lake explain display_products {key}:", [round(t, 2) for t in times[what]], flush=True)
        print(shown, flush=True)
    finally:
        lake("connect", "stop")
    return times


def print_against(product: dict[str, float], left: str, right: str, header: str) -> None:
    """The product's figures of scenario ``right`` against its figures of ``left`` in the same run: per
    workload both ran, the two figures and right / left (``header`` names the three columns)."""
    print(f"\n| workload, the product | {header} |\n|---|---|---|---|")
    for name, base in product.items():
        workload = name.removeprefix(f"{left}: ")
        figure = product.get(f"{right}: {workload}")
        if workload != name and figure is not None:
            print(f"| {workload} | {base:,.2f} | {figure:,.2f} | {figure / base:.2f}x |")


def main() -> None:
    from peerkit import clean, differences, table_results

    with (
        tempfile.TemporaryDirectory() as tmp,
        embedded_broker(Path(tmp) / "kafka") as bootstrap,
        embedded_registry(Path(tmp) / "registry"),
    ):
        tmp = Path(tmp)
        os.environ["LAKE_KAFKA_TOPIC_PREFIX"] = ""
        (tmp / "peer_bench.yaml").write_text(PIPELINE)
        (tmp / "peer_bench_no_metrics.yaml").write_text(PIPELINE + "metrics: false\n")
        (tmp / "product.avsc").write_text(json.dumps(PRODUCT_AVRO))
        (tmp / "merchant.avsc").write_text(json.dumps(MERCHANT_AVRO))
        config = load_config(tmp / "peer_bench.yaml")
        cluster = connect(config, tmp / "lake")
        ensure_topics(cluster, config.topics.values())
        copies = [
            replace(s, name=p + s.name) for p in ("peer_", "base_", "nom_") for s in config.topics.values()
        ]
        outs = [replace(copies[0], name=f"peer_{j}", compacted=False) for j in config.joins]
        ensure_topics(cluster, [*copies, *outs])
        figures: dict[str, dict] = {"peer": {}, "product": {}, "table": {}}
        print(
            f"fk: {PRODUCTS:,} products, {MERCHANTS:,} merchants; list: {PERSONS:,} persons x {LIST} of "
            f"{ADDRESSES:,} addresses, one list of {BIG:,}; 4 partitions; machine: {os.cpu_count()} cores"
        )
        finals: dict[str, dict] = {}
        chosen = {name: SCENARIOS[name] for name in sys.argv[1:] or SCENARIOS}  # e.g. "list" only
        profiles = {
            name: run_scenario(name, s, tmp, bootstrap, cluster, config, figures, finals)
            for name, s in chosen.items()
        }

        explained = time_explain(tmp) if "fk" in chosen else {}

        # --- the same final result per key ----------------------------------------------------------
        different = False

        def decoded(records: dict) -> dict:
            return {k.decode(): clean(json.loads(v, parse_float=Decimal)) for k, v in records.items()}

        for name, scenario in chosen.items():
            if name not in finals and "fk" not in finals:
                continue  # fk-avro without fk: no peer run to compare with
            theirs = decoded(finals.get(name) or finals["fk"])  # fk-avro, fk-baseline: the same data as fk
            for where, ours in (
                ("result table", table_results(Lake(tmp / scenario.root), scenario.workload.join)),
                ("changelog topic", decoded(finals[f"{name} changelog"])),
            ):
                diff = differences(ours, theirs)
                different = different or bool(diff)
                print(f"\n{name}: final results: product's {where} {len(ours):,} keys, peer {len(theirs):,} "
                      "keys: " + ("equal" if not diff else "DIFFERENT\n  " + "\n  ".join(diff)))  # fmt: skip

        print(
            "\n| workload | Kafka Streams | product, topic | product / peer | product, result table | "
            "product / peer |\n|---|---|---|---|---|---|"
        )
        for name, theirs in figures["peer"].items():
            cells = [f"{theirs:,.2f}"]
            for where in ("product", "table"):
                mine = figures[where].get(name)
                cells += [f"{mine:,.2f}", f"{mine / theirs:.2f}x"] if mine is not None else ["", ""]
            print(f"| {name} | " + " | ".join(cells) + " |")

        if "fk-avro" in chosen and "fk" in chosen:
            print_against(figures["product"], "fk", "fk-avro", "JSON values | Avro values | Avro / JSON")
        if "fk-no-metrics" in chosen and "fk" in chosen:
            header = f"metrics off | on, scraped every {SCRAPE_EVERY:g} s | on / off"
            print_against(figures["product"], "fk-no-metrics", "fk", header)
        if "fk-baseline" in chosen and "fk" in chosen:
            header = f"at {BASELINE} (baseline) | this checkout | this / baseline"
            print_against(figures["product"], "fk-baseline", "fk", header)

        if explained:
            print("\n| lake explain display_products KEY, the Spark Connect server up | runs, s | median, s | max, s |"
                  "\n|---|---|---|---|")  # fmt: skip
            for what, times in explained.items():
                runs = ", ".join(f"{t:.2f}" for t in times)
                print(f"| {what} | {runs} | {float(np.median(times)):.2f} | {max(times):.2f} |")

        parts = {name: p for by_join in profiles.values() for name, p in by_join.items()}
        rows = list(dict.fromkeys(k for p in parts.values() for k in p))
        print(
            "\nwhere the product's time goes, ms (from its jobs' logs; a workload run more than once: the median)"
        )
        print("| part | " + " | ".join(parts) + " |\n|---|" + "---|" * len(parts))
        for row in rows:
            print(
                f"| {row} | "
                + " | ".join(f"{p[row]:,.0f}" if row in p else "" for p in parts.values())
                + " |"
            )
        if different:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
