"""The oracle: each join kind recomputed as a plain batch join of the topics, with Spark SQL, apart
from the engine's incremental code. ``lake audit`` and the tests compare a join's result with it.

``lake audit`` reads the topics from Kafka up to the offsets the join has consumed (its checkpoint),
so a job that is behind is not reported as wrong, and says which offsets it compared; records the
engine quarantines are left out the same way. A key on whose records the ``select`` fails (a poison
pill: the engine quarantines the record and keeps the key's result as it was, which depends on how
the records fell into micro-batches) is not compared, and the audit names it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from spark_jobs.config import JoinSpec, PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.joins.derive import NEWEST
from spark_jobs.joins.engine import Projection, adopt_former_names, prepare, side_records
from spark_jobs.joins.keyed import LeftKeys
from spark_jobs.joins.lists import ListProjection
from spark_jobs.joins.poison import guarded_frame
from spark_jobs.joins.registry import JOBS
from spark_jobs.joins.runner import consumed_offsets, offsets_read
from spark_jobs.kafka import connect
from spark_jobs.lake import Lake, conform
from spark_jobs.layout import join_table
from spark_jobs.snapshots import records as kafka_records
from spark_jobs.snapshots import take

SAMPLE = 10
Records = Callable[[str], DataFrame]  # a declared topic -> its records (Spark's Kafka columns)


def _records(
    config: PipelineConfig, frame: DataFrame, topic: str, side: str, keys: LeftKeys | None = None
) -> DataFrame:
    """A topic's valid records (as the engine accepts them); with ``keys``, the left records' foreign /
    derived key (``by``) or list (``items``, ``ids``)."""
    df = side_records(frame, side)
    df = prepare(df, {side: config.topic(topic).value_format})
    if keys is not None:
        df = keys.add(df)
    return df.filter(F.col("reason").isNull()).drop("reason", "side")


def consumed_records(
    spark: SparkSession, lake: Lake, config: PipelineConfig, spec: JoinSpec
) -> tuple[Records, str]:
    """The join's topics as it has consumed them: a reader of each topic's records from Kafka up to
    the offsets of its last committed micro-batch (the topics' end offsets now, when it has none),
    and which offsets those are."""
    cluster = connect(config, lake.root)
    upto = consumed_offsets(lake, config, spec, cluster)
    if upto is None:
        snapshot = take(cluster, [config.topic(t) for _, t in spec.sides])
        upto = {side: list(snapshot.ends[topic]) for side, topic in spec.sides}
    ends = {topic: upto[side] for side, topic in spec.sides}
    return (lambda topic: kafka_records(spark, cluster, config.topic(topic), ends[topic])), offsets_read(
        spec, config, upto
    )


def _latest(records: DataFrame) -> DataFrame:
    order = Window.partitionBy("key").orderBy(F.col("timestamp").desc(), F.col("offset").desc())
    return records.withColumn("_rn", F.row_number().over(order)).filter("_rn = 1").drop("_rn")


@dataclass
class Expected:
    """The oracle's rows, and the keys it left out because the join's ``select`` fails on them (a
    data error: the engine quarantines such records and leaves the key's result as it was, which
    depends on how the records fell into micro-batches)."""

    table: pa.Table
    failing_keys: list[bytes]


def expected(
    spark: SparkSession, lake: Lake, config: PipelineConfig, name: str, records: Records
) -> pa.Table:
    """The join's result as a batch join of its topics' ``records``."""
    return expected_rows(spark, lake, config, name, records).table


def expected_rows(
    spark: SparkSession, lake: Lake, config: PipelineConfig, name: str, records: Records
) -> Expected:
    """:func:`expected`, with the keys on which the select fails left out and named."""
    spec = config.join(name)
    keys = LeftKeys(spark, config, spec) if spec.join_kind.keyed_by else None
    left = _records(config, records(spec.left), spec.left, "left", keys)
    right = _records(config, records(spec.right), spec.right, "right") if spec.right else None
    rows, project = ORACLES[spec.kind](spark, lake, config, spec, left, right)
    found = guarded_frame(project, rows)
    table = conform(found.output, lake.schema(spec.name), f"oracle of {spec.name}")
    return Expected(table, sorted(set(found.failed.column("key").to_pylist())))


# A kind's oracle: (spark, lake, config, spec, left records, right records or None) -> the joined
# rows, and the projection that makes them result rows (the join's select)
Oracle = Callable[..., tuple[DataFrame, Callable[[DataFrame], DataFrame]]]


def _live(records: DataFrame) -> DataFrame:
    """Each key's latest record, when it is not a tombstone."""
    return _latest(records).filter(F.col("value").isNotNull())


def _table(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame):
    """table: both sides' latest live values per key, joined."""
    how = {"inner": "inner", "left": "left", "outer": "full"}[spec.type]
    lhs = _live(left).select("key", F.col("value").alias("left_value"))
    return lhs.join(_right_values(right), "key", how), Projection(spark, config, spec).frame


def _stream_table(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame):
    """stream-table: each left event with the right value as of its timestamp (events still waiting
    for the right side to be read are the engine's, not yet in the result)."""
    events = left.filter(F.col("value").isNotNull()).alias("l")
    r = right.alias("r")
    cond = (F.col("l.key") == F.col("r.key")) & (F.col("r.timestamp") <= F.col("l.timestamp"))
    joined = events.join(r, cond, "left")
    order = Window.partitionBy("l.partition", "l.offset").orderBy(
        F.col("r.timestamp").desc_nulls_last(), F.col("r.offset").desc_nulls_last()
    )
    rows = (
        joined.withColumn("_rn", F.row_number().over(order))
        .filter("_rn = 1")
        .select(
            F.col("l.key").alias("key"),
            F.col("l.timestamp").alias("timestamp"),
            F.col("l.partition").alias("partition"),
            F.col("l.offset").alias("offset"),
            F.col("l.value").alias("left_value"),
            F.col("r.value").alias("right_value"),
        )
    )
    if spec.type == "inner":
        rows = rows.filter(F.col("right_value").isNotNull())
    waiting = lake.read(join_table(spec.name, "waiting")).select("partition", "offset")
    return rows.join(waiting, ["partition", "offset"], "left_anti"), Projection(spark, config, spec).frame


def _stream_stream_oracle(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame):
    return _stream_stream(spark, lake, spec, left, right), Projection(spark, config, spec).frame


def _right_values(right: DataFrame) -> DataFrame:
    return _live(right).select("key", F.col("value").alias("right_value"))


def _fk(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame):
    """fk: each live left record with the right value of the key its foreign key names."""
    rows = _live(left).select("key", F.col("value").alias("left_value"), F.col("by").alias("fk"))
    rhs = _right_values(right).withColumnRenamed("key", "fk")
    rows = rows.join(rhs, "fk", "inner" if spec.type == "inner" else "left").drop("fk")
    return rows, Projection(spark, config, spec).frame


def _derive(spark, lake, config, spec: JoinSpec, left: DataFrame, right: None):
    """derive: per derived key, the newest live master record that derives it."""
    newest = Window.partitionBy("by").orderBy(*[F.col(c).desc() for c in NEWEST])
    rows = (
        _live(left)
        .filter(F.col("by").isNotNull())
        .withColumn("_rn", F.row_number().over(newest))
        .filter("_rn = 1")
        .select(
            F.col("by").alias("key"), F.col("key").alias("master_key"), F.col("value").alias("left_value")
        )
    )
    return rows, Projection(spark, config, spec).frame


def _list(spark, lake, config, spec: JoinSpec, left: DataFrame, right: DataFrame):
    """list: each live left record with every element of its list and the right value it names."""
    lhs = _live(left)
    elements = lhs.select("key", F.posexplode(F.arrays_zip("items", "ids")).alias("pos", "e")).select(
        "key", "pos", F.col("e.items").alias("item"), F.col("e.ids").alias("id")
    )
    elements = elements.join(_right_values(right).withColumnRenamed("key", "id"), "id", "left")
    projection = ListProjection(spark, config, spec)
    return lhs.select("key", F.col("value").alias("left_value")), lambda some: projection.frame(
        some, elements
    )


# The oracle of every kind of spark_jobs.joins.kinds.KINDS (a kind without one is a KeyError, never
# another kind's oracle)
ORACLES: dict[str, Oracle] = {
    "table": _table,
    "stream-table": _stream_table,
    "stream-stream": _stream_stream_oracle,
    "fk": _fk,
    "derive": _derive,
    "list": _list,
}


def _stream_stream(
    spark: SparkSession, lake: Lake, spec: Any, left: DataFrame, right: DataFrame
) -> DataFrame:
    window_us = int(spec.window_ms) * 1000
    cols = ["key", "timestamp", "partition", "offset", "value"]
    lhs = left.filter(F.col("value").isNotNull()).select(*[F.col(c).alias(f"left_{c}") for c in cols])
    rhs = right.filter(F.col("value").isNotNull()).select(*[F.col(c).alias(f"right_{c}") for c in cols])
    gap = F.abs(F.unix_micros("left_timestamp") - F.unix_micros("right_timestamp"))
    pairs = lhs.join(rhs, (F.col("left_key") == F.col("right_key")) & (gap <= window_us), "inner")
    out = [
        F.coalesce("left_key", "right_key").alias("key"),
        *[F.col(f"{s}_{c}") for s in ("left", "right") for c in ("timestamp", "partition", "offset")],
        F.col("left_value"),
        F.col("right_value"),
    ]
    result = pairs.select(*out)
    progress = lake.read_arrow(join_table(spec.name, "progress"), columns=["watermark"])  # the last batch's
    if spec.type != "inner" and progress.num_rows:
        last = progress["watermark"][0].as_py()
        if last is not None:
            sides = [("left", lhs, rhs)] + ([("right", rhs, lhs)] if spec.type == "outer" else [])
            for side, mine, other in sides:
                o = "right" if side == "left" else "left"
                near = (
                    F.abs(F.unix_micros(f"{side}_timestamp") - F.unix_micros(f"{o}_timestamp")) <= window_us
                )
                lonely = mine.join(other, (F.col(f"{side}_key") == F.col(f"{o}_key")) & near, "left_anti")
                expired = F.unix_micros(f"{side}_timestamp") + window_us < F.lit(int(last.timestamp() * 1e6))
                lonely = lonely.filter(expired)
                for c in ("key", "timestamp", "partition", "offset", "value"):
                    lonely = lonely.withColumn(
                        f"{o}_{c}", F.lit(None).cast(mine.schema[f"{side}_{c}"].dataType)
                    )
                result = result.unionByName(lonely.select(*out))
    return result


@dataclass
class AuditReport:
    join: str
    expected_rows: int
    actual_rows: int
    missing: list[dict] = field(default_factory=list)  # expected, not in the result (sample)
    unexpected: list[dict] = field(default_factory=list)  # in the result, not expected (sample)
    differing_keys: list[Any] = field(default_factory=list)
    pending: int = 0
    read: str = ""  # the topics' offsets the expected rows were computed up to
    left_out: list[Any] = field(default_factory=list)  # keys the select fails on, not compared

    @property
    def clean(self) -> bool:
        return not self.missing and not self.unexpected

    def text(self) -> str:
        head = (
            f"audit {self.join}: {self.actual_rows} result rows, {self.expected_rows} expected by the batch "
            f"join of {self.read}"
        )
        if self.left_out:
            shown = ", ".join(_shown(k) for k in self.left_out[:SAMPLE])
            head += (
                f" ({len(self.left_out)} key(s) not compared, as the select fails on their records, "
                f"which the join quarantines: {shown})"
            )
        if self.clean:
            return f"{head}: identical"
        keys = ", ".join(_shown(k) for k in self.differing_keys[:SAMPLE])
        return f"{head}: DIFFERENT for {len(self.differing_keys)} key(s), e.g. {keys}"


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def _shown(key: Any) -> str:
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else str(key)


def audit(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    name: str,
    records: Records | None = None,
    read: str = "the given records",
) -> AuditReport:
    """Diff a join's result against the oracle (as multisets of rows) of its topics as the join has
    consumed them from Kafka, or of ``records`` (what ``read`` says they are)."""
    spec = config.join(name)
    if not lake.exists(spec.name):
        raise UserError(f"join {spec.name} has no result yet: run 'lake run {spec.name} --once' first")
    adopt_former_names(lake, spec, JOBS[spec.kind].state_tables(spec), lambda _: None)
    if records is None:
        records, read = consumed_records(spark, lake, config, spec)
    found = expected_rows(spark, lake, config, name, records)
    want_table = found.table
    have_table = lake.read_arrow(spec.name).cast(want_table.schema)
    sizes = (want_table.num_rows, have_table.num_rows)
    if found.failing_keys:
        compared = [
            pc.invert(pc.is_in(t["key"], pa.array(found.failing_keys, pa.binary())))
            for t in (want_table, have_table)
        ]
        want_table, have_table = want_table.filter(compared[0]), have_table.filter(compared[1])
    want = Counter(_hashable(r) for r in want_table.to_pylist())
    have = Counter(_hashable(r) for r in have_table.to_pylist())
    missing = [dict(r) for r in (want - have).elements()]
    unexpected = [dict(r) for r in (have - want).elements()]
    keys = sorted({r["key"] for r in missing + unexpected}, key=lambda k: (k is None, k or b""))
    report = AuditReport(spec.name, *sizes, missing, unexpected, keys)
    report.read = read
    report.left_out = found.failing_keys
    # what the join holds back: a stream-table's waiting events, a keyed join's parked result rows
    held = [join_table(spec.name, part) for part in ("waiting", "parked")]
    report.pending = sum(lake.read_arrow(t).num_rows for t in held if lake.exists(t))
    return report
