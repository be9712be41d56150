"""The lake root's layout, spelled once: every folder and file the product keeps under a root, and
what it keeps in this machine's work folder (:mod:`spark_jobs.seams.storage`: for a local root the
root itself, so a local lake is one folder).

```
<root>/                           durable: a local folder or an object store's prefix (s3a://)
  tables/<table>/                 Delta tables: bronze mirrors of the topics (<topic>), lookups
                                  (lookup_<lookup>), join results (<join>) and the tables a join owns
                                  (<join>__<part>, JOIN_PARTS), system tables (SYSTEM_TABLES)
  _checkpoints/<join>/            a join's Spark checkpoint (and lake-inputs.json: its topics' ids)
  _checkpoints/ingest/<topic>/    a topic's ingest checkpoint (and <topic>.start.json after a rebuild)
  _checkpoints/lookups/<lookup>.json
                                  the Kafka offsets a lookup's table is complete up to
  _checkpoints/.driver/<join>/    a join's checkpoint under the pipeline test driver (spark_jobs.testing)
  _repair/<topic>.json            a topic repartition in progress
  _leases/<name>.json             who holds a job or a lock now, on a root on an object store
                                  (spark_jobs.runtime.leases)
  _uploads/<id>/                  a local dump a backfill on an object store's root copied up for the
                                  cluster's executors to read (removed when the backfill ends)
  _airflow/<dag>/<run>/           what one DAG run's tasks hand each other; alerts.jsonl
  reports/quality/                the report pages, Data Docs and run pages (ReportFolder)
  warehouse/                      the catalog's managed tables (the dbt marts)

<work>/                           this machine's: a local folder
  _jobs/<job>.json|.lock|.log|.last.json
                                  long-running jobs: registry entry, lock, output, last micro-batch
  _logs/<command>.log             what Spark's JVM printed during a command (its warnings, Java stack
                                  traces): kept out of the command's own output
  _locks/<name>.lock              cross-process locks (topic producers, ingest, catalog, ...)
  _kafka/                         the embedded broker: data/, server.properties, log4j2.properties,
                                  broker.log, broker.out, broker.json
  _registry/                      the embedded Schema Registry: data/, registry.log, registry.json
  _s3/                            the embedded S3 store: data/, s3.json, s3.log (spark_jobs.seams.embedded_s3)
  _connect/                       the Spark Connect server: server.json, server.log, warm-up/
  _staging/<id>/                  a command's local copies while it works on an object store's root
  catalog/                        the Spark catalog's metastore (embedded Derby)
  dbt/target/, dbt/logs/          dbt's target and logs
```

Other modules ask the lake's ``Layout`` (``Lake.layout``, or ``Layout(root)`` where there is no lake
yet) for a path, and the functions below for a table's name, instead of joining strings. A durable
path is a ``pathlib.Path`` under a local root and a :class:`spark_jobs.seams.storage.ObjectPath`
under an object store's: both answer the same questions; ``str()`` of either is what Spark is given.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_jobs.seams.storage import Root, resolve_root

# The system tables under tables/ (their schemas: spark_jobs.system_tables). No topic, lookup or join
# may take these names.
QUARANTINE = "quarantine"
QUALITY_RUNS = "quality_runs"
JOIN_METRICS = "join_metrics"
SYSTEM_TABLES = (QUARANTINE, QUALITY_RUNS, JOIN_METRICS)

LOOKUP_PREFIX = "lookup_"
OWNED = "__"  # <join>__<part>: a table a join owns
# The tables a join owns, by part: what each holds
JOIN_PARTS = {
    "parked": "a keyed join's result rows parked for the table's next catch-up (--table-every)",
    "waiting": "a stream-table join's left events waiting for their right key",
    "right_history": "a stream-table join's right records, for the events that arrive later",
    "left_buffer": "a stream-stream join's left events whose window is open",
    "right_buffer": "a stream-stream join's right events whose window is open",
    "progress": "a stream join's watermark and decisions per micro-batch",
}


def lookup_table(lookup: str) -> str:
    """The Delta table a lookup is kept in."""
    return f"{LOOKUP_PREFIX}{lookup}"


def join_table(join: str, part: str) -> str:
    """The name of a table join ``join`` owns (``part``: one of ``JOIN_PARTS``)."""
    if part not in JOIN_PARTS:
        raise KeyError(f"no join table part {part!r} (parts: {', '.join(JOIN_PARTS)})")
    return f"{join}{OWNED}{part}"


def former_pending_table(join: str) -> str:
    """The name a stream-table's waiting events and a keyed join's parked rows both had before each
    got its own (``waiting``, ``parked``); :func:`spark_jobs.joins.engine.adopt_former_names` renames it."""
    return f"{join}{OWNED}pending"


def is_reserved(name: str) -> bool:
    """Would a topic, lookup or join of this name share a table name with the lake's own tables?"""
    return name in SYSTEM_TABLES or name.startswith(LOOKUP_PREFIX) or OWNED in name


