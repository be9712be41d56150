"""Commit fences: this process's Delta commits under a lake root stop when a lease it holds there may
have lapsed.

A lease (``spark_jobs.runtime.leases``) is good until ``TTL`` after the start of its last renewal;
its holder stops writing ``MARGIN`` seconds before that. The deadline lives here, per root and lease,
and in the driver JVM's Delta log store (``lake.delta.PutIfAbsentLogStore``), which refuses every
commit under the root once a deadline has passed: at the commit itself, whatever thread or streaming
query makes it, not at the start of the work before it. Work that commits elsewhere (a join's
changelog, whose Kafka transactions the executors commit) asks :func:`check` before it starts. A
session started while leases are held gets their deadlines when it starts (:func:`apply`). Only a
session whose driver is this process is fenced: a Spark Connect server commits in its own JVM.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from spark_jobs.errors import UserError

_lock = threading.Lock()
_deadlines: dict[tuple[str, str], float] = {}  # (root, lease) -> time.monotonic() when commits stop

FENCED = "lake-lease-lapsed"  # how the log store's refusal starts


def hold(root: str, lease: str, until: float) -> None:
    """Commits under ``root`` stop at ``until`` (``time.monotonic()``) unless ``lease`` renews it."""
    with _lock:
        _deadlines[(root, lease)] = until
        _push(root, lease, until)


def lift(root: str, lease: str) -> None:
    """``lease`` was released: its fence goes."""
    with _lock:
        _deadlines.pop((root, lease), None)
        store = _store()
        if store is not None:
            store.lift(root, lease)


def check(root: str) -> None:
    """Refuse work that commits outside Delta (a changelog's Kafka transactions, which the
    executors commit) when a lease this process holds on ``root`` is past its deadline."""
    with _lock:
        lapsed = [
            lease
            for (where, lease), until in _deadlines.items()
            if where == root and until <= time.monotonic()
        ]
    if lapsed:
        raise UserError(
            f"{FENCED}: this process's lease {lapsed[0]} on {root} was not renewed in time, and another "
            "machine may hold it now: nothing more is written"
        )


def refusal(error: str) -> str | None:
    """The log store's refusal in an error's text (a Spark job's or Delta's, through py4j), in one line."""
    at = error.find(FENCED)
    return error[at:].splitlines()[0] if at >= 0 else None


def apply(spark: Any) -> None:
    """Give a session that has just started the fences of the leases this process holds."""
    with _lock:
        for (root, lease), until in _deadlines.items():
            _push(root, lease, until, spark)


def _push(root: str, lease: str, until: float, spark: Any = None) -> None:
    store = _store(spark)
    if store is not None:
        store.fence(root, lease, max(0, int((until - time.monotonic()) * 1000)))


def _store(spark: Any = None) -> Any:
    """The driver JVM's log store class, when this process has a classic Spark session."""
    from pyspark import SparkContext

    try:
        context = spark.sparkContext if spark is not None else SparkContext._active_spark_context
    except Exception:  # a Spark Connect session has no context here
        return None
    jvm = getattr(context, "_jvm", None)
    return None if jvm is None else jvm.lake.delta.PutIfAbsentLogStore
