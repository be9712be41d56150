"""Benchmark: a quick command as a user sees it, ``lake show <table>`` (a 1,000-row table), from typing
it to its output: with a local Spark session (what every command starts without the services) and
on the lake root's Spark Connect server (``lake up``), in one run. Median, min and max of RUNS runs
each (the server's start-up is printed apart; it is paid once per ``lake up``). Usage:
bench_cli.py [RUNS]."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from spark_jobs.seams import connect
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.processes import free_port

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
ROWS = 1000


def show(root: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), "show", "items"],
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - started
    if proc.returncode != 0 or len(proc.stdout.splitlines()) != ROWS + 1:
        raise SystemExit(f"lake show failed: {proc.stderr.strip()[-500:]}")
    return took


def figures(name: str, runs: list[float]) -> str:
    return f"| {name} | {statistics.median(runs):.2f} s | {min(runs):.2f} s | {max(runs):.2f} s |"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "lake"
        lake = Lake(root)
        schema = pa.schema([("key", pa.binary()), ("title", pa.string())])
        lake.create("items", schema)
        keys = pa.array([f"k{i:04d}".encode() for i in range(ROWS)], pa.binary())
        lake.append("items", pa.table({"key": keys, "title": [f"t{i}" for i in range(ROWS)]}, schema=schema))
        lake.spark.stop()  # the benchmark's own session is not one the commands could use
        local = [show(root) for _ in range(RUNS)]
        started = time.perf_counter()
        connect.ConnectServer(root).start(free_port())
        start_up = time.perf_counter() - started
        try:
            remote = [show(root) for _ in range(RUNS)]
        finally:
            connect.ConnectServer(root).stop()
    print(
        f"lake show of a {ROWS:,}-row table, {RUNS} runs each (Spark Connect server start-up: {start_up:.1f} s)"
    )
    print("| session | median | min | max |\n|---|---|---|---|")
    print(figures("local Spark (no services)", local))
    print(figures("Spark Connect server (lake up)", remote))
    print(f"local / server (medians): {statistics.median(local) / statistics.median(remote):.1f}x")


if __name__ == "__main__":
    main()
