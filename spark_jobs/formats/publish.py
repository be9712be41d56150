"""A published changelog in a Schema Registry format: its schema derived from the result's Spark
type, and the Spark expression that writes a row as a framed record (on the executors: Spark's own
``to_avro`` and ``to_json``, no Python per record)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_jobs.formats import framing
from spark_jobs.formats.codec import jvm_function

if TYPE_CHECKING:
    from pyspark.sql import Column


def derived_schema(fmt: str, value_type: Any, topic: str, registered: str | None = None) -> str:
    """The schema text of ``fmt`` for values of the Spark struct type ``value_type``; ``registered``:
    the subject's latest schema, whose Protobuf field numbers the new one keeps."""
    if fmt == "avro":
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        assert spark is not None
        jvm: Any = spark._jvm
        jtype = jvm.org.apache.spark.sql.types.DataType.fromJson(value_type.json())
        schema = jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(
            jtype, False, _message_name(topic), "lake.changelog"
        )
        return json.dumps(_null_defaults(json.loads(str(schema.toString()))))
    if fmt == "json_schema":
        return json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", **_json_schema(value_type)})
    if fmt == "protobuf":
        return _proto(value_type, _message_name(topic), _numbering(registered))
    raise ValueError(f"a changelog cannot be published as {fmt}")


