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


TYPES = pa.schema(
    [
        ("key", pa.binary()),
        ("price", pa.decimal128(10, 2)),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("ratio", pa.float64()),
        ("raw", pa.binary()),
        ("tags", pa.list_(pa.string())),
        ("counts", pa.map_(pa.string(), pa.int64())),
        ("item", pa.struct([("n", pa.int32()), ("prices", pa.list_(pa.decimal128(10, 2)))])),
    ]
)


def test_show_json_carries_every_column_type_a_select_can_produce(lake, capsys):
    """Decimal, date, timestamp, NaN, binary, arrays, maps and nested structs: one parsable JSON
    object per row, current rows and change feed alike, with the documented representations."""
    from datetime import UTC, date, datetime
    from decimal import Decimal

    lake.create("typed", TYPES)
    row = {
        "key": b"p1",
        "price": Decimal("19.90"),
        "day": date(2026, 11, 26),
        "at": datetime(2026, 11, 26, 1, 2, 3, 456000, tzinfo=UTC),
        "ratio": float("nan"),
        "raw": b"\x00\xff",
        "tags": ["a", "b"],
        "counts": [("x", 1)],
        "item": {"n": 2, "prices": [Decimal("0.10"), None]},
    }
    lake.append("typed", pa.Table.from_pylist([row], schema=TYPES))
    want = {
        "key": "p1",
        "price": "19.90",
        "day": "2026-11-26",
        "at": "2026-11-26T01:02:03.456000+00:00",
        "ratio": "NaN",
        "raw": "\\x00\\xff",
        "tags": ["a", "b"],
        "counts": {"x": 1},
        "item": {"n": 2, "prices": ["0.10", None]},
    }
    assert main(["--root", str(lake.root), "show", "typed", "--json"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [want]
    assert main(["--root", str(lake.root), "show", "typed", "--changes", "--json"]) == 0
    (change,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {k: v for k, v in change.items() if not k.startswith("_")} == want
    assert change["_change_type"] == "insert" and change["_commit_version"] == 1
    # the plain view: the same values, nested ones as JSON
    assert main(["--root", str(lake.root), "show", "typed"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split("\t") == [
        "p1", "19.90", "2026-11-26", "2026-11-26T01:02:03.456000+00:00", "NaN", "\\x00\\xff",
        '["a", "b"]', '{"x": 1}', '{"n": 2, "prices": ["0.10", null]}',
    ]  # fmt: skip
