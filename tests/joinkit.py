"""Test helpers for joins: a pipeline with every kind and type, records with their own timestamps
produced to the session's Kafka broker, feeding exact micro-batches of them to the engine, and a small
independent model of each kind's semantics."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from spark_jobs.config import load_config
from spark_jobs.joins.oracle import audit
from spark_jobs.seams.kafka import TransactionalProducer, connect, ensure_topics, read
from spark_jobs.testing import JoinQuery

PIPELINE = """
pipeline: joins-test
topics:
  L: {partitions: 2}
  R: {partitions: 2}
  S: {partitions: 2, value: string}
joins:
  t_inner: {kind: table, left: L, right: R, type: inner, select: {lv: left.v, rv: right.v}}
  t_left: {kind: table, left: L, right: R, type: left, select: {lv: left.v, rv: right.v}, publish: true}
  t_outer: {kind: table, left: L, right: R, type: outer, select: {lv: left.v, rv: right.v}}
  t_string:
    kind: table
    left: L
    right: S
    select: {lv: left.v, rv: right.value, both: "concat(left.v, '/', right.value)"}
  st_inner: {kind: stream-table, left: L, right: R, type: inner, select: {lv: left.v, rv: right.v}}
  st_left: {kind: stream-table, left: L, right: R, type: left, select: {lv: left.v, rv: right.v}}
  ss_inner: {kind: stream-stream, left: L, right: R, type: inner, window: 10 seconds, select: {lv: left.v, rv: right.v}}
  ss_left: {kind: stream-stream, left: L, right: R, type: left, window: 10 seconds, select: {lv: left.v, rv: right.v}}
  ss_outer: {kind: stream-stream, left: L, right: R, type: outer, window: 10 seconds, select: {lv: left.v, rv: right.v}}
