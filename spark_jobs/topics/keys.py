"""Key hygiene: the ways a key's bytes differ from the plain UTF-8 text both sides of a join mean by
it (keys that differ in invisible bytes), spelled once. Each rule has its Spark SQL form
(the quality suite's ``key_format`` check over the topics' records) and its Arrow form (``lake diagnose``,
which reads Kafka without Spark).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

WHITESPACE = "[ \\t\\n\\x0b\\f\\r]"  # Java's \s, which the SQL form's RLIKE uses


@dataclass(frozen=True)
class KeyRule:
    name: str  # an identifier (``lake diagnose --json``)
    text: str  # plain words, completing "the key ..."
    sql: str  # Spark SQL over a binary column ``key``: true when the key breaks the rule
    arrow: Callable[[pa.Array], np.ndarray]  # the same over a binary Arrow array (a null key: False)


def _flags(result: pa.Array) -> np.ndarray:
    return pc.fill_null(result, False).to_numpy(zero_copy_only=False).astype(bool)


def _not_utf8(keys: pa.Array) -> np.ndarray:
    try:
        keys.cast(pa.string())  # validates the whole array at once
        return np.zeros(len(keys), dtype=bool)
    except pa.ArrowInvalid:
        out = np.zeros(len(keys), dtype=bool)
        for i, key in enumerate(keys.to_pylist()):
            if key is not None:
                try:
                    key.decode("utf-8")
                except UnicodeDecodeError:
                    out[i] = True
        return out


def _starts(prefix: str, min_length: int = 1) -> Callable[[pa.Array], np.ndarray]:
    def check(keys: pa.Array) -> np.ndarray:
        long_enough = pc.greater_equal(pc.binary_length(keys), min_length)
        return _flags(pc.and_(long_enough, pc.starts_with(keys, pattern=prefix)))

    return check


def _quoted(keys: pa.Array) -> np.ndarray:
    ends = pc.and_(pc.starts_with(keys, pattern='"'), pc.ends_with(keys, pattern='"'))
    return _flags(pc.and_(pc.greater_equal(pc.binary_length(keys), 2), ends))


def _regex(pattern: str) -> Callable[[pa.Array], np.ndarray]:
    return lambda keys: _flags(pc.match_substring_regex(keys, pattern=pattern))


# The rules a string key is held to, in the order findings name them. Binary keys (declared
# ``key: binary``, e.g. Avro with Schema Registry framing) may hold any bytes.
RULES = (
    KeyRule("not_utf8", "is not valid UTF-8", "NOT is_valid_utf8(key)", _not_utf8),
    KeyRule(
        "framed",
        "starts with Schema Registry framing (0x00 + 4-byte schema id)",
        "length(key) >= 5 AND substring(key, 1, 1) = X'00'",
        _starts("\x00", 5),
    ),
    KeyRule(
        "bom",
        "starts with a byte order mark (EF BB BF)",
        "length(key) >= 3 AND substring(key, 1, 3) = X'EFBBBF'",
        _starts("\ufeff"),
    ),
    KeyRule(
        "quoted",
        "is wrapped in double quotes (JSON-encoded string)",
        "length(key) >= 2 AND substring(key, 1, 1) = X'22' AND substring(key, -1, 1) = X'22'",
        _quoted,
    ),
    KeyRule(
        "whitespace",
        "has leading or trailing whitespace",
        "cast(key as string) RLIKE '^\\\\s|\\\\s$'",
        _regex(f"^{WHITESPACE}|{WHITESPACE}$"),
    ),
    KeyRule(
        "control",
        "contains control characters",
        "cast(key as string) RLIKE '[\\\\x00-\\\\x1f\\\\x7f]'",
        _regex("[\\x00-\\x1f\\x7f]"),
    ),
)


def hex_dump(key: bytes, limit: int = 32) -> str:
    """``75 73 65 72 5f 31 | user_1``: the bytes in hex, then as text with unprintables as dots."""
    shown = key[:limit]
    text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in shown)
    more = f" (+{len(key) - limit} bytes)" if len(key) > limit else ""
    return f"{shown.hex(' ')} | {text}{more}"


def show(key: bytes) -> str:
    """A key as a person reads it: its text when it is printable UTF-8, else its hex dump."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return hex_dump(key)
    return text if text.isprintable() and text.strip() == text else repr(text)


# A key without the invisible bytes the rules above find: control characters and byte order marks
# anywhere, surrounding spaces, then one pair of JSON quotes (and the spaces inside them). What a
# key was probably meant to be, for naming it beside a key that differs from it only in those bytes
# (the completeness check's near keys, the backfill's quarantine, ``lake explain``): one rule, in its
# Spark SQL form and its Python form.
_INVISIBLE_SQL = "[\\\\x00-\\\\x1f\\\\x7f\\\\x{FEFF}]"
_INVISIBLE = re.compile(rb"[\x00-\x1f\x7f]|\xef\xbb\xbf")


def plain_key_sql(column: str) -> str:
    """Spark SQL: the string ``column`` (a key's text or bytes) without its invisible bytes."""
    text = f"trim(regexp_replace(cast({column} AS string), '{_INVISIBLE_SQL}', ''))"
    return f"""trim(regexp_replace({text}, '^"(.*)"$', '$1'))"""


def plain_key(key: bytes) -> bytes:
    """The same as :func:`plain_key_sql` for a key's bytes in Python."""
    out = _INVISIBLE.sub(b"", key).strip(b" ")
    if len(out) >= 2 and out[:1] == b'"' and out[-1:] == b'"':
        out = out[1:-1].strip(b" ")
    return out
