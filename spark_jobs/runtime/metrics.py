"""What a long-running job shows Prometheus (docs/operating.md).

Each continuous join (``lake run --continuous``, ``lake start``) and the continuous ingest serves the
Prometheus text format at ``http://<host>:<port>/metrics`` while it runs: on loopback and a free port
by default, where the pipeline file's ``metrics:`` says otherwise (``metrics: false``: none). The job
writes the address into its registry entry, so ``lake status --json`` gives each running job's
``metrics_url``. The exposition is prometheus_client's; the figures come from three places:

- each micro-batch the job processed (:meth:`JoinMetrics.batch`): records read per side, result
  changes, changelog records, dropped records by reason (:mod:`spark_jobs.joins.dropped`), the
  batch's duration and its phases;
- Spark's progress of the query (:meth:`Endpoint.progress`): its trigger's durations, rows per
  second, the state store's rows and bytes;
- Kafka and the lake at scrape time (:class:`Lag`, :class:`Gate`): per input topic-partition the
  records not yet processed and the seconds between the newest record's time and the newest processed
  one's (asked of the cluster at most every ``LAG_EVERY_SECONDS``), and the quality gate's last verdict.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from spark_jobs.config import JoinSpec, PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.joins.dropped import REASONS
from spark_jobs.layout import Layout
from spark_jobs.seams.kafka import Cluster, RecordClock

LAG_EVERY_SECONDS = 2.0  # scrapes closer together than this share one answer from Kafka
GATE_EVERY_SECONDS = 30.0  # how often the quality gate's last verdict is read again
BATCH_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
Positions = dict[str, dict[int, int]]  # Kafka topic -> partition -> next offset to process


class Endpoint:
    """A job's registry of metrics and, once :meth:`serve` d, its HTTP server."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.url: str | None = None
        self._server: Any = None
        self._spark_gauges: dict[str, Gauge] = {}
        self.lag: Lag | None = None  # the lag collector, whose Kafka consumer close() closes

    def serve(self, host: str, port: int) -> str:
        """Serve the metrics on ``host``:``port`` (0: a free port); the address, or a one-line error."""
        try:
            self._server, _ = start_http_server(port, host, self.registry)
        except OSError as exc:
            raise UserError(
                f"cannot serve metrics on {host}:{port} ({exc.strerror or exc}); set metrics.port in the "
                f"pipeline file to a free port, 0 for any, or metrics: false"
            ) from None
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self._server.server_port}/metrics"
        return self.url

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.lag is not None:
            with self.lag.guard:  # not while a scrape asks Kafka
                self.lag.clock.close()

    def progress(self, query: Any, labels: dict[str, str]) -> None:
        """Spark's own streaming metrics of ``query``'s last progress: its trigger's durations, rows
        per second, and its state store's rows and bytes."""
        last = query.lastProgress
        if not last:
            return
        if not self._spark_gauges:
            names = [*labels, "query"]
            self._spark_gauges = {
                "duration": Gauge(
                    "lake_spark_trigger_duration_seconds",
                    "Spark: the last trigger's time by step (durationMs of the query's progress)",
                    [*names, "step"],
                    registry=self.registry,
                ),
                "input": Gauge(
                    "lake_spark_input_rows_per_second",
                    "Spark: input rows per second of the last trigger",
                    names,
                    registry=self.registry,
                ),
                "processed": Gauge(
                    "lake_spark_processed_rows_per_second",
                    "Spark: rows processed per second of the last trigger",
                    names,
                    registry=self.registry,
                ),
                "state_rows": Gauge(
                    "lake_spark_state_rows",
                    "Spark: rows in the query's state store (its stateful operators' numRowsTotal)",
                    names,
                    registry=self.registry,
                ),
                "state_bytes": Gauge(
                    "lake_spark_state_bytes",
                    "Spark: memory the query's state store uses (its operators' memoryUsedBytes)",
                    names,
                    registry=self.registry,
                ),
                "batch": Gauge(
                    "lake_spark_batch_id",
                    "Spark: the id of the query's last micro-batch",
                    names,
                    registry=self.registry,
                ),
            }
        mine = {**labels, "query": str(last.get("name") or "")}
        gauges = self._spark_gauges
        for step, ms in (last.get("durationMs") or {}).items():
            gauges["duration"].labels(**mine, step=step).set(float(ms) / 1000)
        gauges["input"].labels(**mine).set(float(last.get("inputRowsPerSecond") or 0))
        gauges["processed"].labels(**mine).set(float(last.get("processedRowsPerSecond") or 0))
        operators = last.get("stateOperators") or []
        if operators:
            gauges["state_rows"].labels(**mine).set(sum(int(o.get("numRowsTotal") or 0) for o in operators))
            gauges["state_bytes"].labels(**mine).set(
                sum(int(o.get("memoryUsedBytes") or 0) for o in operators)
            )
        gauges["batch"].labels(**mine).set(int(last.get("batchId") or 0))


