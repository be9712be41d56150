"""Kafka-shaped topics kept as append-only Delta logs.

A topic table has the columns of Spark's Kafka source: ``key`` (binary), ``value`` (binary, null is a
tombstone), ``topic``, ``partition``, ``offset`` (contiguous from 0 in each partition),
``timestamp``, ``timestampType`` (0 = CreateTime) and ``headers``; it is partitioned by ``partition``.

``produce`` follows ``kcat -P -l``: one record per line, ``-K SEP`` splits the key off at the first
SEP, ``-Z`` sends empty keys/values as null. It is vectorized end to end (Arrow compute to split lines,
numpy partitioners, numpy offsets) and streams into a single Delta commit: a bad line anywhere aborts
the whole call before anything becomes visible.

``consume`` follows ``kcat -C -f``: records in partition, offset order, formatted with ``%k %s %p %o
%T %t`` (and ``%K %S`` for lengths, ``%h`` for headers) and the escapes ``\\n \\t \\r \\\\``.
"""

from __future__ import annotations

import fcntl
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs import partitioners
from spark_jobs.config import TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.lake import Lake, Txn

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TOPIC_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", HEADER_TYPE),
    ]
)
CHUNK_BYTES = 16 * 1024 * 1024  # ~500k dump lines: small enough to overlap parsing and writing


def ensure_topic(lake: Lake, spec: TopicSpec) -> None:
    """Create the topic's empty table on first use."""
    if not lake.exists(spec.name):
        lake.create(
            spec.name,
            TOPIC_SCHEMA,
            partition_by=["partition"],
            description=f"Kafka-shaped topic, {spec.partitions} partitions",
        )


def next_offsets(lake: Lake, spec: TopicSpec) -> np.ndarray:
    """The next offset of every partition (int64 [partitions]), from the Delta file statistics."""
    ensure_topic(lake, spec)
    nxt = np.zeros(spec.partitions, dtype=np.int64)
    actions = lake.add_actions(spec.name)
    if actions.num_rows == 0:
        return nxt
    parts = actions.column("partition.partition").to_numpy(zero_copy_only=False)
    if "max.offset" not in actions.column_names:
        raise RuntimeError(f"topic {spec.name}: data files carry no offset statistics")
    maxes = actions.column("max.offset").to_numpy(zero_copy_only=False)
    for p, m in zip(parts, maxes, strict=True):
        if p < spec.partitions and m is not None and not np.isnan(m):
            nxt[int(p)] = max(nxt[int(p)], int(m) + 1)
    return nxt


@contextmanager
def topic_lock(lake: Lake, topic: str) -> Iterator[None]:
    """Serialize producers of one topic (offsets are assigned from the current end)."""
    lock_dir = lake.root / "_locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"{topic}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --- reading input lines ----------------------------------------------------------------------------


