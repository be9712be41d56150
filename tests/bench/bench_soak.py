"""Benchmark: steady state against Kafka Streams. The fk join (``display_products``, the KIP-213 left
join of bench_peer) and the Kafka Streams peer (``tests/bench/peer``: exactly-once v2, commit 100 ms,
2 stream threads), each alone on the same broker, under product updates produced at a steady rate for
minutes, as a join runs for months: what a user pays per record once the JVMs have warmed up, whether
memory stays flat, and how stale the result is on the topic and in the Delta table.

Per system (the peer first, then the product, each on its own copy of the topics): PRODUCTS products
(default 1,000,000) on PRODUCTS / 10 merchants are loaded and the system started; once every product's
result is visible, product updates go out at each rate of SOAK_RATES (default 1,000 and 5,000 a
second) for SOAK_LEVEL_MINUTES each (default SOAK_MINUTES / 3), then a ramp finds the highest rate the
system sustains (steps of SOAK_RAMP_SECONDS, x1.5 until the lag grows, then one step between), and
that rate runs for SOAK_MINUTES (default 30; 0: the levels only), then the first rate again for
SOAK_WARM_MINUTES (default SOAK_LEVEL_MINUTES; none when the top level does not run): its CPU per record
on JVMs that have compiled their hot code, where the first level's includes the JIT compilers' warm-up
(at 1,000/s the product's first level took 1.18 s per 1,000 records, its warm level 1.02). A rate is
sustained when the producer kept it and the lag at the step's end is under SUSTAINED_LAG seconds of records and not
growing, up to SOAK_MAX_RATE (default 50,000/s: past it this process, which produces the load and
reads every result in one interpreter, measures itself).

Every update is one product's new title ``s<seq>-<ms>`` (the produce time, ms), each product updated
once per cycle through all of them in a shuffled order. Per SOAK_SAMPLE_SECONDS (default 60) a row:
CPU seconds per 1,000 records of every process of the system (the product: ``lake run`` and its JVM;
the peer: its JVM), their resident memory, the state's size on disk (the product: its checkpoint with
RocksDB; the peer: its state directory), the lag of its consumer group on the products topic in
records and in seconds (now - the timestamp of the next record it has not committed, as Kafka's lag
exporters compute it), and produce -> visible p50 / p99: on the output topic (the peer's, the
product's changelog; read committed) and, for the product, in its Delta result table (each commit's
change-data files read with pyarrow as it appears, no Spark in this process), which ``--table-every
SOAK_TABLE_EVERY`` (default 5 s) writes behind the changelog, and in its current view
(``lake.<join>__current``: the table with the pending rows each micro-batch appends, ``<join>__parked``,
over it), where an update is visible from the first commit of either table that holds it. Once loaded, the product's time from ``lake run`` to the end of its
first micro-batch, as ``lake status`` says.

A level's steady state leaves out its first sample (the change of rate); the top level's is its last
two thirds (20 of 30 minutes). Memory rule: over the top level's steady window, the resident memory of
the product's processes may grow by at most SOAK_MAX_GROWTH % (default 5; the slope of a least-squares
line times the window, over its start): more fails the run (exit 1), as a leak in the state, the
registry caches, the producers or Delta's log cache would. At the end each system's final result per
product must be the last update produced for it, with its merchant (the product's changelog and its
table both), or the run fails.

Figures go to ``bench-results/soak.json``, the plot of CPU per 1,000 records and resident memory over
the run to ``bench-results/soak.png`` (an SVG drawn here, rendered by the system Chromium). Run with
``make bench-soak``; SOAK_SYSTEMS=product (or peer) runs one of them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import psutil
from bench_peer import FK_JOIN, MERCHANT, TITLE, merchant_values, prefixed, product_values
from benchkit import committed_rows, embedded_broker

from spark_jobs.config import load_config
from spark_jobs.layout import join_table
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import connect, ensure_topics, produce

PRODUCTS = int(os.environ.get("SOAK_PRODUCTS", "1000000"))
MERCHANTS = max(PRODUCTS // 10, 1)
RATES = [int(r) for r in os.environ.get("SOAK_RATES", "1000,5000").split(",")]
TOP_MINUTES = float(os.environ.get("SOAK_MINUTES", "30"))
LEVEL_MINUTES = float(os.environ.get("SOAK_LEVEL_MINUTES", str(max(TOP_MINUTES / 3, 1.0))))
WARM_MINUTES = float(os.environ.get("SOAK_WARM_MINUTES", str(LEVEL_MINUTES if TOP_MINUTES else 0)))
RAMP_SECONDS = float(os.environ.get("SOAK_RAMP_SECONDS", "90"))
SAMPLE = float(os.environ.get("SOAK_SAMPLE_SECONDS", "60"))
MAX_GROWTH = float(os.environ.get("SOAK_MAX_GROWTH", "5"))
SYSTEMS = os.environ.get("SOAK_SYSTEMS", "peer,product").split(",")
TRIGGER = os.environ.get("SOAK_TRIGGER", "0.1")
TABLE_EVERY = os.environ.get("SOAK_TABLE_EVERY", "5")
# the highest rate tried: one Python process produces the load and reads every result, and past this
# it measures itself (its producer and its reader share one interpreter lock and the system's cores)
MAX_RATE = int(os.environ.get("SOAK_MAX_RATE", "50000"))
LAG_EVERY = 5.0  # seconds between readings of a system's lag
SUSTAINED_LAG = 10.0  # seconds of records behind at a step's end: more is not keeping up
OUT = Path(os.environ.get("SOAK_OUT", "bench-results"))
JOIN = "display_products"

PIPELINE = (
    """\
