"""Reading Spark Structured Streaming checkpoints: which micro-batches are committed, and the Kafka
offsets each one read up to. The one place that knows Spark's checkpoint layout.

A checkpoint folder holds ``metadata`` (the query's id), ``state/`` (a stateful operator's store),
``offsets/<batch>`` (written before a micro-batch runs: a version line, a metadata line, then one line
per source with the offset that batch reads up to) and ``commits/<batch>`` (written after the batch's
sink has finished). A Kafka source's offset is ``{"<kafka topic>": {"<partition>": <next offset>,
...}}``: the offset after the last one the batch has read in that partition (transaction markers included).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Positions = dict[str, dict[int, int]]  # Kafka topic -> partition -> the next offset to read


def query_id(checkpoint: Path) -> str:
    """The streaming query's id: stable across restarts from the same checkpoint."""
    return str(json.loads((checkpoint / "metadata").read_text())["id"])


def last_committed(checkpoint: Path) -> int | None:
    """The last micro-batch whose commit entry is written (None: none yet)."""
    commits = checkpoint / "commits"
    batches = [int(p.name) for p in commits.glob("[0-9]*")] if commits.is_dir() else []
    return max(batches) if batches else None


def has_state(checkpoint: Path) -> bool:
    """The query keeps state in Spark's state store (the ``state/`` folder of a stateful operator)."""
    return (checkpoint / "state").is_dir()


def forget_commit(checkpoint: Path, batch: int) -> None:
    """Remove micro-batch ``batch``'s commit entry: the next start runs the batch again, as after a
    crash between the batch's writes and its commit (the pipeline test driver's ``replay_last``)."""
    for entry in (str(batch), f".{batch}.crc"):
        (checkpoint / "commits" / entry).unlink(missing_ok=True)


def source_offsets(checkpoint: Path, batch: int) -> list[Any]:
    """The offset of each source that micro-batch ``batch`` reads up to, in the query's source order
    (a source that has not started yet is null; none when the entry is missing)."""
    try:
        lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [None if line.strip() in ("", "-") else json.loads(line) for line in lines[2:]]


def kafka_positions(offsets: list[Any]) -> Positions:
    """The Kafka sources' offsets merged: topic -> partition -> next offset. Anything else (a Delta
    source's ``reservoirVersion`` from an older version of the product) raises :class:`ValueError`."""
    out: Positions = {}
    for offset in offsets:
        if offset is None:
            continue
        if not isinstance(offset, dict) or "reservoirVersion" in offset:
            raise ValueError(f"not a Kafka source offset: {json.dumps(offset)[:120]}")
        for topic, parts in offset.items():
            if not isinstance(parts, dict):
                raise ValueError(f"not a Kafka source offset: {json.dumps(offset)[:120]}")
            out.setdefault(topic, {}).update({int(p): int(o) for p, o in parts.items()})
    return out


def batch_positions(checkpoint: Path, batch: int) -> Positions:
    """The Kafka offsets micro-batch ``batch`` reads up to (its entry in ``offsets/``)."""
    return kafka_positions(source_offsets(checkpoint, batch))


def committed_positions(checkpoint: Path) -> Positions | None:
    """The Kafka offsets the last committed micro-batch read up to (None: nothing committed)."""
    batch = last_committed(checkpoint) if checkpoint.is_dir() else None
    return None if batch is None else batch_positions(checkpoint, batch)


def has_delta_sources(checkpoint: Path) -> bool:
    """The last committed batch read Delta tables (a checkpoint of a join from before the joins read
    Kafka: its positions are bronze table versions, not Kafka offsets)."""
    batch = last_committed(checkpoint) if checkpoint.is_dir() else None
    if batch is None:
        return False
    return any(isinstance(o, dict) and "reservoirVersion" in o for o in source_offsets(checkpoint, batch))
