"""What the Schema Registry formats share: the subject, its reader schema, the writer schemas by id,
and the ids that belong elsewhere (and why)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import UserError
from spark_jobs.formats import framing
from spark_jobs.formats.codec import Codec, DecodeError, as_json, jvm_function
from spark_jobs.formats.logical import OPTIONS, spelled
from spark_jobs.seams.schema_registry import Registry, Version

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame


class MissingSubject(UserError):
    """A registry format's subject has no version in the registry. Whether the registry lost it (the
    topic holds records framed with ids it does not know) takes Kafka to tell:
    :func:`spark_jobs.topics.lost_schemas.explained`."""

    def __init__(self, where: str, registry: Registry, subject: str):
        self.where, self.registry, self.subject = where, registry, subject
        part = where.rsplit(".", 1)[-1]
        super().__init__(
            f"{where}: subject {subject} has no schema in the Schema Registry at {registry.url}; "
            f"register one, e.g. lake produce TOPIC FILE --{part}-schema SCHEMA_FILE"
        )

    @property
    def topic_part(self) -> tuple[str, str] | None:
        """The declared topic and its part (``key``, ``value``) whose subject is missing."""
        if not self.where.startswith("topics."):
            return None
        topic, part = self.where.removeprefix("topics.").rsplit(".", 1)
        return topic, part


class RegisteredCodec(Codec):
    """A registry format of one subject. ``reader``: what records are decoded into, the subject's
    latest version when this codec was made (or the schema a writing command writes with, see
    :meth:`write_with`); ``writers``: the subject's versions by id (what records
    may be written with); ``foreign``: ids seen on the topic that are not the subject's, with why."""

    registered = True
    textual = True  # given as JSON text, or a string schema's text
    json_given = True
    publishes = True

    def __init__(self, where: str, registry: Registry, subject: str):
        super().__init__(where)
        self.registry, self.subject = registry, subject
        reader = registry.latest(subject)
        if reader is None:
            raise MissingSubject(where, registry, subject)
        if reader.schema_type != self.schema_type:
            raise UserError(
                f"{where}: subject {subject} holds a {_named(reader.schema_type)} schema "
                f"(id {reader.schema_id}), "
                f"but the topic declares {self.name}"
            )
        self.reader: Version = reader
        self.writer: Version = reader  # what encode() writes with (lake produce --value-schema: a file's)
        self.writers: dict[int, str] = {v.schema_id: v.text for v in registry.versions(subject)}
        self.writers.setdefault(reader.schema_id, reader.text)
        self.foreign: dict[int, str] = {}
        self._parsed_cache: dict[str, Any] = {}

    def _parse(self, text: str) -> Any:
        raise NotImplementedError

    def _decoder(self, jvm: Any) -> tuple[Any, Any]:
        """The format's JVM decoder for the schema ids known now, and its Spark return type."""
        raise NotImplementedError

    def spark_value(self, raw: bytes) -> Any:
        """The record as Spark's value of the reader schema (what :meth:`column` gives), in Python:
        dicts in the reader schema's field order, as :mod:`.logical` spells it; :class:`DecodeError`
        when it does not decode."""
        raise NotImplementedError

    def logical_value(self, raw: bytes) -> bytes | None:
        """A framed key's logical value (:mod:`.logical`); None when it does not decode."""
        try:
            return spelled(self.spark_value(raw))
        except DecodeError:
            return None

    def logical(self, raw: bytes) -> bytes:
        value = self.logical_value(raw)
        return raw if value is None else value

    def logical_keys(self, keys: pa.Array) -> pa.Array:
        import pyarrow as pa

        return pa.array([None if k is None else self.logical(k) for k in keys.to_pylist()], pa.binary())

    def render(self, raw: bytes) -> bytes:
        return as_json(self.decode(raw))

    # --- Spark: one JVM function per format gives each record its value or why not ---------------
    def decoded(self, raw: Column) -> Column:
        """``struct<value, error>`` of each record (null for a null record)."""
        return jvm_function(self._decoder, raw)

    def column(self, raw: Column) -> Column:
        return self.decoded(raw).getField("value")

    def problem(self, raw: Column) -> Column:
        return self.decoded(raw).getField("error")

    def key_bytes(self, raw: Column) -> Column:
        """A framed key as its logical value (:mod:`.logical`): a composite key's JSON (formats with
        a string key schema give the string's own bytes, so the key equals the same key written
        plain)."""
        from pyspark.sql import functions as F

        text = F.to_json(self.column(raw), OPTIONS)
        return F.when(raw.isNull(), F.lit(None)).otherwise(F.coalesce(text.cast("binary"), raw))

    def encode_given(self, value: Any) -> bytes | None:
        """Bytes as they are; anything else (a dict, a string of a string schema) encoded."""
        if value is None or isinstance(value, bytes):
            return value
        return self.encode(value)

    def comparable(self, raw: Column) -> Column:
        """By the value decoded into the reader schema: the schema id it was written with makes no
        change."""
        from pyspark.sql import functions as F

        return F.to_json(self.column(raw)).cast("binary")

    def field(self, path: str) -> Column:
        from pyspark.sql import functions as F

        return F.expr(f"left.{path}")

    def learn(self, frame: DataFrame, column: str) -> bool:
        from pyspark.sql import functions as F

        ids = [r[0] for r in frame.select(framing.schema_id(F.col(column)).alias("id")).distinct().collect()]
        return self._learn(i for i in ids if i is not None)

    def learn_ids(self, ids: Iterable[int]) -> bool:
        return self._learn(ids)

    def write_with(self, text: str) -> int:
        """Encode with schema ``text`` from now on, registered under the subject first (the
        registry's compatibility rules decide; a schema it has already keeps its id), and read into
        it too: what a command compares with what it writes (a backfill's dump with the topic) is
        compared in the schema it writes with, so a field only that schema has is not dropped."""
        self._parse(text)  # a schema that does not parse is one line naming the file's format
        schema_id = self.registry.register(self.subject, self.schema_type, text)
        self.writer = self.reader = Version(schema_id, self.subject, 0, self.schema_type, text)
        self.writers[schema_id] = text
        return schema_id

    def encode_text(self, text: bytes) -> bytes:
        """A line's JSON as a record of the writer schema."""
        try:
            value = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"is not JSON ({exc})") from None
        return self.encode(value)

    def _parsed(self, text: str) -> Any:
        if text not in self._parsed_cache:
            self._parsed_cache[text] = self._parse(text)
        return self._parsed_cache[text]

    def _split(self, raw: bytes) -> tuple[int, bytes]:
        try:
            return framing.split(raw)
        except framing.NotFramed as exc:
            raise DecodeError(str(exc)) from None

    def _writer(self, schema_id: int) -> Any:
        """The parsed writer schema of ``schema_id``; :class:`DecodeError` when it is not one of
        the subject's (asking the registry about an id not seen before)."""
        if schema_id not in self.writers and schema_id not in self.foreign:
            self._learn([schema_id])
        if schema_id in self.foreign:
            raise DecodeError(self.foreign[schema_id])
        return self._parsed(self.writers[schema_id])

    def _learn(self, ids: Iterable[int]) -> bool:
        """Ask the registry about ids not seen before: a version of the subject registered since
        this codec was made becomes a writer; any other id a reason. True when anything was new."""
        new = False
        for schema_id in ids:
            if schema_id in self.writers or schema_id in self.foreign:
                continue
            new = True
            found = self.registry.schema(schema_id)
            if found is None:
                self.foreign[schema_id] = (
                    f"unknown schema id {schema_id} "
                    f"(the Schema Registry at {self.registry.url} has no such schema)"
                )
                continue
            subjects = self.registry.subjects_of(schema_id)
            if self.subject in subjects and found.schema_type == self.schema_type:
                self.writers[schema_id] = found.text
            elif found.schema_type != self.schema_type:
                self.foreign[schema_id] = (
                    f"schema id {schema_id} is a {_named(found.schema_type)} schema, not {self.name}"
                )
            else:
                owners = ", ".join(subjects[:3]) or "no subject"
                if len(subjects) > 3:
                    owners += f" and {len(subjects) - 3} more"
                self.foreign[schema_id] = f"schema id {schema_id} belongs to {owners}, not to {self.subject}"
        return new


def _named(schema_type: str) -> str:
    """A Schema Registry ``schemaType`` by the product's name of its format."""
    from spark_jobs.formats import schema_format

    found = schema_format(schema_type)
    return found.name if found is not None else schema_type
