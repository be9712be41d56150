"""Bronze: every declared Kafka topic mirrored into a Delta table, ``lake ingest``.

A Spark Structured Streaming query per topic reads Kafka (Spark's Kafka source, ``read_committed``,
from the earliest offset) and appends to the Delta table ``<root>/tables/<topic>`` (Delta's streaming
sink), exactly once through its checkpoint ``<root>/_checkpoints/ingest/<topic>``: a killed ingest
resumes where its last committed micro-batch ended, and Delta's sink skips a batch it already wrote.

The table has the columns of Spark's Kafka source: ``key`` (binary), ``value`` (binary, null is a
tombstone), ``topic`` (the Kafka name), ``partition``, ``offset``, ``timestamp``, ``timestampType`` and
``headers``; it is partitioned by ``partition``, has the change data feed on and is append-only.
After mirroring a lookup's topic the ingest refreshes the lookup's table
(``spark_jobs.topics.lookup_tables``).
These tables are the lake's queryable copy of the topics (SQL, time travel, history, dbt's sources);
the joins, the quality suites, the audits and the backfills read Kafka itself.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs import checkpoints, faults
from spark_jobs.config import LookupSpec, PipelineConfig, TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.runtime import lineage
from spark_jobs.runtime.jobs import HEARTBEAT_SECONDS, ingest_job, registered
from spark_jobs.runtime.metrics import IngestMetrics, serve
from spark_jobs.runtime.stopping import stop_on_signals
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import Cluster, connect, ensure_topics, watermarks
from spark_jobs.seams.storage import remove_tree, write_whole
from spark_jobs.topics.lookup_tables import refresh_lookup
from spark_jobs.topics.snapshots import RECORD_SCHEMA, records, stream

TOPIC_SCHEMA = RECORD_SCHEMA  # a bronze table has the columns of Spark's Kafka source
LOOKUP_REFRESH_SECONDS = 30.0  # a continuous ingest refreshes the lookup tables at most this often


def ensure_bronze(lake: Lake, spec: TopicSpec) -> None:
    """Create the topic's (empty) bronze table on first use."""
    if not lake.exists(spec.name):
        lake.create(
            spec.name,
            TOPIC_SCHEMA,
            partition_by=["partition"],
            description=f"bronze mirror of the Kafka topic {spec.name} ({spec.partitions} partitions)",
        )


def checkpoint_dir(lake: Lake, topic: str) -> Path:
    return lake.layout.ingest_checkpoint(topic)


@dataclass(frozen=True)
class Refreshed:
    """A lookup table's refresh: the Kafka offsets it is complete up to (None: its topic is not
    mirrored yet), and the keys it merged."""

    up_to: list[int] | None
    merged: int


@dataclass
class IngestSummary:
    topics: dict[str, int] = field(default_factory=dict)  # topic -> records appended
    seconds: float = 0.0
    lookups: dict[str, Refreshed] = field(default_factory=dict)  # lookup -> its refresh at the end

    def text(self) -> str:
        parts = ", ".join(f"{t} +{n:,}" for t, n in self.topics.items()) or "no topics"
        return f"ingest: {parts} in {self.seconds:.1f}s"


def _query(
    spark: SparkSession,
    lake: Lake,
    cluster: Cluster,
    spec: TopicSpec,
    once: bool,
    trigger_s: float,
    max_records: int | None,
):
    ensure_bronze(lake, spec)
    frame = stream(spark, cluster, [spec], _starting_offsets(lake, spec.name), max_records, headers=True)
    writer = (
        frame.writeStream.format("delta")
        .queryName(f"ingest_{spec.name}")
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint_dir(lake, spec.name)))
    )
    writer = (
        writer.trigger(availableNow=True) if once else writer.trigger(processingTime=f"{trigger_s} seconds")
    )
    return writer.start(lake.uri(spec.name))


