"""kcat's two verbs on Kafka topics: ``lake produce`` and ``lake consume``.

``produce`` follows ``kcat -P -l``: one record per line, ``-K SEP`` splits the key off at the first
SEP, ``-Z`` sends empty keys/values as null; a byte-order mark at the input's start and the CR of
CRLF line ends are dropped (as backfill dumps drop them), unlike kcat. Lines are split and checked
with Arrow compute (keys UTF-8 where the topic declares string keys, values JSON where it declares
JSON), a block at a time on a helper thread, and produced through the Kafka seam as one
transaction: a bad line anywhere aborts the whole call before anything becomes visible to
``read_committed`` readers. A ``--timestamp`` outside what the topic accepts is refused first.

``consume`` follows ``kcat -C -e -f``: records in partition, offset order up to the end, formatted
with ``%k %s %p %o %T %t`` (and ``%K %S`` for lengths, ``%h`` for headers) and the escapes
``\\n \\t \\r \\\\``.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import BinaryIO, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.config import TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.formats import Codec, DecodeError, TextError, unregistered_codecs
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import Cluster, Delivered, Message, produce, producer_id, read

CHUNK_BYTES = 16 * 1024 * 1024  # ~500k dump lines: small enough to overlap parsing and producing


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


BOM = b"\xef\xbb\xbf"


def without_line_end_marks(lines: pa.Array, first: bool) -> pa.Array:
    """The lines as a text editor means them, as backfill dumps read them: a UTF-8 byte-order mark
    before the input's first line and the CR of CRLF line ends are not part of any key or value."""
    if first and len(lines) and lines[0].as_py().startswith(BOM):
        lines = pa.concat_arrays([pa.array([lines[0].as_py()[3:]], pa.binary()), lines.slice(1)])
    crlf = pc.ends_with(lines, pattern="\r")
    if pc.any(crlf).as_py():
        lines = pc.if_else(crlf, pc.binary_slice(lines, 0, -1), lines)
    return lines


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


def encode_lines(
    spec: TopicSpec, parsed: ParsedLines, codecs: tuple[Codec, Codec], source: str, first_line: int
) -> ParsedLines:
    """The lines' key and value texts as records of the topic's formats (a string key must be UTF-8,
    a JSON value JSON, a registry format's text is encoded and framed with the subject's schema); a
    line that does not fit is an error naming it and why, and nothing is sent."""
    out = []
    for part, codec, texts in (("key", codecs[0], parsed.keys), ("value", codecs[1], parsed.values)):
        try:
            out.append(codec.encode_texts(texts))
        except TextError as exc:
            raise UserError(
                f"{source}:{first_line + exc.index}: {part} {exc}: {_show(texts[exc.index].as_py())}; "
                f"topic '{spec.name}' declares {codec.name} {part}s, nothing was sent"
            ) from None
    return ParsedLines(out[0], out[1])


def produce_lines(
    cluster: Cluster,
    spec: TopicSpec,
    stream: BinaryIO,
    source: str,
    key_sep: str | None = None,
    null_empty: bool = False,
    partitioner: str | None = None,
    timestamp_ms: int | None = None,
    progress: Callable[[int], None] | None = None,
    transactional_id: str | None = None,
    codecs: tuple[Codec, Codec] | None = None,
) -> Delivered:
    """``kcat -P -l`` into a topic: every line of ``stream`` is a record, all in one transaction.
    ``codecs`` (key, value, :meth:`spark_jobs.formats.Formats.writing`): a Schema Registry format's
    lines are JSON, encoded and framed here (what kafka-avro-console-producer does); without them the
    topic's formats must not be a registry's."""
    if key_sep == "":
        raise UserError("the key separator given with -K must not be empty")
    codecs = codecs or unregistered_codecs(spec)

    def parse(chunk: bytes, line_no: int) -> ParsedLines:
        lines = without_line_end_marks(split_lines(chunk), first=line_no == 1)
        parsed = parse_lines(lines, key_sep, null_empty, source, line_no)
        return encode_lines(spec, parsed, codecs, source, line_no)

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

    return produce(
        cluster, spec, batches(), partitioner, timestamp_ms, progress, transactional_id=transactional_id
    )


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
            elif token in "ksKSpoTthiI":
                if buf:
                    out.append("".join(buf))
                    buf = []
                out.append((token,))
            else:
                raise UserError(
                    f"unknown format token %{token} in {fmt!r} (use %k %s %K %S %p %o %T %t %h %i %I)"
                )
            i += 2
        else:
            buf.append(ch)
            i += 1
    if buf:
        out.append("".join(buf))
    return out


