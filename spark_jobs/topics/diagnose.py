"""Diagnosis of keys on Kafka: ``lake diagnose`` (two topics side by side), and the words for one key
that ``lake explain`` and the quality pages share (where its partitioner puts it, why it is missing,
which keys differ from it only in invisible bytes).

``lake diagnose``: two Kafka topics side by side, read-only, no pipeline needed.

What one otherwise does by hand with kcat: read both topics to their end offsets as
the command starts (assigned partitions, no consumer group offsets read or written, nothing
produced) and report

- each topic's partition count and record count;
- which partitioner its placements fit: the share of its keys that murmur2 (Kafka's Java default,
  what Kafka Streams assumes) and CRC32 (librdkafka's and kcat's default) would put where they are;
- the keys that sit elsewhere than the expected partitioner puts them, keys found in more than one
  partition, and the keys whose partition differs between the two topics;
- key hygiene (``spark_jobs.topics.keys``: Schema Registry framing, JSON quotes, whitespace, BOM,
  non-UTF-8, control bytes), with a hex dump of a sample;
- keys present in one topic and missing in the other;
- with a Schema Registry to ask (the pipeline's, or ``--registry URL``): keys framed on one topic
  whose decoded value is a plain key of the other (the same key, other bytes: a Kafka Streams or
  ksqlDB join misses it, and the partitioner may place the two apart), with each side's partition.

Memory is bounded by the number of distinct keys, not records: a key is kept as 12 bytes (its murmur2
and CRC32 hashes, which are also all that is needed to place it, and its partition). Samples of key
bytes are kept per finding (``sample`` each). Only the keys of the first topic missing in the second
need a second read of the first topic, which stops when its sample is full.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.config import PipelineConfig, TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.formats import Codec, Formats, LogicalKeys
from spark_jobs.seams import partitioners
from spark_jobs.seams.kafka import Cluster, offset_ranges, partition_counts, read, topic_prefix, watermarks
from spark_jobs.seams.partitioners import MURMUR2, crc32_array, murmur2_array
from spark_jobs.topics.keys import RULES, hex_dump, plain_key, show

if TYPE_CHECKING:
    from confluent_kafka import Message

CRC32 = "crc32"  # librdkafka's consistent_random / consistent: kcat, confluent-kafka's default
PARTITIONERS = (MURMUR2, CRC32)
COMPACT_EVERY = 4_000_000  # buffered (hash, partition) pairs before they are deduplicated


@dataclass
class Sample:
    """A finding: how many distinct keys, and the first ``limit`` of them with details."""

    limit: int
    count: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    _seen: set[bytes] = field(default_factory=set)

    def offer(self, key: bytes, **details: Any) -> None:
        if len(self.rows) < self.limit and key not in self._seen:
            self._seen.add(key)
            self.rows.append({"key": show(key), "hex": hex_dump(key), **details})

    @property
    def full(self) -> bool:
        return len(self.rows) >= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {"count": self.count, "sample": self.rows}


class KeySet:
    """Distinct (key hash, partition) pairs of a topic, as sorted numpy arrays. The hash is murmur2 in
    the high 32 bits and CRC32 in the low ones: unique enough to tell keys apart (a collision among
    ten million keys has odds of about one in 300,000) and all that placing a key needs."""

    def __init__(self) -> None:
        self._hashes: list[np.ndarray] = []
        self._parts: list[np.ndarray] = []
        self._buffered = 0
        self.hashes = np.zeros(0, dtype=np.uint64)
        self.parts = np.zeros(0, dtype=np.int32)

    def add(self, hashes: np.ndarray, parts: np.ndarray) -> None:
        self._hashes.append(hashes)
        self._parts.append(parts)
        self._buffered += len(hashes)
        if self._buffered >= COMPACT_EVERY:
            self.compact()

    def compact(self) -> None:
        if not self._hashes:
            return
        hashes = np.concatenate([self.hashes, *self._hashes])
        parts = np.concatenate([self.parts, *self._parts])
        self._hashes, self._parts, self._buffered = [], [], 0
        order = np.lexsort((parts, hashes))
        hashes, parts = hashes[order], parts[order]
        keep = np.ones(len(hashes), dtype=bool)
        keep[1:] = (hashes[1:] != hashes[:-1]) | (parts[1:] != parts[:-1])
        self.hashes, self.parts = hashes[keep], parts[keep]

    def keys(self) -> np.ndarray:
        """The distinct key hashes, sorted."""
        return np.unique(self.hashes)

    def first_partition(self, hashes: np.ndarray) -> np.ndarray:
        """The (lowest) partition of each of ``hashes``, which must be among this set's keys."""
        return self.parts[np.searchsorted(self.hashes, hashes)]