"""
SECOND = 1000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def write_config(folder: Path, text: str = PIPELINE):
    path = folder / "pipeline.yaml"
    path.write_text(text)
    return load_config(path)


def val(v: str | None) -> bytes | None:
    return None if v is None else json.dumps({"v": v}).encode()


_producers: dict[tuple[str, str], TransactionalProducer] = {}  # kept open: a transaction costs ~30 ms
_configs: dict[str, object] = {}  # lake root -> the pipeline its records were produced for


def produce(lake, config, topic: str, records: list[tuple]) -> None:
    """Produce (key, value, ts_ms) records in order to the topic on Kafka, in one transaction (as
    ``lake produce`` writes them, placed by the topic's partitioner). ``value`` None is a tombstone; a
    str is written as ``{"v": value}``, bytes as they are."""
    cluster = connect(config, lake.root)
    spec = config.topic(topic)
    _configs[str(lake.root)] = config
    writer = _producers.get((cluster.bootstrap_servers, cluster.topic(topic)))
    if writer is None:
        writer = TransactionalProducer(cluster, spec, None, f"joinkit-{uuid.uuid4().hex[:12]}")
        _producers[(cluster.bootstrap_servers, cluster.topic(topic))] = writer
    keys = pa.array([k.encode() if isinstance(k, str) else k for k, _, _ in records], pa.binary())
    values = pa.array([val(v) if isinstance(v, str) or v is None else v for _, v, _ in records], pa.binary())
    writer.produce([(keys, values, [int(ts) for _, _, ts in records], None)])


def forget_producers() -> None:
    """Open new producers next time (after a test deleted a topic their metadata still knows)."""
    _producers.clear()


RECORD_TYPES = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
    ]
)


def topic_records(lake, config, topic: str, after=None) -> pa.Table:
    """The topic's committed records on Kafka (after ``after``: the first offset per partition), in
    partition and offset order."""
    cluster = connect(config, lake.root)
    rows = {name: [] for name in RECORD_TYPES.names}
    for batch in read(cluster, config.topic(topic), after=after):
        for m in batch:
            rows["key"].append(m.key())
            rows["value"].append(m.value())
            rows["timestamp"].append(m.timestamp()[1] * 1000)
            rows["partition"].append(m.partition())
            rows["offset"].append(m.offset())
    return pa.table(
        {
            "key": pa.array(rows["key"], pa.binary()),
            "value": pa.array(rows["value"], pa.binary()),
            "timestamp": pa.array(rows["timestamp"], pa.int64()).cast(RECORD_TYPES.field("timestamp").type),
            "partition": pa.array(rows["partition"], pa.int32()),
            "offset": pa.array(rows["offset"], pa.int64()),
        }
    )


def assert_oracle(spark, lake, config, name: str) -> None:
    """The join's result equals the oracle's batch join of its topics."""
    report = audit(spark, lake, config, name)
    assert report.clean, report.text()


def result_changes(lake, name: str) -> list[tuple]:
    """A table join's change feed: (change type, key, lv, rv) in commit order."""
    feed = lake.changes_arrow(name).to_pylist()
    return [(c["_change_type"], c["key"].decode(), c["lv"], c["rv"]) for c in feed]


class Feeder:
    """Hands the records a join has not seen yet to its streaming query (``spark_jobs.testing``'s
    ``JoinQuery``: the join's plan and ``foreachBatch`` as ``lake run`` runs them) as one micro-batch."""

    def __init__(self, spark, lake, config, name: str, query_id: str = "test-query"):
        self.spark, self.lake, self.config = spark, lake, config
        _configs[str(lake.root)] = config
        self.spec = config.join(name)
        # as lake run does: a join may start before its topics exist
        ensure_topics(connect(config, lake.root), [config.topic(t) for _, t in self.spec.sides])
        self.query = JoinQuery(spark, lake, config, name, query_id, self.ends)
        self.job = self.query.job
        self.seen: set[tuple[str, int, int]] = set()
        self._read: dict[str, pa.Table] = {}  # topic -> its records read from Kafka so far

    def records(self, topic: str) -> pa.Table:
        """Every record of the topic on Kafka (read incrementally)."""
        known = self._read.get(topic)
        spec = self.config.topic(topic)
        after = np.zeros(spec.partitions, dtype=np.int64)
        if known is not None and known.num_rows:
            for p, o in zip(known["partition"].to_pylist(), known["offset"].to_pylist(), strict=True):
                after[p] = max(after[p], o + 1)
        new = topic_records(self.lake, self.config, topic, after.tolist())
        self._read[topic] = new if known is None else pa.concat_tables([known, new])
        return self._read[topic]

    def ends(self, topic_spec) -> np.ndarray:
        """How far the topic's records go: the offset after each partition's last record."""
        rows = self.records(topic_spec.name)
        ends = np.zeros(topic_spec.partitions, dtype=np.int64)
        for p, o in zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True):
            ends[p] = max(ends[p], o + 1)
        return ends

    def pending_records(self) -> pa.Table:
        parts = []
        for side, topic in self.spec.sides:
            rows = self.records(topic).sort_by([("partition", "ascending"), ("offset", "ascending")])
            keep = [
                (side, p, o) not in self.seen
                for p, o in zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True)
            ]
            rows = rows.filter(pa.array(keep, pa.bool_()))
            parts.append(rows.add_column(0, "side", pa.array([side] * rows.num_rows, pa.string())))
        return pa.concat_tables(parts)

    def feed(self, rows: pa.Table | None = None):
        """Process ``rows`` (default: everything not fed yet) as the next micro-batch."""
        rows = self.pending_records() if rows is None else rows
        for side, p, o in zip(
            rows["side"].to_pylist(), rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True
        ):
            self.seen.add((side, p, o))
        return self.query.feed(rows)

    def restart(self):
        """Start the query again after a failed batch: Spark reruns that batch."""
        return self.query.restart()

    def replay_last(self):
        """Run the last committed batch again (a crash after its writes, before its commit entry)."""
        return self.query.replay_last()


def result_rows(lake, name: str, columns: tuple[str, ...] = ("key", "lv", "rv")) -> list[tuple]:
    table = lake.read_arrow(name).to_pylist()
    out = []
    for r in table:
        row = tuple(r[c].decode() if isinstance(r[c], bytes) else r[c] for c in columns)
        out.append(row)
    return sorted(out, key=lambda t: tuple((x is None, x) for x in t))