def serve(
    endpoint: Endpoint, config: PipelineConfig, join: str | None, log: Callable[[str], None]
) -> str | None:
    """Serve ``endpoint`` where the pipeline says (None: ``metrics: false``), logging the address."""
    if config.metrics is None:
        return None
    url = endpoint.serve(config.metrics.host, config.metrics_port(join))
    log(f"{f'join {join}' if join else 'ingest'}: Prometheus metrics at {url}")
    return url


class JoinMetrics(Endpoint):
    """A join's metrics: one label set (``pipeline``, ``join``) on every series."""

    def __init__(
        self,
        config: PipelineConfig,
        spec: JoinSpec,
        cluster: Cluster,
        positions: Callable[[], Positions | None],
        layout: Layout,
    ):
        super().__init__()
        self.labels = {"pipeline": config.name, "join": spec.name}
        names = list(self.labels)
        r = self.registry
        self.read = Counter(
            "lake_join_input_records",
            "Records the join read, per side and topic (valid or not)",
            [*names, "side", "topic"],
            registry=r,
        )
        self.results = Counter(
            "lake_join_result_changes",
            "Changes the join made to its result table: upserted, deleted or appended rows",
            [*names, "change"],
            registry=r,
        )
        self.rows = Counter(
            "lake_join_result_rows",
            "Result rows the join answered (a keyed join's live rows, a stream join's events), by "
            "outcome: matched (both sides' records in it) or unmatched (a left or outer join's row "
            "without one); list and derive joins count none",
            [*names, "outcome"],
            registry=r,
        )
        self.published = Counter(
            "lake_join_changelog_records",
            "Records the join sent to its changelog topic (upserts and tombstones)",
            [*names, "topic"],
            registry=r,
        )
        self.dropped = Counter(
            "lake_join_dropped_records",
            "Records the join did not use, by reason (each also in the quarantine table)",
            [*names, "reason"],
            registry=r,
        )
        self.batches = Histogram(
            "lake_join_batch_duration_seconds",
            "Micro-batches the join processed and how long each took (its foreachBatch work)",
            names,
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.phases = Counter(
            "lake_join_batch_phase_seconds",
            "Time the join's micro-batches spent in each phase",
            [*names, "phase"],
            registry=r,
        )
        self.last_batch = Gauge(
            "lake_join_last_batch_timestamp_seconds",
            "When the join's last micro-batch ended (Unix time)",
            names,
            registry=r,
        )
        self.pending = Gauge(
            "lake_join_pending_events",
            "Stream kinds: events waiting for the other side or their window, after the last batch",
            names,
            registry=r,
        )
        self.behind = Gauge(
            "lake_join_table_behind_rows",
            "Result rows on the changelog not yet written into the result table (--table-every)",
            names,
            registry=r,
        )
        self.sides = dict(spec.sides)
        for side, topic in spec.sides:
            self.read.labels(**self.labels, side=side, topic=topic)
        self.batches.labels(**self.labels)
        for change in ("upserted", "deleted", "appended"):
            self.results.labels(**self.labels, change=change)
        for reason in REASONS:
            self.dropped.labels(**self.labels, reason=reason)
        for outcome in ("matched", "unmatched"):
            self.rows.labels(**self.labels, outcome=outcome)
        self.changelog = spec.publish
        if spec.publish:
            self.published.labels(**self.labels, topic=spec.publish)
        inputs = {topic: config.topic(topic).partitions for _, topic in spec.sides}
        self.lag = Lag("lake_join", self.labels, cluster, inputs, positions)
        r.register(self.lag)
        r.register(Gate(config.name, layout))

    def batch(self, m: Any, seconds: float, parked: int) -> None:
        """Count one processed micro-batch (a :class:`spark_jobs.joins.engine.BatchMetrics`)."""
        for side, n in (("left", m.input_left), ("right", m.input_right)):
            if side in self.sides:
                self.read.labels(**self.labels, side=side, topic=self.sides[side]).inc(n)
        self.results.labels(**self.labels, change="upserted").inc(m.upserted)
        self.results.labels(**self.labels, change="deleted").inc(m.deleted)
        self.results.labels(**self.labels, change="appended").inc(m.appended)
        self.rows.labels(**self.labels, outcome="matched").inc(m.matched)
        self.rows.labels(**self.labels, outcome="unmatched").inc(m.unmatched)
        if self.changelog:
            self.published.labels(**self.labels, topic=self.changelog).inc(m.published)
        for reason, n in m.dropped.items():
            self.dropped.labels(**self.labels, reason=reason).inc(n)
        self.batches.labels(**self.labels).observe(seconds)
        for phase, ms in m.phases.ms.items():
            self.phases.labels(**self.labels, phase=phase).inc(ms / 1000)
        self.last_batch.labels(**self.labels).set(time.time())
        self.pending.labels(**self.labels).set(m.pending)
        self.behind.labels(**self.labels).set(parked)


class IngestMetrics(Endpoint):
    """The continuous ingest's metrics: records mirrored and lag per topic."""

    def __init__(
        self,
        config: PipelineConfig,
        cluster: Cluster,
        topics: dict[str, int],
        positions: Callable[[], Positions | None],
    ):
        super().__init__()
        self.labels = {"pipeline": config.name}
        self.mirrored = Counter(
            "lake_ingest_records",
            "Records the ingest mirrored into the topic's bronze table",
            [*self.labels, "topic"],
            registry=self.registry,
        )
        for topic in topics:
            self.mirrored.labels(**self.labels, topic=topic)
        self._seen: dict[str, int] = {}  # topic -> the last micro-batch counted
        self.lag = Lag("lake_ingest", self.labels, cluster, topics, positions)
        self.registry.register(self.lag)

    def query(self, topic: str, query: Any) -> None:
        """A mirroring query's progress: the records of its micro-batches since the last call (from
        its recent progress), Spark's figures."""
        last = query.lastProgress
        seen = self._seen.get(topic, -1)
        if not last or last["batchId"] <= seen:
            return
        for progress in query.recentProgress:
            if progress["batchId"] > seen:
                self.mirrored.labels(**self.labels, topic=topic).inc(int(progress["numInputRows"] or 0))
        self._seen[topic] = last["batchId"]
        self.progress(query, self.labels)


class Lag(Collector):
    """Per input topic-partition, at scrape time: ``<prefix>_lag_records``, the records (offsets,
    transaction markers among them) after the job's committed position, and ``<prefix>_lag_seconds``,
    the newest record's time minus the newest processed record's (0 when caught up). Asked of Kafka at
    most every ``LAG_EVERY_SECONDS``; a cluster that does not answer leaves both out of that scrape."""

    def __init__(
        self,
        prefix: str,
        labels: dict[str, str],
        cluster: Cluster,
        topics: dict[str, int],  # declared topic -> its partitions
        positions: Callable[[], Positions | None],
    ):
        self.prefix, self.labels, self.cluster, self.topics = prefix, labels, cluster, topics
        self.positions = positions
        self.clock = RecordClock(cluster)
        self.guard = threading.Lock()
        self.answer: list[tuple[str, int, int, float | None]] = []
        self.asked = 0.0

    def describe(self) -> list:
        return []  # collected at scrape time only

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.guard:
            if time.monotonic() - self.asked >= LAG_EVERY_SECONDS:
                try:
                    self.answer = self._ask()
                except UserError:
                    self.answer = []
                self.asked = time.monotonic()
            answer = self.answer
        names = [*self.labels, "topic", "partition"]
        records = GaugeMetricFamily(
            f"{self.prefix}_lag_records",
            "Records of the input partition after the job's committed position",
            labels=names,
        )
        seconds = GaugeMetricFamily(
            f"{self.prefix}_lag_seconds",
            "The input partition's newest record time minus the newest processed record's time",
            labels=names,
        )
        for topic, partition, lag, behind in answer:
            values = [*self.labels.values(), topic, str(partition)]
            records.add_metric(values, lag)
            if behind is not None:
                seconds.add_metric(values, behind)
        yield records
        yield seconds

    def _ask(self) -> list[tuple[str, int, int, float | None]]:
        done = self.positions() or {}
        out = []
        for topic, partitions in self.topics.items():
            name = self.cluster.topic(topic)
            for partition, (low, high) in enumerate(self.clock.watermarks(name, partitions)):
                at = max(low, done.get(name, {}).get(partition, low))
                lag = max(0, high - at)
                behind: float | None = 0.0
                if lag:
                    newest = self.clock.time_before(name, partition, high, low)
                    processed = self.clock.time_before(name, partition, at, low)
                    if processed is None:  # nothing processed yet: from the first record on
                        processed = self.clock.time_before(name, partition, at + 1, low)
                    behind = (
                        None if newest is None or processed is None else max(0, newest - processed) / 1000
                    )
                out.append((topic, partition, lag, behind))
        return out


class Gate(Collector):
    """The pipeline's last quality run, from the root's report folder (``runs/*.json``):
    ``lake_quality_gate_passed`` 1 or 0 and ``lake_quality_last_run_timestamp_seconds``; absent
    before the pipeline's first quality run. Read at most every ``GATE_EVERY_SECONDS``."""

    def __init__(self, pipeline: str, layout: Layout):
        self.pipeline, self.layout = pipeline, layout
        self.guard = threading.Lock()
        self.answer: tuple[bool, float] | None = None
        self.asked = -GATE_EVERY_SECONDS

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.guard:
            if time.monotonic() - self.asked >= GATE_EVERY_SECONDS:
                self.answer = self._last_run()
                self.asked = time.monotonic()
            answer = self.answer
        if answer is None:
            return
        passed, at = answer
        labels = ["pipeline"]
        gate = GaugeMetricFamily(
            "lake_quality_gate_passed",
            "1 when the pipeline's last quality run passed every check",
            labels=labels,
        )
        gate.add_metric([self.pipeline], 1.0 if passed else 0.0)
        when = GaugeMetricFamily(
            "lake_quality_last_run_timestamp_seconds",
            "When the pipeline's last quality run ran",
            labels=labels,
        )
        when.add_metric([self.pipeline], at)
        yield gate
        yield when

    def _last_run(self) -> tuple[bool, float] | None:
        runs = self.layout.report_folder.path / "runs"
        try:
            pages = sorted((p for p in runs.glob("*.json")), key=lambda p: p.name, reverse=True)
            for page in pages:
                report = json.loads(page.read_text())
                if report.get("pipeline") == self.pipeline:
                    at = datetime.fromisoformat(str(report["run_time"]).replace("Z", "+00:00"))
                    return bool(report["success"]), at.timestamp()
        except (OSError, ValueError, KeyError):
            return None
        return None
