"""``lake quarantine``: the records a pipeline's jobs did not use, in one place.

Every job writes the input it rejects to the lake's one ``quarantine`` table: a join every record it
does not use (its topic, partition, offset, key, value, the sentence saying why and the reason in one
word, :mod:`spark_jobs.joins.dropped`), a backfill the dump lines it could not read (``bad_line``).
This lists a pipeline's rows, newest first, and counts them by job and reason; what it covers is said
with the table's version and that commit's time.

``--replay`` puts the quarantined records whose cause can be mended back on their topic, as they were
(key, value, timestamp, headers, partition), so that every join reading it takes them again: a record
that did not decode (once its format or schema is fixed) and an event a stream join's ``select``
failed on (once the select is fixed). Each copy carries ``lake.replay.of: <topic>:<partition>:<offset>``,
and a record is left where it is when (:func:`decide`):

- it is gone from the topic (retention, compaction): nothing to replay;
- a copy of it is in the topic already (an earlier replay): a replay is done once;
- it still does not decode with the topic's format as the pipeline declares it now;
- ``select`` failed on it in a join that takes its topic as a table: the join holds it as its key's
  value already, so a copy (the same value) changes nothing there; the mend is to rebuild the
  result once the select is fixed (``lake run <join> --once --reset``);
- a join takes its topic as a table and a newer record of its key follows it: the copy would put
  the older value back over the newer one;
- it is an event (a stream join's stream) that another join read and used: the copy would be a
  second event for that join;
- its reason is not a fault a fix can mend (:data:`KEPT`): a null key, a null foreign or derived
  key and a missing list are how those joins are defined (Kafka Streams drops them too), and a
  backfill's dump line is mended in the dump.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import pyarrow as pa

from spark_jobs.config import PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.seams.delta import Lake
from spark_jobs.system_tables import QUARANTINE


@dataclass
class Quarantined:
    """A pipeline's quarantined records (newest first), and what they were read from."""

    pipeline: str
    version: int | None  # the quarantine table's version read (None: the table does not exist yet)
    as_of: str | None  # that commit's time
    rows: list[dict[str, Any]] = field(default_factory=list)

    def counts(self) -> Counter[tuple[str, str]]:
        """(job, cause) -> records."""
        return Counter((r["job"], r["cause"] or "undecodable") for r in self.rows)

    def covers(self) -> str:
        if self.version is None:
            return f"quarantine of pipeline {self.pipeline}: nothing was ever quarantined in this lake"
        return f"quarantine of pipeline {self.pipeline} (table version {self.version}, as of {self.as_of})"


def jobs_of(config: PipelineConfig) -> list[str]:
    """The quarantine's ``job`` of each of the pipeline's jobs that writes it."""
    return [config.join(j).job for j in config.joins] + [f"backfill:{name}" for name in config.lookups]


def quarantined(
    lake: Lake, config: PipelineConfig, join: str | None = None, cause: str | None = None
) -> Quarantined:
    """The pipeline's rows (one join's, with ``join``; one reason's, with ``cause``), newest first."""
    jobs = jobs_of(config) if join is None else [config.join(join).job]
    if not lake.exists(QUARANTINE):
        return Quarantined(config.name, None, None)
    version = lake.version(QUARANTINE)
    commit = lake.commit(QUARANTINE, version)
    as_of = datetime.fromtimestamp(commit.timestamp_ms / 1000, UTC).isoformat(timespec="seconds")
    table = lake.read_arrow(QUARANTINE, version=version)
    rows = [r for r in table.to_pylist() if r["job"] in jobs]
    if cause is not None:
        rows = [r for r in rows if (r.get("cause") or "undecodable") == cause]
    rows.sort(
        key=lambda r: (r["run_time"], r.get("topic") or r["source"] or "", r["line"] or 0), reverse=True
    )
    return Quarantined(config.name, version, as_of, rows)


def check_cause(cause: str | None) -> None:
    from spark_jobs.joins.dropped import REASONS

    known = (*REASONS, "bad_line")
    if cause is not None and cause not in known:
        raise UserError(f"--reason: one of {', '.join(known)}, not {cause!r}")


