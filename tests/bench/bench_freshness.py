"""Benchmark: end-to-end freshness of the consents table join, as a user sees it.

An embedded broker of its own, the demo pipeline's consents join over JSON values (PIPELINE: the
bundled demo's consents are Avro through a Schema Registry, which this benchmark does not start)
with 10,000 accounts, then as continuous
jobs `lake ingest --continuous` (Kafka -> bronze, the lake's copy) and `lake run consents_with_mail
--continuous` (Kafka -> join result in Delta, the join reads the topics itself), each with a 0.5 s
trigger. Consents are produced at 1,000 records/s
for SECONDS (default 60) by one long-lived producer, as a user's application would (confluent-kafka,
idempotent, acks=all, murmur2 like the Java client, linger 5 ms), each carrying a unique customerId;
this process follows the result table's commits (their change-data and data files, read from the
Delta log with pyarrow: no Spark job of its own) and records when each one became visible.
Reports p50 / p99 / max of (visible in Delta - handed to the producer), against the floor of the same
path without the join (the bronze table's own freshness, measured the same way), and the rate
actually achieved. Run with `make bench`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from benchkit import committed_rows, embedded_broker

from spark_jobs.config import load_config
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import connect, produce

SECONDS = int(sys.argv[1]) if len(sys.argv) > 1 else 60
RATE = 1000
ACCOUNTS = 10_000
PIPELINE = """\
pipeline: freshness
topics:
  customer_consents: {partitions: 4, key: string, value: json}
  customer_accounts: {partitions: 4, key: string, value: json}
joins:
  consents_with_mail:
    kind: table
    left: customer_consents
    right: customer_accounts
    type: left
    select:
      customerId: left.customerId
      contactMailAddress: right.contactMailAddress
    publish: true
"""


def start(root: Path, config: Path, *args: str) -> subprocess.Popen:
    log = open(root.parent / f"{args[0]}.log", "wb")  # noqa: SIM115 - lives as long as the job
    return subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), "--config", str(config), *args],
        stdout=log,
        stderr=log,
    )


def follow(lake: Lake, table: str, column: str, seen: dict[str, float], stop: threading.Event) -> None:
    """Record when each value of ``column`` first appears in ``table``'s new commits."""
    version = 0
    while not stop.is_set():
        if lake.exists(table):
            while lake.version(table) >= version:
                now = time.time()
                for value in committed_rows(lake.path(table), version, [column])[column]:
                    key = value.decode() if isinstance(value, bytes) else value
                    if key is not None:
                        seen.setdefault(key, now)
                version += 1
        time.sleep(0.05)


def percentiles(latencies: list[float]) -> str:
    if not latencies:
        return "none arrived (n=0)"
    a = np.array(latencies)
    return f"p50 {np.percentile(a, 50):.2f} s, p99 {np.percentile(a, 99):.2f} s, max {a.max():.2f} s (n={len(a):,})"


def send_consents(bootstrap: str, topic: str) -> dict[str, float]:
    """Produce RATE consents per second for SECONDS; returns when each was handed to the producer,
    by its token and by its raw value (how the result and the bronze table show it)."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    sent: dict[str, float] = {}
    failed: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failed.append(str(err))

    seq = 0
    started = time.time()
    while time.time() - started < SECONDS:
        for _ in range(RATE // 100):  # 10 records every 10 ms
            n = seq % ACCOUNTS
            token = f"user_{n}#{seq}"
            value = json.dumps(
                {"customerId": token, "consents": {"retargeter1": True, "retargeter2": False}},
                separators=(",", ":"),
            )
            now = time.time()
            producer.produce(topic, value.encode(), f"user_{n}".encode(), on_delivery=delivered)
            sent[token] = sent[value] = now
            seq += 1
        producer.poll(0)
        time.sleep(max(0.0, started + seq / RATE - time.time()))
    producer.flush(60)
    if failed:
        raise SystemExit(f"{len(failed)} records were not delivered, e.g. {failed[0]}")
    return sent


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, embedded_broker(Path(tmp) / "kafka"):
        os.environ["LAKE_KAFKA_TOPIC_PREFIX"] = ""
        root = Path(tmp) / "lake"
        pipeline = Path(tmp) / "freshness.yaml"
        pipeline.write_text(PIPELINE)
        config = load_config(pipeline)
        cluster = connect(config, root)
        lake = Lake(root)
        accounts = [
            (f"user_{n}", {"customerId": f"user_{n}", "contactMailAddress": f"u{n}@x.org"})
            for n in range(ACCOUNTS)
        ]
        keys = pa.array([k.encode() for k, _ in accounts])
        values = pa.array([json.dumps(v).encode() for _, v in accounts])
        produce(cluster, config.topic("customer_accounts"), [(keys, values)])
        jobs = [
            start(root, pipeline, "ingest", "--continuous", "--trigger", "0.5"),
            start(root, pipeline, "run", "consents_with_mail", "--continuous", "--trigger", "0.5"),
        ]
        stop = threading.Event()
        joined: dict[str, float] = {}
        mirrored: dict[str, float] = {}
        threads = [
            threading.Thread(target=follow, args=(lake, "consents_with_mail", "customerId", joined, stop)),
            threading.Thread(target=follow, args=(lake, "customer_consents", "value", mirrored, stop)),
        ]
        try:
            time.sleep(40)  # both jobs up, the accounts mirrored and joined
            for t in threads:
                t.start()
            sent = send_consents(cluster.bootstrap_servers, cluster.topic("customer_consents"))
            time.sleep(30)  # let the last records arrive
        finally:
            stop.set()
            for job in jobs:
                job.send_signal(signal.SIGTERM)
            for job in jobs:
                job.wait(timeout=120)
        join_lat = [joined[t] - sent[t] for t in sent if "#" in t and not t.startswith("{") and t in joined]
        bronze_lat = [mirrored[t] - sent[t] for t in sent if t.startswith("{") and t in mirrored]
        produced = sum(1 for t in sent if not t.startswith("{"))
        print(
            f"consents produced for {SECONDS} s: {produced:,} records ({produced / SECONDS:,.0f}/s, "
            f"target {RATE:,}/s), {ACCOUNTS:,} accounts"
        )
        print(f"produced -> bronze (ingest, trigger 0.5 s):              {percentiles(bronze_lat)}")
        print(f"produced -> join result in Delta (the join reads Kafka, 0.5 s): {percentiles(join_lat)}")
        missing = produced - len(join_lat)
        if not join_lat:  # say why, from the join's own log
            print(
                "the join's log ends:", *(root.parent / "run.log").read_text().splitlines()[-5:], sep="\n  "
            )
        print(f"not visible in the result at the end: {missing:,}")


if __name__ == "__main__":
    main()
