"""``lake explain JOIN KEY``: why a join's result for a key is what it is (docs/explain.md).

The answer is read, not recomputed: the result row carries the partition and offset of the input
records it was computed from (its provenance columns, kept by the join's state), so each of them is
fetched from Kafka where it is, and marked when it sits in another partition than its topic's
partitioner puts its key. A side without a record (a left join's null side, an inner join's missing
row, a list element without its right record) is looked for on Kafka as the topic is now: no record
up to its end offsets, a tombstone, a record the join has not read yet, a record whose timestamp
comes after the event (stream-table), or a record whose key differs in invisible bytes. Then the
row's history (the result's change feed, newest first) and the last quality runs that named the key.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from confluent_kafka import Message

from spark_jobs.config import FIELD_PATH_RE, JoinSpec, PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.formats import Formats
from spark_jobs.formats.codec import DecodeError, jsonable
from spark_jobs.layout import QUALITY_RUNS
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import Cluster, connect, fetch, partition_counts, read
from spark_jobs.topics.diagnose import (
    KeyFound,
    backfill_fix,
    find_keys,
    missing,
    placement,
    why_differs,
)
from spark_jobs.topics.keys import show


@dataclass
class Source:
    """An input record a result row was computed from (or the record that explains an empty side)."""

    role: str  # left, right, or "element <id>"
    topic: str
    partition: int
    offset: int
    timestamp: str | None = None
    key: str | None = None
    value: Any = None  # decoded (JSON-able); None for a tombstone
    gone: bool = False  # no longer on Kafka (compacted away, or past its retention)
    placement: str | None = None  # set when the record is in another partition than its key's
    # a gone record's key's newest record in its partition (compaction keeps the newest per key), and
    # whether the join has read it: then it has the named record's value (a record that changed the
    # value would be named instead)
    successor: Source | None = None
    successor_read: bool = False

    def text(self) -> str:
        where = f"{self.topic} partition {self.partition} offset {self.offset}"
        if self.gone:
            line = f"{self.role}: {where} (no longer on Kafka: compacted or past retention)"
            later = self.successor
            if later is None:
                return line
            value = (
                "tombstone" if later.value is None else json.dumps(later.value, sort_keys=True, default=str)
            )
            said = (
                "which the join has read: the same value written again (the row names the record that "
                "began the value), and compaction kept only this newest one"
                if self.successor_read
                else "which the join has not read yet"
            )
            return (
                f"{line}\n      its key's newest record: offset {later.offset}, {later.timestamp}, key "
                f"{later.key}: {value}, {said}"
            )
        value = "tombstone" if self.value is None else json.dumps(self.value, sort_keys=True, default=str)
        line = f"{self.role}: {where}, {self.timestamp}, key {self.key}: {value}"
        return line + (f"\n      {self.placement}" if self.placement else "")


@dataclass
class Reason:
    """Why a side has no record: what was found on Kafka, the offsets that show it, and the fix."""

    side: str
    text: str
    fix: str | None = None
    nothing: bool = False  # no record with the key at all (nor one that differs in invisible bytes)

    def line(self) -> str:
        return f"{self.side}: {self.text}" + (f"; fix: {self.fix}" if self.fix else "")


@dataclass
class Explanation:
    join: str
    kind: str
    key: str
    key_hex: str
    as_of: str
    read: str  # what the join had read, per topic (its last committed micro-batch)
    rows: list[dict] = field(default_factory=list)  # the result's row(s) for the key, newest first
    sources: list[list[Source]] = field(default_factory=list)  # per row
    reasons: list[Reason] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)  # newest first
    history_total: int = 0
    gate: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        lines = [
            f"explain {self.join} ({self.kind} join) key {self.key}, as of {self.as_of}",
            f"the join has read {self.read}",
        ]
        if not self.rows:
            lines.append("row: none")
        for row, sources in zip(self.rows, self.sources, strict=True):
            lines.append("row: " + _row_text(row))
            lines += [f"  {s.text()}" for s in sources]
        lines += [f"  {r.line()}" for r in self.reasons]
        if self.history_total:
            lines.append(f"history (newest first, {len(self.history)} of {self.history_total}):")
            for h in self.history:
                line = f"  version {h['version']} {h['committed_at']} {h['change']}"
                if h["change"] != "delete":
                    line += f": {_row_text(h['row'])}; from {_sources_text(h['sources'])}"
                lines.append(line)
            if self.history_total > len(self.history):
                lines.append(f"  ... {self.history_total - len(self.history)} older; see more with --limit")
        lines.append(_gate_text(self.gate, self.key))
        return "\n".join(lines)


def _row_text(row: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in row.items())


def _sources_text(sources: dict) -> str:
    """``left 2/4, right none``: a history entry's input records (partition/offset)."""
    parts = []
    for side in ("left", "right"):
        if f"{side}_partition" in sources:
            p, o = sources[f"{side}_partition"], sources[f"{side}_offset"]
            parts.append(f"{side} " + ("none" if p is None else f"partition {p} offset {o}"))
    if "partition" in sources:  # stream-table: the event's place
        parts.insert(0, f"left partition {sources['partition']} offset {sources['offset']}")
    for element in sources.get("element_sources") or []:
        p = element["partition"]
        parts.append(
            f"element {element['id']} "
            + ("none" if p is None else f"partition {p} offset {element['offset']}")
        )
    return ", ".join(parts) or "no input records recorded"


