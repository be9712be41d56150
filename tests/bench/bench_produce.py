"""Benchmark: `lake produce` of big dumps into a 12-partition topic vs. the physical floor.

For 1,000,000 and 10,000,000 `user_N;"userN@example.com"` lines it reports
  - produce: read the file, split lines, partition (murmur2, vectorized), assign offsets, write Delta
    (delta-rs), one commit: records/s;
  - floor: `pyarrow.parquet.write_table` of the very same final rows, already in memory: records/s;
  - ratio produce/floor (goal >= 0.5);
and, separately, the start-up costs of the interpreter with the product imported and of a Spark JVM.
Run with `make bench`; nothing here is a test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from spark_jobs.config import TopicSpec
from spark_jobs.demo import write_synthetic_dump
from spark_jobs.lake import Lake
from spark_jobs.topics import produce_lines

SIZES = [int(a) for a in sys.argv[1:]] or [1_000_000, 10_000_000]
SPEC = TopicSpec("bench_accounts", partitions=12, key_format="string", value_format="string")


def startup_seconds(code: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - started


def warm_up() -> None:
    """Pay one-off import costs (pandas via delta-rs add actions) outside the timed runs."""
    with tempfile.TemporaryDirectory() as tmp:
        lake = Lake(tmp)
        with open(os.devnull, "rb") as empty:
            produce_lines(lake, SPEC, empty, "warm-up")
        lake.add_actions(SPEC.name)


def main() -> None:
    warm_up()
    print(f"python {sys.version.split()[0]}, 2 cores; topic {SPEC.partitions} partitions, murmur2")
    print(
        f"start-up: interpreter + lake CLI import {startup_seconds('import spark_jobs.cli, spark_jobs.topics'):.2f}s; "
        f"Spark session (JVM) {startup_seconds('from spark_jobs.session import get_spark; get_spark()'):.2f}s"
    )
    print(
        f"{'lines':>12} {'produce s':>10} {'produce rec/s':>14} {'floor s':>8} {'floor rec/s':>12} {'ratio':>6}"
    )
    for n in SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            dump = Path(tmp) / "dump.txt"
            write_synthetic_dump(dump, n)
            lake = Lake(Path(tmp) / "lake")
            with open(dump, "rb") as fh:
                t0 = time.perf_counter()
                res = produce_lines(lake, SPEC, fh, str(dump), key_sep=";", timestamp_ms=0)
                produce_s = time.perf_counter() - t0
            assert res.records == n
            rows = lake.read_arrow(SPEC.name)
            t0 = time.perf_counter()
            pq.write_table(rows, Path(tmp) / "floor.parquet")
            floor_s = time.perf_counter() - t0
            print(
                f"{n:>12,} {produce_s:>10.2f} {n / produce_s:>14,.0f} {floor_s:>8.2f} "
                f"{n / floor_s:>12,.0f} {floor_s / produce_s:>6.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