def row_line(row: dict[str, Any]) -> str:
    """``2026-11-29T10:00:01Z join:t_left L[1] offset 5: value is not a JSON object (key 'z')``."""
    at = row["run_time"].astimezone(UTC).isoformat(timespec="seconds") if row["run_time"] else "?"
    where = f"{row['source']} {'offset' if row.get('topic') else 'line'} {row['line']}"
    return f"{at} {row['job']} {where} [{row.get('cause') or 'undecodable'}]: {row['reason']}"


# --- replay -----------------------------------------------------------------------------------------

REPLAY_HEADER = "lake.replay.of"  # <topic>:<partition>:<offset> of the quarantined record a copy replays
REPLAYABLE = ("undecodable", "poison")
KEPT = {  # why a quarantined record of each other reason is not replayed
    "null_key": "a record without a key cannot be joined by key: its producer must send it again with one",
    "null_foreign_key": "the inner join drops a record without a foreign key by definition",
    "null_derived_key": "the derive join drops a record whose derived key is null by definition",
    "no_list": "the list join drops a record without a list by definition",
    "null_value": "a tombstone on a stream is not an event: there is nothing to join",
    "bad_line": "a dump line, not a record: mend the dump and run lake backfill again",
}
_SOURCE = re.compile(r"^(?P<topic>.+)\[(?P<partition>\d+)\]$")


@dataclass(frozen=True, order=True)
class Place:
    """Where a record is on Kafka (its topic as the pipeline names it)."""

    topic: str
    partition: int
    offset: int

    def text(self) -> str:
        return f"{self.topic}[{self.partition}] offset {self.offset}"

    def tag(self) -> bytes:
        return f"{self.topic}:{self.partition}:{self.offset}".encode()


@dataclass
class Found:
    """What a quarantined record's partition holds from the record on: the record itself (None: gone),
    its logical key and why it does not decode now (None: it does), the offset of a later record of
    the same key (None: none), and the offset of a copy an earlier replay made (None: none)."""

    record: tuple[bytes | None, bytes | None, int, list[tuple[str, bytes]]] | None = None
    problem: str | None = None
    newer: int | None = None
    copy: int | None = None


@dataclass
class Verdict:
    """One quarantined record's replay: ``replay`` or not, and the sentence saying why not."""

    place: Place | None  # None: a backfill's dump line
    cause: str
    jobs: tuple[str, ...]
    replay: bool
    why: str = ""
    record: tuple[bytes | None, bytes | None, int, list[tuple[str, bytes]]] | None = None
    offset: int | None = None  # where the copy went (once replayed)

    def line(self, dry_run: bool) -> str:
        where = self.place.text() if self.place else "a dump line"
        said = f"  {where} [{self.cause}] of {', '.join(self.jobs)}: "
        if not self.replay:
            return said + f"kept: {self.why}"
        if self.offset is None:
            return said + ("would be replayed" if dry_run else "replayed")
        return said + f"replayed as offset {self.offset}"


def place_of(row: dict[str, Any]) -> Place | None:
    """A quarantine row's record on Kafka (None: a backfill's dump line). Rows from before the
    ``topic`` column name it in ``source``: ``topic[partition]``."""
    if row["job"].startswith("backfill:"):
        return None
    if row.get("topic") is not None:
        return Place(row["topic"], int(row["partition"]), int(row["line"]))
    match = _SOURCE.match(row["source"] or "")
    return Place(match["topic"], int(match["partition"]), int(row["line"])) if match else None


