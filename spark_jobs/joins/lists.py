"""list: the left value holds a list of ids into the right table (docs/joins.md, "Foreign-key, list
and derive joins")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.utils import AnalysisException

from spark_jobs.config import JoinSpec
from spark_jobs.errors import UserError, spark_error
from spark_jobs.joins.batch import latest, left_sources, live, right_versions, with_since
from spark_jobs.joins.engine import BatchMetrics, SideCodecs
from spark_jobs.joins.keyed import KeyedJob
from spark_jobs.joins.state_store import StateStoreJob
from spark_jobs.seams.delta import conform
from spark_jobs.seams.session import arrow_frame


# --- the list join's projection --------------------------------------------------------------------
class ListProjection:
    """A list join's result: ``key``, ``timestamp``, where it came from (``left_partition``,
    ``left_offset``, and ``element_sources``: per list position its id and its right record's
    partition and offset, null when unmatched), ``select`` over ``left``, and the enriched list: per
    element ``id``, ``matched`` and ``elements`` over ``element`` (the element: a JSON object's
    fields, or the scalar as text) and ``right``; inner joins leave unmatched elements out. Lists keep
    their order."""

    def __init__(self, spark: SparkSession, codecs: SideCodecs, spec: JoinSpec):
        self.spark, self.spec = spark, spec
        self.codecs = codecs.values
        rows = pa.schema(
            [
                ("key", pa.binary()),
                ("timestamp", pa.timestamp("us", tz="UTC")),
                ("left_value", pa.binary()),
                ("left_partition", pa.int32()),
                ("left_offset", pa.int64()),
            ]
        )
        elements = pa.schema(
            [
                ("key", pa.binary()),
                ("pos", pa.int64()),
                ("item", pa.string()),
                ("id", pa.binary()),
                ("right_value", pa.binary()),
                ("right_partition", pa.int32()),
                ("right_offset", pa.int64()),
            ]
        )
        self.row_schema, self.element_schema = rows, elements
        frame = self._checked(
            spark.createDataFrame(rows.empty_table()), spark.createDataFrame(elements.empty_table())
        )
        schema = to_arrow_schema(frame.schema, timezone="UTC")
        self.output_schema = pa.schema([f.with_nullable(True) for f in schema])  # deletes carry nulls

    def _value(self, side: str, column: str) -> Column:
        return self.codecs[side].column(F.col(column))

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
            F.struct(
                F.col("id").cast("string").alias("id"),
                F.col("right_partition").alias("partition"),
                F.col("right_offset").alias("offset"),
            ).alias("__source"),
        ).selectExpr("key", "pos", "id", "matched", "__source", *exprs)

    def frame(self, rows: DataFrame, elements: DataFrame) -> DataFrame:
        """``rows`` (key, timestamp, left_value, left_partition, left_offset) and their ``elements``
        (key, pos, item, id, right_value, right_partition, right_offset: null when the id has no live
        right record) -> the result's columns."""
        enriched = self._enriched(elements, self._element_exprs())
        fields = ["id", "matched", *self.spec.elements]
        entry = F.struct(
            F.col("pos"),
            F.struct(*[F.col(f"`{c}`") for c in fields]).alias("e"),
            F.col("__source").alias("s"),
        )
        lists = enriched.groupBy("key").agg(F.sort_array(F.collect_list(entry)).alias("__entries"))
        joined = rows.join(lists, "key", "left")
        kept: Any = "__entries"
        if self.spec.type == "inner":  # unmatched elements left out (their sources stay)
            kept = F.filter("__entries", lambda x: x["e"]["matched"])
        framed = joined.select(
            "key",
            "timestamp",
            "left_partition",
            "left_offset",
            self._value("left", "left_value").alias("left"),
            F.transform(kept, lambda x: x["e"]).alias("__items"),
            F.transform("__entries", lambda x: x["s"]).alias("__sources"),
        )
        element_type = framed.schema["__items"].dataType
        source_type = framed.schema["__sources"].dataType
        meta = ["key", "timestamp", "left_partition", "left_offset"]
        out = framed.selectExpr(
            *meta,
            "__sources",
            *[f"({expr}) AS `{col}`" for col, expr in self.spec.select.items()],
            "__items",
        )
        return out.select(
            *meta,
            F.coalesce(F.col("__sources"), F.expr("array()").cast(source_type)).alias("element_sources"),
            *[F.col(f"`{c}`") for c in self.spec.select],
            F.coalesce(F.col("__items"), F.expr("array()").cast(element_type)).alias(self.spec.list_as),
        )

    def apply(self, rows: pa.Table, elements: pa.Table) -> pa.Table:
        if rows.num_rows == 0:
            return self.output_schema.empty_table()
        frame = self.frame(
            arrow_frame(
                self.spark, conform(rows.select(self.row_schema.names), self.row_schema, "list rows")
            ),
            arrow_frame(self.spark, conform(elements, self.element_schema, "list elements")),
        )
        return conform(frame.toArrow(), self.output_schema, f"join {self.spec.name}")


