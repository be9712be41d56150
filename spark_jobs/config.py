"""The configuration seam: load and validate a pipeline YAML file into typed dataclasses.

Every error names the file, the key path and (where known) the line, e.g.
``pipelines/demo.yaml:7: topics.customer_consents.partitions: must be a positive integer, got 'four'``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spark_jobs.errors import UserError

DEFAULT_CONFIG = "demo.yaml"
KEY_FORMATS = ("string", "bytes")
VALUE_FORMATS = ("json", "string")
PARTITIONERS = ("murmur2", "consistent_random")
TOP_LEVEL_KEYS = ("pipeline", "description", "topics", "lookups", "joins", "quality")
# Sections that later parts of the product fill; accepted (as mappings) so files can be written ahead.
RESERVED_SECTIONS = ("lookups", "joins", "quality")
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,199}$")


@dataclass(frozen=True)
class TopicSpec:
    """A Kafka-shaped topic: the facts producers and joins must agree on."""

    name: str
    partitions: int
    key_format: str = "string"
    value_format: str = "json"
    partitioner: str = "murmur2"


@dataclass(frozen=True)
class PipelineConfig:
    source: str
    name: str
    description: str = ""
    topics: dict[str, TopicSpec] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)

    def topic(self, name: str) -> TopicSpec:
        try:
            return self.topics[name]
        except KeyError:
            known = ", ".join(sorted(self.topics)) or "none"
            raise UserError(
                f"unknown topic '{name}': not declared in {self.source} (declared: {known})"
            ) from None


def bundled_config_path(name: str = DEFAULT_CONFIG) -> Path:
    return Path(__file__).with_name("pipelines") / name


def resolve_config_path(path: str | os.PathLike[str] | None = None) -> Path:
    """``--config`` wins, then ``LAKE_CONFIG``, then the bundled demo pipeline."""
    chosen = path or os.environ.get("LAKE_CONFIG")
    return Path(chosen) if chosen else bundled_config_path()


class _Located:
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

    def error(self, path: tuple[str, ...], message: str) -> UserError:
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        where = f"{self.source}:{line}" if line else self.source
        key = ".".join(path) if path else "(top level)"
        return UserError(f"{where}: {key}: {message}")


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node)
    finally:
        loader.dispose()


def load_config(path: str | os.PathLike[str] | None = None) -> PipelineConfig:
    """Load and validate a pipeline file (see README, "Configuration reference")."""
    cfg_path = resolve_config_path(path)
    source = str(cfg_path)
    try:
        text = cfg_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{source}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{source}: cannot read config: {exc}") from None
    doc = _Located(source, text)
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
    topics = {t: _topic(doc, t, spec) for t, spec in topics_raw.items()}
    sections = {}
    for section in RESERVED_SECTIONS:
        if section in data:
            if not isinstance(data[section], dict):
                raise doc.error((section,), "must be a mapping")
            sections[section] = data[section]
    return PipelineConfig(source, name, description, topics, sections)


def _topic(doc: _Located, name: str, spec: Any) -> TopicSpec:
    path = ("topics", name)
    if not NAME_RE.match(name):
        raise doc.error(path, "topic names use letters, digits, '_', '-' or '.'")
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
    key_format = spec.get("key", "string")
    if key_format not in KEY_FORMATS:
        raise doc.error((*path, "key"), f"must be one of {', '.join(KEY_FORMATS)}, got {key_format!r}")
    value_format = spec.get("value", "json")
    if value_format not in VALUE_FORMATS:
        raise doc.error((*path, "value"), f"must be one of {', '.join(VALUE_FORMATS)}, got {value_format!r}")
    partitioner = spec.get("partitioner", "murmur2")
    if partitioner not in PARTITIONERS:
        raise doc.error(
            (*path, "partitioner"), f"must be one of {', '.join(PARTITIONERS)}, got {partitioner!r}"
        )
    return TopicSpec(name, partitions, key_format, value_format, partitioner)
