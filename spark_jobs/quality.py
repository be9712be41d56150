"""Data-quality suites: completeness, co-partitioning, key format and lookup basics.

A suite is a versioned YAML file in ``expectations/`` (declared per pipeline under ``quality.suites``).
A run takes the end offsets of every topic its checks read when it starts (``spark_jobs.snapshots``)
and reads the topics from Kafka up to them: it answers for the topics as they are, never for an older
copy, and says which offsets it checked. Each check computes its *findings* with Spark (one row per
key or topic, with a plain-words ``problem`` where something is wrong) and Great Expectations
validates those findings, which also renders Data Docs. A check over a topic that holds no records
fails and says so: nothing was checked. Every failing expectation's description names the offending
keys, so the HTML says in plain words what is missing or misplaced. Results also go to
``summary.json``, a one-page ``summary.html`` and the ``quality_runs`` Delta table (history).
"""

from __future__ import annotations

import html
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec, PipelineConfig, choice, mapping, read_located, text_value
from spark_jobs.errors import UserError
from spark_jobs.joins.kinds import referencing
from spark_jobs.kafka import connect
from spark_jobs.keys import RULES as KEY_RULES
from spark_jobs.lake import Lake
from spark_jobs.layout import Layout
from spark_jobs.partitioners import spark_partition
from spark_jobs.report import report_path, run_page, write_report
from spark_jobs.snapshots import Snapshot, SnapshotReader, offsets_text, take
from spark_jobs.system_tables import QUALITY_RUNS, QUALITY_RUNS_SCHEMA, ensure_quality_runs

CHECK_TYPES = ("completeness", "co_partitioning", "key_format", "lookup_basics")
LIST_LIMIT = 1000  # offending keys listed per expectation (with the total count)
DESCRIPTION_LIMIT = 20  # offending keys spelled out in the Data Docs description


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


@dataclass(frozen=True)
class Check:
    type: str
    params: dict[str, Any]

    @property
    def name(self) -> str:
        target = self.params.get("lookup") or "+".join(self.params.get("topics", []))
        if self.type == "completeness":
            refs = self.params["refs"]
            target = f"{refs.stream}->{refs.lookup}"
            if refs.join:
                target = f"{refs.join}:{target}"
        elif self.params.get("join"):
            target = self.params["join"]
        return f"{self.type}:{target}"


@dataclass(frozen=True)
class Suite:
    name: str
    version: int
    description: str
    checks: list[Check]
    source: str


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
        params = params or {}
        if check_type == "completeness":
            keys = ("stream", "lookup", "join", "foreign_key", "list", "element_id")
            params = mapping(doc, (*where, check_type), params, keys)
            params["refs"] = _references(doc, (*where, check_type), params, config)
        elif check_type == "co_partitioning" and "join" in (params or {}):
            params = mapping(doc, (*where, check_type), params, ("join",))
            join = config.joins.get(str(params.get("join")))
            if join is None or join.right is None:
                raise doc.error(
                    (*where, check_type, "join"),
                    f"must name a join of {config.source} that has a right topic",
                )
        elif check_type in ("co_partitioning", "key_format"):
            params = mapping(doc, (*where, check_type), params, ("topics",))
            topics = params.get("topics")
            if not isinstance(topics, list) or not topics or any(t not in config.topics for t in topics):
                raise doc.error((*where, check_type, "topics"), f"must list topics of {config.source}")
            if check_type == "co_partitioning" and len(topics) < 2:
                raise doc.error((*where, check_type, "topics"), "co-partitioning needs at least two topics")
        else:
            params = mapping(doc, (*where, check_type), params, ("lookup",))
            if params.get("lookup") not in config.lookups:
                raise doc.error((*where, check_type, "lookup"), f"must name a lookup of {config.source}")
        checks.append(Check(check_type, dict(params)))
    return Suite(name, version, str(data.get("description", "")).strip(), checks, str(path))


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


# --- findings: plain Spark DataFrames ---------------------------------------------------------------


