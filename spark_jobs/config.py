"""The configuration seam: load and validate a pipeline YAML file into typed dataclasses.

Every error names the file, the key path and (where known) the line, e.g.
``pipelines/demo.yaml:7: topics.customer_consents.partitions: must be a positive integer, got 'four'``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from spark_jobs.errors import UserError
from spark_jobs.join_kinds import KINDS, JoinKind
from spark_jobs.layout import LOOKUP_PREFIX, OWNED, SYSTEM_TABLES, is_reserved

DEFAULT_CONFIG = "demo.yaml"
# what a backfill dump's value text is (a dump's own setting, not a topic's record format)
DUMP_VALUES = ("string", "json")
# the registry client's settings that pass through (confluent-kafka's names)
REGISTRY_SETTINGS = (
    "basic.auth.user.info",
    "basic.auth.credentials.source",
    "bearer.auth.credentials.source",
    "bearer.auth.token",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "timeout",
)
# librdkafka's names (kcat's -X partitioner=...); "murmur2" is kept as an alias of murmur2_random
PARTITIONERS = ("murmur2_random", "murmur2", "consistent_random")
TOP_LEVEL_KEYS = (
    "pipeline",
    "description",
    "kafka",
    "topics",
    "lookups",
    "joins",
    "quality",
    "airflow",
    "metrics",
)
MAX_PARTITIONS = 10_000  # far above any real topic; a broker asked for millions would not answer
KAFKA_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{0,200}$")
ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
FIELD_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
COLUMN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
WINDOW_RE = re.compile(
    r"^\s*(\d+)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?|d|days?)\s*$", re.I
)
WINDOW_UNITS_MS = {"ms": 1, "mi": 1, "s": 1000, "se": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
DUMP_FORMATS = ("lines", "csv", "jsonl")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,199}$")


@dataclass(frozen=True)
class TopicSpec:
    """A Kafka-shaped topic: the facts producers and joins must agree on."""

    name: str
    partitions: int
    key_format: str = "string"
    value_format: str = "json"
    partitioner: str = "murmur2"
    compacted: bool = False  # lookup topics and join changelogs: cleanup.policy=compact
    # registry formats: the subject of the key's / value's schema (None: the topic name strategy,
    # ``<kafka topic>-key`` / ``-value``) and a schema file (``lake produce`` registers it; the test
    # driver reads it instead of a registry)
    key_subject: str | None = None
    value_subject: str | None = None
    key_schema: Path | None = None
    value_schema: Path | None = None
    # protobuf: the full name of the topic's message (None: the reader schema's first message)
    key_message: str | None = None
    value_message: str | None = None

    def format_of(self, part: str) -> str:
        """The format of the record's ``key`` or ``value``."""
        return self.key_format if part == "key" else self.value_format

    def subject_of(self, part: str, kafka_name: str) -> str:
        """The registry subject of the ``key`` or ``value`` schema, for the topic's Kafka name."""
        named = self.key_subject if part == "key" else self.value_subject
        return named or f"{kafka_name}-{part}"

    def schema_file_of(self, part: str) -> Path | None:
        return self.key_schema if part == "key" else self.value_schema

    def message_of(self, part: str) -> str | None:
        return self.key_message if part == "key" else self.value_message

    @property
    def registered(self) -> bool:
        """Does the key or the value use a Schema Registry format?"""
        from spark_jobs.formats import codec_class

        return codec_class(self.key_format).registered or codec_class(self.value_format).registered


@dataclass(frozen=True)
class RegistrySpec:
    """A Confluent-compatible Schema Registry (Confluent's, Apicurio's ``/apis/ccompat/v7``,
    Karapace, Redpanda): its ``url`` and client ``settings`` (``basic.auth.user.info``, TLS files;
    ``${NAME}`` read from the environment)."""

    url: str
    settings: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class KafkaSpec:
    """Where the pipeline's topics live. Without ``bootstrap_servers`` the product uses
    ``$LAKE_KAFKA_BOOTSTRAP``, else the embedded broker of the lake root (``lake kafka start``).
    ``settings`` are client settings passed through unchanged (librdkafka's names:
    ``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``ssl.ca.location``, ...);
    ``${NAME}`` in a value is read from the environment, so secrets stay out of the file."""

    bootstrap_servers: str | None = None
    settings: dict[str, str] = field(default_factory=dict)
    topic_prefix: str = ""  # Kafka topic = prefix + declared name (environments sharing a cluster)
    # None: $LAKE_SCHEMA_REGISTRY_URL, else the lake root's embedded registry (lake registry start)
    schema_registry: RegistrySpec | None = None


