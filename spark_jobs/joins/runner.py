"""Running a join as a Spark Structured Streaming query, and what ``lake status`` / ``--reset`` see.

The join reads its topics with Spark's Kafka source (``read_committed``; one source subscribed to
both topics), tags each record with the side it comes from and hands the micro-batch to the engine
by ``foreachBatch``: a record goes from Kafka through the join's state operator into its result and
changelog topic in one micro-batch. The checkpoint under ``<root>/_checkpoints/<join>`` keeps each
partition's next Kafka offset; beside Spark's files it keeps the ids of the Kafka topics it reads
(``Layout.join_inputs``), so a topic replaced under the join (``lake topic repartition``, or deleted
and created again) stops it with one line instead of being read from offsets of another topic. A
running job registers itself under ``<root>/_jobs`` (``spark_jobs.runtime.jobs``), so a second copy refuses
to start.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import checkpoints, faults
from spark_jobs.config import JoinSpec, PipelineConfig, TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.joins.consumer_group import GroupPosition
from spark_jobs.joins.engine import RECORD_COLUMNS, BatchMetrics, Inputs
from spark_jobs.joins.registry import JOBS, job_for
from spark_jobs.joins.state_store import StateStoreJob
from spark_jobs.runtime import lineage
from spark_jobs.runtime.jobs import (
    HEARTBEAT_SECONDS,
    join_job,
    last_batch,
    last_batch_path,
    process_started,
    record_batch,
    registered,
    registry,
    running_jobs,
)
from spark_jobs.runtime.metrics import JoinMetrics, serve
from spark_jobs.runtime.stopping import stop_on_signals
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import (
    Cluster,
    connect,
    delete_topics,
    ensure_topics,
    offset_ranges,
    partition_counts,
    topic_ids,
    topic_prefix,
)
from spark_jobs.seams.storage import remove_tree, write_whole
from spark_jobs.topics import ingest
from spark_jobs.topics.snapshots import offsets_text, stream

STOP_MARKER = "lake: stop requested, this micro-batch is left for the next run"
PROGRESS_SECONDS = 1.0  # Spark's progress goes to the metrics at most this often
IDLE_SECONDS = 0.5  # a continuous run does its upkeep once no micro-batch ran for this long
Sides = dict[str, list[int]]  # side -> the next offset of each partition


def checkpoint_dir(lake: Lake, spec: JoinSpec) -> Path:
    return lake.layout.join_checkpoint(spec.name)


def input_stream(
    spark: SparkSession,
    cluster: Cluster,
    config: PipelineConfig,
    spec: JoinSpec,
    max_records: int | None = None,
) -> DataFrame:
    """A join's input: its topics' records as one stream, with the side each comes from."""
    frame = stream(spark, cluster, [config.topic(t) for _, t in spec.sides], max_records=max_records)
    side = F.lit("left")
    if spec.right is not None:
        side = F.when(F.col("topic") == cluster.topic(spec.left), "left").otherwise("right")
    return frame.select(side.alias("side"), *RECORD_COLUMNS)


def by_side(
    cluster: Cluster, config: PipelineConfig, spec: JoinSpec, positions: checkpoints.Positions
) -> Sides:
    """Kafka positions (topic -> partition -> next offset) as the join's sides: per side, the next
    offset of each declared partition (0 where nothing was read)."""
    out = {}
    for side, topic in spec.sides:
        read = positions.get(cluster.topic(topic), {})
        out[side] = [int(read.get(p, 0)) for p in range(config.topic(topic).partitions)]
    return out


def consumed_offsets(lake: Lake, config: PipelineConfig, spec: JoinSpec, cluster: Cluster) -> Sides | None:
    """The offsets the join's last committed micro-batch read up to, per side (None: nothing yet)."""
    checkpoint = checkpoint_dir(lake, spec)
    _refuse_bronze_checkpoint(checkpoint, spec)
    positions = checkpoints.committed_positions(checkpoint)
    return None if positions is None else by_side(cluster, config, spec, positions)


def offsets_read(spec: JoinSpec, config: PipelineConfig, sides: Sides) -> str:
    """``L up to offsets [2, 1], R up to offsets [1, 0]``."""
    return ", ".join(offsets_text(topic, sides[side]) for side, topic in spec.sides)


