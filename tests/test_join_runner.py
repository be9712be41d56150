"""Joins as streaming queries: lake run --once / --continuous, restart, status, audit, a second copy
refused, a graceful SIGTERM, and SIGKILL at random moments with exactly-once results."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions
from joinkit import (
    KEYED_PIPELINE,
    PIPELINE,
    T0,
    Feeder,
    changelog,
    derive_rows,
    fk_rows,
    forget_producers,
    jv,
    list_rows,
    model_derive,
    model_fk,
    model_list,
    model_table,
    produce,
    result_rows,
    topic_history,
    write_config,
)

from spark_jobs.cli import main
from spark_jobs.errors import UserError
from spark_jobs.joins import dropped
from spark_jobs.joins.behind import TableBehind, current_view, pending
from spark_jobs.joins.runner import _batch_offsets, run_join, status
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import connect, delete_topics, watermarks

LAKE = str(Path(sys.executable).with_name("lake"))


@pytest.fixture
def setup(tmp_path):
    cfg = write_config(tmp_path)
    return cfg, Lake(tmp_path / "lake"), ["--root", str(tmp_path / "lake"), "--config", cfg.source]


def no_noop_changes(lake, name):
    """The change feed never repeats a row: no update whose post-image equals its pre-image and no
    insert of a key that exists (what a replayed batch would leave behind)."""
    feed = lake.changes_arrow(name).to_pylist()
    live: dict = {}
    pre: dict = {}
    for c in feed:
        row = {k: v for k, v in c.items() if not k.startswith("_")}
        kind, key = c["_change_type"], c["key"]
        if kind == "insert":
            assert key not in live, f"insert of existing key {key!r}"
            live[key] = row
        elif kind == "delete":
            assert live.pop(key) == row
        elif kind == "update_preimage":
            assert live[key] == row
            pre[key] = row
        else:
            assert pre.pop(key) != row, f"no-op update of {key!r}"
            live[key] = row
    current = {r["key"]: r for r in lake.read_arrow(name).to_pylist()}
    assert live == current


def test_run_once_resumes_where_it_stopped_and_status_and_audit_see_it(spark, setup, capsys):
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("a", "a1", T0), ("b", "b1", T0)])
    produce(lake, cfg, "R", [("a", "r1", T0)])
    assert main(["run", "t_left", "--once", *opts]) == 0
    assert "processed 1 micro-batch(es): 3 input records, 2 upserted" in capsys.readouterr().out
    produce(lake, cfg, "R", [("b", "r2", T0 + 1)])
    assert main(["run", "t_left", "--once", *opts]) == 0
    assert "processed 1 micro-batch(es): 1 input records, 1 upserted" in capsys.readouterr().out
    assert result_rows(lake, "t_left") == [("a", "a1", "r1"), ("b", "b1", "r2")]
    no_noop_changes(lake, "t_left")

    row = next(r for r in status(lake, cfg) if r["join"] == "t_left")
    assert (row["running"], row["records_behind"], row["last_batch_in"], row["last_batch_out"]) == (
        False,
        {"left": 0, "right": 0},
        1,
        1,
    )
    read = row["offsets"]
    # the last run's first micro-batch (its only one): its record, and how long the run took to it
    first = row["first_batch"]
    assert first["records"] == 1 and first["after_s"] >= first["after_spark_s"] >= 0, first
    produce(lake, cfg, "L", [("c", "c1", T0 + 2)])
    assert main(["status", *opts]) == 0
    # Kafka's lag: the record and its transaction's commit marker
    shown = (
        f"t_left (table): stopped; records behind: L 2, R 0; read L up to offsets {read['left']}, "
        f"R up to offsets {read['right']}; first batch {first['after_s']:g} s after the last run's start "
        f"({first['after_spark_s']:g} s after Spark was ready); last batch"
    )
    assert shown in capsys.readouterr().out

    assert main(["audit", "t_left", *opts]) == 0
    assert (
        f"2 result rows, 2 expected by the batch join of L up to offsets {read['left']}, R up to offsets "
        f"{read['right']}: identical" in capsys.readouterr().out
    )
    # tamper with the result: the audit names the key and exits 1
    row = next(r for r in lake.read_arrow("t_left").to_pylist() if r["key"] == b"b")
    tampered = {**row, "rv": "wrong"}
    lake.merge("t_left", pa.Table.from_pylist([tampered], schema=lake.schema("t_left")), ["key"])
    assert main(["audit", "t_left", *opts]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT for 1 key(s), e.g. b" in out and "wrong" in out


def test_audit_names_keys_whose_records_came_out_of_timestamp_order_and_raises_no_false_alarm(
    spark, setup, capsys
):
    """b's right records: r1 at T0, r2 at T0+3 (one run), then r2 again at T0+2 (late, the next run).
    The join keeps r2 from the record at T0+3 (a record older than its accepted version changes
    nothing); a batch join of the topics begins r2's run at T0+2. Both are right about the value;
    the value time and provenance depend on the micro-batches. lake audit compares b without them,
    names it, and finds the result identical; a wrong value is still found."""
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("a", "a1", T0), ("b", "b1", T0)])
    produce(lake, cfg, "R", [("a", "r", T0), ("b", "r1", T0), ("b", "r2", T0 + 3)])
    assert main(["run", "t_left", "--once", *opts]) == 0
    produce(lake, cfg, "R", [("b", "r2", T0 + 2)])
    assert main(["run", "t_left", "--once", *opts]) == 0
    capsys.readouterr()
    assert main(["audit", "t_left", *opts]) == 0
    out = capsys.readouterr().out
    assert (
        "(1 key(s) whose records came out of timestamp order compared without timestamp, left_partition, "
        "left_offset, right_partition, right_offset, which then depend on how the records fell into "
        "micro-batches: b): identical"
    ) in out, out
    assert main(["audit", "t_left", "--json", *opts]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["clean"], report["unordered_keys"]) == (True, ["b"])
    row = next(r for r in lake.read_arrow("t_left").to_pylist() if r["key"] == b"b")
    lake.merge(
        "t_left", pa.Table.from_pylist([{**row, "rv": "wrong"}], schema=lake.schema("t_left")), ["key"]
    )
    assert main(["audit", "t_left", *opts]) == 1
    assert "DIFFERENT for 1 key(s), e.g. b" in capsys.readouterr().out


def test_a_stopped_run_restarts_mid_stream_exactly_once(spark, setup):
    cfg, lake, _ = setup
    produce(lake, cfg, "L", [("a", "a0", T0)])
    lines: list[str] = []
    assert run_join(spark, lake, cfg, "t_left", once=True, log=lines.append).batches == 1  # the snapshot
    # each batch's line says where its time went (spark_jobs.runtime.profile)
    phases = r"read\+state \d+, publish \d+, write \d+, metrics \d+"
    assert re.fullmatch(rf"join t_left batch 0: in 1\+0, .* \((\d+) ms: {phases}\)", lines[-2]), lines
    # then how long the run took to its first micro-batch
    assert re.fullmatch(
        r"join t_left: first micro-batch \(1 record\(s\)\) done [\d.]+ s after the command started, [\d.]+ s "
        r"after its Spark session was ready",
        lines[-1],
    ), lines
    # three more transactions per topic (9 records, 6 commit markers), a few offsets per micro-batch
    for i in range(1, 4):
        produce(lake, cfg, "L", [("a", f"a{i}", T0 + i), (f"x{i}", "x", T0 + i)])
        produce(lake, cfg, "R", [("a", f"r{i}", T0 + i)])
    stop = threading.Event()

    def log(line):
        if " batch " in line:
            stop.set()  # ask to stop as soon as a micro-batch is done

    first = run_join(spark, lake, cfg, "t_left", once=True, max_records=4, log=log, stop=stop)
    assert first.stopped_by_signal and first.batches == 1 and 0 < first.input_rows < 9
    # the result holds exactly the records read so far: the batch join of the consumed offsets
    assert main(["audit", "t_left", "--root", str(lake.root), "--config", cfg.source]) == 0
    rest = run_join(spark, lake, cfg, "t_left", once=True, max_records=4)
    assert rest.batches >= 2 and first.input_rows + rest.input_rows == 9
    want = model_table(topic_history(lake, "L"), topic_history(lake, "R"), "left")
    assert (
        result_rows(lake, "t_left")
        == want
        == [
            ("a", "a3", "r3"),
            ("x1", "x", None),
            ("x2", "x", None),
            ("x3", "x", None),
        ]
    )
    no_noop_changes(lake, "t_left")


def _start(opts, *extra, **env_vars):
    env = dict(os.environ, LAKE_SPARK_UI="false", **env_vars)
    return subprocess.Popen(
        [LAKE, "run", "t_left", "--continuous", "--trigger", "0.5", *extra, *opts],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait(predicate, timeout, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"job exited early: {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    return False


def _terminate(proc) -> tuple[str, str]:
    """SIGTERM a job; it must end cleanly. Its stdout and stderr."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    return out, err


