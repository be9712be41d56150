"""Kafka partitioners, bit-exact: the Java client's murmur2 and librdkafka's consistent_random (CRC32).

Two implementations of each, which the tests hold equal:
  - scalar (``murmur2``, ``crc32``, ``partition_for``): one key at a time, the reference;
  - vectorized over Arrow binary arrays (``partitions``): numpy over the Arrow buffers, no per-record
    Python, used for bulk loads; ``spark_partition`` wraps it as a Spark Arrow UDF.

Placement rules
  - ``murmur2``: ``(murmur2(key) & 0x7fffffff) % n`` with Kafka's seed 0x9747b28c: the Java producer,
    Kafka Streams, ksqlDB, and librdkafka's ``murmur2_random``.
  - ``consistent_random``: ``crc32(key) % n``: librdkafka's default (kcat, confluent-kafka-python).
  - Keys with no bytes to hash get a *random* partition in the clients (null keys everywhere; empty keys
    too under ``consistent_random``). Random cannot be reproduced, so here they are spread round-robin in
    input order, which is deterministic and balanced like the clients' placement.
"""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MURMUR2 = "murmur2"
CONSISTENT_RANDOM = "consistent_random"
NAMES = (MURMUR2, CONSISTENT_RANDOM)

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def _to_int32(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2(key: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit int, exactly as the Java client returns it."""
    length = len(key)
    h = (_SEED ^ length) & _MASK32
    nblocks = length // 4
    for i in range(nblocks):
        k = int.from_bytes(key[4 * i : 4 * i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = key[4 * nblocks :]
    rem = len(tail)
    if rem == 3:
        h ^= tail[2] << 16
    if rem >= 2:
        h ^= tail[1] << 8
    if rem >= 1:
        h ^= tail[0]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return _to_int32(h)


def crc32(key: bytes) -> int:
    """CRC-32 (IEEE 802.3, as librdkafka's ``rd_crc32``), unsigned."""
    return zlib.crc32(key) & _MASK32


def check_partitioner(name: str) -> str:
    if name not in NAMES:
        from spark_jobs.errors import UserError

        raise UserError(f"unknown partitioner '{name}' (use one of: {', '.join(NAMES)})")
    return name


def partition_for(key: bytes | None, num_partitions: int, partitioner: str = MURMUR2) -> int | None:
    """Partition of one key, or None where the clients would pick a random partition."""
    if key is None:
        return None
    if partitioner == MURMUR2:
        return (murmur2(key) & 0x7FFFFFFF) % num_partitions
    if partitioner == CONSISTENT_RANDOM:
        return None if len(key) == 0 else crc32(key) % num_partitions
    check_partitioner(partitioner)
    raise AssertionError("unreachable")


# --- vectorized -------------------------------------------------------------------------------------


def _make_crc_table() -> np.ndarray:
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table[i] = c
    return table


_CRC_TABLE = _make_crc_table()


def _binary_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets as int64 [n+1], data bytes as uint8, validity as bool [n]) of a binary-like array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary())
    elif pa.types.is_binary_view(arr.type) or pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.large_binary())
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        raise TypeError(f"keys must be a binary or string array, got {arr.type}")
    n = len(arr)
    bufs = arr.buffers()
    off_type = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(bufs[1], dtype=off_type, count=n + 1 + arr.offset)[arr.offset :]
    offsets = offsets.astype(np.int64, copy=False)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    valid = np.ones(n, dtype=bool) if arr.null_count == 0 else pc.is_valid(arr).to_numpy(zero_copy_only=False)
    return offsets, data, valid


def _by_length(offsets: np.ndarray, data: np.ndarray, rows: np.ndarray):
    """Yield (row indexes, bytes matrix [rows x L]) for each distinct key length L among ``rows``."""
    lengths = offsets[1:] - offsets[:-1]
    sub_len = lengths[rows]
    for length in np.unique(sub_len):
        idx = rows[sub_len == length]
        if length == 0:
            yield idx, np.zeros((len(idx), 0), dtype=np.uint8)
        else:
            starts = offsets[:-1][idx]
            yield idx, data[starts[:, None] + np.arange(length)[None, :]]


