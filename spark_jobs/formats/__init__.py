"""Record formats: one codec per format, the one place where record bytes become values and back.

Every reader and writer of records asks :class:`Formats` for the codec of a topic's key or value
(``formats.codec("customer_consents", "value")``): the joins' Kafka read and their projection, the
snapshots the checks, audits and backfills read, ``lake produce`` and ``lake consume``, ``lake
show``, the published changelogs, the backfills' dumps, the test driver. A new format is one
module here: a :class:`Codec` subclass (its name, what it may be used for, how a text line, a Python
value and record bytes become each other in Python and in Spark, a key's logical value, a published
changelog's schema and encoder), listed once in ``_codecs``; nothing outside this package asks which
format a topic has (``tests/test_format_module.py`` adds one that way and greps for the rest).

- ``string``, ``bytes``, ``json`` (:mod:`.plain`): the record's bytes are the value;
- ``avro`` (:mod:`.avro`), ``protobuf`` (:mod:`.protobuf`), ``json_schema`` (:mod:`.json_schema`):
  framed by a Schema Registry (:mod:`.framing`: magic byte, schema id, Protobuf's message indexes),
  read with the writer schema the frame names into the topic's reader schema (the subject's latest
  version when the command or job started, the topic name strategy's ``<topic>-key`` /
  ``<topic>-value`` unless the topic names a ``subject``). The registry is asked once per command
  (:mod:`spark_jobs.seams.schema_registry`); a schema id is fetched once and cached.

In Spark the registry formats decode on the executors (the JVM functions of ``java/``), and every
record either decodes or says why not (:meth:`Codec.problem`: no magic byte, unknown schema id, a
schema of another subject, truncated bytes): those go to quarantine with their offset and the reason,
never into a join as a row of nulls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.config import PipelineConfig, TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.formats import framing
from spark_jobs.formats.codec import Codec, DecodeError, TextError
from spark_jobs.seams.schema_registry import Registry, connect_registry
from spark_jobs.seams.storage import Root

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = [
    "Codec",
    "DecodeError",
    "Formats",
    "LogicalKeys",
    "TextError",
    "codec_class",
    "format_names",
    "unregistered_codecs",
]


class Formats:
    """The codecs of one pipeline's topics for one command or job (made when first asked, and kept:
    the reader schemas stay the ones the command started with). ``kafka_name`` gives a topic's name
    on Kafka (the topic name strategy's subjects use it); the registry is connected to only when a
    topic uses a registry format, and asked once whether it answers."""

    def __init__(
        self,
        config: PipelineConfig,
        root: Root | Path,
        kafka_name: Callable[[str], str] | None = None,
        registry: Registry | None = None,
    ):
        from spark_jobs.seams.kafka import topic_prefix

        prefix = topic_prefix(config)
        self.config, self.root = config, root
        self.kafka_name = kafka_name or (lambda name: prefix + name)
        self._registry = registry
        self._checked = False
        self._codecs: dict[tuple[str, str], Codec] = {}

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = connect_registry(self.config, self.root)
        if not self._checked:
            self._registry.check()
            self._checked = True
        return self._registry

    def needs_registry(self, topics: Iterable[str] | None = None) -> bool:
        """Whether any of ``topics`` (default: the pipeline's) is in a registry format."""
        names = self.config.topics if topics is None else topics
        return any(self.config.topic(name).registered for name in names)

    def check(self, topics: Iterable[str] | None = None, reading: bool = False) -> None:
        """Reach the registry now when one of ``topics`` (default: any of the pipeline's) needs
        it: a one-line error before any work starts (before Spark, before Kafka is read).
        ``reading``: the command reads the topics, so each registry part's subject must have a schema
        now too (a writer may register the first one)."""
        names = list(self.config.topics if topics is None else topics)
        if not self.needs_registry(names):
            return
        _ = self.registry
        if not reading:
            return
        for name in names:
            for part in ("key", "value"):
                if codec_class(self.config.topic(name).format_of(part)).registered:
                    self.codec(name, part)

    def writing(self, topic: str, part: str, schema: Path | None) -> Codec:
        """The codec of ``topic``'s ``key`` or ``value`` for writing records: with ``schema`` (a
        file; else the topic's declared ``schema:`` file, if any) registered under the subject and
        written with, else with the subject's latest version."""
        spec = self.config.topic(topic)
        schema = schema or spec.schema_file_of(part)
        fmt = spec.format_of(part)
        if schema is not None and not codec_class(fmt).registered:
            raise UserError(f"topics.{topic}.{part} is {fmt}: a schema file is for the registry formats")
        if schema is None:
            return self.codec(topic, part)
        try:
            text = Path(schema).read_text()
        except OSError as exc:
            raise UserError(f"{schema}: cannot read the schema file: {exc.strerror}") from None
        subject = spec.subject_of(part, self.kafka_name(topic))
        if self.registry.latest(subject) is None:  # a new subject: the file is its first version
            self.registry.register(subject, codec_class(fmt).schema_type, text)
        codec = self.codec(topic, part)
        codec.write_with(text)  # type: ignore[attr-defined]
        return codec

    def publisher(self, topic: str, value_type: Any) -> Callable[[Column], Column]:
        """How a published changelog's values are written: a function from the row's struct (of
        Spark type ``value_type``) to the record bytes. JSON: the row as a JSON object. A registry
        format: its schema derived from ``value_type`` (Avro by Spark's own type mapping, JSON Schema
        from the struct's fields), registered under the topic's value subject now (a schema the
        registry's compatibility rules refuse is one line with the subject and its reason, before
        anything is written), the row encoded by Spark (``to_avro``, ``to_json``) behind the frame."""
        cls = codec_class(self.config.topic(topic).value_format)
        if not cls.registered:
            return cls.row_encoder(None, None)
        subject = self.config.topic(topic).subject_of("value", self.kafka_name(topic))
        registered = self.registry.latest(subject)
        text = cls.derive_schema(value_type, topic, registered.text if registered else None)
        schema_id = self.registry.register(subject, cls.schema_type, text)
        return cls.row_encoder(schema_id, text)

    def codec(self, topic: str, part: str) -> Codec:
        """The codec of ``topic``'s ``key`` or ``value``."""
        if (topic, part) not in self._codecs:
            spec = self.config.topic(topic)
            cls = codec_class(spec.format_of(part))
            where = f"topics.{topic}.{part}"
            if cls.registered:
                subject = spec.subject_of(part, self.kafka_name(topic))
                message = spec.message_of(part)  # protobuf's only (the config refuses it elsewhere)
                options = {"message": message} if message else {}
                self._codecs[(topic, part)] = cls(where, self.registry, subject, **options)  # type: ignore[call-arg]
            else:
                self._codecs[(topic, part)] = cls(where)
        return self._codecs[(topic, part)]


class LogicalKeys:
    """Framed keys of any topic as their logical value, for a command that reads topics without a
    pipeline's declarations (``lake diagnose``): a record's frame names its schema id, and the key is
    read as a topic of that id's subject would read it, into the subject's latest version
    (:mod:`.logical`, the value the joins compare). None for a key that is not framed or does not
    decode."""

    def __init__(self, registry: Registry | None):
        self.registry = registry
        self._codecs: dict[int, Any] = {}

    def __call__(self, raw: bytes) -> bytes | None:
        if self.registry is None:
            return None
        try:
            schema_id, _ = framing.split(raw)
        except framing.NotFramed:
            return None
        if schema_id not in self._codecs:
            self._codecs[schema_id] = self._codec_of(schema_id)
        codec = self._codecs[schema_id]
        return None if codec is None else codec.logical_value(raw)

    def _codec_of(self, schema_id: int) -> Any:
        assert self.registry is not None
        found = self.registry.schema(schema_id)
        subjects = self.registry.subjects_of(schema_id) if found is not None else []
        cls = schema_format(found.schema_type) if found is not None else None
        if cls is None or not subjects:
            return None
        try:
            return cls(f"schema id {schema_id}", self.registry, subjects[0])  # type: ignore[call-arg]
        except UserError:
            return None


def codec_class(fmt: str) -> type[Codec]:
    """The codec of the format named ``fmt`` (a name the pipeline file's validation accepted)."""
    return {c.name: c for c in _codecs()}[fmt]


def format_names(part: str | None = None, publishing: bool = False) -> list[str]:
    """The formats' names: those a topic's ``part`` (``key``, ``value``) may use, or those a join's
    changelog may be published in."""
    return [
        c.name for c in _codecs() if (part is None or part in c.parts) and (c.publishes or not publishing)
    ]


def unregistered_codecs(spec: TopicSpec) -> tuple[Codec, Codec]:
    """A topic's key and value codecs where neither is a registry format (no registry to ask);
    :class:`ValueError` for a topic that needs one (give :meth:`Formats.writing`'s)."""
    if spec.registered:
        raise ValueError(f"topic {spec.name} uses a Schema Registry format: give its codecs")
    return codec_class(spec.key_format)(f"topics.{spec.name}.key"), codec_class(spec.value_format)(
        f"topics.{spec.name}.value"
    )


def schema_format(schema_type: str) -> type[Codec] | None:
    """The registry format of the Schema Registry's ``schemaType`` (``AVRO``, ``PROTOBUF``,
    ``JSON``); None for a type the product does not read."""
    return next((c for c in _codecs() if c.registered and c.schema_type == schema_type), None)


def _codecs() -> list[type[Codec]]:
    from spark_jobs.formats.avro import AvroCodec
    from spark_jobs.formats.json_schema import JsonSchemaCodec
    from spark_jobs.formats.plain import BytesCodec, JsonCodec, StringCodec
    from spark_jobs.formats.protobuf import ProtobufCodec

    return [JsonCodec, StringCodec, BytesCodec, AvroCodec, ProtobufCodec, JsonSchemaCodec]
