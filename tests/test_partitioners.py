"""Partitioners are bit-exact against public test vectors, and the vectorized kernels (numpy, Spark
Arrow UDF) agree with the scalar reference on arbitrary keys."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.seams import partitioners as P

# librdkafka src/rdmurmur2.c unittest_murmur2 (expected values computed with the Java client).
LIBRDKAFKA_MURMUR2 = {
    b"kafka": 0xD067CF64,
    b"giberish123456789": 0x8F552B0C,
    b"1234": 0x9FC97B14,
    b"234": 0xE7C009CA,
    b"34": 0x873930DA,
    b"4": 0x5A4B5CA1,
    b"PreAmbleWillBeRemoved,ThePrePartThatIs": 0x78424F1C,
    b"reAmbleWillBeRemoved,ThePrePartThatIs": 0x4A62B377,
    b"eAmbleWillBeRemoved,ThePrePartThatIs": 0xE0E4E09E,
    b"AmbleWillBeRemoved,ThePrePartThatIs": 0x62B8B43F,
    b"": 0x106E08D9,
}
# librdkafka tests/0048-partitioner.c: crc32 ("consistent") and positive (& 0x7fffffff) murmur2 hashes
# of its message keys.
LIBRDKAFKA_0048 = [
    (b"23456", 0xB1B451D7, 0x058D780F),
    (b"this is another string with more length to it perhaps", 0xB0150DF7, 0x4F7703DA),
    (b"hejsan", 0xD077037E, 0x5EC19395),
]
# kafka-python test_partitioner.py: Java DefaultPartitioner placement over 1000 partitions.
JAVA_PLACEMENT_1000 = {b"": 681, b"a": 524, b"ab": 434, b"abc": 107, b"123456789": 566, b"\x00 ": 742}


@pytest.mark.parametrize("key,expected", LIBRDKAFKA_MURMUR2.items())
def test_murmur2_matches_librdkafka_vectors(key, expected):
    assert P.murmur2(key) & 0xFFFFFFFF == expected


def test_murmur2_matches_kafka_utils_test():
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2
    assert P.murmur2(b"21") == -973932308


@pytest.mark.parametrize("key,crc,murmur", LIBRDKAFKA_0048)
def test_0048_partitioner_vectors(key, crc, murmur):
    assert P.crc32(key) == crc
    assert P.murmur2(key) & 0x7FFFFFFF == murmur
    for parts in (7, 17):  # the test's partition counts
        assert P.partition_for(key, parts, "consistent_random") == crc % parts
        assert P.partition_for(key, parts, "murmur2") == murmur % parts


def test_crc32_check_value():
    assert P.crc32(b"123456789") == 0xCBF43926


@pytest.mark.parametrize("key,partition", JAVA_PLACEMENT_1000.items())
def test_java_default_partitioner_placement(key, partition):
    assert P.partition_for(key, 1000, "murmur2") == partition


def test_vectorized_kernels_match_vectors():
    keys = list(LIBRDKAFKA_MURMUR2)
    got = P.murmur2_array(pa.array(keys, pa.binary())).view(np.uint32).tolist()
    assert got == list(LIBRDKAFKA_MURMUR2.values())
    crc_keys = [k for k, _, _ in LIBRDKAFKA_0048] + [b"123456789"]
    assert P.crc32_array(pa.array(crc_keys)).tolist() == [c for _, c, _ in LIBRDKAFKA_0048] + [0xCBF43926]
    placed = P.partitions(pa.array(list(JAVA_PLACEMENT_1000)), 1000, "murmur2").tolist()
    assert placed == list(JAVA_PLACEMENT_1000.values())


def test_unhashable_keys_go_round_robin():
    keys = pa.array([None, b"", None, b"a", None], pa.binary())
    # murmur2 hashes empty keys (Java does); only nulls rotate: 0, 1, 2 -> partitions 0, 1, 2
    m = P.partitions(keys, 3, "murmur2").tolist()
    assert [m[0], m[2], m[4]] == [0, 1, 2]
    assert m[1] == P.partition_for(b"", 3, "murmur2")
    # librdkafka's consistent_random treats empty keys like nulls (random)
    c = P.partitions(keys, 3, "consistent_random", round_robin_start=1).tolist()
    assert [c[0], c[1], c[2], c[4]] == [1, 2, 0, 1]
    assert c[3] == zlib.crc32(b"a") % 3


def test_string_and_sliced_arrays():
    keys = pa.array(["user_1", "user_22", "ü"])
    expected = [P.partition_for(k.encode(), 5) for k in ["user_1", "user_22", "ü"]]
    assert P.partitions(keys, 5).tolist() == expected
    sliced = pa.array([b"x", b"user_1", b"user_22"]).slice(1)
    assert P.partitions(sliced, 5).tolist() == expected[:2]


def test_unknown_partitioner_is_a_user_error():
    from spark_jobs.errors import UserError

    with pytest.raises(UserError, match="unknown partitioner 'random'"):
        P.partitions(pa.array([b"a"]), 3, "random")


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.binary(max_size=40), min_size=1, max_size=60),
    parts=st.integers(min_value=1, max_value=300),
)
def test_vectorized_equals_scalar(keys, parts):
    arr = pa.array(keys, pa.binary())
    assert P.murmur2_array(arr).tolist() == [P.murmur2(k) for k in keys]
    assert P.crc32_array(arr).tolist() == [zlib.crc32(k) for k in keys]
    assert P.partitions(arr, parts, "murmur2").tolist() == [
        P.partition_for(k, parts, "murmur2") for k in keys
    ]
    hashed = [P.partition_for(k, parts, "consistent_random") for k in keys]
    vec = P.partitions(arr, parts, "consistent_random").tolist()
    assert [v for v, h in zip(vec, hashed, strict=True) if h is not None] == [
        h for h in hashed if h is not None
    ]


def test_spark_arrow_udf_agrees_with_scalar(spark):
    keys = [f"user_{i}".encode() for i in range(500)] + [b"", b"\x00\x01", "ü".encode()]
    df = spark.createDataFrame([(k,) for k in keys], "key binary")
    for name in P.NAMES:
        rows = df.select("key", P.spark_partition(df.key, 12, name).alias("p")).collect()
        got = {bytes(r.key): r.p for r in rows}
        for k in keys:
            expected = P.partition_for(k, 12, name)
            if expected is not None:
                assert got[k] == expected, (name, k)


_examples = iter(range(10**6))


@settings(max_examples=8, deadline=None)
@given(
    keys=st.lists(
        st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode)),
        min_size=1,
        max_size=60,
        unique=True,
    ),
    partitions=st.integers(min_value=1, max_value=17),
)
def test_placements_on_the_broker_equal_the_vectorized_partitioners(keys, partitions):
    """librdkafka's murmur2_random and consistent_random, producing to the real broker, put every key
    where the product's vectorized partitioners say (empty keys are random under consistent_random,
    so that one gets only non-empty keys)."""
    from pathlib import Path

    from spark_jobs.config import PipelineConfig, TopicSpec
    from spark_jobs.seams.kafka import connect, produce, read

    n = next(_examples)
    for partitioner in ("murmur2", "consistent_random"):
        sent = [k for k in keys if k or partitioner == "murmur2"]
        if not sent:
            continue
        spec = TopicSpec(
            f"placement-{n}-{partitioner}", partitions, key_format="bytes", value_format="string"
        )
        cluster = connect(PipelineConfig("test", "test"), Path("."))  # the session's broker
        produce(cluster, spec, [(pa.array(sent, pa.binary()), pa.array([b"v"] * len(sent)))], partitioner)
        placed = {m.key(): m.partition() for batch in read(cluster, spec) for m in batch}
        expected = P.partitions(pa.array(sent, pa.binary()), partitions, partitioner)
        assert placed == dict(zip(sent, expected.tolist(), strict=True))