class KafkaInputs(Inputs):
    """How far a ``lake run`` of a stream kind has read (its checkpoint's offsets for the batch) and
    how far its topics go now (Kafka's end offsets)."""

    def __init__(self, checkpoint: Path, cluster: Cluster, config: PipelineConfig, spec: JoinSpec):
        self.checkpoint, self.cluster, self.config, self.spec = checkpoint, cluster, config, spec

    def read_to(self, batch_id: int) -> dict[str, np.ndarray]:
        positions = checkpoints.batch_positions(self.checkpoint, batch_id)
        sides = by_side(self.cluster, self.config, self.spec, positions)
        return {side: np.array(offsets, dtype=np.int64) for side, offsets in sides.items()}

    def ends(self, topic: TopicSpec) -> np.ndarray:
        ranges = offset_ranges(self.cluster, [topic])[topic.name][: topic.partitions]
        ends = np.zeros(topic.partitions, dtype=np.int64)
        ends[: len(ranges)] = [high for _, high in ranges]
        return ends


@dataclass
class RunSummary:
    join: str
    batches: int = 0
    input_rows: int = 0
    upserted: int = 0
    deleted: int = 0
    appended: int = 0
    quarantined: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # records not used, by reason
    stopped_by_signal: bool = False
    read: str = ""  # which offsets of which topics the join has read up to (offsets_read)

    def add(self, m: BatchMetrics) -> None:
        self.batches += 1
        self.input_rows += m.input_left + m.input_right
        self.upserted += m.upserted
        self.deleted += m.deleted
        self.appended += m.appended
        self.quarantined += m.quarantined
        self.dropped.update(m.dropped)

    def text(self) -> str:
        how = "stopped on request after" if self.stopped_by_signal else "processed"
        return (
            f"join {self.join}: {how} {self.batches} micro-batch(es): {self.input_rows} input records, "
            f"{self.upserted} upserted, {self.deleted} deleted, {self.appended} appended, "
            f"{self.quarantined} quarantined; read {self.read}"
            + (f"; dropped (in the quarantine): {dropped_text(self.dropped)}" if self.dropped else "")
        )


def dropped_text(dropped: dict[str, int]) -> str:
    """``undecodable 2, null_key 1``: records not used, by reason."""
    return ", ".join(f"{reason} {n}" for reason, n in sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0])))