@dataclass(frozen=True)
class BackfillSpec:
    """How a dump becomes records of a lookup's topic."""

    source: Path | None  # default dump (``--from`` overrides)
    format: str = "lines"  # lines: ``key SEP value`` | csv (with header) | jsonl
    separator: str = ";"  # lines: the key separator (the first one splits)
    key_field: str = "key"  # csv / jsonl: the field holding the key
    value_field: str = "value"  # csv / jsonl: the field holding the value
    value_format: str = "string"  # json: the dump's value is JSON text | string: plain text
    value: dict[str, str] | None = None  # topic value = JSON object of field -> Spark SQL expression

    @property
    def json_values(self) -> bool:
        """The dump's value text is JSON (the dump's own setting, not a topic's record format)."""
        return self.value_format == "json"


@dataclass(frozen=True)
class LookupSpec:
    """A compacted topic read as a table: the latest value per key, tombstones delete."""

    name: str
    topic: str
    joined_with: tuple[str, ...]  # topics it is joined with (their partitioner is the default)
    backfill: BackfillSpec


@dataclass(frozen=True)
class QualitySpec:
    suites: dict[str, Path]  # suite name -> suite file (expectations/*.yaml)


@dataclass(frozen=True)
class AirflowSpec:
    """How the pipeline's DAGs run (docs/airflow.md). Schedules are cron expressions, presets such
    as ``@daily``, or ``null`` for manual runs only."""

    schedule: str | None = "@daily"  # the pipeline DAG: backfill -> quality gate -> joins
    quality_schedule: str | None = "@hourly"  # the quality DAG (also runs when a lookup changes)
    health_schedule: str | None = "*/15 * * * *"  # the streams DAG's health check
    # health fails when a join's input topic has more records (offsets) it has not processed
    max_records_behind: int = 10_000
    owner: str = "data-platform"
    retries: int = 2  # Spark tasks; the delay doubles from retry_delay_seconds on each retry
    retry_delay_seconds: int = 60
    spark_conn_id: str = "lake_spark"  # the Airflow connection naming the Spark master
    paused_at_creation: bool = True  # the pipeline and streams DAGs (they start jobs)


@dataclass(frozen=True)
class MetricsSpec:
    """Where the pipeline's long-running jobs serve their Prometheus metrics (docs/operating.md):
    ``port`` 0 gives each job a free port (``lake status --json`` shows its ``metrics_url``); a fixed
    port gives the ingest that one and the joins the next ones, in the file's order."""

    host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True)
class JoinSpec:
    """A continuous join of two topics, or a lookup derived from one (docs/joins.md)."""

    name: str
    kind: str  # a name of spark_jobs.join_kinds.KINDS
    left: str
    right: str | None  # None for derive (one master topic)
    type: str  # inner | left | outer (as the kind allows)
    select: dict[str, str]  # output column -> Spark SQL expression over left.<field> / right.<field>
    where: dict[str, str]  # output column -> "file:line: joins.<name>.select.<column>" for errors
    window_ms: int | None = None  # stream-stream: |left.timestamp - right.timestamp| <= window
    publish: str | None = None  # topic receiving the result changelog, if any
    # fk: the foreign key; derive: the derived key; list: the list -- each a Spark SQL expression
    # over ``left`` (a bare field path such as ``merchant_id`` or ``address.id`` is read from the JSON)
    by: str | None = None
    element_id: str | None = None  # list: the id's path inside object elements (scalars: the element)
    elements: dict[str, str] = field(default_factory=dict)  # list: column -> expr over element/right
    list_as: str = "elements"  # list: the enriched list's column
    # the keyed kinds: a continuous run writes the result table behind the changelog topic, at most
    # this often (seconds; 0: every micro-batch writes it). ``lake run --table-every`` overrides it.
    table_every: float = 0.0
    # the changelog's value format: json, or a Schema Registry format whose schema the product derives
    # from the select and registers under the changelog topic's value subject
    publish_format: str = "json"
    # stream-table: hold each event until the stream's time (its largest event timestamp read) has
    # passed the event's timestamp by this much (KIP-923); None: decide once the table side has
    grace_ms: int | None = None
    # the consumer group the join's finished offsets are committed to, for Kafka's own tools: "" the
    # default (lake.<pipeline>.<join>, PipelineConfig.consumer_group), None none (consumer_group: false)
    consumer_group: str | None = ""
    # the topic every record the join does not use is also written to (KIP-1034's dead-letter queue),
    # with the batch that quarantines it; None: the quarantine table only
    dead_letter_topic: str | None = None

    @property
    def job(self) -> str:
        return f"join:{self.name}"

    @property
    def join_kind(self) -> JoinKind:
        return KINDS[self.kind]

    @property
    def sides(self) -> tuple[tuple[str, str], ...]:
        """``(side, topic)`` of every input."""
        if self.right is None:
            return (("left", self.left),)
        return (("left", self.left), ("right", self.right))


