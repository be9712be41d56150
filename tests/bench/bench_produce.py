"""Benchmark: producing to Kafka and mirroring it into bronze, on an embedded broker of its own.

For 1,000,000 (and more, given as arguments) `user_N;"userN@example.com"` lines into a 12-partition
topic it reports
  - `lake produce`: the CLI as a user runs it (process start to exit: read, split and check the lines,
    produce them through librdkafka with murmur2_random in one transaction): records/s;
  - the baseline: confluent-kafka's raw producer sending the same records (keys and values already in
    memory, idempotent, acks=all, murmur2_random, one transaction) in a plain loop: records/s;
  - the ratio of the two (lake / raw);
  - `lake ingest --once` of that topic into its bronze Delta table (the CLI process, Spark start-up
    included) and the ingest's rate without the start-up (the same query in a running session).
Run with `make bench`; nothing here is a test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchkit import embedded_broker

from spark_jobs.config import TopicSpec
from spark_jobs.demo.data import write_synthetic_dump

SIZES = [int(a) for a in sys.argv[1:]] or [1_000_000]
PIPELINE = "topics:\n  lake_produced: {partitions: 12, value: string}\n  raw_produced: {partitions: 12, value: string}\n"


def lake_cli(root: Path, config: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), "--config", str(config), *args],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - started


def raw_produce(bootstrap: str, topic: str, dump: Path) -> tuple[float, int]:
    """The floor: confluent-kafka's producer in a plain loop over records already in memory."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the topic exists
    admin.create_topics([NewTopic(topic, 12, 1)])[topic].result()
    records = [line.split(b";", 1) for line in dump.read_bytes().splitlines()]
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 10,
            "queue.buffering.max.messages": 500_000,
            "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
        }
    )
    producer.init_transactions(30)
    started = time.perf_counter()
    producer.begin_transaction()
    for key, value in records:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
    producer.commit_transaction(120)
    return time.perf_counter() - started, len(records)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, embedded_broker(Path(tmp) / "kafka") as bootstrap:
        root = Path(tmp) / "lake"
        config = Path(tmp) / "pipeline.yaml"
        config.write_text(PIPELINE)
        os.environ["LAKE_KAFKA_TOPIC_PREFIX"] = ""
        print(f"python {sys.version.split()[0]}, 2 cores; embedded KRaft broker {bootstrap}; 12 partitions")
        print(
            f"{'lines':>10} {'lake produce s':>15} {'rec/s':>10} {'raw producer s':>15} {'rec/s':>10} {'lake/raw':>9}"
        )
        for n in SIZES:
            dump = Path(tmp) / f"dump-{n}.txt"
            write_synthetic_dump(dump, n)
            spec = TopicSpec(f"lake_produced_{n}", 12, value_format="string")
            config.write_text(PIPELINE + f"  {spec.name}: {{partitions: 12, value: string}}\n")
            lake_s = lake_cli(root, config, "produce", spec.name, str(dump), "-K", ";")
            raw_s, count = raw_produce(bootstrap, f"raw_produced_{n}", dump)
            assert count == n
            print(
                f"{n:>10,} {lake_s:>15.2f} {n / lake_s:>10,.0f} {raw_s:>15.2f} {n / raw_s:>10,.0f} "
                f"{(n / lake_s) / (n / raw_s):>9.2f}",
                flush=True,
            )
            ingest_s = lake_cli(root, config, "ingest", spec.name, "--once")
            print(
                f"{'':>10} lake ingest --once (CLI, Spark start-up included): {ingest_s:.1f}s, {n / ingest_s:,.0f} rec/s"
            )
            measure_ingest(root, config, n)


def measure_ingest(root: Path, config: Path, n: int) -> None:
    """The ingest's rate in a running session: the same topic into a fresh bronze table."""
    from spark_jobs.config import load_config
    from spark_jobs.seams.delta import Lake
    from spark_jobs.seams.session import get_spark
    from spark_jobs.topics.ingest import catch_up

    spark = get_spark(app_name="bench-ingest")
    cfg = load_config(config)
    fresh = Lake(root.parent / f"lake-warm-{n}")
    started = time.perf_counter()
    summary = catch_up(spark, fresh, cfg, [f"lake_produced_{n}"])
    secs = time.perf_counter() - started
    got = sum(summary.topics.values())
    assert got == n, (got, n)
    print(
        f"{'':>10} ingest Kafka -> bronze in a running Spark session: {secs:.1f}s, {n / secs:,.0f} rec/s",
        flush=True,
    )


if __name__ == "__main__":
    main()