def murmur2_array(keys: pa.Array) -> np.ndarray:
    """Vectorized :func:`murmur2` (int32 per key; nulls hash as empty keys)."""
    offsets, data, _ = _binary_buffers(keys)
    out = np.empty(len(offsets) - 1, dtype=np.uint32)
    m = np.uint32(_M)
    with np.errstate(over="ignore"):
        for idx, mat in _by_length(offsets, data, np.arange(len(out))):
            length = mat.shape[1]
            h = np.full(len(idx), (_SEED ^ length) & _MASK32, dtype=np.uint32)
            nblocks = length // 4
            w = mat.astype(np.uint32)
            for b in range(nblocks):
                j = 4 * b
                k = w[:, j] | (w[:, j + 1] << 8) | (w[:, j + 2] << 16) | (w[:, j + 3] << 24)
                k = k * m
                k ^= k >> np.uint32(24)
                k = k * m
                h = h * m
                h ^= k
            rem = length - 4 * nblocks
            base = 4 * nblocks
            if rem == 3:
                h ^= w[:, base + 2] << 16
            if rem >= 2:
                h ^= w[:, base + 1] << 8
            if rem >= 1:
                h ^= w[:, base]
                h = h * m
            h ^= h >> np.uint32(13)
            h = h * m
            h ^= h >> np.uint32(15)
            out[idx] = h
    return out.view(np.int32)


def crc32_array(keys: pa.Array) -> np.ndarray:
    """Vectorized :func:`crc32` (uint32 per key; nulls hash as empty keys)."""
    offsets, data, _ = _binary_buffers(keys)
    out = np.empty(len(offsets) - 1, dtype=np.uint32)
    for idx, mat in _by_length(offsets, data, np.arange(len(out))):
        c = np.full(len(idx), 0xFFFFFFFF, dtype=np.uint32)
        for j in range(mat.shape[1]):
            c = _CRC_TABLE[(c ^ mat[:, j]) & 0xFF] ^ (c >> np.uint32(8))
        out[idx] = c ^ np.uint32(0xFFFFFFFF)
    return out


def partitions(
    keys: pa.Array, num_partitions: int, partitioner: str = MURMUR2, round_robin_start: int = 0
) -> np.ndarray:
    """Partition (int32) of every key, vectorized. Unhashable keys (see module doc) go round-robin,
    numbered from ``round_robin_start`` so that successive chunks continue the rotation."""
    check_partitioner(partitioner)
    offsets, _, valid = _binary_buffers(keys)
    if partitioner == MURMUR2:
        part = (murmur2_array(keys).view(np.uint32) & np.uint32(0x7FFFFFFF)) % np.uint32(num_partitions)
        unhashable = ~valid
    else:
        part = crc32_array(keys) % np.uint32(num_partitions)
        unhashable = ~valid | ((offsets[1:] - offsets[:-1]) == 0)
    part = part.astype(np.int32)
    if unhashable.any():
        count = int(unhashable.sum())
        part[unhashable] = (np.arange(count) + round_robin_start) % num_partitions
    return part


def spark_partition(key_col, num_partitions: int, partitioner: str = MURMUR2):
    """A Spark Column with the partition of ``key_col`` (binary), computed by the vectorized kernel
    inside an Arrow UDF, so bulk jobs place records exactly as :func:`partition_for` does."""
    from pyspark.sql import functions as F

    check_partitioner(partitioner)

    # Unhashable keys rotate within each Arrow batch here (placement of hashable keys is exact).
    @F.arrow_udf("int")  # type: ignore[misc]
    def _place(keys: pa.Array) -> pa.Array:
        return pa.array(partitions(keys, num_partitions, partitioner), type=pa.int32())

    return _place(key_col)
