"""Kafka -> bronze: the mirror holds exactly the committed records, once, also across a kill -9."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pyarrow as pa

from spark_jobs.config import load_config
from spark_jobs.runtime.profile import watch_queries
from spark_jobs.seams.kafka import connect, produce, read
from spark_jobs.topics.ingest import catch_up, mirrored_records

PIPELINE = "topics:\n  events: {partitions: 3}\n  other: {partitions: 2, value: string}\n"


def kafka_records(cluster, spec) -> list[tuple]:
    return sorted(
        (m.key(), m.value(), m.partition(), m.offset(), m.timestamp()[1], tuple(m.headers() or []))
        for batch in read(cluster, spec)
        for m in batch
    )


def bronze_records(lake, name) -> list[tuple]:
    rows = lake.read_arrow(name).to_pylist()
    return sorted(
        (
            r["key"],
            r["value"],
            r["partition"],
            r["offset"],
            int(r["timestamp"].timestamp() * 1000),
            tuple((h["key"], h["value"]) for h in r["headers"] or []),
        )
        for r in rows
    )


def test_ingest_mirrors_records_tombstones_and_headers_exactly(spark, lake, tmp_path):
    (tmp_path / "p.yaml").write_text(PIPELINE)
    config = load_config(tmp_path / "p.yaml")
    cluster = connect(config, lake.root)
    spec = config.topic("events")
    keys = pa.array([b"a", b"b", b"c", b"a"], pa.binary())
    values = pa.array([b'{"n":1}', b'{"n":2}', None, b'{"n":3}'], pa.binary())
    produce(cluster, spec, [(keys, values)], timestamp_ms=1_000, headers=[("source", b"test")])
    first = catch_up(spark, lake, config)
    assert first.topics == {"events": 4, "other": 0}
    want = kafka_records(cluster, spec)
    assert len(want) == 4 and bronze_records(lake, "events") == want
    assert {r["topic"] for r in lake.read_arrow("events").to_pylist()} == {cluster.topic("events")}
    # a second ingest adds only what is new
    produce(cluster, spec, [(pa.array([b"d"]), pa.array([b'{"n":4}']))], timestamp_ms=2_000)
    assert catch_up(spark, lake, config, ["events"]).topics == {"events": 1}
    assert bronze_records(lake, "events") == kafka_records(cluster, spec)


def test_topics_says_in_kafka_offsets_how_far_bronze_is_complete(spark, lake, tmp_path, capsys):
    from spark_jobs.cli import main
    from spark_jobs.seams.kafka import watermarks

    (tmp_path / "p.yaml").write_text(PIPELINE)
    (tmp_path / "in.txt").write_text('a;{"n":1}\nb;{"n":2}\nc;{"n":3}\n')
    opts = ["--root", str(lake.root), "--config", str(tmp_path / "p.yaml")]
    assert main([*opts, "produce", "events", str(tmp_path / "in.txt"), "-K", ";"]) == 0
    config = load_config(tmp_path / "p.yaml")
    ends = [high for _, high in watermarks(connect(config, lake.root), config.topic("events"))]
    assert sum(ends) == 3 + sum(1 for end in ends if end)  # one transaction: a commit marker per partition

    def events_line() -> str:
        capsys.readouterr()
        assert main([*opts, "topics"]) == 0
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  events:"))

    assert events_line().endswith(f"end offsets {ends}; not in bronze yet")
    catch_up(spark, lake, config, ["events"])
    assert events_line().endswith(f"end offsets {ends}; bronze up to offsets {ends}")


def test_an_ingest_waiting_on_another_that_ends_short_mirrors_the_rest_itself(spark, lake, tmp_path):
    """Two commands mirror one topic at once (two backfills): the second waits for the first, which
    may have started before the second's records were written and end without them. The second then
    mirrors them itself instead of waiting for an ingest that is gone."""
    import threading

    (tmp_path / "p.yaml").write_text(PIPELINE)
    config = load_config(tmp_path / "p.yaml")
    cluster = connect(config, lake.root)
    spec = config.topic("events")
    produce(cluster, spec, [(pa.array([b"a", b"b"]), pa.array([b"{}", b"{}"]))])
    lines: list[str] = []
    with lake.lock("ingest-events"):  # the first command's ingest holds the topic ...
        waiting = threading.Thread(
            target=catch_up, args=(spark, lake, config, ["events"]), kwargs={"log": lines.append}
        )
        waiting.start()
        deadline = time.monotonic() + 60
        while not lines and time.monotonic() < deadline:
            time.sleep(0.1)
    waiting.join(timeout=120)  # ... and ends having mirrored nothing
    assert not waiting.is_alive()
    assert lines[0] == "ingest: events is being mirrored by another ingest; waiting for it ..."
    assert bronze_records(lake, "events") == kafka_records(cluster, spec)


def test_with_lake_profile_each_micro_batch_logs_its_spark_phases(spark, lake, tmp_path, monkeypatch):
    (tmp_path / "p.yaml").write_text(PIPELINE)
    config = load_config(tmp_path / "p.yaml")
    spec = config.topic("events")
    produce(connect(config, lake.root), spec, [(pa.array([b"a", b"b"]), pa.array([b"{}", b"{}"]))])
    monkeypatch.setenv("LAKE_PROFILE", "1")
    lines: list[str] = []
    listener = watch_queries(spark, lines.append)
    try:
        catch_up(spark, lake, config, ["events"])
        deadline = time.monotonic() + 30  # the listener hears of the batch after it ends
        while not lines and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        spark.streams.removeListener(listener)
    assert len(lines) == 1, lines
    found = re.fullmatch(r"profile ingest_events batch 0 at (\d+\.\d{3}) rows 2 ms (\{.*\})", lines[0])
    assert found, lines[0]
    phases = json.loads(found.group(2))
    assert {"latestOffset", "walCommit", "getBatch", "queryPlanning", "addBatch", "commitOffsets"} <= set(
        phases
    )
    assert phases["triggerExecution"] >= phases["addBatch"] > 0
    assert abs(float(found.group(1)) - time.time()) < 120


def test_ingest_is_exactly_once_across_kill_9(spark, lake, tmp_path):
    (tmp_path / "p.yaml").write_text(PIPELINE)
    config = load_config(tmp_path / "p.yaml")
    cluster = connect(config, lake.root)
    spec = config.topic("events")
    for chunk in range(6):  # six transactions of 2,000 records
        keys = pa.array([f"k{chunk}-{i}".encode() for i in range(2000)], pa.binary())
        produce(cluster, spec, [(keys, pa.array([b"{}"] * 2000, pa.binary()))])
    command = [
        sys.executable, "-m", "spark_jobs.cli", "--root", str(lake.root), "--config", str(tmp_path / "p.yaml"),
        "ingest", "events", "--continuous", "--trigger", "0.2", "--max-records", "600",
    ]  # fmt: skip
    # its own session: kill -9 takes the whole job, the Python driver and its Spark JVM alike
    job = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 180
        while mirrored_records(lake, spec) < 1200:  # a few micro-batches in, far from done
            assert job.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert mirrored_records(lake, spec) < 12_000
    catch_up(spark, lake, config, ["events"])  # resumes from the killed job's checkpoint
    got = bronze_records(lake, "events")
    assert len(got) == 12_000 and len({(r[2], r[3]) for r in got}) == 12_000  # each offset once
    assert got == kafka_records(cluster, spec)
