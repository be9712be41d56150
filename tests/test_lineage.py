"""The lineage seam without Spark: nothing is sent unless OpenLineage is configured; a configured run
is START then COMPLETE, or FAIL with the error; the parent and root runs come from the environment
as Airflow's provider passes them; datasets are named by OpenLineage's naming spec. The events of a
whole pipeline DAG run are checked as a graph in test_cluster.py."""

from __future__ import annotations

import json

import pytest
from joinkit import write_config

from spark_jobs.runtime import lineage
from spark_jobs.seams.lineage import Dataset, Lineage, configured, kafka_dataset, location_dataset

PIPELINE = """
pipeline: shop
topics:
  orders: {partitions: 1}
"""


@pytest.fixture
def events(tmp_path, monkeypatch):
    """OpenLineage configured the standard way, with a file transport; the events it received."""
    out = tmp_path / "events.jsonl"
    config = tmp_path / "openlineage.yml"
    config.write_text(f"transport:\n  type: file\n  log_file_path: {out}\n  append: true\n")
    monkeypatch.setenv("OPENLINEAGE_CONFIG", str(config))
    return lambda: [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def test_nothing_is_sent_when_openlineage_is_not_configured(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no openlineage.yml here
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert not configured() and Lineage.from_environment() is None
    config = write_config(tmp_path, PIPELINE)
    asked = []
    with lineage.job_run(config, "quality", lambda: asked.append("in") or [], lambda: []) as run:
        assert run is None
    assert asked == []  # not even the datasets were worked out
    (tmp_path / "openlineage.yml").write_text("transport:\n  type: console\n")
    assert configured()
    monkeypatch.setenv("OPENLINEAGE_DISABLED", "true")
    assert not configured()


def test_a_run_is_start_then_complete_with_its_datasets_and_parent(tmp_path, monkeypatch, events):
    monkeypatch.setenv(
        "OPENLINEAGE_PARENT_ID",
        "default/shop_pipeline.run_quality_suites/019ad2f4-0000-7000-8000-000000000001",
    )
    monkeypatch.setenv(
        "OPENLINEAGE_ROOT_PARENT_ID", "default/shop_pipeline/019ad2f4-0000-7000-8000-000000000002"
    )
    config = write_config(tmp_path, PIPELINE)
    topic = Dataset("kafka://127.0.0.1:9092", "orders", (("key", "string"), ("v", "string")))
    with lineage.job_run(
        config, "quality", lambda: [topic], lambda: [location_dataset("/lake/tables/quality_runs")]
    ) as run:
        assert run is not None
        run.inputs = [
            Dataset(topic.namespace, topic.name, topic.fields, (("completeness: all keys", False),))
        ]
    start, complete = events()
    assert [start["eventType"], complete["eventType"]] == ["START", "COMPLETE"]
    assert start["run"]["runId"] == complete["run"]["runId"]
    assert (
        start["job"]
        == complete["job"]
        == {
            "namespace": "lake",
            "name": "shop.quality",
            "facets": start["job"]["facets"],
        }
    )
    parent = complete["run"]["facets"]["parent"]
    assert (parent["job"]["namespace"], parent["job"]["name"]) == (
        "default",
        "shop_pipeline.run_quality_suites",
    )
    assert parent["run"]["runId"] == "019ad2f4-0000-7000-8000-000000000001"
    assert (parent["root"]["job"]["namespace"], parent["root"]["job"]["name"]) == ("default", "shop_pipeline")
    assert parent["root"]["run"]["runId"] == "019ad2f4-0000-7000-8000-000000000002"
    (checked,) = complete["inputs"]
    assert (checked["namespace"], checked["name"]) == ("kafka://127.0.0.1:9092", "orders")
    fields = [(f["name"], f["type"]) for f in checked["facets"]["schema"]["fields"]]
    assert fields == [("key", "string"), ("v", "string")]
    assertions = checked["inputFacets"]["dataQualityAssertions"]["assertions"]
    assert [(a["assertion"], a["success"]) for a in assertions] == [("completeness: all keys", False)]
    assert [(o["namespace"], o["name"]) for o in complete["outputs"]] == [
        ("file", "/lake/tables/quality_runs")
    ]


def test_a_failing_run_is_start_then_fail_with_its_error(tmp_path, events):
    config = write_config(tmp_path, PIPELINE)
    with pytest.raises(RuntimeError), lineage.job_run(config, "join.orders_enriched", list, list):
        raise RuntimeError("join orders_enriched failed: the broker went away\nmore")
    start, fail = events()
    assert [start["eventType"], fail["eventType"]] == ["START", "FAIL"]
    error = fail["run"]["facets"]["errorMessage"]
    assert error["message"] == "join orders_enriched failed: the broker went away"
    assert "RuntimeError" in error["stackTrace"]
    assert fail["job"]["facets"]["jobType"]["processingType"] == "STREAMING"


def test_a_receiver_that_does_not_answer_costs_one_log_line(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OPENLINEAGE_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("OPENLINEAGE_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, PIPELINE)
    with lineage.job_run(config, "ingest", list, list) as run:
        assert run is not None
    said = [r.getMessage() for r in caplog.records if r.name == "lake.lineage"]
    assert len(said) == 1 and said[0].startswith("lineage: could not send the START event of shop.ingest (")


def test_datasets_follow_the_naming_spec():
    assert kafka_dataset("SASL_SSL://b1:9093,b2:9093", "t.orders") == Dataset("kafka://b1:9093", "t.orders")
    assert location_dataset("s3a://lake-bucket/prod/tables/orders") == Dataset(
        "s3://lake-bucket", "prod/tables/orders"
    )
    assert location_dataset("/srv/lake/tables/orders") == Dataset("file", "/srv/lake/tables/orders")
    assert location_dataset("file:///srv/dumps/a.dump") == Dataset("file", "/srv/dumps/a.dump")


def test_a_topics_dataset_carries_its_formats_fields(tmp_path, lake):
    """The schema facet of a topic: its key, then its value's fields as its schema declares them
    (Avro, Protobuf, JSON Schema), or its value's format for a format without one."""
    from spark_jobs.seams.kafka import connect
    from spark_jobs.testing import _formats

    (tmp_path / "a.avsc").write_text(
        json.dumps(
            {
                "type": "record",
                "name": "A",
                "fields": [
                    {"name": "id", "type": "string"},
                    {"name": "n", "type": ["null", "long"]},
                    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
                ],
            }
        )
    )
    (tmp_path / "p.proto").write_text(
        'syntax = "proto3";\npackage t;\nmessage P {\n  string name = 1;\n  repeated string ids = 2;\n  Q q = 3;\n}\n'
        "message Q {\n  int64 n = 1;\n}\n"
    )
    (tmp_path / "j.json").write_text(
        json.dumps({"type": "object", "properties": {"v": {"type": "string"}, "n": {"type": "integer"}}})
    )
    config = write_config(
        tmp_path,
        "topics:\n"
        "  a: {partitions: 1, value: {format: avro, schema: a.avsc}}\n"
        "  p: {partitions: 1, value: {format: protobuf, schema: p.proto}}\n"
        "  j: {partitions: 1, value: {format: json_schema, schema: j.json}}\n"
        "  plain: {partitions: 1, value: json}\n",
    )
    cluster = connect(config, lake.root)
    formats = _formats(config, lake)
    fields = {t: lineage.topic(cluster, config, t, formats).fields for t in ("a", "p", "j", "plain")}
    assert fields == {
        "a": (("key", "string"), ("id", "string"), ("n", "null|long"), ("at", "timestamp-millis")),
        "p": (("key", "string"), ("name", "string"), ("ids", "string"), ("q", "t.Q")),
        "j": (("key", "string"), ("v", "string"), ("n", "bigint")),
        "plain": (("key", "string"), ("value", "json")),
    }
    assert lineage.topic(cluster, config, "a").name == cluster.topic("a")