def catch_up(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    topics: list[str] | None = None,
    *,
    max_records: int | None = None,
    log: Callable[[str], None] = lambda _: None,
    cluster: Cluster | None = None,
) -> IngestSummary:
    """Mirror ``topics`` (default: every declared topic) into their bronze tables up to their end as
    of now, then refresh the lookup tables of those topics (``lake ingest --once``; what a backfill
    hands its topic to). ``max_records`` caps the Kafka offsets one micro-batch reads per topic
    (Spark's ``maxOffsetsPerTrigger``).

    One ingest per topic runs at a time (``<root>/_locks/ingest-<topic>.lock``): on a topic that
    another ingest is mirroring (the continuous one), this waits until that one has passed the
    topic's end as of now. ``cluster``: the pipeline's cluster when the caller has it already (one
    connection per command)."""
    started = time.perf_counter()
    specs, cluster, before = _prepare(lake, config, topics, cluster)
    with ExitStack() as held:
        mine, others = _take(held, lake, specs)
        targets = {s.name: [high for _, high in watermarks(cluster, s)] for s in others}
        _await(
            [_query(spark, lake, cluster, s, True, 1.0, max_records) for s in mine], threading.Event(), None
        )
        for spec in others:
            log(f"ingest: {spec.name} is being mirrored by another ingest; waiting for it ...")
            _mirror_behind(spark, lake, cluster, spec, targets[spec.name], max_records)
        faults.point("mirror")  # bronze is written, the lookup tables not refreshed
        refreshed = refresh_lookups(spark, lake, config, _lookups_of(config, specs))
    return _summary(lake, specs, before, refreshed, started, log)


