"""The fault suite (``make faults``): the product on a 3-broker Kafka cluster (KRaft, SCRAM, 3 replicas,
2 in sync; :mod:`faultkit`) while brokers and join drivers are killed with SIGKILL, run only through the
``lake`` command as an operator runs it, then checked exactly against what was produced.

1. **Produce under a broker kill.** Merchants, addresses, products and persons are produced in
   transactions of ``BATCH`` lines; the broker leading ``products`` partition 0 is killed between two
   of them and restarted after the next. A ``lake produce`` that fails is run again as it was (one
   transaction per call: nothing of a failed call is visible).
2. **Ingest and the continuous joins under broker kills.** The continuous ingest and the fk join
   (``display_products``) and the list join (``people_with_addresses``) run detached (``lake ingest
   --detach``, ``lake start``) while waves of updates arrive (moved and deleted products, renamed
   merchants that fan out, edited and deleted lists, changed addresses). The leader of a ``products``
   partition, then of a ``persons`` partition, is killed and restarted mid-wave. Recovery time: from
   the kill until both joins have read every record of the wave (``lake status --json``).
3. **Each join's driver killed at each commit point** of a micro-batch (``LAKE_KILL_AT``: offsets
   written, changelog committed, rows parked for the table, a catch-up MERGE in, the result committed),
   a wave before each; the next run (``lake run --once``) resumes. Recovery time: that run.

Then ``lake ingest --once``, and the checks, each exact:
- every input topic holds each produced record once, in produced order per key (``lake consume``,
  read_committed);
- bronze holds each topic offset once, up to the topics' end (``lake sql``);
- each join's result (``lake show --json``) equals a model computed here from what was produced;
- ``lake audit`` finds each result identical to the batch join of its topics;
- each changelog topic (read_committed) ends, per key, at the model's row (a deleted key at a
  tombstone), and no record repeats the one before it for its key (a batch published twice).

Figures go to stdout (``bench-results/faults.txt``) and docs/benchmarks.md. Usage: faults.py [--products N]
[--persons N] [--waves N] [--keep DIR] (the lake and the cluster's logs stay in DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faultkit import KafkaCluster  # noqa: E402

JOINS = ("display_products", "people_with_addresses")
POINTS = (  # the commit points of spark_jobs/faults.py, each with the --table-every that reaches it
    ("batch", ["--table-every", "1"]),
    ("publish", ["--table-every", "1"]),
    ("park", ["--table-every", "1"]),
    ("fold", ["--table-every", "1"]),
    ("write", []),
)
BATCH = 1000  # lines per `lake produce` call (one transaction each)

PIPELINE = """\
pipeline: faults
description: the fault suite's fk and list joins on a 3-broker SCRAM cluster
kafka:
  bootstrap_servers: {bootstrap}
  security.protocol: SASL_PLAINTEXT
  sasl.mechanism: SCRAM-SHA-512
  sasl.username: {user}
  sasl.password: ${{FAULTS_KAFKA_PASSWORD}}
topics:
  products: {{partitions: 3, value: json}}
  merchants: {{partitions: 2, value: json}}
  persons: {{partitions: 2, value: json}}
  addresses: {{partitions: 3, value: json}}
joins:
  display_products:
    kind: fk
    left: products
    right: merchants
    foreign_key: merchant_id
    type: left
    select:
      title: left.title
      rev: cast(left.rev AS bigint)
      merchant_id: left.merchant_id
      merchant: right.name
      merchant_rev: cast(right.rev AS bigint)
    publish: true
  people_with_addresses:
    kind: list
    left: persons
    right: addresses
    list: address_ids
    select:
      name: left.name
    elements:
      street: right.street
    as: addresses
    publish: true
