"""`lake show`: current rows sorted by key, the change feed in commit order, JSON lines."""

from __future__ import annotations

import json

import pyarrow as pa

from spark_jobs.cli import main

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("n", pa.int64())])


def make(lake):
    lake.create("t", SCHEMA)
    lake.append(
        "t", pa.table({"key": [b"b", b"a\x00"], "value": [b'{"x":1}', None], "n": [2, 1]}, schema=SCHEMA)
    )
    lake.merge(
        "t",
        pa.table({"key": [b"b", b"a\x00"], "value": [b'{"x":2}', None], "n": [3, 1], "gone": [False, True]}),
        ["key"],
        delete_column="gone",
    )


def test_show_current_rows_sorted_by_key(lake, capsys):
    make(lake)
    lake.append("t", pa.table({"key": [b"a"], "value": [b"v"], "n": [0]}, schema=SCHEMA))
    assert main(["--root", str(lake.root), "show", "t"]) == 0
    assert capsys.readouterr().out.splitlines() == ["key\tvalue\tn", "a\tv\t0", 'b\t{"x":2}\t3']


def test_show_changes_in_commit_order_with_escaped_bytes(lake, capsys):
    make(lake)
    assert main(["--root", str(lake.root), "show", "t", "--changes", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    got = [(r["_change_type"], r["_commit_version"], r["key"], r["value"], r["n"]) for r in rows]
    assert got == [
        ("insert", 1, "a\\x00", None, 1),
        ("insert", 1, "b", '{"x":1}', 2),
        ("delete", 2, "a\\x00", None, 1),
        ("update_preimage", 2, "b", '{"x":1}', 2),
        ("update_postimage", 2, "b", '{"x":2}', 3),
    ]


def test_show_unknown_table_is_one_line(lake, capsys):
    assert main(["--root", str(lake.root), "show", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lake: error: unknown table 'nope'") and err.count("\n") == 1
