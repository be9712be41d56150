"""``avro``: Schema Registry framed Avro records.

Each record names its writer schema by id; it is read into the topic's reader schema (the subject's
latest version when the command or job started), so records written with older compatible versions
decode too. In Spark the records are decoded on the executors by the product's JVM function
``lake.formats.AvroDecode`` (Avro's Java library, Spark's Avro types), which gives every record either
its value or the reason it cannot be decoded: never a row of nulls that looks like data. In Python
(``lake produce``, ``lake consume``, backfills, publishing) fastavro reads and writes them.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from uuid import UUID

import fastavro

from spark_jobs.errors import UserError
from spark_jobs.formats import framing
from spark_jobs.formats.codec import DecodeError, message_name
from spark_jobs.formats.logical import OPTIONS, Float32
from spark_jobs.formats.registered import RegisteredCodec

if TYPE_CHECKING:
    from pyspark.sql import Column


class AvroCodec(RegisteredCodec):
    name = "avro"
    schema_type = "AVRO"
    schema_suffixes = (".avsc",)

    def fields(self) -> list[tuple[str, str]]:
        schema = json.loads(self.reader.text)
        if not isinstance(schema, dict) or schema.get("type") != "record":
            return []
        return [(f["name"], _type_name(f["type"])) for f in schema.get("fields", [])]

    def _parse(self, text: str) -> Any:
        try:
            return fastavro.parse_schema(json.loads(text))
        except (ValueError, fastavro.schema.SchemaParseException) as exc:
            raise UserError(f"{self.where}: not an Avro schema: {exc}") from None

    # --- Python ---------------------------------------------------------------------------------
    def encode(self, value: Any) -> bytes:
        schema = self._parsed(self.writer.text)
        problems = _misfits(value, schema)
        if problems:
            raise ValueError(f"does not fit the Avro schema of {self.subject}: {problems[0]}")
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, schema, value)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise ValueError(f"does not fit the Avro schema of {self.subject}: {exc}") from None
        return framing.frame(self.writer.schema_id, out.getvalue())

    def encode_text(self, text: bytes) -> bytes:
        """A line's JSON as a record; for a string schema the line's text itself is the string too
        (``user_1`` as well as ``"user_1"``)."""
        if self._is_text(self.writer.text):
            try:
                value = json.loads(text)
            except (ValueError, UnicodeDecodeError):
                value = text.decode("utf-8", "replace")
            return self.encode(value if isinstance(value, str) else text.decode("utf-8", "replace"))
        return super().encode_text(text)

    @staticmethod
    def _is_text(schema: str) -> bool:
        parsed = json.loads(schema)
        return parsed == "string" or (isinstance(parsed, dict) and parsed.get("type") == "string")

    def decode(self, raw: bytes) -> Any:
        schema_id, payload = self._split(raw)
        writer = self._writer(schema_id)
        body = io.BytesIO(payload)
        try:
            value = fastavro.schemaless_reader(body, writer, self._parsed(self.reader.text))
        except Exception as exc:  # fastavro raises what the bytes make it raise
            raise DecodeError(
                f"not an Avro record of schema id {schema_id} ({self.subject}): {exc}"
            ) from None
        if body.read(1):
            raise DecodeError(
                f"bytes left after the Avro record of schema id {schema_id} ({self.subject}): "
                "written with another schema?"
            )
        return value

    def spark_value(self, raw: bytes) -> Any:
        reader = self._parsed(self.reader.text)
        return _shaped(
            self.decode(raw), reader, reader.get("__named_schemas", {}) if isinstance(reader, dict) else {}
        )

    # --- a published changelog ----------------------------------------------------------------
    @classmethod
    def derive_schema(cls, value_type: Any, topic: str, registered: str | None) -> str:
        """Spark's own Avro type mapping of the row, every nullable field with a null default."""
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        assert spark is not None
        jvm: Any = spark._jvm
        jtype = jvm.org.apache.spark.sql.types.DataType.fromJson(value_type.json())
        schema = jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(
            jtype, False, message_name(topic), "lake.changelog"
        )
        return json.dumps(_null_defaults(json.loads(str(schema.toString()))))

    @classmethod
    def row_encoder(cls, schema_id: int | None, text: str | None) -> Callable[[Column], Column]:
        """Spark's ``to_avro`` behind the frame."""
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import to_avro

        assert schema_id is not None and text is not None
        header = F.lit(bytearray(framing.frame(schema_id, b"")))
        return lambda row: F.concat(header, to_avro(row, text))

    # --- Spark ----------------------------------------------------------------------------------
    def _decoder(self, jvm: Any) -> tuple[Any, Any]:
        """The JVM decoder of the schema ids known now, and its return type."""
        writers = json.dumps({str(i): text for i, text in sorted(self.writers.items())})
        foreign = json.dumps({str(i): reason for i, reason in sorted(self.foreign.items())})
        registry = self.registry.for_executors
        decoder = jvm.lake.formats.AvroDecode(self.subject, self.reader.text, writers, foreign, registry)
        return decoder, jvm.lake.formats.AvroDecode.returnType(self.reader.text)

    def key_bytes(self, raw: Column) -> Column:
        """A framed key as the text of its logical value (a string key's own UTF-8 bytes, so it
        equals the same key written plain), a composite key as its JSON."""
        from pyspark.sql import functions as F

        value = self.column(raw)
        text = value.cast("string") if self._is_text(self.reader.text) else F.to_json(value, OPTIONS)
        return F.when(raw.isNull(), F.lit(None)).otherwise(F.coalesce(text.cast("binary"), raw))


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