@dataclass
class TopicReport:
    name: str
    partitions: int
    expected: str
    sample: int
    records: int = 0
    null_keys: int = 0
    keys: int = 0
    explained: dict[str, int] = field(default_factory=dict)  # partitioner -> keys it places right
    misplaced: Sample = field(init=False)  # against the expected partitioner
    several_partitions: Sample = field(init=False)  # a key in more than one partition
    hygiene: dict[str, Sample] = field(init=False)  # rule name -> keys that break it
    only_here: Sample = field(init=False)  # keys the other topic does not have
    key_set: KeySet = field(default_factory=KeySet)
    _bad: dict[str, KeySet] = field(default_factory=dict)  # rule -> hashes of keys that break it
    # framed keys by their decoded (logical) value: hashes, and a sample of (raw, logical, partition)
    logical_set: KeySet = field(default_factory=KeySet)
    framed_examples: list[tuple[bytes, bytes, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.misplaced = Sample(self.sample)
        self.several_partitions = Sample(self.sample)
        self.hygiene = {r.name: Sample(self.sample) for r in RULES}
        self.only_here = Sample(self.sample)
        self._bad = {r.name: KeySet() for r in RULES}

    @property
    def fits(self) -> str:
        """The partitioner that places every key where it is (both, neither, or one)."""
        if not self.keys:
            return "no keys"
        full = [p for p in PARTITIONERS if self.explained.get(p) == self.keys]
        if len(full) == len(PARTITIONERS):
            return "both"
        return full[0] if full else "neither"

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.name,
            "partitions": self.partitions,
            "records": self.records,
            "null_keys": self.null_keys,
            "keys": self.keys,
            "partitioners": {
                p: {"keys": self.explained.get(p, 0), "share": _share(self.explained.get(p, 0), self.keys)}
                for p in PARTITIONERS
            },
            "fits": self.fits,
            "misplaced": {"partitioner": self.expected, **self.misplaced.as_dict()},
            "in_several_partitions": self.several_partitions.as_dict(),
            "hygiene": {
                r.name: {"problem": f"the key {r.text}", **self.hygiene[r.name].as_dict()}
                for r in RULES
                if self.hygiene[r.name].count
            },
            "only_in_this_topic": self.only_here.as_dict(),
        }


@dataclass
class Diagnosis:
    a: TopicReport
    b: TopicReport
    differing: Sample  # keys in both topics whose partitions differ
    framed_apart: Sample  # keys framed on one topic whose decoded value is a plain key of the other

    @property
    def co_partitioned(self) -> bool:
        return (
            self.a.partitions == self.b.partitions
            and not self.differing.count
            and not self.framed_apart.count
            and not any(t.misplaced.count or t.several_partitions.count for t in (self.a, self.b))
        )

    @property
    def clean(self) -> bool:
        return not any(s.count for t in (self.a, self.b) for s in t.hygiene.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "topics": [self.a.as_dict(), self.b.as_dict()],
            "same_partition_count": self.a.partitions == self.b.partitions,
            "partition_differs": self.differing.as_dict(),
            "framed_on_one_side": self.framed_apart.as_dict(),
            "co_partitioned": self.co_partitioned,
            "clean": self.clean,
        }


def diagnose(
    cluster: Cluster,
    topic_a: str,
    topic_b: str,
    expected: str = MURMUR2,
    sample: int = 10,
    progress: Callable[[str, int, int], None] = lambda *_: None,
    logical: LogicalKeys | None = None,
) -> Diagnosis:
    """Read both topics and compare them (see the module doc). ``progress(topic, records, total)`` is
    called with 0 records when a read of the topic starts (``total``: the records it holds), then with
    each batch's records. ``logical`` decodes framed keys (a registry to ask)."""
    if topic_a == topic_b:
        raise UserError(f"diagnose needs two different topics, got {topic_a} twice")
    counts = partition_counts(cluster, [topic_a, topic_b])
    for name in (topic_a, topic_b):
        if name not in counts:
            raise UserError(
                f"topic {name} does not exist on Kafka at {cluster.bootstrap_servers} ({cluster.origin})"
            )
    a = TopicReport(topic_a, counts[topic_a], expected, sample)
    b = TopicReport(topic_b, counts[topic_b], expected, sample)
    for report in (a, b):
        _scan(cluster, report, progress, logical or LogicalKeys(None))
    differing = Sample(sample)
    _compare(cluster, a, b, differing, progress)
    return Diagnosis(a, b, differing, _framed_apart(a, b, sample))


def _batches(
    cluster: Cluster, report: TopicReport, progress: Callable[[str, int, int], None]
) -> Iterator[tuple[int, pa.Array]]:
    """(partition, keys) per batch of the topic's committed records up to its end."""
    spec = TopicSpec(report.name, report.partitions)
    progress(report.name, 0, sum(high - low for low, high in watermarks(cluster, spec)))
    for messages in read(cluster, spec, batch=50_000):
        progress(report.name, len(messages), 0)
        yield int(messages[0].partition() or 0), pa.array([m.key() for m in messages], pa.binary())


def _hashes(keys: pa.Array) -> np.ndarray:
    murmur = murmur2_array(keys).view(np.uint32).astype(np.uint64)
    return (murmur << np.uint64(32)) | crc32_array(keys).astype(np.uint64)


def _placements(hashes: np.ndarray, partitions: int) -> dict[str, np.ndarray]:
    """Where each partitioner puts each key (from its hashes)."""
    n = np.uint64(partitions)
    return {
        MURMUR2: (((hashes >> np.uint64(32)) & np.uint64(0x7FFFFFFF)) % n).astype(np.int32),
        CRC32: ((hashes & np.uint64(0xFFFFFFFF)) % n).astype(np.int32),
    }


def _scan(
    cluster: Cluster, report: TopicReport, progress: Callable[[str, int, int], None], logical: LogicalKeys
) -> None:
    framed_rule = next(r for r in RULES if r.name == "framed")
    for partition, keys in _batches(cluster, report, progress):
        report.records += len(keys)
        present = keys.filter(keys.is_valid())
        report.null_keys += len(keys) - len(present)
        if not len(present):
            continue
        hashes = _hashes(present)
        report.key_set.add(hashes, np.full(len(hashes), partition, dtype=np.int32))
        where = _placements(hashes, report.partitions)[report.expected]
        wrong = np.flatnonzero(where != partition)
        if len(wrong) and not report.misplaced.full:
            for i in wrong[: report.sample * 4]:
                report.misplaced.offer(present[int(i)].as_py(), partition=partition, expected=int(where[i]))
        for rule in RULES:
            hit = np.flatnonzero(rule.arrow(present))
            if len(hit):
                report._bad[rule.name].add(hashes[hit], np.zeros(len(hit), dtype=np.int32))
                for i in hit[: report.sample * 4]:
                    report.hygiene[rule.name].offer(present[int(i)].as_py(), partition=partition)
        framed = np.flatnonzero(framed_rule.arrow(present)) if logical.registry is not None else np.zeros(0)
        _decode_framed(report, present, framed, partition, logical)
    _summarize(report)
    report.logical_set.compact()


def _decode_framed(
    report: TopicReport, keys: pa.Array, framed: Any, partition: int, logical: LogicalKeys
) -> None:
    """The framed keys among ``keys`` as their decoded values: hashed into the report's logical set,
    a few kept as examples."""
    decoded: list[tuple[bytes, bytes]] = []
    for i in framed:
        raw = keys[int(i)].as_py()
        value = logical(raw)
        if value is not None:
            decoded.append((raw, value))
    if not decoded:
        return
    hashes = _hashes(pa.array([value for _, value in decoded], pa.binary()))
    report.logical_set.add(hashes, np.full(len(hashes), partition, dtype=np.int32))
    room = report.sample * 4 - len(report.framed_examples)
    report.framed_examples += [(raw, value, partition) for raw, value in decoded[: max(room, 0)]]


def _framed_apart(a: TopicReport, b: TopicReport, sample: int) -> Sample:
    """Keys framed on one topic whose decoded value is a plain key of the other, with the framing and
    each side's partition."""
    from spark_jobs.formats import framing

    found = Sample(sample)
    for framed, plain in ((a, b), (b, a)):
        logical, plain_keys = framed.logical_set.keys(), plain.key_set.keys()
        found.count += len(np.intersect1d(logical, plain_keys, assume_unique=True))
        for raw, value, partition in framed.framed_examples:
            hashed = _hashes(pa.array([value], pa.binary()))
            if not np.isin(hashed, plain_keys)[0]:
                continue
            found.offer(
                value,
                framed_in=framed.name,
                schema_id=framing.split(raw)[0],
                **{framed.name: partition, plain.name: int(plain.key_set.first_partition(hashed)[0])},
            )
    return found


def _summarize(report: TopicReport) -> None:
    """Per-key counts from the distinct (key, partition) pairs."""
    ks = report.key_set
    ks.compact()
    if not len(ks.hashes):
        return
    starts = np.flatnonzero(np.r_[True, ks.hashes[1:] != ks.hashes[:-1]])
    report.keys = len(starts)
    places = _placements(ks.hashes, report.partitions)
    for name, where in places.items():
        right = (where == ks.parts).astype(np.int8)
        report.explained[name] = int(np.minimum.reduceat(right, starts).sum())  # every partition right
    wrong = (places[report.expected] != ks.parts).astype(np.int8)
    report.misplaced.count = int(np.maximum.reduceat(wrong, starts).sum())
    sizes = np.diff(np.r_[starts, len(ks.hashes)])
    report.several_partitions.count = int((sizes > 1).sum())
    for rule in RULES:
        bad = report._bad[rule.name]
        bad.compact()
        report.hygiene[rule.name].count = len(np.unique(bad.hashes))


def _compare(
    cluster: Cluster,
    a: TopicReport,
    b: TopicReport,
    differing: Sample,
    progress: Callable[[str, int, int], None],
) -> None:
    """Keys only in one topic, keys whose partitions differ, and samples of both. The samples of
    ``b``'s findings come from a read of ``b`` (``a``'s key set is complete by then), the sample of
    keys only in ``a`` from a second read of ``a`` that stops when the sample is full."""
    keys_a, keys_b = a.key_set.keys(), b.key_set.keys()
    a.only_here.count = len(np.setdiff1d(keys_a, keys_b, assume_unique=True))
    b.only_here.count = len(np.setdiff1d(keys_b, keys_a, assume_unique=True))
    both = np.intersect1d(keys_a, keys_b, assume_unique=True)
    differing.count = len(both) - _same_partitions(a.key_set, b.key_set, both)
    several = {r.name for r in (a, b) if r.several_partitions.count}
    for report, other in ((b, a), (a, b)):
        wants_only = report.only_here.count and not report.only_here.full
        wants_differing = differing.count and not differing.full and report is b
        wants_several = report.name in several and not report.several_partitions.full
        if not (wants_only or wants_differing or wants_several):
            continue
        mine = report.key_set
        multi = _multi_partition_keys(mine) if wants_several else np.zeros(0, dtype=np.uint64)
        other_keys = other.key_set.keys()
        for partition, keys in _batches(cluster, report, progress):
            present = keys.filter(keys.is_valid())
            if not len(present):
                continue
            hashes = _hashes(present)
            found = np.zeros(len(hashes), dtype=bool)
            if len(other_keys):
                at = np.minimum(np.searchsorted(other_keys, hashes), len(other_keys) - 1)
                found = other_keys[at] == hashes
            if wants_only:
                for i in np.flatnonzero(~found)[: report.sample * 4]:
                    report.only_here.offer(present[int(i)].as_py(), partition=partition)
            if wants_differing:
                theirs = np.full(len(hashes), -1, dtype=np.int32)
                theirs[found] = other.key_set.first_partition(hashes[found])
                for i in np.flatnonzero(found & (theirs != partition))[: report.sample * 4]:
                    differing.offer(present[int(i)].as_py(), **{a.name: int(theirs[i]), b.name: partition})
            if wants_several:
                for i in np.flatnonzero(np.isin(hashes, multi))[: report.sample * 4]:
                    lo, hi = (
                        np.searchsorted(mine.hashes, hashes[i], "left"),
                        np.searchsorted(mine.hashes, hashes[i], "right"),
                    )
                    parts = sorted(int(p) for p in mine.parts[lo:hi])
                    report.several_partitions.offer(present[int(i)].as_py(), partitions=parts)
            if (
                (not wants_only or report.only_here.full)
                and (not wants_differing or differing.full)
                and (not wants_several or report.several_partitions.full)
            ):
                break


def _same_partitions(a: KeySet, b: KeySet, keys: np.ndarray) -> int:
    """How many of ``keys`` (in both sets) sit in the same partitions in both."""
    same = 0
    in_a = np.isin(a.hashes, keys)
    in_b = np.isin(b.hashes, keys)
    ha, pa_ = a.hashes[in_a], a.parts[in_a]
    hb, pb = b.hashes[in_b], b.parts[in_b]
    if len(ha) == len(keys) and len(hb) == len(keys):  # one partition per key on both sides: aligned
        return int((pa_ == pb).sum())
    groups_a = np.split(pa_, np.flatnonzero(np.diff(ha)) + 1) if len(ha) else []
    groups_b = np.split(pb, np.flatnonzero(np.diff(hb)) + 1) if len(hb) else []
    for x, y in zip(groups_a, groups_b, strict=True):
        same += int(np.array_equal(x, y))
    return same


def _multi_partition_keys(ks: KeySet) -> np.ndarray:
    repeated = ks.hashes[1:] == ks.hashes[:-1]
    return np.unique(ks.hashes[1:][repeated])


def _share(n: int, total: int) -> float:
    return round(n / total, 4) if total else 0.0


def text(d: Diagnosis) -> str:
    """The diagnosis in plain words."""
    lines = []
    for t in (d.a, d.b):
        lines.append(
            f"{t.name}: {t.partitions} partitions, {t.records:,} records, {t.keys:,} distinct keys"
            + (f", {t.null_keys:,} records without a key" if t.null_keys else "")
        )
    if d.a.partitions != d.b.partitions:
        lines.append(
            f"partition counts differ ({d.a.name} {d.a.partitions}, {d.b.name} {d.b.partitions}): "
            "no partitioner places a key alike in both"
        )
    lines.append("")
    lines.append("partitioners (share of keys each places where they are):")
    for t in (d.a, d.b):
        shares = ", ".join(
            f"{p} {_share(t.explained.get(p, 0), t.keys):.0%} ({t.explained.get(p, 0):,})"
            for p in PARTITIONERS
        )
        lines.append(f"  {t.name}: {shares} -> fits {t.fits}")
    for t in (d.a, d.b):
        if t.misplaced.count:
            lines.append("")
            lines.append(f"{t.name}: {t.misplaced.count:,} keys not where {t.expected} puts them:")
            lines += [
                f"  {r['key']}: partition {r['partition']}, {t.expected} says {r['expected']}"
                for r in t.misplaced.rows
            ]
            lines += _more(t.misplaced)
        if t.several_partitions.count:
            lines.append("")
            lines.append(f"{t.name}: {t.several_partitions.count:,} keys in more than one partition:")
            lines += [f"  {r['key']}: partitions {r['partitions']}" for r in t.several_partitions.rows]
            lines += _more(t.several_partitions)
    if d.framed_apart.count:
        lines.append("")
        lines.append(
            f"{d.framed_apart.count:,} keys are framed by a Schema Registry on one topic and plain on the "
            "other: the same key, other bytes (a Kafka Streams or ksqlDB join of the two misses them):"
        )
        for r in d.framed_apart.rows:
            plain = d.b.name if r["framed_in"] == d.a.name else d.a.name
            lines.append(
                f"  {r['key']}: {r['framed_in']} partition {r[r['framed_in']]} (framed with schema id "
                f"{r['schema_id']}), {plain} partition {r[plain]} (plain)"
            )
        lines += _more(d.framed_apart)
    if d.differing.count:
        lines.append("")
        lines.append(f"{d.differing.count:,} keys sit in different partitions in the two topics:")
        lines += [
            f"  {r['key']}: {d.a.name} {r[d.a.name]}, {d.b.name} {r[d.b.name]}" for r in d.differing.rows
        ]
        lines += _more(d.differing)
    for t in (d.a, d.b):
        for rule in RULES:
            found = t.hygiene[rule.name]
            if found.count:
                lines.append("")
                lines.append(f"{t.name}: {found.count:,} keys: the key {rule.text}:")
                lines += [f"  {r['hex']}" for r in found.rows]
                lines += _more(found)
    for t, other in ((d.a, d.b), (d.b, d.a)):
        if t.only_here.count:
            lines.append("")
            lines.append(f"{t.only_here.count:,} keys of {t.name} are not in {other.name}:")
            lines += [f"  {r['key']} (partition {r['partition']})" for r in t.only_here.rows]
            lines += _more(t.only_here)
    lines.append("")
    verdict = "co-partitioned" if d.co_partitioned else "NOT co-partitioned"
    lines.append(f"{d.a.name} and {d.b.name}: {verdict}, keys {'clean' if d.clean else 'NOT clean'}")
    return "\n".join(lines)


def _more(s: Sample) -> list[str]:
    return [f"  ... and {s.count - len(s.rows):,} more"] if s.count > len(s.rows) else []


# --- one key: where it belongs, why it is missing, what differs (lake explain, the quality pages) ---
LOOKALIKES = 3  # records with a key that differs in invisible bytes, named per missing key


def placement(config: PipelineConfig, topic: str, raw_key: bytes | None, partition: int) -> str | None:
    """Where a record is against where its topic's partitioner puts its key: None when it is there,
    else the partition it belongs in and the partitioner that put it where it is."""
    if raw_key is None:
        return None
    spec = config.topic(topic)
    partitioner = partitioners.check_partitioner(spec.partitioner)
    expected = partitioners.partition_for(raw_key, spec.partitions, partitioner)
    if expected is None or expected == partition:
        return None
    matches = [
        p
        for p in partitioners.NAMES
        if p != partitioner and partitioners.partition_for(raw_key, spec.partitions, p) == partition
    ]
    written = (
        f"written with {matches[0]}" if matches else "written with neither murmur2 nor consistent_random"
    )
    return (
        f"MISPLACED: in partition {partition}, but {partitioner} (the topic's partitioner) puts this key in "
        f"partition {expected} ({written}): the product's joins find it, a Kafka Streams or ksqlDB join "
        f"of the topic misses it; fix: lake topic repartition {topic}"
    )


@dataclass(frozen=True)
class KeyRecord:
    partition: int
    offset: int
    ms: int  # the record's timestamp, epoch ms
    key: bytes
    value: bytes | None

    @classmethod
    def of(cls, m: Message) -> KeyRecord:
        return cls(int(m.partition() or 0), int(m.offset() or 0), m.timestamp()[1], m.key() or b"", m.value())

    @property
    def where(self) -> str:
        return f"partition {self.partition} offset {self.offset}"

    @property
    def when(self) -> str:
        return datetime.fromtimestamp(self.ms / 1000, UTC).isoformat(timespec="milliseconds")


@dataclass
class KeyFound:
    """What a scan of a topic found for one key: its records (exact key) and lookalikes."""

    records: list[KeyRecord] = field(default_factory=list)
    lookalikes: list[KeyRecord] = field(default_factory=list)


def normal_key(raw: bytes, codec: Codec) -> bytes:
    """A key without the invisible bytes a producer may add: registry framing (its logical value),
    then :func:`spark_jobs.topics.keys.plain_key`."""
    return plain_key(codec.logical(raw))


def find_keys(
    cluster: Cluster, config: PipelineConfig, formats: Formats, topic: str, keys: Iterable[bytes]
) -> tuple[dict[bytes, KeyFound], list[int]]:
    """A read of the whole topic for ``keys``: each key's records, and records whose key differs
    from it only in invisible bytes; and the end offsets it read up to."""
    spec = config.topic(topic)
    codec = formats.codec(topic, "key")
    targets = {k: normal_key(k, codec) for k in keys}
    found = {k: KeyFound() for k in targets}
    ends = [high for _, high in offset_ranges(cluster, [spec])[spec.name]]
    patterns = {n for n in targets.values() if n}
    for messages in read(cluster, spec, batch=50_000):
        raw = pa.array([m.key() for m in messages], pa.binary())
        logical_raw = codec.logical_keys(raw)  # the join compares a framed key's logical value
        exact = pc.is_in(logical_raw, pa.array(list(targets), pa.binary())).to_numpy(zero_copy_only=False)
        near = pa.array([False] * len(raw))
        for pattern in patterns:
            near = pc.or_(
                near, pc.fill_null(pc.match_substring(raw, pattern=pattern.decode("utf-8", "replace")), False)
            )
        for i in (exact | near.to_numpy(zero_copy_only=False)).nonzero()[0]:
            m, k = KeyRecord.of(messages[int(i)]), logical_raw[int(i)].as_py()
            if k in found:
                found[k].records.append(m)
                continue
            normal = normal_key(m.key, codec)
            for target, target_normal in targets.items():
                if normal == target_normal and len(found[target].lookalikes) < LOOKALIKES:
                    found[target].lookalikes.append(m)
    return found, ends


def missing(config: PipelineConfig, topic: str, key: bytes, ends: list[int]) -> str:
    """``no record with key K in T up to its end offsets [..] (murmur2 puts it in partition p)``."""
    spec = config.topic(topic)
    partitioner = partitioners.check_partitioner(spec.partitioner)
    home = partitioners.partition_for(key, spec.partitions, partitioner)
    upto = f"[{', '.join(str(e) for e in ends)}]"
    return (
        f"no record with key {show(key)} in {topic} up to its end offsets {upto} "
        f"({partitioner} puts it in partition {home})"
    )


def explain_commands(config: PipelineConfig, topic: str, key: bytes) -> list[str]:
    """``lake explain JOIN KEY`` for each join whose result is keyed by ``topic``'s keys (not the
    joins that reach it through a foreign key or a list: their rows have the left topic's keys)."""
    arg = show(key)
    if arg != key.decode("utf-8", "replace") or arg.startswith("-"):
        arg = f"{key.hex()} --key-hex"
    keyed = [n for n, j in config.joins.items() if j.left == topic and not j.join_kind.rekeyed]
    keyed += [n for n, j in config.joins.items() if j.right == topic and not j.join_kind.references]
    return [f"lake explain {name} {arg}" for name in keyed]


def why_differs(raw: bytes) -> str:
    rules = [r.text for r in RULES if bool(r.arrow(pa.array([raw], pa.binary()))[0])]
    return "the key " + " and ".join(rules) if rules else "other bytes"


def backfill_fix(config: PipelineConfig, topic: str) -> str | None:
    lookup = next((name for name, lk in config.lookups.items() if lk.topic == topic), None)
    return f"lake backfill {lookup}" if lookup else None


class Explainer:
    """A missing or misplaced key of a finding as ``lake explain`` says it (the same words), with
    the ``lake explain`` commands that tell the rest for the joins reading its topic."""

    def __init__(self, config: PipelineConfig):
        self.config = config

    def missing(self, row: dict, finding: dict) -> str | None:
        lookup = self.config.lookups.get(row["check"].split("->", 1)[-1])
        if lookup is None or not finding.get("key_hex"):
            return None
        key = bytes.fromhex(finding["key_hex"])
        # a quality_runs row's (topic, ends) pairs, or a run summary's {topic: ends}
        read = dict(row.get("topic_offsets") or row.get("offsets") or [])
        ends = read.get(lookup.topic, read.get(self._kafka(lookup.topic)))
        if ends is None:
            return None
        text = f"{missing(self.config, lookup.topic, key, list(ends))}; fix: lake backfill {lookup.name}"
        return "; ".join([text, *explain_commands(self.config, lookup.topic, key)])

    def misplaced(self, finding: dict, where: dict) -> str | None:
        name = next((t for t in self.config.topics if self._kafka(t) == where["topic"]), where["topic"])
        if name not in self.config.topics or not finding.get("key_hex"):
            return None
        key = bytes.fromhex(finding["key_hex"])
        texts = [placement(self.config, name, key, p) for p in where["partitions"]]
        return "; ".join([t for t in texts if t] + explain_commands(self.config, name, key)) or None

    def _kafka(self, topic: str) -> str:
        """A declared topic's name on Kafka (findings name the topics as Kafka does)."""
        return topic_prefix(self.config) + topic
