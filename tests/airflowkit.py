"""Helpers for tests that run Airflow (``lake airflow ...``) and the detached join jobs it starts."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from spark_jobs.config import load_config
from spark_jobs.seams.delta import Lake

LAKE = str(Path(sys.executable).with_name("lake"))
ALL_MAILS = {f"user_{i}": f"user{i}@example.com" for i in range(1, 11)}


class Airflow:
    """`lake --root ROOT [--config CONFIG] airflow ...` with its own AIRFLOW_HOME (migrated once).
    ``pipelines``: the pipeline files Airflow shows (``$LAKE_PIPELINES``) instead of one config."""

    def __init__(
        self,
        home: Path,
        root: Path,
        config: Path | None = None,
        env: dict | None = None,
        pipelines: list[Path] | None = None,
    ):
        self.home, self.root, self.config = home, root, config
        self.env = {k: v for k, v in os.environ.items() if k != "LAKE_PIPELINES"}
        self.env.update({"LAKE_AIRFLOW_HOME": str(home), **(env or {})})
        self.pipelines = pipelines or [config]
        if pipelines:
            self.env["LAKE_PIPELINES"] = os.pathsep.join(str(p) for p in pipelines)
        self.lake = Lake(root)

    def __call__(self, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
        cmd = [LAKE, "--root", str(self.root)]
        if self.config:
            cmd += ["--config", str(self.config)]
        return subprocess.run(
            [*cmd, "airflow", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def test_dag(self, dag_id: str, conf: dict | None = None) -> subprocess.CompletedProcess:
        args = ["dags", "test", dag_id] + (["--conf", json.dumps(conf)] if conf else [])
        return self(*args)

    def lake_cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        cmd = [LAKE, "--root", str(self.root)] + (["--config", str(self.config)] if self.config else [])
        return subprocess.run(
            [*cmd, *args], env=self.env, capture_output=True, text=True, timeout=300, input=stdin
        )

    def stop_joins(self) -> None:
        """Stop the continuous jobs the DAGs started: the joins, then the ingest."""
        from spark_jobs.joins.supervise import stop_ingest, stop_join

        for path in self.pipelines:
            config = load_config(path)
            for spec in config.joins.values():
                stop_join(self.lake, spec)
            stop_ingest(self.lake, config)


def ran(result: subprocess.CompletedProcess, task_id: str) -> bool:
    return f"[DAG TEST] starting task_id={task_id} " in result.stdout + result.stderr


def output(result: subprocess.CompletedProcess) -> str:
    return result.stdout + result.stderr


def running(lake: Lake) -> dict[str, int]:
    from spark_jobs.runtime.jobs import running_jobs

    return running_jobs(lake)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def mails(lake: Lake, table: str) -> dict[str, str | None]:
    if not lake.exists(table):
        return {}
    rows = lake.read_arrow(table).to_pylist()
    return {r["key"].decode(): r["contactMailAddress"] for r in rows}


def asset_events(home: Path) -> list[tuple]:
    with sqlite3.connect(home / "airflow.db") as db:
        return list(
            db.execute(
                "SELECT a.name, a.uri, e.source_dag_id, e.source_task_id FROM asset_event e "
                "JOIN asset a ON a.id = e.asset_id ORDER BY e.id"
            )
        )


def demo_topics(af: Airflow) -> None:
    done = af.lake_cli("demo", "--topics-only")
    assert done.returncode == 0, done.stderr
