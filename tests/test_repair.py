"""Repartitioning a Kafka topic written with a foreign partitioner."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import zlib

import pytest

from spark_jobs.errors import UserError
from spark_jobs.seams.partitioners import partition_for
from spark_jobs.topics.ingest import catch_up, refresh_lookups
from spark_jobs.topics.lookup_tables import lookup_table
from spark_jobs.topics.produce_consume import consume, produce_lines, producing
from spark_jobs.topics.repair import dependents, repartition


def records(cluster, spec):
    out = io.BytesIO()
    consume(cluster, spec, out, fmt="%k|%p|%o|%s\\n")
    return out.getvalue().decode().splitlines()


def test_repartition_places_every_record_and_keeps_per_key_order(spark, lake, demo_config, cluster):
    spec = demo_config.topic("customer_accounts")
    # user_10 lands in partition 0 under crc32 and 1 under murmur2; its two versions span both
    # Recent timestamps: the topic is compacted, and a segment whose records are older than segment.ms
    # (7 days) rolls at once, after which the cleaner may drop the superseded user_10 v1.
    now = int(time.time() * 1000)
    kcat = io.BytesIO(b'user_10;{"v":1}\nuser_1;{"v":1}\n')
    produce_lines(cluster, spec, kcat, "-", key_sep=";", partitioner="consistent_random", timestamp_ms=now)
    java = io.BytesIO(b'user_10;{"v":2}\nuser_2;{"v":1}\n')
    produce_lines(cluster, spec, java, "-", key_sep=";", timestamp_ms=now + 1)
    assert zlib.crc32(b"user_10") % 4 == 0 and partition_for(b"user_10", 4) == 1
    catch_up(spark, lake, demo_config, ["customer_accounts"])
    refresh_lookups(spark, lake, demo_config, [demo_config.lookup("accounts")])
    result = repartition(spark, lake, demo_config, "customer_accounts")
    assert (result.records, result.moved, result.partitioner, result.replaced) == (4, 2, "murmur2", True)
    restart = ["lookup:accounts", "join:consents_with_mail", "join:consents_enriched_at_event_time"]
    assert result.restart == restart == dependents(demo_config, "customer_accounts")
    # one transaction wrote the copy: offsets from 0, and each partition's commit marker after it
    assert records(cluster, spec) == [
        'user_10|1|0|{"v":1}',
        'user_10|1|1|{"v":2}',
        'user_2|2|0|{"v":1}',
        'user_1|3|0|{"v":1}',
    ]
    assert cluster.topic("customer_accounts.repartition") not in _topics(cluster)
    # bronze was rebuilt from the new topic, and the lookup notices the rewrite and rebuilds itself
    bronze = sorted(
        (r["key"], r["partition"], r["offset"]) for r in lake.read_arrow("customer_accounts").to_pylist()
    )
    assert bronze == [(b"user_1", 3, 0), (b"user_10", 1, 0), (b"user_10", 1, 1), (b"user_2", 2, 0)]
    refresh_lookups(spark, lake, demo_config, [demo_config.lookup("accounts")])
    rows = {
        r["key"]: (r["value"], r["partition"], r["offset"])
        for r in lake.read_arrow(lookup_table(demo_config.lookup("accounts"))).to_pylist()
    }
    assert rows == {
        b"user_10": (b'{"v":2}', 1, 1),
        b"user_2": (b'{"v":1}', 2, 0),
        b"user_1": (b'{"v":1}', 3, 0),
    }
    # the ingest continues after the rebuilt records
    produce_lines(cluster, spec, io.BytesIO(b'user_3;{"v":1}\n'), "-", key_sep=";")
    catch_up(spark, lake, demo_config, ["customer_accounts"])
    assert lake.read_arrow("customer_accounts").num_rows == 5
    again = repartition(spark, lake, demo_config, "customer_accounts")
    assert (again.moved, again.replaced) == (0, False)


def _topics(cluster):
    from spark_jobs.seams.kafka import partition_counts

    return partition_counts(cluster)


def test_repartition_refuses_while_a_dependent_job_runs(spark, lake, demo_config, cluster):
    spec = demo_config.topic("customer_accounts")
    produce_lines(
        cluster, spec, io.BytesIO(b'user_10;{"v":1}\n'), "-", key_sep=";", partitioner="consistent_random"
    )
    jobs = lake.layout.jobs
    jobs.mkdir(parents=True)
    (jobs / "lookup_accounts.json").write_text(json.dumps({"job": "lookup:accounts", "pid": os.getpid()}))
    with pytest.raises(
        UserError,
        match=rf"refusing to rewrite customer_accounts: jobs reading it are running: lookup:accounts \(pid {os.getpid()}\)",
    ):
        repartition(spark, lake, demo_config, "customer_accounts")
    assert records(cluster, spec) == ['user_10|0|0|{"v":1}']


def test_a_produce_running_during_the_repartition_is_not_lost(spark, lake, demo_config, cluster, tmp_path):
    """`lake produce` started while the topic is replaced waits for the replacement, then writes to the
    new topic: every record is there afterwards, placed by murmur2."""
    spec = demo_config.topic("customer_accounts")
    lines = "".join(f'user_{n};{{"v":{n}}}\n' for n in range(1, 201)).encode()
    produce_lines(cluster, spec, io.BytesIO(lines), "-", key_sep=";", partitioner="consistent_random")
    late = tmp_path / "late.txt"
    late.write_text("".join(f'late_{n};{{"v":{n}}}\n' for n in range(50)))
    env = {**os.environ, "LAKE_ROOT": str(lake.root)}
    command = [sys.executable, "-m", "spark_jobs.cli", "produce", "customer_accounts", str(late), "-K", ";"]
    proc = None

    def start_producer(message: str) -> None:
        nonlocal proc
        if proc is None and message.startswith("copying"):  # the exclusive lock is held now
            proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)

    repartition(spark, lake, demo_config, "customer_accounts", log=start_producer)
    assert proc is not None
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "waiting for another process to finish topic-customer_accounts" in err
    got = [line.split("|") for line in records(cluster, spec)]
    keys = sorted(k for k, *_ in got)
    assert keys == sorted([f"user_{n}" for n in range(1, 201)] + [f"late_{n}" for n in range(50)])
    assert all(int(p) == partition_for(k.encode(), 4) for k, p, *_ in got)


def test_the_producer_lock_is_shared_between_producers(lake):
    with producing(lake, "t") as first, producing(lake, "t") as second:
        assert first and second
        pass  # two producers at once do not wait for each other
