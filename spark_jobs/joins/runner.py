"""Running a join as a Spark Structured Streaming query, and what ``lake status`` / ``--reset`` see.

Both topics' bronze tables are read with Delta's streaming source, unioned with a ``side`` column and
handed to the engine by ``foreachBatch``. The checkpoint lives under ``<root>/_checkpoints/<join>``;
a running job registers itself under ``<root>/_jobs`` (``spark_jobs.jobs``), so a second copy refuses
to start.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from spark_jobs import ingest
from spark_jobs.config import JoinSpec, PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.jobs import (
    HEARTBEAT_SECONDS,
    join_job,
    last_batch,
    last_batch_path,
    record_batch,
    registered,
    registry,
    running_jobs,
)
from spark_jobs.joins.engine import BatchMetrics, side_records
from spark_jobs.joins.registry import JOBS, job_for
from spark_jobs.joins.state_store import StateStoreJob
from spark_jobs.kafka import connect, delete_topics
from spark_jobs.lake import Lake
from spark_jobs.layout import Layout
from spark_jobs.stopping import stop_on_signals

STOP_MARKER = "lake: stop requested, this micro-batch is left for the next run"
IDLE_SECONDS = 0.5  # a continuous run does its upkeep once no micro-batch ran for this long
REWRITTEN = (
    r"DELTA_SOURCE_TABLE_IGNORE_CHANGES\]? Detected a data update \(for example (\w+)[^)]*\)+ "
    r"in the source table at version (\d+)"
)


def checkpoint_dir(lake: Lake, spec: JoinSpec) -> Path:
    return Layout(lake.root).join_checkpoint(spec.name)


def query_id(checkpoint: Path) -> str:
    """The streaming query's id: stable across restarts from the same checkpoint."""
    return str(json.loads((checkpoint / "metadata").read_text())["id"])


def consumed_versions(lake: Lake, spec: JoinSpec) -> dict[str, int] | None:
    """The topic versions the last committed micro-batch read up to, from the Spark checkpoint
    (``offsets/<n>`` holds one line per source, in the order left, right; derive joins have one)."""
    checkpoint = checkpoint_dir(lake, spec)
    commits = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")] if checkpoint.is_dir() else []
    if not commits:
        return None
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()
    offsets = [json.loads(line) for line in lines[2 : 2 + len(spec.sides)]]
    return {side: delta_offset_version(o) for (side, _), o in zip(spec.sides, offsets, strict=True)}


def delta_offset_version(offset: dict[str, Any]) -> int:
    """The last table version a Delta streaming source offset has read completely. Delta records
    ``(reservoirVersion, index)``: index -1 means every commit before ``reservoirVersion``, the
    largest long means ``reservoirVersion`` itself; any other index is a position inside that
    version, which a source only stops at when ``maxFilesPerTrigger`` splits a commit."""
    version, index = int(offset["reservoirVersion"]), int(offset["index"])
    return version - 1 if index == -1 else version


@dataclass
class RunSummary:
    join: str
    batches: int = 0
    input_rows: int = 0
    upserted: int = 0
    deleted: int = 0
    appended: int = 0
    quarantined: int = 0
    stopped_by_signal: bool = False

    def add(self, m: BatchMetrics) -> None:
        self.batches += 1
        self.input_rows += m.input_left + m.input_right
        self.upserted += m.upserted
        self.deleted += m.deleted
        self.appended += m.appended
        self.quarantined += m.quarantined

    def text(self) -> str:
        how = "stopped on request after" if self.stopped_by_signal else "processed"
        return (
            f"join {self.join}: {how} {self.batches} micro-batch(es): {self.input_rows} input records, "
            f"{self.upserted} upserted, {self.deleted} deleted, {self.appended} appended, "
            f"{self.quarantined} quarantined"
        )


def input_stream(spark: SparkSession, lake: Lake, spec: JoinSpec, max_files: int | None = None) -> DataFrame:
    """A join's input: its topics' records as a stream with the side they come from."""
    streams = []
    for side, topic in spec.sides:
        reader = spark.readStream.format("delta")
        if max_files:
            reader = reader.option("maxFilesPerTrigger", max_files)
        streams.append(side_records(reader.load(lake.uri(topic)), side))
    return streams[0] if len(streams) == 1 else streams[0].unionByName(streams[1])