def _shaped(value: Any, schema: Any, named: dict) -> Any:
    """A value fastavro read with ``schema`` as the JVM's ``AvroTypes.toSpark`` gives it: a record
    every field in order, a union of several types its ``member<i>`` struct, an Avro ``float`` a
    :class:`Float32`, the time and local-timestamp logical types their numbers."""
    if value is None:
        return None
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            return _shaped(value, branches[0], named)
        chosen = next(i for i, b in enumerate(branches) if _fits(value, b, named))
        return {
            f"member{i}": _shaped(value, b, named) if i == chosen else None for i, b in enumerate(branches)
        }
    kind = schema["type"] if isinstance(schema, dict) else schema
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind in named):
        return _shaped(value, kind, named)
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    if kind == "record":
        return {f["name"]: _shaped(value.get(f["name"]), f["type"], named) for f in schema["fields"]}
    if kind == "array":
        return [_shaped(item, schema["items"], named) for item in value]
    if kind == "map":
        return {str(k): _shaped(item, schema["values"], named) for k, item in value.items()}
    if kind in ("enum", "string"):
        return str(value)
    if kind == "float":
        return Float32(value)
    if kind == "double":
        return float(value)
    if isinstance(value, time):  # time-millis, time-micros: Spark has their numbers
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond
        return micros // 1000 if logical == "time-millis" else micros
    if isinstance(value, datetime) and logical not in ("timestamp-millis", "timestamp-micros"):
        micros = (value.replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
        return micros // 1000 if logical == "local-timestamp-millis" else micros
    return value


def _fits(value: Any, schema: Any, named: dict) -> bool:
    """Whether a value fastavro read is of the union branch ``schema``."""
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    kind = schema["type"] if isinstance(schema, dict) else schema
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind in named):
        return _fits(value, kind, named)
    plain = {
        "record": lambda v: isinstance(v, dict) and set(v) <= {f["name"] for f in schema["fields"]},
        "map": lambda v: isinstance(v, dict),
        "enum": lambda v: isinstance(v, str) and v in schema["symbols"],
        "string": lambda v: isinstance(v, (str, UUID)),
        "bytes": lambda v: isinstance(v, (bytes, Decimal)),
        "fixed": lambda v: isinstance(v, (bytes, Decimal)),
        "int": lambda v: isinstance(v, (int, date, time)) and not isinstance(v, (bool, datetime)),
        "long": lambda v: isinstance(v, (int, datetime, time)) and not isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
    }
    if kind in plain:
        return plain[kind](value)
    return PRIMITIVES.get(kind, lambda v: False)(value)


PRIMITIVES: dict[str, Any] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31,
    "long": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63,
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "double": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "bytes": lambda v: isinstance(v, (bytes, str)),
}


def _misfits(value: Any, schema: Any, path: str = "") -> list[str]:
    """Why ``value`` does not fit the (fastavro-parsed) Avro ``schema``, one sentence per misfit,
    naming the field by its path in the record (``consents.retargeter2``)."""
    named = schema.get("__named_schemas", {}) if isinstance(schema, dict) else {}
    return _check(value, schema, path, named)


def _check(value: Any, schema: Any, path: str, named: dict) -> list[str]:
    where = f"field {path}" if path else "the record"
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    if isinstance(schema, list):  # a union: any branch
        if any(not _check(value, branch, path, named) for branch in schema):
            return []
        return [f"{where} is {_shown(value)}, which fits none of {_type_names(schema, named)}"]
    kind = schema["type"] if isinstance(schema, dict) else schema
    if isinstance(kind, (dict, list)) or (isinstance(kind, str) and kind in named):
        return _check(value, kind, path, named)
    if kind in PRIMITIVES:
        return [] if PRIMITIVES[kind](value) else [f"{where} must be {kind}, got {_shown(value)}"]
    if kind == "record":
        if not isinstance(value, dict):
            return [
                f"{where} must be an object (record {schema['name'].rsplit('.', 1)[-1]}), got {_shown(value)}"
            ]
        out = []
        for field in schema["fields"]:
            inner = f"{path}.{field['name']}" if path else field["name"]
            if field["name"] not in value:
                if "default" not in field:
                    out.append(f"field {inner} is missing (it has no default)")
                continue
            out += _check(value[field["name"]], field["type"], inner, named)
        return out
    if kind == "enum":
        ok = isinstance(value, str) and value in schema["symbols"]
        return [] if ok else [f"{where} must be one of {', '.join(schema['symbols'])}, got {_shown(value)}"]
    if kind == "fixed":
        ok = isinstance(value, (bytes, str)) and len(value) == schema["size"]
        return [] if ok else [f"{where} must be {schema['size']} bytes, got {_shown(value)}"]
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where} must be a list, got {_shown(value)}"]
        return [
            m for i, item in enumerate(value) for m in _check(item, schema["items"], f"{path}[{i}]", named)
        ]
    if kind == "map":
        if not isinstance(value, dict):
            return [f"{where} must be an object (map), got {_shown(value)}"]
        return [m for k, item in value.items() for m in _check(item, schema["values"], f"{path}.{k}", named)]
    return []


def _type_names(union: list, named: dict) -> str:
    names = []
    for branch in union:
        kind = branch if isinstance(branch, str) else branch.get("type")
        names.append(
            str(branch.get("name", kind)).rsplit(".", 1)[-1] if isinstance(branch, dict) else str(kind)
        )
    return ", ".join(names)


def _shown(value: Any) -> str:
    return json.dumps(value, default=str)


def _type_name(avro_type: Any) -> str:
    """An Avro field type in words: ``string``, ``null|string``, ``array``, a named type's name."""
    if isinstance(avro_type, list):
        return "|".join(_type_name(t) for t in avro_type)
    if isinstance(avro_type, dict):
        return str(avro_type.get("logicalType") or avro_type.get("name") or avro_type.get("type"))
    return str(avro_type)
