"""The one reader of Spark's checkpoint layout: committed batches and the Kafka offsets each read up to,
on checkpoint folders written in Spark's format (version line, metadata line, one line per source)."""

import json

import pytest

from spark_jobs import checkpoints


def write_batch(folder, batch, sources, committed=True):
    (folder / "offsets").mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1})]
    lines += ["-" if s is None else json.dumps(s) for s in sources]
    (folder / "offsets" / str(batch)).write_text("\n".join(lines) + "\n")
    if committed:
        (folder / "commits").mkdir(exist_ok=True)
        (folder / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_the_last_committed_batch_and_what_it_read(tmp_path):
    cp = tmp_path / "cp"
    (tmp_path / "cp").mkdir()
    (cp / "metadata").write_text('{"id":"4f1c2a9e-0000-4000-8000-000000000001"}\n')
    assert checkpoints.last_committed(cp) is None
    assert checkpoints.committed_positions(cp) is None
    write_batch(cp, 0, [{"orders": {"0": 3, "1": 5}}, None])
    write_batch(cp, 1, [{"orders": {"0": 7, "1": 5}}, {"customers": {"0": 2}}])
    write_batch(cp, 2, [{"orders": {"0": 9, "1": 6}}, {"customers": {"0": 4}}], committed=False)

    assert checkpoints.query_id(cp) == "4f1c2a9e-0000-4000-8000-000000000001"
    assert checkpoints.last_committed(cp) == 1  # batch 2 is planned, not committed
    assert checkpoints.committed_positions(cp) == {"orders": {0: 7, 1: 5}, "customers": {0: 2}}
    assert checkpoints.batch_positions(cp, 0) == {"orders": {0: 3, 1: 5}}  # a source not started: null
    assert checkpoints.batch_positions(cp, 2) == {"orders": {0: 9, 1: 6}, "customers": {0: 4}}
    assert checkpoints.source_offsets(cp, 7) == []  # no entry
    assert not checkpoints.has_delta_sources(cp)
    assert checkpoints.committed_positions(tmp_path / "none") is None


def test_a_checkpoint_that_read_delta_tables_is_told_apart(tmp_path):
    cp = tmp_path / "cp"
    write_batch(cp, 0, [{"sourceVersion": 1, "reservoirVersion": 4, "index": -1, "isStartingVersion": False}])
    assert checkpoints.has_delta_sources(cp)
    with pytest.raises(ValueError, match="not a Kafka source offset"):
        checkpoints.committed_positions(cp)
    with pytest.raises(ValueError, match="not a Kafka source offset"):
        checkpoints.kafka_positions([{"orders": 5}])


def test_state_and_a_forgotten_commit(tmp_path):
    cp = tmp_path / "cp"
    write_batch(cp, 0, [{"orders": {"0": 3}}])
    write_batch(cp, 1, [{"orders": {"0": 5}}])
    (cp / "commits" / ".1.crc").write_text("")
    assert not checkpoints.has_state(cp)
    (cp / "state" / "0").mkdir(parents=True)
    assert checkpoints.has_state(cp)
    checkpoints.forget_commit(cp, 1)
    assert checkpoints.last_committed(cp) == 0
    assert sorted(p.name for p in (cp / "commits").iterdir()) == ["0"]
