"""The join kinds that follow a key inside the left value (DOMAIN.md §4-§6), on the join engine.

- ``fk``: a foreign-key table-table join, keyed by the left key. A right change reaches the left
  rows pointing at it through the subscription store ``<join>__subs`` (foreign key -> left key, one row
  per accepted left version; the left state tells which entries are current), so it costs the rows
  that point at it, never a scan of the left table or one record holding all of them.
- ``derive``: a lookup keyed by a value of its master topic (e.g. e-mail -> customer id). The same
  store finds the master keys that hold a derived key; each affected derived key is recomputed from
  the current master state (the newest master record holding it wins), so a derived row that a newer
  update wrote is never deleted by an older one moving away.
- ``list``: the left value holds a list of ids into the right table. ``<join>__elements`` caches, per
  (left key, element id), the right value the element was joined with: a batch looks up only added
  elements and elements whose right record changed, retracts removed ones, and reuses the rest.

Every kind recomputes exactly the affected result keys from state and merges the difference; the
oracle (``oracle.py``) checks the result against a batch join of the snapshots.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, StringType
from pyspark.sql.utils import AnalysisException

from spark_jobs.config import FIELD_PATH_RE, JoinSpec, PipelineConfig
from spark_jobs.errors import UserError, spark_error
from spark_jobs.joins.engine import (
    BatchMetrics,
    JoinJob,
    Projection,
    StreamStreamJob,
    StreamTableJob,
    TableJob,
    _unique_keys,
    _without,
    latest_per_key,
    prepare,
    value_column,
)
from spark_jobs.lake import conform
from spark_jobs.session import arrow_frame

CHUNK_KEYS = 100_000  # result keys recomputed at a time: a hot key's fan-out is bounded in memory
# derive: which of the master records holding one derived key wins. Offsets order records within a
# partition only, so equal timestamps in different partitions fall back to the partition number.
NEWEST = ["timestamp", "partition", "offset"]


# --- the left records' keys, by Spark ------------------------------------------------------------
class LeftKeys:
    """Adds to a batch the left records' foreign key (fk), derived key (derive) or items and ids (list),
    and the quarantine reason of a list join's left record without a list."""

    def __init__(self, spark: SparkSession, config: PipelineConfig, spec: JoinSpec):
        self.spec = spec
        self.format = config.topic(spec.left).value_format
        self.setting = str(spec.join_kind.keyed_by)
        self.expr = spec.by or ""
        self.is_path = self.format == "json" and bool(FIELD_PATH_RE.match(self.expr))
        self.is_path = self.is_path and not self.expr.startswith("left.")
        empty = spark.createDataFrame([], "side string, key binary, value binary, reason string")
        try:
            self.as_text = self._raw_type(empty) == StringType()
            _ = self.add(empty).schema  # analysis happens here
        except AnalysisException as exc:
            raise UserError(f"{spec.where['__' + self.setting]}: {spark_error(exc)}") from None

    def _left(self) -> Column:
        return value_column(F.col("value"), self.format)

    def _raw(self) -> Column:
        if self.is_path:
            return F.get_json_object(F.col("value").cast("string"), f"$.{self.expr}")
        return F.expr(self.expr)

    def _raw_type(self, frame: DataFrame) -> Any:
        data_type = frame.withColumn("left", self._left()).select(self._raw()).schema[0].dataType
        if self.spec.kind == "list" and not isinstance(data_type, (StringType, ArrayType)):
            raise UserError(
                f"{self.spec.where['__list']}: must give a list (or JSON text of one), "
                f"not {data_type.simpleString()}"
            )
        return data_type

    def add(self, frame: DataFrame) -> DataFrame:
        is_left = (F.col("side") == "left") & F.col("value").isNotNull()
        df = frame.withColumn("left", self._left())
        raw = self._raw()
        if self.spec.kind != "list":
            by = raw.cast("string").cast("binary")
            return df.withColumn("by", F.when(is_left, by)).drop("left")
        items = (
            F.from_json(raw, "array<string>")
            if self.as_text
            else F.transform(raw, lambda x: x.cast("string"))
        )
        df = df.withColumn("items", F.when(is_left, items))
        if self.spec.element_id:
            path = f"$.{self.spec.element_id}"
            ids = F.transform("items", lambda x: F.get_json_object(x, path).cast("binary"))
        else:
            ids = F.transform("items", lambda x: x.cast("binary"))
        reason = F.when(is_left & F.col("items").isNull(), F.lit(f"value has no list at '{self.expr}'"))
        return (
            df.withColumn("ids", ids).withColumn("reason", F.coalesce(F.col("reason"), reason)).drop("left")
        )


