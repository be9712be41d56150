"""Backfills: a dump loaded into a lookup's Kafka topic.

A backfill compares the dump with the topic as Kafka holds it when the comparison starts (its end
offsets, named in the summary) and produces only records that change something (a new key, or a
value different from the topic's latest one; JSON compared by content; with ``missing_only`` only new
keys) in one Kafka transaction (idempotent producer, ``acks=all``), with the partitioner of the topics
the lookup is joined with unless told otherwise; then, whether it wrote anything or not, it mirrors
the topic into bronze, which refreshes the lookup table (``spark_jobs.topics.lookup_tables``), and
says up to which offsets the lookup table is complete. So a backfill that died after its records
reached Kafka is mended by running it again: the rerun has nothing to write, and still brings the
lookup table up to the topic. Bad lines go to the ``quarantine`` table. Backfills of one topic take
turns, so a second one sees what the first wrote.

Crash points (``spark_jobs.faults``): ``backfill-read``, ``backfill-diff``, then the Kafka seam's
``produce`` and ``commit``, then the ingest's ``mirror`` and ``refresh``.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import faults
from spark_jobs.config import LookupSpec, PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.formats import Codec, Formats
from spark_jobs.layout import lookup_table
from spark_jobs.lookups.dumps import dump_source, parse_dump, read_lines
from spark_jobs.runtime import lineage
from spark_jobs.seams import partitioners
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import Cluster, connect, produce
from spark_jobs.seams.session import arrow_frame
from spark_jobs.system_tables import QUARANTINE, ensure_quarantine
from spark_jobs.topics import ingest
from spark_jobs.topics.produce_consume import producing
from spark_jobs.topics.snapshots import SnapshotReader, take


@dataclass
class BackfillSummary:
    lookup: str
    topic: str
    source: str
    partitioner: str
    dry_run: bool
    missing_only: bool = False  # changed keys are counted, not written (the topic may be newer)
    lines: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    duplicates: int = 0  # good lines whose key appears again later in the dump (the last one wins)
    rejected: int = 0
    written: int = 0
    compared_with: str = ""  # the topic's offsets the dump was compared with
    lookup_up_to: list[int] | None = None  # the offsets the lookup table is complete up to afterwards
    lookup_changed: bool = False  # the lookup table got rows (this run's, or a crashed run's records)
    seconds: float = 0.0
    rejects_sample: list[dict] | None = None

    def text(self) -> str:
        verb = "would write" if self.dry_run else "wrote"
        return (
            f"backfill {self.lookup} from {self.source} ({self.partitioner}): {self.lines:,} lines read, "
            f"{self.new:,} new keys, {self.changed:,} changed"
            + (
                " (not written: the topic may be newer than the dump)"
                if self.missing_only and self.changed
                else ""
            )
            + f", {self.unchanged:,} unchanged, "
            f"{self.duplicates:,} superseded duplicates, {self.rejected:,} rejected; {verb} "
            f"{self.written:,} records to {self.topic}"
            + f" in {self.seconds:.1f}s; compared with {self.compared_with}"
            + (f"; lookup table up to offsets {self.lookup_up_to}" if self.lookup_up_to is not None else "")
            + (" [dry run: nothing written]" if self.dry_run else "")
        )

    def as_dict(self) -> dict:
        return asdict(self)


def run_backfill(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    lookup_name: str,
    source: str | None = None,
    separator: str | None = None,
    partitioner: str | None = None,
    dry_run: bool = False,
    max_rejects: int = 0,
    missing_only: bool = False,
    log=print,
) -> BackfillSummary:
    """Produce the dump's keys that the lookup's topic lacks or holds with another value (only the
    lacking ones with ``missing_only``: what a scheduled run does, since the topic may hold a newer
    value than a dump exported earlier), compared with the topic on Kafka as it is when the
    comparison starts; then, written or not (unless a dry run), mirror the topic into bronze and
    refresh the lookup table up to the topic's end offsets.

    Backfills of one topic take turns (``<root>/_locks/backfill-<topic>.lock``): the second compares
    with what the first wrote, so two runs of one dump write it once."""
    started = time.perf_counter()
    lookup = config.lookup(lookup_name)
    topic = config.topics[lookup.topic]
    spec = lookup.backfill
    path = source or (str(spec.source) if spec.source else None)
    if path is None:
        raise UserError(f"lookup '{lookup.name}' declares no backfill source: give one with --from FILE")
    path = dump_source(path)
    chosen = partitioners.check_partitioner(partitioner or config.lookup_partitioner(lookup))
    summary = BackfillSummary(lookup.name, topic.name, str(path), chosen, dry_run, missing_only)

    cluster = connect(config, lake.root)
    formats = Formats(config, lake.root, cluster.topic)
    codecs = (formats.writing(topic.name, "key", None), formats.writing(topic.name, "value", None))

    def outputs() -> list:
        written = (
            []
            if dry_run
            else [lineage.table(lake, topic.name), lineage.table(lake, lookup_table(lookup.name))]
        )
        return [lineage.topic(cluster, config, topic.name, formats), *written]

    with lineage.job_run(config, f"backfill.{lookup.name}", lambda: [lineage.file(str(path))], outputs):
        with _readable(lake, path, log) as where:
            log(f"reading {path} ...")
            parsed = parse_dump(read_lines(spark, where, path), spec, codecs, separator)
            if codecs[0].registered or codecs[1].registered:
                parsed = _encoded(spark, parsed, codecs)
            parsed = parsed.persist()
            try:
                counts = parsed.agg(F.count("*").alias("lines"), F.count("reason").alias("rejected")).first()
                assert counts is not None  # an aggregate without grouping always has one row
                summary.lines, summary.rejected = int(counts["lines"]), int(counts["rejected"])
                faults.point("backfill-read")
                with lake.lock(f"backfill-{topic.name}", log):
                    _diff_and_produce(
                        spark, lake, cluster, formats, lookup, parsed, summary, max_rejects, log
                    )
            finally:
                parsed.unpersist()
        if not dry_run:
            # handed to the ingest: the mirror and the lookup table, up to the topic's end; also when
            # nothing was written, so a rerun after a crash between the write and the refresh finishes
            # what that run began
            refreshed = ingest.catch_up(spark, lake, config, [topic.name], log=log, cluster=cluster).lookups
            summary.lookup_up_to = refreshed[lookup.name].up_to
            summary.lookup_changed = refreshed[lookup.name].merged > 0
            log(f"lookup {lookup.name}: up to offsets {summary.lookup_up_to}")
    summary.seconds = time.perf_counter() - started
    return summary


@contextmanager
def _readable(lake: Lake, source: str, log) -> Iterator[str]:
    """Where the executors read the dump ``source`` from: where it is, or, for a local file and a
    lake on an object store (whose executors may run on machines without this one's disk), a copy
    under the root (``_uploads/``), removed when the backfill ends."""
    from spark_jobs.seams.storage import ObjectPath, remove_tree, scheme_of

    if scheme_of(source) is not None or not lake.root.on_object_storage:
        yield source
        return
    target = lake.layout.upload(Path(source).name)
    assert isinstance(target, ObjectPath)
    log(f"copying {source} ({Path(source).stat().st_size:,} bytes) to {target} for the executors ...")
    try:
        with open(source, "rb") as local, target.fs.open_output_stream(target.key) as remote:
            shutil.copyfileobj(local, remote, 8 * 1024 * 1024)
        yield str(target)
    finally:
        remove_tree(target.parent)


def _diff_and_produce(
    spark: SparkSession,
    lake: Lake,
    cluster: Cluster,
    formats: Formats,
    lookup: LookupSpec,
    parsed: DataFrame,
    summary: BackfillSummary,
    max_rejects: int,
    log,
) -> None:
    """Compare the dump's good lines with the topic as Kafka holds it now, then (unless a dry run)
    produce what changes something in one transaction and quarantine the rejected lines; the counts
    and the records written go into ``summary``."""
    topic = formats.config.topics[lookup.topic]
    snapshot = take(cluster, [topic])
    summary.compared_with = snapshot.covers()
    log(f"comparing with {summary.compared_with}")
    reader = SnapshotReader(spark, cluster, {topic.name: topic}, snapshot, formats)
    codec = formats.codec(topic.name, "value")
    try:
        current = reader.latest(topic.name).select("key", "value")
        codec.learn(current, "value")  # the writer schemas of the topic's records
        rejects = parsed.filter(F.col("reason").isNotNull())
        if summary.rejected:
            rejects = _name_plain_keys(rejects, current)
        sample = rejects.orderBy("line").limit(5).select("line", "reason", F.hex("raw").alias("raw_hex"))
        summary.rejects_sample = [r.asDict() for r in sample.collect()]
        if summary.rejected > max_rejects:
            first = summary.rejects_sample[0] if summary.rejects_sample else {}
            raise UserError(
                f"{summary.source}: {summary.rejected:,} rejected line(s), more than --max-rejects "
                f"{max_rejects}; nothing was written (first: line {first.get('line')}: {first.get('reason')})"
            )
        diff = _diff(parsed.filter(F.col("reason").isNull()), current, codec).persist()
        try:
            by_change = {
                r["change"]: r["n"] for r in diff.groupBy("change").agg(F.count("*").alias("n")).collect()
            }
            summary.new = int(by_change.get("new", 0))
            summary.changed = int(by_change.get("changed", 0))
            summary.unchanged = int(by_change.get("unchanged", 0))
            summary.duplicates = (
                summary.lines - summary.rejected - summary.new - summary.changed - summary.unchanged
            )
            write = ["new"] if summary.missing_only else ["new", "changed"]
            if summary.dry_run:
                summary.written = summary.new + (0 if summary.missing_only else summary.changed)
                return
            faults.point("backfill-diff")
            to_write = diff.filter(F.col("change").isin(write)).orderBy("line").select("key", "value")
            records = to_write.toArrow()
        finally:
            diff.unpersist()
        if records.num_rows:
            name = cluster.topic(topic.name)
            log(f"producing {records.num_rows:,} records to {name} with {summary.partitioner} ...")
            with producing(lake, topic.name, log=log) as transactional_id:
                result = produce(
                    cluster,
                    topic,
                    [(records.column("key").combine_chunks(), records.column("value").combine_chunks())],
                    summary.partitioner,
                    transactional_id=transactional_id,
                )
            summary.written = result.records
        if summary.rejected:
            _quarantine(lake, f"backfill:{lookup.name}", rejects)
    finally:
        reader.close()


def _diff(good: DataFrame, current: DataFrame, codec: Codec) -> DataFrame:
    """The dump's last value per key (``key``, ``value``, ``line``) against the topic's ``current``
    value: ``change`` is new, changed or unchanged (JSON compared by content, a registry format's
    records by their decoded values)."""
    last = good.groupBy("key").agg(F.max_by("value", "line").alias("value"), F.max("line").alias("line"))
    return (
        last.alias("d")
        .join(current.alias("c"), F.col("d.key") == F.col("c.key"), "left")
        .select(
            F.col("d.key").alias("key"),
            F.col("d.value").alias("value"),
            F.col("d.line").alias("line"),
            F.when(F.col("c.key").isNull(), "new")
            .when(
                codec.comparable(F.col("c.value")).eqNullSafe(codec.comparable(F.col("d.value"))),
                "unchanged",
            )
            .otherwise("changed")
            .alias("change"),
        )
    )


def _name_plain_keys(rejects: DataFrame, current: DataFrame) -> DataFrame:
    """A line rejected for a key with invisible bytes (``"m2"``, ``m2 ``, a BOM) says which key of the
    topic it differs from only in them, when there is one: never matched silently, always named."""
    plain = rejects.select("plain_key").where(F.col("plain_key").isNotNull()).distinct()
    known = current.select(F.col("key").alias("plain_key")).join(F.broadcast(plain), "plain_key")
    named = rejects.join(known.withColumn("_known", F.lit(True)), "plain_key", "left")
    hint = F.concat(F.lit("; the topic has the key '"), F.col("plain_key").cast("string"), F.lit("'"))
    return named.withColumn(
        "reason", F.when(F.col("_known"), F.concat(F.col("reason"), hint)).otherwise(F.col("reason"))
    ).drop("_known")


def _encoded(spark: SparkSession, parsed: DataFrame, codecs: tuple[Codec, Codec]) -> DataFrame:
    """The good lines' keys and values written in the topic's registry formats (framed with the
    subject's schema); a line whose key or value does not fit becomes a rejected line naming the
    field. The lines are encoded on the driver, a dump's worth of records in Python."""
    good = parsed.filter(F.col("reason").isNull()).select("line", "key", "value").toArrow()
    out: dict[str, list] = {"line": [], "_key": [], "_value": [], "_reason": []}
    for line, key, value in zip(*(good.column(c).to_pylist() for c in ("line", "key", "value")), strict=True):
        reason = None
        try:
            key = codecs[0].encode_text(key) if codecs[0].registered else key
        except ValueError as exc:
            reason = f"key {exc}"
        if reason is None and value is not None and codecs[1].registered:
            try:
                value = codecs[1].encode_text(value)
            except ValueError as exc:
                reason = f"value {exc}"
        out["line"].append(line)
        out["_key"].append(None if reason else key)
        out["_value"].append(None if reason else value)
        out["_reason"].append(reason)
    fixed = arrow_frame(spark, pa.table(out, schema=ENCODED))
    joined = parsed.join(fixed, "line", "left")
    why = F.coalesce(F.col("reason"), F.col("_reason"))
    return joined.select(
        "source",
        "line",
        "raw",
        F.when(why.isNull(), F.col("_key")).alias("key"),
        F.when(why.isNull(), F.col("_value")).alias("value"),
        why.alias("reason"),
        "plain_key",
    )


ENCODED = pa.schema(
    [("line", pa.int64()), ("_key", pa.binary()), ("_value", pa.binary()), ("_reason", pa.string())]
)


def _quarantine(lake: Lake, job: str, rejects: DataFrame) -> None:
    ensure_quarantine(lake)
    rows = rejects.select(
        F.lit(str(uuid.uuid4())).alias("run_id"),
        F.lit(datetime.now(UTC)).alias("run_time"),
        F.lit(job).alias("job"),
        "source",
        "line",
        F.hex("raw").alias("raw_hex"),
        "reason",
        F.lit(None).cast("string").alias("topic"),
        F.lit(None).cast("int").alias("partition"),
        F.lit(None).cast("string").alias("key_hex"),
        F.lit("bad_line").alias("cause"),
    )
    lake.append(QUARANTINE, rows)
