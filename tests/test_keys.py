"""Key hygiene rules: each rule's Arrow form (lake diagnose) flags exactly the keys its Spark SQL form
(the key_format check) flags, and keys are shown as a person reads them."""

import pyarrow as pa
import pytest

from spark_jobs.topics.keys import RULES, hex_dump, show

KEYS = [
    b"user_1",
    b"\xff\xfeuser",  # not UTF-8
    b"\x00\x00\x00\x00\x07user_1",  # Schema Registry framing
    b"\x00ab",  # a NUL first, too short for framing: a control character
    "\ufeffuser_1".encode(),
    b'"user_1"',
    b'"',  # one quote is not quoted
    b" user_1",
    b"user_1\r\n",
    b"us\x07er",
    None,
]
FLAGGED = {  # rule -> indexes of KEYS it flags
    "not_utf8": {1},
    "framed": {2},
    "bom": {4},
    "quoted": {5},
    "whitespace": {7, 8},
    "control": {2, 3, 8, 9},
}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_each_rule_flags_exactly_its_keys(rule):
    flags = rule.arrow(pa.array(KEYS, pa.binary()))
    assert {i for i, f in enumerate(flags) if f} == FLAGGED[rule.name]


@pytest.mark.slow
def test_the_sql_form_agrees_with_the_arrow_form(spark):
    df = spark.createDataFrame([(i, k) for i, k in enumerate(KEYS)], "i int, key binary")
    for rule in RULES:
        got = {r.i for r in df.where(rule.sql).select("i").collect()}
        assert got == FLAGGED[rule.name], rule.name


def test_keys_shown_as_a_person_reads_them():
    assert show(b"user_1") == "user_1"
    assert show(b" user_1") == "' user_1'"
    assert show("\ufeffuser_1".encode()) == "'\\ufeffuser_1'"
    assert show(b"\xff\xfe") == "ff fe | .."
    assert hex_dump(b"user_1") == "75 73 65 72 5f 31 | user_1"
    assert hex_dump(b"x" * 40, limit=4) == "78 78 78 78 | xxxx (+36 bytes)"


PLAIN = [  # a key, and what it was probably meant to be
    (b"user_1", b"user_1"),
    ("\ufeffuser_1".encode(), b"user_1"),
    (b'"user_1"', b"user_1"),
    (b' " user_1 " \r\n', b"user_1"),
    (b"us\x07er_1\t", b"user_1"),
    ('\ufeff"user_1"'.encode(), b"user_1"),
    (b'"', b'"'),
    (b"", b""),
]


@pytest.mark.slow
def test_a_key_without_its_invisible_bytes_is_one_rule_in_spark_and_in_python(spark):
    """The completeness check's near keys and the backfill's quarantine (Spark) and ``lake explain``
    (Python) name the same key a key was meant to be."""
    from pyspark.sql import functions as F

    from spark_jobs.topics.keys import plain_key, plain_key_sql

    assert [plain_key(key) for key, _ in PLAIN] == [want for _, want in PLAIN]
    df = spark.createDataFrame([(i, k) for i, (k, _) in enumerate(PLAIN)], "i int, key binary")
    rows = df.select("i", F.encode(F.expr(plain_key_sql("key")), "UTF-8").alias("plain")).collect()
    assert [bytes(r["plain"]) for r in sorted(rows, key=lambda r: r["i"])] == [want for _, want in PLAIN]