def read_chunks(stream: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Yield blocks of whole lines (each ends at a newline, except possibly the last)."""
    rest = b""
    while True:
        block = stream.read(chunk_bytes)
        if not block:
            if rest:
                yield rest
            return
        block = rest + block
        cut = block.rfind(b"\n")
        if cut < 0:
            rest = block
            continue
        yield block[: cut + 1]
        rest = block[cut + 1 :]


def split_lines(chunk: bytes) -> pa.Array:
    """The lines of a block (without their newline) as a binary array."""
    lines = pc.split_pattern(pa.array([chunk], pa.large_binary()), "\n").values
    if len(lines) and chunk.endswith(b"\n"):
        lines = lines.slice(0, len(lines) - 1)  # the empty piece after the final newline
    return lines.cast(pa.binary())


@dataclass
class ParsedLines:
    keys: pa.Array  # binary, null where there is no key
    values: pa.Array  # binary, null = tombstone


def parse_lines(
    lines: pa.Array, key_sep: str | None, null_empty: bool, source: str, first_line: int
) -> ParsedLines:
    """Split kcat-style lines into keys and values (vectorized). Raises UserError naming the first
    line that has no separator."""
    n = len(lines)
    if key_sep is None:
        keys: pa.Array = pa.nulls(n, pa.binary())
        values = lines
    else:
        parts = pc.split_pattern(lines, key_sep, max_splits=1)
        count = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(count < 2)
        if len(bad):
            line_no = first_line + int(bad[0])
            raise UserError(
                f"{source}:{line_no}: no key separator {key_sep!r} in line "
                f"{_show(lines[int(bad[0])].as_py())} ({len(bad)} such line(s) in this block)"
            )
        keys = pc.list_element(parts, 0)
        values = pc.list_element(parts, 1)
    if null_empty:
        keys = pc.if_else(pc.equal(pc.binary_length(keys), 0), pa.scalar(None, pa.binary()), keys)
        values = pc.if_else(pc.equal(pc.binary_length(values), 0), pa.scalar(None, pa.binary()), values)
    return ParsedLines(keys, values)


def _show(raw: bytes | None, limit: int = 60) -> str:
    if raw is None:
        return "NULL"
    text = repr(raw[:limit])[1:]
    return text + ("…" if len(raw) > limit else "")


def check_formats(spec: TopicSpec, parsed: ParsedLines, source: str, first_line: int) -> None:
    """Keys must be UTF-8 where the topic declares string keys; values JSON where it declares JSON."""
    if spec.key_format == "string":
        try:
            parsed.keys.cast(pa.string())
        except pa.ArrowInvalid:
            for i, key in enumerate(parsed.keys.to_pylist()):
                try:
                    if key is not None:
                        key.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise UserError(
                        f"{source}:{first_line + i}: key is not valid UTF-8 ({exc.reason} at byte "
                        f"{exc.start}): {_show(key)}; topic '{spec.name}' declares string keys"
                    ) from None
    if spec.value_format == "json":
        for i, value in enumerate(parsed.values.to_pylist()):
            if value is None:
                continue
            try:
                json.loads(value)
            except (ValueError, UnicodeDecodeError) as exc:
                raise UserError(
                    f"{source}:{first_line + i}: value is not valid JSON ({exc}): {_show(value)}; "
                    f"topic '{spec.name}' declares JSON values (use value: string for plain text)"
                ) from None


def assign_offsets(part: np.ndarray, next_offset: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Offsets for records in input order, continuing each partition's sequence (``next_offset`` is
    updated in place); also returns each partition's row mask, for splitting the batch."""
    offsets = np.empty(len(part), dtype=np.int64)
    masks = []
    for p in range(len(next_offset)):
        mask = part == p
        count = int(np.count_nonzero(mask))
        offsets[mask] = np.arange(next_offset[p], next_offset[p] + count, dtype=np.int64)
        next_offset[p] += count
        masks.append(mask)
    return offsets, masks


def record_batch(
    spec: TopicSpec,
    keys: pa.Array,
    values: pa.Array,
    part: np.ndarray,
    offsets: np.ndarray,
    timestamp_ms: int,
) -> pa.RecordBatch:
    n = len(keys)
    ts = pa.array(np.full(n, timestamp_ms * 1000, dtype=np.int64), pa.int64()).cast(
        pa.timestamp("us", tz="UTC")
    )
    headers = pa.ListArray.from_arrays(
        pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], HEADER_TYPE.value_type)
    )
    return pa.RecordBatch.from_arrays(
        [
            keys.cast(pa.binary()),
            values.cast(pa.binary()),
            pa.repeat(pa.scalar(spec.name, pa.string()), n),
            pa.array(part, pa.int32()),
            pa.array(offsets, pa.int64()),
            ts,
            pa.array(np.zeros(n, dtype=np.int32)),
            headers,
        ],
        schema=TOPIC_SCHEMA,
    )


@dataclass
class ProduceResult:
    topic: str
    records: int
    tombstones: int
    per_partition: list[int]
    version: int | None
    seconds: float


