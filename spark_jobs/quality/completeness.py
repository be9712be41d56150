"""The completeness check: every id a topic's records reference exists in its lookup.

The ids are the record keys, or what a foreign-key or list join reads from each left value
(:class:`spark_jobs.joins.keyed.LeftKeys`), so the check counts what the join it guards will look
up. A missing id is named with how many records reference it, where the first and last are, and a
lookup key that differs from it only in invisible bytes when there is one. With a foreign key or
list, a second expectation names the left records the references cannot be read from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec, PipelineConfig, mapping, text_value
from spark_jobs.join_kinds import referencing
from spark_jobs.quality.findings import Finding, display, keyed, show_key
from spark_jobs.quality.gx import GreatExpectations
from spark_jobs.topics.keys import plain_key_sql
from spark_jobs.topics.snapshots import SnapshotReader

KEYS = ("stream", "lookup", "join", "foreign_key", "list", "element_id")


def parse(doc: Any, where: tuple[str, ...], params: Any, config: PipelineConfig) -> dict[str, Any]:
    params = mapping(doc, where, params, KEYS)
    params["refs"] = _references(doc, where, params, config)
    return params


def target(params: dict[str, Any]) -> str:
    refs: References = params["refs"]
    return f"{refs.join}:{refs.stream}->{refs.lookup}" if refs.join else f"{refs.stream}->{refs.lookup}"


def topics(params: dict[str, Any], config: PipelineConfig) -> list[str]:
    refs: References = params["refs"]
    return [refs.stream, config.lookups[refs.lookup].topic]


@dataclass(frozen=True)
class References:
    """What a completeness check counts: the ids the ``stream``'s records reference, which ``lookup``
    must hold. ``by`` (a join spec, fk or list) computes them from the left value the way that join
    does (:class:`spark_jobs.joins.keyed.LeftKeys`); without it the record key is the id. With
    ``current`` only each left key's latest value counts (what a table-like join holds), else every
    record (a stream's events)."""

    stream: str
    lookup: str
    join: str | None = None  # the join the check guards, when it names one
    by: JoinSpec | None = None
    current: bool = False

    @property
    def what(self) -> str:
        if self.by is None:
            return "key"
        return "list element" if self.by.join_kind.has_list else "foreign key"


def _references(doc: Any, where: tuple[str, ...], p: dict[str, Any], config: PipelineConfig) -> References:
    """A completeness check's references: from the join it names, or from ``stream`` with an optional
    ``foreign_key`` or ``list`` (and ``element_id``), written as in a join."""
    if p.get("join") is not None:
        others = [k for k in ("stream", "foreign_key", "list", "element_id") if k in p]
        if others:
            raise doc.error(
                (*where, others[0]), "with join, the join says it: leave out stream, foreign_key, list"
            )
        join = config.joins.get(str(p["join"]))
        if join is None or join.right is None:
            raise doc.error((*where, "join"), f"must name a join of {config.source} that has a right topic")
        lookups = [name for name, spec in config.lookups.items() if spec.topic == join.right]
        lookup = p.get("lookup") or (lookups[0] if lookups else None)
        if lookup is None:
            raise doc.error(
                (*where, "join"),
                f"join {join.name} reads {join.right}, which no lookup of {config.source} holds: "
                f"declare one under lookups (topic: {join.right})",
            )
        if lookup not in config.lookups or config.lookups[lookup].topic != join.right:
            raise doc.error((*where, "lookup"), f"must name a lookup on the join's right topic {join.right}")
        by = join if join.join_kind.references else None
        return References(join.left, lookup, join.name, by, current=not join.join_kind.events)
    if p.get("stream") not in config.topics:
        raise doc.error((*where, "stream"), f"must name a topic of {config.source}")
    if p.get("lookup") not in config.lookups:
        raise doc.error((*where, "lookup"), f"must name a lookup of {config.source}")
    if "foreign_key" in p and "list" in p:
        raise doc.error((*where, "list"), "give either foreign_key or list, not both")
    if "element_id" in p and "list" not in p:
        raise doc.error((*where, "element_id"), "element_id needs list")
    setting = "foreign_key" if "foreign_key" in p else "list" if "list" in p else None
    by = None
    if setting is not None:
        expr = text_value(doc, (*where, setting), p[setting])
        element_id = text_value(doc, (*where, "element_id"), p["element_id"]) if "element_id" in p else None
        by = JoinSpec(
            name=f"completeness of {p['stream']}",
            kind=referencing(setting).name,
            left=str(p["stream"]),
            right=config.lookups[str(p["lookup"])].topic,
            type="left",
            select={},
            where={f"__{setting}": doc.where((*where, setting))},
            by=expr,
            element_id=element_id,
        )
    return References(str(p["stream"]), str(p["lookup"]), None, by, current=False)


LEFT_KEY_SAMPLE = 5  # left keys named per missing id


def completeness_findings(
    spark: SparkSession, topics: SnapshotReader, config: PipelineConfig, refs: References
) -> DataFrame:
    """One row per id the stream references: records, a sample of their keys, first/last reference,
    and ``problem`` when the lookup lacks it (naming a lookup key that differs from it only in
    invisible bytes, if there is one)."""
    if refs.by is not None:
        left = _left_references(spark, topics, config, refs)
        if refs.by.join_kind.has_list:  # each id once per list; null ids (and empty lists) reference nothing
            left = left.filter(F.col("reason").isNull()).withColumn("ref", F.explode(F.array_distinct("ids")))
        else:
            left = left.withColumn("ref", F.col("by"))
    else:
        left = _referencing(topics, refs).withColumn("ref", F.col("key"))
    refs_df = (
        left.filter(F.col("ref").isNotNull())
        .groupBy("ref")
        .agg(
            F.count("*").alias("records"),
            F.min(F.struct("partition", "offset")).alias("first"),
            F.max(F.struct("partition", "offset")).alias("last"),
            F.slice(F.array_sort(F.collect_set(F.col("key").cast("string"))), 1, LEFT_KEY_SAMPLE).alias(
                "keys"
            ),
        )
    )
    keys = topics.latest(config.lookups[refs.lookup].topic).select(F.col("key").alias("lk"))
    near = keys.select(F.expr(plain_key_sql("lk")).alias("nk"), F.col("lk").alias("near"))
    joined = refs_df.join(keys, refs_df.ref == keys.lk, "left")
    joined = joined.join(near, (F.col("lk").isNull()) & (F.expr(plain_key_sql("ref")) == F.col("nk")), "left")
    joined = joined.groupBy("ref", "records", "first", "last", "keys", "lk").agg(F.min("near").alias("near"))
    by_keys = F.lit("")
    if refs.by is not None:
        shown = F.array_join("keys", ", ")
        more = F.when(F.col("records") > LEFT_KEY_SAMPLE, F.lit(", ...")).otherwise(F.lit(""))
        by_keys = F.concat(F.lit(" (keys "), shown, more, F.lit(")"))
    where = F.format_string(
        f"referenced by %d record(s) of {refs.stream}%s, first at partition %d offset %d, "
        "last at partition %d offset %d",
        F.col("records"),
        by_keys,
        F.col("first.partition"),
        F.col("first.offset"),
        F.col("last.partition"),
        F.col("last.offset"),
    )
    hint = F.when(
        F.col("near").isNotNull(),
        F.concat(
            F.lit(f"; {refs.lookup} has a key that differs from it only in invisible bytes (hex "),
            F.lower(F.hex("near")),
            F.lit(")"),
        ),
    ).otherwise(F.lit(""))
    return joined.select(
        *display("ref"),
        "records",
        F.col("first.partition").alias("first_partition"),
        F.col("first.offset").alias("first_offset"),
        F.col("last.partition").alias("last_partition"),
        F.col("last.offset").alias("last_offset"),
        F.when(
            F.col("lk").isNull(), F.concat(F.lit(f"missing in lookup {refs.lookup}: "), where, hint)
        ).alias("problem"),
    )


def reference_shape_findings(
    spark: SparkSession, topics: SnapshotReader, config: PipelineConfig, refs: References
) -> DataFrame:
    """Left records the references cannot be read from: a list join's record whose value holds no list
    at the path (one row each), or a foreign key that no record has (one row: the expression names no
    field)."""
    assert refs.by is not None
    left = _left_references(spark, topics, config, refs)
    setting = str(refs.by.join_kind.keyed_by)
    if refs.by.join_kind.has_list:
        return left.select(
            *display("key"),
            "partition",
            "offset",
            F.when(
                F.col("reason").isNotNull(),
                F.format_string(
                    f"the record at partition %d offset %d of {refs.stream} has no list at '{refs.by.by}' "
                    "(the join quarantines it)",
                    "partition",
                    "offset",
                ),
            ).alias("problem"),
        )
    counts = left.agg(F.count(F.lit(1)).alias("n"), F.count("by").alias("with"))
    return counts.select(
        F.lit(None).cast("string").alias("key_text"),
        F.lit(None).cast("string").alias("key_hex"),
        F.when(
            (F.col("n") > 0) & (F.col("with") == 0),
            F.format_string(
                f"none of the %d current record(s) of {refs.stream} has a value at {setting} "
                f"'{refs.by.by}': does it name a field of the value?",
                "n",
            ),
        ).alias("problem"),
    )


def _referencing(topics: SnapshotReader, refs: References) -> DataFrame:
    """The stream's records that reference something: every record with a value, or (``current``)
    each key's latest record by timestamp, then offset, unless that is a tombstone."""
    records = topics.records(refs.stream).select("key", "value", "timestamp", "partition", "offset")
    if refs.current:
        from pyspark.sql import Window

        newest = Window.partitionBy("key").orderBy(F.desc("timestamp"), F.desc("offset"), F.desc("partition"))
        records = records.withColumn("__n", F.row_number().over(newest)).filter("__n = 1").drop("__n")
    return records.filter(F.col("value").isNotNull())


def _left_references(
    spark: SparkSession, topics: SnapshotReader, config: PipelineConfig, refs: References
) -> DataFrame:
    """The referencing records with what the join reads from them (``LeftKeys``: ``by`` for a foreign
    key; ``items``, ``ids`` and ``reason`` for a list)."""
    from spark_jobs.joins.engine import SideCodecs
    from spark_jobs.joins.keyed import LeftKeys

    assert refs.by is not None
    records = _referencing(topics, refs)
    no_reason = F.lit(None).cast("string").alias("reason")
    codecs = SideCodecs.of(topics.formats, refs.by)
    return LeftKeys(spark, codecs, refs.by).add(records.select(F.lit("left").alias("side"), "*", no_reason))


def run(finish: Callable, asset: str, spark, reader, config, p: dict, gxr: GreatExpectations) -> None:
    refs: References = p["refs"]
    guarded = f" (join {refs.join})" if refs.join else ""
    if refs.by is not None:
        shape = "holds a list at" if refs.by.join_kind.has_list else "has a value at"
        finish(
            f"Every record of {refs.stream} {shape} '{refs.by.by}'{guarded}.",
            reference_shape_findings(spark, reader, config, refs),
            lambda r: keyed(
                r,
                r["problem"],
                topic=refs.stream,
                offsets=[(r["partition"], r["offset"])] if r.get("partition") is not None else [],
            ),
            "records without references",
            name=f"{asset}.shape",
        )
    finish(
        f"Every {refs.what} that {refs.stream} references exists in lookup {refs.lookup}{guarded}.",
        completeness_findings(spark, reader, config, refs),
        lambda r: _missing(r, refs),
        f"{refs.what}s missing in {refs.lookup}",
    )


def _missing(row: dict, refs: References) -> Finding:
    """``user_9 (referenced by 1 record(s) of orders, first at partition 2 offset 0, ...)``."""
    where = row["problem"].split(": ", 1)[1]
    key = show_key(row)
    first = (row["first_partition"], row["first_offset"])
    last = (row["last_partition"], row["last_offset"])
    return Finding(f"{key} ({where})", where, key, row["key_hex"], refs.stream, row["records"], [first, last])
