"""What the benchmarks share: an embedded Kafka broker of their own, the test kits on sys.path, and the
table-join workload of ``bench_joins`` and ``bench_state``."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: bronzekit, joinkit

# A left table join of two 4-partition topics whose JSON values carry "v".
TABLE_JOIN_PIPELINE = """
topics:
  left: {partitions: 4}
  right: {partitions: 4}
joins:
  bench: {kind: table, left: left, right: right, type: left, select: {lv: left.v, rv: right.v}}
"""


def values(tag: str, n: int) -> pa.Array:
    """``n`` JSON values ``{"v": "<tag><i>"}``."""
    return pa.array([f'{{"v":"{tag}{i}"}}'.encode() for i in range(n)], pa.binary())


def keys(ids: np.ndarray) -> pa.Array:
    """The keys ``c<id>`` of ``ids``."""
    return pa.array([f"c{i}".encode() for i in ids], pa.binary())


@contextmanager
def embedded_broker(root: Path) -> Iterator[str]:
    """Start a broker under ``root`` on a free loopback port; every Kafka client of this process (and
    of the processes it starts) uses it through $LAKE_KAFKA_BOOTSTRAP. Stopped on exit."""
    from spark_jobs import broker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = broker.start(root, port)
    os.environ["LAKE_KAFKA_BOOTSTRAP"] = str(state.bootstrap_servers)
    try:
        yield str(state.bootstrap_servers)
    finally:
        broker.stop(root)