def produce_records(
    lake: Lake,
    spec: TopicSpec,
    batches: Iterable[tuple[pa.Array, pa.Array]],
    partitioner: str | None = None,
    timestamp_ms: int | None = None,
    progress: Callable[[int], None] | None = None,
    txn: Txn | None = None,
) -> ProduceResult:
    """Append (key, value) array pairs to a topic as one atomic Delta commit (skipped when ``txn``,
    an (application id, batch id) pair, is already committed).

    Partitions come from ``partitioner`` (default: the topic's, normally murmur2); offsets continue
    each partition. The input is consumed lazily and streamed into the commit; an exception raised by
    ``batches`` aborts the commit, so nothing of the call becomes visible.
    """
    started = time.perf_counter()
    partitioner = partitioners.check_partitioner(partitioner or spec.partitioner)
    ts = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
    ensure_topic(lake, spec)
    totals = {"records": 0, "tombstones": 0}

    with topic_lock(lake, spec.name):
        nxt = next_offsets(lake, spec)
        first = nxt.copy()
        round_robin = [0]

        def files() -> Iterator[tuple[dict[str, int], pa.Table]]:
            """One data file per partition per input chunk, rows in offset order."""
            for keys, values in batches:
                part = partitioners.partitions(
                    keys, spec.partitions, partitioner, round_robin_start=round_robin[0]
                )
                round_robin[0] += int(keys.null_count)
                offsets, masks = assign_offsets(part, nxt)
                totals["records"] += len(keys)
                totals["tombstones"] += values.null_count
                if progress:
                    progress(len(keys))
                table = pa.Table.from_batches([record_batch(spec, keys, values, part, offsets, ts)])
                for p, mask in enumerate(masks):
                    if mask.any():
                        yield {"partition": p}, partial(table.filter, mask)

        # keys and values are mostly unique: dictionary-encoding them only costs time
        version = lake.append_files(
            spec.name, files(), stats_columns=["offset"], dictionary_columns=["topic", "headers"], txn=txn
        )
    return ProduceResult(
        spec.name,
        totals["records"],
        totals["tombstones"],
        (nxt - first).tolist(),
        version,
        time.perf_counter() - started,
    )


def produce_lines(
    lake: Lake,
    spec: TopicSpec,
    stream: BinaryIO,
    source: str,
    key_sep: str | None = None,
    null_empty: bool = False,
    partitioner: str | None = None,
    timestamp_ms: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> ProduceResult:
    """``kcat -P -l`` into a topic: every line of ``stream`` is a record."""
    if key_sep == "":
        raise UserError("the key separator given with -K must not be empty")

    def parse(chunk: bytes, line_no: int) -> ParsedLines:
        lines = split_lines(chunk)
        parsed = parse_lines(lines, key_sep, null_empty, source, line_no)
        check_formats(spec, parsed, source, line_no)
        return parsed

    def batches() -> Iterator[tuple[pa.Array, pa.Array]]:
        # Parse the next block on a helper thread while this one is partitioned and written
        # (Arrow and numpy release the GIL); order and line numbers stay those of the input.
        with ThreadPoolExecutor(1, thread_name_prefix="parse") as pool:
            pending: Future | None = None
            line_no = 1
            for chunk in read_chunks(stream):
                nxt = pool.submit(parse, chunk, line_no)
                line_no += chunk.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)
                if pending is not None:
                    parsed = pending.result()
                    yield parsed.keys, parsed.values
                pending = nxt
            if pending is not None:
                parsed = pending.result()
                yield parsed.keys, parsed.values

    return produce_records(lake, spec, batches(), partitioner, timestamp_ms, progress)


# --- consuming --------------------------------------------------------------------------------------

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "0": "\0"}