def decide(
    rows: list[dict[str, Any]],
    found: dict[Place, Found],
    table_sides: Callable[[str, str], bool],
    users: Callable[[str], list[str]],
) -> list[Verdict]:
    """Whether each quarantined record (rows of one record merged: several joins may drop one) is
    replayed, from what its partition holds (``found``), whether a join takes a topic as a table
    (``table_sides(job, topic)``) and the jobs that read a topic (``users(topic)``)."""
    merged: dict[Place | None, list[dict[str, Any]]] = {}
    lines: list[Verdict] = []
    for row in rows:
        place = place_of(row)
        if place is None:
            lines.append(Verdict(None, row["cause"] or "bad_line", (row["job"],), False, KEPT["bad_line"]))
            continue
        merged.setdefault(place, []).append(row)
    for place, same in sorted(merged.items(), key=lambda kv: kv[0] or Place("", 0, 0)):
        assert place is not None
        jobs = tuple(sorted({r["job"] for r in same}))
        causes = {r["cause"] or "undecodable" for r in same}
        cause = next((c for c in REPLAYABLE if c in causes), sorted(causes)[0])
        verdict = Verdict(place, cause, jobs, False)
        lines.append(verdict)
        here = found.get(place, Found())
        if cause not in REPLAYABLE:
            verdict.why = KEPT[cause]
        elif here.record is None:
            verdict.why = "gone from the topic (retention or compaction): there is nothing to replay"
        elif here.copy is not None:
            verdict.why = f"replayed already (the copy is offset {here.copy})"
        elif cause == "poison" and all(table_sides(job, place.topic) for job in jobs):
            rebuild = " and ".join(f"lake run {job.removeprefix('join:')} --once --reset" for job in jobs)
            verdict.why = (
                "its join holds it as its key's value already (only the select failed on it): a copy "
                f"changes nothing; once the select is fixed, rebuild the result: {rebuild}"
            )
        elif cause == "undecodable" and here.problem is not None:
            verdict.why = (
                f"it still does not decode ({here.problem}): mend topics.{place.topic}'s format or the "
                "schema first"
            )
        elif here.newer is not None and any(table_sides(job, place.topic) for job in users(place.topic)):
            verdict.why = (
                f"a newer record of its key follows it (offset {here.newer}): the copy would put the older "
                "value back"
            )
        elif cause == "poison" and (
            streams := [u for u in users(place.topic) if u not in jobs and not table_sides(u, place.topic)]
        ):
            verdict.why = f"an event {', '.join(streams)} used already: the copy would be a second one there"
        else:
            verdict.replay, verdict.record = True, here.record
    return lines


@dataclass
class Replayed:
    """What ``lake quarantine --replay`` did (or, with ``dry_run``, would do)."""

    covers: str
    verdicts: list[Verdict]
    dry_run: bool

    def lines(self) -> list[str]:
        replayed = [v for v in self.verdicts if v.replay]
        verb = "would replay" if self.dry_run else "replayed"
        out = [f"{self.covers}: {len(self.verdicts)} record(s)"]
        out += [v.line(self.dry_run) for v in self.verdicts]
        topics = sorted({v.place.topic for v in replayed if v.place})
        out.append(
            f"{verb} {len(replayed)} record(s)"
            + (f" to {', '.join(topics)}" if topics else "")
            + f", kept {len(self.verdicts) - len(replayed)}"
        )
        return out


def replay(
    lake: Lake,
    config: PipelineConfig,
    found_rows: Quarantined,
    dry_run: bool = False,
    log: Callable[[str], None] = lambda _: None,
) -> Replayed:
    """Replay the quarantined records that can be (:func:`decide`): each topic's copies in one Kafka
    transaction, each to the partition it came from, with its key, value, timestamp and headers and
    the ``lake.replay.of`` header."""
    from spark_jobs.seams.kafka import connect, produce, producer_id

    rows = found_rows.rows
    candidates = sorted({p for p in (place_of(r) for r in rows if r["cause"] in REPLAYABLE) if p is not None})
    cluster = connect(config, lake.root)
    found = _found(lake, config, cluster, candidates, log)
    verdicts = decide(rows, found, _table_side(config), _users(config))
    if dry_run:
        return Replayed(found_rows.covers(), verdicts, True)
    by_topic: dict[str, list[Verdict]] = {}
    for v in verdicts:
        if v.replay and v.place is not None:
            by_topic.setdefault(v.place.topic, []).append(v)
    for topic, todo in by_topic.items():
        spec = config.topic(topic)
        records = [v.record for v in todo if v.record is not None]
        keys = pa.array([r[0] for r in records], pa.binary())
        values = pa.array([r[1] for r in records], pa.binary())
        stamps = [r[2] for r in records]
        heads = [
            [*r[3], (REPLAY_HEADER, v.place.tag())] for r, v in zip(records, todo, strict=True) if v.place
        ]
        parts = [v.place.partition for v in todo if v.place]
        log(f"replaying {len(todo)} record(s) to {cluster.topic(topic)}")
        produce(
            cluster,
            spec,
            [(keys, values, stamps, heads, parts)],
            transactional_id=producer_id(lake.root, "replay", topic),
        )
    if by_topic:  # where each copy went: read back by its header (the producer's offsets are per partition)
        copies = _found(lake, config, cluster, [v.place for v in verdicts if v.replay and v.place], log)
        for v in verdicts:
            if v.replay and v.place is not None:
                v.offset = copies[v.place].copy
    return Replayed(found_rows.covers(), verdicts, False)


