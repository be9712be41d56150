"""The co-partitioning check: joined topics have the same partition count, and every key sits in the
same partition of each, the one its topic's partitioner gives (what a table or stream-table join
needs). For a foreign-key or list join only the right topic's placement counts: a Kafka Streams fk
or list join sends its subscriptions by it (KIP-775), and the partition counts may differ.

Keys are compared by their logical value: a Schema Registry framed key decoded. Where one logical key
has other bytes on the topics (framed on one, plain on the other, or framed with other schema ids)
the finding names each side's framing: this product joins the decoded key, but a Kafka Streams or
ksqlDB join of the same topics sees two keys, and their partitioners may place them apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import PipelineConfig, mapping
from spark_jobs.quality.findings import Finding, Placement, display, keyed
from spark_jobs.quality.gx import GreatExpectations
from spark_jobs.seams.partitioners import spark_partition
from spark_jobs.topics.snapshots import SnapshotReader

# why a key with other bytes on the joined topics matters, and what to do
APART = (
    " (this product joins the decoded key, but a Kafka Streams or ksqlDB join of these topics sees two "
    "keys: write both topics' keys the same way, plain or framed with one key schema)"
)


def parse(doc: Any, where: tuple[str, ...], params: Any, config: PipelineConfig) -> dict[str, Any]:
    if "join" in (params or {}):
        params = mapping(doc, where, params, ("join",))
        join = config.joins.get(str(params.get("join")))
        if join is None or join.right is None:
            raise doc.error((*where, "join"), f"must name a join of {config.source} that has a right topic")
        return params
    params = topic_list(doc, where, params, config)
    if len(params["topics"]) < 2:
        raise doc.error((*where, "topics"), "co-partitioning needs at least two topics")
    return params


def topic_list(doc: Any, where: tuple[str, ...], params: Any, config: PipelineConfig) -> dict[str, Any]:
    """``{topics: [...]}``, each a topic of the pipeline."""
    params = mapping(doc, where, params, ("topics",))
    names = params.get("topics")
    if not isinstance(names, list) or not names or any(t not in config.topics for t in names):
        raise doc.error((*where, "topics"), f"must list topics of {config.source}")
    return params


def target(params: dict[str, Any]) -> str:
    return params.get("join") or "+".join(params["topics"])


def topics(params: dict[str, Any], config: PipelineConfig) -> list[str]:
    if not params.get("join"):
        return list(params["topics"])
    join = config.joins[params["join"]]
    right = str(join.right)
    return [right] if join.join_kind.references else [join.left, right]


def co_partitioning_findings(
    spark: SparkSession, reader: SnapshotReader, config: PipelineConfig, topics: list[str]
):
    """(partition counts per topic, one row per key with its partitions and the expected one)."""
    counts = spark.createDataFrame(
        [(t, config.topics[t].partitions) for t in topics], "topic string, partitions int"
    )
    first = config.topics[topics[0]].partitions
    counts = counts.withColumn(
        "problem",
        F.when(
            F.col("partitions") != first,
            F.format_string(f"%s has %d partitions but {topics[0]} has {first}", "topic", "partitions"),
        ),
    )
    per_topic = []
    for t in topics:
        spec = config.topics[t]
        framing = F.when(F.col("key_id").isNull(), F.lit("plain")).otherwise(
            F.format_string("framed with schema id %d", F.col("key_id"))
        )
        placed = (
            reader.keyed(t)
            .withColumn("_x", spark_partition(F.col("key"), spec.partitions, spec.partitioner))
            .groupBy(F.col("logical").alias("key"))
            .agg(
                F.array_sort(F.collect_set("partition")).alias(f"p_{t}"),
                F.min("_x").alias(f"x_{t}"),
                F.max((F.col("partition") != F.col("_x")).cast("int")).alias(f"m_{t}"),
                F.array_sort(F.collect_set(framing)).alias(f"f_{t}"),
            )
        )
        per_topic.append(placed)
    keys = per_topic[0]
    for other in per_topic[1:]:
        keys = keys.join(other, "key", "full")
    problems = []
    for t in topics:
        spec = config.topics[t]
        problems.append(
            F.when(
                F.col(f"p_{t}").isNotNull() & (F.col(f"m_{t}") == 1),
                F.format_string(
                    f"in {t} at partition %s but {spec.partitioner} places it in %d",
                    F.array_join(F.col(f"p_{t}").cast("array<string>"), ","),
                    F.col(f"x_{t}"),
                ),
            )
        )
    in_all = F.lit(True)
    for t in topics:
        in_all = in_all & F.col(f"p_{t}").isNotNull()
    differ = F.lit(False)
    for t in topics[1:]:
        differ = differ | (F.col(f"p_{t}") != F.col(f"p_{topics[0]}"))
    problems.append(
        F.when(
            in_all & differ,
            F.concat(
                F.lit("different partitions: "),
                F.concat_ws(
                    ", ",
                    *[
                        F.concat(F.lit(f"{t}="), F.array_join(F.col(f"p_{t}").cast("array<string>"), ","))
                        for t in topics
                    ],
                ),
            ),
        )
    )
    framed_apart = F.lit(False)
    for t in topics[1:]:
        framed_apart = framed_apart | (F.col(f"f_{t}") != F.col(f"f_{topics[0]}"))
    problems.append(
        F.when(
            in_all & framed_apart,
            F.concat(
                F.lit("its bytes differ: "),
                F.concat_ws(
                    ", ", *[F.concat(F.lit(f"{t} "), F.array_join(F.col(f"f_{t}"), " and ")) for t in topics]
                ),
                F.lit(APART),
            ),
        )
    )
    problem = F.concat_ws("; ", *problems)
    cols = [*display("key")]
    for t in topics:
        cols += [
            F.col(f"p_{t}").cast("array<int>").alias(f"partitions_{t}"),
            F.col(f"x_{t}").alias(f"expected_{t}"),
            F.col(f"f_{t}").alias(f"framing_{t}"),
        ]
    return counts, keys.select(*cols, F.when(problem != "", problem).alias("problem"))


def run(finish: Callable, asset: str, spark, reader, config, p: dict, gxr: GreatExpectations) -> None:
    if not p.get("join"):
        _co_partitioning(finish, asset, p["topics"], spark, reader, config)
        return
    join = config.joins[p["join"]]
    right = str(join.right)
    # a Kafka Streams fk or list join sends its subscriptions by the right topic's own placement
    if not join.join_kind.references:
        _co_partitioning(finish, asset, [join.left, right], spark, reader, config)
        return
    _, keys = co_partitioning_findings(spark, reader, config, [right])
    finish(
        f"Every key of {right} sits in the partition {config.topics[right].partitioner} gives it among "
        f"the topic's {config.topics[right].partitions}, where join {join.name} ({join.kind}) sends its "
        "subscriptions (the partition counts of the two topics may differ).",
        keys,
        lambda r: _misplaced(r, [right], config),
        "misplaced keys",
    )


def _co_partitioning(finish: Callable, asset: str, topics: list[str], spark, reader, config) -> None:
    """Same partition count, and every key in the same partition of each topic, the one its
    partitioner gives (what a table or stream-table join needs)."""
    counts, keys = co_partitioning_findings(spark, reader, config, topics)
    finish(
        f"Topics {', '.join(topics)} have the same partition count.",
        counts,
        lambda r: Finding(r["problem"], r["problem"], topic=r["topic"]),
        "partition-count mismatches",
        name=f"{asset}.counts",
    )
    finish(
        f"Every key of {', '.join(topics)} sits in the same partition in each topic, the one "
        "its topic's partitioner gives.",
        keys,
        lambda r: _misplaced(r, topics, config),
        "misplaced keys",
    )


def _misplaced(row: dict, topics: list[str], config: PipelineConfig) -> Finding:
    """A key's finding, with each topic where it is not in its partitioner's partition."""
    placements = [
        Placement(t, list(row[f"partitions_{t}"]), row[f"expected_{t}"], config.topics[t].partitioner)
        for t in topics
        if row[f"partitions_{t}"] is not None and list(row[f"partitions_{t}"]) != [row[f"expected_{t}"]]
    ]
    return keyed(row, row["problem"], placements=placements)
