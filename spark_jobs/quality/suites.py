"""Suite files: a versioned YAML file in ``expectations/`` (declared per pipeline under
``quality.suites``) lists checks; each check type is one module of this package (its parameters,
the topics it reads, its findings and expectations), listed in ``CHECKS``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from spark_jobs.config import PipelineConfig, choice, mapping, read_located, text_value
from spark_jobs.quality import co_partitioning, completeness, framing, key_format, lookup_basics

# each check type's module: parse(doc, where, params, config), target(params), topics(params, config),
# run(finish, asset, spark, reader, config, params, gx)
CHECKS: dict[str, ModuleType] = {
    "completeness": completeness,
    "co_partitioning": co_partitioning,
    "key_format": key_format,
    "framing": framing,
    "lookup_basics": lookup_basics,
}
CHECK_TYPES = tuple(CHECKS)


@dataclass(frozen=True)
class Check:
    type: str
    params: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.type}:{CHECKS[self.type].target(self.params)}"

    def topics(self, config: PipelineConfig) -> list[str]:
        """The topics the check reads."""
        return CHECKS[self.type].topics(self.params, config)


@dataclass(frozen=True)
class Suite:
    name: str
    version: int
    description: str
    checks: list[Check]
    source: str

    def topics(self, config: PipelineConfig) -> list[str]:
        """The topics its checks read, each once."""
        return list(dict.fromkeys(t for check in self.checks for t in check.topics(config)))


def load_suite(path: Path, config: PipelineConfig) -> Suite:
    """Read and validate a suite file; errors name the file, line and key."""
    doc = read_located(path)
    data = mapping(doc, (), doc.data, ("suite", "version", "description", "checks"))
    name = text_value(doc, ("suite",), data.get("suite"))
    version = data.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise doc.error(("version",), f"must be a positive integer, got {version!r}")
    checks_raw = data.get("checks")
    if not isinstance(checks_raw, list) or not checks_raw:
        raise doc.error(("checks",), "must be a non-empty list of checks")
    checks = []
    for i, item in enumerate(checks_raw):
        where = ("checks", str(i))
        if not isinstance(item, dict) or len(item) != 1:
            raise doc.error(where, f"each check is a mapping with one key: {', '.join(CHECK_TYPES)}")
        ((check_type, params),) = item.items()
        choice(doc, where, check_type, CHECK_TYPES)
        params = CHECKS[check_type].parse(doc, (*where, check_type), params or {}, config)
        checks.append(Check(check_type, dict(params)))
    return Suite(name, version, str(data.get("description", "")).strip(), checks, str(path))