def _heartbeat(lake):
    entry = lake.layout.job_entry("t_left")
    try:
        return json.loads(entry.read_text()).get("last_batch_id")
    except (OSError, ValueError):
        return None


@pytest.mark.slow
def test_continuous_run_stops_gracefully_on_sigterm_and_refuses_a_second_copy(spark, setup, capsys):
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("a", "a1", T0)])
    proc = _start(opts)
    try:
        assert _wait(lambda: _heartbeat(lake) is not None, 120, proc)
        assert main(["run", "t_left", "--once", *opts]) == 2
        assert "join t_left is already running (pid" in capsys.readouterr().err
        assert next(r for r in status(lake, cfg) if r["join"] == "t_left")["running"]
        produce(lake, cfg, "R", [("a", "r1", T0 + 1)])
        assert _wait(lambda: result_rows(lake, "t_left") == [("a", "a1", "r1")], 60, proc)
        out, _ = _terminate(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "join t_left: stopped on request after" in out
    assert not lake.layout.job_entry("t_left").exists()
    assert not next(r for r in status(lake, cfg) if r["join"] == "t_left")["running"]


@pytest.mark.bench
def test_sigkill_at_random_moments_then_restart_gives_the_oracle_and_no_duplicates(spark, setup):
    """Fault injection: the job runs as its own process and is killed with SIGKILL while new records
    keep arriving; each time it is restarted. The result must equal the batch join, the change feed
    and the published changelog must hold no repeated row. A storm for `make bench`
    (LAKE_FAULT_KILLS=20); CI kills at every commit point instead (the next test)."""
    cfg, lake, opts = setup
    kills = int(os.environ.get("LAKE_FAULT_KILLS", "2"))
    rng = random.Random(int(os.environ.get("LAKE_FAULT_SEED", "7")))
    produce(lake, cfg, "L", [(f"k{i}", "v0", T0) for i in range(20)])
    ts = T0
    proc = None
    try:
        for _ in range(kills):
            proc = _start(opts)
            start_batch = _heartbeat(lake)
            ts += 1
            produce(lake, cfg, "R", [(f"k{rng.randrange(20)}", "v0", ts)])  # work for the restarted job
            assert _wait(lambda before=start_batch: _heartbeat(lake) not in (None, before), 180, proc)
            deadline = time.monotonic() + rng.uniform(0.2, 3.0)
            while time.monotonic() < deadline:  # keep records coming while the job works
                ts += 1
                topic = rng.choice(["L", "R"])
                key = f"k{rng.randrange(20)}"
                value = rng.choice(["v1", "v2", "v3", None])
                produce(lake, cfg, topic, [(key, value, ts)])
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
    run_join(spark, lake, cfg, "t_left", once=True)  # drain what arrived after the last kill
    want = model_table(topic_history(lake, "L"), topic_history(lake, "R"), "left")
    assert result_rows(lake, "t_left") == want
    no_noop_changes(lake, "t_left")
    # the published changelog replays to the same table, without a repeated record per key (a record
    # of the same value with a later time is a new answer: a right tombstone of a key the right side
    # never had moves the row's time)
    last: dict = {}
    records = changelog(lake, cfg, "t_left_changelog")
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        said = (r["value"], r["timestamp"])
        assert last.get(r["key"], "none") != said, f"repeated changelog record for {r['key']!r}"
        last[r["key"]] = said
    published = {k: json.loads(v) for k, (v, _) in last.items() if v is not None}
    assert sorted((k.decode(), v["lv"], v["rv"]) for k, v in published.items()) == want


JVM_KAFKA = Path(__file__).resolve().parents[1] / ".jvm" / "kafka"


def described_group(group: str) -> dict[tuple[str, int], tuple[int, int, int]]:
    """``kafka-consumer-groups --describe --group G`` (Kafka's own tool, from the locked jars):
    (topic, partition) -> (current offset, log end offset, lag)."""
    proc = subprocess.run(
        ["java", "-cp", f"{JVM_KAFKA}/*", "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"]
        + ["--bootstrap-server", os.environ["LAKE_KAFKA_BOOTSTRAP"], "--describe", "--group", group],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {}
    for line in proc.stdout.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[0] == group and cells[2].isdigit():
            rows[(cells[1], int(cells[2]))] = (int(cells[3]), int(cells[4]), int(cells[5]))
    return rows


def checkpoint_group(lake, cfg, name: str) -> dict[tuple[str, int], int]:
    """The join's checkpoint position as (Kafka topic, partition) -> offset."""
    from spark_jobs import checkpoints
    from spark_jobs.joins.runner import checkpoint_dir

    positions = checkpoints.committed_positions(checkpoint_dir(lake, cfg.join(name))) or {}
    return {(t, p): o for t, by in positions.items() for p, o in by.items()}


def test_kafka_tools_see_a_join_as_its_consumer_group_with_its_lag(spark, setup, capsys):
    """kafka-consumer-groups --describe shows the join's group lake.<pipeline>.<join> at the offsets
    its checkpoint finished, with the lag of what arrived since, and caught up after the next run."""
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("a", "a1", T0), ("b", "b1", T0), ("c", "c1", T0)])
    produce(lake, cfg, "R", [("a", "r1", T0)])
    assert main(["run", "t_left", "--once", *opts]) == 0
    cluster = connect(cfg, lake.root)
    group = cluster.group("lake.joins-test.t_left")
    ends = {
        (cluster.topic(t), p): high
        for t in ("L", "R")
        for p, (_, high) in enumerate(watermarks(cluster, cfg.topic(t)))
    }
    assert checkpoint_group(lake, cfg, "t_left") == ends
    assert described_group(group) == {tp: (end, end, 0) for tp, end in ends.items()}

    produce(lake, cfg, "L", [("d", "d1", T0 + 1)])  # one record and its transaction's commit marker
    lagging = {tp: lag for tp, (_, _, lag) in described_group(group).items() if lag}
    assert list(lagging.values()) == [2] and next(iter(lagging))[0] == cluster.topic("L")

    assert main(["run", "t_left", "--once", *opts]) == 0
    caught_up = described_group(group)
    assert all(lag == 0 for _, _, lag in caught_up.values())
    assert {tp: current for tp, (current, _, _) in caught_up.items()} == checkpoint_group(lake, cfg, "t_left")
    capsys.readouterr()