def run_join(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    name: str,
    *,
    once: bool,
    trigger_seconds: float = 5.0,
    max_records: int | None = None,
    log: Callable[[str], None] = lambda _: None,
    stop: threading.Event | None = None,
    table_every: float | None = None,
) -> RunSummary:
    """Run a join: ``once`` processes everything its topics hold as it starts (their end offsets at
    that moment) and returns; otherwise it runs until ``stop`` is set or SIGTERM / SIGINT arrives,
    then stops after the current micro-batch. ``max_records`` caps the Kafka offsets one micro-batch
    reads. ``table_every`` > 0 (a keyed kind, continuous; default the join's ``table_every`` setting):
    the result table is written behind the changelog topic, at most every that many seconds
    (:mod:`spark_jobs.joins.behind`)."""
    spark_ready = time.time()  # the command's Spark session is up: the first batch is timed from here too
    spec = config.join(name)
    check_table_every(spec, once, table_every)
    if table_every is None:
        table_every = 0.0 if once else spec.table_every
    cluster = connect(config, lake.root)
    ensure_topics(cluster, [config.topic(t) for _, t in spec.sides])  # a join may start before its topics
    checkpoint = checkpoint_dir(lake, spec)
    stop = stop or threading.Event()
    with ExitStack() as held, registered(lake, join_job(spec), "once" if once else "continuous") as beat:
        _check_checkpoint(lake, spec, cluster)
        job = job_for(spark, lake, config, spec, lambda: checkpoints.query_id(checkpoint), log)
        job.inputs = KafkaInputs(checkpoint, cluster, config, spec)
        held.enter_context(
            lineage.job_run(
                config,
                f"join.{spec.name}",
                lambda: [lineage.topic(cluster, config, t, job.formats) for _, t in spec.sides],
                lambda: (
                    [lineage.table(lake, spec.name)]
                    + ([lineage.topic(cluster, config, spec.publish, job.formats)] if spec.publish else [])
                ),
            )
        )
        if isinstance(job, StateStoreJob):
            job.table_every = table_every
        batches = _Batches(lake, config, spec, cluster, job, beat, stop, spark_ready, log)
        group = config.consumer_group(spec)
        batches.group = GroupPosition(cluster, group and cluster.group(group), checkpoint, log)
        batches.group.sync()  # a run killed before its last commit reached the group: mended here
        if not once and config.metrics is not None:
            batches.metrics = JoinMetrics(
                config, spec, cluster, lambda: checkpoints.committed_positions(checkpoint), lake.layout
            )
            held.callback(batches.metrics.close)
            beat({"metrics_url": serve(batches.metrics, config, spec.name, log)})
        stream = job.plan(input_stream(spark, cluster, config, spec, max_records))
        writer = stream.writeStream.queryName(f"join_{spec.name}").foreachBatch(batches)
        writer = writer.option("checkpointLocation", str(checkpoint))
        if once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
        with stop_on_signals(stop):
            for attempt in itertools.count():
                query = writer.start()
                log(f"join {spec.name}: started ({'once' if once else f'every {trigger_seconds:g} s'})")
                try:
                    _watch(query, batches, table_every)
                finally:
                    batches.group.sync(query)
                    if batches.metrics is not None:
                        batches.metrics.progress(query, batches.metrics.labels)
                    job.flush_metrics()
                    if isinstance(job, StateStoreJob) and job.behind.waiting:  # the table catches up
                        _fold_at_end(lake, spec, job)
                error = query.exception()
                outage = None if error is None else registry_outage(error)
                if outage is None or once:
                    break
                delay = OUTAGE_RETRY_SECONDS[min(attempt, len(OUTAGE_RETRY_SECONDS) - 1)]
                waiting = (
                    f"{outage}: the micro-batch was not committed; retrying in {delay:g} s "
                    f"(retry {attempt + 1})"
                )
                log(f"join {spec.name}: {waiting}")
                beat({"waiting": waiting})
                if stop.wait(delay):  # stopped while waiting: nothing in flight
                    batches.stopping, error = True, None
                    break
        batches.summary.stopped_by_signal = batches.stopping
        if error is not None and outage is not None:
            raise UserError(
                f"join {spec.name}: {outage}: the micro-batch was not committed (nothing skipped); "
                f"run it again when the registry answers"
            )
        if error is not None and not (batches.stopping and STOP_MARKER in str(error)):
            cause = _user_error(error, spec, cluster)
            if cause:
                raise UserError(cause)
            raise RuntimeError(f"join {spec.name} failed: {str(error).strip().splitlines()[0]}") from error
    read = consumed_offsets(lake, config, spec, cluster)
    batches.summary.read = (
        offsets_read(spec, config, read) if read is not None else "nothing yet (no committed records)"
    )
    return batches.summary