# --- the list join's projection --------------------------------------------------------------------
class ListProjection:
    """A list join's result: ``key``, ``select`` over ``left``, and the enriched list: per element
    ``id``, ``matched`` and ``elements`` over ``element`` (the element: a JSON object's fields, or the
    scalar as text) and ``right``; inner joins leave unmatched elements out. Lists keep their order."""

    def __init__(self, spark: SparkSession, config: PipelineConfig, spec: JoinSpec):
        self.spark, self.spec = spark, spec
        self.formats = {side: config.topic(topic).value_format for side, topic in spec.sides}
        rows = pa.schema([("key", pa.binary()), ("left_value", pa.binary())])
        elements = pa.schema(
            [
                ("key", pa.binary()),
                ("pos", pa.int64()),
                ("item", pa.string()),
                ("id", pa.binary()),
                ("right_value", pa.binary()),
            ]
        )
        self.row_schema, self.element_schema = rows, elements
        frame = self._checked(
            spark.createDataFrame(rows.empty_table()), spark.createDataFrame(elements.empty_table())
        )
        schema = to_arrow_schema(frame.schema, timezone="UTC")
        self.output_schema = pa.schema([f.with_nullable(True) for f in schema])  # deletes carry nulls

    def _value(self, side: str, column: str) -> Column:
        return value_column(F.col(column), self.formats[side])

    def _element_exprs(self) -> list[str]:
        return [f"({expr}) AS `{col}`" for col, expr in self.spec.elements.items()]

    def _checked(self, rows: DataFrame, elements: DataFrame) -> DataFrame:
        for col, expr in self.spec.elements.items():
            try:
                _ = self._enriched(elements, [f"({expr}) AS `{col}`"]).schema
            except AnalysisException as exc:
                raise UserError(f"{self.spec.where['elements.' + col]}: {spark_error(exc)}") from None
        for col, expr in self.spec.select.items():
            try:
                _ = (
                    rows.select(self._value("left", "left_value").alias("left"))
                    .selectExpr(f"({expr})")
                    .schema
                )
            except AnalysisException as exc:
                raise UserError(f"{self.spec.where[col]}: {spark_error(exc)}") from None
        return self.frame(rows, elements)

    def _enriched(self, elements: DataFrame, exprs: list[str]) -> DataFrame:
        element = F.from_json(F.col("item"), "map<string,string>") if self.spec.element_id else F.col("item")
        return elements.select(
            "key",
            "pos",
            F.col("id").cast("string").alias("id"),
            F.col("right_value").isNotNull().alias("matched"),
            element.alias("element"),
            self._value("right", "right_value").alias("right"),
        ).selectExpr("key", "pos", "id", "matched", *exprs)

    def frame(self, rows: DataFrame, elements: DataFrame) -> DataFrame:
        """``rows`` (key, left_value) and their ``elements`` (key, pos, item, id, right_value: null
        when the id has no live right record) -> the result's columns."""
        enriched = self._enriched(elements, self._element_exprs())
        if self.spec.type == "inner":
            enriched = enriched.filter("matched")
        fields = ["id", "matched", *self.spec.elements]
        entry = F.struct(F.col("pos"), F.struct(*[F.col(f"`{c}`") for c in fields]).alias("e"))
        lists = enriched.groupBy("key").agg(F.sort_array(F.collect_list(entry)).alias("__entries"))
        joined = rows.join(lists, "key", "left")
        items = F.transform("__entries", lambda x: x["e"])
        framed = joined.select("key", self._value("left", "left_value").alias("left"), items.alias("__items"))
        element_type = framed.schema["__items"].dataType
        out = framed.selectExpr(
            "key", *[f"({expr}) AS `{col}`" for col, expr in self.spec.select.items()], "__items"
        )
        empty = F.expr("array()").cast(element_type)
        return out.select(
            *[F.col(f"`{c}`") for c in ("key", *self.spec.select)],
            F.coalesce(F.col("__items"), empty).alias(self.spec.list_as),
        )

    def apply(self, rows: pa.Table, elements: pa.Table, with_json: bool = False) -> pa.Table:
        if rows.num_rows == 0:
            out = self.output_schema.empty_table()
            return out.append_column("__json", pa.array([], pa.string())) if with_json else out
        frame = self.frame(
            arrow_frame(
                self.spark, conform(rows.select(self.row_schema.names), self.row_schema, "list rows")
            ),
            arrow_frame(self.spark, conform(elements, self.element_schema, "list elements")),
        )
        columns = [*self.spec.select, self.spec.list_as]
        if with_json:
            cols = [F.col(f"`{c}`") for c in columns]
            frame = frame.withColumn("__json", F.to_json(F.struct(*cols), {"ignoreNullFields": "false"}))
        schema = (
            self.output_schema.append(pa.field("__json", pa.string())) if with_json else self.output_schema
        )
        return conform(frame.toArrow(), schema, f"join {self.spec.name}")


