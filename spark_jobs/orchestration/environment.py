"""The environment Airflow runs in for this product (``lake airflow ARGS``): one place that says
where Airflow keeps its state, which DAGs it loads, which lake and pipelines they use, and which Spark
master the ``SparkSubmitOperator`` tasks submit to.

- ``AIRFLOW_HOME``: ``$LAKE_AIRFLOW_HOME`` or ``./.airflow`` (git-ignored), with its SQLite database.
- DAGs: this repo's ``dags/`` folder; no example DAGs; the plugin serving the reports.
- ``LAKE_ROOT`` (absolute) and ``LAKE_PIPELINES`` (pipeline files, ``:``-separated; default: the
  ``--config`` / ``$LAKE_CONFIG`` pipeline, else every bundled pipeline: consents, marketplace, people).
- The Spark connection of each pipeline (``airflow.spark_conn_id``, default ``lake_spark``) as an
  ``AIRFLOW_CONN_*`` variable pointing at ``$LAKE_SPARK_MASTER`` (default ``local[2]``), unless that
  variable is set already.
- ``PATH`` starts with this interpreter's folder, where ``spark-submit`` is.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from spark_jobs.config import load_config, pipeline_files
from spark_jobs.errors import UserError
from spark_jobs.seams.storage import resolve_root

REPO = Path(__file__).resolve().parents[2]
DAGS_FOLDER = REPO / "dags"
PLUGINS_FOLDER = Path(__file__).with_name("airflow_plugins")
DEFAULT_MASTER = "local[2]"  # the same default as the Spark session seam


def unique_pipelines(config: str | None = None) -> list[Path]:
    """:func:`pipeline_files`, checked to declare different pipeline names (they prefix DAG ids)."""
    seen: dict[str, Path] = {}
    for path in pipeline_files(config):
        name = load_config(path).name
        if name in seen:
            raise UserError(
                f"{path}: pipeline '{name}' is also declared by {seen[name]}; "
                "pipeline names must differ (they prefix the DAG ids)"
            )
        seen[name] = path
    return list(seen.values())


def airflow_home() -> Path:
    return Path(os.environ.get("LAKE_AIRFLOW_HOME") or Path.cwd() / ".airflow").absolute()


def airflow_env(
    root: str | None = None, config: str | None = None, home: Path | None = None
) -> dict[str, str]:
    env = dict(os.environ)
    home = home or airflow_home()
    pipelines = unique_pipelines(config)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["AIRFLOW_HOME"] = str(home)
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS_FOLDER)
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(PLUGINS_FOLDER)  # serves the reports, see reports.py
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home / 'airflow.db'}"
    # a local, single-user Airflow: no login page (never set this on a shared deployment)
    env.setdefault("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "True")
    env["LAKE_ROOT"] = str(resolve_root(root))
    env["LAKE_PIPELINES"] = os.pathsep.join(str(p) for p in pipelines)
    master = env.get("LAKE_SPARK_MASTER") or DEFAULT_MASTER
    for path in pipelines:
        conn = f"AIRFLOW_CONN_{load_config(path).airflow.spark_conn_id.upper()}"
        env.setdefault(conn, json.dumps({"conn_type": "spark", "host": master}))
    return env


def run_airflow(args: list[str], root: str | None = None, config: str | None = None) -> int:
    """Become ``airflow ARGS`` (this interpreter's Airflow) in the product's environment."""
    env = airflow_env(root, config)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).parent / "airflow"
    print(
        f"airflow home {env['AIRFLOW_HOME']}, lake root {env['LAKE_ROOT']}, "
        f"pipelines {env['LAKE_PIPELINES']}",
        file=sys.stderr,
        flush=True,
    )
    sys.stderr.flush()
    sys.stdout.flush()
    os.execve(str(airflow), [str(airflow), *args], env)
    return 0  # not reached