def _gate_text(gate: list[dict], key: str) -> str:
    if not gate:
        return f"gate: no quality run has named {key}"
    lines = [f"gate: the last quality run(s) naming {key}:"]
    for g in gate:
        verdict = "passed" if g["success"] else "FAILED"
        lines.append(f"  {g['run_time']} {g['suite']} {g['check']} {verdict}: {g['finding']}")
        if g.get("report"):
            lines.append(f"    report: {g['report']}")
        if g.get("since"):
            since = g["since"]
            verdict = "passed" if since["success"] else "failed"
            lines.append(f"    since then: the run of {since['run_time']} {verdict} without naming it")
    return "\n".join(lines)


# --- the answer ------------------------------------------------------------------------------------
def explain(lake: Lake, config: PipelineConfig, name: str, key: bytes, limit: int = 10) -> Explanation:
    """Why join ``name``'s result for ``key`` is what it is (see the module doc)."""
    from spark_jobs.joins.runner import consumed_offsets, offsets_read

    spec = config.join(name)
    if limit < 1:
        raise UserError("--limit must be at least 1")
    if not lake.exists(spec.name):
        raise UserError(
            f"join {spec.name} has never run (no result table): run 'lake run {spec.name} --once'"
        )
    cluster = connect(config, lake.root)
    on_kafka = partition_counts(cluster, [cluster.topic(t) for _, t in spec.sides])
    gone = [t for _, t in spec.sides if cluster.topic(t) not in on_kafka]
    if gone:
        raise UserError(
            f"join {spec.name}: topic {', '.join(cluster.topic(t) for t in gone)} is not on Kafka at "
            f"{cluster.bootstrap_servers} (deleted since the join read it?): its records cannot be shown"
        )
    consumed = consumed_offsets(lake, config, spec, cluster)
    read_text = offsets_read(spec, config, consumed) if consumed else "nothing yet"
    shown = show(key)
    out = Explanation(spec.name, spec.kind, shown, key.hex(), _now(), read_text)
    formats = Formats(config, lake.root)
    _ = lake.spark  # the session, built before two threads use it
    with ThreadPoolExecutor(2) as beside:  # the change feed and the quality runs, beside the rows
        history, gate = beside.submit(_history, lake, spec, key, limit), beside.submit(_gate, lake, key)
        _explain_rows(out, lake, config, spec, cluster, formats, key, limit, consumed)
        out.history, out.history_total = history.result()
        out.gate = gate.result()
    return out


