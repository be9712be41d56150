"""Airflow orchestration: DAG integrity (parsed the way Airflow parses them) and end-to-end runs of the
DAGs with ``airflow dags test`` through ``lake airflow`` (SQLite under a temporary AIRFLOW_HOME).

The end-to-end runs submit real Spark applications with ``spark-submit`` (the SparkSubmitOperator),
so each takes one to three minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from airflowkit import Airflow, asset_events, demo_topics, output, ran
from conftest import S3_BUCKET, bucket_files

from spark_jobs.config import bundled_config_path

REPO = Path(__file__).resolve().parents[1]
DEMO_DUMP = REPO / "spark_jobs" / "demo" / "dumps" / "customer_accounts.dump"
JOINS = ("consents_with_mail", "consents_enriched_at_event_time")


# --- DAG integrity ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    """What Airflow's DagBag makes of dags/, gathered in a separate process (Airflow sets up logging
    and settings on import)."""
    tmp = tmp_path_factory.mktemp("dagbag")
    out = tmp / "facts.json"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp / "home"), "LAKE_ROOT": str(tmp / "lake")}
    env.pop("LAKE_PIPELINES", None)
    env.pop("LAKE_CONFIG", None)
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "airflow" / "dag_facts.py"), str(REPO / "dags"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    data["lake_root_created"] = (tmp / "lake").exists()
    return data


def test_every_dag_file_imports_cheaply_and_without_side_effects(facts):
    assert facts["import_errors"] == {}
    # every bundled pipeline, with neither $LAKE_PIPELINES nor $LAKE_CONFIG set
    assert facts["files"]["lakehouse.py"]["dags"] == [
        f"{pipeline}_{dag}"
        for pipeline in ("consents", "marketplace", "people")
        for dag in ("manual_backfill", "pipeline", "quality", "streams")
    ]
    for name, parsed in facts["files"].items():
        assert parsed["seconds"] < 1.0, f"{name} took {parsed['seconds']:.2f} s to parse"
    assert facts["heavy_modules"] == []  # no Spark, Great Expectations, Arrow at parse time
    assert facts["lake_root_created"] is False  # no lake access


def test_every_dag_has_tags_docs_owner_retries_and_failure_alerts(facts):
    for dag_id, dag in facts["dags"].items():
        assert "lakehouse" in dag["tags"] and f"pipeline:{dag_id.split('_')[0]}" in dag["tags"], dag_id
        assert dag["doc_md"] and dag["catchup"] is False, dag_id
        for task_id, task in dag["tasks"].items():
            where = f"{dag_id}.{task_id}"
            assert task["owner"] == "data-platform", where
            assert task["doc_md"], where
            assert task["has_failure_callback"], where
            if task_id == "dbt_build":  # failing data tests are not fixed by running them again
                assert task["retries"] == 0, where
            elif task["type"] == "LakeSubmitOperator":  # Spark work: retried, with backoff
                assert (task["retries"], task["backoff"]) == (2, 2.0), where


def test_the_pipeline_dag_is_backfill_then_suites_then_gate_then_joins(facts):
    dag = facts["dags"]["consents_pipeline"]
    assert dag["schedule"] == "@daily" and dag["paused"] is True
    edges = {t: task["downstream"] for t, task in dag["tasks"].items()}
    assert edges == {
        "backfill_accounts": ["run_quality_suites"],
        "run_quality_suites": ["quality_gate"],
        "quality_gate": ["ensure_joins_running"],
        "ensure_joins_running": ["wait_joins_caught_up"],
        "wait_joins_caught_up": ["dbt_build"],
        "dbt_build": [],
    }
    types = {t: task["type"] for t, task in dag["tasks"].items()}
    assert (
        types["backfill_accounts"]
        == types["run_quality_suites"]
        == types["dbt_build"]
        == "LakeSubmitOperator"
    )
    assert types["wait_joins_caught_up"] == "PythonSensor"
    assert dag["tasks"]["quality_gate"]["retries"] == 0  # a failed check is not retried
    # the fk and list pipelines have the same gate in front of their joins
    for pipeline, lookup in (("marketplace", "merchants"), ("people", "addresses")):
        gated = {t: task["downstream"] for t, task in facts["dags"][f"{pipeline}_pipeline"]["tasks"].items()}
        expected = {t: down for t, down in edges.items() if t != "backfill_accounts"}
        expected |= {f"backfill_{lookup}": ["run_quality_suites"]}
        assert gated == expected, pipeline


def test_manual_backfill_params_are_typed_and_it_publishes_the_lookup_asset(facts, tmp_path):
    dag = facts["dags"]["consents_manual_backfill"]
    assert dag["schedule"] is None and dag["paused"] is False
    assert dag["params"] == {
        "lookup": {
            "type": "string",
            "enum": ["accounts"],
            "title": "Lookup",
            "description": "The lookup to backfill.",
        },
        "source": {
            "type": "string",
            "title": "Dump file or URI",
            "description": (
                "An absolute path, a file:// or an s3a:// URI. Empty: the dump named in the pipeline config."
            ),
        },
        "partitioner": {
            "type": "string",
            "enum": ["default", "murmur2_random", "murmur2", "consistent_random"],
            "title": "Partitioner override",
            "description": "default: the partitioner of the topics the lookup is joined with (murmur2 for "
            "Java clients). Override only if you know the consumers' partitioner.",
        },
        "dry_run": {
            "type": "boolean",
            "title": "Dry run",
            "description": "Only count what would change; write nothing.",
        },
        "max_rejects": {
            "type": "integer",
            "minimum": 0,
            "title": "Bad lines allowed",
            "description": "Fail (writing nothing) when the dump has more bad lines than this. Accepted bad "
            "lines are quarantined and counted, never dropped silently.",
        },
    }
    tasks = dag["tasks"]
    assert tasks["validate_params"]["downstream"] == ["backfill"]
    assert tasks["backfill"]["downstream"] == ["publish_lookup_accounts", "run_quality_suites"]
    assert tasks["run_quality_suites"]["downstream"] == ["report"]
    root = Path(facts["dags"]["consents_manual_backfill"]["tasks"]["publish_lookup_accounts"]["outlets"][0])
    assert str(root).endswith("/lake/tables/lookup_accounts")


def test_quality_dag_runs_on_schedule_or_asset_and_streams_dag_offers_the_lifecycle(facts):
    quality = facts["dags"]["consents_quality"]
    assert quality["timetable"] == "AssetOrTimeSchedule"
    assert {t: task["downstream"] for t, task in quality["tasks"].items()} == {
        "run_quality_suites": ["quality_gate"],
        "quality_gate": [],
    }
    streams = facts["dags"]["consents_streams"]
    assert streams["schedule"] == "*/15 * * * *"
    assert streams["params"]["action"] == {
        "type": "string",
        "enum": ["health", "start", "stop"],
        "title": "Action",
        "description": None,
    }
    assert streams["params"]["action"]["enum"] == ["health", "start", "stop"]
    assert streams["params"]["join"]["enum"] == ["all", *JOINS]
    assert streams["tasks"]["choose_action"]["downstream"] == ["check_health", "start_joins", "stop_joins"]


def test_starting_the_joins_logs_each_job_as_it_registers_and_names_the_ones_that_did_not_start(
    monkeypatch, tmp_path, caplog
):
    """The task that starts a pipeline's jobs (``ensure_joins_running``) says what became of each one,
    even when another did not start: the task then fails naming it, and Airflow's retry leaves the
    started ones alone (the retry's "already running" is not the first word a person reads)."""
    from spark_jobs.errors import UserError
    from spark_jobs.joins import supervise
    from spark_jobs.orchestration import tasks
    from spark_jobs.runtime.jobs import JobState

    class Registered:
        def __init__(self, label: str, pid: int, started: bool):
            self.state = JobState(label, pid, started, tmp_path / "job.log")

        def wait(self) -> JobState:
            return self.state

    class Exited:
        def wait(self) -> JobState:
            raise UserError("ingest:marketplace did not start (exit 1): no cores")

    joins = {"display_products": Registered("join display_products", 41, True)}
    joins["merchants_by_name"] = Registered("join merchants_by_name", 42, False)
    monkeypatch.setattr(tasks, "connection_master", lambda conn_id: "spark://h:7077")
    monkeypatch.setattr(tasks, "lineage_env", lambda context: {})
    monkeypatch.setattr(supervise, "launch_ingest", lambda *args, **kwargs: Exited())
    monkeypatch.setattr(supervise, "launch_join", lambda lake, path, spec, *args, **kwargs: joins[spec.name])
    config = str(bundled_config_path().parent / "marketplace.yaml")
    with caplog.at_level("INFO"), pytest.raises(UserError) as failed:
        tasks.ensure_joins_running(config, str(tmp_path / "lake"), "spark_default", 5.0, params={})
    assert str(failed.value) == (
        "1 of 3 job(s) did not start: ingest:marketplace did not start (exit 1): no cores"
    )
    said = [r.getMessage() for r in caplog.records if r.name == "spark_jobs.orchestration.tasks"]
    log = tmp_path / "job.log"
    assert said == [
        "ingest:marketplace did not start (exit 1): no cores",
        f"join display_products: started (pid 41, master spark://h:7077); log {log}",
        f"join merchants_by_name: already running, left alone (pid 42, master spark://h:7077); log {log}",
    ]


# --- end to end with `airflow dags test` ------------------------------------------------------------


@pytest.fixture
def incomplete(tmp_path):
    """The demo pipeline whose configured dump lacks the oldest customers (user_9, user_10)."""
    base = bundled_config_path().parent
    text = bundled_config_path().read_text().replace("pipeline: consents", "pipeline: consents_incomplete")
    text = text.replace("../dumps/customer_accounts.dump", str(tmp_path / "accounts-1-8.dump"))
    text = text.replace("../../../expectations/", str(base / "../../../expectations") + "/")
    text = text.replace("../schemas/", str(base / "../schemas") + "/")
    lines = DEMO_DUMP.read_text().splitlines()
    (tmp_path / "accounts-1-8.dump").write_text(
        "\n".join(line for line in lines if line.split(";")[0] not in ("user_9", "user_10")) + "\n"
    )
    config = tmp_path / "incomplete.yaml"
    config.write_text(text)
    af = Airflow(tmp_path / "airflow", tmp_path / "lake", config)
    assert af("db", "migrate").returncode == 0
    demo_topics(af)
    yield af
    af.stop_joins()


@pytest.fixture
def demo(tmp_path):
    af = Airflow(tmp_path / "airflow", tmp_path / "lake")
    assert af("db", "migrate").returncode == 0
    demo_topics(af)
    yield af
    af.stop_joins()


def test_a_manual_backfill_dry_run_writes_nothing_then_a_real_one_completes_the_lookup(incomplete, tmp_path):
    """The accounts lookup lacks user_9 and user_10 (the gate failing at this point through Airflow is
    test_cluster.py's, for the fk pipeline)."""
    af = incomplete

    # a person backfills the missing customers by hand: a dry run first (nothing written), ...
    dump = tmp_path / "from-crm.dump"
    dump.write_text('user_9;"user9@example.com"\nnot a line\nuser_10;"user10@example.com"\n')
    before = af.lake_cli("consume", "customer_accounts", "-f", "%k|%p|%o\\n").stdout
    dry = af.test_dag(
        "consents_incomplete_manual_backfill",
        {"lookup": "accounts", "source": f"file://{dump}", "dry_run": True, "max_rejects": 1},
    )
    text = output(dry)
    assert dry.returncode == 1, text[-3000:]  # the suites still fail: nothing was written
    assert (
        "2 new, 0 changed, 0 unchanged, 1 rejected; would write 2 records to customer_accounts [dry run: nothing written]"
        in text
    )
    assert af.lake_cli("consume", "customer_accounts", "-f", "%k|%p|%o\\n").stdout == before
    assert not af.lake.exists("customer_accounts")  # nothing mirrored either
    assert asset_events(af.home) == []  # publish_lookup_accounts skipped

    # ... then for real: the report passes and the lookup's Asset is updated
    real = af.test_dag(
        "consents_incomplete_manual_backfill", {"lookup": "accounts", "source": str(dump), "max_rejects": 1}
    )
    text = output(real)
    assert real.returncode == 0, text[-3000:]
    assert "2 new, 0 changed, 0 unchanged, 1 rejected; wrote 2 records to customer_accounts" in text
    assert "quality gate passed: 6 check(s)" in text  # with the framing census
    assert asset_events(af.home) == [
        (
            "consents_incomplete.lookup_accounts",
            f"file://{af.root}/tables/lookup_accounts",
            "consents_incomplete_manual_backfill",
            "publish_lookup_accounts",
        )
    ]
    quarantined = [r for r in af.lake.read_arrow("quarantine").to_pylist() if r["job"] == "backfill:accounts"]
    assert [(r["line"], r["raw_hex"]) for r in quarantined] == [(2, b"not a line".hex().upper())]


def test_a_manual_backfill_on_an_s3_root_keeps_its_hand_offs_lookup_and_report_in_the_bucket(tmp_path, s3):
    """The same DAG with ``--root s3a://...``: its tasks (spark-submit, and the worker's own) hand each
    other the backfill's and the suites' summaries through the run's folder in the bucket, the lookup's
    Asset names the table there, and this machine keeps only locks and logs."""
    prefix = f"airflow/{uuid.uuid4().hex[:12]}"
    root = f"s3a://{S3_BUCKET}/{prefix}"
    af = Airflow(tmp_path / "airflow", root, env={"LAKE_WORK": str(tmp_path / "work")})  # type: ignore[arg-type]
    assert af("db", "migrate").returncode == 0
    demo_topics(af)
    dump = tmp_path / "from-crm.dump"
    dump.write_text('user_9;"user9@example.com"\nuser_10;"user10@example.com"\n')

    real = af.test_dag("consents_manual_backfill", {"lookup": "accounts", "source": str(dump)})
    text = output(real)
    assert real.returncode == 0, text[-3000:]
    assert "2 new, 0 changed, 0 unchanged, 0 rejected; wrote 2 records to customer_accounts" in text
    assert "quality gate passed: 6 check(s)" in text
    assert asset_events(af.home) == [
        (
            "consents.lookup_accounts",
            f"{root}/tables/lookup_accounts",
            "consents_manual_backfill",
            "publish_lookup_accounts",
        )
    ]
    lookup = af.lake.read_arrow("lookup_accounts").to_pylist()
    assert sorted(r["key"].decode() for r in lookup) == sorted(f"user_{n}" for n in range(1, 11))
    kept = bucket_files(s3, prefix)
    hand_offs = sorted(p.rsplit("/", 1)[1] for p in kept if "/_airflow/consents_manual_backfill/" in p)
    assert hand_offs == ["backfill.json", "quality.json"]
    assert f"{S3_BUCKET}/{prefix}/reports/quality/consents.html" in kept
    local = [
        p.relative_to(tmp_path / "work").as_posix() for p in (tmp_path / "work").rglob("*") if p.is_file()
    ]
    assert local and all(p.startswith(("_locks/", "_logs/", "_jobs/")) for p in local), local


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_reports_are_served_under_lake_reports_and_nothing_else_is(tmp_path):
    from fastapi.testclient import TestClient

    from spark_jobs.orchestration.reports import create_app, report_url

    runs = tmp_path / "lake" / "reports" / "quality" / "runs"
    runs.mkdir(parents=True)
    (runs / "r1.html").write_text("<h1>Data quality</h1>")
    (tmp_path / "lake" / "secret.txt").write_text("not a report")
    client = TestClient(create_app(str(tmp_path / "lake")))
    page = client.get("/quality/runs/r1.html")
    assert (page.status_code, page.text) == (200, "<h1>Data quality</h1>")
    for path in ("/../secret.txt", "/%2e%2e/secret.txt", "/quality/runs/none.html"):
        assert client.get(path).status_code == 404, path
    root = str(tmp_path / "lake")
    assert report_url(str(runs / "r1.html"), root, "http://host:8080/") == (
        "http://host:8080/lake-reports/quality/runs/r1.html"
    )
    assert report_url(str(tmp_path / "elsewhere.html"), root, "http://host:8080") is None


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_reports_in_a_bucket_are_served_as_a_local_roots_are(s3, monkeypatch, tmp_path):
    """The reports route on an s3a root reads ``<root>/reports`` in the bucket: a page, a folder's
    index, and a 404 for what is not there or climbs out; a report's address maps to the route."""
    from fastapi.testclient import TestClient

    from spark_jobs.orchestration.reports import create_app, report_url

    monkeypatch.setenv("LAKE_WORK", str(tmp_path / "work"))
    prefix = f"reports/{uuid.uuid4().hex[:12]}"
    root = f"s3a://{S3_BUCKET}/{prefix}"
    for key, text in [
        ("reports/quality/index.html", "<h1>All pipelines</h1>"),
        ("reports/quality/runs/r1.html", "<h1>Data quality</h1>"),
        ("secret.txt", "not a report"),
    ]:
        with s3.open_output_stream(f"{S3_BUCKET}/{prefix}/{key}") as out:
            out.write(text.encode())
    client = TestClient(create_app(root))
    page = client.get("/quality/runs/r1.html")
    assert (page.status_code, page.text, page.headers["content-type"]) == (
        200,
        "<h1>Data quality</h1>",
        "text/html; charset=utf-8",
    )
    assert client.get("/quality/").text == "<h1>All pipelines</h1>"
    for path in ("/../secret.txt", "/%2e%2e/secret.txt", "/quality/runs/none.html"):
        assert client.get(path).status_code == 404, path
    assert report_url(f"{root}/reports/quality/runs/r1.html", root, "http://host:8080/") == (
        "http://host:8080/lake-reports/quality/runs/r1.html"
    )
    assert report_url("/tmp/elsewhere.html", root, "http://host:8080") is None


def test_manual_backfill_params_are_checked_before_any_spark_work(demo, tmp_path):
    plugins = demo("plugins")
    assert plugins.returncode == 0 and "lake_reports" in plugins.stdout, output(plugins)[-2000:]
    unknown = demo.test_dag("consents_manual_backfill", {"lookup": "nope"})
    assert unknown.returncode != 0
    assert "'nope' is not one of ['accounts']" in output(unknown)
    missing = demo.test_dag(
        "consents_manual_backfill", {"lookup": "accounts", "source": str(tmp_path / "none.dump")}
    )
    text = output(missing)
    assert missing.returncode == 1
    assert f"params: {tmp_path / 'none.dump'}: no such file" in text
    assert not ran(missing, "backfill")
    assert "Spark-Submit cmd" not in text
    relative = demo.test_dag("consents_manual_backfill", {"lookup": "accounts", "source": "accounts.dump"})
    assert relative.returncode == 1
    assert (
        "params: source must be an absolute path, a file:// or an s3a:// URI, got 'accounts.dump'"
        in output(relative)
    )


def test_two_pipeline_files_with_one_name_are_refused(tmp_path, monkeypatch):
    from spark_jobs.errors import UserError
    from spark_jobs.orchestration.environment import unique_pipelines

    demo = str(bundled_config_path())
    monkeypatch.setenv("LAKE_PIPELINES", f"{demo}:{demo}")
    with pytest.raises(
        UserError, match="pipeline 'consents' is also declared by .*pipeline names must differ"
    ):
        unique_pipelines()
    assert "airflow" not in sys.modules  # the check itself needs no Airflow