pipeline: soak
topics:
  products: {partitions: 4}
  merchants: {partitions: 4}
joins:
"""
    + FK_JOIN
)

UPDATE = re.compile(rb'"title":"s(\d+)-(\d+)"')


# --- the load: product updates at a steady rate ------------------------------------------------
class Load(threading.Thread):
    """Product updates onto one system's products topic at the rate last :meth:`set`, from a thread of
    its own: each product once per cycle through all of them (a shuffled order), its title
    ``s<seq>-<ms>``. ``sent``: the records produced so far."""

    def __init__(self, bootstrap: str, topic: str):
        from confluent_kafka import Producer

        super().__init__(daemon=True)
        self.topic = topic
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
             "partitioner": "murmur2_random", "queue.buffering.max.messages": 2_000_000}
        )  # fmt: skip
        self.order = np.random.default_rng(7).permutation(PRODUCTS).tolist()
        self.sent = 0
        self.last: dict[int, bytes] = {}  # product -> the title of its last update
        self.stopped = threading.Event()
        self.set(0)

    def set(self, rate: float) -> None:
        self.plan = (rate, time.time(), self.sent)  # one assignment: the thread reads it whole

    def run(self) -> None:
        produce, poll, order, topic = self.producer.produce, self.producer.poll, self.order, self.topic
        while not self.stopped.is_set():
            rate, since, base = self.plan
            now = time.time()
            due = int(rate * (now - since)) - (self.sent - base)
            ms = int(now * 1000)
            for _ in range(max(due, 0)):
                seq = self.sent
                i = order[seq % PRODUCTS]
                title = b"s%d-%d" % (seq, ms)
                value = b'{"title":"%s","price":9.99,"merchant_id":"m%d"}' % (title, i % MERCHANTS)
                while True:
                    try:
                        produce(topic, value, b"p%d" % i)
                        break
                    except BufferError:  # librdkafka's queue is full: let it drain
                        poll(0.05)
                self.last[i] = title
                self.sent = seq + 1
            poll(0)
            time.sleep(0.01)
        self.producer.flush(60)

    def stop(self) -> None:
        self.stopped.set()
        self.join()

    def expected(self) -> dict[str, tuple[str, str]]:
        """Product key -> (title, merchant) its result must show at the end."""
        return {
            f"p{i}": ((self.last[i] if i in self.last else b"t%d" % i).decode(), f"M{i % MERCHANTS}")
            for i in range(PRODUCTS)
        }


# --- where results become visible ------------------------------------------------------------------
class Latencies:
    """Produce -> visible, ms, of the updates seen since the last ``take()``."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self.lock = threading.Lock()

    def add(self, values: list[int]) -> None:
        with self.lock:
            self.values += values

    def take(self) -> np.ndarray:
        with self.lock:
            taken, self.values = self.values, []
        return np.array(taken, dtype=np.float64)


def follow_topic(bootstrap: str, topic: str, seen: Latencies, final: dict, stop: threading.Event) -> None:
    """Read the output topic (read committed) as results arrive: each update's latency, and the last
    value per key."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"soak-{time.time()}", "isolation.level": "read_committed",
         "enable.auto.commit": False, "fetch.wait.max.ms": 10}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
    try:
        while not stop.is_set():
            messages = consumer.consume(10_000, 0.05)
            now = int(time.time() * 1000)
            latencies = []
            for m in messages:
                if m.error():
                    continue
                value = m.value()
                final[m.key()] = value
                found = UPDATE.search(value) if value else None
                if found:
                    latencies.append(now - int(found[2]))
            seen.add(latencies)
    finally:
        consumer.close()


def latency(now: int, title: str) -> int:
    """Milliseconds from an update's produce (its title ``s<seq>-<ms>``) to ``now``."""
    return now - int(title.rsplit("-", 1)[1])


class FirstSeen:
    """The current view's latencies: each update as it first appears in either table the view reads
    (the result, the rows pending for it)."""

    def __init__(self, seen: Latencies) -> None:
        self.seen, self.once, self.lock = seen, set[str](), threading.Lock()

    def add(self, now: int, titles: list[str]) -> None:
        fresh = []
        with self.lock:
            for title in titles:
                if title in self.once:  # its second table: forgotten, it is seen in both
                    self.once.discard(title)
                else:
                    self.once.add(title)
                    fresh.append(latency(now, title))
        self.seen.add(fresh)


