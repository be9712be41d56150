"""A framed key's logical value: what the joins, the checks, ``lake explain`` and ``lake diagnose``
compare, so that a key written with a Schema Registry frame equals the same key written plain.

**The definition.** The key decoded into the topic's reader schema (the subject's latest version when
the command or job started), as a join's ``select`` sees it, spelled as Spark's ``to_json`` spells it
with :data:`OPTIONS`: a string key is its text; any other is compact JSON with its fields in the
reader schema's order, a field that is null left out (in maps too; not in lists), a field the writer
did not have given its default, integers of every width as numbers (a Protobuf ``int64`` too), floats
as Java prints them, an enum by its name, bytes as base64, a decimal by its digits, a date as
``yyyy-MM-dd``, a timestamp in UTC to the millisecond (``2026-01-02T03:04:05.678Z``).

It is spelled twice, because Spark and plain Python both need it: in Spark by each codec's
``key_bytes`` (``to_json`` on the executors), in Python by :func:`spelled` over a codec's
``spark_value`` (the decoded record shaped as Spark's value of the reader schema).
``tests/test_formats.py`` holds the two equal on composite Avro, Protobuf and JSON Schema keys.
"""

from __future__ import annotations

import base64
import math
import struct
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

OPTIONS = {
    "ignoreNullFields": "true",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSXXX",
    "dateFormat": "yyyy-MM-dd",
    "timeZone": "UTC",
}


class Float32(float):
    """A 32-bit float (Avro ``float``, Protobuf ``float``): Java prints it with a float's digits."""


def spelled(value: Any) -> bytes:
    """``value`` (as a codec's ``spark_value`` shapes it) as its logical key's bytes."""
    if isinstance(value, str):
        return value.encode()
    return _json(value).encode()


def _json(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return (
            "{" + ",".join(f"{_string(str(k))}:{_json(v)}" for k, v in value.items() if v is not None) + "}"
        )
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_json(v) for v in value) + "]"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Float32):
        return _java_float(value, single=True)
    if isinstance(value, float):
        return _java_float(value, single=False)
    if isinstance(value, Decimal):
        return str(value)  # Java's BigDecimal.toString and Python's str follow the same rules
    if isinstance(value, datetime):
        utc = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        return '"' + utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z" + '"'
    if isinstance(value, date):
        return '"' + value.isoformat() + '"'
    if isinstance(value, (bytes, bytearray)):
        return '"' + base64.b64encode(bytes(value)).decode() + '"'
    raise TypeError(f"no logical spelling for {type(value).__name__}")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _string(text: str) -> str:
    """A JSON string as Jackson writes it: UTF-8 kept, other control characters as ``\\u00XX``."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _java_float(value: float, single: bool) -> str:
    """``value`` as Java's ``Float.toString`` / ``Double.toString`` print it (the shortest digits
    that read back, plain between 10^-3 and 10^7, else ``d.dddE±n``; NaN and Infinity as Jackson
    writes them, quoted)."""
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    if value == 0:
        return "-0.0" if math.copysign(1, value) < 0 else "0.0"
    digits, exponent = _shortest(value, single)  # value = 0.digits * 10^exponent
    sign = "-" if value < 0 else ""
    if 1e-3 <= abs(value) < 1e7:
        if exponent <= 0:
            return f"{sign}0.{'0' * -exponent}{digits}"
        whole, fraction = digits[:exponent].ljust(exponent, "0"), digits[exponent:]
        return f"{sign}{whole}.{fraction or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent - 1}"


def _shortest(value: float, single: bool) -> tuple[str, int]:
    """The shortest significant digits that read back as ``value`` (as a 32-bit float when
    ``single``), and the decimal exponent of ``0.digits``."""
    text = repr(abs(value))  # Python's repr: the shortest digits of a double
    if single:
        target = _f32(abs(value))
        text = next(t for p in range(1, 10) if _f32(float(t := f"{target:.{p - 1}e}")) == target)
    _, digits, exponent = Decimal(text).as_tuple()
    shown = "".join(map(str, digits)).lstrip("0")
    return shown.rstrip("0") or "0", len(shown) + int(exponent)


def _f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]