@pytest.mark.slow
def test_kill_9_at_every_commit_point_loses_and_doubles_nothing(spark, setup):
    """A continuous job killed with SIGKILL right after each commit point of a micro-batch in turn:
    Spark wrote the batch's offsets, its changelog transaction committed, its rows were parked for
    the table, a catch-up's MERGE went in, the result's commit went in. Each next run resumes. The
    result table, its change feed and the changelog topic (read_committed) then hold exactly the
    batch join of everything produced, and nothing twice."""
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [(f"k{i}", "v0", T0) for i in range(6)])
    produce(lake, cfg, "R", [(f"k{i}", "r0", T0) for i in range(0, 6, 2)])
    run_join(spark, lake, cfg, "t_left", once=True)  # the first load: the table is not empty now
    rounds = [("batch", ["--table-every", "1"]), ("publish", ["--table-every", "1"])]
    rounds += [("park", ["--table-every", "1"]), ("fold", ["--table-every", "1"]), ("write", [])]
    for n, (point, extra) in enumerate(rounds, 1):
        produce(lake, cfg, "L", [(f"k{n}", f"v{n}", T0 + n), (f"n{n}", "new", T0 + n)])
        produce(lake, cfg, "R", [(f"k{n + 1}", f"r{n}", T0 + n), (f"k{n - 1}", None, T0 + n)])
        proc = _start(opts, *extra, LAKE_KILL_AT=point)
        try:
            assert proc.wait(timeout=240) == -signal.SIGKILL, f"{point}: {proc.stderr.read()[-2000:]}"
        finally:
            if proc.poll() is None:
                proc.kill()
    run_join(spark, lake, cfg, "t_left", once=True)  # resumes after the last kill
    # Kafka's tools see the position the checkpoint holds, whatever commit point the kills hit
    group = connect(cfg, lake.root).group("lake.joins-test.t_left")
    described = {tp: current for tp, (current, _, _) in described_group(group).items()}
    assert described == checkpoint_group(lake, cfg, "t_left")
    want = model_table(topic_history(lake, "L"), topic_history(lake, "R"), "left")
    assert result_rows(lake, "t_left") == want
    assert lake.read_arrow("t_left__parked").num_rows == 0
    no_noop_changes(lake, "t_left")
    # the changelog replays to the same table, and no batch's records went out twice
    records = sorted(changelog(lake, cfg, "t_left_changelog"), key=lambda r: (r["partition"], r["offset"]))
    last: dict = {}
    for r in records:
        last[r["key"]] = r["value"]
    published = {k: json.loads(v) for k, v in last.items() if v is not None}
    assert sorted((k.decode(), v["lv"], v["rv"]) for k, v in published.items()) == want
    for partition in {r["partition"] for r in records}:  # one transaction per batch: one run of its tag
        tags = [r["batch"] for r in records if r["partition"] == partition]
        runs = [b for i, b in enumerate(tags) if i == 0 or b != tags[i - 1]]
        assert len(runs) == len(set(runs)), f"a batch's changelog records went out twice: {tags}"