def follow_table(table: Path, seen: Latencies | None, view: FirstSeen, stop: threading.Event) -> None:
    """Each commit of a Delta table as it appears: its updates' latencies (into ``seen``, and into
    ``view`` when first seen there)."""
    version = 0
    while not stop.is_set():
        while (table / "_delta_log" / f"{version:020d}.json").exists():
            now = int(time.time() * 1000)
            titles = [
                t for t in committed_rows(table, version, ["title"])["title"] if t and t.startswith("s")
            ]
            if seen is not None:
                seen.add([latency(now, t) for t in titles])
            view.add(now, titles)
            version += 1
        time.sleep(0.05)


# --- what a system costs, and how far behind it is --------------------------------------------------
NMT = os.environ.get("SOAK_NMT") == "1"  # the product's JVM with Native Memory Tracking, read per sample
NMT_TOTAL = re.compile(r"Total: reserved=\d+KB, committed=(\d+)KB")
NMT_HEAP = re.compile(r"Java Heap \(reserved=\d+KB, committed=(\d+)KB")


class JvmMemory:
    """The product's memory beside its resident size: its state store's (the join's Prometheus
    gauge ``lake_spark_state_bytes``, the state operators' ``memoryUsedBytes``: RocksDB's memtables
    and block cache) and, with SOAK_NMT=1, the JVM's own accounts (``jcmd VM.native_memory``): the
    heap, the JVM's other memory, and what the process holds beyond them (native allocations the JVM
    does not see: RocksDB's, the codecs')."""

    def __init__(self, pid: int, lake: Lake):
        self.pid, self.lake, self.url = pid, lake, None

    def split(self) -> dict:
        out: dict = {"state memory MB": self._state_mb()}
        if not NMT:
            return out
        java = next((p for p in processes(self.pid) if p.name() == "java"), None)
        if java is None:
            return out
        done = subprocess.run(
            ["jcmd", str(java.pid), "VM.native_memory", "summary"], capture_output=True, text=True, timeout=60
        )
        total, heap = NMT_TOTAL.search(done.stdout), NMT_HEAP.search(done.stdout)
        if total and heap:
            tracked, heap_mb = int(total[1]) / 1024, int(heap[1]) / 1024
            out |= {"heap MB": heap_mb, "jvm other MB": tracked - heap_mb,
                    "untracked MB": java.memory_info().rss / 2**20 - tracked}  # fmt: skip
        return out

    def _state_mb(self) -> float | None:
        import urllib.request

        try:
            if self.url is None:
                self.url = json.loads(self.lake.layout.job_entry(JOIN).read_text()).get("metrics_url")
            with urllib.request.urlopen(self.url, timeout=10) as answer:
                text = answer.read().decode()
        except (OSError, ValueError, TypeError):
            self.url = None  # not up yet, or restarted: its entry is read again next time
            return None
        found = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("lake_spark_state_bytes")
        ]
        return sum(found) / 2**20 if found else None