def parse_format(fmt: str) -> list[str | tuple[str]]:
    """Split a kcat ``-f`` format into literal strings and ``(token,)`` tuples."""
    out: list[str | tuple[str]] = []
    buf: list[str] = []
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch == "\\" and i + 1 < len(fmt) and fmt[i + 1] in _ESCAPES:
            buf.append(_ESCAPES[fmt[i + 1]])
            i += 2
        elif ch == "%" and i + 1 < len(fmt):
            token = fmt[i + 1]
            if token == "%":
                buf.append("%")
            elif token in "ksKSpoTth":
                if buf:
                    out.append("".join(buf))
                    buf = []
                out.append((token,))
            else:
                raise UserError(f"unknown format token %{token} in {fmt!r} (use %k %s %K %S %p %o %T %t %h)")
            i += 2
        else:
            buf.append(ch)
            i += 1
    if buf:
        out.append("".join(buf))
    return out


def _format_records(batch: pa.RecordBatch, fmt: list[str | tuple[str]], null: bytes) -> bytes:
    cols = batch.to_pydict()
    out = bytearray()
    for i in range(batch.num_rows):
        for piece in fmt:
            if isinstance(piece, str):
                out += piece.encode()
                continue
            token = piece[0]
            if token == "k":
                k = cols["key"][i]
                out += null if k is None else k
            elif token == "s":
                v = cols["value"][i]
                out += null if v is None else v
            elif token == "K":
                k = cols["key"][i]
                out += str(-1 if k is None else len(k)).encode()
            elif token == "S":
                v = cols["value"][i]
                out += str(-1 if v is None else len(v)).encode()
            elif token == "p":
                out += str(cols["partition"][i]).encode()
            elif token == "o":
                out += str(cols["offset"][i]).encode()
            elif token == "T":
                out += str(int(cols["timestamp"][i].timestamp() * 1000)).encode()
            elif token == "t":
                out += cols["topic"][i].encode()
            elif token == "h":
                hs = cols["headers"][i] or []
                out += ",".join(
                    f"{h['key']}={(h['value'] or b'').decode('utf-8', 'replace')}" for h in hs
                ).encode()
    return bytes(out)


def consume(
    lake: Lake,
    spec: TopicSpec,
    out: BinaryIO,
    fmt: str = "%s\\n",
    start: str = "beginning",
    count: int | None = None,
    partition: int | None = None,
    null_as: bytes = b"",
) -> int:
    """Write the topic's records in partition, offset order; returns how many were written.

    ``start``: ``beginning``, ``end``, an absolute offset ``N`` (per partition) or ``-N`` (the last N
    of every partition), as kcat's ``-o``."""
    import pyarrow.dataset as pads

    pieces = parse_format(fmt)
    ensure_topic(lake, spec)
    if partition is not None and not 0 <= partition < spec.partitions:
        raise UserError(f"topic '{spec.name}' has partitions 0..{spec.partitions - 1}, not {partition}")
    nxt = next_offsets(lake, spec)
    written = 0
    wanted = [partition] if partition is not None else range(spec.partitions)
    for p in wanted:
        first = _start_offset(start, int(nxt[p]))
        if first >= nxt[p]:
            continue
        flt = (pads.field("partition") == p) & (pads.field("offset") >= first)
        table = lake.read_arrow(spec.name, filter=flt).sort_by("offset")
        if count is not None:
            table = table.slice(0, count - written)
        for batch in table.to_batches(max_chunksize=10_000):
            out.write(_format_records(batch, pieces, null_as))
        written += table.num_rows
        if count is not None and written >= count:
            break
    out.flush()
    return written


def _start_offset(start: str, end: int) -> int:
    if start == "beginning":
        return 0
    if start == "end":
        return end
    try:
        value = int(start)
    except ValueError:
        raise UserError(f"bad start offset {start!r} (use beginning, end, N, or -N for the last N)") from None
    return max(end + value, 0) if value < 0 else value


def open_input(path: str | None) -> tuple[BinaryIO, str]:
    """An input file (or stdin for None / ``-``) and its name for error messages."""
    if path is None or path == "-":
        return sys.stdin.buffer, "<stdin>"
    try:
        return open(path, "rb"), path  # noqa: SIM115 - closed by the caller
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot open: {exc.strerror}") from None