def run_join(
    spark: SparkSession,
    lake: Lake,
    config: PipelineConfig,
    name: str,
    *,
    once: bool,
    trigger_seconds: float = 5.0,
    max_files: int | None = None,
    log: Callable[[str], None] = lambda _: None,
    stop: threading.Event | None = None,
    table_every: float = 0.0,
) -> RunSummary:
    """Run a join: ``once`` processes everything available and returns; otherwise it runs until
    ``stop`` is set or SIGTERM / SIGINT arrives, then stops after the current micro-batch.
    ``table_every`` > 0 (a keyed kind, continuous): the result table is written behind the
    changelog topic, at most every that many seconds (:mod:`spark_jobs.joins.behind`)."""
    spec = config.join(name)
    check_table_every(spec, once, table_every)
    checkpoint = checkpoint_dir(lake, spec)
    _check_checkpoint(checkpoint, spec)
    stop = stop or threading.Event()
    summary = RunSummary(spec.name)
    with registered(lake, join_job(spec), "once" if once else "continuous") as beat:
        job = job_for(spark, lake, config, spec, lambda: query_id(checkpoint), log)
        if isinstance(job, StateStoreJob):
            job.table_every = table_every
        guard = threading.Lock()
        stopping = [False]
        done = [-1]  # the last micro-batch this run processed
        ended = [time.monotonic()]  # when the last micro-batch ended

        def batch(frame: DataFrame, batch_id: int) -> None:
            with guard:
                if stopping[0] or stop.is_set():
                    # Fail (not skip) the batch: Spark then does not commit it, and the next run
                    # replays it from the checkpoint's offset log.
                    stopping[0] = True
                    raise RuntimeError(STOP_MARKER)
                started_at = datetime.now(UTC)
                began = time.perf_counter()
                metrics = job.process(frame, batch_id)
                done[0] = batch_id
                summary.add(metrics)
                record_batch(
                    lake,
                    join_job(spec),
                    {
                        "batch_id": batch_id,
                        "started_at": started_at.isoformat(),
                        "duration_ms": round((time.perf_counter() - began) * 1000),
                        "in": metrics.input_left + metrics.input_right,
                        "out": metrics.upserted + metrics.deleted + metrics.appended,
                        "pending": metrics.pending,
                    },
                )
                beat({"last_batch_id": batch_id, "last_batch": metrics.text()})
                ended[0] = time.monotonic()

        stream = job.plan(input_stream(spark, lake, spec, max_files))
        writer = stream.writeStream.queryName(f"join_{spec.name}").foreachBatch(batch)
        writer = writer.option("checkpointLocation", str(checkpoint))
        if once:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
        last_beat = [time.monotonic()]
        with stop_on_signals(stop):
            query = writer.start()
            log(f"join {spec.name}: started ({'once' if once else f'every {trigger_seconds:g} s'})")
            try:
                while query.isActive:
                    if stop.is_set():
                        with guard:  # wait for the batch in progress, then keep new ones out
                            stopping[0] = True
                        _await_commit(query, done[0])  # a stop before it would replay the batch
                        query.stop()
                        break
                    query.awaitTermination(0.25)  # type: ignore[arg-type]  # seconds, a float is fine
                    if time.monotonic() - ended[0] >= IDLE_SECONDS:
                        _between_batches(job, guard, table_every)
                    if time.monotonic() - last_beat[0] >= HEARTBEAT_SECONDS:  # alive, even when idle
                        beat({})
                        last_beat[0] = time.monotonic()
            except StreamingQueryException:
                pass  # reported below, from query.exception()
            finally:
                job.flush_metrics()
                if isinstance(job, StateStoreJob) and job.behind.waiting:  # the table catches up
                    job.fold()
        summary.stopped_by_signal = stopping[0]
        error = query.exception()
        if error is not None and not (stopping[0] and STOP_MARKER in str(error)):
            cause = _user_error(error, spec)
            if cause:
                raise UserError(cause)
            raise RuntimeError(f"join {spec.name} failed: {str(error).strip().splitlines()[0]}") from error
    return summary


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


def check_table_every(spec: JoinSpec, once: bool, table_every: float) -> None:
    """``--table-every`` is for continuous runs of the keyed kinds (their state is in the state store)."""
    if table_every < 0:
        raise UserError("--table-every must be a positive number of seconds")
    if table_every and not issubclass(JOBS[spec.kind], StateStoreJob):
        raise UserError(
            f"join {spec.name}: --table-every applies to the keyed kinds (table, fk, list, derive), "
            f"not to {spec.kind}"
        )
    if table_every and once:
        raise UserError(f"join {spec.name}: --table-every applies to --continuous runs")


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


