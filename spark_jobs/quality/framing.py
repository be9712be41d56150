"""The framing check, a census per topic: how many of its keys and values are plain, framed with the
topic's Schema Registry subject, framed with a schema id the registry does not know, framed with a
schema outside the topic's subject, or framed but not decodable, each with the offsets of examples.
It fails for every record that is not what its topic declares: a registry topic's plain records (a
producer without the registry's serializer), unknown ids, other subjects' schemas, undecodable bytes;
a plain topic's framed records.

```yaml
- framing:
    topics: [customer_consents, customer_accounts]
```
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig
from spark_jobs.formats import framing
from spark_jobs.quality.co_partitioning import topic_list as parse
from spark_jobs.quality.findings import Finding
from spark_jobs.quality.gx import GreatExpectations
from spark_jobs.topics.snapshots import SnapshotReader

__all__ = ["framing_census", "parse", "run", "target", "topics"]
EXAMPLES = 3  # offsets named per category


def target(params: dict[str, Any]) -> str:
    return "+".join(params["topics"])


def topics(params: dict[str, Any], config: PipelineConfig) -> list[str]:
    return list(params["topics"])


def _category(codec: Any, raw: Any) -> tuple[Any, Any]:
    """(what a record is, why that is wrong for its topic or null) as Spark columns."""
    framed = framing.schema_id(raw)
    if not codec.registered:
        what = F.when(framed.isNull(), F.lit("plain")).otherwise(
            F.format_string("framed (schema id %d)", framed)
        )
        wrong = framed.isNotNull() & F.lit(not codec.any_bytes)
        return what, F.when(wrong, F.lit(f"framed, though the topic declares {codec.name}"))
    problem = codec.problem(raw)
    what = (
        F.when(problem.isNull(), F.lit(f"framed with {codec.subject}"))
        .when(framed.isNull(), F.lit("plain (not framed)"))
        .when(
            problem.startswith("unknown schema id"),
            F.lit("framed with a schema id the registry does not know"),
        )
        .when(
            problem.contains(" belongs to ") | problem.contains(" schema, not "),
            F.lit(f"framed with a schema outside {codec.subject}"),
        )
        .otherwise(F.lit("framed, but not decodable"))
    )
    return what, F.when(problem.isNotNull(), F.concat(what, F.lit(": "), problem))


def framing_census(reader: SnapshotReader, topics: list[str]) -> DataFrame:
    """One row per topic, part (key, value) and category: how many records, example offsets, and the
    problem when the category is not what the topic declares."""
    frames = []
    for t in topics:
        for part in ("key", "value"):
            codec = reader.formats.codec(t, part)
            rows = reader.records(t).filter(F.col(part).isNotNull())
            if codec.registered:
                codec.learn(rows, part)
            what, wrong = _category(codec, F.col(part))
            labelled = rows.select("partition", "offset", what.alias("category"), wrong.alias("_why"))
            frames.append(
                labelled.groupBy("category")
                .agg(
                    F.count("*").alias("records"),
                    F.slice(F.array_sort(F.collect_list(F.struct("partition", "offset"))), 1, EXAMPLES).alias(
                        "examples"
                    ),
                    F.min("_why").alias("problem"),
                )
                .select(F.lit(t).alias("topic"), F.lit(part).alias("part"), "*")
            )
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def run(
    finish: Callable, asset: str, spark: SparkSession, reader, config, p: dict, gxr: GreatExpectations
) -> None:
    census = framing_census(reader, p["topics"]).persist()
    try:
        counts = census.orderBy("topic", "part", "category").collect()
        said = "; ".join(f"{r['topic']} {r['part']}s: {r['records']:,} {r['category']}" for r in counts)
        finish(
            f"The keys and values of {', '.join(p['topics'])} are framed as their topics declare ({said}).",
            census,
            _finding,
            "records framed otherwise than declared",
        )
    finally:
        census.unpersist()


def _finding(row: dict) -> Finding:
    examples = [(e["partition"], e["offset"]) for e in row["examples"]]
    shown = ", ".join(f"partition {p} offset {o}" for p, o in examples)
    text = f"{row['topic']}: {row['records']:,} {row['part']}(s) {row['problem']} (e.g. {shown})"
    return Finding(text, row["problem"], topic=row["topic"], records=row["records"], offsets=examples)
