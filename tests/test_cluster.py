"""Spark as a distributed engine: a standalone master with two workers (infra/spark-cluster.sh, from
the pyspark installation), a join submitted to it with spark-submit, and the consents pipeline's DAGs
run against it through Airflow (pipeline, then the streams DAG's start, health and stop). Slow (a few
minutes), and part of CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from airflowkit import ALL_MAILS, Airflow, demo_topics, mails, output, ran, running, wait_for

from spark_jobs.session import submit_conf

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "infra" / "spark-cluster.sh")
APP = str(REPO / "spark_jobs" / "_submit" / "lake_app.py")
PORT, UI = 17077, 18090  # not the defaults, so a developer's own cluster is left alone
MASTER = f"spark://127.0.0.1:{PORT}"
JOINS = ("consents_with_mail", "consents_enriched_at_event_time")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spark-cluster")
    env = {
        **os.environ,
        "SPARK_CLUSTER_DIR": str(folder),
        "SPARK_MASTER_PORT": str(PORT),
        "SPARK_MASTER_WEBUI_PORT": str(UI),
    }
    started = subprocess.run([SCRIPT, "start"], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"cluster up: {MASTER} with 2 workers" in started.stdout
        yield folder
    finally:
        subprocess.run([SCRIPT, "stop"], env=env, capture_output=True, timeout=120)


def master_state() -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{UI}/json/", timeout=5) as reply:
        return json.load(reply)


def apps(kind: str) -> dict[str, str]:
    return {a["name"]: a["state"] for a in master_state()[kind]}


def test_a_join_submitted_to_the_standalone_cluster_runs_on_its_workers(cluster, tmp_path):
    state = master_state()
    assert (state["status"], state["aliveworkers"]) == ("ALIVE", 2)
    root = tmp_path / "lake"
    af = Airflow(tmp_path / "airflow", root)
    demo_topics(af)
    conf = [arg for key, value in submit_conf().items() for arg in ("--conf", f"{key}={value}")]
    submit = Path(sys.executable).with_name("spark-submit")
    done = subprocess.run(
        [str(submit), "--master", MASTER, "--name", "cluster-join", "--conf", "spark.cores.max=2", *conf, APP]
        + ["run", "consents_with_mail", "--once", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "PATH": f"{submit.parent}{os.pathsep}{os.environ['PATH']}",
        },  # as `lake airflow` does
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "join consents_with_mail: processed 1 micro-batch(es): 18 input records, 10 upserted" in done.stdout
    )
    # the demo's accounts topic lacks user_9 and user_10 until it is backfilled
    assert mails(af.lake, "consents_with_mail") == {**ALL_MAILS, "user_9": None, "user_10": None}
    assert apps("completedapps") == {"cluster-join": "FINISHED"}
    # its executors ran in the workers' JVMs (one work folder per application and worker)
    app_dirs = sorted(p.parent.name for p in cluster.glob("worker*/app-*/*/stderr"))
    assert len(app_dirs) >= 2 and {p.name for p in cluster.glob("worker*") if list(p.glob("app-*"))} == {
        "worker1",
        "worker2",
    }


def test_the_pipeline_dag_on_the_cluster_passes_the_gate_starts_the_joins_once_then_health_and_stop(
    cluster, tmp_path
):
    """The consents pipeline through Airflow with every Spark task and continuous job on the cluster
    (the same DAGs on local[2] are test_airflow_joins.py's): the gate passes, the ingest and both
    joins run as cluster applications and catch up, the marts are built; the streams DAG leaves
    running joins alone, reports them healthy, stops them, then alerts that they are down."""
    af = Airflow(
        tmp_path / "airflow",
        tmp_path / "lake",
        env={"LAKE_SPARK_MASTER": MASTER, "LAKE_SPARK_CORES_MAX": "1"},
    )
    assert af("db", "migrate").returncode == 0
    demo_topics(af)
    try:
        _pipeline_then_streams(af)
    finally:
        af.stop_joins()
    assert running(af.lake) == {}


def _pipeline_then_streams(af: Airflow) -> None:
    result = af.test_dag("consents_pipeline")
    text = output(result)
    assert result.returncode == 0, text[-3000:]
    assert f"Spark-Submit cmd: spark-submit --master {MASTER} " in text
    assert "backfill accounts from" in text and "2 new keys, 0 changed, 8 unchanged" in text
    assert "quality gate passed: 5 check(s)" in text
    jobs = running(af.lake)
    assert sorted(jobs) == sorted(["ingest:consents", *(f"join:{j}" for j in JOINS)])
    assert (
        f"join consents_with_mail: started (pid {jobs['join:consents_with_mail']}, master {MASTER})" in text
    )
    # the continuous table join catches up on the cluster: every consent has its customer's e-mail
    wait_for(lambda: mails(af.lake, "consents_with_mail") == ALL_MAILS, 300, "the join on the cluster")
    assert apps("activeapps") == {
        "ingest-consents": "RUNNING",
        "join-consents_with_mail": "RUNNING",
        "join-consents_enriched_at_event_time": "RUNNING",
    }
    assert {"consents-backfill_accounts", "consents-run_quality_suites", "consents-dbt_build"} <= set(
        apps("completedapps")
    )
    # the run built the pipeline's marts once the joins had caught up, their tests passing
    assert ran(result, "wait_joins_caught_up") and ran(result, "dbt_build")
    assert "Completed successfully" in text
    assert (af.root / "warehouse" / "marts.db" / "optout_feed").is_dir()
    assert not (af.root / "warehouse" / "marts.db" / "display_products").exists()  # another pipeline's

    # start again (the streams DAG): nothing new starts, the same processes run on
    again = af.test_dag("consents_streams", {"action": "start"})
    assert again.returncode == 0, output(again)[-3000:]
    assert output(again).count("already running, left alone") == 3  # the ingest and both joins
    assert running(af.lake) == jobs

    healthy = af.test_dag("consents_streams")  # the scheduled action: the health check
    assert healthy.returncode == 0, output(healthy)[-3000:]
    assert f"healthy: {', '.join(JOINS)} (limit 10000 records behind)" in output(healthy)

    stopped = af.test_dag("consents_streams", {"action": "stop"})
    assert stopped.returncode == 0, output(stopped)[-3000:]
    assert running(af.lake) == {}

    down = af.test_dag("consents_streams")
    text = output(down)
    assert down.returncode == 1
    assert "join consents_with_mail is down (last batch " in text
    alerts = [json.loads(line) for line in (af.root / "_airflow" / "alerts.jsonl").read_text().splitlines()]
    assert [(a["dag_id"], a["task_id"]) for a in alerts] == [("consents_streams", "check_health")]
    assert alerts[0]["error"].startswith(
        "3 problem(s): the continuous ingest of consents is down, so the bronze tables fall behind the "
        "topics (the joins read Kafka and are not affected); start it with 'lake ingest --continuous "
        "--detach'; join consents_with_mail is down"
    )