@dataclass(frozen=True)
class PipelineConfig:
    source: str
    name: str
    description: str = ""
    kafka: KafkaSpec = field(default_factory=KafkaSpec)
    topics: dict[str, TopicSpec] = field(default_factory=dict)
    lookups: dict[str, LookupSpec] = field(default_factory=dict)
    quality: QualitySpec = field(default_factory=lambda: QualitySpec({}))
    joins: dict[str, JoinSpec] = field(default_factory=dict)
    airflow: AirflowSpec = field(default_factory=AirflowSpec)
    metrics: MetricsSpec | None = field(default_factory=MetricsSpec)  # None: ``metrics: false``

    def _declared(self, kind: str, items: dict[str, Any], name: str) -> Any:
        try:
            return items[name]
        except KeyError:
            known = ", ".join(sorted(items)) or "none"
            raise UserError(
                f"unknown {kind} '{name}': not declared in {self.source} (declared: {known})"
            ) from None

    def topic(self, name: str) -> TopicSpec:
        return self._declared("topic", self.topics, name)

    def lookup(self, name: str) -> LookupSpec:
        return self._declared("lookup", self.lookups, name)

    def join(self, name: str) -> JoinSpec:
        return self._declared("join", self.joins, name)

    def consumer_group(self, spec: JoinSpec) -> str | None:
        """The consumer group that shows the join's position to Kafka's tools (None: turned off)."""
        if spec.consumer_group == "":
            return f"lake.{self.name}.{spec.name}"
        return spec.consumer_group

    def metrics_port(self, join: str | None = None) -> int:
        """The port a job serves its metrics on: ``join``'s, or the ingest's (None); 0 any free one."""
        if self.metrics is None or not self.metrics.port:
            return 0
        return self.metrics.port + (0 if join is None else 1 + list(self.joins).index(join))

    def lookup_partitioner(self, lookup: LookupSpec) -> str:
        """The partitioner a backfill uses by default: the one of the topics it is joined with."""
        first = lookup.joined_with[0] if lookup.joined_with else lookup.topic
        return self.topics[first].partitioner


def bundled_config_path(name: str = DEFAULT_CONFIG) -> Path:
    return Path(__file__).parent / "demo" / "pipelines" / name


def bundled_pipelines() -> list[Path]:
    """Every pipeline file shipped in the package, the demo's first."""
    folder = bundled_config_path().parent
    return sorted(folder.glob("*.yaml"), key=lambda p: (p.name != DEFAULT_CONFIG, p.name))


def pipeline_files(config: str | None = None) -> list[Path]:
    """The pipelines Airflow shows (and ``lake report --all`` reports on): the ``--config``
    pipeline, else ``$LAKE_PIPELINES``, else the ``$LAKE_CONFIG`` pipeline, else every bundled one."""
    listed = os.environ.get("LAKE_PIPELINES")
    if config:
        return [resolve_config_path(config).absolute()]
    if listed:
        return [Path(p).absolute() for p in listed.split(os.pathsep) if p]
    if os.environ.get("LAKE_CONFIG"):
        return [resolve_config_path().absolute()]
    return bundled_pipelines()


def resolve_config_path(path: str | os.PathLike[str] | None = None) -> Path:
    """``--config`` wins, then ``LAKE_CONFIG``, then the bundled demo pipeline."""
    chosen = path or os.environ.get("LAKE_CONFIG")
    return Path(chosen) if chosen else bundled_config_path()


