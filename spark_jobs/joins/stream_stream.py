"""stream-stream: every left/right pair of one key within the window (DOMAIN.md §2)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.config import JoinSpec
from spark_jobs.joins.engine import (
    RECORD_COLUMNS,
    TS,
    BatchMetrics,
)
from spark_jobs.joins.kinds import STREAM_STREAM
from spark_jobs.joins.streams import BUFFER_SCHEMA, PAIR_COLUMNS, StreamJob, _stream_tables


class StreamStreamJob(StreamJob):
    """stream-stream: every left/right pair of one key within the window."""

    @classmethod
    def _kind_tables(cls, spec: JoinSpec) -> dict[str, pa.Schema]:
        return _stream_tables(spec) | {
            f"{spec.name}__left_buffer": BUFFER_SCHEMA,
            f"{spec.name}__right_buffer": BUFFER_SCHEMA,
        }

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
        name, window = self.spec.name, int(self.spec.window_ms or 0) * 1000
        new = {}
        for side, records in (("left", left), ("right", right)):
            live = records.filter(pc.is_valid(records["value"]))
            m.ignored += records.num_rows - live.num_rows
            new[side] = live.append_column("matched", pa.array(np.zeros(live.num_rows, dtype=bool)))
        decision = self._decide(txn, progress)
        old = {s: self._owned(f"{name}__{s}_buffer") for s in ("left", "right")}
        pairs = [
            _window_pairs(new["left"], pa.concat_tables([old["right"], new["right"]]), window),
            _window_pairs(old["left"], new["right"], window),
        ]
        paired = pa.concat_tables(pairs)
        buffers, unmatched = {}, []
        watermark = decision.get("watermark")
        for side in ("left", "right"):
            rows = pa.concat_tables([old[side], new[side]])
            hit = _ids_in(rows, paired[f"{side}_partition"], paired[f"{side}_offset"])
            rows = rows.set_column(
                rows.schema.get_field_index("matched"), "matched", pc.or_(rows["matched"], hit)
            )
            if watermark is not None:
                expires = pc.less(pc.add(rows["timestamp"], pa.scalar(window, pa.duration("us"))), watermark)
            else:
                expires = pa.array(np.zeros(rows.num_rows, dtype=bool))
            keep_side = self.spec.type == "outer" or (side == "left" and self.spec.type == "left")
            if keep_side:
                unmatched.append(_unmatched(rows.filter(pc.and_(expires, pc.invert(rows["matched"]))), side))
            buffers[side] = rows.filter(pc.invert(expires))
        out_rows = pa.concat_tables([paired, *unmatched]) if unmatched else paired
        m.affected_keys = out_rows.num_rows
        blame = {"__lp": "left_partition", "__lo": "left_offset", "__rp": "right_partition"}
        for column, source in (blame | {"__ro": "right_offset"}).items():
            out_rows = out_rows.append_column(column, out_rows[source])
        out, _ = self._project(out_rows, txn, at, m)
        order = [(c, "ascending") for c in STREAM_STREAM.meta_columns[1:]]
        out = out.sort_by(order)
        m.appended = out.num_rows
        m.pending = buffers["left"].num_rows + buffers["right"].num_rows
        self._append_events(out, txn, at)
        for side in ("left", "right"):
            if old[side].num_rows or buffers[side].num_rows:
                self._overwrite_owned(f"{name}__{side}_buffer", buffers[side], txn)


def _window_pairs(left: pa.Table, right: pa.Table, window_us: int) -> pa.Table:
    """Every (left, right) pair with the same key and |timestamps| <= window."""
    lhs = left.select(RECORD_COLUMNS).rename_columns(
        ["key", "left_value", "left_timestamp", "left_partition", "left_offset"]
    )
    rhs = right.select(RECORD_COLUMNS).rename_columns(
        ["key", "right_value", "right_timestamp", "right_partition", "right_offset"]
    )
    pairs = lhs.join(rhs, "key", join_type="inner")
    if pairs.num_rows:
        gap = pc.abs(pc.subtract(pairs["left_timestamp"], pairs["right_timestamp"]))
        pairs = pairs.filter(pc.less_equal(gap, pa.scalar(window_us, pa.duration("us"))))
    return pairs.select(PAIR_COLUMNS)


def _unmatched(rows: pa.Table, side: str) -> pa.Table:
    other = "right" if side == "left" else "left"
    n = rows.num_rows
    cols = {
        "key": rows["key"],
        f"{side}_timestamp": rows["timestamp"],
        f"{side}_partition": rows["partition"],
        f"{side}_offset": rows["offset"],
        f"{other}_timestamp": pa.nulls(n, TS),
        f"{other}_partition": pa.nulls(n, pa.int32()),
        f"{other}_offset": pa.nulls(n, pa.int64()),
        f"{side}_value": rows["value"],
        f"{other}_value": pa.nulls(n, pa.binary()),
    }
    return pa.table({c: cols[c] for c in PAIR_COLUMNS})


def _ids_in(rows: pa.Table, partitions: Any, offsets: Any) -> pa.Array:
    """Per row: is its (partition, offset) among the given ones."""
    if rows.num_rows == 0 or len(partitions) == 0:
        return pa.array(np.zeros(rows.num_rows, dtype=bool))
    wanted = {(p, o) for p, o in zip(partitions.to_pylist(), offsets.to_pylist(), strict=True)}
    mine = zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True)
    return pa.array([(p, o) in wanted for p, o in mine])