# --- an independent model of the semantics (plain Python over the full record history) ----------
def _v(value: bytes | None) -> str | None:
    return None if value is None else json.loads(value)["v"]


def model_table(left: list[dict], right: list[dict], how: str) -> list[tuple]:
    def latest(records):
        best: dict = {}
        for r in records:
            k = r["key"]
            if k not in best or (r["timestamp"], r["offset"]) > (best[k]["timestamp"], best[k]["offset"]):
                best[k] = r
        return {k: _v(r["value"]) for k, r in best.items() if r["value"] is not None}

    lhs, rhs = latest(left), latest(right)
    keys = set(lhs) | (set(rhs) if how == "outer" else set())
    rows = []
    for k in keys:
        if how == "inner" and k not in rhs:
            continue
        if k not in lhs and how != "outer":
            continue
        rows.append((k.decode(), lhs.get(k), rhs.get(k)))
    return sorted(rows, key=lambda t: tuple((x is None, x) for x in t))


def model_stream_table(left: list[dict], right: list[dict], how: str) -> list[tuple]:
    by_key = defaultdict(list)
    for r in right:
        by_key[r["key"]].append(r)
    rows = []
    for e in left:
        if e["value"] is None:
            continue
        older = [r for r in by_key[e["key"]] if r["timestamp"] <= e["timestamp"]]
        match = max(older, key=lambda r: (r["timestamp"], r["offset"])) if older else None
        rv = _v(match["value"]) if match is not None else None
        if how == "inner" and rv is None:
            continue
        rows.append((e["key"].decode(), _v(e["value"]), rv))
    return sorted(rows, key=lambda t: tuple((x is None, x) for x in t))


def model_stream_stream(left: list[dict], right: list[dict], how: str, window_ms: int) -> list[tuple]:
    lhs = [r for r in left if r["value"] is not None]
    rhs = [r for r in right if r["value"] is not None]
    window = window_ms * 1000
    stamps = [r["timestamp"] for r in left + right]
    watermark = max(stamps) if stamps else None
    rows, hit_l, hit_r = [], set(), set()
    for i, a in enumerate(lhs):
        for j, b in enumerate(rhs):
            if a["key"] == b["key"] and abs(_us(a["timestamp"]) - _us(b["timestamp"])) <= window:
                rows.append((a["key"].decode(), _v(a["value"]), _v(b["value"])))
                hit_l.add(i)
                hit_r.add(j)
    if watermark is not None:
        wm = _us(watermark)
        if how in ("left", "outer"):
            rows += [
                (a["key"].decode(), _v(a["value"]), None)
                for i, a in enumerate(lhs)
                if i not in hit_l and _us(a["timestamp"]) + window < wm
            ]
        if how == "outer":
            rows += [
                (b["key"].decode(), None, _v(b["value"]))
                for j, b in enumerate(rhs)
                if j not in hit_r and _us(b["timestamp"]) + window < wm
            ]
    return sorted(rows, key=lambda t: tuple((x is None, x) for x in t))


def _us(ts) -> int:
    return int(ts.timestamp() * 1_000_000)


def topic_history(lake, topic: str) -> list[dict]:
    """Every record of the topic on Kafka (key, value, timestamp, partition, offset)."""
    return topic_records(lake, _configs[str(lake.root)], topic).to_pylist()


# --- fk, list and derive -----------------------------------------------------------------------
KEYED_PIPELINE = """
pipeline: keyed-test
topics:
  P: {partitions: 3}
  M: {partitions: 2}
  PE: {partitions: 2}
  A: {partitions: 3}
joins:
  fk_inner: {kind: fk, left: P, right: M, foreign_key: m, type: inner, select: {lv: left.v, rv: right.v}}
  fk_left:
    kind: fk
    left: P
    right: M
    foreign_key: m
    type: left
    select: {lv: left.v, rv: right.v}
    publish: true
  list_left:
    kind: list
    left: PE
    right: A
    list: ids
    select: {lv: left.v}
    elements: {rv: right.v}
    as: items
  list_inner:
    kind: list
    left: PE
    right: A
    list: ids
    type: inner
    select: {lv: left.v}
    elements: {rv: right.v}
    as: items
  derive:
    kind: derive
    left: M
    key: v
    select: {id: "cast(master_key as string)", n: "cast(left.n as int)"}
"""


