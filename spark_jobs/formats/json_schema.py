"""``json_schema``: Schema Registry framed JSON records (a JSON Schema per subject version).

The record after its frame is JSON text. Written records are checked against the writer schema
(``jsonschema``: the first violation, with its field's path); in Spark the reader schema's
``properties`` give the typed record (``left.address.city``): ``string``, ``integer`` (long),
``number`` (double), ``boolean``, ``array`` of ``items``, ``object`` with ``properties`` a struct
(without: a map of strings), ``$ref`` to ``#/definitions`` or ``#/$defs``; anything else stays JSON
text. A record that is not framed, not JSON, of another type than the schema says, without a
``required`` field or with a null its field's schema does not allow (absent and null told apart as
JSON Schema and ``lake produce`` do) is quarantined with that reason (Spark's own JSON reader, no
Python per record).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import UserError
from spark_jobs.formats import framing
from spark_jobs.formats.codec import DecodeError, jvm_function
from spark_jobs.formats.registered import RegisteredCodec

if TYPE_CHECKING:
    from pyspark.sql import Column

CORRUPT = "__corrupt"


class JsonSchemaCodec(RegisteredCodec):
    name = "json_schema"
    schema_type = "JSON"
    schema_suffixes = (".json",)

    def _parse(self, text: str) -> Any:
        from jsonschema import validators
        from jsonschema.exceptions import SchemaError

        try:
            schema = json.loads(text)
            validators.validator_for(schema).check_schema(schema)
        except (ValueError, SchemaError) as exc:
            raise UserError(f"{self.where}: not a JSON Schema: {str(exc).splitlines()[0]}") from None
        return validators.validator_for(schema)(schema)

    # --- Python ---------------------------------------------------------------------------------
    def encode(self, value: Any) -> bytes:
        validator = self._parsed(self.writer.text)
        error = next(iter(sorted(validator.iter_errors(value), key=lambda e: list(e.path))), None)
        if error is not None:
            field = ".".join(str(p) for p in error.path)
            where = f"field {field}" if field else "the record"
            raise ValueError(f"does not fit the JSON Schema of {self.subject}: {where}: {error.message}")
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        return framing.frame(self.writer.schema_id, text)

    def decode(self, raw: bytes) -> Any:
        schema_id, payload = self._split(raw)
        self._writer(schema_id)  # one of the subject's versions, else why not
        try:
            return json.loads(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"not JSON after the frame of schema id {schema_id}: {exc}") from None

    def spark_value(self, raw: bytes) -> Any:
        fields = [f for f in self._struct().fields if f.name != CORRUPT]
        value = self.decode(raw)
        if not isinstance(value, dict):
            raise DecodeError("not a JSON object")
        return {f.name: _shaped(value.get(f.name), f.dataType) for f in fields}

    # --- a published changelog ----------------------------------------------------------------
    @classmethod
    def derive_schema(cls, value_type: Any, topic: str, registered: str | None) -> str:
        """The struct's fields as properties, every one nullable."""
        return json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", **_json_schema(value_type)})

    @classmethod
    def row_encoder(cls, schema_id: int | None, text: str | None) -> Callable[[Column], Column]:
        """Spark's ``to_json`` behind the frame, null fields kept."""
        from pyspark.sql import functions as F

        assert schema_id is not None
        header = F.lit(bytearray(framing.frame(schema_id, b"")))
        return lambda row: F.concat(header, F.to_json(row, {"ignoreNullFields": "false"}).cast("binary"))

    # --- Spark: Spark's JSON reader, with the reader schema's types ------------------------------
    def _struct(self) -> Any:
        """The reader schema's Spark struct (with the corrupt-record column), made once per reader."""
        key = f"struct:{self.reader.text}"
        if key not in self._parsed_cache:
            self._parsed_cache[key] = self._typed()
        return self._parsed_cache[key]

    def fields(self) -> list[tuple[str, str]]:
        return [(f.name, f.dataType.simpleString()) for f in self._struct().fields if f.name != CORRUPT]

    def _typed(self) -> Any:
        from pyspark.sql.types import StringType, StructField, StructType

        schema = json.loads(self.reader.text)
        typed = spark_type(schema, schema)
        if not isinstance(typed, StructType):
            raise UserError(f"{self.where}: the JSON Schema of {self.subject} must describe an object")
        return StructType([*typed.fields, StructField(CORRUPT, StringType())])

    def _parsed_column(self, raw: Column) -> Column:
        from pyspark.sql import functions as F

        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        return F.from_json(
            F.substring(raw, framing.HEADER + 1, 2**31 - 1).cast("string"), self._struct(), options
        )

    def _decoder(self, jvm: Any) -> tuple[Any, Any]:  # noqa: ARG002 - Spark's JSON reader decodes
        raise NotImplementedError

    def column(self, raw: Column) -> Column:
        from pyspark.sql import functions as F

        parsed = self._parsed_column(raw)
        names = [f.name for f in self._struct().fields if f.name != CORRUPT]
        value = F.struct(*[parsed.getField(n).alias(n) for n in names])
        return F.when(self.problem(raw).isNull() & raw.isNotNull(), value)

    def _member(self, raw: Column) -> Column:
        """Why a record is not a framed record of one of the subject's versions (the JVM's
        ``SchemaMember``: the frame, then the schema id, asked of the registry when not known)."""
        known = json.dumps(sorted(self.writers))
        foreign = json.dumps({str(i): reason for i, reason in sorted(self.foreign.items())})
        registry = self.registry.for_executors

        def member(jvm: Any) -> tuple[Any, Any]:
            check = jvm.lake.formats.SchemaMember(self.subject, "JSON", known, foreign, registry)
            return check, jvm.org.apache.spark.sql.types.DataTypes.StringType

        return jvm_function(member, raw)

    def problem(self, raw: Column) -> Column:
        from pyspark.sql import functions as F

        schema_id = framing.schema_id(raw)
        member = self._member(raw)
        reason = F.when(member.isNotNull(), member)
        parsed = self._parsed_column(raw)
        reason = reason.when(
            parsed.isNull() | parsed.getField(CORRUPT).isNotNull(),
            F.concat(F.lit("not JSON of the schema of "), F.lit(self.subject), F.lit(" (schema id "),
                     schema_id.cast("string"), F.lit("): a field of another type, or not JSON")),
        )  # fmt: skip
        text = F.substring(raw, framing.HEADER + 1, 2**31 - 1).cast("string")
        root = json.loads(self.reader.text)
        for path, field, check in presence_rules(root, root):
            where = ".".join((*path, field))
            inside = text if not path else F.get_json_object(text, "$" + "".join(f"['{p}']" for p in path))
            present = F.array_contains(F.json_object_keys(inside), field)
            value = parsed
            for name in (*path, field):
                value = value.getField(name)
            if check == "required":
                reason = reason.when(
                    inside.isNotNull() & ~present, F.lit(f"required field {where} is missing")
                )
            else:
                reason = reason.when(
                    present & value.isNull(), F.lit(f"field {where} is null, which its schema does not allow")
                )
        return reason


