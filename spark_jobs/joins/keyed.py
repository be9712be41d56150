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
from spark_jobs.joins import engine
from spark_jobs.joins.engine import (
    BatchMetrics,
    JoinJob,
    Projection,
    StreamStreamJob,
    StreamTableJob,
    TableJob,
    prepare,
    value_column,
)
from spark_jobs.lake import conform
from spark_jobs.session import arrow_frame

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
    size = size or engine.CHUNK_KEYS
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
class FkJob(KeyedJob, TableJob):
    """fk: the KIP-213 shape in Spark's state store (``lake.joins.FkJoin``, Java): the left side by its
    key, subscriptions routed to the foreign key, the right side and its subscribers by foreign key; a
    right change is answered for exactly the left keys that point at it."""

    operator = "FkJoin"


class DeriveJob(KeyedJob, TableJob):
    """derive: the master records by key, each holding its derived key; per derived key its holders
    (``lake.joins.DeriveJoin``, Java), and the newest of them is the derived row."""

    operator = "DeriveJoin"
    row_columns = ["key", "master_key", "left_value", "__lp", "__lo"]
    tombstones_follow_left = False  # its result is keyed by the derived key, not the left topic's


# --- list ---------------------------------------------------------------------------------------
class ListJob(KeyedJob, TableJob):
    """list: per left key its list's ids subscribe to the right side (``lake.joins.ListJoin``, Java):
    a right change reaches exactly the rows whose list holds its id; each row keeps, per id, the right
    value it was joined with, so a batch looks up only added ids and ids whose right record changed."""

    operator = "ListJoin"
    row_columns = ["key", "left_value", "__lp", "__lo", "items", "ids", "right_values"]

    def _result_projection(self) -> Any:
        return ListProjection(self.spark, self.config, self.spec)

    def _desired(
        self, live: pa.Table, txn: tuple[str, int], at: datetime, m: BatchMetrics
    ) -> tuple[pa.Table, pa.Array]:
        return self._project(live.select(self.row_columns[:4]), txn, at, m, _elements(live))


def _elements(rows: pa.Table) -> pa.Table:
    """One row per list position of ``rows`` (with ``items``, ``ids``, ``right_values``): key, pos,
    item, id, right_value."""
    items = rows["items"].combine_chunks()
    parents = pc.list_parent_indices(items)
    offsets = items.offsets.to_numpy()
    starts = offsets[parents.to_numpy()] if len(parents) else np.array([], dtype=np.int64)
    pos = offsets[0] + np.arange(len(parents), dtype=np.int64) - starts  # flat index -> list position
    return pa.table(
        {
            "key": rows["key"].combine_chunks().take(parents),
            "pos": pa.array(pos, pa.int64()),
            "item": pc.list_flatten(items),
            "id": pc.list_flatten(rows["ids"].combine_chunks()),
            "right_value": pc.list_flatten(rows["right_values"].combine_chunks()),
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
