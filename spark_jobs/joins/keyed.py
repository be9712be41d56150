"""What the kinds that follow a key inside the left value share (fk, list, derive;
docs/joins.md, "Foreign-key, list and derive joins"):
the left records' foreign key, derived key or list, computed by Spark in the join's plan
(:class:`LeftKeys`), ahead of the kind's state operator. Their state is in Spark's state store
(``state_store``), and the oracle (``oracle.py``) checks each result against a batch join of the
snapshots."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType
from pyspark.sql.utils import AnalysisException

from spark_jobs.config import FIELD_PATH_RE, JoinSpec
from spark_jobs.errors import UserError, spark_error
from spark_jobs.joins.engine import JoinJob, Projection, SideCodecs, prepare


# --- the left records' keys, by Spark ------------------------------------------------------------
class LeftKeys:
    """Adds to a batch the left records' foreign key (fk), derived key (derive) or items and ids (list),
    and the quarantine reason of a list join's left record without a list."""

    def __init__(self, spark: SparkSession, codecs: SideCodecs, spec: JoinSpec):
        self.spec = spec
        self.codec = codecs.values["left"]
        self.setting = str(spec.join_kind.keyed_by)
        self.expr = spec.by or ""
        # a bare field path (``merchant_id``, ``address.id``): read from a json value's text, or from
        # the decoded record of a registry format (``left.merchant_id``)
        path = bool(FIELD_PATH_RE.match(self.expr)) and not self.expr.startswith("left.")
        self.field = self.codec.field(self.expr) if path else None
        empty = spark.createDataFrame([], "side string, key binary, value binary, reason string")
        try:
            self.as_text = self._raw_type(empty) == StringType()
            _ = self.add(empty).schema  # analysis happens here
        except AnalysisException as exc:
            raise UserError(f"{spec.where['__' + self.setting]}: {spark_error(exc)}") from None

    def _left(self) -> Column:
        return self.codec.column(F.col("value"))

    def _raw(self) -> Column:
        return self.field if self.field is not None else F.expr(self.expr)

    def _raw_type(self, frame: DataFrame) -> Any:
        data_type = frame.withColumn("left", self._left()).select(self._raw()).schema[0].dataType
        if self.spec.join_kind.has_list and not isinstance(data_type, (StringType, ArrayType)):
            raise UserError(
                f"{self.spec.where['__list']}: must give a list (or JSON text of one), "
                f"not {data_type.simpleString()}"
            )
        return data_type

    def add(self, frame: DataFrame) -> DataFrame:
        is_left = (F.col("side") == "left") & F.col("value").isNotNull()
        df = frame.withColumn("left", self._left())
        raw = self._raw()
        if not self.spec.join_kind.has_list:
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


class KeyedJob(JoinJob):
    """The kinds whose left records carry a key (or list) computed from their value."""

    def _prepared(self, frame: DataFrame) -> DataFrame:
        return self.left_keys.add(prepare(frame, self.codecs))

    def _projection(self) -> Any:
        self.left_keys = LeftKeys(self.spark, self.codecs, self.spec)  # checked before the projection
        return self._result_projection()

    def _result_projection(self) -> Any:
        return Projection(self.spark, self.codecs, self.spec)