class _Batches:
    """The ``foreachBatch`` function of a run: each micro-batch through the join's engine, then its
    record under ``<root>/_jobs`` and a heartbeat. A stop keeps new micro-batches out by failing them
    (Spark then does not commit them, and the next run replays them from the offset log)."""

    def __init__(
        self,
        lake: Lake,
        config: PipelineConfig,
        spec: JoinSpec,
        cluster: Cluster,
        job: Any,
        beat: Callable[[dict[str, Any]], None],
        stop: threading.Event,
        spark_ready: float,
        log: Callable[[str], None],
    ):
        self.lake, self.config, self.spec, self.cluster = lake, config, spec, cluster
        self.job, self.beat, self.stop = job, beat, stop
        self.spark_ready, self.log = spark_ready, log  # when the run's Spark session was up; its log
        self.checkpoint = checkpoint_dir(lake, spec)
        self.summary = RunSummary(spec.name)
        self.guard = threading.Lock()  # one micro-batch or one piece of upkeep at a time
        self.stopping = False
        self.done = -1  # the last micro-batch this run processed
        self.ended = time.monotonic()  # when the last micro-batch ended
        self.group: GroupPosition | None = None  # the consumer group Kafka's tools read
        self.metrics: JoinMetrics | None = None  # a continuous run's Prometheus endpoint
        self.first: dict[str, Any] | None = None  # this run's first micro-batch: how long it took to come

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        with self.guard:
            if self.stopping or self.stop.is_set():
                self.stopping = True
                raise RuntimeError(STOP_MARKER)
            read = _batch_offsets(self.checkpoint, self.cluster, self.config, self.spec, batch_id)
            faults.point("batch")
            started_at = datetime.now(UTC)
            began = time.perf_counter()
            metrics = self.job.process(frame, batch_id)
            self.done = batch_id
            self.summary.add(metrics)
            parked = _parked(self.job)
            if self.first is None:
                self.first = self._first(metrics)
            if self.metrics is not None:
                self.metrics.batch(metrics, time.perf_counter() - began, parked)
            record_batch(
                self.lake,
                join_job(self.spec),
                {
                    "batch_id": batch_id,
                    "started_at": started_at.isoformat(),
                    "duration_ms": round((time.perf_counter() - began) * 1000),
                    "in": metrics.input_left + metrics.input_right,
                    "out": metrics.upserted + metrics.deleted + metrics.appended,
                    "pending": metrics.pending,
                    "skipped": metrics.skipped,
                    "offsets": read,
                    "parked": parked,
                    "dropped": dict(self.summary.dropped),  # since the run started
                    "first_batch": self.first,
                },
            )
            self.beat(
                {
                    "last_batch_id": batch_id,
                    "last_batch": metrics.text(),
                    "offsets": read,
                    "parked": parked,
                    "waiting": None,
                    "dropped": dict(self.summary.dropped),
                    "first_batch": self.first,
                }
            )
            self.ended = time.monotonic()

    def _first(self, metrics: BatchMetrics) -> dict[str, Any]:
        """How long this run took to its first micro-batch's end: from the command's start (its
        process) and from its Spark session being ready (what is left is the query's start, its
        planning and the batch itself)."""
        now = time.time()
        first = {
            "after_s": round(now - process_started(), 1),
            "after_spark_s": round(now - self.spark_ready, 1),
            "records": metrics.input_left + metrics.input_right,
        }
        self.log(
            f"join {self.spec.name}: first micro-batch ({first['records']:,} record(s)) done "
            f"{first['after_s']:g} s after the command started, {first['after_spark_s']:g} s after its "
            f"Spark session was ready"
        )
        return first

    def keep_out(self) -> None:
        """Wait for the micro-batch in progress, then fail every new one."""
        with self.guard:
            self.stopping = True


def _watch(query: Any, batches: _Batches, table_every: float) -> None:
    """Watch a started query until it ends or a stop is asked for (then stop it after its current
    micro-batch has committed), doing the upkeep between micro-batches and a heartbeat when idle."""
    last_beat = last_progress = time.monotonic()
    try:
        while query.isActive:
            if batches.stop.is_set():
                batches.keep_out()
                _await_commit(query, batches.done)  # a stop before it would replay the batch
                query.stop()
                break
            query.awaitTermination(0.25)  # type: ignore[arg-type]  # seconds, a float is fine
            if batches.group is not None:
                batches.group.sync(query)
            if batches.metrics is not None and time.monotonic() - last_progress >= PROGRESS_SECONDS:
                batches.metrics.progress(query, batches.metrics.labels)
                last_progress = time.monotonic()
            if time.monotonic() - batches.ended >= IDLE_SECONDS:
                _between_batches(batches.job, batches.guard, table_every)
            if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:  # alive, even when idle
                batches.beat({"parked": _parked(batches.job)})
                last_beat = time.monotonic()
    except StreamingQueryException:
        pass  # the caller reports it, from query.exception()
    except BaseException:
        # the driver's own work between batches failed (its heartbeat or metrics on a full disk, an
        # interrupt): the query must not run on while the command reports it
        query.stop()
        raise


def _parked(job: Any) -> int:
    """Result rows a keyed join has parked for the table's next catch-up (0 for the other kinds)."""
    return job.behind.parked if isinstance(job, StateStoreJob) else 0


def _fold_at_end(lake: Lake, spec: JoinSpec, job: StateStoreJob) -> None:
    """The result table takes what the run parked before the run ends, and the run's last batch
    record says so."""
    job.fold()
    last = last_batch(lake, join_job(spec))
    if last is not None:
        record_batch(lake, join_job(spec), {**last, "parked": job.behind.parked})