class LocatedYaml:
    """YAML loaded together with the line of every key path, for error messages."""

    def __init__(self, source: str, text: str):
        self.source = source
        self.lines: dict[tuple[str, ...], int] = {}
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UserError(f"{source}{where}: not valid YAML: {problem}") from None
        self.data = self._convert(node, ()) if node is not None else None

    def _convert(self, node: yaml.Node, path: tuple[str, ...]) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if key in out:
                    raise UserError(
                        f"{self.source}:{key_node.start_mark.line + 1}: "
                        f"{'.'.join((*path, key))}: duplicate key"
                    )
                self.lines[(*path, key)] = key_node.start_mark.line + 1
                out[key] = self._convert(value_node, (*path, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._convert(v, (*path, str(i))) for i, v in enumerate(node.value)]
        return _scalar(node)

    def where(self, path: tuple[str, ...]) -> str:
        """``file:line: key.path`` of a key path (the nearest enclosing one that has a line)."""
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        place = f"{self.source}:{line}" if line else self.source
        return f"{place}: {'.'.join(path) if path else '(top level)'}"

    def error(self, path: tuple[str, ...], message: str) -> UserError:
        return UserError(f"{self.where(path)}: {message}")


def _scalar(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node)
    finally:
        loader.dispose()


def read_located(path: str | os.PathLike[str]) -> LocatedYaml:
    """A YAML file with line numbers for error messages (used for suite files too)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    return LocatedYaml(str(path), text)


def load_config(path: str | os.PathLike[str] | None = None) -> PipelineConfig:
    """Load and validate a pipeline file (docs/configuration.md)."""
    cfg_path = resolve_config_path(path)
    source = str(cfg_path)
    try:
        text = cfg_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{source}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{source}: cannot read config: {exc}") from None
    doc = LocatedYaml(source, text)
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error((), "the file must be a mapping with a 'topics:' section")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise doc.error((key,), f"unknown top-level key (allowed: {', '.join(TOP_LEVEL_KEYS)})")
    name = data.get("pipeline", cfg_path.stem)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise doc.error(("pipeline",), f"must be a name of letters, digits, '_', '-' or '.', got {name!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise doc.error(("description",), "must be a string")
    topics_raw = data.get("topics")
    if not isinstance(topics_raw, dict) or not topics_raw:
        raise doc.error(("topics",), "must be a non-empty mapping of topic name to its settings")
    base = cfg_path.parent
    topics = {t: _topic(doc, t, spec, base) for t, spec in topics_raw.items()}
    lookups_raw = data.get("lookups") or {}
    if not isinstance(lookups_raw, dict):
        raise doc.error(("lookups",), "must be a mapping of lookup name to its settings")
    lookups = {n: _lookup(doc, n, spec, topics, base) for n, spec in lookups_raw.items()}
    for lookup in lookups.values():  # a lookup topic is a table: compacted, like Kafka Streams' tables
        topics[lookup.topic] = replace(topics[lookup.topic], compacted=True)
    quality = _quality(doc, data.get("quality") or {}, base)
    joins_raw = data.get("joins") or {}
    if not isinstance(joins_raw, dict):
        raise doc.error(("joins",), "must be a mapping of join name to its settings")
    from spark_jobs.formats import codec_class

    joins = {}
    for join_name, spec in joins_raw.items():
        join = _join(doc, join_name, spec, topics, lookups)
        if join.publish:
            left = topics[join.left]
            # the changelog's key is the result's: the left key as the join compares it (a framed left
            # key decoded: its text, or a composite key's JSON)
            key_format = "bytes" if codec_class(left.key_format).registered else left.key_format
            topics[join.publish] = TopicSpec(
                join.publish, left.partitions, key_format, join.publish_format, "murmur2", compacted=True
            )
        if join.dead_letter_topic:  # the records as they came: their own bytes, keyed as they were
            if join.dead_letter_topic in topics:
                raise doc.error(
                    ("joins", join_name, "dead_letter_topic"),
                    f"topic '{join.dead_letter_topic}' is declared or used already; each join needs its own",
                )
            topics[join.dead_letter_topic] = TopicSpec(
                join.dead_letter_topic, topics[join.left].partitions, "bytes", "bytes"
            )
        joins[join_name] = join
    airflow = _airflow(doc, data.get("airflow") or {})
    kafka = _kafka(doc, data.get("kafka") or {})
    metrics = _metrics(doc, data.get("metrics", {}), len(joins))
    return PipelineConfig(source, name, description, kafka, topics, lookups, quality, joins, airflow, metrics)


def _kafka(doc: LocatedYaml, raw: Any) -> KafkaSpec:
    if not isinstance(raw, dict):
        raise doc.error(("kafka",), "must be a mapping: bootstrap_servers, topic_prefix and client settings")
    bootstrap = raw.get("bootstrap_servers")
    if bootstrap is not None:
        bootstrap = text_value(doc, ("kafka", "bootstrap_servers"), bootstrap)
        for server in bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise doc.error(
                    ("kafka", "bootstrap_servers"), f"must be HOST:PORT[,HOST:PORT...], got {bootstrap!r}"
                )
    prefix = raw.get("topic_prefix", "")
    if not isinstance(prefix, str) or not KAFKA_TOPIC_RE.match(prefix):
        raise doc.error(
            ("kafka", "topic_prefix"), f"must be letters, digits, '.', '_' or '-', got {prefix!r}"
        )
    settings: dict[str, str] = {}
    for key, value in raw.items():
        if key in ("bootstrap_servers", "topic_prefix", "schema_registry"):
            continue
        path = ("kafka", key)
        if key in ("bootstrap.servers", "partitioner", "transactional.id", "group.id"):
            raise doc.error(path, "is set by the product (use bootstrap_servers for the cluster)")
        settings[key] = _setting(doc, path, value)
    registry = None if raw.get("schema_registry") is None else _registry(doc, raw["schema_registry"])
    return KafkaSpec(bootstrap, settings, prefix, registry)


def _setting(doc: LocatedYaml, path: tuple[str, ...], value: Any) -> str:
    """A client setting's value as text, with ``${NAME}`` read from the environment."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    if not isinstance(value, (str, int, float)):
        raise doc.error(path, f"must be a string or number (a client setting), got {value!r}")
    text = str(value)
    for ref in ENV_REF_RE.findall(text):
        if ref not in os.environ:
            raise doc.error(path, f"refers to ${{{ref}}}, which is not set in the environment")
    return ENV_REF_RE.sub(lambda m: os.environ[m.group(1)], text)


def _registry(doc: LocatedYaml, raw: Any) -> RegistrySpec:
    path = ("kafka", "schema_registry")
    raw = mapping(doc, path, raw, ("url", *REGISTRY_SETTINGS))
    if "url" not in raw:
        raise doc.error((*path, "url"), "is required (e.g. http://registry:8081)")
    url = _setting(doc, (*path, "url"), raw["url"])
    for one in url.split(","):
        if not re.match(r"^(https?|mock)://[^\s/]+", one.strip()):
            raise doc.error((*path, "url"), f"must be http(s)://HOST[:PORT][/PATH][,...], got {url!r}")
    settings = {k: _setting(doc, (*path, k), v) for k, v in raw.items() if k != "url"}
    return RegistrySpec(url, settings)


GROUP_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")


def mapping(doc: LocatedYaml, path: tuple[str, ...], value: Any, allowed: tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise doc.error(path, "must be a mapping")
    for key in value:
        if key not in allowed:
            raise doc.error((*path, key), f"unknown setting (allowed: {', '.join(allowed)})")
    return value


def choice(doc: LocatedYaml, path: tuple[str, ...], value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise doc.error(path, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


def text_value(doc: LocatedYaml, path: tuple[str, ...], value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise doc.error(path, f"must be a non-empty string, got {value!r}")
    return value


def _lookup(doc: LocatedYaml, name: str, spec: Any, topics: dict[str, TopicSpec], base: Path) -> LookupSpec:
    path = ("lookups", name)
    if not NAME_RE.match(name):
        raise doc.error(path, "lookup names use letters, digits, '_', '-' or '.'")
    spec = mapping(doc, path, spec, ("topic", "joined_with", "backfill"))
    topic = spec.get("topic")
    if topic not in topics:
        raise doc.error((*path, "topic"), f"must name a declared topic, got {topic!r}")
    joined = spec.get("joined_with", [])
    if isinstance(joined, str):
        joined = [joined]
    if not isinstance(joined, list):
        raise doc.error((*path, "joined_with"), "must be a list of topic names")
    for i, other in enumerate(joined):
        if other not in topics:
            raise doc.error((*path, "joined_with", str(i)), f"must name a declared topic, got {other!r}")
    bf_path = (*path, "backfill")
    bf = mapping(
        doc,
        bf_path,
        spec.get("backfill", {}),
        ("source", "format", "separator", "key_field", "value_field", "value_format", "value"),
    )
    source = bf.get("source")
    if source is not None:
        source = (base / text_value(doc, (*bf_path, "source"), source)).resolve()
    fmt = choice(doc, (*bf_path, "format"), bf.get("format", "lines"), DUMP_FORMATS)
    sep = text_value(doc, (*bf_path, "separator"), bf.get("separator", ";"))
    value_format = choice(doc, (*bf_path, "value_format"), bf.get("value_format", "string"), DUMP_VALUES)
    value = bf.get("value")
    if value is not None:
        value = mapping(doc, (*bf_path, "value"), value, tuple(value))
        for field_name, expr in value.items():
            text_value(doc, (*bf_path, "value", field_name), expr)
    backfill = BackfillSpec(
        source,
        fmt,
        sep,
        text_value(doc, (*bf_path, "key_field"), bf.get("key_field", "key")),
        text_value(doc, (*bf_path, "value_field"), bf.get("value_field", "value")),
        value_format,
        value,
    )
    return LookupSpec(name, topic, tuple(joined), backfill)


def _quality(doc: LocatedYaml, raw: Any, base: Path) -> QualitySpec:
    raw = mapping(doc, ("quality",), raw, ("suites",))
    suites_raw = raw.get("suites", {})
    if not isinstance(suites_raw, dict):
        raise doc.error(("quality", "suites"), "must be a mapping of suite name to its file")
    suites = {}
    for name, file in suites_raw.items():
        path = ("quality", "suites", name)
        if not NAME_RE.match(name):
            raise doc.error(path, "suite names use letters, digits, '_', '-' or '.'")
        suites[name] = (base / text_value(doc, path, file)).resolve()
    return QualitySpec(suites)


def _metrics(doc: LocatedYaml, raw: Any, jobs: int) -> MetricsSpec | None:
    if raw is False:
        return None
    raw = mapping(doc, ("metrics",), {} if raw is True or raw is None else raw, ("host", "port"))
    host = text_value(doc, ("metrics", "host"), raw.get("host", MetricsSpec.host))
    port = raw.get("port", 0)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535 - jobs:
        raise doc.error(
            ("metrics", "port"),
            f"must be a port number (0: a free port per job; the ingest takes it and the {jobs} join(s) "
            f"the next ones, so at most {65535 - jobs}), got {port!r}",
        )
    return MetricsSpec(host, port)


def _airflow(doc: LocatedYaml, raw: Any) -> AirflowSpec:
    defaults = AirflowSpec()
    if isinstance(raw, dict) and "max_versions_behind" in raw:
        raise doc.error(
            ("airflow", "max_versions_behind"),
            "is now max_records_behind: the joins read Kafka, and health counts the records they have "
            "not processed, not bronze versions",
        )
    raw = mapping(doc, ("airflow",), raw, tuple(AirflowSpec.__dataclass_fields__))
    values: dict[str, Any] = {}
    for key, value in raw.items():
        path = ("airflow", key)
        default = getattr(defaults, key)
        if key.endswith("schedule"):
            if value is not None:
                value = text_value(doc, path, value)
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise doc.error(path, f"must be true or false, got {value!r}")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise doc.error(path, f"must be a non-negative integer, got {value!r}")
        else:
            value = text_value(doc, path, value)
        values[key] = value
    return AirflowSpec(**values)


# the names the lake keeps for its own tables, which no topic or join may take
RESERVED = f"({', '.join(SYSTEM_TABLES)}, {LOOKUP_PREFIX}<name>, <join>{OWNED}<state>); choose another"


def _topic(doc: LocatedYaml, name: str, spec: Any, base: Path) -> TopicSpec:
    path = ("topics", name)
    if not NAME_RE.match(name):
        raise doc.error(path, "topic names use letters, digits, '_', '-' or '.'")
    if is_reserved(name):
        raise doc.error(
            path, f"'{name}' would share its bronze table's name with the lake's own tables {RESERVED}"
        )
    if not isinstance(spec, dict):
        raise doc.error(path, "must be a mapping with at least 'partitions'")
    allowed = ("partitions", "key", "value", "partitioner")
    for key in spec:
        if key not in allowed:
            raise doc.error((*path, key), f"unknown setting (allowed: {', '.join(allowed)})")
    partitions = spec.get("partitions")
    if partitions is None:
        raise doc.error((*path, "partitions"), "is required")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise doc.error((*path, "partitions"), f"must be a positive integer, got {partitions!r}")
    if partitions > MAX_PARTITIONS:
        raise doc.error(
            (*path, "partitions"),
            f"must be at most {MAX_PARTITIONS:,} (a Kafka topic's partitions), got {partitions:,}",
        )
    key_format, key_subject, key_schema, key_message = _record_format(
        doc, (*path, "key"), spec.get("key", "string"), base
    )
    value_format, value_subject, value_schema, value_message = _record_format(
        doc, (*path, "value"), spec.get("value", "json"), base
    )
    partitioner = spec.get("partitioner", "murmur2")
    if partitioner not in PARTITIONERS:
        raise doc.error(
            (*path, "partitioner"), f"must be one of {', '.join(PARTITIONERS)}, got {partitioner!r}"
        )
    partitioner = "murmur2" if partitioner == "murmur2_random" else partitioner
    return TopicSpec(
        name,
        partitions,
        key_format,
        value_format,
        partitioner,
        key_subject=key_subject,
        value_subject=value_subject,
        key_schema=key_schema,
        value_schema=value_schema,
        key_message=key_message,
        value_message=value_message,
    )


def _record_format(
    doc: LocatedYaml, path: tuple[str, ...], raw: Any, base: Path
) -> tuple[str, str | None, Path | None, str | None]:
    """A topic's ``key:`` or ``value:``: a format name, or ``{format, subject, schema, message}`` for
    the registry formats. Returns the format, the subject (None: the topic name strategy), the schema
    file (resolved against the pipeline file's folder) and, for protobuf, the topic's message (None:
    the schema's first)."""
    from spark_jobs.formats import codec_class, format_names

    allowed = format_names(path[-1])
    settings = (
        mapping(doc, path, raw, ("format", "subject", "schema", "message"))
        if isinstance(raw, dict)
        else {"format": raw}
    )
    fmt = settings.get("format")
    if fmt not in allowed:
        raise doc.error(path, f"must be one of {', '.join(allowed)}, got {fmt!r}")
    codec = codec_class(fmt)
    if not codec.registered:
        if len(settings) > 1:
            registered = [name for name in format_names() if codec_class(name).registered]
            raise doc.error(
                path, f"subject and schema are for the registry formats ({', '.join(registered)})"
            )
        return fmt, None, None, None
    message = settings.get("message")
    if message is not None:
        if not codec.named_messages:
            named = " or ".join(name for name in format_names() if codec_class(name).named_messages)
            raise doc.error((*path, "message"), f"names a Protobuf message: it is for the {named} format")
        message = text_value(doc, (*path, "message"), message)
    subject = settings.get("subject")
    if subject is not None:
        subject = text_value(doc, (*path, "subject"), subject)
    schema = None
    if settings.get("schema") is not None:
        schema = (base / text_value(doc, (*path, "schema"), settings["schema"])).resolve()
        if schema.suffix not in codec.schema_suffixes:
            raise doc.error(
                (*path, "schema"),
                f"a {fmt} schema file ends in {' or '.join(codec.schema_suffixes)}, got {schema.name}",
            )
        if not schema.is_file():
            raise doc.error((*path, "schema"), f"{schema}: no such file")
    return fmt, subject, schema, message


def window_ms(doc: LocatedYaml, path: tuple[str, ...], value: Any) -> int:
    """``10 minutes``, ``30 s``, ``1 hour``, ``500 ms`` -> milliseconds (> 0)."""
    match = WINDOW_RE.match(str(value)) if isinstance(value, (str, int)) else None
    if not match or int(match.group(1)) <= 0:
        raise doc.error(
            path, f"must be a positive duration such as '10 minutes' or '30 seconds', got {value!r}"
        )
    unit = match.group(2).lower()
    factor = WINDOW_UNITS_MS[unit[:2]] if unit[:2] in WINDOW_UNITS_MS else WINDOW_UNITS_MS[unit[0]]
    return int(match.group(1)) * factor


def _join(
    doc: LocatedYaml, name: str, spec: Any, topics: dict[str, TopicSpec], lookups: dict[str, LookupSpec]
) -> JoinSpec:
    path = ("joins", name)
    _join_name(doc, path, name, topics)
    if not isinstance(spec, dict):
        raise doc.error(path, "must be a mapping")
    kind = choice(doc, (*path, "kind"), spec.get("kind"), tuple(KINDS))
    info = KINDS[kind]
    every = tuple(dict.fromkeys(k for other in KINDS.values() for k in other.settings))
    common = ("kind", "left", "type", "select", "publish", "consumer_group", "dead_letter_topic")
    spec = mapping(doc, path, spec, (*common, *every))
    for key in spec:
        if key in every and key not in info.settings:
            kinds = ", ".join(k.name for k in KINDS.values() if key in k.settings)
            raise doc.error((*path, key), f"applies to {kinds} joins only, not {kind}")
    sides: dict[str, str | None] = {"right": None}
    for side in ("left", "right") if info.has_right else ("left",):
        topic = spec.get(side)
        if topic not in topics:
            raise doc.error((*path, side), f"must name a declared topic, got {topic!r}")
        sides[side] = topic
    if sides["left"] == sides["right"]:
        raise doc.error((*path, "right"), "must be a different topic than left")
    join_type = choice(doc, (*path, "type"), spec.get("type", info.types[0]), info.types)
    lists = info.keyed_by == "list"
    select, where = _expressions(
        doc, path, "select", spec.get("select"), info.meta_columns, f"every {kind} result", required=not lists
    )
    window = None
    if "window" in info.settings:
        if "window" not in spec:
            raise doc.error((*path, "window"), f"is required for a {kind} join, e.g. '10 minutes'")
        window = window_ms(doc, (*path, "window"), spec["window"])
    by = None
    if info.keyed_by:
        if info.keyed_by not in spec:
            raise doc.error((*path, info.keyed_by), f"is required for a {kind} join")
        by = text_value(doc, (*path, info.keyed_by), spec[info.keyed_by])
        where[f"__{info.keyed_by}"] = doc.where((*path, info.keyed_by))
    element_id, elements, list_as = (
        _list_settings(doc, path, spec, (*info.meta_columns, *select), where)
        if lists
        else (None, {}, "elements")
    )
    table_every, publish, publish_format = _publish_settings(doc, path, name, spec, topics)
    grace = window_ms(doc, (*path, "grace"), spec["grace"]) if "grace" in spec else None
    group = _consumer_group(doc, (*path, "consumer_group"), spec.get("consumer_group", ""))
    dead_letters = spec.get("dead_letter_topic")
    if dead_letters is not None and (not isinstance(dead_letters, str) or not NAME_RE.match(dead_letters)):
        raise doc.error((*path, "dead_letter_topic"), f"must be a topic name, got {dead_letters!r}")
    if dead_letters is not None and dead_letters == publish:
        raise doc.error((*path, "dead_letter_topic"), "must differ from the changelog topic (publish)")
    return JoinSpec(
        name,
        kind,
        str(sides["left"]),
        sides["right"],
        join_type,
        select,
        where,
        window,
        publish,
        by,
        element_id,
        elements,
        list_as,
        table_every,
        publish_format,
        grace,
        group,
        dead_letters,
    )


def _consumer_group(doc: LocatedYaml, path: tuple[str, ...], value: Any) -> str | None:
    """A consumer group name (letters, digits, '.', '_', '-'), false for none; "" the default."""
    if value is False:
        return None
    if value == "":
        return ""
    if not isinstance(value, str) or not GROUP_RE.fullmatch(value):
        raise doc.error(path, "must be a consumer group name (letters, digits, '.', '_', '-') or false")
    return value


def _join_name(doc: LocatedYaml, path: tuple, name: str, topics: dict[str, TopicSpec]) -> None:
    if not COLUMN_RE.match(name):
        raise doc.error(path, "join names use letters, digits and '_' (they name the result table)")
    if name in topics or is_reserved(name):
        raise doc.error(
            path, f"the name is taken by a topic or would share a name with the lake's own tables {RESERVED}"
        )


def _list_settings(
    doc: LocatedYaml, path: tuple, spec: dict[str, Any], taken: tuple[str, ...], where: dict[str, str]
) -> tuple[str | None, dict[str, str], str]:
    """A list join's element_id, elements and as (the column of the joined elements, not one of
    ``taken``); the elements' source lines go into ``where``."""
    element_id = None
    if "element_id" in spec:
        element_id = text_value(doc, (*path, "element_id"), spec["element_id"])
        if not FIELD_PATH_RE.match(element_id):
            raise doc.error((*path, "element_id"), f"must be a field path such as 'id', got {element_id!r}")
    list_as = spec.get("as", "elements")
    if not isinstance(list_as, str) or not COLUMN_RE.match(list_as) or list_as in taken:
        raise doc.error(
            (*path, "as"), f"must be a new column name of letters, digits and '_', got {list_as!r}"
        )
    elements, element_where = _expressions(
        doc, path, "elements", spec.get("elements"), ("id", "matched"), "every element", required=True
    )
    where |= {f"elements.{c}": w for c, w in element_where.items()}
    return element_id, elements, list_as


def _publish_settings(
    doc: LocatedYaml, path: tuple, name: str, spec: dict[str, Any], topics: dict[str, TopicSpec]
) -> tuple[float, str | None, str]:
    """``table_every`` (seconds, 0 for every batch), the changelog topic ``publish`` names (or None)
    and its value format: ``publish: true``, a topic name, or ``{topic: NAME, format: FORMAT}``."""
    table_every = 0.0
    if "table_every" in spec:
        table_every = window_ms(doc, (*path, "table_every"), spec["table_every"]) / 1000
        if not publish_set(spec):
            raise doc.error(
                (*path, "table_every"),
                "writes the result table behind the changelog topic: it needs publish (true or a topic)",
            )
    publish = spec.get("publish", False)
    publish_format = "json"
    if isinstance(publish, dict):
        settings = mapping(doc, (*path, "publish"), publish, ("topic", "format"))
        from spark_jobs.formats import format_names

        publishing = tuple(format_names(publishing=True))
        publish_format = choice(doc, (*path, "publish", "format"), settings.get("format", "json"), publishing)
        publish = settings.get("topic", True)
    if publish is True:
        publish = f"{name}_changelog"
    elif publish is False or publish is None:
        publish = None
    elif not isinstance(publish, str) or not NAME_RE.match(publish):
        raise doc.error((*path, "publish"), f"must be true, false or a topic name, got {publish!r}")
    if publish and publish in topics:
        raise doc.error(
            (*path, "publish"), f"topic '{publish}' is declared already; publish needs its own topic"
        )
    return table_every, publish, publish_format


def publish_set(spec: dict[str, Any]) -> bool:
    """The join publishes a changelog topic (``publish: true`` or a topic name)."""
    return spec.get("publish", False) not in (False, None)


def _expressions(
    doc: LocatedYaml,
    path: tuple[str, ...],
    key: str,
    raw: Any,
    reserved: tuple[str, ...],
    owner: str,
    required: bool,
) -> tuple[dict[str, str], dict[str, str]]:
    """A mapping of output column -> Spark SQL expression, and each column's location."""
    if raw is None and not required:
        return {}, {}
    if not isinstance(raw, dict) or not raw:
        raise doc.error((*path, key), "must be a mapping of output column to a Spark SQL expression")
    exprs, where = {}, {}
    for column, expr in raw.items():
        col_path = (*path, key, column)
        if not COLUMN_RE.match(column):
            raise doc.error(col_path, "output columns use letters, digits and '_'")
        if column in reserved:
            raise doc.error(col_path, f"'{column}' is a column {owner} has; choose another name")
        exprs[column] = text_value(doc, col_path, expr)
        where[column] = doc.where(col_path)
    return exprs, where
