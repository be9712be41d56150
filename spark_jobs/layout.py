"""The lake root's layout, spelled once: every folder and file the product keeps under a root.

```
<root>/
  tables/<table>/                 Delta tables: bronze mirrors of the topics, lookups, join results
                                  and state, system tables (quarantine, quality runs, join metrics)
  _checkpoints/<join>/            a join's Spark checkpoint (and lake-inputs.json: its topics' ids)
  _checkpoints/ingest/<topic>/    a topic's ingest checkpoint (and <topic>.start.json after a rebuild)
  _checkpoints/.driver/<join>/    a join's checkpoint under the pipeline test driver (spark_jobs.testing)
  _jobs/<job>.json|.lock|.log     long-running jobs: registry entry, lock, output
  _locks/<name>.lock              cross-process locks (topic producers, ingest, catalog, ...)
  _repair/<topic>.json            a topic repartition in progress
  _kafka/                         the embedded broker: data, log, broker.json
  _connect/                       the Spark Connect server: server.json, server.log
  _airflow/<dag>/<run>/           what one DAG run's tasks hand each other
  reports/quality/                the report pages, Data Docs and run pages
  catalog/                        the Spark catalog's metastore (embedded Derby)
  warehouse/                      the catalog's managed tables (the dbt marts)
  dbt/                            dbt's target and logs
```

Other modules ask ``Layout(root)`` for a path instead of joining strings onto the root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The system tables under tables/ (their schemas: spark_jobs.system_tables). No topic, lookup or join
# may take these names.
QUARANTINE = "quarantine"
QUALITY_RUNS = "quality_runs"
JOIN_METRICS = "join_metrics"
SYSTEM_TABLES = (QUARANTINE, QUALITY_RUNS, JOIN_METRICS)


@dataclass(frozen=True)
class Layout:
    root: Path

    # --- data -------------------------------------------------------------------------------------
    @property
    def tables(self) -> Path:
        return self.root / "tables"

    def table(self, name: str) -> Path:
        return self.tables / name

    @property
    def catalog(self) -> Path:
        return self.root.absolute() / "catalog"

    @property
    def warehouse(self) -> Path:
        return self.root.absolute() / "warehouse"

    # --- streaming progress -----------------------------------------------------------------------
    def join_checkpoint(self, join: str) -> Path:
        return self.root / "_checkpoints" / join

    def join_inputs(self, join: str) -> Path:
        """The Kafka topic ids a join's checkpoint has read (beside Spark's own files)."""
        return self.join_checkpoint(join) / "lake-inputs.json"

    def driver_checkpoint(self, join: str) -> Path:
        return self.root / "_checkpoints" / ".driver" / join

    def ingest_checkpoint(self, topic: str) -> Path:
        return self.root / "_checkpoints" / "ingest" / topic

    # --- coordination -----------------------------------------------------------------------------
    @property
    def jobs(self) -> Path:
        return self.root / "_jobs"

    @property
    def locks(self) -> Path:
        return self.root / "_locks"

    def repair_marker(self, topic: str) -> Path:
        return self.root / "_repair" / f"{topic}.json"

    @property
    def kafka(self) -> Path:
        return self.root / "_kafka"

    @property
    def connect(self) -> Path:
        return self.root / "_connect"

    def airflow_run(self, dag_id: str, run_id: str) -> Path:
        return self.root / "_airflow" / dag_id / run_id

    @property
    def alerts(self) -> Path:
        return self.root / "_airflow" / "alerts.jsonl"

    # --- what people read -------------------------------------------------------------------------
    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def quality_reports(self) -> Path:
        return self.root.absolute() / "reports" / "quality"

    def pipeline_report(self, pipeline: str) -> Path:
        return self.quality_reports / f"{pipeline}.html"

    @property
    def dbt(self) -> Path:
        return self.root.absolute() / "dbt"
