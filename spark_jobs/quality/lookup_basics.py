"""The lookup-basics check: a lookup's current keys are non-null and unique, and its values parse as
declared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig, mapping
from spark_jobs.quality.findings import display, keyed
from spark_jobs.quality.gx import GreatExpectations
from spark_jobs.topics.snapshots import SnapshotReader


def parse(doc: Any, where: tuple[str, ...], params: Any, config: PipelineConfig) -> dict[str, Any]:
    params = mapping(doc, where, params, ("lookup",))
    if params.get("lookup") not in config.lookups:
        raise doc.error((*where, "lookup"), f"must name a lookup of {config.source}")
    return params


def target(params: dict[str, Any]) -> str:
    return str(params["lookup"])


def topics(params: dict[str, Any], config: PipelineConfig) -> list[str]:
    return [config.lookups[params["lookup"]].topic]


def lookup_findings(
    spark: SparkSession, topics: SnapshotReader, config: PipelineConfig, lookup: str
) -> DataFrame:
    spec = config.lookups[lookup]
    table = topics.latest(spec.topic)
    codec = topics.formats.codec(spec.topic, "value")
    codec.learn(table, "value")  # a registry format: the schema ids its values are framed with
    return table.select(*display("key"), codec.stored_problem(F.col("value")).cast("string").alias("problem"))


def run(finish: Callable, asset: str, spark, reader, config, p: dict, gxr: GreatExpectations) -> None:
    gx = gxr.gx
    finish(
        f"Lookup {p['lookup']} has a non-null unique key and values that parse as declared.",
        lookup_findings(spark, reader, config, p["lookup"]),
        lambda r: keyed(r, r["problem"], topic=config.lookups[p["lookup"]].topic),
        "bad lookup rows",
        extra=[
            gx.expectations.ExpectColumnValuesToNotBeNull(column="key_hex"),
            gx.expectations.ExpectColumnValuesToBeUnique(column="key_hex"),
        ],
    )
