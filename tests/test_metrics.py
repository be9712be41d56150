"""The Prometheus side of a job, without Spark: where the pipeline file puts the endpoints, the lag a
scrape reports from Kafka and a position, the quality gate's last verdict, a busy port, and the
reasons dropped records are counted by. A running join's and ingest's endpoints are scraped in
test_join_runner.py (test_start_is_idempotent_and_stop_ends_the_detached_job)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from joinkit import T0, produce, write_config
from prometheus_client.parser import text_string_to_metric_families

from spark_jobs.config import load_config
from spark_jobs.errors import UserError
from spark_jobs.joins import dropped
from spark_jobs.runtime.metrics import Endpoint, Gate, Lag
from spark_jobs.seams.kafka import connect, ensure_topics

ONE = """
pipeline: clock
topics:
  P: {partitions: 1}
  Q: {partitions: 1}
joins:
  a: {kind: table, left: P, right: Q, select: {v: left.v}}
  b: {kind: table, left: P, right: Q, select: {v: left.v}}
"""


def _samples(collector) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


def test_the_pipeline_file_places_the_endpoints_or_turns_them_off(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(ONE)
    config = load_config(path)
    assert (config.metrics.host, config.metrics.port) == ("127.0.0.1", 0)
    assert [config.metrics_port(), config.metrics_port("a")] == [0, 0]  # a free port each
    path.write_text(ONE + "metrics: {host: 0.0.0.0, port: 9400}\n")
    config = load_config(path)
    assert config.metrics.host == "0.0.0.0"
    assert [config.metrics_port(), config.metrics_port("a"), config.metrics_port("b")] == [9400, 9401, 9402]
    path.write_text(ONE + "metrics: false\n")
    assert load_config(path).metrics is None
    for bad, message in [
        (
            "metrics: {port: 65534}\n",
            "metrics.port: must be a port number (0: a free port per job; the ingest",
        ),
        ("metrics: {port: http}\n", "metrics.port: must be a port number"),
        ("metrics: {path: /m}\n", "metrics.path: unknown setting (allowed: host, port)"),
    ]:
        path.write_text(ONE + bad)
        with pytest.raises(UserError, match="p.yaml:9: ") as err:
            load_config(path)
        assert message in str(err.value)


def test_lag_in_records_and_seconds_follows_the_position(tmp_path, lake):
    """Three records 0 s, 5 s and 20 s after T0 in one transaction (offsets 0-2, its commit marker 3):
    the lag in seconds is the newest record's time minus the newest processed one's, from the first
    record's when nothing is processed; 0 once the position reaches the end."""
    config = write_config(tmp_path, ONE)
    cluster = connect(config, lake.root)
    ensure_topics(cluster, [config.topic("P"), config.topic("Q")])
    produce(lake, config, "P", [("k", "a", T0), ("k", "b", T0 + 5000), ("k", "c", T0 + 20000)])
    name = cluster.topic("P")
    position: dict = {}
    lag = Lag("lake_join", {"join": "a"}, cluster, {"P": 1, "Q": 1}, lambda: position)
    seen = []
    for at in (None, 1, 2, 4):
        position = {} if at is None else {name: {0: at}}
        lag.asked = 0.0  # a new answer from Kafka, not the last one's
        samples = _samples(lag)
        records = samples[("lake_join_lag_records", (("join", "a"), ("partition", "0"), ("topic", "P")))]
        seconds = samples[("lake_join_lag_seconds", (("join", "a"), ("partition", "0"), ("topic", "P")))]
        assert samples[("lake_join_lag_records", (("join", "a"), ("partition", "0"), ("topic", "Q")))] == 0
        seen.append((records, seconds))
    assert seen == [(4, 20.0), (3, 20.0), (2, 15.0), (0, 0.0)]
    lag.clock.close()


def test_the_gate_is_the_pipelines_last_quality_run(lake):
    gate = Gate("clock", lake.layout)
    assert _samples(gate) == {}  # no quality run yet: no series
    runs = lake.layout.report_folder.path / "runs"
    runs.mkdir(parents=True)
    for name, pipeline, success, at in [
        ("20261129T100000Z-aaaa.json", "clock", True, "2026-11-29T10:00:00+00:00"),
        ("20261129T110000Z-bbbb.json", "clock", False, "2026-11-29T11:00:00+00:00"),
        ("20261129T120000Z-cccc.json", "other", True, "2026-11-29T12:00:00+00:00"),
    ]:
        (runs / name).write_text(json.dumps({"pipeline": pipeline, "success": success, "run_time": at}))
    gate.asked = -1e9
    assert _samples(gate) == {
        ("lake_quality_gate_passed", (("pipeline", "clock"),)): 0.0,
        ("lake_quality_last_run_timestamp_seconds", (("pipeline", "clock"),)): 1795950000.0,
    }


def test_an_endpoint_serves_the_text_format_and_a_busy_port_is_one_line():
    endpoint = Endpoint()
    url = endpoint.serve("127.0.0.1", 0)
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain")
            list(text_string_to_metric_families(answer.read().decode()))  # parses
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        with pytest.raises(UserError) as err:
            Endpoint().serve("127.0.0.1", port)
        assert str(err.value).startswith(f"cannot serve metrics on 127.0.0.1:{port} (")
        assert "\n" not in str(err.value)
    finally:
        endpoint.close()
    again = Endpoint()  # closed: the port is free again (for the job's next run)
    assert again.serve("127.0.0.1", port) == url
    again.close()


def test_a_quarantine_sentence_is_counted_by_its_reason():
    sentences = [
        "null key",
        "value is not a JSON object (key 'z')",
        "key: not a Schema Registry frame (key 'x')",
        "select failed on the left record of result key 'k': division by zero",
    ]
    assert dropped.count(sentences) == {"null_key": 1, "undecodable": 2, "poison": 1}
    assert set(dropped.count(sentences)) <= set(dropped.REASONS)