def jv(**fields) -> bytes:
    """A JSON value (None values are written as JSON null)."""
    return json.dumps(fields).encode()


def fk_rows(lake, name: str) -> list[tuple]:
    return result_rows(lake, name)


def list_rows(lake, name: str) -> list[tuple]:
    """(key, lv, [(id, matched, rv), ...]) per result row, by key."""
    out = []
    for r in lake.read_arrow(name).to_pylist():
        items = [(e["id"], e["matched"], e["rv"]) for e in r["items"]]
        out.append((r["key"].decode(), r["lv"], items))
    return sorted(out)


def derive_rows(lake, name: str = "derive") -> list[tuple]:
    rows = lake.read_arrow(name).to_pylist()
    return sorted((r["key"].decode(), r["id"], r["n"]) for r in rows)


def _latest_live(records: list[dict]) -> dict:
    best: dict = {}
    for r in records:
        k = r["key"]
        if k not in best or (r["timestamp"], r["offset"]) > (best[k]["timestamp"], best[k]["offset"]):
            best[k] = r
    return {k: r for k, r in best.items() if r["value"] is not None}


def model_fk(left: list[dict], right: list[dict], how: str) -> list[tuple]:
    rhs = {k: json.loads(r["value"])["v"] for k, r in _latest_live(right).items()}
    rows = []
    for k, r in _latest_live(left).items():
        value = json.loads(r["value"])
        fk = value.get("m")
        rv = rhs.get(str(fk).encode()) if fk is not None else None
        matched = fk is not None and str(fk).encode() in rhs
        if how == "inner" and not matched:
            continue
        rows.append((k.decode(), value["v"], rv))
    return sorted(rows, key=lambda t: tuple((x is None, x) for x in t))


def model_list(left: list[dict], right: list[dict], how: str) -> list[tuple]:
    rhs = {k.decode(): json.loads(r["value"])["v"] for k, r in _latest_live(right).items()}
    rows = []
    for k, r in _latest_live(left).items():
        value = json.loads(r["value"])
        items = [(i, i in rhs, rhs.get(i)) for i in value["ids"]]
        if how == "inner":
            items = [e for e in items if e[1]]
        rows.append((k.decode(), value["v"], items))
    return sorted(rows)


def model_derive(master: list[dict]) -> list[tuple]:
    newest: dict = {}
    for k, r in _latest_live(master).items():
        value = json.loads(r["value"])
        d = value.get("v")
        if d is None:
            continue
        rank = (r["timestamp"], r["partition"], r["offset"])  # equal timestamps: partition, then offset
        if d not in newest or rank > newest[d][0]:
            newest[d] = (rank, k.decode(), value.get("n"))
    return sorted((d, k, n) for d, (_, k, n) in newest.items())


def changelog(lake, config, topic: str) -> list[dict]:
    """The records a join published to its changelog topic on Kafka (key, value, partition, offset,
    timestamp, and the batch that published it), partition by partition in offset order."""
    from spark_jobs.seams.kafka import connect, read

    cluster = connect(config, lake.root)
    return [
        {
            "key": m.key(),
            "value": m.value(),
            "partition": m.partition(),
            "offset": m.offset(),
            "timestamp": m.timestamp()[1],
            "batch": dict(m.headers() or []).get("lake.batch"),
        }
        for batch in read(cluster, config.topic(topic))
        for m in batch
    ]


def crash_on_result_write(monkeypatch, lake, name: str):
    """Make the join's write of its result (an append of new keys or a MERGE) die as a killed process
    would, after the batch's earlier commits; ``.undo()`` lets writes through again."""
    real = {method: getattr(lake, method) for method in ("append", "merge")}

    def crashing(method):
        def write(table, *args, **kwargs):
            if table == name:
                raise RuntimeError("killed")
            return real[method](table, *args, **kwargs)

        return write

    for method in real:
        monkeypatch.setattr(lake, method, crashing(method))

    class Undo:
        def undo(self):
            for method, write in real.items():
                monkeypatch.setattr(lake, method, write)

    return Undo()
