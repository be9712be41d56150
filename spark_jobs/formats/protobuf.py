"""``protobuf``: Schema Registry framed Protobuf records.

A subject's schema is ``.proto`` text; the product compiles it with protoc (``grpcio-tools``: the
Python package carries protoc, nothing of gRPC is used) into a ``FileDescriptorSet``, which Python
(``protobuf``'s dynamic messages: ``lake produce``, ``lake consume``) and the executors (the JVM
function ``lake.formats.ProtobufDecode``, protobuf-java) read records with. The topic's message is the
schema's first message (message indexes ``[0]``, what a producer of that message writes); a record
whose indexes name another message is quarantined saying which. Imports of Google's well-known types
(``google/protobuf/timestamp.proto``, ...) resolve; a schema that references other subjects does not
(docs/limits.md).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import UserError
from spark_jobs.formats import framing
from spark_jobs.formats.codec import DecodeError
from spark_jobs.formats.registered import RegisteredCodec

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Compiled:
    """A ``.proto`` schema compiled: its descriptor set, and the topic's message (the first one)."""

    descriptor_set: bytes
    message: str  # full name
    message_class: Any
    pool: Any
    file: Any

    @property
    def file_proto(self) -> Any:
        """The schema's own ``FileDescriptorProto`` (its imports' come before it in the set)."""
        from google.protobuf import descriptor_pb2

        return descriptor_pb2.FileDescriptorSet.FromString(self.descriptor_set).file[-1]


def compile_proto(text: str, where: str) -> Compiled:
    """Compile ``.proto`` text with protoc; a schema protoc refuses is one line with protoc's reason."""
    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

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
    name = f"{own.package}.{own.message_type[0].name}" if own.package else own.message_type[0].name
    descriptor = pool.FindMessageTypeByName(name)
    return Compiled(
        data, name, message_factory.GetMessageClass(descriptor), pool, pool.FindFileByName(own.name)
    )


class ProtobufCodec(RegisteredCodec):
    name = "protobuf"

    def _parse(self, text: str) -> Compiled:
        return compile_proto(text, self.where)

    # --- Python ---------------------------------------------------------------------------------
    def encode(self, value: Any) -> bytes:
        from google.protobuf import json_format

        compiled = self._parsed(self.writer.text)
        if not isinstance(value, dict):
            raise ValueError(f"does not fit the Protobuf schema of {self.subject}: a message is an object")
        message = compiled.message_class()
        try:
            json_format.ParseDict(value, message)
        except json_format.ParseError as exc:
            raise ValueError(f"does not fit the Protobuf schema of {self.subject}: {exc}") from None
        return framing.frame(self.writer.schema_id, message.SerializeToString(), framing.message_indexes([0]))

    def decode(self, raw: bytes) -> Any:
        from google.protobuf import json_format
        from google.protobuf.message import DecodeError as ProtobufError

        schema_id, rest = self._split(raw)
        self._writer(schema_id)  # one of the subject's versions, else why not
        try:
            path, payload = framing.read_indexes(rest)
        except framing.NotFramed as exc:
            raise DecodeError(str(exc)) from None
        compiled = self._parsed(self.reader.text)
        if path != [0]:
            raise DecodeError(
                f"message indexes {path} name another message than the topic's {compiled.message}"
            )
        message = compiled.message_class()
        try:
            message.ParseFromString(payload)
        except ProtobufError as exc:
            raise DecodeError(f"not a Protobuf {compiled.message} of schema id {schema_id}: {exc}") from None
        return json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    # --- Spark ----------------------------------------------------------------------------------
    def _decoder(self, jvm: Any) -> tuple[Any, Any]:
        """The JVM decoder of the reader's message, and its return type."""
        compiled = self._parsed(self.reader.text)
        known = json.dumps(sorted(self.writers))
        foreign = json.dumps({str(i): reason for i, reason in sorted(self.foreign.items())})
        descriptors = base64.b64encode(compiled.descriptor_set).decode()
        registry = self.registry.for_executors
        decoder = jvm.lake.formats.ProtobufDecode(
            self.subject, descriptors, compiled.message, known, foreign, registry
        )
        return decoder, jvm.lake.formats.ProtobufDecode.returnType(descriptors, compiled.message)
