"""Topics: kcat-style produce and consume, offsets, tombstones, placement, atomicity."""

from __future__ import annotations

import io
import zlib

import pytest

from spark_jobs.config import TopicSpec
from spark_jobs.errors import UserError
from spark_jobs.partitioners import partition_for
from spark_jobs.topics import consume, next_offsets, parse_format, produce_lines

SPEC = TopicSpec("t", partitions=3, key_format="string", value_format="string")


def produce(lake, text: bytes, spec=SPEC, **kw):
    return produce_lines(lake, spec, io.BytesIO(text), "input.txt", **kw)


def dump(lake, spec=SPEC, fmt="%k|%s|%p|%o\\n", **kw) -> str:
    out = io.BytesIO()
    consume(lake, spec, out, fmt=fmt, **kw)
    return out.getvalue().decode()


def test_produce_consume_round_trip_with_offsets_per_partition(lake):
    res = produce(lake, b"a;1\nb;2\nc;3\na;4\n", key_sep=";", timestamp_ms=1_000)
    assert res.records == 4 and res.version == 1
    res2 = produce(lake, b"b;5\n", key_sep=";", timestamp_ms=2_000)
    assert res2.version == 2
    expected = []
    offsets = [0, 0, 0]
    for key, value in [("a", "1"), ("b", "2"), ("c", "3"), ("a", "4"), ("b", "5")]:
        p = partition_for(key.encode(), 3)
        expected.append((p, offsets[p], key, value))
        offsets[p] += 1
    lines = [f"{k}|{v}|{p}|{o}" for p, o, k, v in sorted(expected)]
    assert dump(lake).splitlines() == lines
    assert next_offsets(lake, SPEC).tolist() == offsets
    assert dump(lake, fmt="%t %T %K %S\\n", count=1) == "t 1000 1 1\n"


def test_tombstones_null_keys_and_escapes(lake):
    produce(lake, b"k;\n;v\nx;y\n", key_sep=";", null_empty=True)
    got = sorted(dump(lake, fmt="%k,%s,%K,%S\\n", null_as=b"NULL").splitlines())
    assert got == ["NULL,v,-1,1", "k,NULL,1,-1", "x,y,1,1"]
    assert parse_format("%k\\t%s\\\\%%\\n") == [("k",), "\t", ("s",), "\\%\n"]


def test_without_key_separator_every_line_is_a_value(lake):
    produce(lake, b"plain;text\nsecond\n")
    assert sorted(dump(lake, fmt="%K:%s\\n").splitlines()) == ["-1:plain;text", "-1:second"]


def test_consume_start_offsets_count_and_partition(lake):
    keys = [f"user_{i}" for i in range(30)]
    produce(lake, "".join(f"{k};{i}\n" for i, k in enumerate(keys)).encode(), key_sep=";")
    per_part = {p: [k for k in keys if partition_for(k.encode(), 3) == p] for p in range(3)}
    assert dump(lake, fmt="%k\\n", partition=1).split() == per_part[1]
    assert dump(lake, fmt="%k\\n", partition=1, start="2").split() == per_part[1][2:]
    assert dump(lake, fmt="%k\\n", start="-1").split() == [per_part[p][-1] for p in range(3)]
    assert dump(lake, fmt="%k\\n", start="end") == ""
    assert dump(lake, fmt="%k\\n", count=4).split() == (per_part[0] + per_part[1])[:4]


def test_consistent_random_places_like_kcat(lake):
    keys = [f"user_{i}" for i in range(1, 11)]
    produce(lake, "".join(f"{k};x\n" for k in keys).encode(), key_sep=";", partitioner="consistent_random")
    got = dict(line.split(",") for line in dump(lake, fmt="%k,%p\\n").splitlines())
    assert got == {k: str(zlib.crc32(k.encode()) % 3) for k in keys}


@pytest.mark.parametrize(
    "text,spec,message",
    [
        (b"a;1\nno separator\n", SPEC, "input.txt:2: no key separator ';'"),
        (b"a;1\n\xffb;2\n", SPEC, "input.txt:2: key is not valid UTF-8"),
        (
            b'a;{"x":1}\nb;{oops\n',
            TopicSpec("t", 3, value_format="json"),
            "input.txt:2: value is not valid JSON",
        ),
    ],
)
def test_bad_input_names_the_line_and_writes_nothing(lake, text, spec, message):
    produce(lake, b"ok;1\n", spec=TopicSpec("t", 3, value_format="string"), key_sep=";")
    before = lake.version("t")
    with pytest.raises(UserError, match=message):
        produce(lake, text, spec=spec, key_sep=";")
    assert lake.version("t") == before
    assert dump(lake, fmt="%k\\n") == "ok\n"


def test_bytes_keys_accept_any_bytes(lake):
    spec = TopicSpec("t", 3, key_format="bytes", value_format="string")
    produce(lake, b"\x00\x00\x00\x00\x01user_1;v\n", spec=spec, key_sep=";")
    assert dump(lake, spec, fmt="%k\\n").encode() == b"\x00\x00\x00\x00\x01user_1\n"


def test_large_input_spans_chunks_with_correct_line_numbers(lake, monkeypatch):
    import spark_jobs.topics as topics

    monkeypatch.setattr(topics, "CHUNK_BYTES", 64)
    text = b"".join(b"key_%03d;value\n" % i for i in range(100)) + b"broken\n"
    with pytest.raises(UserError, match="input.txt:101: no key separator"):
        produce(lake, text, key_sep=";")
    assert not lake.exists("t") or lake.read_arrow("t").num_rows == 0
    res = produce(lake, text[: -len(b"broken\n")], key_sep=";")
    assert res.records == 100 and sum(res.per_partition) == 100
    assert sorted(dump(lake, fmt="%o\\n", partition=0).split(), key=int) == [
        str(i) for i in range(res.per_partition[0])
    ]
