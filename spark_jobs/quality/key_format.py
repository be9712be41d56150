"""The key-format check: keys are clean text in the declared encoding (the rules of
:mod:`spark_jobs.topics.keys`, shared with ``lake diagnose``), and the joined topics declare the same one.

A topic declared with Schema Registry keys is framed on purpose: its keys are checked instead to be
framed with the topic's key subject and to decode (no magic byte, an unknown schema id, another
subject's schema are named), and for **key schema drift**: one logical key written with more than one
schema id has other bytes from one record to the next (a Kafka Streams join and the producers'
partitioners see other keys)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.quality.co_partitioning import topic_list as parse
from spark_jobs.quality.findings import Finding, display, show_key
from spark_jobs.quality.gx import GreatExpectations
from spark_jobs.topics.keys import RULES as KEY_RULES
from spark_jobs.topics.snapshots import SnapshotReader

__all__ = ["key_format_findings", "parse", "run", "target", "topics"]


def target(params: dict[str, Any]) -> str:
    return "+".join(params["topics"])


def topics(params: dict[str, Any], config: PipelineConfig) -> list[str]:
    return list(params["topics"])


def key_format_findings(
    spark: SparkSession, reader: SnapshotReader, config: PipelineConfig, topics: list[str]
) -> DataFrame:
    """One row per distinct key per topic, ``problem`` naming every format rule it breaks."""
    frames = []
    for t in topics:
        if reader.formats.codec(t, "key").registered:
            frames.append(_registry_keys(reader, t))
            continue
        keys = reader.records(t).filter(F.col("key").isNotNull()).select("key").distinct()
        # declared binary keys (e.g. Avro with Schema Registry framing): any bytes are fine
        rules = [(F.expr(r.sql), r.text) for r in KEY_RULES] if reader.formats.codec(t, "key").textual else []
        problem = (
            F.concat_ws("; ", *[F.when(cond, F.lit(text)) for cond, text in rules]) if rules else F.lit("")
        )
        frames.append(
            keys.select(
                F.lit(t).alias("topic"), *display("key"), F.when(problem != "", problem).alias("problem")
            )
        )
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    # the joined topics must agree on key encoding: one row per topic that declares another format
    first = config.topics[topics[0]]
    disagree = [
        (
            t,
            None,
            None,
            f"declares {config.topics[t].key_format} keys but {first.name} declares {first.key_format}",
        )
        for t in topics[1:]
        if config.topics[t].key_format != first.key_format
    ]
    if disagree:
        out = out.unionByName(
            spark.createDataFrame(disagree, "topic string, key_text string, key_hex string, problem string")
        )
    return out


def _registry_keys(reader: SnapshotReader, topic: str) -> DataFrame:
    """One row per logical key of a topic with Schema Registry keys: why its records' keys do not
    decode, and the schema ids it was written with when there is more than one."""
    keys = (
        reader.keyed(topic)
        .groupBy("logical")
        .agg(
            F.array_sort(F.collect_set("key_id")).alias("_ids"),
            F.min("key_problem").alias("_problem"),
        )
    )
    drift = F.when(
        F.size("_ids") > 1,
        F.format_string(
            "written with schema ids %s: one key, other bytes from one record to the next (a Kafka Streams "
            "join and the producers' partitioners see other keys)",
            F.array_join(F.col("_ids").cast("array<string>"), " and "),
        ),
    )
    problem = F.concat_ws("; ", F.col("_problem"), drift)
    return keys.select(
        F.lit(topic).alias("topic"), *display("logical"), F.when(problem != "", problem).alias("problem")
    )


def run(finish: Callable, asset: str, spark, reader, config, p: dict, gxr: GreatExpectations) -> None:
    finish(
        f"Keys of {', '.join(p['topics'])} are clean text in the declared encoding.",
        key_format_findings(spark, reader, config, p["topics"]),
        lambda r: _bad_key(r),
        "badly formatted keys",
    )


def _bad_key(row: dict) -> Finding:
    """``orders: ' user_1' starts or ends with whitespace``."""
    key = show_key(row) if row["key_hex"] else None
    text = f"{row['topic']}: " + (f"{key} " if key else "") + row["problem"]
    return Finding(text, row["problem"], key, row["key_hex"] or None, row["topic"])
