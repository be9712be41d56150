"""``protobuf``: Schema Registry framed Protobuf records.

A subject's schema is ``.proto`` text; the product compiles it with protoc (``grpcio-tools``: the
Python package carries protoc, nothing of gRPC is used) into a ``FileDescriptorSet``, which Python
(``protobuf``'s dynamic messages: ``lake produce``, ``lake consume``) and the executors (the JVM
function ``lake.formats.ProtobufDecode``, protobuf-java) read records with. The topic's message is the
reader schema's first message, or the one its ``message:`` names (as ksqlDB's
``VALUE_SCHEMA_FULL_NAME``). A record's message indexes are resolved in the writer schema its frame
names (a writer version that added or moved messages puts the topic's at other indexes), then read
with the reader's message of that name; a record whose indexes name another message is quarantined
saying which. Imports of Google's well-known types
(``google/protobuf/timestamp.proto``, ...) resolve; a schema that references other subjects does not
(docs/limits.md).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import UserError
from spark_jobs.formats import framing
from spark_jobs.formats.codec import DecodeError, jvm_function, message_name
from spark_jobs.formats.logical import Float32
from spark_jobs.formats.registered import RegisteredCodec

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass(frozen=True)
class Compiled:
    """A ``.proto`` schema compiled: its descriptor set, its messages by their message indexes
    (top-level and nested, in declaration order, map entries among them, as protoc numbers them),
    and the topic's message (the one named, else the first)."""

    descriptor_set: bytes
    message: str  # full name
    names: dict[tuple[int, ...], str]  # message indexes -> full name
    pool: Any
    file: Any

    @property
    def file_proto(self) -> Any:
        """The schema's own ``FileDescriptorProto`` (its imports' come before it in the set)."""
        from google.protobuf import descriptor_pb2

        return descriptor_pb2.FileDescriptorSet.FromString(self.descriptor_set).file[-1]

    @property
    def message_class(self) -> Any:
        return self.class_of(self.message)

    def class_of(self, name: str) -> Any:
        from google.protobuf import message_factory

        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(name))

    def indexes_of(self, name: str) -> list[int] | None:
        """The message indexes of the message ``name`` in this schema (None: it has none)."""
        return next((list(path) for path, found in self.names.items() if found == name), None)


def compile_proto(text: str, where: str, message: str | None = None) -> Compiled:
    """Compile ``.proto`` text with protoc; a schema protoc refuses is one line with protoc's reason.
    ``message``: the full name of the topic's message (default: the schema's first)."""
    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="lake-proto-") as folder:
        source = Path(folder) / "schema.proto"
        source.write_text(text)
        out = Path(folder) / "schema.pb"
        done = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{folder}", f"-I{include}",
             f"--descriptor_set_out={out}", "--include_imports", str(source)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["protoc failed"])[0].replace(f"{folder}/", "")
            raise UserError(f"{where}: not a Protobuf schema protoc can read: {reason}")
        data = out.read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data)
    own = files.file[-1]
    if not own.message_type:
        raise UserError(f"{where}: the Protobuf schema defines no message")
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    names: dict[tuple[int, ...], str] = {}

    def walk(messages: Any, prefix: str, path: tuple[int, ...]) -> None:
        for index, found in enumerate(messages):
            name = f"{prefix}.{found.name}" if prefix else found.name
            names[(*path, index)] = name
            walk(found.nested_type, name, (*path, index))

    walk(own.message_type, own.package, ())
    chosen = message or names[(0,)]
    if chosen not in names.values():
        raise UserError(f"{where}: the Protobuf schema has no message {chosen} (messages: "
                        f"{', '.join(sorted(names.values()))})")  # fmt: skip
    return Compiled(data, chosen, names, pool, pool.FindFileByName(own.name))


