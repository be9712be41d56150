"""What every codec is: how one format's record bytes (a key or a value) are written, read, shown,
and decoded by Spark. One subclass per format (``plain``: string, bytes, json; ``avro``,
``protobuf``, ``json_schema``: the Schema Registry's), chosen by :class:`spark_jobs.formats.Formats`."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterable
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame


class DecodeError(ValueError):
    """Why one record cannot be decoded (the message is the reason, as quarantine keeps it)."""


class TextError(ValueError):
    """Why the ``index``-th of some input texts is not a record of a format (``is not valid JSON
    (...)``, ``does not fit the Avro schema of ...``)."""

    def __init__(self, index: int, reason: str):
        super().__init__(reason)
        self.index = index


class Codec:
    """A format of a topic's keys or values. ``where`` names them in messages (``topics.x.value``)."""

    name = ""
    registered = False  # framed by a Schema Registry (magic byte, schema id)
    schema_type = ""  # a registry format's schemaType in the Schema Registry (AVRO, PROTOBUF, JSON)
    # records are given as UTF-8 text (a registry format's as its JSON or string text): a key's text
    # is checked for invisible bytes (topics/keys.py), in produced lines, dumps and the key checks
    textual = False
    json_given = False  # records are given as JSON text: a dump's value must parse as JSON
    any_bytes = False  # any bytes are a record of this format, a framed-looking one too
    parts: tuple[str, ...] = ("key", "value")  # what a topic may use it for
    publishes = False  # a join's changelog may be written in it (its schema derived from the select)
    schema_suffixes: tuple[str, ...] = ()  # a registry format's schema files end so
    named_messages = False  # a topic may name which of its schema's messages it holds (message:)

    def __init__(self, where: str):
        self.where = where

    # --- Python: lake produce, lake consume, lake show, backfills, publishing -------------------
    def encode(self, value: Any) -> bytes:
        """A value as JSON gives it (an object, a string, ...) as record bytes; :class:`ValueError`
        naming the field that does not fit."""
        raise NotImplementedError

    def encode_text(self, text: bytes) -> bytes:
        """One input line's key or value (``lake produce``) as record bytes; :class:`ValueError`
        saying why it does not fit the format (``is not valid JSON (...)``)."""
        return text

    def encode_texts(self, texts: pa.Array) -> pa.Array:
        """Input lines' keys or values (binary, nulls kept) as record bytes: :meth:`encode_text`
        each; :class:`TextError` for the first that does not fit."""
        import pyarrow as pa

        out = []
        for i, text in enumerate(texts.to_pylist()):
            try:
                out.append(None if text is None else self.encode_text(text))
            except ValueError as exc:
                raise TextError(i, str(exc)) from None
        return pa.array(out, pa.binary())

    def encode_given(self, value: Any) -> bytes | None:
        """A key or value handed over in Python (the test driver's ``pipe``) as record bytes: bytes
        as they are, text as its UTF-8, anything else as JSON; :class:`ValueError` when it does not
        fit."""
        if value is None or isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode()
        try:
            return json.dumps(value, separators=(",", ":")).encode()
        except TypeError as exc:
            raise ValueError(f"the value is not JSON-serializable ({exc})") from None

    def decode(self, raw: bytes) -> Any:
        """Record bytes as a Python value (JSON-able); :class:`DecodeError` when they do not decode."""
        return raw

    def logical(self, raw: bytes) -> bytes:
        """The key the joins compare, as :meth:`key_bytes` gives it in Spark (:mod:`.logical`): the
        key itself here; a framed key's logical value, or its bytes when it does not decode."""
        return raw

    def logical_keys(self, keys: pa.Array) -> pa.Array:
        """:meth:`logical` of each of ``keys`` (binary, nulls kept): the array itself here."""
        return keys

    def render(self, raw: bytes) -> bytes:
        """Record bytes as ``lake consume`` prints them: the bytes themselves, or the decoded
        record as JSON for the registry formats."""
        return raw

    # --- Spark: the joins, the checks, the audits ------------------------------------------------
    def column(self, raw: Column) -> Column:
        """The decoded value as ``select`` sees it (``left.<field>``); null stays null."""
        raise NotImplementedError

    def problem(self, raw: Column) -> Column:
        """Why a record cannot be decoded (its quarantine reason), null when it can (or is null)."""
        from pyspark.sql import functions as F

        return F.lit(None).cast("string")

    def key_bytes(self, raw: Column) -> Column:
        """The key bytes that joins and checks compare: the logical key (a framed key decoded)."""
        return raw

    def comparable(self, raw: Column) -> Column:
        """A value as a backfill compares the dump's with the topic's: what the same record spelled
        differently (JSON's key order and spacing, the schema id it was written with) leaves equal."""
        return raw

    def fields(self) -> list[tuple[str, str]]:
        """The fields of a record of this format and their types, as its schema declares them (what
        a lineage schema facet shows); empty for a format without a schema."""
        return []

    def field(self, path: str) -> Column | None:
        """A bare field path of a value (``merchant_id``, ``address.id``, as a join's
        ``foreign_key:`` names one) read over the row's ``value`` bytes and its decoded ``left``;
        None when the format's values have no fields (the setting is then an expression)."""
        return None

    def stored_problem(self, raw: Column) -> Column:
        """Why a value kept in a lookup table is not a record of this format (a lookup check's
        finding), null when it is; what Spark cannot decode, as :meth:`problem`."""
        return self.problem(raw)

    # --- a published changelog in this format (classmethods: its subject may not exist yet) -----
    @classmethod
    def derive_schema(cls, value_type: Any, topic: str, registered: str | None) -> str:
        """A registry format's schema text for values of the Spark struct type ``value_type`` (a
        changelog of ``topic``); ``registered``: the subject's latest schema, which it evolves."""
        raise ValueError(f"a changelog cannot be published as {cls.name}")

    @classmethod
    def row_encoder(cls, schema_id: int | None, text: str | None) -> Callable[[Column], Column]:
        """The row's struct as a record of this format on the executors (no Python per record), of
        schema ``text`` registered as ``schema_id`` for a registry format."""
        raise ValueError(f"a changelog cannot be published as {cls.name}")

    def learn(self, frame: DataFrame, column: str) -> bool:
        """Learn the schema ids of ``frame[column]`` (the registry formats); True when something
        new was learnt, so an expression built before must be built again."""
        return False

    def learn_ids(self, ids: Iterable[int]) -> bool:
        return False