class Layout:
    """``root``: a :class:`Root`, or a local folder (then also its own work folder)."""

    def __init__(self, root: Root | Path | str):
        self.lake = resolve_root(root)
        self.root: Any = self.lake.path  # durable: Path or ObjectPath
        self.work: Path = self.lake.work  # this machine's

    # --- data -------------------------------------------------------------------------------------
    @property
    def tables(self) -> Any:
        return self.root / "tables"

    def table(self, name: str) -> Any:
        return self.tables / name

    @property
    def catalog(self) -> Path:
        return self.work / "catalog"

    @property
    def warehouse(self) -> Any:
        return self.root / "warehouse"

    # --- streaming progress -----------------------------------------------------------------------
    def join_checkpoint(self, join: str) -> Any:
        return self.root / "_checkpoints" / join

    def join_tables(self, join: str) -> list[Any]:
        """The tables join ``join`` owns that exist (``<join>__<part>``)."""
        return sorted(self.tables.glob(f"{join}{OWNED}*")) if self.tables.is_dir() else []

    def join_inputs(self, join: str) -> Any:
        """The Kafka topic ids a join's checkpoint has read (beside Spark's own files)."""
        return self.join_checkpoint(join) / "lake-inputs.json"

    def driver_checkpoint(self, join: str) -> Any:
        return self.root / "_checkpoints" / ".driver" / join

    def ingest_checkpoint(self, topic: str) -> Any:
        return self.root / "_checkpoints" / "ingest" / topic

    def lookup_position(self, lookup: str) -> Any:
        """The Kafka offsets a lookup's table is complete up to, recorded by its last refresh."""
        return self.root / "_checkpoints" / "lookups" / f"{lookup}.json"

    def ingest_start(self, topic: str) -> Any:
        """Where a rebuilt bronze table's records end: the next ingest checkpoint starts there."""
        return self.root / "_checkpoints" / "ingest" / f"{topic}.start.json"

    # --- coordination -----------------------------------------------------------------------------
    @property
    def jobs(self) -> Path:
        return self.work / "_jobs"

    def job_entry(self, job: str) -> Path:
        """A running job's registry entry (pid, mode, heartbeat)."""
        return self.jobs / f"{job}.json"

    def job_lock(self, job: str) -> Path:
        return self.jobs / f"{job}.lock"

    def job_log(self, job: str) -> Path:
        return self.jobs / f"{job}.log"

    def spark_log(self, command: str) -> Path:
        """Where a command's Spark JVM writes its own output (``lake backfill``: ``backfill.log``)."""
        return self.work / "_logs" / f"{command}.log"

    def job_last_batch(self, job: str) -> Path:
        """A job's last micro-batch (its figures); it outlives the run."""
        return self.jobs / f"{job}.last.json"

    @property
    def locks(self) -> Path:
        return self.work / "_locks"

    def lock(self, name: str) -> Path:
        return self.locks / f"{name}.lock"

    def repair_marker(self, topic: str) -> Any:
        return self.root / "_repair" / f"{topic}.json"

    @property
    def kafka(self) -> Path:
        return self.work / "_kafka"

    @property
    def broker_state(self) -> Path:
        """The running embedded broker: its pid and ports."""
        return self.kafka / "broker.json"

    @property
    def broker_log(self) -> Path:
        return self.kafka / "broker.log"

    @property
    def broker_data(self) -> Path:
        """The embedded broker's log directories (its topics' records and the KRaft metadata)."""
        return self.kafka / "data"

    @property
    def broker_config(self) -> Path:
        """The embedded broker's server.properties, written at each start."""
        return self.kafka / "server.properties"

    @property
    def broker_log_config(self) -> Path:
        return self.kafka / "log4j2.properties"

    @property
    def broker_output(self) -> Path:
        """What the broker's JVM printed before its logging started."""
        return self.kafka / "broker.out"

    @property
    def registry(self) -> Path:
        return self.work / "_registry"

    @property
    def registry_state(self) -> Path:
        """The running embedded Schema Registry: its pid and URL."""
        return self.registry / "registry.json"

    @property
    def registry_log(self) -> Path:
        return self.registry / "registry.log"

    @property
    def registry_data(self) -> Path:
        """The embedded registry's storage (an H2 database: the schemas outlive a restart)."""
        return self.registry / "data"

    @property
    def s3(self) -> Path:
        return self.work / "_s3"

    @property
    def s3_state(self) -> Path:
        """The running embedded S3 store: its pid, endpoint and key (readable by its owner only)."""
        return self.s3 / "s3.json"

    @property
    def s3_log(self) -> Path:
        return self.s3 / "s3.log"

    @property
    def s3_data(self) -> Path:
        """The embedded S3 store's objects, as files: ``data/<bucket>/<key>``."""
        return self.s3 / "data"

    @property
    def s3_properties(self) -> Path:
        """The embedded S3 store's settings, written at each start."""
        return self.s3 / "s3.properties"

    @property
    def s3_log_config(self) -> Path:
        return self.s3 / "logback.xml"

    @property
    def connect(self) -> Path:
        return self.work / "_connect"

    @property
    def connect_state(self) -> Path:
        """The running Spark Connect server: its pid and port."""
        return self.connect / "server.json"

    @property
    def connect_log(self) -> Path:
        return self.connect / "server.log"

    @property
    def connect_warm_up(self) -> Path:
        """The small Delta table the Connect server writes and reads once at its start."""
        return self.connect / "warm-up"

    def airflow_run(self, dag_id: str, run_id: str) -> Any:
        return self.root / "_airflow" / dag_id / run_id

    @property
    def alerts(self) -> Any:
        return self.root / "_airflow" / "alerts.jsonl"

    # --- what people read -------------------------------------------------------------------------
    @property
    def reports(self) -> Any:
        return self.root / "reports"

    @property
    def quality_reports(self) -> Any:
        return self.root / "reports" / "quality"

    @property
    def report_folder(self) -> ReportFolder:
        return ReportFolder(self.quality_reports)

    def lease(self, name: str) -> Any:
        """The lease ``name`` (``job-<job>``, ``lock-<lock>``) of a root on an object store."""
        return self.root / "_leases" / f"{name}.json"

    def upload(self, name: str) -> Any:
        """Where a backfill copies a local dump up to for the executors to read, a folder of its own."""
        from uuid import uuid4

        return self.root / "_uploads" / uuid4().hex / name

    @property
    def staging(self) -> Path:
        """Where a command keeps local copies while it works on a root on an object store (Great
        Expectations' project during a quality run): removed when it ends."""
        return self.work / "_staging"

    @property
    def dbt(self) -> Path:
        return self.work / "dbt"

    @property
    def dbt_target(self) -> Path:
        return self.dbt / "target"

    @property
    def dbt_logs(self) -> Path:
        return self.dbt / "logs"


