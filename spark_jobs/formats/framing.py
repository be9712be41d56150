"""The Schema Registry's wire format, in Python and as Spark columns: magic byte ``0``, the schema id
as a 4-byte big-endian integer, for Protobuf the message indexes (a zigzag varint count, then the
indexes; a single ``0`` byte means ``[0]``), then the encoded record. The JVM's copy for the executors
is ``java/lake/formats/Framing.java``; both name a record that is not framed the same way."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column


MAGIC = b"\x00"
HEADER = 5


class NotFramed(ValueError):
    """Why a record is not a framed record (the message is the reason)."""


def problem(raw: bytes) -> str | None:
    """Why ``raw`` is not a framed record, None when it is one."""
    if not raw:
        return "empty record (a framed record has magic byte 0 and a 4-byte schema id first)"
    if raw[0] != 0:
        return (
            f"no magic byte: the record starts with 0x{raw[0]:02X}{_guess(raw[0])}, "
            "not 0x00 followed by a schema id"
        )
    if len(raw) < HEADER:
        return f"truncated: {len(raw)} bytes, a framed record has at least {HEADER}"
    return None


def _guess(first: int) -> str:
    if first in b"{[":
        return " (plain JSON, written without the registry)"
    if first == ord('"'):
        return " (a JSON string, written without the registry)"
    return ""


def split(raw: bytes) -> tuple[int, bytes]:
    """``(schema id, the bytes after the header)``; :class:`NotFramed` when it is not framed."""
    reason = problem(raw)
    if reason is not None:
        raise NotFramed(reason)
    return struct.unpack(">I", raw[1:HEADER])[0], raw[HEADER:]


def frame(schema_id: int, payload: bytes, indexes: bytes = b"") -> bytes:
    return MAGIC + struct.pack(">I", schema_id) + indexes + payload


def zigzag_varint(n: int) -> bytes:
    value = (n << 1) ^ (n >> 31)
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def message_indexes(path: list[int]) -> bytes:
    """Protobuf's message indexes for the message at ``path`` of its file (``[0]`` is one 0 byte)."""
    if path == [0]:
        return b"\x00"
    return zigzag_varint(len(path)) + b"".join(zigzag_varint(i) for i in path)


def read_indexes(rest: bytes) -> tuple[list[int], bytes]:
    """The message indexes at the start of ``rest`` and the message after them."""
    position = 0

    def varint() -> int:
        nonlocal position
        shift = result = 0
        while True:
            if position >= len(rest):
                raise NotFramed("truncated inside the message indexes")
            byte = rest[position]
            position += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
            if shift > 35:
                raise NotFramed("message indexes: a varint longer than 5 bytes")

    count = varint()
    if count == 0:
        return [0], rest[position:]
    if not 0 < count <= 100:
        raise NotFramed(f"message indexes: a count of {count} is not one")
    return [varint() for _ in range(count)], rest[position:]


def schema_id(raw: Column) -> Column:
    """Spark: the schema id of a framed record (null when the record is not framed)."""
    from pyspark.sql import functions as F

    framed = (F.length(raw) >= HEADER) & (F.substring(raw, 1, 1) == F.lit(MAGIC))
    return F.when(framed, F.conv(F.hex(F.substring(raw, 2, 4)), 16, 10).cast("long"))