def _batch_offsets(
    checkpoint: Path, cluster: Cluster, config: PipelineConfig, spec: JoinSpec, batch_id: int
) -> Sides:
    """The offsets micro-batch ``batch_id`` reads up to, per side. A partition beyond a topic's
    declared count (one was added on Kafka) stops the join before it processes the batch: the keys
    would no longer sit in the partitions the pipeline's checks and co-partitioned readers expect."""
    positions = checkpoints.batch_positions(checkpoint, batch_id)
    for _, topic in spec.sides:
        declared = config.topic(topic).partitions
        extra = sorted(p for p in positions.get(cluster.topic(topic), {}) if p >= declared)
        if extra:
            raise UserError(
                f"join {spec.name}: topic {cluster.topic(topic)} has partition(s) "
                f"{', '.join(map(str, extra))} beyond the {declared} the pipeline declares "
                f"(topics.{topic}.partitions): a partition was added on Kafka, which moves keys to other "
                f"partitions; the join stopped before reading them. Declare the new count and rerun with "
                f"--reset, or repartition into a new topic"
            )
    return by_side(cluster, config, spec, positions)


def _between_batches(job: Any, guard: threading.Lock, table_every: float) -> None:
    """The work a continuous run keeps off its micro-batches, done while the query idles: the
    buffered ``join_metrics`` rows, and the result table's catch-up (``--table-every``)."""
    fold = isinstance(job, StateStoreJob) and bool(table_every) and job.behind.due(table_every)
    if not (fold or job.metrics_due()) or not guard.acquire(blocking=False):
        return
    try:
        if fold:
            job.fold()
        if job.metrics_due():
            job.flush_metrics()
    finally:
        guard.release()


def check_table_every(spec: JoinSpec, once: bool, table_every: float | None) -> None:
    """``--table-every`` is for continuous runs of the keyed kinds (their state is in the state store)
    that publish a changelog (the topic is what the table is written behind)."""
    if table_every is not None and table_every < 0:
        raise UserError("--table-every must be a positive number of seconds")
    if not table_every:
        return
    if not issubclass(JOBS[spec.kind], StateStoreJob):
        raise UserError(
            f"join {spec.name}: --table-every applies to the keyed kinds (table, fk, list, derive), "
            f"not to {spec.kind}"
        )
    if once:
        raise UserError(f"join {spec.name}: --table-every applies to --continuous runs")
    if not spec.publish:
        raise UserError(
            f"join {spec.name}: --table-every writes the result table behind the changelog topic, and the "
            f"join publishes none (set publish: true)"
        )


def _await_commit(query: Any, batch_id: int, timeout: float = 60.0) -> None:
    """Wait until Spark has committed micro-batch ``batch_id`` to the checkpoint (it reports a
    batch's progress after the batch's commit-log entry): stopping the query between
    ``foreachBatch`` and that entry would leave the batch to be replayed by the next run."""
    deadline = time.monotonic() + timeout
    while batch_id >= 0 and query.isActive and time.monotonic() < deadline:
        progress = query.lastProgress
        if progress is not None and progress["batchId"] >= batch_id:
            return
        time.sleep(0.05)


def _check_checkpoint(lake: Lake, spec: JoinSpec, cluster: Cluster) -> None:
    """Refuse a checkpoint the join cannot resume from, with one line naming ``--reset``: one from a
    version of the product that read the bronze tables, one whose state is not in the state store,
    or one that read other Kafka topics than the join's topics now (a topic replaced under it, or
    another topic configured). Then record the topics' ids beside the checkpoint."""
    checkpoint = checkpoint_dir(lake, spec)
    _refuse_bronze_checkpoint(checkpoint, spec)
    committed = checkpoints.last_committed(checkpoint) is not None
    if JOBS[spec.kind].state_in_checkpoint and committed and not checkpoints.has_state(checkpoint):
        raise UserError(
            f"join {spec.name}: its checkpoint {checkpoint} is from an older version of the product (its "
            f"state was in Delta tables, now it is in Spark's state store); rerun with --reset"
        )
    names = [cluster.topic(topic) for _, topic in spec.sides]
    ids = topic_ids(cluster, names)
    path = lake.layout.join_inputs(spec.name)
    recorded = json.loads(path.read_text()) if path.exists() else None
    if committed and recorded is not None:
        if sorted(recorded) != sorted(names):
            raise UserError(
                f"join {spec.name} reads {', '.join(names)} now, but its checkpoint read "
                f"{', '.join(sorted(recorded))}: its offsets belong to other topics; rerun with --reset"
            )
        replaced = [n for n in names if recorded[n] != ids.get(n)]
        if replaced:
            raise UserError(
                f"join {spec.name}: topic {', '.join(replaced)} was replaced since the join last read it "
                f"(a new Kafka topic id: 'lake topic repartition', or deleted and created again), so its "
                f"checkpoint's offsets point into a topic that is gone; rerun with --reset"
            )
    write_whole(path, json.dumps(ids))