@dataclass(frozen=True)
class ReportFolder:
    """A folder of data-quality reports (the root's ``reports/quality``, or ``lake check
    --report-dir``): ``index.html`` (a section per pipeline), ``<pipeline>.html``, ``summary.html`` /
    ``summary.json`` (the latest run), ``runs/<time>-<id>.html|.json`` (each run's own page) and
    Great Expectations' project (``gx/``) with its Data Docs."""

    path: Any  # a local Path or an object store's (spark_jobs.seams.storage.ObjectPath)

    @property
    def index(self) -> Any:
        return self.path / "index.html"

    @property
    def summary(self) -> Any:
        return self.path / "summary.html"

    @property
    def summary_json(self) -> Any:
        return self.path / "summary.json"

    def pipeline_page(self, pipeline: str) -> Any:
        return self.path / f"{pipeline}.html"

    def pipeline_pages(self) -> list[Any]:
        """The pipelines' pages present, by name."""
        return sorted(p for p in self.path.glob("*.html") if p not in (self.index, self.summary))

    def run_page(self, run_time: datetime, run_id: str) -> Any:
        return self.path / "runs" / f"{run_time.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}-{run_id[:8]}.html"

    @property
    def data_docs_index(self) -> Any:
        """The index of the Data Docs site Great Expectations builds in its project (``gx/``)."""
        return self.path / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"

    def href(self, target: Any) -> str:
        """``target``'s address relative to the folder (a link between the folder's pages)."""
        return target.relative_to(self.path).as_posix()

    def link(self, page: Any, target: Any) -> str:
        """The relative link from ``page`` to ``target``, both in the folder: it works on disk, over
        http (the Airflow UI's "Data quality" view) and on an object store's web endpoint alike."""
        return posixpath.relpath(self.href(target), posixpath.dirname(self.href(page)) or ".")
