"""Parse the DAG folder the way Airflow does and print what the integrity tests check, as JSON.

Run in its own process (tests/test_airflow.py): Airflow configures logging and settings on import,
which must not leak into the test session. Usage: python dag_facts.py DAGS_FOLDER OUT_JSON (Airflow logs to stdout)
"""

import json
import sys
import time
from pathlib import Path

folder = Path(sys.argv[1])
# Airflow itself is imported before timing: the bar is the DAG files' own parse time. So are the
# providers' operators the DAG files use, as Airflow's DAG processor pre-imports them before it parses a
# file ([dag_processor] parsing_pre_import_modules): with the OpenLineage provider installed, the Spark
# provider's operator module imports the OpenLineage client (0.3 s alone, seconds on a loaded machine).
from airflow.dag_processing.dagbag import DagBag  # noqa: E402
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator  # noqa: E402, F401
from airflow.providers.standard.operators.python import PythonOperator  # noqa: E402, F401
from airflow.serialization.serialized_objects import DagSerialization  # noqa: E402

files = sorted(p for p in folder.glob("*.py"))
facts: dict = {"files": {}, "dags": {}, "import_errors": {}}
for path in files:
    started = time.perf_counter()
    bag = DagBag(dag_folder=str(path))
    facts["files"][path.name] = {"seconds": time.perf_counter() - started, "dags": sorted(bag.dag_ids)}
    facts["import_errors"].update(bag.import_errors)
    for dag_id, dag in bag.dags.items():
        dag.check_cycle()
        DagSerialization.serialize_dag(dag)  # what the scheduler stores: must not fail
        facts["dags"][dag_id] = {
            "tags": sorted(dag.tags),
            "schedule": dag.schedule if isinstance(dag.schedule, str | None) else type(dag.schedule).__name__,
            "timetable": type(dag.timetable).__name__,
            "catchup": dag.catchup,
            "doc_md": bool(dag.doc_md),
            "paused": dag.is_paused_upon_creation,
            "params": {
                k: {**dag.params.get_param(k).schema, "description": dag.params.get_param(k).description}
                for k in dag.params
            },
            "tasks": {
                t.task_id: {
                    "type": type(t).__name__,
                    "owner": t.owner,
                    "retries": t.retries,
                    "backoff": t.retry_exponential_backoff,
                    "doc_md": bool(t.doc_md),
                    "downstream": sorted(t.downstream_task_ids),
                    "outlets": [getattr(o, "uri", str(o)) for o in t.outlets],
                    "has_failure_callback": bool(t.on_failure_callback),
                }
                for t in dag.tasks
            },
        }
facts["heavy_modules"] = sorted(m for m in ("pyspark", "great_expectations", "pyarrow") if m in sys.modules)
Path(sys.argv[2]).write_text(json.dumps(facts, default=str))