def _explain_rows(
    out: Explanation,
    lake: Lake,
    config: PipelineConfig,
    spec: JoinSpec,
    cluster: Cluster,
    formats: Formats,
    key: bytes,
    limit: int,
    consumed: dict[str, list[int]] | None,
) -> None:
    """The rows, their input records, and why a side is empty (a one-line error when the key is on
    neither side)."""
    shown = out.key
    rows = _rows(lake, spec, key, limit)
    places = [s for row in rows for s in _provenance(spec, row)]
    records = fetch(cluster, [(t, p, o) for _, t, p, o in places])
    for row in rows:
        sources = [_source(config, formats, records, *place) for place in _provenance(spec, row)]
        _successors(lake, config, spec, cluster, formats, row, sources, records, consumed)
        out.rows.append(_values(row, spec))
        out.sources.append(sources)
    out.reasons = _reasons(lake, config, spec, cluster, formats, key, rows, out.sources, records, consumed)
    if not rows and all(r.nothing for r in out.reasons):
        raise UserError(
            f"join {spec.name}: no row for key {shown} and no record with this key on either side: "
            + "; ".join(
                r.text.split(f"no record with key {shown} in ", 1)[-1] + (f"; fix: {r.fix}" if r.fix else "")
                for r in out.reasons
            )
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# the meta columns a row's text leaves out (they are its sources)


def _values(row: dict, spec: JoinSpec) -> dict:
    """A result row as JSON holds it, without its key and its sources (shown apart); a meta column
    that holds a key (derive's ``master_key``) as a key is shown."""
    meta = spec.join_kind.meta_columns

    def value(name: str, v: Any) -> Any:
        return show(v) if name in meta and isinstance(v, bytes) else jsonable(v)

    return {k: value(k, v) for k, v in row.items() if k != "key" and k not in spec.join_kind.provenance}


def _rows(lake: Lake, spec: JoinSpec, key: bytes, limit: int) -> list[dict]:
    table = lake.read_keys(spec.name, "key", pa.array([key], pa.binary()))
    rows = table.to_pylist()
    if spec.join_kind.events:  # a log of events: the newest first (by time, then by offset, as numbers)
        order = spec.join_kind.meta_columns[1:]
        rows.sort(key=lambda r: [(r.get(c) is not None, r.get(c)) for c in order], reverse=True)
    return rows[:limit]


def _provenance(spec: JoinSpec, row: dict) -> list[tuple[str, str, int, int]]:
    """(role, topic, partition, offset) of each input record ``row`` names."""
    out = []
    left = spec.join_kind.provenance[:2]  # the left record's partition and offset
    if row.get(left[0]) is not None:
        out.append(("left", spec.left, row[left[0]], row[left[1]]))
    if spec.right and row.get("right_partition") is not None:
        out.append(("right", spec.right, row["right_partition"], row["right_offset"]))
    for element in row.get("element_sources") or []:
        if element["partition"] is not None:
            out.append((f"element {element['id']}", str(spec.right), element["partition"], element["offset"]))
    return out


def _source(
    config: PipelineConfig,
    formats: Formats,
    records: dict[tuple[str, int, int], Message],
    role: str,
    topic: str,
    partition: int,
    offset: int,
) -> Source:
    m = records.get((topic, partition, offset))
    if m is None:
        return Source(role, topic, partition, offset, gone=True)
    return _record(config, formats, role, topic, m)


def _successors(
    lake: Lake,
    config: PipelineConfig,
    spec: JoinSpec,
    cluster: Cluster,
    formats: Formats,
    row: dict,
    sources: list[Source],
    records: dict[tuple[str, int, int], Message],
    consumed: dict[str, list[int]] | None,
) -> None:
    """For each of a row's input records that is gone from Kafka, its key's newest record after it in
    its partition: on a compacted topic, once the same value is written again, compaction removes
    the record the row names (the one that began the value) and keeps the newest."""
    for source in sources:
        if not source.gone:
            continue
        key = _source_key(lake, spec, formats, row, source, sources, records)
        if key is None:
            continue
        later = _newest_after(cluster, config, formats, source.topic, source.partition, source.offset, key)
        if later is None:
            continue
        source.successor = _record(config, formats, source.role, source.topic, later)
        side = "left" if source.role == "left" else "right"
        read_to = (consumed or {}).get(side)
        source.successor_read = read_to is not None and source.successor.offset < read_to[source.partition]
        records[(source.topic, source.partition, source.successor.offset)] = later  # fk: read from it


def _source_key(
    lake: Lake,
    spec: JoinSpec,
    formats: Formats,
    row: dict,
    source: Source,
    sources: list[Source],
    records: dict[tuple[str, int, int], Message],
) -> bytes | None:
    """The logical key of an input record of ``row`` (None: not known from the row, a derive join's
    master)."""
    if source.role.startswith("element "):
        return source.role.removeprefix("element ").encode()
    if spec.join_kind.rekeyed:
        return None
    if source.role == "right" and spec.join_kind.by_foreign_key:
        return _foreign_key(lake, spec, formats, sources, records)
    return row["key"]


def _newest_after(
    cluster: Cluster,
    config: PipelineConfig,
    formats: Formats,
    topic: str,
    partition: int,
    offset: int,
    key: bytes,
) -> Message | None:
    """The newest record with logical key ``key`` after ``offset`` in ``topic``'s ``partition``."""
    spec = config.topic(topic)
    codec = formats.codec(topic, "key")
    newest = None
    after = [0] * partition + [offset + 1]
    for messages in read(cluster, spec, partitions=[partition], after=after, batch=50_000):
        for m in messages:
            raw = m.key()
            if raw is not None and codec.logical(raw) == key:
                newest = m
    return newest


def _record(config: PipelineConfig, formats: Formats, role: str, topic: str, m: Message) -> Source:
    raw_key, raw_value = m.key(), m.value()
    value = None
    if raw_value is not None:
        try:
            value = jsonable(formats.codec(topic, "value").decode(raw_value))
        except DecodeError as exc:
            value = f"(does not decode: {exc}) {raw_value!r}"
    kind, ms = m.timestamp()
    when = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") if kind else None
    partition, offset = int(m.partition() or 0), int(m.offset() or 0)
    source = Source(role, topic, partition, offset, when, show(raw_key) if raw_key is not None else "null")
    source.value = value
    source.placement = placement(config, topic, raw_key, partition)
    return source


# --- why a side is empty ---------------------------------------------------------------------------
def _reasons(
    lake: Lake,
    config: PipelineConfig,
    spec: JoinSpec,
    cluster: Cluster,
    formats: Formats,
    key: bytes,
    rows: list[dict],
    sources: list[list[Source]],
    records: dict[tuple[str, int, int], Message],
    consumed: dict[str, list[int]] | None,
) -> list[Reason]:
    """The reasons of the sides without a record: the left side when there is no row, the right
    side (or a list's unmatched elements) of a row that has none."""
    kind = spec.join_kind
    wanted: list[tuple[str, str, bytes, int | None]] = []  # (role, side, key, event ms)
    if not rows:
        wanted.append(("left", "left", key, None))
        if kind.right_by_key:
            wanted.append(("right", "right", key, None))
    for row, row_sources in zip(rows, sources, strict=True):
        roles = {s.role for s in row_sources}
        if kind.right_by_key and "right" not in roles:
            event_ms = _ms(row.get("timestamp")) if kind.right_as_of_event else None
            wanted.append(("right", "right", key, event_ms))
        if kind.left_may_be_missing and "left" not in roles:
            wanted.append(("left", "left", key, None))
        if kind.by_foreign_key and "right" not in roles:
            fk = _foreign_key(lake, spec, formats, row_sources, records)
            if fk is None:
                return [Reason("right", f"the left record's foreign key ({spec.by}) is null")]
            wanted.append(("right", "right", fk, None))
        for element in row.get("element_sources") or []:
            if element["partition"] is None and element["id"] is not None:
                wanted.append((f"element {element['id']}", "right", element["id"].encode(), None))
    out = []
    for side in ("left", "right"):
        mine = [w for w in wanted if w[1] == side]
        if not mine:
            continue
        topic = spec.left if side == "left" else str(spec.right)
        found, ends = find_keys(cluster, config, formats, topic, {w[2] for w in mine})
        for role, _, wanted_key, event_ms in dict.fromkeys(mine):
            read_to = (consumed or {}).get(side)
            out.append(_reason(config, role, topic, wanted_key, found[wanted_key], ends, read_to, event_ms))
    return out


def _ms(value: Any) -> int | None:
    return int(value.timestamp() * 1000) if isinstance(value, datetime) else None


def _foreign_key(
    lake: Lake,
    spec: JoinSpec,
    formats: Formats,
    sources: list[Source],
    records: dict[tuple[str, int, int], Message],
) -> bytes | None:
    """The foreign key of a row's left record (among the fetched ``records``), as the join computes
    it (its ``foreign_key``)."""
    from spark_jobs.joins.engine import SideCodecs
    from spark_jobs.joins.keyed import LeftKeys

    left = next((s for s in sources if s.role == "left"), None)
    if left is not None and left.gone:
        left = left.successor  # compacted away: the same value, in its key's newest record
    if left is None:
        return None
    path = (spec.by or "").removeprefix("left.")
    if FIELD_PATH_RE.match(path) and isinstance(left.value, dict):  # a field of the decoded value
        found: Any = left.value
        for part in path.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if found is None or isinstance(found, (dict, list)):
            return None
        return (json.dumps(found) if isinstance(found, bool) else str(found)).encode()
    record = records.get((spec.left, left.partition, left.offset))
    if record is None or record.value() is None:
        return None
    spark = lake.spark
    frame = spark.createDataFrame(
        [("left", record.key(), record.value(), None)], "side string, key binary, value binary, reason string"
    )
    by = LeftKeys(spark, SideCodecs.of(formats, spec), spec).add(frame).select("by").first()
    return None if by is None or by[0] is None else bytes(by[0])


def _reason(
    config: PipelineConfig,
    role: str,
    topic: str,
    key: bytes,
    found: KeyFound,
    ends: list[int],
    read_to: list[int] | None,
    event_ms: int | None,
) -> Reason:
    shown = show(key)
    fix = backfill_fix(config, topic)
    if not found.records:
        text = missing(config, topic, key, ends)
        for m in found.lookalikes:
            text += (
                f"; but {topic} {m.where} has key {show(m.key)} (hex {m.key.hex(' ')}), which differs "
                f"in invisible bytes ({why_differs(m.key)})"
            )
        return Reason(role, text, fix, nothing=not found.lookalikes)
    last = max(found.records, key=lambda m: (m.ms, m.offset))
    where, when = f"{topic} {last.where}", last.when
    if read_to is not None and last.offset >= read_to[last.partition]:
        return Reason(
            role,
            f"the latest record with key {shown} is at {where} ({when}), which the join has not read yet "
            f"(it read partition {last.partition} up to offset {read_to[last.partition]})",
            None,
        )
    if last.value is None:
        return Reason(role, f"the key {shown} was deleted: a tombstone at {where} ({when})", fix)
    if event_ms is not None and last.ms > event_ms:
        event = datetime.fromtimestamp(event_ms / 1000, UTC).isoformat(timespec="milliseconds")
        return Reason(
            role,
            f"the event (timestamp {event}) was decided before the table's record arrived: {where} has "
            f"timestamp {when}, later than the event's; a stream-table join uses the table as of each "
            f"event's time",
            f"{fix} before the events are produced" if fix else None,
        )
    misplaced = placement(config, topic, last.key, last.partition)
    return Reason(
        role, f"a record with key {shown} is at {where} ({when})" + (f"; {misplaced}" if misplaced else "")
    )


# --- history and the gate --------------------------------------------------------------------------
def _history(lake: Lake, spec: JoinSpec, key: bytes, limit: int) -> tuple[list[dict], int]:
    """The result's changes for ``key`` (Delta's change feed), newest first: at most ``limit``, and
    how many there are."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    changes = lake.changes(spec.name).filter(F.col("key") == F.lit(key))
    changes = changes.filter(F.col("_change_type") != "update_preimage")
    # one read of the change feed: the key's changes are few next to the table
    counted = changes.withColumn("__total", F.count(F.lit(1)).over(Window.partitionBy(F.lit(1))))
    # newest first: a stream kind's events of one commit by their time and offsets
    within = (
        [F.col(c).desc_nulls_last() for c in spec.join_kind.meta_columns[1:]] if spec.join_kind.events else []
    )
    newest = counted.orderBy(F.col("_commit_version").desc(), *within).limit(limit).toArrow().to_pylist()
    total = newest[0]["__total"] if newest else 0
    meta = spec.join_kind.provenance
    out = []
    for change in newest:
        row = _values({k: v for k, v in change.items() if not k.startswith("_")}, spec)
        out.append(
            {
                "version": change["_commit_version"],
                "committed_at": change["_commit_timestamp"].astimezone(UTC).isoformat(timespec="seconds"),
                "change": {"update_postimage": "update"}.get(change["_change_type"], change["_change_type"]),
                "row": row,
                "sources": {k: change[k] for k in meta},
            }
        )
    return out, total


def _gate(lake: Lake, key: bytes) -> list[dict]:
    """The latest quality run of each check whose findings name ``key``, with its report page."""
    from pyspark.sql import functions as F

    if not lake.exists(QUALITY_RUNS):
        return []
    runs = lake.read(QUALITY_RUNS)
    hexed = key.hex().upper()
    named = runs.withColumn(
        "__f", F.filter("findings", lambda f: F.upper(f["key_hex"]) == F.lit(hexed))
    ).filter(F.size("__f") > 0)
    rows = named.select("run_id", "run_time", "suite", "check", "success", F.col("__f")[0]["text"].alias("t"))
    latest: dict[tuple[str, str], dict] = {}
    for r in rows.toArrow().to_pylist():
        seen = latest.get((r["suite"], r["check"]))
        if seen is None or r["run_time"] > seen["run_time"]:
            latest[(r["suite"], r["check"])] = r
    # the check's latest run of all: a later one that did not name the key (the problem was mended)
    last_runs = runs.groupBy("suite", "check").agg(
        F.max_by(F.struct("run_time", "success"), "run_time").alias("r")
    )
    newest = {(r["suite"], r["check"]): r["r"] for r in last_runs.toArrow().to_pylist()}
    folder = lake.layout.report_folder
    out = []
    for r in sorted(latest.values(), key=lambda r: r["run_time"], reverse=True):
        page = folder.run_page(r["run_time"], r["run_id"])
        out.append(
            {
                "run_id": r["run_id"],
                "run_time": r["run_time"].astimezone(UTC).isoformat(timespec="seconds"),
                "suite": r["suite"],
                "check": r["check"],
                "success": r["success"],
                "finding": r["t"],
                "report": str(page) if page.is_file() else None,
                "since": _later(newest.get((r["suite"], r["check"])), r["run_time"]),
            }
        )
    return out


def _later(run: dict | None, after: datetime) -> dict | None:
    if run is None or run["run_time"] <= after:
        return None
    return {
        "run_time": run["run_time"].astimezone(UTC).isoformat(timespec="seconds"),
        "success": run["success"],
    }
