"""A check's findings as typed rows: what ``quality_runs`` stores and the report renders.

Each check computes its findings with Spark (one row per key, record or topic, with a plain-words
``problem`` where something is wrong); the offending ones become :class:`Finding` rows: the key (as
shown, and in hex), the topic, the records concerned (partition and offset), and for a key in the
wrong partition where it is, where its partitioner puts it and which partitioner that is. ``text`` is
the finding as the check says it in one line (the CLI, the summary page, Data Docs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

LIST_LIMIT = 1000  # offending keys listed per expectation (with the total count)


@dataclass(frozen=True)
class Placement:
    """A key in a topic's partition(s) other than the one its partitioner gives."""

    topic: str
    partitions: list[int]  # where the key's records are
    expected_partition: int  # where the partitioner puts the key
    partitioner: str


@dataclass(frozen=True)
class Finding:
    text: str  # the finding in one line, as the check says it
    problem: str  # what is wrong, without the key
    key: str | None = None  # printable: invisible bytes escaped (key_hex has the bytes)
    key_hex: str | None = None
    topic: str | None = None
    records: int | None = None  # how many records it concerns, when counted
    offsets: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) of records
    placements: list[Placement] = field(default_factory=list)


def as_row(finding: Finding) -> dict:
    """A finding as a ``FINDING_TYPE`` value (``spark_jobs.system_tables``)."""
    return {
        "text": finding.text,
        "problem": finding.problem,
        "key": finding.key,
        "key_hex": finding.key_hex,
        "topic": finding.topic,
        "records": finding.records,
        "offsets": [{"partition": p, "offset": o} for p, o in finding.offsets],
        "placements": [vars(p) for p in finding.placements],
    }


def display(key_col: str = "key") -> list:
    """The key columns of a findings frame: as text, and in hex."""
    return [
        F.col(key_col).cast("string").alias("key_text"),
        F.hex(F.col(key_col)).alias("key_hex"),
    ]


def show_key(row: dict) -> str:
    """A key as a person can read it: its bytes with invisible ones escaped, and in hex if any was."""
    raw = bytes.fromhex(row["key_hex"]) if row.get("key_hex") else b""
    shown = repr(raw)[2:-1]
    plain = raw.decode("utf-8", "replace")
    return shown if shown == plain else f"{shown} (hex {row['key_hex']})"


def keyed(row: dict, problem: str, **typed) -> Finding:
    """A finding about one key: ``<key>: <problem>`` (or the problem alone for a row without a key)."""
    key = show_key(row) if row.get("key_hex") else None
    text = f"{key}: {problem}" if key else problem
    return Finding(text, problem, key, row.get("key_hex") or None, **typed)


def offending(df: DataFrame, describe: Callable[[dict], Finding]) -> tuple[int, list[Finding]]:
    """How many rows of a findings frame have a problem, and the first ``LIST_LIMIT`` of them."""
    bad = df.filter(F.col("problem").isNotNull())
    total = bad.count()
    rows = [
        r.asDict(recursive=True)
        for r in bad.orderBy(*[c for c in ("topic", "key_text", "key_hex") if c in df.columns])
        .limit(LIST_LIMIT)
        .collect()
    ]
    return total, [describe(r) for r in rows]