@pytest.mark.slow
def test_kill_9_in_the_middle_of_a_first_loads_publish_publishes_every_result_once(spark, setup):
    """The executors publish the changelog, one Kafka transaction per partition. A first load killed
    (SIGKILL, its Spark and its driver) while a partition's transaction is open with a record on the
    broker, then killed again once partition 0's transaction committed and the other's perhaps not:
    the run after publishes every result exactly once. The committed partition is not sent again, the
    open transactions' records are never seen by a read_committed reader, and the result table equals
    the batch join."""
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [(f"k{i:03}", f"v{i}", T0) for i in range(300)])
    produce(lake, cfg, "R", [(f"k{i:03}", f"r{i}", T0) for i in range(0, 300, 3)])
    for point in ("publish-open", "publish-part"):
        proc = _start(opts, LAKE_KILL_AT=point)
        try:
            assert proc.wait(timeout=240) == -signal.SIGKILL, f"{point}: {proc.stderr.read()[-2000:]}"
        finally:
            if proc.poll() is None:
                proc.kill()
        if point == "publish-open":
            assert changelog(lake, cfg, "t_left_changelog") == []  # nothing committed
    after_kill = changelog(lake, cfg, "t_left_changelog")
    committed = [r for r in after_kill if r["partition"] == 0]
    assert committed and {r["batch"] for r in committed} == {committed[0]["batch"]}
    assert [r for r in after_kill if r["partition"] != 0] == []  # partition 1's was open at the kill
    run_join(spark, lake, cfg, "t_left", once=True)  # replays the first load's batch
    want = model_table(topic_history(lake, "L"), topic_history(lake, "R"), "left")
    assert len(want) == 300
    assert result_rows(lake, "t_left") == want
    records = changelog(lake, cfg, "t_left_changelog")
    assert [r for r in records if r["partition"] == 0] == committed  # not sent again
    assert sorted(r["key"] for r in records) == [f"k{i:03}".encode() for i in range(300)]  # each once
    published = sorted((r["key"].decode(), *json.loads(r["value"]).values()) for r in records)
    assert published == want


def test_a_publishing_producer_fenced_by_another_executor_is_replaced_not_reused(spark, setup):
    """The executors keep a changelog producer per partition between batches. When a partition's
    task ran on another executor in between, that executor's producer fenced the kept one (here a
    producer with the same transactional id does it, as the other executor's would): the next batch
    closes the fenced producer and opens a new one instead of failing its task, and every result is
    published once."""
    from confluent_kafka import Producer

    from spark_jobs.seams.kafka import producer_id

    cfg, lake, _ = setup
    feeder = Feeder(spark, lake, cfg, "t_left")
    produce(lake, cfg, "L", [(f"k{i}", f"a{i}", T0) for i in range(8)])
    feeder.feed()
    for batch in range(1, 4):
        for partition in range(cfg.topic("t_left_changelog").partitions):  # another executor's task
            other = Producer(
                {
                    "bootstrap.servers": os.environ["LAKE_KAFKA_BOOTSTRAP"],
                    "transactional.id": f"{producer_id(lake.root, 'join', 't_left')}-{partition}",
                }
            )
            other.init_transactions(30)  # fences the producer this JVM keeps for the partition
            del other
        produce(lake, cfg, "R", [(f"k{i}", f"r{batch}", T0 + batch) for i in range(8)])
        feeder.feed()  # a failed task fails the batch here (a local Spark tries a task once)
    want = [(f"k{i}", f"a{i}", "r3") for i in range(8)]
    assert result_rows(lake, "t_left") == want
    records = changelog(lake, cfg, "t_left_changelog")
    batches = sorted({r["batch"] for r in records})
    assert len(batches) == 4
    for tag in batches:  # each batch's records once: every key once per batch
        assert sorted(r["key"] for r in records if r["batch"] == tag) == [f"k{i}".encode() for i in range(8)]
    last = {r["key"]: json.loads(r["value"]) for r in sorted(records, key=lambda r: r["offset"])}
    assert sorted((k.decode(), v["lv"], v["rv"]) for k, v in last.items()) == want


def test_a_replaced_topic_asks_for_reset_and_reset_rebuilds(spark, setup, capsys):
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [(f"k{i}", "x", T0) for i in range(8)])
    assert main(["run", "t_inner", "--once", *opts]) == 0
    # what `lake topic repartition` does to a topic: deleted, created again, its records renumbered
    cluster = connect(cfg, lake.root)
    delete_topics(cluster, [cluster.topic("L")])
    forget_producers()
    produce(lake, cfg, "L", [(f"k{i}", "x", T0) for i in range(8)])
    assert main(["run", "t_inner", "--once", *opts]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"lake: error: join t_inner: topic {cluster.topic('L')} was replaced since the join last read it "
        "(a new Kafka topic id: 'lake topic repartition', or deleted and created again), so its "
        "checkpoint's offsets point into a topic that is gone; rerun with --reset"
    )
    produce(lake, cfg, "R", [("k1", "r", T0 + 1)])
    assert main(["run", "t_inner", "--once", "--reset", *opts]) == 0
    assert result_rows(lake, "t_inner") == [("k1", "x", "r")]


def test_a_table_join_checkpoint_from_before_the_state_store_asks_for_reset(spark, setup, capsys):
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("k1", "x", T0)])
    produce(lake, cfg, "R", [("k1", "r", T0)])
    # what an earlier version left: committed batches, the state in <join>__left / __right tables
    checkpoint = lake.layout.join_checkpoint("t_inner")
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1\n{}\n")
    lake.create("t_inner__left", pa.schema([("key", pa.binary())]))
    assert main(["run", "t_inner", "--once", *opts]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"lake: error: join t_inner: its checkpoint {checkpoint} is from an older version of the product "
        "(its state was in Delta tables, now it is in Spark's state store); rerun with --reset"
    )
    assert main(["run", "t_inner", "--once", "--reset", *opts]) == 0
    assert "t_inner__left" not in lake.tables()
    assert result_rows(lake, "t_inner") == [("k1", "x", "r")]