# --- helpers ---------------------------------------------------------------------------------
def latest_by(rows: pa.Table, keys: list[str], order: list[str]) -> pa.Table:
    """The last row of every ``keys`` combination by ``order``."""
    if rows.num_rows == 0:
        return rows
    ordered = rows.sort_by([(c, "ascending") for c in [*keys, *order]])
    n = ordered.num_rows
    change = pa.array(np.zeros(n - 1, dtype=bool))
    for k in keys:
        col = ordered[k].combine_chunks()
        change = pc.or_(change, pc.fill_null(pc.not_equal(col.slice(0, n - 1), col.slice(1)), True))
        change = pc.or_(change, pc.not_equal(pc.is_null(col.slice(0, n - 1)), pc.is_null(col.slice(1))))
    return ordered.filter(pa.concat_arrays([change, pa.array([True])]))


def chunks(keys: pa.Array, size: int | None = None) -> Iterator[pa.Array]:
    size = size or CHUNK_KEYS
    for start in range(0, len(keys), size):
        yield keys.slice(start, size)


def _union(*arrays: pa.Array) -> pa.Array:
    parts = [a for a in arrays if len(a)]
    if not parts:
        return pa.array([], pa.binary())
    return pc.unique(pa.concat_arrays([p.cast(pa.binary()) for p in parts]))


def _live(state: pa.Table) -> pa.Table:
    return state.filter(pc.is_valid(state["value"]))


def _values_by_key(rows: pa.Table) -> dict[bytes, bytes]:
    return dict(zip(rows["key"].to_pylist(), rows["value"].to_pylist(), strict=True))


class KeyedJob(JoinJob):
    """The kinds whose left records carry a key (or list) computed from their value."""

    def _prepared(self, frame: DataFrame) -> DataFrame:
        return self.left_keys.add(prepare(frame, self.formats))

    def _projection(self) -> Any:
        self.left_keys = LeftKeys(self.spark, self.config, self.spec)  # checked before the projection
        return self._result_projection()

    def _result_projection(self) -> Any:
        return Projection(self.spark, self.config, self.spec)