def _found(
    lake: Lake, config: PipelineConfig, cluster: Any, places: Iterable[Place], log: Callable[[str], None]
) -> dict[Place, Found]:
    """What each place's partition holds from it on (:class:`Found`), read from Kafka, with the
    records' keys and decoding as the joins see them (the topic's codecs, in Spark)."""
    from spark_jobs.formats import Formats
    from spark_jobs.joins.engine import SideCodecs, prepare
    from spark_jobs.seams.kafka import read
    from spark_jobs.seams.session import arrow_frame

    wanted: dict[tuple[str, int], list[Place]] = {}
    for place in places:
        wanted.setdefault((place.topic, place.partition), []).append(place)
    if not wanted:
        return {}
    formats = Formats(config, lake.root, cluster.topic)
    out: dict[Place, Found] = {}
    for (topic, partition), here in sorted(wanted.items()):
        spec = config.topic(topic)
        first = min(p.offset for p in here)
        log(f"reading {cluster.topic(topic)}[{partition}] from offset {first}")
        messages = [
            m
            for batch in read(cluster, spec, start=lambda low, high: first, partitions=[partition])  # noqa: B023
            for m in batch
        ]
        table = pa.table(
            {
                "side": pa.array(["t"] * len(messages), pa.string()),
                "key": pa.array([m.key() for m in messages], pa.binary()),
                "value": pa.array([m.value() for m in messages], pa.binary()),
                "timestamp": pa.array(
                    [m.timestamp()[1] * 1000 for m in messages], pa.timestamp("us", tz="UTC")
                ),
                "partition": pa.array([partition] * len(messages), pa.int32()),
                "offset": pa.array([m.offset() for m in messages], pa.int64()),
            }
        )
        codecs = SideCodecs({"t": formats.codec(topic, "key")}, {"t": formats.codec(topic, "value")})
        seen = prepare(arrow_frame(lake.spark, table), codecs).select("key", "reason").toArrow()
        logical, problems = seen["key"].to_pylist(), seen["reason"].to_pylist()
        by_offset = {m.offset(): i for i, m in enumerate(messages)}
        newest = {key: m.offset() for key, m in zip(logical, messages, strict=True)}  # per key, its last
        copies = {h[1]: m.offset() for m in messages for h in (m.headers() or []) if h[0] == REPLAY_HEADER}
        for place in here:
            i = by_offset.get(place.offset)
            if i is None:
                out[place] = Found(copy=copies.get(place.tag()))
                continue
            m = messages[i]
            newer = newest[logical[i]] if newest[logical[i]] != place.offset else None
            heads = [(str(h[0]), cast(bytes, h[1])) for h in m.headers() or []]
            record = (m.key(), m.value(), m.timestamp()[1], heads)
            out[place] = Found(record, problems[i], newer, copies.get(place.tag()))
    return out


def _table_side(config: PipelineConfig) -> Callable[[str, str], bool]:
    """Whether the job (``join:<name>``) takes the topic as a table (keyed: a newer record of a key
    replaces an older one), not as a stream of events."""
    from spark_jobs.joins.registry import JOBS

    def table_side(job: str, topic: str) -> bool:
        spec = config.join(job.removeprefix("join:"))
        streams = {t for side, t in spec.sides if side in JOBS[spec.kind].null_key_sides}
        return topic not in streams

    return table_side


def _users(config: PipelineConfig) -> Callable[[str], list[str]]:
    """The jobs (``join:<name>``) that read a topic."""

    def users(topic: str) -> list[str]:
        return [spec.job for spec in config.joins.values() if topic in dict(spec.sides).values()]

    return users
