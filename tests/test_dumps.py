"""Dump files into (line, key, value, reason) rows: newline-aligned byte ranges with exact line
numbers, the three formats, and a BOM or CRLF never inside a key or value."""

from __future__ import annotations

import pytest
from pyarrow import fs

from spark_jobs.config import BackfillSpec
from spark_jobs.errors import UserError
from spark_jobs.formats.plain import JsonCodec, StringCodec
from spark_jobs.lookups.dumps import dump_source, line_ranges, parse_dump, read_lines


def test_byte_ranges_end_at_newlines_and_know_their_first_line(tmp_path):
    dump = tmp_path / "d.txt"
    dump.write_bytes(b"a;1\nbb;22\nccc;333\nd;4")  # no newline at the end
    with fs.LocalFileSystem().open_input_file(str(dump)) as fh:
        ranges = line_ranges(fh, range_bytes=5)
    assert ranges == [(0, 10, 1), (10, 18, 3), (18, 21, 4)]
    data = dump.read_bytes()
    assert b"".join(data[s:e] for s, e, _ in ranges) == data
    (tmp_path / "empty.txt").touch()
    with fs.LocalFileSystem().open_input_file(str(tmp_path / "empty.txt")) as fh:
        assert line_ranges(fh, 5) == []


def test_a_dump_is_a_local_file_or_an_object_on_s3(tmp_path, s3, monkeypatch):
    dump = tmp_path / "d.txt"
    dump.write_text("a;1\n")
    monkeypatch.chdir(tmp_path)
    assert dump_source("d.txt") == str(dump)
    assert dump_source(f"file://{dump}") == str(dump)
    with s3.open_output_stream("lake-tests/dumps/d.txt") as out:
        out.write(b"a;1\n")
    assert dump_source("s3a://lake-tests/dumps/d.txt") == "s3a://lake-tests/dumps/d.txt"
    with pytest.raises(UserError, match=r"^s3a://lake-tests/dumps/e\.txt: no such file$"):
        dump_source("s3a://lake-tests/dumps/e.txt")
    with pytest.raises(UserError, match=r"^s3://b/d\.txt: no file system for s3:// here; a dump is a local"):
        dump_source("s3://b/d.txt")
    with pytest.raises(UserError, match=r"no such file$"):
        dump_source(str(tmp_path / "missing.txt"))


def parsed(spark, path, spec: BackfillSpec, value: type = JsonCodec) -> list[tuple]:
    """The dump's lines parsed for a topic of string keys and ``value`` values."""
    codecs = (StringCodec("topics.t.key"), value("topics.t.value"))
    rows = parse_dump(read_lines(spark, str(path)), spec, codecs).orderBy("line").collect()
    return [(r["line"], r["key"], r["value"], r["reason"]) for r in rows]


def test_lines_lose_the_bom_and_crlf_and_bad_lines_say_why(spark, tmp_path):
    dump = tmp_path / "d.txt"
    dump.write_bytes(b'\xef\xbb\xbfuser_1|{"n":1}\r\nno separator\r\n user_2|{"n":2}\nuser_3|{bad\n')
    spec = BackfillSpec(None, separator="|", value_format="json")
    assert parsed(spark, dump, spec) == [
        (1, b"user_1", b'{"n":1}', None),
        (2, None, None, "no separator '|'"),
        (3, None, None, "key has leading or trailing whitespace"),
        (4, None, None, "value is not valid JSON"),
    ]


def test_jsonl_and_csv_take_the_named_fields(spark, tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"id": "u1", "doc": {"a": 1}}\n{"id": "u2", "doc": "text"}\n{"doc": 1}\nnot json\n')
    spec = BackfillSpec(None, format="jsonl", key_field="id", value_field="doc", value_format="string")
    assert parsed(spark, jsonl, spec, value=StringCodec) == [
        (1, b"u1", b'{"a":1}', None),
        (2, b"u2", b"text", None),
        (3, None, None, "no 'id' field"),
        (4, None, None, "line is not a JSON object"),
    ]
    csv = tmp_path / "d.csv"
    csv.write_text("id,mail\nu1,a@x\nu2,\n")
    spec = BackfillSpec(
        None, format="csv", separator=",", key_field="id", value_field="mail", value={"mail": "value"}
    )
    assert parsed(spark, csv, spec) == [
        (2, b"u1", b'{"mail":"a@x"}', None),
        (3, None, None, "no 'mail' column value"),
    ]
