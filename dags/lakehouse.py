"""Airflow DAG file: four DAGs per configured pipeline (docs/airflow.md).

Thin on purpose: the DAGs are built from the pipeline YAML by spark_jobs.orchestration.dags, which
reads the config and nothing else at parse time (no Spark, no lake access, no Great Expectations).
Which pipelines: $LAKE_PIPELINES (":"-separated files), else $LAKE_CONFIG, else every bundled pipeline.
"""

from spark_jobs.orchestration.dags import build_dags

globals().update(build_dags())