"""


class Lake:
    """The ``lake`` command on the suite's root and pipeline."""

    def __init__(self, root: Path, config: Path, password: str):
        self.root, self.config = root, config
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_KAFKA_")}
        self.env |= {"FAULTS_KAFKA_PASSWORD": password, "LAKE_SPARK_UI": "false"}

    def args(self, *args: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "spark_jobs.cli",
            "--root",
            str(self.root),
            "--config",
            str(self.config),
            *args,
        ]

    def __call__(self, *args: str, stdin: str | None = None, ok: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.args(*args), input=stdin, capture_output=True, text=True, env=self.env)
        if ok and proc.returncode != 0:
            raise SystemExit(
                f"lake {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}"
            )
        return proc

    def popen(self, *args: str, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            self.args(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env | env
        )


class Workload:
    """What is produced, and the model of each topic: key -> its values in produced order (None: a
    tombstone). Every value carries a new revision, so no two records of a key are equal."""

    def __init__(self, seed: int, products: int, persons: int):
        self.rng = random.Random(seed)
        self.n_products, self.n_persons = products, persons
        self.n_merchants, self.n_addresses = max(products // 20, 10), max(persons // 3, 10)
        self.sent: dict[str, dict[str, list]] = {
            t: {} for t in ("products", "merchants", "persons", "addresses")
        }
        self.rev = 0
        self.produce_retries = 0

    def _next(self) -> int:
        self.rev += 1
        return self.rev

    def merchant(self, i: int) -> tuple[str, dict]:
        rev = self._next()
        return f"m{i}", {"name": f"M{i} r{rev}", "rev": rev}

    def product(self, i: int) -> tuple[str, dict]:
        rev = self._next()
        value: dict = {"title": f"P{i} r{rev}", "rev": rev}
        draw = self.rng.random()
        if draw < 0.9:
            value["merchant_id"] = f"m{self.rng.randrange(self.n_merchants)}"
        elif draw < 0.95:
            value["merchant_id"] = f"m{self.n_merchants + self.rng.randrange(5)}"  # never produced
        return f"p{i}", value  # else no merchant_id: a product without a merchant

    def address(self, i: int) -> tuple[str, dict]:
        rev = self._next()
        return f"a{i}", {"street": f"S{i} r{rev}"}

    def person(self, i: int) -> tuple[str, dict]:
        rev = self._next()
        ids = [f"a{self.rng.randrange(self.n_addresses + 3)}" for _ in range(self.rng.randrange(5))]
        if ids and self.rng.random() < 0.2:
            ids.append(ids[0])  # a list may name an address twice
        return f"u{i}", {"name": f"U{i} r{rev}", "address_ids": ids}

    def produce(self, lake: Lake, topic: str, records: list[tuple[str, dict | None]]) -> None:
        for start in range(0, len(records), BATCH):
            chunk = records[start : start + BATCH]
            lines = "".join(f"{k};{json.dumps(v) if v is not None else ''}\n" for k, v in chunk)
            for attempt in range(5):
                proc = lake("produce", topic, "-K", ";", "-Z", stdin=lines, ok=False)
                if proc.returncode == 0:
                    break
                self.produce_retries += 1
                print(f"  lake produce {topic} failed, run again: {proc.stderr.strip().splitlines()[-1]}")
                time.sleep(2 * (attempt + 1))
            else:
                raise SystemExit(f"lake produce {topic} failed 5 times: {proc.stderr.strip()[-1000:]}")
            for k, v in chunk:
                self.sent[topic].setdefault(k, []).append(v)

    def initial(self) -> dict[str, list]:
        return {
            "merchants": [self.merchant(i) for i in range(self.n_merchants)],
            "addresses": [self.address(i) for i in range(self.n_addresses)],
            "products": [self.product(i) for i in range(self.n_products)],
            "persons": [self.person(i) for i in range(self.n_persons)],
        }

    def wave(self, size: int) -> dict[str, list]:
        """Updates: products moved or changed, a few deleted (and some of those produced again);
        merchants renamed (each reaches every product pointing at it); lists edited or deleted;
        addresses changed."""
        rng = self.rng

        def some(n: int, k: int) -> list[int]:
            return rng.sample(range(n), min(k, n))

        products = [self.product(i) for i in some(self.n_products, size)]
        products += [(f"p{i}", None) for i in some(self.n_products, size // 20)]
        persons = [self.person(i) for i in some(self.n_persons, size // 2)]
        persons += [(f"u{i}", None) for i in some(self.n_persons, size // 40)]
        return {
            "products": products,
            "merchants": [self.merchant(i) for i in some(self.n_merchants, max(size // 50, 2))],
            "persons": persons,
            "addresses": [self.address(i) for i in some(self.n_addresses, size // 10)],
        }

    def send(self, lake: Lake, records: dict[str, list]) -> int:
        for topic in ("merchants", "addresses", "products", "persons"):
            if topic in records:
                self.produce(lake, topic, records[topic])
        return sum(len(r) for r in records.values())

    def latest(self, topic: str) -> dict[str, dict]:
        return {k: vs[-1] for k, vs in self.sent[topic].items() if vs[-1] is not None}

    def expected(self, join: str) -> dict[str, dict]:
        """Each join's result rows by key, as the join's rules give them (docs/joins.md)."""
        if join == "display_products":
            merchants = self.latest("merchants")
            out = {}
            for key, p in self.latest("products").items():
                m = merchants.get(p.get("merchant_id") or "")
                out[key] = {
                    "title": p["title"],
                    "rev": p["rev"],
                    "merchant_id": p.get("merchant_id"),
                    "merchant": m["name"] if m else None,
                    "merchant_rev": m["rev"] if m else None,
                }
            return out
        addresses = self.latest("addresses")
        return {
            key: {
                "name": p["name"],
                "addresses": [
                    {"id": a, "matched": a in addresses, "street": addresses.get(a, {}).get("street")}
                    for a in p["address_ids"]
                ],
            }
            for key, p in self.latest("persons").items()
        }


def records_behind(lake: Lake) -> dict[str, int]:
    out = {}
    for line in lake("status", "--json").stdout.splitlines():
        entry = json.loads(line)
        if "join" in entry:
            out[entry["join"]] = sum((entry.get("records_behind") or {}).values()) + int(
                entry.get("table_behind") or 0
            )
    return out


def caught_up(lake: Lake, since: float, timeout: float = 600) -> float:
    """Seconds from ``since`` until both joins have read every record and written their tables."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        behind = records_behind(lake)
        if all(behind.get(j) == 0 for j in JOINS):
            return time.monotonic() - since
        time.sleep(1)
    raise SystemExit(f"the joins did not catch up within {timeout:.0f} s: {records_behind(lake)}")


def consume(lake: Lake, topic: str) -> list[tuple[str, str | None]]:
    out = lake("consume", topic, "-f", "%k\t%s\n", "-Z").stdout
    rows = []
    for line in out.splitlines():
        key, value = line.split("\t", 1)
        rows.append((key, None if value == "NULL" else value))
    return rows


def check(lake: Lake, work: Workload) -> dict[str, int]:
    figures = {"lost": 0, "duplicates": 0, "topic records": 0, "changelog records": 0}
    problems: list[str] = []
    for topic, sent in work.sent.items():  # each produced record once, in order per key
        seen: dict[str, list] = {}
        for key, value in consume(lake, topic):
            seen.setdefault(key, []).append(None if value is None else json.loads(value))
        figures["topic records"] += sum(len(v) for v in seen.values())
        for key in sent.keys() | seen.keys():
            got, want = seen.get(key, []), sent.get(key, [])
            if got != want:
                extra = max(len(got) - len(want), 0)
                figures["duplicates"] += extra
                figures["lost"] += max(len(want) - len(got), 0)
                problems.append(f"{topic} {key}: produced {len(want)} records, the topic holds {len(got)}")
    topics = list(work.sent)  # bronze: each offset once, up to the end (one Spark start for all)
    queries = [f"SELECT count(*), count(DISTINCT partition, offset) FROM lake.{t}" for t in topics]
    blocks = [b for b in lake("sql", *queries).stdout.split("\n\n") if b.strip()]
    for topic, block in zip(topics, blocks, strict=True):
        count, distinct = block.split()[-2:]
        total = sum(len(v) for v in work.sent[topic].values())
        if not int(count) == int(distinct) == total:
            problems.append(f"bronze {topic}: {count} rows, {distinct} distinct offsets, {total} produced")
    for join in JOINS:
        want = work.expected(join)
        shown = {}
        for line in lake("show", join, "--json").stdout.splitlines():
            row = json.loads(line)
            shown[row.pop("key")] = row
        for key in want.keys() | shown.keys():
            if shown.get(key) != want.get(key):
                figures["lost"] += 1
                problems.append(f"{join} {key}: the table holds {shown.get(key)}, the model {want.get(key)}")
        audit = lake("audit", join, ok=False)
        if audit.returncode != 0 or ": identical" not in audit.stdout:
            problems.append(f"lake audit {join}: {audit.stdout.strip()} {audit.stderr.strip()[-500:]}")
        last: dict[str, dict | None] = {}
        records = consume(lake, f"{join}_changelog")
        figures["changelog records"] += len(records)
        for key, value in records:
            parsed = None if value is None else json.loads(value)
            if key in last and last[key] == parsed:
                figures["duplicates"] += 1
                problems.append(f"{join}_changelog {key}: the same record twice in a row")
            last[key] = parsed
        for key in want.keys() | last.keys():
            if last.get(key) != want.get(key):
                figures["lost"] += 1
                problems.append(f"{join}_changelog {key}: ends at {last.get(key)}, the model {want.get(key)}")
    for p in problems[:20]:
        print(f"  MISMATCH {p}")
    kinds: dict[str, int] = {}
    for p in problems:
        kind = p.split(" ")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    if kinds:
        print(f"  mismatches by where: {kinds}")
    figures["problems"] = len(problems)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--products", type=int, default=3000)
    parser.add_argument("--persons", type=int, default=1000)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--wave-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument("--keep", type=Path, help="keep the lake and the cluster's logs in this folder")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="lake-faults-"))
    folder.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    cluster = KafkaCluster(folder / "kafka")
    print(f"== a 3-broker cluster (KRaft, SCRAM-SHA-512, RF 3, min ISR 2) under {folder}")
    cluster.start()
    print(f"  up at {cluster.bootstrap_servers} in {time.monotonic() - started:.1f} s")
    config = folder / "faults.yaml"
    config.write_text(PIPELINE.format(bootstrap=cluster.bootstrap_servers, user="lake"))
    lake = Lake(folder / "lake", config, cluster.password)
    work = Workload(args.seed, args.products, args.persons)
    faults: list[tuple[str, str, float]] = []  # (what, where, seconds to recover)
    try:
        wrong = Lake(lake.root, config, "not-the-password")("topics", ok=False)
        print(f"  a wrong password: exit {wrong.returncode}, {wrong.stderr.strip()}")
        assert wrong.returncode == 2 and len(wrong.stderr.strip().splitlines()) == 1

        print(
            f"== 1. produce {args.products} products, {args.persons} persons and their lookups; a broker killed mid-produce"
        )
        first = work.initial()
        work.send(lake, {t: first[t] for t in ("merchants", "addresses")})
        half = len(first["products"]) // 2
        work.produce(lake, "products", first["products"][:half])
        victim = cluster.leader("products", 0)
        killed_at = time.monotonic()
        cluster.kill(victim)
        print(f"  killed broker {victim} (leader of products partition 0)")
        work.produce(lake, "products", first["products"][half:])
        produce_s = time.monotonic() - killed_at
        back = cluster.restart(victim)
        faults.append(("broker kill -9 during produce", f"broker {victim}", produce_s))
        print(
            f"  the rest of products went on without it ({produce_s:.1f} s); broker {victim} back in {back:.1f} s"
        )
        work.produce(lake, "persons", first["persons"])

        print("== 2. continuous ingest and joins; brokers killed mid-wave")
        lake("ingest", "--detach")
        for join in JOINS:
            lake("start", join)
        caught_up(lake, time.monotonic())
        for n in range(args.waves):
            topic = ("products", "persons")[n % 2] if n in (1, 2) else None
            victim = cluster.leader(topic, 0) if topic else None
            if victim:
                cluster.kill(victim)
            since = time.monotonic()
            sent = work.send(lake, work.wave(args.wave_size))
            took = caught_up(lake, since)
            if victim:
                back = cluster.restart(victim)
                faults.append(
                    ("broker kill -9 under the running joins", f"broker {victim} ({topic} leader)", took)
                )
                print(
                    f"  wave {n + 1}: {sent} records; broker {victim} killed: both joins caught up in {took:.1f} s; back in {back:.1f} s"
                )
            else:
                print(f"  wave {n + 1}: {sent} records; both joins caught up in {took:.1f} s")
        for join in JOINS:
            lake("stop", join)
        lake("ingest", "--stop")

        print("== 3. each join's driver killed at each commit point (each run resumes the one killed before)")
        for point, extra in POINTS:
            work.send(lake, work.wave(args.wave_size // 4))
            for join in JOINS:
                since = time.monotonic()
                proc = lake.popen("run", join, "--continuous", "--trigger", "0.5", *extra, LAKE_KILL_AT=point)
                try:
                    code = proc.wait(timeout=900)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                if code != -signal.SIGKILL:
                    raise SystemExit(
                        f"{join} at {point}: exit {code}, not killed: {proc.stderr.read()[-1500:]}"
                    )
                faults.append((f"driver kill -9 after '{point}'", join, time.monotonic() - since))
            print(f"  {point}: both drivers resumed the kill before and were killed there")
        for join in JOINS:
            since = time.monotonic()
            lake("run", join, "--once")
            faults.append(("the run after the last kill", join, time.monotonic() - since))
        lake("ingest", "--once")

        print("== checks: topics, bronze, results, audits, changelogs (read_committed), against the model")
        figures = check(lake, work)
    finally:
        for join in JOINS:
            lake("stop", join, ok=False)
        lake("ingest", "--stop", ok=False)
        cluster.stop()
    produced = sum(len(v) for t in work.sent.values() for v in t.values())
    print()
    print("| fault | where | recovered in |")
    print("|---|---|---|")
    for what, where, took in faults:
        print(f"| {what} | {where} | {took:.1f} s |")
    print()
    print(
        f"records produced {produced}, on the topics {figures['topic records']}, changelog records "
        f"{figures['changelog records']}; faults {len(faults)}; produce calls run again "
        f"{work.produce_retries}; duplicates {figures['duplicates']}; lost {figures['lost']}; "
        f"mismatches {figures['problems']}; {time.monotonic() - started:.0f} s in all"
    )
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if figures["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