def processes(pid: int) -> list[psutil.Process]:
    try:
        top = psutil.Process(pid)
        return [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def usage(pid: int) -> tuple[float, dict[str, float]]:
    """CPU seconds so far of the process and its descendants, and each one's resident MB by name."""
    cpu, rss = 0.0, {}
    for p in processes(pid):
        try:
            times, memory, name = p.cpu_times(), p.memory_info(), p.name()
        except psutil.NoSuchProcess:
            continue
        cpu += times.user + times.system
        rss[name] = rss.get(name, 0.0) + memory.rss / 1e6
    return cpu, rss


def size_mb(folder: Path) -> float:
    total = 0
    for path in folder.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except OSError:
            pass  # compacted away while walking
    return total / 1e6


class Lag(threading.Thread):
    """The lag of a consumer group on a topic, as Kafka's lag exporters compute it, read every LAG_EVERY
    seconds: records between its committed offsets and the ends, and seconds since the timestamp of its
    next uncommitted record. A micro-batch system's lag saws up and down with its batches, so a sample
    gives the readings' mean (and the largest)."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        super().__init__(daemon=True)
        self.group, self.topic = group, topic
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"soak-lag-{time.time()}", "enable.auto.commit": False,
             "isolation.level": "read_committed"}
        )  # fmt: skip
        self.readings: list[tuple[float, int, float]] = []  # (when, records, seconds) since take()
        self.latest: tuple[float, int, float] = (0.0, 0, 0.0)
        self.lock, self.stopped = threading.Lock(), threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            reading = (time.time(), *self.read())
            with self.lock:
                self.readings.append(reading)
                self.latest = reading
            self.stopped.wait(LAG_EVERY)

    def take(self) -> list[tuple[float, int, float]]:
        with self.lock:
            taken, self.readings = self.readings, []
        return taken or [self.latest]

    def read(self) -> tuple[int, float]:
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

        asked = ConsumerGroupTopicPartitions(self.group, [TopicPartition(self.topic, p) for p in range(4)])
        answer = self.admin.list_consumer_group_offsets([asked], request_timeout=30)[self.group].result(
            timeout=60
        )
        records, oldest = 0, None
        for tp in answer.topic_partitions:
            end = self.consumer.get_watermark_offsets(TopicPartition(self.topic, tp.partition), 10)[1]
            committed = max(tp.offset, 0)
            if committed >= end:
                continue
            records += end - committed
            self.consumer.assign([TopicPartition(self.topic, tp.partition, committed)])
            for m in self.consumer.consume(1, 5):
                if not m.error():
                    stamp = m.timestamp()[1] / 1000
                    oldest = stamp if oldest is None else min(oldest, stamp)
        return records, (time.time() - oldest) if oldest else 0.0

    def close(self) -> None:
        self.stopped.set()
        self.join()
        self.consumer.close()


@dataclass
class System:
    """One running system under measure: its top process, where its state lives, its lag."""

    name: str
    pid: int
    state: Path
    lag: Lag
    topic: Latencies = field(default_factory=Latencies)
    table: Latencies | None = None
    view: Latencies | None = None  # the current view: the table and the rows pending for it (--table-every)
    memory: JvmMemory | None = None  # the product's JVM memory, split
    rows: list[dict] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    cpu: float = 0.0
    bench_cpu: float = 0.0

    def rebase(self) -> None:
        """CPU and lag counted from now (not the load or the idle drain before a level)."""
        self.cpu, self.bench_cpu = usage(self.pid)[0], sum(psutil.Process().cpu_times()[:2])
        self.lag.take()

    def sample(self, level: str, rate: float, produced: int, seconds: float) -> dict:
        cpu, rss = usage(self.pid)
        mine = sum(psutil.Process().cpu_times()[:2])  # the load, the followers, this sampler
        readings = self.lag.take()
        topic, table = self.topic.take(), self.table.take() if self.table else None
        view = self.view.take() if self.view else None

        def pct(values, q):
            return float(np.percentile(values, q)) / 1000 if values is not None and len(values) else None

        row = {
            "system": self.name, "level": level, "rate": rate, "minute": (time.time() - self.started) / 60,
            "produced/s": produced / seconds, "cpu cores": (cpu - self.cpu) / seconds,
            "bench cores": (mine - self.bench_cpu) / seconds,
            "cpu s / 1000": (cpu - self.cpu) / produced * 1000 if produced else None,
            "rss MB": sum(rss.values()), "rss": rss, "state MB": size_mb(self.state),
            "lag records": int(np.mean([r[1] for r in readings])), "lag s": float(np.mean([r[2] for r in readings])),
            "lag max s": max(r[2] for r in readings),
            "topic p50 s": pct(topic, 50), "topic p99 s": pct(topic, 99),
            "table p50 s": pct(table, 50), "table p99 s": pct(table, 99),
            "view p50 s": pct(view, 50), "view p99 s": pct(view, 99),
        } | (self.memory.split() if self.memory else {})  # fmt: skip
        self.cpu, self.bench_cpu = cpu, mine
        self.rows.append(row)
        print(_line(row), flush=True)
        return row


def _line(row: dict) -> str:
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    return (
        f"{row['system']:7} {row['level']:>14} min {row['minute']:5.1f}: {row['produced/s']:8,.0f}/s, "
        f"CPU {f(row['cpu s / 1000'], '.3f')} s/1000 ({row['cpu cores']:.2f} cores; bench {row['bench cores']:.2f}), RSS {row['rss MB']:,.0f} MB, "
        f"state {row['state MB']:,.0f} MB, lag {row['lag records']:,} rec {row['lag s']:.1f} s (max {row['lag max s']:.1f}), topic p50/p99 "
        f"{f(row['topic p50 s'], '.2f')}/{f(row['topic p99 s'], '.2f')} s, table p50/p99 "
        f"{f(row['table p50 s'], '.2f')}/{f(row['table p99 s'], '.2f')} s, current view p50/p99 "
        f"{f(row['view p50 s'], '.2f')}/{f(row['view p99 s'], '.2f')} s"
        + "".join(f", {k} {f(row[k], ',.0f')}" for k in MEMORY if k in row)
    )  # fmt: skip


MEMORY = ("state memory MB", "heap MB", "jvm other MB", "untracked MB")  # the product's, split (MiB)


def run_level(system: System, load: Load, level: str, rate: float, seconds: float) -> list[dict]:
    """``rate`` records a second for ``seconds``, a sample every SAMPLE seconds (at least two)."""
    every = min(SAMPLE, seconds / 2)
    load.set(rate)
    system.rebase()
    started, rows = time.time(), []
    sent, at = load.sent, started
    while at < started + seconds - 1:
        time.sleep(max(0.0, min(at + every, started + seconds) - time.time()))
        now, count = time.time(), load.sent
        rows.append(system.sample(level, rate, count - sent, now - at))
        sent, at = count, now
    return rows


def verdict(rows: list[dict], rate: float) -> str:
    """``sustained``: the lag (a sample's mean) ends under SUSTAINED_LAG seconds and has not grown by half
    (and a second) since the first sample; ``behind`` otherwise; ``load-bound``: this process could not
    produce the rate (it shares the cores with the system it measures)."""
    if sum(r["produced/s"] for r in rows) / len(rows) < 0.97 * rate:
        return "load-bound"
    first, end = rows[0]["lag s"], rows[-1]["lag s"]
    return "sustained" if end <= SUSTAINED_LAG and end <= 1.5 * first + 1 else "behind"


def drain(system: System, load: Load, rate: float, timeout: float = 600) -> None:
    """No load until the system has caught up (the lag under a second of ``rate``)."""
    load.set(0)
    since, deadline = time.time(), time.time() + timeout
    while time.time() < deadline:
        when, records, _ = system.lag.latest
        if when > since and records <= rate:
            system.lag.take()
            system.topic.take()
            for seen in (system.table, system.view):
                if seen:
                    seen.take()
            return
        time.sleep(1)
    raise SystemExit(
        f"{system.name}: still behind {system.lag.latest[1]:,} records after {timeout:.0f} s without load"
    )


def soak(system: System, load: Load) -> dict:
    """The levels, the ramp to the highest sustained rate, that rate for TOP_MINUTES, and the first
    level again for WARM_MINUTES."""
    good, bad, why = None, None, "behind"
    for rate in RATES:
        why = verdict(run_level(system, load, f"{rate:,}/s", rate, LEVEL_MINUTES * 60), rate)
        if why != "sustained":
            bad = rate
            break
        good = rate
    if not TOP_MINUTES:  # SOAK_MINUTES=0: the levels only (e.g. to compare --table-every settings)
        return {"highest sustained": None, "above it": "not searched", "top run": "not run"}
    rate = good or RATES[0]
    while bad is None:  # up by half until the lag grows
        if rate >= MAX_RATE:
            why = "the benchmark's cap"
            break
        drain(system, load, rate)
        rate = min(max(int(round(rate * 1.5, -2)), rate + 100), MAX_RATE)
        why = verdict(run_level(system, load, f"ramp {rate:,}/s", rate, RAMP_SECONDS), rate)
        if why == "sustained":
            good = rate
        else:
            bad = rate
    between = int(round(((good or 0) + (bad or 0)) / 2, -2))
    if why == "behind" and good is not None and between > good:  # one step between
        drain(system, load, between)
        step = verdict(run_level(system, load, f"ramp {between:,}/s", between, RAMP_SECONDS), between)
        good = between if step == "sustained" else good
    top = good or max(int(round(RATES[0] / 2, -2)), 100)
    drain(system, load, top)
    held = verdict(run_level(system, load, f"top {top:,}/s", top, TOP_MINUTES * 60), top)
    if WARM_MINUTES:  # the first rate again, after the JVMs' warm-up
        drain(system, load, RATES[0])
        run_level(system, load, f"{RATES[0]:,}/s warm", RATES[0], WARM_MINUTES * 60)
    print(f"{system.name}: highest sustained rate {top:,}/s ({f'{bad:,}/s fell behind' if why == 'behind' else why}); over {TOP_MINUTES:g} min: {held}", flush=True)  # fmt: skip
    return {"highest sustained": top, "above it": why, "top run": held}


# --- the systems, as a user runs them ---------------------------------------------------------------
def start_peer(cluster, tmp: Path, prefix: str):
    from peerkit import Peer

    peer = Peer("fk", cluster, prefix + "products", prefix + "merchants", prefix + JOIN, tmp / "peer")
    peer.__enter__()
    return peer


def start_product(tmp: Path, prefix: str) -> subprocess.Popen:
    """``lake run display_products --continuous``, as a user starts it."""
    log = (tmp / "product.log").open("wb")
    command = [*lake(tmp), "run", JOIN, "--continuous", "--trigger", TRIGGER, "--table-every", TABLE_EVERY]
    env = {**os.environ, "LAKE_KAFKA_TOPIC_PREFIX": prefix}
    if NMT:
        jvm = env.get("LAKE_JVM_OPTS", "-XX:+UseParallelGC")  # the product's default, kept
        env["LAKE_JVM_OPTS"] = f"{jvm} -XX:NativeMemoryTracking=summary"
    return subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True, env=env)  # fmt: skip


def lake(tmp: Path) -> list[str]:
    """The ``lake`` command on the benchmark's root and pipeline."""
    return [
        sys.executable,
        "-m",
        "spark_jobs.cli",
        "--root",
        str(tmp / "lake"),
        "--config",
        str(tmp / "soak.yaml"),
    ]


def first_batch(tmp: Path, prefix: str) -> dict | None:
    """How long the running join took to its first micro-batch, as ``lake status --json`` says (its
    results are on the changelog a moment before the batch's record: asked again for up to 30 s)."""
    env = {**os.environ, "LAKE_KAFKA_TOPIC_PREFIX": prefix}
    for _ in range(10):
        done = subprocess.run(
            [*lake(tmp), "status", "--json"], capture_output=True, text=True, env=env, timeout=120
        )
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        first = next((r.get("first_batch") for r in rows if r.get("join") == JOIN), None)
        if first:
            return first
        time.sleep(3)
    return None


def load_topics(cluster, config, prefix: str) -> None:
    def put(topic, keys, values):
        produce(cluster, replace(config.topic(topic), name=prefix + topic), [(keys, values)], "murmur2")

    merchants, ids = np.arange(MERCHANTS), np.arange(PRODUCTS)
    put("merchants", prefixed("m", merchants), merchant_values(merchants))
    put("products", prefixed("p", ids), product_values(ids, "t", ids % MERCHANTS))


def wait_loaded(final: dict, started: float, what: str, timeout: float = 1800) -> float:
    while len(final) < PRODUCTS:
        if time.time() > started + timeout:
            raise SystemExit(f"{what}: {len(final):,} of {PRODUCTS:,} results after {timeout} s")
        time.sleep(0.2)
    return time.time() - started


def check(results: dict, expected: dict[str, tuple[str, str]], where: str) -> list[str]:
    """The keys whose final result is not the last update produced (with its merchant)."""
    wrong = [k for k, want in expected.items() if results.get(k) != want]
    print(f"{where}: {len(results):,} keys, " + (f"{len(wrong):,} WRONG, e.g. {wrong[:3]}" if wrong else "all equal to the last update produced"), flush=True)  # fmt: skip
    return wrong


def view_final(tmp: Path) -> dict[str, tuple[str, str]]:
    """Product key -> (title, merchant) in the join's current view, as ``lake sql`` reads it."""
    query = f"SELECT key, title, merchant FROM lake.{JOIN}__current"
    done = subprocess.run([*lake(tmp), "sql", "--json", query], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"lake sql on the current view failed: {done.stderr.strip()[-500:]}")
    rows = (json.loads(line) for line in done.stdout.splitlines())
    return {r["key"]: (r["title"], r["merchant"]) for r in rows}


def topic_final(final: dict) -> dict[str, tuple[str, str]]:
    out = {}
    for key, value in final.items():
        if value is None:
            continue
        title, merchant = TITLE.search(value), MERCHANT.search(value)
        out[key.decode()] = (title and title[1].decode(), merchant and merchant[1].decode())
    return out


def measure(name: str, tmp: Path, bootstrap: str, cluster, config) -> dict:
    prefix = f"{name}_"
    load_topics(cluster, config, prefix)
    final: dict = {}
    stop = threading.Event()
    topic_seen = Latencies()
    out = prefix + (JOIN if name == "peer" else f"{JOIN}_changelog")
    threads = [threading.Thread(target=follow_topic, args=(bootstrap, out, topic_seen, final, stop))]
    started = time.time()
    if name == "peer":
        peer = start_peer(cluster, tmp, prefix)
        assert peer.proc is not None
        pid, group, state, table, view = peer.proc.pid, peer.app_id, tmp / "peer" / "state", None, None
    else:
        job = start_product(tmp, prefix)
        group = prefix + (config.consumer_group(config.join(JOIN)) or "")  # what `lake status` names
        pid, state = job.pid, tmp / "lake" / "_checkpoints"
        table, view, lake = Latencies(), Latencies(), Lake(tmp / "lake")
        in_view = FirstSeen(view)
        for seen, name_of in ((table, JOIN), (None, join_table(JOIN, "parked"))):
            path = Path(lake.path(name_of))
            threads.append(threading.Thread(target=follow_table, args=(path, seen, in_view, stop)))
    for t in threads:
        t.start()
    system = System(name, pid, state, Lag(bootstrap, group, prefix + "products"), topic_seen, table, view)
    if name == "product":
        system.memory = JvmMemory(pid, lake)
    system.lag.start()
    load = Load(bootstrap, prefix + "products")
    load.start()
    wrong: list[str] = []
    try:
        loaded = wait_loaded(final, started, f"{name}: initial load")
        print(f"{name}: started and loaded {PRODUCTS:,} results in {loaded:.1f} s", flush=True)
        first = first_batch(tmp, prefix) if name == "product" else None
        if first:
            print(
                f"{name}: its first micro-batch ({first['records']:,} records) ended {first['after_s']:g} s "
                f"after `lake run` started, {first['after_spark_s']:g} s after its Spark session was ready "
                "(lake status)",
                flush=True,
            )
        system.started = time.time()
        summary = soak(system, load)
        drain(system, load, 1)
        expected = load.expected()
        time.sleep(2)
        wrong = check(topic_final(final), expected, f"{name}: {out}")
        if name == "product":  # what a reader of the lake sees while the join runs
            wrong += check(view_final(tmp), expected, f"{name}: lake.{JOIN}__current (lake sql, running)")
    finally:
        load.stop()
        stop.set()
        for t in threads:
            t.join()
        system.lag.close()
        if name == "peer":
            peer.__exit__(None, None, None)
        else:
            job.terminate()
            job.wait(180)
    if name == "product":
        from peerkit import table_results

        rows = table_results(Lake(tmp / "lake"), JOIN)
        wrong += check(
            {k: (r.get("title"), r.get("merchant")) for k, r in rows.items()}, expected, f"{name}: table"
        )
    first_s = first["after_s"] if first else None
    return {"loaded s": loaded, "first batch s": first_s, **summary, "rows": system.rows, "wrong": len(wrong)}


# --- the report ----------------------------------------------------------------------------------
def steady(rows: list[dict], level: str) -> list[dict]:
    """A level's samples at steady state: the top level's last two thirds, another's all but the first."""
    mine = [r for r in rows if r["level"] == level]
    return mine[len(mine) // 3 :] if level.startswith("top") else mine[1:] or mine


def growth(rows: list[dict]) -> float:
    """Resident memory growth over the rows, %: a least-squares line's rise over them, over its start."""
    if len(rows) < 2:
        return 0.0
    t = np.array([r["minute"] for r in rows])
    rss = np.array([r["rss MB"] for r in rows])
    slope, start = np.polyfit(t - t[0], rss, 1)
    return float(slope * (t[-1] - t[0]) / start * 100)


def figures(result: dict) -> dict[str, dict[str, float | None]]:
    """Per level: the steady state's median of each figure."""
    out = {}
    for level in dict.fromkeys(r["level"] for r in result["rows"]):
        if level.startswith("ramp"):
            continue
        rows = steady(result["rows"], level)
        out[level.split(" ")[0] if level.startswith("top") else level] = {
            k: (float(np.median([r[k] for r in rows if r[k] is not None])) if any(r[k] is not None for r in rows) else None)
            for k in ("produced/s", "cpu s / 1000", "cpu cores", "rss MB", "state MB", "lag s", "topic p50 s",
                      "topic p99 s", "table p50 s", "table p99 s", "view p50 s", "view p99 s")
        } | {"rss growth %": growth(rows), "rate": rows[0]["rate"]}  # fmt: skip
    return out


def report(results: dict[str, dict]) -> None:
    by = {name: figures(r) for name, r in results.items()}
    for name, r in results.items():
        print(f"\n{name}: per sample\n| level | min | records/s | CPU s / 1,000 | cores | RSS MB | state MB | "
              "lag, records | lag, s | topic p50 / p99, s | table p50 / p99, s | current view p50 / p99, s |\n" + "|---" * 12 + "|")  # fmt: skip
        for row in r["rows"]:
            cells = [row["level"], f"{row['minute']:.1f}", f"{row['produced/s']:,.0f}", _f(row["cpu s / 1000"], ".3f"),
                     f"{row['cpu cores']:.2f}", f"{row['rss MB']:,.0f}", f"{row['state MB']:,.0f}",
                     f"{row['lag records']:,}", f"{row['lag s']:.1f}",
                     f"{_f(row['topic p50 s'], '.2f')} / {_f(row['topic p99 s'], '.2f')}",
                     f"{_f(row['table p50 s'], '.2f')} / {_f(row['table p99 s'], '.2f')}",
                     f"{_f(row['view p50 s'], '.2f')} / {_f(row['view p99 s'], '.2f')}"]  # fmt: skip
            print("| " + " | ".join(cells) + " |")
    names = list(results)
    print("\n| steady state | " + " | ".join(names) + (" | product / peer |" if len(names) == 2 else " |"))
    print("|---" * (len(names) + 1 + (len(names) == 2)) + "|")
    rows = [("highest sustained rate, records/s", {n: results[n]["highest sustained"] for n in names})]
    rows += [
        (
            "... above it (behind: the system fell behind; load-bound: this process could produce no more; "
            f"the benchmark's cap: {MAX_RATE:,}/s)",
            {n: results[n]["above it"] for n in names},
        )
    ]
    rows += [(f"... over the top level's {TOP_MINUTES:g} min", {n: results[n]["top run"] for n in names})]
    rows += [("initial load of all results, s", {n: results[n]["loaded s"] for n in names})]
    rows += [
        ("start to the end of the first micro-batch, s", {n: results[n].get("first batch s") for n in names})
    ]
    for level in dict.fromkeys(lv for f in by.values() for lv in f):
        for key in ("cpu s / 1000", "cpu cores", "rss MB", "rss growth %", "state MB", "topic p50 s", "topic p99 s",
                    "table p50 s", "table p99 s", "view p50 s", "view p99 s", "lag s"):  # fmt: skip
            values = {n: by[n].get(level, {}).get(key) for n in names}
            if any(v is not None for v in values.values()):
                rate = {n: by[n].get(level, {}).get("rate") for n in names}
                label = (
                    level
                    if level != "top"
                    else "top (" + ", ".join(f"{n} {v:,.0f}/s" for n, v in rate.items() if v) + ")"
                )
                rows.append((f"{label}: {key}", values))
    for label, values in rows:
        digits = ",.0f" if " MB" in label else ",.1f" if "%" in label else ",.3f"
        cells = [
            _f(v, digits if isinstance(v, float) else "," if isinstance(v, int) else "")
            for v in map(values.get, names)
        ]
        numbers = all(isinstance(values.get(n), int | float) for n in names)
        if len(names) == 2 and numbers and values.get("peer") and "growth" not in label:
            cells.append(f"{values['product'] / values['peer']:.2f}x")
        elif len(names) == 2:
            cells.append("")
        print(f"| {label} | " + " | ".join(cells) + " |")


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


# --- the plot: an SVG drawn here, rendered to PNG by the system Chromium ------------------------------
COLORS = {"peer": "#1f77b4", "product": "#d62728"}


def svg(results: dict[str, dict]) -> str:
    """Two panels over each system's minutes since its load began: CPU seconds per 1,000 records (a log
    scale: the systems differ by an order of magnitude), and resident memory (MB)."""
    width, height, pad = 900, 300, 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height * 2 + 40}" font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>']  # fmt: skip
    span = max((r["minute"] for res in results.values() for r in res["rows"]), default=1) or 1

    def x(minute: float) -> float:
        return pad + (width - 2 * pad) * minute / span

    for i, (title, key, log) in enumerate(
        [
            ("CPU s per 1,000 records (log scale)", "cpu s / 1000", True),
            ("resident memory, MB", "rss MB", False),
        ]
    ):
        y0 = i * height + 20
        values = [r[key] for res in results.values() for r in res["rows"] if r[key]]
        if log:
            lo = 10 ** np.floor(np.log10(min(values))) if values else 0.001
            hi = 10 ** np.ceil(np.log10(max(values))) if values else 1.0
            scale = (np.log10, np.log10(lo), np.log10(hi))
            ticks = [m * 10**e for e in range(int(np.log10(lo)), int(np.log10(hi)) + 1) for m in (1, 2, 5)]
            ticks = [t for t in ticks if lo <= t <= hi]
        else:
            hi = (max(values) if values else 1) * 1.1
            scale = (lambda v: v, 0.0, hi)
            ticks = list(np.linspace(0, hi, 5))

        def y(v: float, y0=y0, scale=scale) -> float:
            f, a, b = scale
            return y0 + height - pad - (height - 2 * pad) * (f(v) - a) / (b - a)

        bottom, top = y0 + height - pad, y0 + pad
        out.append(f'<text x="{pad}" y="{y0 + 20}" font-weight="bold">{title}</text>')
        out.append(f'<line x1="{pad}" y1="{bottom}" x2="{width - pad}" y2="{bottom}" stroke="black"/>')
        out.append(f'<line x1="{pad}" y1="{bottom}" x2="{pad}" y2="{top}" stroke="black"/>')
        for tick in ticks:
            label = f"{tick:,.0f}" if tick >= 10 else f"{tick:g}"
            out.append(f'<text x="{pad - 5}" y="{y(tick) + 4}" text-anchor="end">{label}</text>')
            out.append(f'<line x1="{pad}" y1="{y(tick)}" x2="{width - pad}" y2="{y(tick)}" stroke="#eee"/>')
        for tick in np.linspace(0, span, 7):
            out.append(f'<text x="{x(tick)}" y="{bottom + 16}" text-anchor="middle">{tick:.0f} min</text>')
        for n, (name, res) in enumerate(results.items()):
            color = COLORS.get(name, "black")
            path = " ".join(f"{x(r['minute']):.1f},{y(r[key]):.1f}" for r in res["rows"] if r[key])
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
            out.append(f'<text x="{width - pad - 150}" y="{y0 + 20 + 16 * n}" fill="{color}">'
                       f'{"Kafka Streams 4.4" if name == "peer" else "the product"}</text>')  # fmt: skip
            last = None
            for r in res["rows"]:  # where each level starts
                if r["level"] != last and not r["level"].startswith("ramp") and i == 0:
                    out.append(f'<text x="{x(r["minute"])}" y="{y0 + 40 + 14 * n}" font-size="10" '
                               f'fill="{color}">{r["level"]}</text>')  # fmt: skip
                last = r["level"]
    out.append("</svg>")
    return "\n".join(out)


def plot(results: dict[str, dict], png: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if not chromium:
        print("no plot: Debian's chromium is not installed (infra/setup.sh installs it)")
        return
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 640})
        page.set_content(f"<html><body style='margin:0'>{svg(results)}</body></html>")
        page.screenshot(path=str(png), full_page=True)
        browser.close()
    print(f"plot: {png}")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, embedded_broker(Path(tmp) / "kafka") as bootstrap:
        tmp = Path(tmp)
        os.environ["LAKE_KAFKA_TOPIC_PREFIX"] = ""
        (tmp / "soak.yaml").write_text(PIPELINE)
        config = load_config(tmp / "soak.yaml")
        cluster = connect(config, tmp / "lake")
        specs = [replace(s, name=f"{n}_{s.name}") for n in SYSTEMS for s in config.topics.values()]
        outs = [replace(specs[0], name=f"peer_{JOIN}", compacted=False)] if "peer" in SYSTEMS else []
        ensure_topics(cluster, [*specs, *outs])
        print(
            f"soak: fk join, {PRODUCTS:,} products on {MERCHANTS:,} merchants, 4 partitions; rates {RATES} for "
            f"{LEVEL_MINUTES:g} min each, then the highest sustained rate for {TOP_MINUTES:g} min; samples every "
            f"{SAMPLE:g} s; machine: {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}",
            flush=True,
        )
        results = {}
        for name in SYSTEMS:
            results[name] = measure(name, tmp, bootstrap, cluster, config)
            (OUT / "soak.json").write_text(json.dumps(results, indent=1))  # kept as each system ends
    report(results)
    plot(results, OUT / "soak.png")
    failed = [f"{n}: {r['wrong']:,} final results wrong" for n, r in results.items() if r["wrong"]]
    if "product" in results:
        top = figures(results["product"]).get("top", {})
        if (g := top.get("rss growth %") or 0.0) > MAX_GROWTH:
            failed.append(
                f"product: resident memory grew {g:.1f} % over the top level's steady window (> {MAX_GROWTH:g} %)"
            )
    if failed:
        print("FAILED: " + "; ".join(failed))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
