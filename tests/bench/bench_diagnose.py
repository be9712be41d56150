"""Benchmark: ``lake diagnose`` of two large topics, on an embedded broker of its own.

Two 12-partition topics of N records each (default 500,000 and 2,000,000, to show memory does not grow with records; other sizes as arguments): a stream
whose keys ``user_<i % keys>`` (N/2 distinct keys) are placed by murmur2 as the Java client places
them, and a lookup of the same keys but 1% missing, written kcat-style (CRC32). It reports
  - ``lake diagnose`` as a user runs it (the CLI process from start to exit, ``--json``): seconds,
    records/s over both topics, and the process's peak resident memory;
  - the baseline: the same Kafka reader reading both topics once to their end (keys only, nothing
    analysed), with its peak memory; and the ratio of the two (diagnose also reads the second topic
    again, and the first one partly, for the samples of its cross-topic findings);
  - that the findings are the expected ones (the misplaced and missing key counts), so a fast wrong
    answer cannot pass for a figure.
Run with `make bench`; nothing here is a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
from benchkit import embedded_broker

from spark_jobs.config import TopicSpec
from spark_jobs.seams.kafka import Cluster, produce
from spark_jobs.seams.partitioners import partitions

SIZES = [int(a) for a in sys.argv[1:]] or [500_000, 2_000_000]
PARTITIONS = 12
CHUNK = 200_000

# The process's own peak resident memory (VmHWM, KB). Not getrusage: a child's ru_maxrss starts from
# its parent's peak (Linux keeps it across fork and exec), and the parent holds the keys produced.
PEAK_KB_SOURCE = """
def peak_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
"""
# ``lake diagnose --json`` as the CLI runs it, then the process's peak resident memory on stderr
CLI = (
    PEAK_KB_SOURCE
    + """
import sys
from spark_jobs.cli import main
stream, lookup, bootstrap = sys.argv[1:]
code = main(["diagnose", stream, lookup, "--bootstrap", bootstrap, "--json"])
sys.stdout.flush()
print(peak_kb(), file=sys.stderr)
sys.exit(code)
"""
)


def fill(cluster: Cluster, name: str, keys: list[bytes], partitioner: str) -> None:
    spec = TopicSpec(name, PARTITIONS)
    value = b'{"email":"someone@example.com"}'

    def batches():
        for start in range(0, len(keys), CHUNK):
            part = keys[start : start + CHUNK]
            yield pa.array(part, pa.binary()), pa.array([value] * len(part), pa.binary())

    produce(cluster, spec, batches(), partitioner)


def raw_read(bootstrap: str, topics: list[str]) -> tuple[float, int, int]:
    """The floor: the same reader (``spark_jobs.seams.kafka.read``: assigned partitions, read_committed, up
    to the end offsets) reading both topics once, keys only, nothing analysed, in a process of its
    own; returns (seconds, records, peak RSS in KB)."""
    script = f"""
import time
from spark_jobs.config import TopicSpec
{PEAK_KB_SOURCE}
from spark_jobs.seams.kafka import Cluster, read
cluster = Cluster("{bootstrap}", {{}}, "", "bench")
started = time.perf_counter(); n = 0
for topic in {topics!r}:
    for messages in read(cluster, TopicSpec(topic, {PARTITIONS}), batch=50_000):
        keys = [m.key() for m in messages]
        n += len(keys)
print(time.perf_counter() - started, n, peak_kb())
"""
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    seconds, n, rss = out.split()
    return float(seconds), int(n), int(rss)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, embedded_broker(Path(tmp) / "kafka") as bootstrap:
        cluster = Cluster(bootstrap, {}, "", "bench")
        print(f"lake diagnose, two {PARTITIONS}-partition topics, on an embedded broker")
        for n in SIZES:
            tag = uuid.uuid4().hex[:6]
            stream, lookup = f"stream_{tag}", f"lookup_{tag}"
            distinct = n // 2
            stream_keys = [f"user_{i % distinct}".encode() for i in range(n)]
            missing = set(range(0, distinct, 100))  # 1% of the keys
            lookup_keys = [f"user_{i}".encode() for i in range(distinct) if i not in missing]
            lookup_keys = (lookup_keys * 3)[:n]  # N records, updates included
            started = time.perf_counter()
            fill(cluster, stream, stream_keys, "murmur2")
            fill(cluster, lookup, lookup_keys, "consistent_random")
            print(f"  {n:,} records per topic produced in {time.perf_counter() - started:.1f} s")
            unique = pa.array(
                [f"user_{i}".encode() for i in range(distinct) if i not in missing], pa.binary()
            )
            java = partitions(unique, PARTITIONS, "murmur2")
            kcat = np.array([zlib.crc32(k) % PARTITIONS for k in unique.to_pylist()], dtype=np.int32)
            expected_misplaced = int((java != kcat).sum())

            started = time.perf_counter()
            run = subprocess.run(
                [sys.executable, "-c", CLI, stream, lookup, bootstrap], capture_output=True, text=True
            )
            seconds = time.perf_counter() - started
            peak = int(run.stderr.strip().splitlines()[-1])  # the CLI process's own peak RSS, KB
            found = json.loads(run.stdout)
            a, b = found["topics"]
            assert run.returncode == 1, run.stderr
            assert (a["keys"], b["keys"]) == (distinct, distinct - len(missing)), (a["keys"], b["keys"])
            assert b["misplaced"]["count"] == expected_misplaced, (
                b["misplaced"]["count"],
                expected_misplaced,
            )
            assert a["only_in_this_topic"]["count"] == len(missing)
            assert found["partition_differs"]["count"] == expected_misplaced

            raw_s, raw_n, raw_rss = raw_read(bootstrap, [stream, lookup])
            total = 2 * n
            assert raw_n == total == a["records"] + b["records"], (raw_n, a["records"], b["records"])
            print(
                f"  lake diagnose (CLI, start to exit): {seconds:.1f} s, {total / seconds:,.0f} records/s, "
                f"peak RSS {peak / 1024:.0f} MB"
            )
            print(
                f"  the reader alone, both topics once (keys only): {raw_s:.1f} s, {total / raw_s:,.0f} records/s, "
                f"peak RSS {raw_rss / 1024:.0f} MB"
            )
            print(f"  ratio diagnose / reader alone: {seconds / raw_s:.2f}")
            print(
                f"  findings: {distinct:,} / {distinct - len(missing):,} distinct keys, "
                f"{expected_misplaced:,} misplaced (as expected), {len(missing):,} missing (as expected)"
            )


if __name__ == "__main__":
    main()