class ProtobufCodec(RegisteredCodec):
    name = "protobuf"
    schema_type = "PROTOBUF"
    schema_suffixes = (".proto",)
    named_messages = True

    def __init__(self, where: str, registry: Any, subject: str, message: str | None = None):
        self.message_name = message  # the topic's message (None: the reader schema's first)
        super().__init__(where, registry, subject)

    def _parse(self, text: str) -> Compiled:
        return compile_proto(text, self.where)

    def fields(self) -> list[tuple[str, str]]:
        from google.protobuf.descriptor import FieldDescriptor

        compiled = self._reader()
        names = {
            v: k.removeprefix("TYPE_").lower()
            for k, v in vars(FieldDescriptor).items()
            if k.startswith("TYPE_")
        }
        message = compiled.pool.FindMessageTypeByName(compiled.message)
        return [
            (
                f.name,
                f.message_type.full_name
                if f.message_type
                else f.enum_type.full_name
                if f.enum_type
                else names[f.type],
            )
            for f in message.fields
        ]

    def _reader(self) -> Compiled:
        """The reader schema, with the topic's message."""
        key = f"reader:{self.reader.text}"
        if key not in self._parsed_cache:
            self._parsed_cache[key] = compile_proto(self.reader.text, self.where, self.message_name)
        return self._parsed_cache[key]

    # --- Python ---------------------------------------------------------------------------------
    def encode(self, value: Any) -> bytes:
        """``value`` as the topic's message of the writer schema, framed with its message indexes in
        that schema."""
        from google.protobuf import json_format

        writer = self._parsed(self.writer.text)
        name = self._reader().message
        indexes = writer.indexes_of(name)
        if indexes is None:
            raise ValueError(
                f"the Protobuf schema of {self.subject} (id {self.writer.schema_id}) has no message {name}"
            )
        if not isinstance(value, dict):
            raise ValueError(f"does not fit the Protobuf schema of {self.subject}: a message is an object")
        message = writer.class_of(name)()
        try:
            json_format.ParseDict(value, message)
        except json_format.ParseError as exc:
            raise ValueError(f"does not fit the Protobuf schema of {self.subject}: {exc}") from None
        return framing.frame(
            self.writer.schema_id, message.SerializeToString(), framing.message_indexes(indexes)
        )

    def decode(self, raw: bytes) -> Any:
        from google.protobuf import json_format

        return json_format.MessageToDict(
            self._message(raw), preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    def spark_value(self, raw: bytes) -> Any:
        return _shaped(self._message(raw))

    def _message(self, raw: bytes) -> Any:
        """The record read as the topic's message: its message indexes resolved in the writer schema
        its frame names (a writer that added or moved messages places the topic's elsewhere), the
        bytes read with the reader schema's message of that name."""
        from google.protobuf.message import DecodeError as ProtobufError

        schema_id, rest = self._split(raw)
        writer = self._writer(schema_id)  # one of the subject's versions, else why not
        try:
            path, payload = framing.read_indexes(rest)
        except framing.NotFramed as exc:
            raise DecodeError(str(exc)) from None
        reader = self._reader()
        name = writer.names.get(tuple(path))
        if name is None:
            raise DecodeError(
                f"message indexes {path} name no message of schema id {schema_id} ({self.subject})"
            )
        if name != reader.message:
            raise DecodeError(f"message indexes {path} name {name}, not the topic's {reader.message}")
        message = reader.message_class()
        try:
            message.ParseFromString(payload)
        except ProtobufError as exc:
            raise DecodeError(f"not a Protobuf {name} of schema id {schema_id}: {exc}") from None
        return message

    # --- a published changelog ----------------------------------------------------------------
    @classmethod
    def derive_schema(cls, value_type: Any, topic: str, registered: str | None) -> str:
        """A proto3 message of the row's fields, numbered as the registered version numbers them."""
        return _proto(value_type, message_name(topic), _numbering(registered))

    @classmethod
    def row_encoder(cls, schema_id: int | None, text: str | None) -> Callable[[Column], Column]:
        assert schema_id is not None and text is not None
        return _protobuf_encoder(schema_id, text)

    # --- Spark ----------------------------------------------------------------------------------
    def _decoder(self, jvm: Any) -> tuple[Any, Any]:
        """The JVM decoder of the reader's message, and its return type; each known writer version's
        messages by their indexes go with it (a version met later is outlined on the executor)."""
        compiled = self._reader()
        known = json.dumps(
            {
                str(i): {".".join(map(str, path)): name for path, name in self._parsed(text).names.items()}
                for i, text in sorted(self.writers.items())
            }
        )
        foreign = json.dumps({str(i): reason for i, reason in sorted(self.foreign.items())})
        descriptors = base64.b64encode(compiled.descriptor_set).decode()
        registry = self.registry.for_executors
        decoder = jvm.lake.formats.ProtobufDecode(
            self.subject, descriptors, compiled.message, known, foreign, registry
        )
        return decoder, jvm.lake.formats.ProtobufDecode.returnType(descriptors, compiled.message)


def _shaped(message: Any) -> dict[str, Any]:
    """A message as the JVM's ``ProtobufTypes.toSpark`` gives it: every field in declaration order;
    a message field or a scalar with presence that is not set null, any other scalar its value or
    default; an enum its value's name, a ``float`` a :class:`Float32`, a Timestamp a time."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, item = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            out[field.name] = {_single(key, k): _single(item, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_single(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = _single(field, value)
    return out


def _single(field: Any, value: Any) -> Any:
    from google.protobuf.descriptor import FieldDescriptor

    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known else f"UNKNOWN_ENUM_VALUE_{field.enum_type.name}_{value}"
    if field.type == FieldDescriptor.TYPE_FLOAT:
        return Float32(value)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return datetime.fromtimestamp(value.seconds, UTC) + timedelta(microseconds=value.nanos // 1000)
        return _shaped(value)
    return value


def _protobuf_encoder(schema_id: int, text: str) -> Callable[[Column], Column]:
    """Rows as Protobuf messages of the derived schema, by the JVM's ``ProtobufEncode``."""
    import base64

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

    fields: dict[str, int] = dataclass_field(default_factory=dict)
    reserved: set[int] = dataclass_field(default_factory=set)
    nested: dict[str, Numbering] = dataclass_field(default_factory=dict)

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
        message = message_name(field)
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