# --- fk and derive ------------------------------------------------------------------------------
class IndexedJob(KeyedJob):
    """fk and derive: the left state, the subscription store, and (fk) the right state."""

    def _compacted(self, table: str, rows: pa.Table) -> pa.Table:
        if table.endswith("__subs"):  # the current subscriptions, clustered by foreign key
            current = latest_per_key(rows)
            return current.filter(pc.is_valid(current["by"])).sort_by([("by", "ascending")])
        return latest_per_key(rows)

    def _apply_left(self, left: pa.Table, txn: tuple[str, int], m: BatchMetrics) -> pa.Table:
        """Apply the left records, and record the accepted ones' subscriptions (a deleted row or a
        null key subscribes to nothing); counts the live records with a null key, and returns them
        all (the batch's live left records)."""
        name = self.spec.name
        live_left = _live(left)
        m.null_keys = int(pc.sum(pc.is_null(live_left["by"])).as_py() or 0)
        _, fresh = self._apply(f"{name}__left", left, _unique_keys(left), txn)
        if fresh.num_rows:
            by = pc.if_else(pc.is_valid(fresh["value"]), fresh["by"], pa.nulls(fresh.num_rows, pa.binary()))
            subs = pa.table(
                {"by": by, "key": fresh["key"], "timestamp": fresh["timestamp"], "offset": fresh["offset"]}
            )
            self.lake.append(f"{name}__subs", subs, txn=txn)
            self._appended.add(f"{name}__subs")
        return live_left

    def _subscribers(self, by: pa.Array) -> pa.Array:
        """Left keys whose store entries name one of ``by`` (a superset of the current ones)."""
        if len(by) == 0:
            return pa.array([], pa.binary())
        rows = self.lake.read_keys(f"{self.spec.name}__subs", "by", by, columns=["key"])
        return pc.unique(rows["key"].combine_chunks()) if rows.num_rows else pa.array([], pa.binary())


class FkJob(IndexedJob):
    def _batch(
        self,
        batch: pa.Table,
        left: pa.Table,
        right: pa.Table,
        txn: tuple[str, int],
        at: datetime,
        m: BatchMetrics,
    ) -> None:
        name = self.spec.name
        self._apply_left(left, txn, m)
        right_keys = _unique_keys(right)
        self._apply(f"{name}__right", right, right_keys, txn)
        # affected: the changed left rows, and every left row that points at a changed right row
        left_keys = _unique_keys(left)
        candidates = _union(left_keys, self._subscribers(right_keys))
        changes = []
        for chunk in chunks(candidates):
            keys, rows = self._rows(chunk, left_keys, right_keys)
            m.affected_keys += len(keys)
            desired, failed = self._project(rows, txn, at, m)
            changes.append(self._changes(desired, _without(keys, failed)))
        self._write_changes(changes, txn, at, m)

    def _rows(
        self, candidates: pa.Array, left_keys: pa.Array, right_keys: pa.Array
    ) -> tuple[pa.Array, pa.Table]:
        """The affected keys among ``candidates`` (changed left rows, and rows that now point at a
        changed right row: a stale store entry is not one) and their desired joined rows (key,
        left_value, right_value)."""
        name = self.spec.name
        state = latest_per_key(self.lake.read_keys(f"{name}__left", "key", candidates))
        pointing = pc.and_(pc.is_valid(state["value"]), pc.is_in(state["by"], right_keys))
        state = state.filter(pc.or_(pc.is_in(state["key"], left_keys), pc.fill_null(pointing, False)))
        keys = state["key"].combine_chunks()
        live = _live(state)
        by = live["by"].combine_chunks()
        fks = pc.unique(by.filter(pc.is_valid(by)))
        right = _live(latest_per_key(self.lake.read_keys(f"{name}__right", "key", fks)))
        rhs = right.select(["key", "value", "partition", "offset"])
        rhs = rhs.rename_columns(["__fk", "right_value", "__rp", "__ro"])
        lhs = live.select(["key", "value", "by", "partition", "offset"])
        lhs = lhs.rename_columns(["key", "left_value", "__fk", "__lp", "__lo"])
        join_type = "inner" if self.spec.type == "inner" else "left outer"
        rows = lhs.join(rhs, "__fk", join_type=join_type).drop_columns(["__fk"])
        return keys, rows