class Rendering:
    """How ``lake consume`` prints keys and values: as they are (``raw``, and the formats without a
    registry), or decoded to JSON by the topic's codecs (a record that does not decode is printed as
    it is, and counted with its first reason)."""

    def __init__(self, codecs: tuple[Codec, Codec] | None = None, raw: bool = False):
        self.codecs = None if raw else codecs
        self.undecodable = 0
        self.first: str | None = None

    def __call__(self, part: int, raw: bytes, m: Message) -> bytes:
        if self.codecs is None:
            return raw
        try:
            return self.codecs[part].render(raw)
        except DecodeError as exc:
            self.undecodable += 1
            if self.first is None:
                self.first = f"partition {m.partition()} offset {m.offset()} {('key', 'value')[part]}: {exc}"
            return raw

    def schema_id(self, raw: bytes | None) -> bytes:
        """``%i`` / ``%I``: the schema id of a framed record, else ``-``."""
        return (
            str(struct.unpack(">I", raw[1:5])[0]).encode() if raw and len(raw) >= 5 and raw[0] == 0 else b"-"
        )


def _format_records(
    messages: list[Message], fmt: list[str | tuple[str]], null: bytes, render: Rendering
) -> bytes:
    out = bytearray()
    for m in messages:
        for piece in fmt:
            if isinstance(piece, str):
                out += piece.encode()
                continue
            token = piece[0]
            if token == "k":
                k = m.key()
                out += null if k is None else render(0, k, m)
            elif token == "s":
                v = m.value()
                out += null if v is None else render(1, v, m)
            elif token == "i":
                out += render.schema_id(m.value())
            elif token == "I":
                out += render.schema_id(m.key())
            elif token == "K":
                k = m.key()
                out += str(-1 if k is None else len(k)).encode()
            elif token == "S":
                v = m.value()
                out += str(-1 if v is None else len(v)).encode()
            elif token == "p":
                out += str(m.partition()).encode()
            elif token == "o":
                out += str(m.offset()).encode()
            elif token == "T":
                out += str(m.timestamp()[1]).encode()
            elif token == "t":
                out += (m.topic() or "").encode()
            elif token == "h":
                hs = cast(list[tuple[str, bytes | None]], m.headers() or [])
                out += ",".join(f"{k}={(v or b'').decode('utf-8', 'replace')}" for k, v in hs).encode()
    return bytes(out)


def consume(
    cluster: Cluster,
    spec: TopicSpec,
    out: BinaryIO,
    fmt: str = "%s\\n",
    start: str = "beginning",
    count: int | None = None,
    partition: int | None = None,
    null_as: bytes = b"",
    render: Rendering | None = None,
) -> int:
    """Write the topic's committed records, partition by partition in offset order, up to the end as
    the call starts (kcat ``-C -e``); returns how many were written. ``render``: how keys and values
    are printed (default: as they are).

    ``start``: ``beginning``, ``end``, an absolute offset ``N`` (per partition) or ``-N`` (the last N
    of every partition), as kcat's ``-o``."""
    pieces = parse_format(fmt)
    if partition is not None and not 0 <= partition < spec.partitions:
        raise UserError(f"topic '{spec.name}' has partitions 0..{spec.partitions - 1}, not {partition}")
    _start_offset(start, 0, 0)  # a bad -o is an error before anything is read
    written = 0
    wanted = None if partition is None else [partition]
    for messages in read(cluster, spec, lambda low, high: _start_offset(start, low, high), wanted):
        if count is not None:
            messages = messages[: count - written]
        out.write(_format_records(messages, pieces, null_as, render or Rendering()))
        written += len(messages)
        if count is not None and written >= count:
            break
    out.flush()
    return written


def _start_offset(start: str, low: int, high: int) -> int:
    if start == "beginning":
        return low
    if start == "end":
        return high
    try:
        value = int(start)
    except ValueError:
        raise UserError(f"bad start offset {start!r} (use beginning, end, N, or -N for the last N)") from None
    return max(high + value, low) if value < 0 else value


@contextmanager
def producing(lake: Lake, topic: str, exclusive: bool = False, log=lambda _: None) -> Iterator[str]:
    """The topic's producer lock ``<root>/_locks/topic-<topic>.lock``: the product's producers hold it
    shared, ``lake topic repartition`` exclusively while it replaces the topic, so a produce that runs
    at the same time waits and is never lost. (It serializes processes on one machine; producers
    outside the product do not take it.)

    Yields the transactional id to produce with: the first free producer slot of the topic
    (``topic-<topic>.producer<N>.lock``), so concurrent producers get distinct ids and the next one
    after a crash reuses the dead one's, which aborts its open transaction at once."""
    with lake.lock(f"topic-{topic}", log, shared=not exclusive), ExitStack() as slots:
        slot = 0
        while not slots.enter_context(lake.lock(f"topic-{topic}.producer{slot}", wait=False)):
            slot += 1
        yield producer_id(lake.root, topic, str(slot))


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
