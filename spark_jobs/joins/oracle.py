"""The oracle: each join kind recomputed as a plain batch join of the topics, with Spark SQL, apart
from the engine's incremental code (each kind's ``expected``, in the kind's module). ``lake audit``
and the tests compare a join's result with it.

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
from spark_jobs.formats import Formats
from spark_jobs.joins.behind import pending
from spark_jobs.joins.engine import SideCodecs, adopt_former_names, prepare, side_records
from spark_jobs.joins.keyed import LeftKeys
from spark_jobs.joins.poison import guarded_frame
from spark_jobs.joins.registry import JOBS
from spark_jobs.joins.runner import consumed_offsets, offsets_read
from spark_jobs.layout import join_table
from spark_jobs.seams.delta import Lake, conform
from spark_jobs.seams.kafka import connect
from spark_jobs.topics.snapshots import records as kafka_records
from spark_jobs.topics.snapshots import take

SAMPLE = 10
Records = Callable[[str], DataFrame]  # a declared topic -> its records (Spark's Kafka columns)


def _records(
    codecs: SideCodecs, frame: DataFrame, side: str, keys: LeftKeys | None = None, null_keys: tuple = ()
) -> DataFrame:
    """A topic's valid records (as the engine accepts them: a null key only on ``null_keys``' sides);
    with ``keys``, the left records' foreign / derived key (``by``) or list (``items``, ``ids``)."""
    df = side_records(frame, side)
    df = prepare(df, SideCodecs({side: codecs.keys[side]}, {side: codecs.values[side]}), null_keys)
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


def _learnt(codecs: SideCodecs, frame: DataFrame, side: str) -> DataFrame:
    """The records, once the side's codecs know every schema id among them (the registry formats)."""
    codecs.keys[side].learn(frame, "key")
    codecs.values[side].learn(frame, "value")
    return frame


@dataclass
class Expected:
    """The oracle's rows, and the keys it left out because the join's ``select`` fails on them (a
    data error: the engine quarantines such records and leaves the key's result as it was, which
    depends on how the records fell into micro-batches); ``unordered_keys``: the result keys whose
    input records came out of timestamp order, whose value time and provenance (the kind's
    ``arrival_columns``) depend on the micro-batches too."""

    table: pa.Table
    failing_keys: list[bytes]
    unordered_keys: list[bytes] = field(default_factory=list)


def late_keys(records: DataFrame) -> DataFrame:
    """The keys (``key``) with a record whose timestamp is older than an earlier record's of the
    same key (by partition and offset): records that arrived out of timestamp order."""
    before = (
        Window.partitionBy("key").orderBy("partition", "offset").rowsBetween(Window.unboundedPreceding, -1)
    )
    earlier = F.max("timestamp").over(before)
    return (
        records.filter(F.col("key").isNotNull())
        .withColumn("__earlier", earlier)
        .filter(F.col("timestamp") < F.col("__earlier"))
        .select("key")
        .distinct()
    )


def unordered_keys(spec: JoinSpec, left: DataFrame, right: DataFrame | None) -> list[bytes]:
    """The result keys whose rows a record out of timestamp order reaches: a late left record's own
    key (a derive join's: the key it derives), a late right record's key, or, for the kinds whose
    left records reference right keys, every left key that referenced it."""
    kind = spec.join_kind
    late_left = late_keys(left)
    if kind.keyed_by == "key":  # derive: the result is keyed by what the left records derive
        found = left.join(late_left, "key", "left_semi").select(F.col("by").alias("key"))
    else:
        found = late_left
    if right is not None:
        late_right = late_keys(right).withColumnRenamed("key", "__late")
        if kind.has_list:
            referenced = left.select("key", F.explode_outer("ids").alias("__late"))
            found = found.union(referenced.join(late_right, "__late", "left_semi").select("key"))
        elif kind.references:
            referenced = left.select("key", F.col("by").alias("__late"))
            found = found.union(referenced.join(late_right, "__late", "left_semi").select("key"))
        else:
            found = found.union(late_right.select(F.col("__late").alias("key")))
    return sorted(r[0] for r in found.distinct().collect() if r[0] is not None)


def expected(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    name: str,
    records: Records,
    formats: Formats | None = None,
) -> pa.Table:
    """The join's result as a batch join of its topics' ``records``."""
    return expected_rows(spark, lake, config, name, records, formats).table


def expected_rows(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    name: str,
    records: Records,
    formats: Formats | None = None,
) -> Expected:
    """:func:`expected`, with the keys on which the select fails left out and named. ``formats``:
    the records' codecs (by default the pipeline's, its registry asked now)."""
    spec = config.join(name)
    codecs = SideCodecs.of(formats or Formats(config, lake.root), spec)
    keys = LeftKeys(spark, codecs, spec) if spec.join_kind.keyed_by else None
    streams = JOBS[spec.kind].null_key_sides
    left = _learnt(codecs, records(spec.left), "left")
    left = _records(codecs, left, "left", keys, streams)
    right = (
        _records(codecs, _learnt(codecs, records(spec.right), "right"), "right", None, streams)
        if spec.right
        else None
    )
    rows, project = JOBS[spec.kind].expected(spark, lake, config, spec, left, right, codecs)
    found = guarded_frame(project, rows)
    table = conform(found.output, lake.schema(spec.name), f"oracle of {spec.name}")
    unordered = unordered_keys(spec, left, right) if spec.join_kind.arrival_columns else []
    return Expected(table, sorted(set(found.failed.column("key").to_pylist())), unordered)


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
    # keys whose records came out of timestamp order: compared without these columns
    unordered: list[Any] = field(default_factory=list)
    unordered_columns: tuple[str, ...] = ()

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
        if self.unordered:
            shown = ", ".join(_shown(k) for k in self.unordered[:SAMPLE])
            head += (
                f" ({len(self.unordered)} key(s) whose records came out of timestamp order compared without "
                f"{', '.join(self.unordered_columns)}, which then depend on how the records fell into "
                f"micro-batches: {shown})"
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
    unordered = set(found.unordered_keys)
    arrival = spec.join_kind.arrival_columns

    def comparable(row: dict) -> Any:  # an unordered key's row without its arrival columns
        if row["key"] in unordered:
            row = {c: v for c, v in row.items() if c not in arrival}
        return _hashable(row)

    want = Counter(comparable(r) for r in want_table.to_pylist())
    have = Counter(comparable(r) for r in have_table.to_pylist())
    missing = [dict(r) for r in (want - have).elements()]
    unexpected = [dict(r) for r in (have - want).elements()]
    keys = sorted({r["key"] for r in missing + unexpected}, key=lambda k: (k is None, k or b""))
    report = AuditReport(spec.name, *sizes, missing, unexpected, keys)
    report.read = read
    report.left_out = found.failing_keys
    report.unordered = sorted(
        unordered & set(want_table.column("key").to_pylist() + have_table.column("key").to_pylist())
    )
    report.unordered_columns = arrival
    # what the join holds back: a stream-table's waiting events, a keyed join's parked result rows
    waiting, parked = join_table(spec.name, "waiting"), pending(lake, spec.name)
    report.pending = (lake.read_arrow(waiting).num_rows if lake.exists(waiting) else 0) + (
        parked.count() if parked is not None else 0
    )
    return report