Rule = tuple[tuple[str, ...], str, str]  # (path to the object, field, "required" | "not null")


def presence_rules(schema: Any, root: Any, path: tuple[str, ...] = ()) -> list[Rule]:
    """What Spark's JSON reader cannot tell and JSON Schema does: a field that is absent from one that
    is present and null. ``(path, field, "required")`` for a required field (absent: not valid, null:
    valid when its schema allows null); ``(path, field, "not null")`` for a field whose schema does
    not allow null (absent: valid unless required). Objects nested in objects too (``path`` the
    fields leading to it); not inside arrays, whose items Spark's reader checks by type only."""
    schema = _resolved(schema, root)
    rules: list[Rule] = []
    properties = schema.get("properties") or {}
    if any("'" in name or "]" in name for name in (*path, *properties)):
        return rules  # not expressible as a JSON path of Spark's get_json_object
    rules += [(path, name, "required") for name in schema.get("required", []) if isinstance(name, str)]
    for name, sub in properties.items():
        if not _allows_null(sub, root):
            rules.append((path, name, "not null"))
        if _is_record(sub, root):
            rules += presence_rules(sub, root, (*path, name))
    return rules


def _resolved(schema: Any, root: Any) -> Any:
    """``schema`` with a ``$ref`` to ``#/definitions`` or ``#/$defs`` followed."""
    for _ in range(32):  # a reference to a reference ...; a cycle stops here
        ref = schema.get("$ref") if isinstance(schema, dict) else None
        if not isinstance(ref, str):
            return schema
        for prefix in ("#/definitions/", "#/$defs/"):
            if ref.startswith(prefix):
                schema = root.get(prefix[2:-1], {}).get(ref[len(prefix) :], {})
                break
        else:
            return {}
    return schema