def jvm_function(make: Callable[[Any], tuple[Any, Any]], *columns: Column) -> Column:
    """A column of one of the product's JVM functions over ``columns``: ``make(jvm)`` gives the
    function (a Spark Java UDF of ``spark_jobs/formats/java``) and its Spark return type. The column
    is bound to the function itself, not to a registered name: it resolves in whichever session
    evaluates it, a streaming query's own among them. ``JavaUdf.of`` binds the Java-UDF overload of
    ``functions.udf`` at compile time: through Py4J the choice between it and the untyped Scala
    overload (refused by Spark) follows the JVM's method order, which differs between machines."""
    from pyspark.sql import SparkSession
    from pyspark.sql.classic.column import Column as ClassicColumn
    from pyspark.sql.classic.column import _to_seq

    spark = SparkSession.getActiveSession()
    assert spark is not None, "a Spark session runs the formats' JVM functions"
    jvm: Any = spark._jvm
    function = jvm.lake.formats.JavaUdf.of(*make(jvm))
    return ClassicColumn(function.apply(_to_seq(spark.sparkContext, [c._jc for c in columns])))  # type: ignore[attr-defined]


def message_name(topic: str) -> str:
    """A record or message name made of a topic's name (``customer_consents`` -> ``CustomerConsents``)."""
    return "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", topic) if part) or "Changelog"


def jsonable(value: Any) -> Any:
    """A decoded value as JSON can hold it: bytes as base64, dates and times in ISO 8601, decimals as
    text."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def as_json(value: Any) -> bytes:
    return json.dumps(jsonable(value), ensure_ascii=False, separators=(",", ":")).encode()
