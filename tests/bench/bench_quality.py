"""Benchmark: backfill of a 1,000,000-line dump, then completeness + co-partitioning over a
10,000,000-record stream topic and the 1,000,000-key lookup, on Spark local[2], both read from Kafka
(the suites read the topics up to their end offsets as they start).

Reports seconds and records/s for each; Spark start-up is reported separately. `make bench` runs it;
usage: bench_quality.py [STREAM_RECORDS] [KEYS].
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from benchkit import embedded_broker, produce_records

from spark_jobs.config import load_config
from spark_jobs.demo.data import synthetic_dump_chunks, write_synthetic_dump
from spark_jobs.lookups.backfill import run_backfill
from spark_jobs.quality.run import run_suites
from spark_jobs.seams.delta import Lake

STREAM = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
KEYS = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000

CONFIG = """
topics:
  events: {partitions: 12, value: string}
  accounts: {partitions: 12, value: string}
lookups:
  accounts: {topic: accounts, joined_with: [events], backfill: {format: lines, separator: ";"}}
quality:
  suites: {bench: suite.yaml}
"""
SUITE = """
suite: bench
checks:
  - completeness: {stream: events, lookup: accounts}
  - co_partitioning: {topics: [events, accounts]}
"""


def main() -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    with tempfile.TemporaryDirectory() as tmp, embedded_broker(Path(tmp) / "kafka"):
        root = Path(tmp)
        (root / "p.yaml").write_text(CONFIG)
        (root / "suite.yaml").write_text(SUITE)
        config = load_config(root / "p.yaml")
        lake = Lake(root / "lake")

        def stream():
            """STREAM records whose keys cycle through user_1 .. user_KEYS."""
            remaining = STREAM
            while remaining > 0:
                for block in synthetic_dump_chunks(KEYS):
                    lines = pc.split_pattern(pa.array([block], pa.large_binary()), "\n").values
                    lines = lines.slice(0, len(lines) - 1)
                    keys = pc.list_element(pc.split_pattern(lines, ";", max_splits=1), 0).cast(pa.binary())
                    take = min(len(keys), remaining)
                    yield keys.slice(0, take), pa.repeat(pa.scalar(b"{}", pa.binary()), take)
                    remaining -= take
                    if remaining == 0:
                        return

        t0 = time.perf_counter()
        for keys, values in stream():  # the checked stream, on Kafka
            produce_records(lake, config, "events", keys, values)
        print(f"setup: produced {STREAM:,} stream records in {time.perf_counter() - t0:.1f}s", flush=True)
        dump = root / "accounts.dump"
        write_synthetic_dump(dump, KEYS)

        from spark_jobs.seams.session import get_spark

        t0 = time.perf_counter()
        spark = get_spark(app_name="bench-quality")
        spark.range(1).collect()
        print(f"Spark session start-up: {time.perf_counter() - t0:.1f}s", flush=True)

        t0 = time.perf_counter()
        s = run_backfill(spark, lake, config, "accounts", source=str(dump), log=lambda m: None)
        secs = time.perf_counter() - t0
        print(
            f"backfill {s.lines:,}-line dump: {secs:.1f}s, {s.lines / secs:,.0f} lines/s "
            f"({s.new:,} new keys written, {s.partitioner})",
            flush=True,
        )

        t0 = time.perf_counter()
        report = run_suites(spark, lake, config, report_dir=root / "reports", log=lambda m: None)
        secs = time.perf_counter() - t0
        print(
            f"completeness + co-partitioning over {STREAM:,} stream records and a {KEYS:,}-key lookup: "
            f"{secs:.1f}s, {STREAM / secs:,.0f} stream records/s; success={report.success}",
            flush=True,
        )
        for r in report.results:
            print(f"  {'PASS' if r.success else 'FAIL'} {r.check}: {r.offending_total} offending")


if __name__ == "__main__":
    main()
