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


ALIASES = {"murmur2_random": MURMUR2}  # librdkafka's (and kcat's) name of the Java placement
LIBRDKAFKA = {MURMUR2: "murmur2_random", CONSISTENT_RANDOM: "consistent_random"}


def check_partitioner(name: str) -> str:
    """The product's name of a partitioner (``murmur2`` or ``consistent_random``); librdkafka's
    ``murmur2_random`` is accepted for ``murmur2``."""
    name = ALIASES.get(name, name)
    if name not in NAMES:
        from spark_jobs.errors import UserError

        raise UserError(
            f"unknown partitioner '{name}' (use one of: murmur2_random (murmur2), consistent_random)"
        )
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


def _as_binary(arr: pa.Array) -> pa.Array:
    """Any binary-like Arrow array as ``binary``/``large_binary`` (one chunk)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_string(t):
        return arr.cast(pa.binary())
    if pa.types.is_large_string(t) or pa.types.is_binary_view(t) or pa.types.is_string_view(t):
        return arr.cast(pa.large_binary())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return arr
    raise TypeError(f"keys must be a binary or string array, got {t}")


def _lengths(arr: pa.Array) -> np.ndarray:
    """Byte length of every key (nulls count as empty)."""
    return pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _by_length(arr: pa.Array, lengths: np.ndarray):
    """Yield (row indexes or None for all rows, bytes matrix [rows x L]) per distinct key length L.

    The matrix comes from Arrow itself (take, then cast to fixed_size_binary(L)): one contiguous copy
    of the key bytes, no index arithmetic in Python."""
    present = np.flatnonzero(np.bincount(lengths))
    for length in present:
        if len(present) == 1:
            idx, sub = None, arr
        else:
            idx = np.flatnonzero(lengths == length)
            sub = arr.take(pa.array(idx))
        n = len(sub)
        if length == 0:
            yield idx, np.zeros((n, 0), dtype=np.uint8)
            continue
        fixed = sub.cast(pa.binary(int(length)))
        flat = np.frombuffer(fixed.buffers()[1], dtype=np.uint8)
        start = fixed.offset * int(length)
        yield idx, flat[start : start + n * int(length)].reshape(n, int(length))


def murmur2_array(keys: pa.Array) -> np.ndarray:
    """Vectorized :func:`murmur2` (int32 per key; nulls hash as empty keys)."""
    arr = _as_binary(keys)
    lengths = _lengths(arr)
    out = np.empty(len(arr), dtype=np.uint32)
    m = np.uint32(_M)
    with np.errstate(over="ignore"):
        for idx, mat in _by_length(arr, lengths):
            length = mat.shape[1]
            h = np.full(mat.shape[0], (_SEED ^ length) & _MASK32, dtype=np.uint32)
            nblocks = length // 4
            if nblocks:
                words = np.ascontiguousarray(mat[:, : 4 * nblocks]).view("<u4")
                for b in range(nblocks):
                    k = words[:, b] * m
                    k ^= k >> np.uint32(24)
                    k *= m
                    h *= m
                    h ^= k
            rem = length - 4 * nblocks
            base = 4 * nblocks
            if rem == 3:
                h ^= mat[:, base + 2].astype(np.uint32) << np.uint32(16)
            if rem >= 2:
                h ^= mat[:, base + 1].astype(np.uint32) << np.uint32(8)
            if rem >= 1:
                h ^= mat[:, base].astype(np.uint32)
                h *= m
            h ^= h >> np.uint32(13)
            h *= m
            h ^= h >> np.uint32(15)
            if idx is None:
                out[:] = h
            else:
                out[idx] = h
    return out.view(np.int32)


def crc32_array(keys: pa.Array) -> np.ndarray:
    """Vectorized :func:`crc32` (uint32 per key; nulls hash as empty keys)."""
    arr = _as_binary(keys)
    lengths = _lengths(arr)
    out = np.empty(len(arr), dtype=np.uint32)
    for idx, mat in _by_length(arr, lengths):
        c = np.full(mat.shape[0], 0xFFFFFFFF, dtype=np.uint32)
        for j in range(mat.shape[1]):
            c = _CRC_TABLE[(c ^ mat[:, j]) & 0xFF] ^ (c >> np.uint32(8))
        c ^= np.uint32(0xFFFFFFFF)
        if idx is None:
            out[:] = c
        else:
            out[idx] = c
    return out


def partitions(
    keys: pa.Array, num_partitions: int, partitioner: str = MURMUR2, round_robin_start: int = 0
) -> np.ndarray:
    """Partition (int32) of every key, vectorized. Unhashable keys (see module doc) go round-robin,
    numbered from ``round_robin_start`` so that successive chunks continue the rotation."""
    check_partitioner(partitioner)
    arr = _as_binary(keys)
    valid = (
        np.ones(len(arr), dtype=bool)
        if arr.null_count == 0
        else pc.is_valid(arr).to_numpy(zero_copy_only=False)
    )
    if partitioner == MURMUR2:
        part = (murmur2_array(arr).view(np.uint32) & np.uint32(0x7FFFFFFF)) % np.uint32(num_partitions)
        unhashable = ~valid
    else:
        part = crc32_array(arr) % np.uint32(num_partitions)
        unhashable = ~valid | (_lengths(arr) == 0)
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
    @F.arrow_udf("int")  # type: ignore[misc, call-overload]
    def _place(keys: pa.Array) -> pa.Array:
        return pa.array(partitions(keys, num_partitions, partitioner), type=pa.int32())

    return _place(key_col)
