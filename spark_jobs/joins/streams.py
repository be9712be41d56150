"""What the stream kinds share: their progress per side and partition, the batch's recorded decision
(has a side read everything its topic holds?), the watermark, and appending decided events."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from spark_jobs.config import JoinSpec
from spark_jobs.ingest import next_offsets
from spark_jobs.joins.engine import (
    RECORD_COLUMNS,
    RECORD_FIELDS,
    TS,
    BatchMetrics,
    JoinJob,
    _without_json,
)
from spark_jobs.joins.kinds import STREAM_STREAM
from spark_jobs.lake import conform

STATE_SCHEMA = pa.schema(RECORD_FIELDS)
BUFFER_SCHEMA = pa.schema([*RECORD_FIELDS, ("matched", pa.bool_())])
PROGRESS_SCHEMA = pa.schema(
    [("side", pa.string()), ("partition", pa.int32()), ("next_offset", pa.int64()), ("max_timestamp", TS)]
)
DECISIONS_SCHEMA = pa.schema(
    [
        ("query_id", pa.string()),
        ("batch_id", pa.int64()),
        ("left_caught_up", pa.bool_()),
        ("right_caught_up", pa.bool_()),
        ("watermark", TS),
    ]
)
# A stream-stream pair (or an unmatched event) before ``select``: meta columns, then both values.
PAIR_COLUMNS = [*STREAM_STREAM.meta_columns, "left_value", "right_value"]


class StreamJob(JoinJob):
    """A kind whose result is an append-only log of events (stream-table, stream-stream)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._owned_rows: dict[str, pa.Table] = {}  # state tables as this job last read or wrote them

    def _owned(self, table: str) -> pa.Table:
        """A state table only this job writes, as it is now: read from Delta once per process, then
        kept as this job writes it (a read per batch would cost as much as the write)."""
        rows = self._owned_rows.get(table)
        if rows is None:
            rows = self._owned_rows[table] = self.lake.read_arrow(table)
        return rows

    def _overwrite_owned(self, table: str, rows: pa.Table, txn: tuple[str, int]) -> None:
        before = self._owned_rows.get(table)
        if self.lake.overwrite(table, rows, txn=txn) is None:  # a replay: Delta holds the first attempt's
            self._owned_rows.pop(table, None)
        else:
            self._owned_rows[table] = rows.cast(before.schema) if before is not None else rows

    def _step(self, frame: DataFrame, txn: tuple[str, int], at: datetime, metrics: BatchMetrics) -> None:
        """A micro-batch of records with ``reason``: quarantine the bad ones, hand the rest to the
        kind's :meth:`_batch`."""
        batch = conform(
            frame.toArrow(),
            pa.schema([("side", pa.string()), *RECORD_FIELDS, ("reason", pa.string())]),
            f"join {self.spec.name} input",
        )
        side = batch["side"]
        metrics.input_left = int(pc.sum(pc.equal(side, "left")).as_py() or 0)
        metrics.input_right = batch.num_rows - metrics.input_left
        bad = batch.filter(pc.is_valid(batch["reason"]))
        good = batch.filter(pc.is_null(batch["reason"]))
        metrics.quarantined = bad.num_rows
        self._quarantine(bad, txn, at)
        left = good.filter(pc.equal(good["side"], "left")).select(RECORD_COLUMNS)
        right = good.filter(pc.equal(good["side"], "right")).select(RECORD_COLUMNS)
        self._batch(batch, left, right, txn, at, metrics)

    def _batch(
        self,
        batch: pa.Table,
        left: pa.Table,
        right: pa.Table,
        txn: tuple[str, int],
        at: datetime,
        m: BatchMetrics,
    ) -> None:
        """The kind's work on a batch's valid records (``batch``: all of them, with ``reason``)."""
        raise NotImplementedError

    def _progress(self, batch: pa.Table, txn: tuple[str, int]) -> list[dict[str, Any]]:
        """Record the next offset and the largest timestamp seen per side and partition; returns the
        progress after the batch."""
        current = self._owned(f"{self.spec.name}__progress")
        if batch.num_rows == 0:
            return current.to_pylist()
        grouped = batch.group_by(["side", "partition"]).aggregate([("offset", "max"), ("timestamp", "max")])
        best: dict[tuple[str, int], tuple[int, Any]] = {
            (r["side"], r["partition"]): (r["next_offset"], r["max_timestamp"]) for r in current.to_pylist()
        }
        for r in grouped.to_pylist():
            k = (r["side"], r["partition"])
            off, ts = best.get(k, (0, None))
            best[k] = (
                max(off, r["offset_max"] + 1),
                ts if ts is not None and ts >= r["timestamp_max"] else r["timestamp_max"],
            )
        rows = pa.table(
            {
                "side": [k[0] for k in best],
                "partition": pa.array([k[1] for k in best], pa.int32()),
                "next_offset": pa.array([v[0] for v in best.values()], pa.int64()),
                "max_timestamp": pa.array([v[1] for v in best.values()], TS),
            }
        )
        # every side and partition seen so far: one overwrite (an append's cost), not a MERGE
        self._overwrite_owned(f"{self.spec.name}__progress", rows, txn)
        return rows.to_pylist()

    def _decide(self, txn: tuple[str, int], progress: list[dict[str, Any]]) -> dict[str, Any]:
        """Has each side read all its topic holds, and the largest timestamp per side — recorded by
        the first attempt of a batch, so a replay decides the same."""
        table = f"{self.spec.name}__decisions"
        if self._replay and self.lake.committed(table, txn):  # only the first batch of a run can be
            rows = self.lake.read_keys(table, "batch_id", pa.array([txn[1]], pa.int64()))
            rows = rows.filter(pc.equal(rows["query_id"], txn[0])).to_pylist()
            if rows:
                return rows[0] | {"recorded": True}
        decision: dict[str, Any] = {"query_id": txn[0], "batch_id": txn[1]}
        maxima: dict[str, Any] = {}
        for side, name in self.spec.sides:
            topic = self.config.topic(name)
            seen = np.zeros(topic.partitions, dtype=np.int64)
            stamps = [r["max_timestamp"] for r in progress if r["side"] == side]
            for r in progress:
                if r["side"] == side and r["partition"] < topic.partitions:
                    seen[r["partition"]] = r["next_offset"]
            decision[f"{side}_caught_up"] = bool((seen >= next_offsets(self.lake, topic)).all())
            maxima[side] = max(stamps) if stamps else None
        decision["watermark"] = self._watermark(decision, maxima)
        self.lake.append(table, pa.Table.from_pylist([decision], DECISIONS_SCHEMA), txn=txn)
        return decision

    def _watermark(self, decision: dict[str, Any], maxima: dict[str, Any]) -> Any:
        return _watermark(decision, maxima)

    def _append_events(self, out: pa.Table, txn: tuple[str, int], at: datetime) -> None:
        """Stream kinds: append the decided rows to the result, and publish them when configured."""
        if out.num_rows == 0:
            return
        self.lake.append(self.spec.name, _without_json(out), txn=txn)
        if self.spec.publish:
            self._publish(
                out["key"].combine_chunks(), out["__json"].combine_chunks().cast(pa.binary()), txn, at
            )


def _stream_tables(spec: JoinSpec) -> dict[str, pa.Schema]:
    """The stream kinds' progress per side and partition, and each batch's recorded decisions."""
    return {f"{spec.name}__progress": PROGRESS_SCHEMA, f"{spec.name}__decisions": DECISIONS_SCHEMA}


def _watermark(decision: dict[str, Any], maxima: dict[str, Any]) -> Any:
    """Event time below which no more records are expected: a side still reading holds it back to
    its largest timestamp (its later records are not older); a side that has read everything does not
    hold it back. When both have, it is the largest timestamp seen."""
    bounds = [maxima[s] for s in ("left", "right") if not decision[f"{s}_caught_up"]]
    if bounds:
        return None if any(b is None for b in bounds) else min(bounds)
    seen = [v for v in maxima.values() if v is not None]
    return max(seen) if seen else None
