"""Where a micro-batch's time goes: the join engine's own phases (:class:`Phases`, on every batch's log
line) and, with ``$LAKE_PROFILE=1``, Spark's phases of every streaming query's micro-batch (ingest and
joins: :func:`watch_queries`). ``make bench-peer`` reads both from the jobs' logs for docs/benchmarks.md's
profile.

A profile line is ``profile <query> batch <id> at <start, epoch s> rows <n> ms {<phase>: ms, ...}``
with Spark's ``durationMs``: ``latestOffset`` (asking the sources for their end), ``getBatch``,
``queryPlanning``, ``addBatch`` (the sink's write: Delta's append for an ingest, the engine's
``foreachBatch`` for a join), ``walCommit`` and ``commitOffsets`` (the checkpoint's offset and commit
logs), and ``triggerExecution`` (all of the batch).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

PROFILE_ENV = "LAKE_PROFILE"


class Phases:
    """Wall-clock milliseconds of a micro-batch's named phases, in the order they first ran."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - started) * 1000

    def text(self) -> str:
        return ", ".join(f"{name} {ms:.0f}" for name, ms in self.ms.items())


def profiling() -> bool:
    return os.environ.get(PROFILE_ENV, "0") == "1"


def profile_line(progress: Any) -> str:
    """A query progress as a profile line (see the module's doc)."""
    started = datetime.fromisoformat(str(progress.timestamp).replace("Z", "+00:00")).timestamp()
    durations = {k: int(v) for k, v in dict(progress.durationMs).items()}
    return (
        f"profile {progress.name} batch {progress.batchId} at {started:.3f} "
        f"rows {progress.numInputRows} ms {json.dumps(durations, sort_keys=True)}"
    )


def watch_queries(spark: Any, log: Callable[[str], None]) -> Any:
    """With ``$LAKE_PROFILE=1``: log a profile line for every micro-batch that read records, of every
    streaming query of ``spark``; returns the listener (``spark.streams.removeListener`` ends it).
    Without it, nothing (None)."""
    if not profiling():
        return None
    from pyspark.sql.streaming import StreamingQueryListener

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            if event.progress.numInputRows:
                log(profile_line(event.progress))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    listener = Listener()
    spark.streams.addListener(listener)
    return listener
