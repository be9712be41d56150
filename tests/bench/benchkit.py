"""What the benchmarks share: an embedded Kafka broker of their own, and the test kits on sys.path."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: bronzekit, joinkit


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
