"""stream-table: each left event with the right side's value as of its timestamp (DOMAIN.md §2)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.config import JoinSpec
from spark_jobs.joins.engine import (
    RECORD_COLUMNS,
    BatchMetrics,
)
from spark_jobs.joins.streams import STATE_SCHEMA, StreamJob, _stream_tables


class StreamTableJob(StreamJob):
    """stream-table: each left event with the right side's value as of its timestamp."""

    @classmethod
    def _kind_tables(cls, spec: JoinSpec) -> dict[str, pa.Schema]:
        return _stream_tables(spec) | {
            f"{spec.name}__right_history": STATE_SCHEMA,
            f"{spec.name}__pending": STATE_SCHEMA,
        }

    def _watermark(self, decision: dict[str, Any], maxima: dict[str, Any]) -> Any:  # noqa: ARG002
        return maxima["right"]  # later right records are not older

    def _batch(
        self,
        batch: pa.Table,
        left: pa.Table,
        right: pa.Table,
        txn: tuple[str, int],
        at: datetime,
        m: BatchMetrics,
    ) -> None:
        progress = self._progress(batch, txn)
        name = self.spec.name
        m.ignored = left.num_rows - int(pc.sum(pc.is_valid(left["value"])).as_py() or 0)
        events = left.filter(pc.is_valid(left["value"]))
        if right.num_rows:
            self.lake.append(f"{name}__right_history", right, txn=txn)
        decision = self._decide(txn, progress)
        pending = self._owned(f"{name}__pending")
        candidates = _distinct_events(pa.concat_tables([pending, events]))
        if decision["right_caught_up"]:
            ready_mask = pa.array(np.ones(candidates.num_rows, dtype=bool))
        elif decision.get("watermark") is not None:
            ready_mask = pc.less(candidates["timestamp"], decision["watermark"])
        else:
            ready_mask = pa.array(np.zeros(candidates.num_rows, dtype=bool))
        ready, waiting = candidates.filter(ready_mask), candidates.filter(pc.invert(ready_mask))
        m.affected_keys, m.pending = ready.num_rows, waiting.num_rows
        rows = self._as_of(ready)
        out, _ = self._project(rows, txn, at, m)
        out = out.sort_by([("timestamp", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
        m.appended = out.num_rows
        self._append_events(out, txn, at)
        if pending.num_rows or waiting.num_rows:
            self._overwrite_owned(f"{name}__pending", waiting, txn)

    def _as_of(self, events: pa.Table) -> pa.Table:
        """Each event with the right side's value as of its timestamp (equal timestamps count as
        earlier); ``right_value`` null when there is none or it was deleted."""
        base = events.select(RECORD_COLUMNS).rename_columns(
            ["key", "left_value", "timestamp", "partition", "offset"]
        )
        base = base.append_column("__lp", base["partition"]).append_column("__lo", base["offset"])
        n = base.num_rows
        right = {"right_value": pa.nulls(n, pa.binary()), "__rp": pa.nulls(n, pa.int32())}
        right["__ro"] = pa.nulls(n, pa.int64())
        history = self.lake.read_keys(
            f"{self.spec.name}__right_history",
            "key",
            pc.unique(events["key"].combine_chunks()),
            columns=["key", "value", "timestamp", "partition", "offset"],
        ).rename_columns(["key", "right_value", "r_ts", "__rp", "__ro"])
        ids = base.append_column("__i", pa.array(np.arange(n)))
        cand = ids.select(["key", "timestamp", "__i"]).join(history, "key", join_type="inner")
        cand = cand.filter(pc.less_equal(cand["r_ts"], cand["timestamp"]))
        if cand.num_rows:
            cand = cand.sort_by([("__i", "ascending"), ("r_ts", "ascending"), ("__ro", "ascending")])
            i = cand["__i"].combine_chunks()
            last = pa.concat_arrays([pc.not_equal(i.slice(0, len(i) - 1), i.slice(1)), pa.array([True])])
            best = cand.filter(last)
            at = best["__i"].to_numpy()
            for column, kind in (("right_value", pa.binary()), ("__rp", pa.int32()), ("__ro", pa.int64())):
                values = np.full(n, None, dtype=object)
                values[at] = best[column].to_numpy(zero_copy_only=False)
                right[column] = pa.array(values, kind)
        rows = base
        for column, values in right.items():
            rows = rows.append_column(column, values)
        if self.spec.type == "inner":
            rows = rows.filter(pc.is_valid(rows["right_value"]))
        return rows


def _distinct_events(events: pa.Table) -> pa.Table:
    """Events once each, by (partition, offset), in (timestamp, partition, offset) order."""
    if events.num_rows == 0:
        return events
    ordered = events.sort_by([("partition", "ascending"), ("offset", "ascending")])
    p, o = ordered["partition"].combine_chunks(), ordered["offset"].combine_chunks()
    first = pc.or_(
        pc.not_equal(p.slice(1), p.slice(0, len(p) - 1)), pc.not_equal(o.slice(1), o.slice(0, len(o) - 1))
    )
    ordered = ordered.filter(pa.concat_arrays([pa.array([True]), first]))
    return ordered.sort_by([("timestamp", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