def _display(key_col: str = "key") -> list:
    return [
        F.col(key_col).cast("string").alias("key_text"),
        F.hex(F.col(key_col)).alias("key_hex"),
    ]


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
    near = keys.select(_normalized("lk").alias("nk"), F.col("lk").alias("near"))
    joined = refs_df.join(keys, refs_df.ref == keys.lk, "left")
    joined = joined.join(near, (F.col("lk").isNull()) & (_normalized("ref") == F.col("nk")), "left")
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
        *_display("ref"),
        "records",
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
            *_display("key"),
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
    from spark_jobs.joins.keyed import LeftKeys

    assert refs.by is not None
    records = _referencing(topics, refs)
    no_reason = F.lit(None).cast("string").alias("reason")
    return LeftKeys(spark, config, refs.by).add(records.select(F.lit("left").alias("side"), "*", no_reason))


def _normalized(column: str) -> Any:
    """A key without what people do not see: a leading BOM, surrounding whitespace and JSON quotes."""
    text = F.regexp_replace(F.col(column).cast("string"), "^\ufeff", "")
    text = F.regexp_replace(text, r"^\s+|\s+$", "")
    return F.regexp_replace(text, '^"(.*)"$', "$1")


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
        placed = (
            reader.records(t)
            .filter(F.col("key").isNotNull())
            .groupBy("key")
            .agg(F.array_sort(F.collect_set("partition")).alias(f"p_{t}"))
            .withColumn(f"x_{t}", spark_partition(F.col("key"), spec.partitions, spec.partitioner))
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
                F.col(f"p_{t}").isNotNull() & (F.col(f"p_{t}") != F.array(F.col(f"x_{t}"))),
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
    problem = F.concat_ws("; ", *problems)
    cols = [*_display("key")]
    for t in topics:
        cols += [
            F.col(f"p_{t}").cast("array<int>").alias(f"partitions_{t}"),
            F.col(f"x_{t}").alias(f"expected_{t}"),
        ]
    return counts, keys.select(*cols, F.when(problem != "", problem).alias("problem"))


def key_format_findings(
    spark: SparkSession, reader: SnapshotReader, config: PipelineConfig, topics: list[str]
) -> DataFrame:
    """One row per distinct key per topic, ``problem`` naming every format rule it breaks."""
    frames = []
    for t in topics:
        spec = config.topics[t]
        keys = reader.records(t).filter(F.col("key").isNotNull()).select("key").distinct()
        # declared binary keys (e.g. Avro with Schema Registry framing): any bytes are fine
        rules = [(F.expr(r.sql), r.text) for r in KEY_RULES] if spec.key_format == "string" else []
        problem = (
            F.concat_ws("; ", *[F.when(cond, F.lit(text)) for cond, text in rules]) if rules else F.lit("")
        )
        frames.append(
            keys.select(
                F.lit(t).alias("topic"), *_display("key"), F.when(problem != "", problem).alias("problem")
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


def lookup_findings(
    spark: SparkSession, topics: SnapshotReader, config: PipelineConfig, lookup: str
) -> DataFrame:
    spec = config.lookups[lookup]
    table = topics.latest(spec.topic)
    value_ok = F.lit(True)
    if config.topics[spec.topic].value_format == "json":
        value_ok = F.expr("try_parse_json(cast(value as string)) IS NOT NULL")
    return table.select(
        *_display("key"),
        F.when(value_ok, F.lit(None).cast("string"))
        .otherwise(F.lit("value does not parse as JSON"))
        .alias("problem"),
    )


# --- running with Great Expectations ----------------------------------------------------------------


@dataclass
class ExpectationResult:
    suite: str
    check: str
    expectation: str
    description: str
    success: bool
    observed_value: str
    offending_total: int = 0
    offending: list[str] = field(default_factory=list)
    # what the check read: its topics' end offsets (per partition) in the run's snapshot
    offsets: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class QualityReport:
    run_id: str
    run_time: str
    pipeline: str
    success: bool
    results: list[ExpectationResult]
    data_docs: str | None
    summary_html: str | None
    # the run's snapshot: when its offsets were taken and, per topic, its end offset per partition
    offsets_at: str = ""
    offsets: dict[str, list[int]] = field(default_factory=dict)

    def covers(self) -> str:
        """``orders up to offsets [3, 2]; customers up to offsets [1, 0] (taken ...)``."""
        parts = [offsets_text(t, e) for t, e in self.offsets.items()]
        return f"{'; '.join(parts)} (taken {self.offsets_at})"

    def as_dict(self) -> dict:
        return asdict(self)


def _offending(df: DataFrame, describe: Callable[[dict], str]) -> tuple[int, list[str]]:
    bad = df.filter(F.col("problem").isNotNull())
    total = bad.count()
    rows = [
        r.asDict()
        for r in bad.orderBy(*[c for c in ("topic", "key_text", "key_hex") if c in df.columns])
        .limit(LIST_LIMIT)
        .collect()
    ]
    return total, [describe(r) for r in rows]


def _show_key(row: dict) -> str:
    raw = bytes.fromhex(row["key_hex"]) if row.get("key_hex") else b""
    shown = repr(raw)[2:-1]
    plain = raw.decode("utf-8", "replace")
    return shown if shown == plain else f"{shown} (hex {row['key_hex']})"


def _plain(total: int, items: list[str], what: str) -> str:
    if not total:
        return f"PASSED: no {what}."
    listed = "; ".join(items[:DESCRIPTION_LIMIT])
    more = f"; and {total - DESCRIPTION_LIMIT} more" if total > DESCRIPTION_LIMIT else ""
    return f"FAILED: {total} {_singular(what) if total == 1 else what}: {listed}{more}."


def _singular(what: str) -> str:
    """``foreign keys missing in m`` -> ``foreign key missing in m``: the first plural word."""
    words = what.split(" ")
    for i, word in enumerate(words):
        if word.endswith("s") and len(word) > 2:
            words[i] = word[:-1]
            break
    return " ".join(words)


def preload_great_expectations() -> None:
    """Import Great Expectations in a background thread: about 6 s of Python (7 CPU-seconds) that a
    quality run would otherwise spend after Spark's start, while starting Spark mostly waits on the
    JVM. Call it before starting Spark; :class:`_GX` then finds the module loaded (or waits for it).
    A failed import is left for :class:`_GX` to raise in the main thread."""
    import threading

    def load() -> None:
        try:
            import great_expectations  # noqa: F401
        except Exception:  # noqa: S110 - the main thread's import raises it again, with its traceback
            pass

    threading.Thread(target=load, name="import-gx", daemon=True).start()


class _GX:
    """A file-based Great Expectations context under the report directory."""

    def __init__(self, report_dir: Path):
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self.gx = gx
        self.ctx = gx.get_context(mode="file", project_root_dir=str(report_dir))
        self.ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        self.ctx.variables.save()
        # the findings are persisted by us already; GE persisting them again only logs a warning
        self.ds = self.ctx.data_sources.add_or_update_spark(name="lake", persist=False)

    def validate(self, name: str, df: DataFrame, expectations: list) -> list:
        gx = self.gx
        assets = {a.name: a for a in self.ds.assets}
        asset = assets.get(name) or self.ds.add_dataframe_asset(name=name)
        defs = {b.name: b for b in asset.batch_definitions}
        batch_def = defs.get("all") or asset.add_batch_definition_whole_dataframe("all")
        suite = gx.ExpectationSuite(name=name, expectations=expectations)
        suite = self.ctx.suites.add_or_update(suite)
        vd = self.ctx.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=name, data=batch_def, suite=suite)
        )
        checkpoint = self.ctx.checkpoints.add_or_update(
            gx.Checkpoint(
                name=name,
                validation_definitions=[vd],
                actions=[],  # Data Docs are built once per run (docs_index), not per check
                result_format={"result_format": "SUMMARY"},
            )
        )
        result = checkpoint.run(batch_parameters={"dataframe": df})
        return [r for vr in result.run_results.values() for r in vr.results]

    def docs_index(self) -> str | None:
        """Build the Data Docs of the run's validations (once: each build renders the whole site)
        and return the site's index."""
        self.ctx.build_data_docs()
        sites = self.ctx.get_docs_sites_urls()
        return sites[0]["site_url"] if sites else None


def _unexpected(query_cols: str, description: str):
    import great_expectations as gx

    return gx.expectations.UnexpectedRowsExpectation(
        unexpected_rows_query=f"SELECT {query_cols} FROM {{batch}} WHERE problem IS NOT NULL",
        description=description[:4000],
    )


def run_suites(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    suite_names: list[str] | None = None,
    report_dir: Path | None = None,
    log=print,
) -> QualityReport:
    names = suite_names or list(config.quality.suites)
    if not names:
        raise UserError(f"{config.source} declares no quality suites (quality.suites)")
    unknown = [n for n in names if n not in config.quality.suites]
    if unknown:
        raise UserError(
            f"unknown suite(s) {', '.join(unknown)} (declared: {', '.join(config.quality.suites) or 'none'})"
        )
    suites = [load_suite(config.quality.suites[n], config) for n in names]
    # one quality run at a time per lake: runs share the Great Expectations project
    with lake.lock("quality", log):
        return _run_suites(spark, lake, config, suites, report_dir, log)


def check_topics(check: Check, config: PipelineConfig) -> list[str]:
    """The topics a check reads."""
    p = check.params
    if check.type == "completeness":
        refs: References = p["refs"]
        return [refs.stream, config.lookups[refs.lookup].topic]
    if check.type == "co_partitioning" and p.get("join"):
        join = config.joins[p["join"]]
        right = str(join.right)
        return [right] if join.join_kind.references else [join.left, right]
    if check.type in ("co_partitioning", "key_format"):
        return list(p["topics"])
    return [config.lookups[p["lookup"]].topic]


def _run_suites(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    suites: list[Suite],
    report_dir: Path | None,
    log,
) -> QualityReport:
    report_dir = (report_dir or Layout(lake.root).quality_reports).absolute()
    report_dir.mkdir(parents=True, exist_ok=True)
    cluster = connect(config, lake.root)
    read = list(
        dict.fromkeys(t for suite in suites for check in suite.checks for t in check_topics(check, config))
    )
    snapshot = take(cluster, [config.topic(t) for t in read])
    log(f"reading {snapshot.covers()} from Kafka at {cluster.bootstrap_servers}")
    topics = SnapshotReader(spark, cluster, {t: config.topic(t) for t in read}, snapshot)
    log("loading Great Expectations ...")
    gxr = _GX(report_dir)
    run_id = str(uuid.uuid4())
    run_time = datetime.now(UTC)
    results: list[ExpectationResult] = []
    try:
        for suite in suites:
            for check in suite.checks:
                log(f"checking {suite.name} / {check.name} ...")
                results += _run_check(spark, topics, config, gxr, suite, check)
    finally:
        topics.close()
    success = all(r.success for r in results)
    docs = gxr.docs_index()
    report = QualityReport(run_id, run_time.isoformat(), config.name, success, results, docs, None)
    report.offsets_at = snapshot.taken_at.isoformat(timespec="seconds")
    report.offsets = {t: list(snapshot.ends[t]) for t in read}
    # every run keeps its own page (runs/<time>-<id>.html); summary.html/.json are the latest run
    page = report_dir / run_page(run_time, run_id)
    page.parent.mkdir(exist_ok=True)
    report.summary_html = str(page)
    for target in (page, report_dir / "summary.html"):
        target.write_text(render_summary(report, _docs_href(docs, target)), encoding="utf-8")
    as_json = json.dumps(report.as_dict(), indent=2)
    for target in (page.with_suffix(".json"), report_dir / "summary.json"):
        target.write_text(as_json, encoding="utf-8")
    _record(spark, lake, report, suites, snapshot)
    pipeline_page = write_report(lake, config, _docs_href(docs, report_path(lake, config.name)))
    log(f"report: {pipeline_page}")
    return report


def _gx_outcome(results: list) -> tuple[bool, str]:
    ok = all(r.success for r in results)
    observed = ", ".join(
        str(r.result.get("observed_value", r.result.get("unexpected_count", ""))) for r in results
    )
    return ok, observed


def _run_check(
    spark, topics: SnapshotReader, config, gxr: _GX, suite: Suite, check: Check
) -> list[ExpectationResult]:
    asset = f"{suite.name}.{check.name}".replace(":", "_").replace(">", "").replace("+", "_")
    read = check_topics(check, config)
    offsets = {t: list(topics.snapshot.ends[t]) for t in read}
    empty = [t for t in read if topics.count(t) == 0]
    if empty:  # nothing to check: say so, never pass on it
        covers = "; ".join(offsets_text(t, offsets[t]) for t in empty)
        description = (
            f"NO DATA: {', '.join(empty)} hold(s) no records ({covers}); nothing was checked. Produce or "
            "backfill the topic first."
        )
        return [
            ExpectationResult(
                suite.name, check.name, description, description, False, "no records", 0, [], offsets
            )
        ]
    out: list[ExpectationResult] = []

    def finish(expectation: str, df: DataFrame, describe, what: str, extra: list | None = None, name=asset):
        df = df.persist()  # listed, counted and validated several times: compute the findings once
        try:
            total, items = _offending(df, describe)
            description = f"{expectation} {_plain(total, items, what)}"
            results = gxr.validate(name, df, [_unexpected("*", description), *(extra or [])])
        finally:
            df.unpersist()
        ok, observed = _gx_outcome(results)
        out.append(
            ExpectationResult(
                suite.name, check.name, expectation, description, ok, observed, total, items, offsets
            )
        )

    kind = (
        "join_co_partitioning" if check.type == "co_partitioning" and check.params.get("join") else check.type
    )
    _CHECKS[kind](finish, asset, spark, topics, config, check.params, gxr)
    return out


def _completeness_check(finish: Callable, asset: str, spark, topics, config, p: dict, gxr: _GX) -> None:
    refs: References = p["refs"]
    guarded = f" (join {refs.join})" if refs.join else ""
    if refs.by is not None:
        shape = "holds a list at" if refs.by.join_kind.has_list else "has a value at"
        finish(
            f"Every record of {refs.stream} {shape} '{refs.by.by}'{guarded}.",
            reference_shape_findings(spark, topics, config, refs),
            lambda r: (f"{_show_key(r)}: " if r["key_hex"] else "") + r["problem"],
            "records without references",
            name=f"{asset}.shape",
        )
    finish(
        f"Every {refs.what} that {refs.stream} references exists in lookup {refs.lookup}{guarded}.",
        completeness_findings(spark, topics, config, refs),
        lambda r: f"{_show_key(r)} ({r['problem'].split(': ', 1)[1]})",
        f"{refs.what}s missing in {refs.lookup}",
    )


def _join_co_partitioning_check(
    finish: Callable, asset: str, spark, topics, config, p: dict, gxr: _GX
) -> None:
    join = config.joins[p["join"]]
    right = str(join.right)
    # a Kafka Streams fk or list join sends its subscriptions by the right topic's own placement
    if not join.join_kind.references:
        _co_partitioning(finish, asset, [join.left, right], spark, topics, config)
        return
    _, keys = co_partitioning_findings(spark, topics, config, [right])
    finish(
        f"Every key of {right} sits in the partition {config.topics[right].partitioner} gives it among "
        f"the topic's {config.topics[right].partitions}, where join {join.name} ({join.kind}) sends its "
        "subscriptions (the partition counts of the two topics may differ).",
        keys,
        lambda r: f"{_show_key(r)}: {r['problem']}",
        "misplaced keys",
    )


def _co_partitioning_check(finish: Callable, asset: str, spark, topics, config, p: dict, gxr: _GX) -> None:
    _co_partitioning(finish, asset, p["topics"], spark, topics, config)


def _key_format_check(finish: Callable, asset: str, spark, topics, config, p: dict, gxr: _GX) -> None:
    finish(
        f"Keys of {', '.join(p['topics'])} are clean text in the declared encoding.",
        key_format_findings(spark, topics, config, p["topics"]),
        lambda r: f"{r['topic']}: " + (f"{_show_key(r)} " if r["key_hex"] else "") + r["problem"],
        "badly formatted keys",
    )


def _lookup_check(finish: Callable, asset: str, spark, topics, config, p: dict, gxr: _GX) -> None:
    gx = gxr.gx
    finish(
        f"Lookup {p['lookup']} has a non-null unique key and values that parse as declared.",
        lookup_findings(spark, topics, config, p["lookup"]),
        lambda r: f"{_show_key(r)}: {r['problem']}",
        "bad lookup rows",
        extra=[
            gx.expectations.ExpectColumnValuesToNotBeNull(column="key_hex"),
            gx.expectations.ExpectColumnValuesToBeUnique(column="key_hex"),
        ],
    )


# What each check type of CHECK_TYPES runs (a co-partitioning check of a join is one of its own)
_CHECKS: dict[str, Callable] = {
    "completeness": _completeness_check,
    "join_co_partitioning": _join_co_partitioning_check,
    "co_partitioning": _co_partitioning_check,
    "key_format": _key_format_check,
    "lookup_basics": _lookup_check,
}


def _co_partitioning(finish: Callable, asset: str, topics: list[str], spark, reader, config) -> None:
    """Same partition count, and every key in the same partition of each topic, the one its
    partitioner gives (what a table or stream-table join needs)."""
    counts, keys = co_partitioning_findings(spark, reader, config, topics)
    finish(
        f"Topics {', '.join(topics)} have the same partition count.",
        counts,
        lambda r: r["problem"],
        "partition-count mismatches",
        name=f"{asset}.counts",
    )
    finish(
        f"Every key of {', '.join(topics)} sits in the same partition in each topic, the one "
        "its topic's partitioner gives.",
        keys,
        lambda r: f"{_show_key(r)}: {r['problem']}",
        "misplaced keys",
    )


def _record(
    spark: SparkSession, lake: Lake, report: QualityReport, suites: list[Suite], snapshot: Snapshot
) -> None:
    ensure_quality_runs(lake)
    versions = {s.name: s.version for s in suites}
    when = datetime.fromisoformat(report.run_time)
    rows = [
        {
            "run_id": report.run_id,
            "run_time": when,
            "pipeline": report.pipeline,
            "suite": r.suite,
            "suite_version": versions[r.suite],
            "check": r.check,
            "expectation": r.expectation,
            "success": r.success,
            "observed_value": r.observed_value,
            "offending_total": r.offending_total,
            "offending_sample": r.offending[:50],
            "topic_offsets": list(r.offsets.items()),
            "offsets_at": snapshot.taken_at,
        }
        for r in report.results
    ]
    # from the driver, one run's rows are one data file: they read back in the suite's order
    lake.append(QUALITY_RUNS, pa.Table.from_pylist(rows, schema=QUALITY_RUNS_SCHEMA))


def _docs_href(docs: str | None, page: Path) -> str | None:
    """The Data Docs link as seen from ``page``: relative, so it works on disk (file://) and when the
    reports are served over http (the Airflow UI's "Data quality" view)."""
    if not docs or not docs.startswith("file://"):
        return docs
    return os.path.relpath(docs.removeprefix("file://"), page.parent)


def render_summary(report: QualityReport, docs_href: str | None = None) -> str:
    """The page a person opens first: each expectation, passed or failed, with the offending keys."""
    status = "All checks passed" if report.success else "Some checks FAILED"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Data quality: {html.escape(report.pipeline)}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        ".ok{color:#176f2c}.bad{color:#b00020}li{margin:.2em 0}code{background:#f3f3f3}</style>",
        "</head><body>",
        f"<h1>Data quality: pipeline {html.escape(report.pipeline)}</h1>",
        f"<p class='{'ok' if report.success else 'bad'}'><strong>{status}</strong> "
        f"(run {html.escape(report.run_id)} at {html.escape(report.run_time)})</p>",
        f"<p>Checked the topics as Kafka held them: <code>{html.escape(report.covers())}</code></p>",
    ]
    docs_href = docs_href or report.data_docs
    if docs_href:
        parts.append(
            f"<p>Full validation results: <a href='{html.escape(docs_href)}'>"
            "Great Expectations Data Docs</a></p>"
        )
    for r in report.results:
        cls = "ok" if r.success else "bad"
        parts.append(
            f"<h2 class='{cls}'>{'PASSED' if r.success else 'FAILED'}: {html.escape(r.expectation)}</h2>"
        )
        parts.append(
            f"<p>Suite <code>{html.escape(r.suite)}</code>, check <code>{html.escape(r.check)}</code></p>"
        )
        if r.offending_total:
            shown = len(r.offending)
            head = f"{r.offending_total} offending" + (
                f" (first {shown} listed)" if shown < r.offending_total else ""
            )
            parts.append(f"<p>{head}:</p><ul>")
            parts += [f"<li>{html.escape(item)}</li>" for item in r.offending]
            parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
