"""Repartitioning a topic written with a foreign partitioner."""

from __future__ import annotations

import io
import json
import os
import zlib

import pytest

from spark_jobs.backfill import lookup_table, refresh_lookup
from spark_jobs.errors import UserError
from spark_jobs.partitioners import partition_for
from spark_jobs.repair import dependents, repartition
from spark_jobs.topics import consume, produce_lines


def records(lake, spec):
    out = io.BytesIO()
    consume(lake, spec, out, fmt="%k|%p|%o|%s\\n")
    return out.getvalue().decode().splitlines()


def test_repartition_places_every_record_and_keeps_per_key_order(spark, lake, demo_config):
    spec = demo_config.topic("customer_accounts")
    # user_10 lands in partition 0 under crc32 and 1 under murmur2; its two versions span both
    produce_lines(
        lake,
        spec,
        io.BytesIO(b'user_10;{"v":1}\nuser_1;{"v":1}\n'),
        "-",
        key_sep=";",
        partitioner="consistent_random",
    )
    produce_lines(lake, spec, io.BytesIO(b'user_10;{"v":2}\nuser_2;{"v":1}\n'), "-", key_sep=";")
    assert zlib.crc32(b"user_10") % 4 == 0 and partition_for(b"user_10", 4) == 1
    refresh_lookup(spark, lake, demo_config, demo_config.lookup("accounts"))
    result = repartition(lake, demo_config, "customer_accounts")
    assert (result.records, result.moved, result.partitioner) == (4, 2, "murmur2")  # user_10 v1, user_1
    restart = ["lookup:accounts", "join:consents_with_mail", "join:consents_enriched_at_event_time"]
    assert result.restart == restart == dependents(demo_config, "customer_accounts")
    assert records(lake, spec) == [
        'user_10|1|0|{"v":1}',
        'user_10|1|1|{"v":2}',
        'user_2|2|0|{"v":1}',
        'user_1|3|0|{"v":1}',
    ]
    # the lookup notices the rewrite and rebuilds itself with the latest values
    refresh_lookup(spark, lake, demo_config, demo_config.lookup("accounts"))
    rows = {
        r["key"]: (r["value"], r["partition"], r["offset"])
        for r in lake.read_arrow(lookup_table(demo_config.lookup("accounts"))).to_pylist()
    }
    assert rows == {
        b"user_10": (b'{"v":2}', 1, 1),
        b"user_2": (b'{"v":1}', 2, 0),
        b"user_1": (b'{"v":1}', 3, 0),
    }
    again = repartition(lake, demo_config, "customer_accounts")
    assert (again.moved, again.version) == (0, None)


def test_repartition_refuses_while_a_dependent_job_runs(lake, demo_config):
    spec = demo_config.topic("customer_accounts")
    produce_lines(
        lake, spec, io.BytesIO(b'user_10;{"v":1}\n'), "-", key_sep=";", partitioner="consistent_random"
    )
    jobs = lake.root / "_jobs"
    jobs.mkdir(parents=True)
    (jobs / "lookup_accounts.json").write_text(json.dumps({"job": "lookup:accounts", "pid": os.getpid()}))
    before = lake.version("customer_accounts")
    with pytest.raises(
        UserError,
        match=rf"refusing to rewrite customer_accounts: jobs reading it are running: lookup:accounts \(pid {os.getpid()}\)",
    ):
        repartition(lake, demo_config, "customer_accounts")
    assert lake.version("customer_accounts") == before
