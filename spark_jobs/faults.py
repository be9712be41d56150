"""Crash points for the fault tests: ``LAKE_KILL_AT=<point>`` makes a job kill itself with SIGKILL
(as ``kill -9`` would) right after it passes that point, so a test can check that a restart loses
and doubles nothing whichever commit the crash fell after. Unset, every point is a no-op.

The points of a join's micro-batch, in order: ``batch`` (Spark has written the batch's offsets,
nothing of the batch is done), ``publish`` (its changelog transaction is committed), ``park`` (its
result rows are parked for the table, ``--table-every``), ``write`` (its result commit is in), and
``fold`` (a catch-up's MERGE is in, the parked rows not yet cleared).
"""

from __future__ import annotations

import os
import signal

POINTS = ("batch", "publish", "park", "write", "fold")


def point(name: str) -> None:
    """Die here when ``$LAKE_KILL_AT`` names this point."""
    if os.environ.get("LAKE_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