class ListJob(KeyedJob, StateStoreJob):
    """list: per left key its list's ids subscribe to the right side (``lake.joins.ListJoin``, Java):
    a right change reaches exactly the rows whose list holds its id; each row keeps, per id, the right
    value it was joined with, so a batch looks up only added ids and ids whose right record changed."""

    operator = "ListJoin"
    row_columns = [
        "key",
        "timestamp",
        "left_value",
        "left_partition",
        "left_offset",
        "items",
        "ids",
        "right_values",
        "right_partitions",
        "right_offsets",
    ]

    def _result_projection(self) -> Any:
        return ListProjection(self.spark, self.codecs, self.spec)

    def result_frame(self, keys: DataFrame) -> DataFrame:
        entries = F.posexplode(
            F.arrays_zip("items", "ids", "right_values", "right_partitions", "right_offsets")
        )
        elements = keys.select("key", entries).select(
            "key",
            F.col("pos").cast("long").alias("pos"),
            F.col("col.items").alias("item"),
            F.col("col.ids").alias("id"),
            F.col("col.right_values").alias("right_value"),
            F.col("col.right_partitions").alias("right_partition"),
            F.col("col.right_offsets").alias("right_offset"),
        )
        return self.projection.frame(keys.select(*self.row_columns[:5]), elements)

    def _desired(
        self, live: pa.Table, txn: tuple[str, int], at: datetime, m: BatchMetrics
    ) -> tuple[pa.Table, pa.Array]:
        return self._project(live.select(self.row_columns[:5]), txn, at, m, _elements(live))

    @staticmethod
    def expected(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame, codecs):
        """list: each live left record with every element of its list and the right value it names."""
        lhs = live(with_since(left))
        elements = lhs.select("key", F.posexplode(F.arrays_zip("items", "ids")).alias("pos", "e")).select(
            "key", "pos", F.col("e.items").alias("item"), F.col("e.ids").alias("id")
        )
        matched = right_versions(right).filter(F.col("right_value").isNotNull()).drop("right_since")
        elements = elements.join(matched.withColumnRenamed("key", "id"), "id", "left")
        # the row's timestamp: the latest of the left value's time and its ids' right records' (a
        # right tombstone's too: it made the element unmatched)
        rights = latest(with_since(right)).select(F.col("key").alias("id"), F.col("since").alias("__rs"))
        times = (
            lhs.select("key", "since", F.explode_outer(F.array_distinct("ids")).alias("id"))
            .join(rights, "id", "left")
            .groupBy("key")
            .agg(F.greatest(F.max("since"), F.max("__rs")).alias("__ts"))
        )
        rows = lhs.join(times, "key").select(
            "key", F.col("__ts").alias("timestamp"), F.col("value").alias("left_value"), *left_sources(lhs)
        )
        projection = ListProjection(spark, codecs, spec)
        return rows, lambda some: projection.frame(some, elements)


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
            "right_partition": pc.list_flatten(rows["right_partitions"].combine_chunks()),
            "right_offset": pc.list_flatten(rows["right_offsets"].combine_chunks()),
        }
    )