def _allows_null(schema: Any, root: Any) -> bool:
    """Whether a JSON null is valid for ``schema``: a type that lists null, no type at all, an enum
    or const of null, or an ``anyOf`` / ``oneOf`` member that allows it."""
    schema = _resolved(schema, root)
    if not isinstance(schema, dict):
        return True  # true / {}: anything
    if "const" in schema:
        return schema["const"] is None
    if "enum" in schema:
        return None in schema["enum"]
    choices = [*schema.get("anyOf", []), *schema.get("oneOf", [])]
    if choices and not any(_allows_null(choice, root) for choice in choices):
        return False
    kind = schema.get("type")
    if kind is None:
        return True
    return "null" in kind if isinstance(kind, list) else kind == "null"


def _is_record(schema: Any, root: Any) -> bool:
    """Whether ``schema`` gives a struct in Spark (an object with properties, see :func:`spark_type`)."""
    from pyspark.sql.types import StructType

    return isinstance(spark_type(schema, root), StructType)


def spark_type(schema: Any, root: Any) -> Any:
    """The Spark type of a JSON Schema's values (see the module doc)."""
    from pyspark.sql.types import (
        ArrayType,
        BooleanType,
        DoubleType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    if not isinstance(schema, dict):
        return StringType()
    if "$ref" in schema:
        ref = schema["$ref"]
        for prefix in ("#/definitions/", "#/$defs/"):
            if ref.startswith(prefix):
                return spark_type(root.get(prefix[2:-1], {}).get(ref[len(prefix) :], {}), root)
        return StringType()
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        if not properties:
            return MapType(StringType(), StringType())
        return StructType([StructField(name, spark_type(sub, root)) for name, sub in properties.items()])
    if kind == "array":
        return ArrayType(spark_type(schema.get("items", {}), root))
    return {"integer": LongType(), "number": DoubleType(), "boolean": BooleanType()}.get(
        kind or "", StringType()
    )


def _shaped(value: Any, kind: Any) -> Any:
    """A JSON value as Spark's JSON reader gives it in the Spark type ``kind`` (see
    :func:`spark_type`): a string field holds any other JSON as its text; :class:`DecodeError` for a
    value the reader refuses (its record is quarantined)."""
    from pyspark.sql.types import ArrayType, BooleanType, DoubleType, LongType, MapType, StructType

    if value is None:
        return None
    if isinstance(kind, StructType):
        if not isinstance(value, dict):
            raise DecodeError("not a JSON object")
        return {f.name: _shaped(value.get(f.name), f.dataType) for f in kind.fields}
    if isinstance(kind, MapType):
        if not isinstance(value, dict):
            raise DecodeError("not a JSON object")
        return {k: _shaped(v, kind.valueType) for k, v in value.items()}
    if isinstance(kind, ArrayType):
        if not isinstance(value, list):
            raise DecodeError("not a JSON array")
        return [_shaped(v, kind.elementType) for v in value]
    if isinstance(kind, LongType):
        if not isinstance(value, int) or isinstance(value, bool):
            raise DecodeError("not an integer")
        return value
    if isinstance(kind, DoubleType):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise DecodeError("not a number")
        return float(value)
    if isinstance(kind, BooleanType):
        if not isinstance(value, bool):
            raise DecodeError("not a boolean")
        return value
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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