def _check_checkpoint(checkpoint: Path, spec: JoinSpec) -> None:
    """A kind that keeps its state in Spark's state store keeps it under its checkpoint: a checkpoint
    with committed batches but no state was written by a version that kept the state in Delta tables."""
    if not JOBS[spec.kind].state_in_checkpoint or not (checkpoint / "commits").is_dir():
        return
    if any((checkpoint / "commits").glob("[0-9]*")) and not (checkpoint / "state").is_dir():
        raise UserError(
            f"join {spec.name}: its checkpoint {checkpoint} is from an older version of the product (its "
            f"state was in Delta tables, now it is in Spark's state store); rerun with --reset"
        )


def _user_error(error: Any, spec: JoinSpec) -> str | None:
    """A UserError raised inside foreachBatch reaches us as a StreamingQueryException; recover it.
    A rewritten topic (``lake topic repartition``) is one too: the job must start over."""
    text = str(error)
    marker = "spark_jobs.errors.UserError: "
    if marker in text:
        return text.split(marker, 1)[1].strip().splitlines()[0]
    rewritten = re.search(REWRITTEN, text)
    if rewritten:
        operation, version = rewritten.groups()
        source = re.search(r"source table can be found at path \S*/tables/([^/\s]+?)\.?(?:\s|$)", text)
        topics = source.group(1) if source else " or ".join(topic for _, topic in spec.sides)
        return (
            f"join {spec.name}: topic {topics} was rewritten at version {version} ({operation}, e.g. by "
            f"'lake topic repartition'); the join must start over: rerun with --reset"
        )
    return None


def reset_join(lake: Lake, config: PipelineConfig, name: str) -> list[str]:
    """Forget a join's progress: its checkpoint, state tables, result and published topic."""
    spec = config.join(name)
    if spec.job in running_jobs(lake):
        raise UserError(f"join {spec.name} is running; stop it before --reset")
    removed = []
    # with the state tables of older versions (<join>__*) that the current kind no longer has
    folder = lake.tables_dir
    older = sorted(p.name for p in folder.glob(f"{spec.name}__*")) if folder.is_dir() else []
    owned = JOBS[spec.kind].state_tables(spec)
    tables = [spec.name, *owned, *([spec.publish] if spec.publish else []), *older]
    for table in dict.fromkeys(tables):
        if lake.exists(table):
            shutil.rmtree(lake.path(table))
            removed.append(table)
    checkpoint = checkpoint_dir(lake, spec)
    if checkpoint.exists():
        shutil.rmtree(checkpoint)
        removed.append(str(checkpoint))
    last_batch_path(lake, join_job(spec)).unlink(missing_ok=True)
    if spec.publish:  # the rebuilt join publishes its whole result again, into a fresh changelog
        cluster = connect(config, lake.root)
        delete_topics(cluster, [cluster.topic(spec.publish)])
        removed.append(f"Kafka topic {cluster.topic(spec.publish)}")
        ingest_checkpoint = ingest.checkpoint_dir(lake, spec.publish)
        if ingest_checkpoint.exists():
            shutil.rmtree(ingest_checkpoint)
    return removed


def status(lake: Lake, config: PipelineConfig) -> list[dict[str, Any]]:
    """Per join: running or not, last batch, how far behind its inputs are."""
    running = running_jobs(lake)
    rows = []
    for spec in config.joins.values():
        row: dict[str, Any] = {"join": spec.name, "kind": spec.kind, "running": spec.job in running}
        row["pid"] = running.get(spec.job)
        row["heartbeat_at"] = registry(lake, join_job(spec)).get("heartbeat_at") if row["pid"] else None
        consumed = consumed_versions(lake, spec)
        behind: dict[str, int | None] = {}
        for side, topic in spec.sides:
            latest = lake.version(topic) if lake.exists(topic) else None
            if latest is None:
                behind[side] = None
            else:
                behind[side] = latest - (consumed[side] if consumed else -1)
        row["versions_behind"] = behind
        last = last_batch(lake, join_job(spec)) or {}
        row["last_batch_at"] = last.get("started_at")
        row["last_batch_in"] = last.get("in")
        row["last_batch_out"] = last.get("out")
        row["last_batch_ms"] = last.get("duration_ms")
        row["pending"] = last.get("pending")
        rows.append(row)
    return rows
