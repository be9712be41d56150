"""Crash points for the fault tests: ``LAKE_KILL_AT=<point>`` makes a job kill itself with SIGKILL
(as ``kill -9`` would) right after it passes that point, so a test can check that a restart loses
and doubles nothing whichever commit the crash fell after. Unset, every point is a no-op. Beside
``errors``, below every package: the Kafka seam has a point of its own.

The points of a join's micro-batch, in order: ``batch`` (Spark has written the batch's offsets,
nothing of the batch is done), ``publish-open`` (an executor's changelog transaction has a record on
the broker, not committed), ``publish-part`` (partition 0's changelog transaction is committed, the
others' still open: their tasks wait before committing), ``publish`` (every partition's changelog
transaction is committed), ``park`` (its result rows are parked for the table, ``--table-every``),
``write`` (its result commit is in), and ``fold`` (a catch-up's MERGE is in, the rows of the catch-up
before it not yet deleted from the parked ones). The two ``publish-`` points are the executors'
(``lake.kafka.ChangelogWriter``): they end the Spark process.

The points of a backfill (``lake backfill``), in order: ``backfill-read`` (the dump is read and
counted), ``backfill-diff`` (compared with the topic, nothing produced), ``produce`` (every record
of a Kafka transaction is on the broker, the transaction still open) and ``commit`` (it is committed
and visible), both the Kafka seam's, passed by any transactional producer of the product, then the
ingest's ``mirror`` (the topic is mirrored into bronze, the lookup tables not refreshed) and
``refresh`` (a lookup table is refreshed, its position not yet recorded).
"""

from __future__ import annotations

import os
import signal

JOIN_POINTS = ("batch", "publish-open", "publish-part", "publish", "park", "write", "fold")
BACKFILL_POINTS = ("backfill-read", "backfill-diff", "produce", "commit", "mirror", "refresh")


def point(name: str) -> None:
    """Die here when ``$LAKE_KILL_AT`` names this point."""
    if os.environ.get("LAKE_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