@pytest.mark.slow
def test_start_is_idempotent_and_stop_ends_the_detached_job(spark, setup, capsys):
    """lake start runs the join and the pipeline's ingest detached; each serves Prometheus metrics at
    the metrics_url lake status --json gives, whose counters follow the records: read per side, result
    changes, changelog records, a dropped record by reason (the one the quarantine holds), lag 0 once
    caught up, the records mirrored per topic."""
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("a", "a1", T0)])
    try:
        assert main(["start", "t_left", "--trigger", "0.5", *opts]) == 0
        started = capsys.readouterr().out
        # the pipeline's bronze mirror starts beside the join (the join itself reads Kafka)
        assert "the continuous ingest of joins-test: started (pid " in started
        assert "join t_left: started (pid " in started
        pid = int(started.split("join t_left: started (pid ")[1].split(")")[0])
        assert main(["start", "t_left", *opts]) == 0
        assert capsys.readouterr().out.endswith(
            f"join t_left: already running (pid {pid}); log: {lake.layout.job_log('t_left')}\n"
        )
        assert _wait(
            lambda: lake.exists("t_left") and result_rows(lake, "t_left") == [("a", "a1", None)], 120
        )
        # a record produced to Kafka reaches the running join; a record that is not JSON is dropped
        update = _lines(lake.layout.work / "r.txt", 'a;{"v": "r1"}')
        assert main(["produce", "R", "-K", ";", str(update), *opts]) == 0  # kcat's order of arguments
        produce(lake, cfg, "L", [("z", b"not json", T0 + 1)])
        assert _wait(lambda: result_rows(lake, "t_left") == [("a", "a1", "r1")], 120)
        assert next(r for r in status(lake, cfg) if r["join"] == "t_left")["pid"] == pid

        assert main(["status", "--json", *opts]) == 0
        ingest, *joins = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        row = next(r for r in joins if r["join"] == "t_left")
        assert row["consumer_group"] == connect(cfg, lake.root).group("lake.joins-test.t_left")
        assert row["metrics_url"].startswith("http://127.0.0.1:")
        assert ingest["metrics_url"].startswith("http://127.0.0.1:")
        m = {"pipeline": "joins-test", "join": "t_left"}
        assert _wait(
            lambda: (
                _sample(row["metrics_url"], "lake_join_dropped_records_total", **m, reason="undecodable") == 1
            ),
            60,
        )
        assert _wait(lambda: _sample(row["metrics_url"], "lake_join_lag_records", **m) == 0, 60)
        samples = _scrape(row["metrics_url"])
        assert _pick(samples, "lake_join_input_records_total", **m, side="left", topic="L") == 2
        assert _pick(samples, "lake_join_input_records_total", **m, side="right", topic="R") == 1
        assert _pick(samples, "lake_join_result_changes_total", **m, change="upserted") == 2
        assert _pick(samples, "lake_join_result_changes_total", **m, change="deleted") == 0
        # a's row answered twice: without its right record, then with it
        assert _pick(samples, "lake_join_result_rows_total", **m, outcome="unmatched") == 1
        assert _pick(samples, "lake_join_result_rows_total", **m, outcome="matched") == 1
        assert _pick(samples, "lake_join_changelog_records_total", **m, topic="t_left_changelog") == 2
        assert {
            dict(labels)["reason"]: value
            for (name, labels), value in samples.items()
            if name == "lake_join_dropped_records_total"
        } == {
            "undecodable": 1,
            "null_key": 0,
            "null_foreign_key": 0,
            "null_derived_key": 0,
            "no_list": 0,
            "null_value": 0,
            "poison": 0,
        }
        assert _pick(samples, "lake_join_batch_duration_seconds_count", **m) >= 2
        assert _pick(samples, "lake_join_lag_seconds", **m) == 0
        lag = [dict(labels) for name, labels in samples if name == "lake_join_lag_seconds"]
        assert sorted((g["topic"], g["partition"]) for g in lag) == [
            ("L", "0"),
            ("L", "1"),
            ("R", "0"),
            ("R", "1"),
        ]
        # the quarantine holds the dropped record, with the same reason
        quarantined = [q for q in lake.read_arrow("quarantine").to_pylist() if q["job"] == "join:t_left"]
        assert [(q["source"].split("[")[0], q["reason"]) for q in quarantined] == [
            ("L", "value is not a JSON object (key 'z')")
        ]
        assert dropped.reason_of(quarantined[0]["reason"]) == quarantined[0]["cause"] == "undecodable"
        # lake status and lake quarantine say the same: one record, undecodable (status asked again:
        # the record may have come in a batch after the first answer)
        assert main(["status", "--json", *opts]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert next(r for r in rows[1:] if r["join"] == "t_left")["dropped"] == {"undecodable": 1}
        assert main(["quarantine", *opts]) == 0
        said = capsys.readouterr().out.splitlines()
        version = lake.version("quarantine")
        assert said[0].startswith(f"quarantine of pipeline joins-test (table version {version}, as of 20")
        assert said[0].endswith("): 1 record(s)") and said[1] == "  join:t_left: undecodable 1"
        offset = quarantined[0]["line"]
        assert said[2].endswith(
            f" join:t_left {quarantined[0]['source']} offset {offset} [undecodable]: "
            "value is not a JSON object (key 'z')"
        )
        assert len(said) == 3
        # the ingest mirrors every record of both topics
        url = ingest["metrics_url"]
        assert _wait(
            lambda: _sample(url, "lake_ingest_records_total", pipeline="joins-test", topic="L") == 2, 180
        )
        assert _sample(url, "lake_ingest_records_total", pipeline="joins-test", topic="R") == 1
    finally:
        assert main(["stop", "t_left", *opts]) == 0
        assert main(["ingest", "--stop", *opts]) == 0
    stopped = capsys.readouterr().out
    assert f"join t_left: stopped (pid {pid})" in stopped
    assert "the continuous ingest of joins-test: stopped (pid " in stopped
    assert main(["stop", "t_left", *opts]) == 0
    assert main(["ingest", "--stop", *opts]) == 0
    assert capsys.readouterr().out == (
        "join t_left: was not running\nthe continuous ingest of joins-test: was not running\n"
    )
    log = lake.layout.job_log("t_left").read_text()
    assert "join t_left: stopped on request after" in log


def _scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """A Prometheus scrape of ``url``: (sample name, its labels) -> value."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _pick(samples: dict, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(value for (n, have), value in samples.items() if n == name and wanted <= have)


def _sample(url: str, name: str, **labels: str) -> float:
    return _pick(_scrape(url), name, **labels)


def _lines(path, *lines: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("name", ["fk_left", "list_left", "derive"])
def test_fk_list_and_derive_restart_mid_stream_exactly_once(spark, tmp_path, name, capsys):
    cfg = write_config(tmp_path, KEYED_PIPELINE)
    lake = Lake(tmp_path / "lake")
    opts = ["--root", str(tmp_path / "lake"), "--config", cfg.source]

    def commit(i):
        produce(lake, cfg, "M", [(f"m{i % 2}", jv(v=f"name{i}", n=i), T0 + i)])
        produce(lake, cfg, "P", [(f"p{i}", jv(v=f"item{i}", m=f"m{i % 2}"), T0 + i)])
        produce(lake, cfg, "A", [(f"a{i}", jv(v=f"city{i}"), T0 + i)])
        produce(lake, cfg, "PE", [("ann", jv(v="Ann", ids=[f"a{j}" for j in range(i + 1)]), T0 + i)])

    commit(0)
    assert run_join(spark, lake, cfg, name, once=True).batches == 1  # the snapshot
    for i in range(1, 4):  # three more transactions per topic, read a few offsets per micro-batch
        commit(i)
    stop = threading.Event()

    def log(line):
        if " batch " in line:
            stop.set()

    first = run_join(spark, lake, cfg, name, once=True, max_records=3, log=log, stop=stop)
    assert first.stopped_by_signal and first.batches == 1
    rest = run_join(spark, lake, cfg, name, once=True, max_records=3)
    assert rest.batches >= 1 and first.input_rows + rest.input_rows == (3 if name == "derive" else 6)
    if name == "fk_left":
        want = model_fk(topic_history(lake, "P"), topic_history(lake, "M"), "left")
        assert (
            fk_rows(lake, name)
            == want
            == [
                ("p0", "item0", "name2"),
                ("p1", "item1", "name3"),
                ("p2", "item2", "name2"),
                ("p3", "item3", "name3"),
            ]
        )
    elif name == "list_left":
        want = model_list(topic_history(lake, "PE"), topic_history(lake, "A"), "left")
        assert (
            list_rows(lake, name) == want == [("ann", "Ann", [(f"a{j}", True, f"city{j}") for j in range(4)])]
        )
    else:
        assert (
            derive_rows(lake)
            == model_derive(topic_history(lake, "M"))
            == [
                ("name2", "m0", 2),
                ("name3", "m1", 3),
            ]
        )
    no_noop_changes(lake, name)
    assert main(["audit", name, *opts]) == 0
    assert "identical" in capsys.readouterr().out
    assert main(["status", *opts]) == 0


def _published(lake, cfg) -> dict:
    """The changelog's last value per key (None: a tombstone)."""
    last: dict = {}
    try:
        records = changelog(lake, cfg, "t_left_changelog")
    except UserError:  # the job creates the topic with its first batch
        return last
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        last[r["key"].decode()] = json.loads(r["value"]) if r["value"] is not None else None
    return last


@pytest.mark.slow
def test_table_every_publishes_first_writes_the_table_behind_and_loses_nothing_on_a_kill(
    spark, setup, capsys
):
    """--table-every: each micro-batch publishes and parks its rows in t_left__parked; the result table
    catches up at most every SECONDS and when the job stops. A job killed with rows parked leaves them
    for the next run, which folds them in before its own writes."""
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("a", "a1", T0)])
    proc = _start(opts, "--table-every", "600")
    try:
        assert _wait(lambda: _published(lake, cfg) == {"a": {"lv": "a1", "rv": None}}, 120, proc)
        produce(lake, cfg, "R", [("a", "r1", T0 + 1)])
        produce(lake, cfg, "L", [("b", "b1", T0 + 1)])
        want = {"a": {"lv": "a1", "rv": "r1"}, "b": {"lv": "b1", "rv": None}}
        assert _wait(lambda: _published(lake, cfg) == want, 60, proc)
        # parked after the publish: a and b; the first load went straight into the empty table, and
        # the rest waits for a catch-up 600 s away
        assert _wait(
            lambda: lake.exists("t_left__parked") and lake.read_arrow("t_left__parked").num_rows == 2,
            30,
            proc,
        )
        assert result_rows(lake, "t_left") == [("a", "a1", None)]
        # lake status says how far the table is behind its changelog topic
        assert _wait(
            lambda: next(r for r in status(lake, cfg) if r["join"] == "t_left")["table_behind"] == 2, 30
        )
        # a reader of the current view sees the parked rows before the table has them
        query = "SELECT key, lv, rv FROM lake.t_left__current ORDER BY key"
        shown = subprocess.run([LAKE, "sql", query, *opts], capture_output=True, text=True, timeout=300)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines() == ["key\tlv\trv", "a\ta1\tr1", "b\tb1\t"]
        # and so does a reader of lake show, without the catalog; the view has no change feed
        capsys.readouterr()
        assert main(["show", "t_left__current", "--json", *opts]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(r["key"], r["lv"], r["rv"]) for r in rows] == [("a", "a1", "r1"), ("b", "b1", None)]
        assert main(["show", "t_left__current", "--changes", *opts]) == 2
        assert capsys.readouterr().err.strip() == (
            "lake: error: 't_left__current' is a view (the join's result with its pending rows): it has no "
            "change feed; its tables have one: lake show t_left --changes, lake show t_left__parked --changes"
        )
        _, err = _terminate(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "join t_left: result table caught up with 2 pending row(s)" in err
    assert result_rows(lake, "t_left") == [("a", "a1", "r1"), ("b", "b1", None)]
    assert pending(lake, "t_left").count() == 0  # kept for the current view's readers until the next fold
    assert next(r for r in status(lake, cfg) if r["join"] == "t_left")["table_behind"] == 0

    proc = _start(opts, "--table-every", "600")
    try:
        produce(lake, cfg, "L", [("a", None, T0 + 2)])  # a deleted: parked, then the job is killed
        assert _wait(lambda: _published(lake, cfg).get("a", "?") is None, 120, proc)
        assert _wait(lambda: pending(lake, "t_left").count() == 1, 30, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert result_rows(lake, "t_left") == [("a", "a1", "r1"), ("b", "b1", None)]  # a is still parked
    produce(lake, cfg, "R", [("b", "r2", T0 + 3)])
    run_join(spark, lake, cfg, "t_left", once=True)  # writes the table itself, after the parked rows
    want = model_table(topic_history(lake, "L"), topic_history(lake, "R"), "left")
    assert result_rows(lake, "t_left") == want == [("b", "b1", "r2")]
    assert _published(lake, cfg) == {"a": None, "b": {"lv": "b1", "rv": "r2"}}
    assert lake.read_arrow("t_left__parked").num_rows == 0
    no_noop_changes(lake, "t_left")


def test_table_every_is_for_keyed_continuous_runs(spark, setup, capsys):
    _, _, opts = setup
    assert main(["run", "st_left", "--continuous", "--table-every", "5", *opts]) == 2
    assert (
        "join st_left: --table-every applies to the keyed kinds (table, fk, list, derive), not to "
        "stream-table" in capsys.readouterr().err
    )
    assert main(["run", "t_left", "--once", "--table-every", "5", *opts]) == 2
    assert "join t_left: --table-every applies to --continuous runs" in capsys.readouterr().err
    assert main(["start", "ss_left", "--table-every", "5", *opts]) == 2  # before anything starts
    assert "join ss_left: --table-every applies to the keyed kinds" in capsys.readouterr().err
    assert main(["run", "t_left", "--continuous", "--table-every", "-1", *opts]) == 2
    assert "--table-every must be a positive number of seconds" in capsys.readouterr().err


def test_table_every_tombstones_a_key_whose_row_is_only_parked(spark, tmp_path):
    """An inner join loses rows without a left delete: it publishes a tombstone for each key the table
    holds (a) and for each key only parked rows hold (b), none for a key never joined (c); the
    catch-up then leaves the table as the changelog says."""
    text = PIPELINE.replace("t_inner: {kind: table,", "t_inner: {publish: true, kind: table,")
    cfg = write_config(tmp_path, text)
    lake = Lake(tmp_path / "lake")
    f = Feeder(spark, lake, cfg, "t_inner")
    f.job.table_every = 600.0  # every catch-up is by hand below
    produce(lake, cfg, "L", [("a", "a1", T0)])
    produce(lake, cfg, "R", [("a", "r1", T0)])
    f.feed()  # the first load: straight into the empty table
    produce(lake, cfg, "L", [("b", "b1", T0 + 1), ("d", "d1", T0 + 1)])
    produce(lake, cfg, "R", [("b", "r1", T0 + 1), ("d", "r1", T0 + 1)])
    f.feed()  # parked
    assert result_rows(lake, "t_inner") == [("a", "a1", "r1")]
    produce(lake, cfg, "R", [("a", None, T0 + 2), ("b", None, T0 + 2)])
    produce(lake, cfg, "L", [("c", "c1", T0 + 2)])
    f.feed()
    records = [
        (r["key"].decode(), json.loads(r["value"]) if r["value"] is not None else None)
        for r in changelog(lake, cfg, "t_inner_changelog")
    ]
    published = sorted(records, key=lambda r: (r[0], r[1] is not None))
    assert published == [
        ("a", None),
        ("a", {"lv": "a1", "rv": "r1"}),
        ("b", None),
        ("b", {"lv": "b1", "rv": "r1"}),
        ("d", {"lv": "d1", "rv": "r1"}),
    ]
    f.job.fold()
    assert result_rows(lake, "t_inner") == [("d", "d1", "r1")]
    assert pending(lake, "t_inner").count() == 0


def _current(spark, lake, join: str, result_version: int | None = None) -> list[tuple]:
    """The join's current view as its SQL reads it over the lake's tables (the result as of
    ``result_version``: a reader whose snapshot of it is that old)."""
    at = "" if result_version is None else f" VERSION AS OF {result_version}"
    sql = current_view(
        f"delta.`{lake.uri(join)}`{at}", f"delta.`{lake.uri(join + '__parked')}`", lake.schema(join).names
    )
    rows = spark.sql(sql).collect()
    return sorted(((r["key"].decode(), r["lv"], r["rv"]) for r in rows), key=lambda t: (t[0], t[2] or ""))


def test_the_current_view_shows_parked_rows_before_their_fold_and_after_it_at_any_snapshot(spark, tmp_path):
    """With --table-every, a micro-batch's rows are in the current view (result + newest pending rows)
    before the result table has them; a fold keeps the rows it folded until the next fold, so a reader
    whose snapshot of the result predates the fold still sees them, also when the job died between
    the fold's MERGE and its cleanup; a run that writes the result itself empties the pending rows."""
    cfg = write_config(tmp_path)
    lake = Lake(tmp_path / "lake")
    f = Feeder(spark, lake, cfg, "t_left")
    f.job.table_every = 600.0  # every catch-up is by hand below
    produce(lake, cfg, "L", [("a", "a1", T0), ("b", "b1", T0)])
    f.feed()  # the first load: straight into the empty table
    produce(lake, cfg, "R", [("a", "r1", T0 + 1)])
    produce(lake, cfg, "L", [("b", None, T0 + 1), ("c", "c1", T0 + 1)])
    f.feed()  # parked: a updated, b deleted, c new
    first = [("a", "a1", None), ("b", "b1", None)]
    second = [("a", "a1", "r1"), ("c", "c1", None)]
    assert result_rows(lake, "t_left") == first
    assert _current(spark, lake, "t_left") == second
    assert pending(lake, "t_left").count() == 3
    before_fold = lake.version("t_left")
    f.job.fold()
    assert result_rows(lake, "t_left") == second == _current(spark, lake, "t_left")
    # the fold kept its rows: a reader with the result as it was before the fold still sees them
    assert _current(spark, lake, "t_left", before_fold) == second
    assert pending(lake, "t_left").count() == 0 and f.job.behind.parked == 0
    assert lake.read_arrow("t_left__parked").num_rows == 3

    produce(lake, cfg, "L", [("d", "d1", T0 + 2)])
    f.feed()  # parked; then a fold whose cleanup never ran (the job died after its MERGE)
    before_fold = lake.version("t_left")
    f.job.behind._merge(f.job.query_id, lake.txn_version("t_left", f.job.query_id), False)
    third = [*second, ("d", "d1", None)]
    assert result_rows(lake, "t_left") == third
    assert _current(spark, lake, "t_left") == third == _current(spark, lake, "t_left", before_fold)
    # the next run's view of the pending rows: nothing waiting, the died fold's rows held
    f.job.behind = TableBehind(lake, "t_left", f.job.result_schema, f.job.log)
    assert (f.job.behind.parked, f.job.behind.waiting, f.job.behind.held) == (0, False, True)
    produce(lake, cfg, "R", [("c", "r2", T0 + 3)])
    f.feed()
    f.job.fold()  # deletes the rows of the fold before it (the died one), keeps its own
    fourth = [("a", "a1", "r1"), ("c", "c1", "r2"), ("d", "d1", None)]
    assert result_rows(lake, "t_left") == fourth == _current(spark, lake, "t_left")
    assert [r["key"] for r in lake.read_arrow("t_left__parked").to_pylist()] == [b"c"]

    # a run without --table-every writes the result itself: nothing stays pending to shadow it
    produce(lake, cfg, "L", [("c", "c2", T0 + 4)])
    run_join(spark, lake, cfg, "t_left", once=True)
    fifth = [("a", "a1", "r1"), ("c", "c2", "r2"), ("d", "d1", None)]
    assert result_rows(lake, "t_left") == fifth == _current(spark, lake, "t_left")
    assert lake.read_arrow("t_left__parked").num_rows == 0


def test_records_gone_from_kafka_before_the_join_read_them_stop_it_in_one_line(spark, setup, capsys):
    """Retention deleted records the join never read: it stops, names them, and writes nothing."""
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("a", "a1", T0)])
    assert main(["run", "t_left", "--once", *opts]) == 0
    produce(lake, cfg, "L", [("b", "b1", T0 + 1), ("c", "c1", T0 + 1)])
    cluster = connect(cfg, lake.root)
    name = cluster.topic("L")
    ends = {p: high for p, (_, high) in enumerate(watermarks(cluster, cfg.topic("L")))}
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(name, p, end) for p, end in ends.items()]).values():
        future.result()  # what retention does: the partitions' records are gone up to their ends
    capsys.readouterr()
    version = lake.version("t_left")
    assert main(["run", "t_left", "--once", *opts]) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    assert line.startswith(
        "lake: error: join t_left: records it has not read are gone from Kafka (Could not read records in offset ["
    )
    assert f"for topic partition {name}-" in line and line.endswith(
        "deleted by retention, or the topic was deleted and created again; the join stopped rather than skip "
        "them: rerun with --reset to start over from what the topics hold now"
    )
    assert "Traceback" not in err and lake.version("t_left") == version


