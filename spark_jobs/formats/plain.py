"""The formats without a registry: ``string`` (UTF-8 text), ``bytes`` (keys only: any bytes) and
``json`` (a JSON document; a value must be a JSON object to be joined)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_jobs.formats.codec import Codec, DecodeError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column


class StringCodec(Codec):
    name = "string"
    textual = True

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise ValueError(f"a {self.name} record is text, got {json.dumps(value)}")
        return value.encode()

    def encode_text(self, text: bytes) -> bytes:
        try:
            text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        return text

    def encode_texts(self, texts: pa.Array) -> pa.Array:
        import pyarrow as pa

        try:
            texts.cast(pa.string())  # all valid UTF-8: Arrow checks a block at once
        except pa.ArrowInvalid:
            return super().encode_texts(texts)  # the first that is not
        return texts

    def decode(self, raw: bytes) -> Any:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None

    def column(self, raw: Column) -> Column:
        """A string value is ``struct<value>`` (``left.value``)."""
        from pyspark.sql import functions as F

        return F.when(raw.isNull(), F.lit(None)).otherwise(F.struct(raw.cast("string").alias("value")))


class BytesCodec(Codec):
    name = "bytes"
    any_bytes = True
    parts = ("key",)

    def encode_texts(self, texts: pa.Array) -> pa.Array:
        return texts

    def encode(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode()
        raise ValueError(f"a bytes record is given as text, got {json.dumps(value)}")

    def column(self, raw: Column) -> Column:
        from pyspark.sql import functions as F

        return F.when(raw.isNull(), F.lit(None)).otherwise(F.struct(raw.alias("value")))


class JsonCodec(Codec):
    name = "json"
    json_given = True
    parts = ("value",)
    publishes = True

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

    def encode_text(self, text: bytes) -> bytes:
        try:
            json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"is not valid JSON ({exc})") from None
        return text

    def decode(self, raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"not valid JSON ({exc})") from None

    def column(self, raw: Column) -> Column:
        """A JSON value is ``map<string,string>`` (``left.email``; nested objects stay JSON text)."""
        from pyspark.sql import functions as F

        return F.from_json(raw.cast("string"), "map<string,string>")

    def problem(self, raw: Column) -> Column:
        from pyspark.sql import functions as F

        # the parse ``column`` does: null for anything but a JSON object (an array, a scalar, a
        # malformed text). A variant parse (try_parse_json) said the same for a third more CPU per
        # record (docs/benchmarks.md, "The profile").
        is_object = self.column(raw).isNotNull()
        return F.when(raw.isNotNull() & ~is_object, F.lit("value is not a JSON object"))

    @classmethod
    def row_encoder(cls, schema_id: int | None, text: str | None) -> Callable[[Column], Column]:
        """The row as a JSON object, its null fields kept."""
        from pyspark.sql import functions as F

        return lambda row: F.to_json(row, {"ignoreNullFields": "false"}).cast("binary")

    def comparable(self, raw: Column) -> Column:
        """JSON by content: key order, spacing and number spelling make no change."""
        from pyspark.sql import functions as F

        return F.coalesce(F.to_json(F.try_parse_json(raw.cast("string"))).cast("binary"), raw)

    def field(self, path: str) -> Column:
        from pyspark.sql import functions as F

        return F.get_json_object(F.col("value").cast("string"), f"$.{path}")

    def stored_problem(self, raw: Column) -> Column:
        """A lookup's JSON value may be any JSON document (an object to be joined)."""
        from pyspark.sql import functions as F

        return F.when(F.try_parse_json(raw.cast("string")).isNull(), F.lit("value does not parse as JSON"))