def _refuse_bronze_checkpoint(checkpoint: Path, spec: JoinSpec) -> None:
    if checkpoints.has_delta_sources(checkpoint):
        raise UserError(
            f"join {spec.name}: its checkpoint {checkpoint} is from a version of the product whose joins "
            f"read the bronze tables; they read Kafka now, and bronze versions are not Kafka offsets: "
            f"rerun with --reset"
        )


# A Schema Registry that did not answer for a writer schema the job had not seen (asked by the
# executors' decoder, lake.formats.RegistryLookup): the micro-batch failed uncommitted; a continuous
# job starts its query again after these pauses (the last one repeated), replaying it
OUTAGE = re.compile(r"(the Schema Registry at \S+ did not answer for schema id \d+)")
OUTAGE_RETRY_SECONDS = (2.0, 5.0, 10.0, 30.0)


# A registry that refused the executors' request (HTTP 401/403, a 404 of a URL that is not the
# registry's API, TLS): waiting does not mend it, the job stops with the line naming URL and status
REFUSED = re.compile(r"lake\.formats\.RegistryLookup\$Refused: ([^\n]*?)(?:\. SQLSTATE: \w+)?(?:\n|$)")


def registry_outage(error: Any) -> str | None:
    """The line naming the registry and the schema id when ``error`` is a registry that did not
    answer, else None."""
    found = OUTAGE.search(str(error))
    return found.group(1) if found else None


# Spark's Kafka source (failOnDataLoss) when offsets it has to read are gone: deleted by retention
# before the join read them, or moved back because the topic was deleted and created again
DATA_LOSS = ("Some data may have been lost", "KAFKA_DATA_LOSS")
LOSS_REASON = re.compile(r"(?:Reason: |\[KAFKA_DATA_LOSS\.\w+\]\s*)([^\n]*?)(?:\. Some data may|\\n|\n|$)")


def _user_error(error: Any, spec: JoinSpec, cluster: Cluster) -> str | None:
    """A UserError raised inside foreachBatch reaches us as a StreamingQueryException; recover it.
    Records the Kafka source cannot read any more, or a topic deleted under the join, are one too."""
    text = str(error)
    marker = "spark_jobs.errors.UserError: "
    if marker in text:
        return text.split(marker, 1)[1].strip().splitlines()[0]
    refused = REFUSED.search(text)
    if refused:
        return (
            f"join {spec.name}: {refused.group(1).strip()}; it stopped: the micro-batch was not committed, "
            f"fix kafka.schema_registry's settings and start it again"
        )
    if "UnknownTopicOrPartition" in text:
        names = [cluster.topic(topic) for _, topic in spec.sides]
        gone = [n for n in names if n not in partition_counts(cluster, names)] or names
        return (
            f"join {spec.name}: topic {' and '.join(gone)} was deleted from Kafka while the join read it; "
            f"it stopped. When the topic is back (a new topic: its offsets start over), rerun with --reset"
        )
    if "STATE_STORE_" in text and "SCHEMA" in text and "NOT_COMPATIBLE" in text:
        return (
            f"join {spec.name}: its state in {spec.name}'s checkpoint has another shape than this "
            f"release keeps (written by an earlier release); rebuild it from the topics: "
            f"lake run {spec.name} --once --reset"
        )
    if any(sign in text for sign in DATA_LOSS):
        found = LOSS_REASON.search(text)
        what = f" ({found.group(1).strip().rstrip('.')})" if found and found.group(1).strip() else ""
        return (
            f"join {spec.name}: records it has not read are gone from Kafka{what}: deleted by retention, "
            f"or the topic was deleted and created again; the join stopped rather than skip them: rerun "
            f"with --reset to start over from what the topics hold now"
        )
    return None