def test_a_partition_added_on_kafka_stops_the_join_in_one_line(spark, setup, capsys, tmp_path):
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("a", "a1", T0)])
    cluster = connect(cfg, lake.root)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for future in admin.create_partitions([NewPartitions(cluster.topic("L"), 3)]).values():
        future.result()
    assert main(["run", "t_left", "--once", *opts]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lake: error: topic {cluster.topic('L')} has 3 partitions on Kafka at {cluster.bootstrap_servers} but "
        "the pipeline declares 2 (topics.L.partitions); the product never changes a topic's partition count, "
        "since that moves keys to other partitions: declare 3, or repartition into a new topic"
    )
    # a running join meets the new partition in its next micro-batch's offsets: it stops before reading it
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    offsets = {cluster.topic("L"): {"0": 2, "1": 0, "2": 1}, cluster.topic("R"): {"0": 0, "1": 0}}
    (checkpoint / "offsets" / "4").write_text(f"v1\n{{}}\n{json.dumps(offsets)}\n")
    with pytest.raises(UserError) as error:
        _batch_offsets(checkpoint, cluster, cfg, cfg.join("t_left"), 4)
    assert str(error.value).startswith(
        f"join t_left: topic {cluster.topic('L')} has partition(s) 2 beyond the 2 the pipeline declares "
        "(topics.L.partitions): a partition was added on Kafka"
    )


@pytest.mark.slow
def test_a_topic_deleted_under_a_running_join_stops_it_in_one_line(spark, setup):
    cfg, lake, opts = setup
    produce(lake, cfg, "L", [("a", "a1", T0)])
    proc = _start(opts)
    try:
        assert _wait(lambda: _heartbeat(lake) is not None, 120, proc)
        cluster = connect(cfg, lake.root)
        delete_topics(cluster, [cluster.topic("R")])
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        f"lake: error: join t_left: topic {cluster.topic('R')} was deleted from Kafka while the join read it; "
        "it stopped. When the topic is back (a new topic: its offsets start over), rerun with --reset"
    )