class DeriveJob(IndexedJob):
    tombstones_follow_left = False  # its result is keyed by the derived key, not the left topic's

    def _batch(
        self,
        batch: pa.Table,
        left: pa.Table,
        right: pa.Table,
        txn: tuple[str, int],
        at: datetime,
        m: BatchMetrics,
    ) -> None:
        name = self.spec.name
        live_left = self._apply_left(left, txn, m)
        # affected derived keys: every one a batch key's versions held (old and new), so a key moving
        # away is recomputed as well as the one it moves to
        history = self.lake.read_keys(f"{name}__left", "key", _unique_keys(left), columns=["by"])
        held = history["by"].combine_chunks()
        affected = _union(held.filter(pc.is_valid(held)), live_left["by"].combine_chunks().drop_null())
        m.affected_keys = len(affected)
        changes = []
        for keys in chunks(affected):
            desired, failed = self._project(self._rows(keys), txn, at, m)
            changes.append(self._changes(desired, _without(keys, failed)))
        self._write_changes(changes, txn, at, m)

    def _rows(self, derived: pa.Array) -> pa.Table:
        """Per derived key, the newest live master record holding it: (key, master_key, left_value)."""
        name = self.spec.name
        masters = self._subscribers(derived)
        state = _live(latest_per_key(self.lake.read_keys(f"{name}__left", "key", masters)))
        state = state.filter(pc.is_in(state["by"], derived))
        newest = latest_by(state, ["by"], NEWEST)
        return pa.table(
            {
                "key": newest["by"],
                "master_key": newest["key"],
                "left_value": newest["value"],
                "__lp": newest["partition"],
                "__lo": newest["offset"],
            }
        )


# --- list ---------------------------------------------------------------------------------------
class ListJob(KeyedJob):
    def _result_projection(self) -> Any:
        return ListProjection(self.spark, self.config, self.spec)

    def _compacted(self, table: str, rows: pa.Table) -> pa.Table:
        if table.endswith("__elements"):
            current = latest_by(rows, ["key", "id"], ["seq"])
            return current.filter(current["member"])
        return latest_per_key(rows)

    def _batch(
        self,
        batch: pa.Table,
        left: pa.Table,
        right: pa.Table,
        txn: tuple[str, int],
        at: datetime,
        m: BatchMetrics,
    ) -> None:
        name = self.spec.name
        self._apply(f"{name}__left", left, _unique_keys(left), txn)
        right_keys = _unique_keys(right)
        self._apply(f"{name}__right", right, right_keys, txn)
        affected = _union(_unique_keys(left), self._subscribers(right_keys))
        m.affected_keys = len(affected)
        changes, cache_rows = [], []
        for keys in chunks(affected):
            rows, elements, cache = self._rows(keys, right_keys, m)
            cache_rows.append(cache)
            desired, failed = self._project(rows, txn, at, m, elements)
            changes.append(self._changes(desired, _without(keys, failed)))
        cache_changes = pa.concat_tables(cache_rows) if cache_rows else None
        if cache_changes is not None and cache_changes.num_rows:
            seq = self.lake.version(f"{name}__elements") + 1  # the version this append creates
            cache_changes = cache_changes.append_column("seq", pa.array(np.full(cache_changes.num_rows, seq)))
            self.lake.append(f"{name}__elements", cache_changes, txn=txn)
            self._appended.add(f"{name}__elements")
        self._write_changes(changes, txn, at, m)

    def _subscribers(self, ids: pa.Array) -> pa.Array:
        """Left keys whose list currently holds one of ``ids``."""
        if len(ids) == 0:
            return pa.array([], pa.binary())
        rows = self.lake.read_keys(f"{self.spec.name}__elements", "id", ids)
        current = latest_by(rows, ["key", "id"], ["seq"])
        current = current.filter(current["member"])
        return pc.unique(current["key"].combine_chunks()) if current.num_rows else pa.array([], pa.binary())

    def _rows(
        self, keys: pa.Array, changed_right: pa.Array, m: BatchMetrics
    ) -> tuple[pa.Table, pa.Table, pa.Table]:
        """For ``keys``: the live left rows, their elements with right values, and the element cache's
        changes. Only added elements and elements whose right record changed are looked up."""
        name = self.spec.name
        state = _live(latest_per_key(self.lake.read_keys(f"{name}__left", "key", keys)))
        cached = latest_by(self.lake.read_keys(f"{name}__elements", "key", keys), ["key", "id"], ["seq"])
        cached = cached.filter(cached["member"])
        old: dict[tuple[bytes, bytes], Any] = {
            (k, i): v
            for k, i, v in zip(
                cached["key"].to_pylist(),
                cached["id"].to_pylist(),
                cached["right_value"].to_pylist(),
                strict=True,
            )
        }
        changed = set(changed_right.to_pylist())
        lists = dict(zip(state["key"].to_pylist(), state["ids"].to_pylist(), strict=True))
        now = {(k, i) for k, ids in lists.items() for i in ids if i is not None}
        lookup = [pair for pair in now if pair not in old or pair[1] in changed]
        removed = [pair for pair in old if pair not in now]
        m.elements_joined += len(lookup)
        m.elements_retracted += len(removed)
        m.elements_kept += len(now) - len(lookup)
        ids = pa.array(sorted({i for _, i in lookup}), pa.binary())
        found = _values_by_key(_live(latest_per_key(self.lake.read_keys(f"{name}__right", "key", ids))))
        values = {pair: old.get(pair) for pair in now}
        cache_keys, cache_ids, cache_values, member = [], [], [], []
        for pair in lookup:
            value = found.get(pair[1])
            values[pair] = value
            if pair not in old or old[pair] != value:
                cache_keys.append(pair[0])
                cache_ids.append(pair[1])
                cache_values.append(value)
                member.append(True)
        for pair in removed:
            cache_keys.append(pair[0])
            cache_ids.append(pair[1])
            cache_values.append(None)
            member.append(False)
        cache = pa.table(
            {
                "key": pa.array(cache_keys, pa.binary()),
                "id": pa.array(cache_ids, pa.binary()),
                "right_value": pa.array(cache_values, pa.binary()),
                "member": pa.array(member, pa.bool_()),
            }
        )
        elements = _elements(state, values)
        rows = state.select(["key", "value", "partition", "offset"])
        return rows.rename_columns(["key", "left_value", "__lp", "__lo"]), elements, cache


