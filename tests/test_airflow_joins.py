"""The gate in front of the foreign-key and list joins, run by Airflow (``airflow dags test`` through
``lake airflow``): the marketplace and people pipeline DAGs fail at their quality gate while a lookup
lacks entities the left side references, start no join, and pass once the backfill completed the
lookup, with the joins' exact results.

Both pipelines are the bundled ones, with their dump swapped for a file of the test's own: first an
export missing an entity, then the complete one (a person fixing the source export). Each DAG run
submits real Spark applications, so this file takes several minutes.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from airflowkit import Airflow, output, ran, running, wait_for

from spark_jobs.config import bundled_config_path

DATA = bundled_config_path().parent.parent / "demo_data"
JOINS = {
    "marketplace": ("display_products", "merchants_by_name"),
    "people": ("people_with_addresses",),
}


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
    pipelines = [
        _pipeline(tmp_path, "marketplace.yaml", "merchants.dump", "m3;"),
        _pipeline(tmp_path, "people.yaml", "addresses.dump", "a4;"),
    ]
    af = Airflow(tmp_path / "airflow", tmp_path / "lake", pipelines=pipelines)
    assert af("db", "migrate").returncode == 0
    topics = af.lake_cli("demo", "--topics-only", "marketplace", "people")
    assert topics.returncode == 0, topics.stderr
    assert topics.stdout.splitlines() == ["marketplace: topics written", "people: topics written"]
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


def _people(af: Airflow) -> list[tuple]:
    return [
        (r["key"], r["name"], [(a["id"], a["matched"], a["street"], a["city"]) for a in r["addresses"]])
        for r in _rows(af, "people_with_addresses")
    ]


PRODUCTS = [
    ("p1", "Claw hammer", Decimal("19.90"), "m1", "Acme Tools", "Oslo"),
    ("p2", "Spirit level", Decimal("24.50"), "m1", "Acme Tools", "Oslo"),
    ("p3", "Cordless drill", Decimal("89.00"), "m2", "Bolt Supplies", "Bergen"),
    ("p4", "Gift card", Decimal("25.00"), None, None, None),
    ("p5", "Wood screws", Decimal("7.50"), "m3", "Cobalt Hardware", "Stavanger"),
]
PEOPLE = [
    ("ann", "Ann", [("a1", True, "Storgata 1", "Oslo"), ("a2", True, "Bryggen 5", "Bergen")]),
    ("bob", "Bob", [("a3", True, "Nidarosveien 9", "Trondheim"), ("a4", True, "Torget 2", "Tromsø")]),
    ("cy", "Cy", []),
]


def test_fk_and_list_pipelines_fail_at_the_gate_until_their_lookups_are_backfilled(airflow, tmp_path):
    af = airflow
    # the exports lack m3 (product p5's merchant) and a4 (on Bob's list): both gates fail
    for pipeline, missing in (
        ("marketplace", "FAILED: 1 foreign key missing in merchants: m3 (referenced by 1 record(s) of "
         "products (keys p5), first at partition 1 offset 0, last at partition 1 offset 0)"),
        ("people", "FAILED: 1 list element missing in addresses: a4 (referenced by 1 record(s) of "
         "persons (keys bob), first at partition 0 offset 1, last at partition 0 offset 1)"),
    ):  # fmt: skip
        result = af.test_dag(f"{pipeline}_pipeline")
        text = output(result)
        assert result.returncode == 1, text[-3000:]
        lookup = "merchants" if pipeline == "marketplace" else "addresses"
        assert ran(result, f"backfill_{lookup}") and ran(result, "quality_gate")
        assert "quality gate FAILED (1 check(s)): completeness:" in text
        assert missing in text
        assert f"report: {af.root}/reports/quality/runs/" in text
        assert not ran(result, "ensure_joins_running") and not ran(result, "dbt_build")
    # no join started: no job, no result table
    assert running(af.lake) == {} and not (af.root / "_jobs").exists()
    assert not any(af.lake.exists(j) for joins in JOINS.values() for j in joins)
    alerts = [json.loads(line) for line in (af.root / "_airflow" / "alerts.jsonl").read_text().splitlines()]
    assert [(a["dag_id"], a["task_id"]) for a in alerts] == [
        ("marketplace_pipeline", "quality_gate"),
        ("people_pipeline", "quality_gate"),
    ]
    # the report's index has a section per pipeline, both failing
    index = (af.root / "reports" / "quality" / "index.html").read_text()
    for pipeline in JOINS:
        section = index.split(f"id='pipeline-{pipeline}'>")[1].split("</section>")[0]
        assert "FAILING: 1 of 5 expectations failed" in section

    # the complete exports arrive: the next runs backfill what is missing, pass and start the joins
    for dump in ("merchants.dump", "addresses.dump"):
        (tmp_path / dump).write_text((DATA / dump).read_text())
    for pipeline in JOINS:
        result = af.test_dag(f"{pipeline}_pipeline")
        text = output(result)
        assert result.returncode == 0, text[-3000:]
        assert "1 new keys, 0 changed, " in text  # m3, then a4
        assert "quality gate passed: 5 check(s)" in text
        assert ran(result, "ensure_joins_running") and ran(result, "wait_joins_caught_up")
        assert ran(result, "dbt_build") and "Completed successfully" in text
    assert sorted(running(af.lake)) == sorted(
        ["ingest:marketplace", "ingest:people", *(f"join:{j}" for joins in JOINS.values() for j in joins)]
    )
    assert _products(af) == PRODUCTS
    assert [(r["key"], r["merchant_id"], r["city"]) for r in _rows(af, "merchants_by_name")] == [
        ("Acme Tools", "m1", "Oslo"),
        ("Bolt Supplies", "m2", "Bergen"),
        ("Cobalt Hardware", "m3", "Stavanger"),
    ]
    assert _people(af) == PEOPLE
    for mart in ("display_products", "people_with_addresses"):
        assert (af.root / "warehouse" / "marts.db" / mart / "_delta_log").is_dir()
    assert not (af.root / "warehouse" / "marts.db" / "optout_feed").exists()  # the consents pipeline's

    # the joins run on: a merchant renamed on Kafka reaches its product through the continuous ingest
    renamed = af.lake_cli(
        "--config", str(af.pipelines[0]), "produce", "merchants", "-K", ";",
        stdin='m3;{"name": "Cobalt & Sons", "city": "Stavanger"}\n',
    )  # fmt: skip
    assert renamed.returncode == 0, renamed.stderr
    changed = [*PRODUCTS[:4], (*PRODUCTS[4][:4], "Cobalt & Sons", "Stavanger")]
    wait_for(lambda: _products(af) == changed, 180, "the renamed merchant in display_products")