def reset_join(lake: Lake, config: PipelineConfig, name: str) -> list[str]:
    """Forget a join's progress: its checkpoint, state tables, result and published topic."""
    spec = config.join(name)
    if spec.job in running_jobs(lake):
        raise UserError(f"join {spec.name} is running; stop it before --reset")
    removed = []
    # with the state tables of older versions (<join>__*) that the current kind no longer has
    older = [path.name for path in lake.layout.join_tables(spec.name)]
    owned = JOBS[spec.kind].state_tables(spec)
    tables = [spec.name, *owned, *([spec.publish] if spec.publish else []), *older]
    removed += [table for table in dict.fromkeys(tables) if lake.drop(table)]
    checkpoint = checkpoint_dir(lake, spec)
    if checkpoint.exists():
        remove_tree(checkpoint)
        removed.append(str(checkpoint))
    last_batch_path(lake, join_job(spec)).unlink(missing_ok=True)
    if spec.publish:  # the rebuilt join publishes its whole result again, into a fresh changelog
        cluster = connect(config, lake.root)
        delete_topics(cluster, [cluster.topic(spec.publish)])
        removed.append(f"Kafka topic {cluster.topic(spec.publish)}")
        ingest_checkpoint = ingest.checkpoint_dir(lake, spec.publish)
        remove_tree(ingest_checkpoint)
    return removed


def status(lake: Lake, config: PipelineConfig) -> list[dict[str, Any]]:
    """Per join: running or not, its last batch, and in Kafka's terms how far behind its inputs are
    (per side, the topic's end offsets minus the offsets the join has processed, summed over the
    partitions: records, and the transaction markers among them) and how many result rows wait to be
    written into its table (``--table-every``). Kafka being unreachable leaves the figures out and
    says why (``kafka_error``)."""
    running = running_jobs(lake)
    ends: dict[str, list[int]] = {}
    kafka_error = None
    cluster = None
    try:
        cluster = connect(config, lake.root)
        wanted = {t for spec in config.joins.values() for _, t in spec.sides}
        ranges = offset_ranges(cluster, [config.topic(t) for t in sorted(wanted)])
        ends = {t: [high for _, high in r] for t, r in ranges.items()}
        lows = {t: [low for low, _ in r] for t, r in ranges.items()}
    except UserError as exc:
        kafka_error = str(exc)
    rows = []
    for spec in config.joins.values():
        row: dict[str, Any] = {"join": spec.name, "kind": spec.kind, "running": spec.job in running}
        row["pid"] = running.get(spec.job)
        entry = registry(lake, join_job(spec)) if row["pid"] else {}
        row["heartbeat_at"] = entry.get("heartbeat_at")
        row["waiting"] = entry.get("waiting")
        row["metrics_url"] = entry.get("metrics_url")  # its Prometheus endpoint while it runs
        group = config.consumer_group(spec)  # where Kafka's tools see its position
        row["consumer_group"] = group and topic_prefix(config) + group
        last = last_batch(lake, join_job(spec)) or {}
        row["records_behind"] = {side: None for side, _ in spec.sides}
        row["offsets"] = None
        row["checkpoint_error"] = None
        if cluster is not None:
            try:
                consumed = consumed_offsets(lake, config, spec, cluster)
            except UserError as exc:
                consumed, row["checkpoint_error"] = None, str(exc)
            row["offsets"] = consumed
            for side, topic in spec.sides:
                if row["checkpoint_error"] or topic not in ends:
                    continue
                done = consumed[side] if consumed else lows[topic]
                row["records_behind"][side] = sum(
                    max(0, end - (done[p] if p < len(done) else 0)) for p, end in enumerate(ends[topic])
                )
        row["kafka_error"] = kafka_error
        row["last_batch_at"] = last.get("started_at")
        row["last_batch_in"] = last.get("in")
        row["last_batch_out"] = last.get("out")
        row["last_batch_ms"] = last.get("duration_ms")
        row["pending"] = last.get("pending")
        row["skipped"] = last.get("skipped") or 0  # KIP-962: null-key records the join type drops
        # the records its running (else its last) run did not use, by reason: the quarantine's rows
        # and the metrics' lake_join_dropped_records_total of that run
        row["dropped"] = (entry if row["running"] else last).get("dropped") or {}
        # how long the running (else the last) run took to its first micro-batch
        row["first_batch"] = (entry if row["running"] else last).get("first_batch")
        # result rows on the changelog but not yet in the table: a running job's latest count; a
        # stopped one folded them in at its stop (a killed one leaves them for its next run)
        row["table_behind"] = (
            entry.get("parked", last.get("parked", 0)) if row["running"] else last.get("parked", 0)
        )
        rows.append(row)
    return rows