def run_continuous(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    topics: list[str] | None = None,
    *,
    trigger_seconds: float = 1.0,
    max_records: int | None = None,
    stop: threading.Event | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> IngestSummary:
    """Mirror ``topics`` (default: every declared topic) until ``stop`` is set (or SIGTERM / Ctrl-C),
    a micro-batch every ``trigger_seconds``, refreshing their lookup tables at most every
    ``LOOKUP_REFRESH_SECONDS`` and once more at the end (``lake ingest --continuous``). It registers as
    the pipeline's job ``ingest:<pipeline>`` under ``<root>/_jobs`` (pid, heartbeat, each topic's last
    batch; ``lake ingest --detach`` starts it detached, ``lake status`` shows it); a second one of the
    pipeline, or of one of its topics, is refused."""
    started = time.perf_counter()
    specs, cluster, before = _prepare(lake, config, topics, None)
    with ExitStack() as held:
        beat = held.enter_context(registered(lake, ingest_job(config), "continuous"))
        mine, others = _take(held, lake, specs)
        if others:
            names = ", ".join(s.name for s in others)
            raise UserError(f"a continuous ingest of {names} is already running (lake ingest --continuous)")
        held.enter_context(
            lineage.job_run(
                config,
                "ingest",
                lambda: [lineage.topic(cluster, config, s.name) for s in mine],
                lambda: [lineage.table(lake, s.name) for s in mine],
            )
        )
        queries = [_query(spark, lake, cluster, s, False, trigger_seconds, max_records) for s in mine]
        metrics = None
        if config.metrics is not None:
            metrics = IngestMetrics(
                config, cluster, {s.name: s.partitions for s in mine}, lambda: _positions(lake, mine)
            )
            held.callback(metrics.close)
            beat({"metrics_url": serve(metrics, config, None, log)})
        refresh = lambda: refresh_lookups(spark, lake, config, _lookups_of(config, specs))  # noqa: E731
        _await(queries, stop or threading.Event(), beat, _Every(LOOKUP_REFRESH_SECONDS, refresh), metrics)
        faults.point("mirror")  # bronze is written, the lookup tables not refreshed
        refreshed = refresh()
    return _summary(lake, specs, before, refreshed, started, log)


def _prepare(
    lake: Lake, config: PipelineConfig, topics: list[str] | None, cluster: Cluster | None
) -> tuple[list[TopicSpec], Cluster, dict[str, int]]:
    """The topics' specs, the cluster, the topics created on Kafka when missing (Spark's source needs
    them) and their bronze tables (before anything registers: whoever sees a job running finds the
    tables), and how many records each bronze table holds now."""
    specs = [config.topic(t) for t in topics] if topics else list(config.topics.values())
    cluster = cluster or connect(config, lake.root)
    ensure_topics(cluster, specs)
    for spec in specs:
        ensure_bronze(lake, spec)
    return specs, cluster, {s.name: mirrored_records(lake, s) for s in specs}


def _take(held: ExitStack, lake: Lake, specs: list[TopicSpec]) -> tuple[list[TopicSpec], list[TopicSpec]]:
    """The topics this ingest mirrors itself (their locks taken, held by ``held``) and the topics
    another ingest is mirroring."""
    mine: list[TopicSpec] = []
    others: list[TopicSpec] = []
    for spec in specs:
        taken = held.enter_context(lake.lock(f"ingest-{spec.name}", wait=False))
        (mine if taken else others).append(spec)
    return mine, others


def _lookups_of(config: PipelineConfig, specs: list[TopicSpec]) -> list[LookupSpec]:
    names = {s.name for s in specs}
    return [lk for lk in config.lookups.values() if lk.topic in names]


def _summary(
    lake: Lake,
    specs: list[TopicSpec],
    before: dict[str, int],
    refreshed: dict[str, Refreshed],
    started: float,
    log: Callable[[str], None],
) -> IngestSummary:
    summary = IngestSummary(
        {s.name: mirrored_records(lake, s) - before[s.name] for s in specs},
        time.perf_counter() - started,
        refreshed,
    )
    log(summary.text())
    return summary


class _Every:
    """Call ``work`` at most every ``seconds``."""

    def __init__(self, seconds: float, work: Callable[[], Any]):
        self.seconds, self.work, self.last = seconds, work, time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.last >= self.seconds:
            self.work()
            self.last = time.monotonic()


def refresh_lookups(
    spark: SparkSession, lake: Lake, config: PipelineConfig, lookups: list[LookupSpec]
) -> dict[str, Refreshed]:
    """Bring the lookup tables up to their bronze tables, each recording the Kafka offsets it is then
    complete up to: its mirror's, read before the refresh reads the bronze table."""
    refreshed = {}
    for lookup in lookups:
        up_to = mirrored_up_to(lake, config.topic(lookup.topic))
        refreshed[lookup.name] = Refreshed(up_to, refresh_lookup(spark, lake, lookup, up_to))
    return refreshed


def _positions(lake: Lake, specs: list[TopicSpec]) -> dict[str, dict[int, int]]:
    """The Kafka positions the ingest's checkpoints have committed, of every topic in ``specs``."""
    out: dict[str, dict[int, int]] = {}
    for spec in specs:
        out.update(checkpoints.committed_positions(checkpoint_dir(lake, spec.name)) or {})
    return out


def _await(
    queries: list,
    stop: threading.Event,
    beat: Callable[[dict], None] | None,
    upkeep: Callable[[], None] | None = None,
    metrics: IngestMetrics | None = None,
) -> None:
    last_beat = time.monotonic()
    with stop_on_signals(stop):
        try:
            while any(q.isActive for q in queries):
                if stop.is_set():
                    break
                for q in queries:
                    q.awaitTermination(0.5)
                    if metrics is not None:
                        metrics.query(q.name.removeprefix("ingest_"), q)
                if upkeep is not None:
                    upkeep()
                if beat and time.monotonic() - last_beat >= HEARTBEAT_SECONDS:  # alive, even when idle
                    beat({"topics": {q.name.removeprefix("ingest_"): _progress(q) for q in queries}})
                    last_beat = time.monotonic()
        finally:
            for q in queries:
                if q.isActive:
                    q.stop()
    for q in queries:
        error = q.exception()
        if error is not None:
            raise UserError(f"ingest of {q.name.removeprefix('ingest_')} failed: {_first_line(error)}")


def _progress(query) -> dict[str, Any]:
    """The query's last micro-batch, for the job registry: when, and how many records."""
    last = query.lastProgress or {}
    return {"last_batch_id": last.get("batchId"), "last_batch_rows": last.get("numInputRows")}


def committed_offsets(lake: Lake, topic: str) -> dict[int, int]:
    """Per partition, the Kafka offset the ingest's last committed micro-batch read up to."""
    positions = checkpoints.committed_positions(checkpoint_dir(lake, topic)) or {}
    return {p: o for by_partition in positions.values() for p, o in by_partition.items()}


def mirrored_up_to(lake: Lake, spec: TopicSpec) -> list[int] | None:
    """Per partition, the Kafka offset the topic's bronze table is complete up to: where the ingest's
    last committed micro-batch read up to (a transaction's commit marker included, so a mirror that
    has caught up shows the topic's end offsets), else where a rebuilt table's records end; None: no
    ingest yet. From the checkpoint's files, no Spark."""
    done = committed_offsets(lake, spec.name)
    if not done:
        start = lake.layout.ingest_start(spec.name)
        if not start.exists():
            return None
        done = {int(p): int(o) for ends in json.loads(start.read_text()).values() for p, o in ends.items()}
    return [done.get(p, 0) for p in range(spec.partitions)]


def _mirror_behind(
    spark: SparkSession,
    lake: Lake,
    cluster: Cluster,
    spec: TopicSpec,
    ends: list[int],
    max_records: int | None,
    timeout: float = 300.0,
) -> None:
    """Wait until the ingest holding the topic (a continuous one, or another command's) has mirrored
    it up to ``ends``. One that ends before (it started before the last of those records were
    written) leaves the topic to this one, which mirrors the rest itself."""
    deadline = time.monotonic() + timeout
    while True:
        done = committed_offsets(lake, spec.name)
        if all(done.get(p, 0) >= end for p, end in enumerate(ends) if end > 0):
            return
        with lake.lock(f"ingest-{spec.name}", wait=False) as mine:
            if mine:
                query = _query(spark, lake, cluster, spec, True, 1.0, max_records)
                _await([query], threading.Event(), None)
                return
        if time.monotonic() > deadline:
            raise UserError(
                f"the running ingest of {spec.name} has not reached offsets {ends} within {timeout:g} s "
                f"(it is at {done}); is it stuck? see lake status"
            )
        time.sleep(0.5)


def mirrored_records(lake: Lake, spec: TopicSpec) -> int:
    """How many records the bronze table holds (from the Delta log's file statistics)."""
    if not lake.exists(spec.name):
        return 0
    from pyspark.sql import functions as F

    total = lake.files(spec.name).agg(F.sum("num_records")).first()
    return int(total[0] or 0) if total is not None else 0


def rebuild_bronze(spark: SparkSession, lake: Lake, config: PipelineConfig, spec: TopicSpec) -> int:
    """Replace a topic's bronze table with the Kafka topic's current records (after the topic was
    replaced, ``lake topic repartition``): one Delta overwrite, so the readers that keep positions in
    the table see a rewrite, and a new ingest checkpoint that continues after those records."""

    cluster = connect(config, lake.root)
    with lake.lock(f"ingest-{spec.name}", wait=False) as mine:
        if not mine:
            raise UserError(
                f"a continuous ingest of {spec.name} is running; stop it before rebuilding bronze"
            )
        ends = [high for _, high in watermarks(cluster, spec)]
        frame = records(spark, cluster, spec, ends)
        ensure_bronze(lake, spec)
        lake.overwrite(spec.name, frame)
        checkpoint = checkpoint_dir(lake, spec.name)
        remove_tree(checkpoint)
        write_whole(
            lake.layout.ingest_start(spec.name),
            json.dumps({cluster.topic(spec.name): {str(p): end for p, end in enumerate(ends)}}),
        )
    return mirrored_records(lake, spec)


def _starting_offsets(lake: Lake, topic: str) -> str:
    """Where a new ingest checkpoint starts: after a rebuilt table's records, else the beginning."""
    path = lake.layout.ingest_start(topic)
    return path.read_text() if path.exists() else "earliest"


def _first_line(error) -> str:
    text = str(getattr(error, "desc", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__