def _null_defaults(schema: Any) -> Any:
    """Every nullable field of an Avro schema with ``null`` first and a null default: a column added
    to the ``select`` later is then a change the registry's BACKWARD rule accepts (a reader of the
    new schema reads old records), as one removed is."""
    if isinstance(schema, list):
        return [_null_defaults(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if out.get("type") == "record":
        fields = []
        for field in out["fields"]:
            kind = _null_defaults(field["type"])
            if isinstance(kind, list) and "null" in kind:
                kind = ["null", *[k for k in kind if k != "null"]]
                field = {**field, "type": kind, "default": None}
            else:
                field = {**field, "type": kind}
            fields.append(field)
        out["fields"] = fields
    elif out.get("type") == "array":
        out["items"] = _null_defaults(out["items"])
    elif out.get("type") == "map":
        out["values"] = _null_defaults(out["values"])
    return out


def encoder(fmt: str, schema_id: int, text: str) -> Callable[[Column], Column]:
    """The row's struct as a framed record of schema ``schema_id``."""
    from pyspark.sql import functions as F

    header = F.lit(bytearray(framing.frame(schema_id, b"")))
    if fmt == "avro":
        from pyspark.sql.avro.functions import to_avro

        return lambda row: F.concat(header, to_avro(row, text))
    if fmt == "protobuf":
        return _protobuf_encoder(schema_id, text)
    return lambda row: F.concat(header, F.to_json(row, {"ignoreNullFields": "false"}).cast("binary"))


def _message_name(topic: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", topic) if part) or "Changelog"


def _protobuf_encoder(schema_id: int, text: str) -> Callable[[Column], Column]:
    """Rows as Protobuf messages of the derived schema, by the JVM's ``ProtobufEncode``."""
    import base64

    from spark_jobs.formats.protobuf import compile_proto

    compiled = compile_proto(text, "the changelog's schema")
    descriptors = base64.b64encode(compiled.descriptor_set).decode()

    def encoder(jvm: Any) -> tuple[Any, Any]:
        udf = jvm.lake.formats.ProtobufEncode(descriptors, compiled.message, schema_id)
        return udf, jvm.org.apache.spark.sql.types.DataTypes.BinaryType

    return lambda row: jvm_function(encoder, row)


@dataclass
class Numbering:
    """A message's field numbers as a registered schema has them: ``fields`` by name, the numbers
    already ``reserved``, and its nested messages' by name. A field keeps its number for its life;
    a new one gets the next number never used; a removed one's number is reserved."""

    fields: dict[str, int] = field(default_factory=dict)
    reserved: set[int] = field(default_factory=set)
    nested: dict[str, Numbering] = field(default_factory=dict)

    def assign(self, names: list[str]) -> tuple[list[int], list[int]]:
        """The numbers of ``names`` (in order), and the numbers to reserve."""
        used = set(self.fields.values()) | self.reserved
        numbers = []
        for name in names:
            number = self.fields.get(name)
            if number is None:
                number = max(used, default=0) + 1
                used.add(number)
            numbers.append(number)
        gone = {n for name, n in self.fields.items() if name not in names}
        return numbers, sorted(self.reserved | gone)


def _numbering(registered: str | None) -> Numbering:
    """The field numbers of the registered schema's first message (none: a first version)."""
    if not registered:
        return Numbering()
    from spark_jobs.formats.protobuf import compile_proto

    compiled = compile_proto(registered, "the changelog's registered schema")
    own = compiled.file_proto

    def of(message: Any) -> Numbering:
        reserved = {n for r in message.reserved_range for n in range(r.start, r.end)}
        return Numbering(
            {f.name: f.number for f in message.field},
            reserved,
            {nested.name: of(nested) for nested in message.nested_type},
        )

    return of(own.message_type[0])


def _proto(value_type: Any, name: str, numbering: Numbering | None = None) -> str:
    """A proto3 schema of one message (and its nested ones) for rows of ``value_type``: the fields in
    the row's order, numbered as ``numbering`` (the registered version's) has them, new ones with the
    next unused number, removed ones reserved; scalars ``optional`` (a null is an unset field)."""
    imports: set[str] = set()
    body = _proto_message(value_type, name, "", imports, numbering or Numbering())
    head = ['syntax = "proto3";', "", "package lake.changelog;", ""]
    head += [f'import "{i}";' for i in sorted(imports)] + ([""] if imports else [])
    return "\n".join([*head, *body, ""])


def _proto_message(struct: Any, name: str, indent: str, imports: set[str], numbering: Numbering) -> list[str]:
    out = [f"{indent}message {name} {{"]
    names = [_proto_field(f.name) for f in struct.fields]
    numbers, reserved = numbering.assign(names)
    for field_, field_name, number in zip(struct.fields, names, numbers, strict=True):
        kind, nested = _proto_type(field_.dataType, field_.name, indent + "  ", imports, numbering)
        out += nested
        scalar = not (nested or kind.startswith(("repeated ", "map<", "google.protobuf.")))
        label = "optional " if scalar else ""  # a message field has presence of its own
        out.append(f"{indent}  {label}{kind} {field_name} = {number};")
    if reserved:
        out.append(f"{indent}  reserved {', '.join(str(n) for n in reserved)};")
    return [*out, f"{indent}}}"]


def _proto_type(
    data_type: Any, field: str, indent: str, imports: set[str], numbering: Numbering
) -> tuple[str, list[str]]:
    """A field's Protobuf type (with ``repeated`` / ``map<>``), and the nested messages it needs
    (numbered as ``numbering``, the enclosing message's, has its nested message of that name)."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.StructType):
        message = _message_name(field)
        inner = numbering.nested.get(message, Numbering())
        return message, _proto_message(data_type, message, indent, imports, inner)
    if isinstance(data_type, T.ArrayType):
        inner_type, nested = _proto_type(
            data_type.elementType, f"{field}_element", indent, imports, numbering
        )
        return f"repeated {inner_type}", nested
    if isinstance(data_type, T.MapType):
        value, nested = _proto_type(data_type.valueType, f"{field}_value", indent, imports, numbering)
        return f"map<string, {value}>", nested
    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        imports.add("google/protobuf/timestamp.proto")
        return "google.protobuf.Timestamp", []
    scalars = [
        ((T.LongType,), "int64"),
        ((T.IntegerType, T.ShortType, T.ByteType), "int32"),
        ((T.DoubleType,), "double"),
        ((T.FloatType,), "float"),
        ((T.BooleanType,), "bool"),
        ((T.BinaryType,), "bytes"),
    ]
    for types, name in scalars:
        if isinstance(data_type, types):
            return name, []
    return "string", []  # text, and decimals and dates as their exact text


def _proto_field(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


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