def _elements(state: pa.Table, values: dict[tuple[bytes, bytes], Any]) -> pa.Table:
    """One row per list position: key, pos, item, id, right_value."""
    items, ids = state["items"].combine_chunks(), state["ids"].combine_chunks()
    parents = pc.list_parent_indices(items)
    offsets = items.offsets.to_numpy()
    starts = offsets[parents.to_numpy()] if len(parents) else np.array([], dtype=np.int64)
    pos = offsets[0] + np.arange(len(parents), dtype=np.int64) - starts  # flat index -> list position
    keys = state["key"].combine_chunks().take(parents)
    flat_ids = pc.list_flatten(ids)
    right = [
        values.get((k, i)) if i is not None else None
        for k, i in zip(keys.to_pylist(), flat_ids.to_pylist(), strict=True)
    ]
    return pa.table(
        {
            "key": keys,
            "pos": pa.array(pos, pa.int64()),
            "item": pc.list_flatten(items),
            "id": flat_ids,
            "right_value": pa.array(right, pa.binary()),
        }
    )


def job_for(
    spark: SparkSession, lake: Any, config: PipelineConfig, spec: JoinSpec, query_id: Any, log: Any = None
) -> JoinJob:
    """The engine for a join's kind."""
    cls = JOBS[spec.kind]
    if log is None:
        return cls(spark, lake, config, spec, query_id)
    return cls(spark, lake, config, spec, query_id, log)


# The engine class of every kind of spark_jobs.joins.kinds.KINDS.
JOBS: dict[str, type[JoinJob]] = {
    "table": TableJob,
    "stream-table": StreamTableJob,
    "stream-stream": StreamStreamJob,
    "fk": FkJob,
    "list": ListJob,
    "derive": DeriveJob,
}
