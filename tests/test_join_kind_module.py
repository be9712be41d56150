"""A join kind is one module: this file adds a toy kind, ``log`` (every left event with its select,
tombstones skipped), as one JoinKind entry, one engine class with its oracle, and one registry line
each, and runs it through the public test driver and the audit's oracle. No other code changes."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec
from spark_jobs.join_kinds import KINDS, JoinKind
from spark_jobs.joins.engine import BatchMetrics, Projection
from spark_jobs.joins.oracle import expected
from spark_jobs.joins.registry import JOBS
from spark_jobs.joins.streams import Counts, StreamJob, _stream_tables
from spark_jobs.testing import PipelineTestDriver, TopicLog

LOG = JoinKind("log", ("inner",), (), ("key", "timestamp", "partition", "offset"), events=True)
EVENT_COLUMNS = ["key", "timestamp", "partition", "offset"]


class LogJob(StreamJob):
    """log: each left event once, with its select; its state is the stream kinds' progress only."""

    @classmethod
    def _kind_tables(cls, spec: JoinSpec) -> dict[str, Any]:
        return _stream_tables(spec)

    def _batch(
        self,
        sides: dict[str, DataFrame],
        totals: dict[str, Counts],
        decision: dict[str, Any],  # noqa: ARG002
        txn: tuple[str, int],
        at: datetime,
        m: BatchMetrics,
    ) -> None:
        m.ignored = totals["left"].tombstones
        if totals["left"].valid > totals["left"].tombstones:
            self._append_events(_events(sides["left"]), ["partition", "offset"], txn, at, m)

    @staticmethod
    def expected(spark, lake, config, spec: JoinSpec, left: DataFrame, right: None, codecs):  # noqa: ARG004
        return _events(left), Projection(spark, codecs, spec).frame


def _events(records: DataFrame) -> DataFrame:
    return records.filter(F.col("value").isNotNull()).select(
        *EVENT_COLUMNS, F.col("value").alias("left_value")
    )


PIPELINE = """
pipeline: toy
topics:
  clicks: {partitions: 2}
joins:
  clicks_log:
    kind: log
    left: clicks
    select: {page: left.page}
"""


@pytest.fixture
def with_log_kind(monkeypatch):
    monkeypatch.setitem(KINDS, "log", LOG)
    monkeypatch.setitem(JOBS, "log", LogJob)


def test_a_kind_added_in_one_module_runs_through_the_test_driver_and_the_oracle(
    spark, tmp_path, with_log_kind
):
    (tmp_path / "toy.yaml").write_text(PIPELINE)
    clicks = [("u1", {"page": "home"}, 1000), ("u2", {"page": "cart"}, 2000)]
    later = [("u1", None, 3000), ("u1", {"page": "pay"}, 4000)]  # a tombstone is no event
    with PipelineTestDriver(tmp_path / "toy.yaml", root=tmp_path / "lake", spark=spark) as d:
        for key, value, ts in clicks:
            d.pipe("clicks", key=key, value=value, timestamp=ts)
        d.advance()
        assert sorted(d.changes("clicks_log")) == [
            ("u1", {"page": "home"}, 1000),
            ("u2", {"page": "cart"}, 2000),
        ]
        for key, value, ts in later:
            d.pipe("clicks", key=key, value=value, timestamp=ts)
        d.advance()
        assert d.changes("clicks_log") == [("u1", {"page": "pay"}, 4000)]
        rows = sorted(d.lake.read_arrow("clicks_log", columns=["key", "page"]).to_pylist(), key=str)
        # the oracle over the same records, placed and numbered as the driver's topic placed them
        log = TopicLog(d.config.topic("clicks"))
        for key, value, ts in clicks + later:
            encoded = None if value is None else json.dumps(value).encode()
            log.append(pa.array([key.encode()], pa.binary()), pa.array([encoded], pa.binary()), ts)
        oracle = expected(spark, d.lake, d.config, "clicks_log", lambda topic: d.lake.frame(log.rows))
        assert (
            sorted(oracle.select(["key", "page"]).to_pylist(), key=str)
            == rows
            == sorted(
                [
                    {"key": b"u1", "page": "home"},
                    {"key": b"u2", "page": "cart"},
                    {"key": b"u1", "page": "pay"},
                ],
                key=str,
            )
        )
