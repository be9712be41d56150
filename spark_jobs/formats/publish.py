"""A published changelog in a Schema Registry format: its schema derived from the result's Spark
type, and the Spark expression that writes a row as a framed record (on the executors: Spark's own
``to_avro`` and ``to_json``, no Python per record)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_jobs.formats import framing

if TYPE_CHECKING:
    from pyspark.sql import Column


def derived_schema(fmt: str, value_type: Any, topic: str) -> str:
    """The schema text of ``fmt`` for values of the Spark struct type ``value_type``."""
    if fmt == "avro":
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        assert spark is not None
        jvm: Any = spark._jvm
        jtype = jvm.org.apache.spark.sql.types.DataType.fromJson(value_type.json())
        name = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", topic) if part) or "Changelog"
        schema = jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(
            jtype, False, name, "lake.changelog"
        )
        return str(schema.toString())
    if fmt == "json_schema":
        return json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", **_json_schema(value_type)})
    raise ValueError(f"a changelog cannot be published as {fmt}")


def encoder(fmt: str, schema_id: int, text: str) -> Callable[[Column], Column]:
    """The row's struct as a framed record of schema ``schema_id``."""
    from pyspark.sql import functions as F

    header = F.lit(bytearray(framing.frame(schema_id, b"")))
    if fmt == "avro":
        from pyspark.sql.avro.functions import to_avro

        return lambda row: F.concat(header, to_avro(row, text))
    return lambda row: F.concat(header, F.to_json(row, {"ignoreNullFields": "false"}).cast("binary"))


def _json_schema(data_type: Any) -> dict[str, Any]:
    from pyspark.sql import types as T

    if isinstance(data_type, T.StructType):
        return {
            "type": ["object", "null"],
            "properties": {f.name: _json_schema(f.dataType) for f in data_type.fields},
        }
    if isinstance(data_type, T.ArrayType):
        return {"type": ["array", "null"], "items": _json_schema(data_type.elementType)}
    if isinstance(data_type, T.MapType):
        return {"type": ["object", "null"], "additionalProperties": _json_schema(data_type.valueType)}
    if isinstance(data_type, (T.IntegerType, T.LongType, T.ShortType, T.ByteType)):
        return {"type": ["integer", "null"]}
    if isinstance(data_type, (T.FloatType, T.DoubleType, T.DecimalType)):
        return {"type": ["number", "null"]}
    if isinstance(data_type, T.BooleanType):
        return {"type": ["boolean", "null"]}
    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        return {"type": ["string", "null"], "format": "date-time"}
    if isinstance(data_type, T.DateType):
        return {"type": ["string", "null"], "format": "date"}
    return {"type": ["string", "null"]}  # text, and binary (base64, as Spark's to_json writes it)
