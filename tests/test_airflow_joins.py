"""The gate in front of the foreign-key joins, run by Airflow (``airflow dags test`` through ``lake
airflow``): the marketplace pipeline DAG fails at its quality gate while the merchants lookup lacks an
entity the products reference, starts no join, and passes once the backfill completed the lookup,
with the joins' exact results. (The people pipeline's list-join gate runs the same DAG tasks; its
failing and passing gate are the CLI demo's, test_cli.py.)

The pipeline is the bundled one, with its dump swapped for a file of the test's own: first an export
missing an entity, then the complete one (a person fixing the source export). Each DAG run submits
real Spark applications, so this file takes several minutes.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from airflowkit import Airflow, output, ran, running, wait_for

from spark_jobs.config import bundled_config_path

DATA = bundled_config_path().parent.parent / "demo_data"
JOINS = ("display_products", "merchants_by_name")


def _pipeline(tmp_path: Path, file: str, dump: str, without: str) -> Path:
    """The bundled pipeline with its dump replaced by ``<tmp>/<dump>`` minus the ``without`` line."""
    text = bundled_config_path(file).read_text()
    text = text.replace(f"../demo_data/{dump}", str(tmp_path / dump))
    text = text.replace("../../expectations/", str(bundled_config_path().parent / "../../expectations") + "/")
    lines = (DATA / dump).read_text().splitlines()
    (tmp_path / dump).write_text("\n".join(line for line in lines if not line.startswith(without)) + "\n")
    path = tmp_path / file
    path.write_text(text)
    return path


@pytest.fixture
def airflow(tmp_path):
    pipelines = [_pipeline(tmp_path, "marketplace.yaml", "merchants.dump", "m3;")]
    af = Airflow(tmp_path / "airflow", tmp_path / "lake", pipelines=pipelines)
    assert af("db", "migrate").returncode == 0
    topics = af.lake_cli("demo", "--topics-only", "marketplace")
    assert topics.returncode == 0, topics.stderr
    assert topics.stdout.splitlines() == ["marketplace: topics written"]
    yield af
    af.stop_joins()


def _rows(af: Airflow, table: str) -> list[dict]:
    if not af.lake.exists(table):
        return []
    rows = af.lake.read_arrow(table).to_pylist()
    return sorted(({**r, "key": r["key"].decode()} for r in rows), key=lambda r: r["key"])


def _products(af: Airflow) -> list[tuple]:
    return [
        (r["key"], r["title"], r["price"], r["merchant_id"], r["merchant"], r["merchant_city"])
        for r in _rows(af, "display_products")
    ]


PRODUCTS = [
    ("p1", "Claw hammer", Decimal("19.90"), "m1", "Acme Tools", "Oslo"),
    ("p2", "Spirit level", Decimal("24.50"), "m1", "Acme Tools", "Oslo"),
    ("p3", "Cordless drill", Decimal("89.00"), "m2", "Bolt Supplies", "Bergen"),
    ("p4", "Gift card", Decimal("25.00"), None, None, None),
    ("p5", "Wood screws", Decimal("7.50"), "m3", "Cobalt Hardware", "Stavanger"),
]


def test_the_fk_pipeline_fails_at_the_gate_until_its_lookup_is_backfilled(airflow, tmp_path):
    af = airflow
    # the export lacks m3 (product p5's merchant): the gate fails
    result = af.test_dag("marketplace_pipeline")
    text = output(result)
    assert result.returncode == 1, text[-3000:]
    assert ran(result, "backfill_merchants") and ran(result, "quality_gate")
    assert "quality gate FAILED (1 check(s)): completeness:" in text
    assert (
        "FAILED: 1 foreign key missing in merchants: m3 (referenced by 1 record(s) of products (keys p5), "
        "first at partition 1 offset 0, last at partition 1 offset 0)"
    ) in text
    assert f"report: {af.root}/reports/quality/runs/" in text
    assert not ran(result, "ensure_joins_running") and not ran(result, "dbt_build")
    # no join started: no job, no result table
    assert running(af.lake) == {} and not (af.root / "_jobs").exists()
    assert not any(af.lake.exists(j) for j in JOINS)
    alerts = [json.loads(line) for line in (af.root / "_airflow" / "alerts.jsonl").read_text().splitlines()]
    assert [(a["dag_id"], a["task_id"]) for a in alerts] == [("marketplace_pipeline", "quality_gate")]
    # the report's index has the pipeline's section, failing
    index = (af.root / "reports" / "quality" / "index.html").read_text()
    section = index.split("id='pipeline-marketplace'>")[1].split("</section>")[0]
    assert "FAILING: 1 of 5 expectations failed" in section

    # the complete export arrives: the next run backfills what is missing, passes and starts the joins
    (tmp_path / "merchants.dump").write_text((DATA / "merchants.dump").read_text())
    result = af.test_dag("marketplace_pipeline")
    text = output(result)
    assert result.returncode == 0, text[-3000:]
    assert "1 new keys, 0 changed, " in text  # m3
    assert "quality gate passed: 5 check(s)" in text
    assert ran(result, "ensure_joins_running") and ran(result, "wait_joins_caught_up")
    assert ran(result, "dbt_build") and "Completed successfully" in text
    assert sorted(running(af.lake)) == sorted(["ingest:marketplace", *(f"join:{j}" for j in JOINS)])
    assert _products(af) == PRODUCTS
    assert [(r["key"], r["merchant_id"], r["city"]) for r in _rows(af, "merchants_by_name")] == [
        ("Acme Tools", "m1", "Oslo"),
        ("Bolt Supplies", "m2", "Bergen"),
        ("Cobalt Hardware", "m3", "Stavanger"),
    ]
    assert (af.root / "warehouse" / "marts.db" / "display_products" / "_delta_log").is_dir()
    assert not (af.root / "warehouse" / "marts.db" / "optout_feed").exists()  # the consents pipeline's

    # the joins run on: a merchant renamed on Kafka reaches its product
    renamed = af.lake_cli(
        "--config", str(af.pipelines[0]), "produce", "merchants", "-K", ";",
        stdin='m3;{"name": "Cobalt & Sons", "city": "Stavanger"}\n',
    )  # fmt: skip
    assert renamed.returncode == 0, renamed.stderr
    changed = [*PRODUCTS[:4], (*PRODUCTS[4][:4], "Cobalt & Sons", "Stavanger")]
    wait_for(lambda: _products(af) == changed, 180, "the renamed merchant in display_products")
