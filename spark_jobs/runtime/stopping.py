"""Long-running Spark queries (joins, ingests) stop after their current micro-batch on SIGTERM or Ctrl-C."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT (Ctrl-C) set ``stop`` while the block runs (main thread only); the previous
    handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in previous:
        signal.signal(s, lambda *_: stop.set())
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
