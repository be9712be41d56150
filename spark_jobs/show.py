"""``lake show``: a table's current rows, or its change feed, as a person (or a script) reads them.

Rows are sorted by ``key`` when the table has one (else by all columns); the change feed comes in
commit order. Binary values are shown as text with invisible bytes escaped (``\\x00``); ``--json``
prints one object per line, with every Spark type as JSON can carry it: decimals as strings of their
exact digits (``"19.90"``), dates and timestamps in ISO 8601 (timestamps in UTC), NaN and the
infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, maps as objects (keys as text),
structs as objects and arrays as arrays.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.errors import UserError
from spark_jobs.joins.behind import current_frame, viewed_join
from spark_jobs.layout import join_table
from spark_jobs.seams.delta import Lake, arrow_rows

CHANGE_COLUMNS = ["_change_type", "_commit_version", "_commit_timestamp"]


def shown(value: Any) -> Any:
    """A cell as text: bytes decoded where they are printable UTF-8, escaped otherwise."""
    if isinstance(value, bytes):
        text = value.decode("utf-8", "replace")
        return text if text.isprintable() and "\ufffd" not in text else repr(value)[2:-1]
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)  # exact: a float would round, and json cannot write a Decimal
    if isinstance(value, timedelta):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def table_rows(lake: Lake, name: str, changes: bool = False) -> tuple[list[str], list[dict]]:
    """A table's rows, or its change feed; a join's current view (``<join>__current``) reads as a
    table does, but has no change feed of its own."""
    view = current_frame(lake, name)
    join = viewed_join(name)
    if view is not None and join is not None and changes:
        parked = join_table(join, "parked")
        raise UserError(
            f"'{name}' is a view (the join's result with its pending rows): it has no change feed; "
            f"its tables have one: lake show {join} --changes, lake show {parked} --changes"
        )
    if changes:
        table = lake.changes_arrow(name)
        # within a commit and key, an update's pre-image comes before its post-image
        rank = pc.if_else(pc.equal(table["_change_type"], "update_postimage"), 1, 0)
        table = table.append_column("_rank", rank)
        sort = [("_commit_version", "ascending")]
        sort += [("key", "ascending")] if "key" in table.column_names else []
        sort += [("_rank", "ascending")]
        columns = CHANGE_COLUMNS + [c for c in table.column_names if c not in CHANGE_COLUMNS + ["_rank"]]
    else:
        table = arrow_rows(view) if view is not None else lake.read_arrow(name)
        # by key, then the other columns (event tables hold several rows per key)
        keys = sorted(table.column_names, key=lambda c: c != "key")
        sort = [(k, "ascending") for k in keys if _sortable(table.schema.field(k).type)]
        columns = table.column_names
    if sort and table.num_rows:
        table = table.sort_by(sort)
    return columns, table.select(columns).to_pylist(maps_as_pydicts="lossy")  # Spark's keys are unique


def _sortable(t: pa.DataType) -> bool:
    return not (
        pa.types.is_list(t) or pa.types.is_struct(t) or pa.types.is_map(t) or pa.types.is_large_list(t)
    )


def render(columns: list[str], rows: list[dict], as_json: bool) -> Iterator[str]:
    if as_json:
        for row in rows:
            yield json.dumps({c: _json(row[c]) for c in columns}, ensure_ascii=False)
        return
    yield "\t".join(columns)
    for row in rows:
        yield "\t".join(_cell(row[c]) for c in columns)


def _cell(value: Any) -> str:
    """A tab-separated cell: nested values (a list join's enriched list) as JSON."""
    if value is None:
        return ""
    shown_value = _json(value)
    if isinstance(shown_value, (list, dict)):
        return json.dumps(shown_value, ensure_ascii=False)
    return str(shown_value)


def _json(value: Any) -> Any:
    """A cell as a JSON value (see the module's docstring for each type)."""
    if isinstance(value, list):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(_json(k)): _json(v) for k, v in value.items()}
    return shown(value)
