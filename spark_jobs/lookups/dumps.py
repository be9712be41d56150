"""Reading dump files (the sources of backfills) into Spark, line by line, with exact line numbers.

A Spark Python data source ``dumplines`` splits a file into byte ranges that end at newlines (the
driver counts the newlines before each range once, so every task knows its first line number) and
yields ``(source, line, raw)`` rows as Arrow batches: ``raw`` is the line's bytes exactly as in the
file (no decoding, no newline), so invalid UTF-8 and invisible bytes survive into checks and the
quarantine. Parsing into key and value is Spark SQL (:func:`parse_dump`), so it scales like any job.
A UTF-8 byte-order mark at the start of the file and CRLF line ends are stripped before parsing: they
never end up inside a key or a value.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from spark_jobs.config import BackfillSpec
from spark_jobs.errors import UserError
from spark_jobs.formats import Codec
from spark_jobs.topics.keys import RULES as KEY_RULES
from spark_jobs.topics.keys import plain_key_sql

RANGE_BYTES = 32 * 1024 * 1024
SCHEMA = "source string, line long, raw binary"


class _Range(InputPartition):
    def __init__(self, start: int, end: int, first_line: int):
        super().__init__((start, end, first_line))


def dump_source(source: str) -> str:
    """A dump given as a local path, a ``file://`` URI or an object store's URI (``s3a://``), checked
    to exist: the local file's absolute path, or the URI."""
    from spark_jobs.seams.storage import OBJECT_SCHEMES, location, scheme_of

    scheme = scheme_of(source)
    if scheme == "file":
        source = source.removeprefix("file://")
    elif scheme is not None:
        if scheme not in OBJECT_SCHEMES:
            raise UserError(
                f"{source}: no file system for {scheme}:// here; a dump is a local file or s3a://"
            )
        try:
            found = location(source).is_file()
        except OSError as err:
            raise UserError(f"{source}: {str(err).splitlines()[0]}") from None
        if not found:
            raise UserError(f"{source}: no such file")
        return source
    if not os.path.isfile(source):
        raise UserError(f"{source}: no such file")
    return os.path.abspath(source)


def _file(source: str) -> tuple[Any, str]:
    """The (pyarrow file system, path) a dump is read through: local, or the object store its URI
    names. Picklable: executors open the dump themselves, wherever they run."""
    from pyarrow import fs

    from spark_jobs.seams.storage import ObjectPath, location

    where = location(source)
    if isinstance(where, ObjectPath):
        return where.fs, where.key
    return fs.LocalFileSystem(), str(where)


def line_ranges(fh: Any, range_bytes: int = RANGE_BYTES) -> list[tuple[int, int, int]]:
    """(start, end, first line number) of newline-aligned byte ranges covering the open file."""
    size = fh.size()
    ranges = []
    start, line = 0, 1
    while start < size:
        end = min(start + range_bytes, size)
        fh.seek(start)
        block = fh.read(end - start)
        while end < size and not block.endswith(b"\n"):  # on to the end of the range's last line
            chunk = fh.read(min(64 * 1024, size - end))
            cut = chunk.find(b"\n")
            piece = chunk if cut < 0 else chunk[: cut + 1]
            block += piece
            end += len(piece)
        ranges.append((start, end, line))
        line += block.count(b"\n")
        start = end
    return ranges


class _Reader(DataSourceReader):
    def __init__(self, source: str, name: str):
        self.file, self.name = _file(source), name

    def partitions(self):
        filesystem, path = self.file
        with filesystem.open_input_file(path) as fh:
            return [_Range(s, e, first) for s, e, first in line_ranges(fh)]

    def read(self, partition):
        from spark_jobs.topics.produce_consume import split_lines

        start, end, first = partition.value
        filesystem, path = self.file
        with filesystem.open_input_file(path) as fh:
            block = fh.read_at(end - start, start)
        lines = split_lines(block)
        n = len(lines)
        yield pa.RecordBatch.from_arrays(
            [
                pa.repeat(pa.scalar(self.name, pa.string()), n),
                pa.array(range(first, first + n), pa.int64()),
                lines.cast(pa.binary()),
            ],
            names=["source", "line", "raw"],
        )


class DumpLines(DataSource):
    """``spark.read.format("dumplines").option("name", shown).load(source)``: one row per line of a
    local file or an object store's (``source`` is :func:`dump_source`'s), ``shown`` as its source."""

    @classmethod
    def name(cls) -> str:
        return "dumplines"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema) -> DataSourceReader:
        return _Reader(self.options["path"], self.options.get("name") or self.options["path"])


def read_lines(spark: SparkSession, source: str, name: str | None = None) -> DataFrame:
    """The lines of the dump at ``source`` (a :func:`dump_source`), their ``source`` column ``name``
    (the dump as the user named it) or ``source``."""
    spark.dataSource.register(DumpLines)
    return spark.read.format("dumplines").option("name", name or source).load(source)


# What a line means, as opposed to its bytes (``raw``, kept for the quarantine): a UTF-8 byte-order mark
# at the start of the file and the carriage return of CRLF line ends are not part of any key or value.
_BOM_STRIPPED = "CASE WHEN line = 1 AND startswith(raw, X'EFBBBF') THEN substr(raw, 4) ELSE raw END"
_LINE_SQL = (
    f"CASE WHEN endswith({_BOM_STRIPPED}, X'0D') "
    f"THEN substr({_BOM_STRIPPED}, 1, length({_BOM_STRIPPED}) - 1) ELSE {_BOM_STRIPPED} END"
)


def _reason(conditions: list[tuple[Column, str]]) -> Column:
    expr = F.lit(None).cast("string")
    for cond, text in reversed(conditions):
        expr = F.when(cond, F.lit(text)).otherwise(expr)
    return expr


def _split_lines(
    lines: DataFrame, spec: BackfillSpec, sep: str
) -> tuple[DataFrame, list[tuple[Column, str]]]:
    """``key SEP value`` lines: ``_key`` and ``_raw_value``, and why a line has neither."""
    pos_sql = f"instr(cast(_line as string), {_sql_str(sep)})"
    pos = F.expr(pos_sql)
    df = lines.withColumn(
        "_key", F.when(pos > 0, F.expr(f"substring(cast(_line as string), 1, {pos_sql} - 1)"))
    )
    df = df.withColumn(
        "_raw_value", F.when(pos > 0, F.expr(f"substring(cast(_line as string), {pos_sql} + {len(sep)})"))
    )
    return df, [(pos == 0, f"no separator {sep!r}")]


def _split_jsonl(
    lines: DataFrame, spec: BackfillSpec, sep: str
) -> tuple[DataFrame, list[tuple[Column, str]]]:
    """One JSON object per line: ``_key`` and ``_raw_value`` from its key and value fields (a string
    value as it is, any other as JSON text)."""
    value = _sql_str("$." + spec.value_field)
    df = lines.withColumn("_doc", F.expr("try_parse_json(cast(_line as string))"))
    df = df.withColumn("_key", F.expr(f"variant_get(_doc, {_sql_str('$.' + spec.key_field)}, 'string')"))
    df = df.withColumn(
        "_raw_value",
        F.expr(
            f"CASE WHEN variant_get(_doc, {value}, 'string') IS NOT NULL "
            f"AND schema_of_variant(variant_get(_doc, {value})) = 'STRING' "
            f"THEN variant_get(_doc, {value}, 'string') "
            f"ELSE to_json(variant_get(_doc, {value})) END"
        ),
    )
    return df, [
        (F.col("_doc").isNull(), "line is not a JSON object"),
        (F.col("_key").isNull(), f"no '{spec.key_field}' field"),
        (F.col("_raw_value").isNull(), f"no '{spec.value_field}' field"),
    ]


def _split_csv(lines: DataFrame, spec: BackfillSpec, sep: str) -> tuple[DataFrame, list[tuple[Column, str]]]:
    """CSV with a header line: the first line names the columns."""
    return _parse_csv(lines, spec, sep), [
        (F.col("_key").isNull(), f"no '{spec.key_field}' column value"),
        (F.col("_raw_value").isNull(), f"no '{spec.value_field}' column value"),
    ]


_SPLIT = {"lines": _split_lines, "jsonl": _split_jsonl, "csv": _split_csv}


def parse_dump(
    lines: DataFrame,
    spec: BackfillSpec,
    codecs: tuple[Codec, Codec],
    separator: str | None = None,
) -> DataFrame:
    """``(source, line, raw)`` rows -> ``(source, line, raw, key, value, reason)``.

    ``key`` and ``value`` are the topic record's bytes; ``reason`` is null for good lines and says in
    words why a line is rejected otherwise (no separator, empty key, not UTF-8, value not JSON, a key
    with invisible bytes: a BOM, surrounding whitespace or quotes, control characters, ...).
    ``plain_key`` is such a key without them, for naming the key it was probably meant to be.
    """
    sep = separator if separator is not None else spec.separator
    lines = lines.withColumn("_line", F.expr(_LINE_SQL))
    valid_utf8 = F.expr("is_valid_utf8(_line)")
    df, conditions = _SPLIT[spec.format](lines, spec, sep)
    if codecs[0].textual:
        conditions.insert(0, (~valid_utf8, "not valid UTF-8"))
    conditions.append((F.col("_key") == "", "empty key"))
    if codecs[0].textual:  # keys that differ from the plain text only in invisible bytes
        df = df.withColumn("key", F.encode(F.col("_key"), "UTF-8"))
        for rule in KEY_RULES[1:]:  # not_utf8 is the first condition already
            df = df.withColumn(f"_rule_{rule.name}", F.expr(rule.sql))
            conditions.append((F.col(f"_rule_{rule.name}"), f"key {rule.text}"))
    value_src = F.col("_raw_value")
    if spec.json_values:
        parsed = F.expr("try_parse_json(_raw_value)")
        conditions.append((value_src.isNotNull() & parsed.isNull(), "value is not valid JSON"))
        value_expr = "try_parse_json(_raw_value)"
    else:
        value_expr = "_raw_value"
    df = df.withColumn("value", F.expr(value_expr)).withColumn("key", F.col("_key"))
    if spec.value:
        fields = ", ".join(f"{_sql_str(name)}, {expr}" for name, expr in spec.value.items())
        out_value = F.expr(f"to_json(named_struct({fields}))")
    elif spec.json_values:
        out_value = F.expr("to_json(value)")
    else:
        out_value = F.col("value")
    df = df.withColumn("_out", out_value)
    if codecs[1].json_given and not spec.value and not spec.json_values:
        conditions.append((F.expr("try_parse_json(_out)").isNull(), "value is not valid JSON"))
    reason = _reason(conditions)
    return df.select(
        "source",
        "line",
        "raw",
        F.when(reason.isNull(), F.encode(F.col("_key"), "UTF-8")).alias("key"),
        F.when(reason.isNull(), F.encode(F.col("_out"), "UTF-8")).alias("value"),
        reason.alias("reason"),
        F.when(reason.startswith("key "), F.encode(F.expr(plain_key_sql("_key")), "UTF-8")).alias(
            "plain_key"
        ),
    )


def _parse_csv(lines: DataFrame, spec: BackfillSpec, sep: str) -> DataFrame:
    header_row = lines.filter(F.col("line") == 1).select(F.col("_line").cast("string")).first()
    if header_row is None:
        raise UserError("the CSV dump is empty: it needs a header line")
    names = [n.strip() for n in header_row[0].split(sep)]
    for needed in (spec.key_field, spec.value_field):
        if needed not in names:
            raise UserError(f"the CSV header has no column '{needed}' (columns: {', '.join(names)})")
    schema = ", ".join(f"`{re.sub('`', '', n)}` string" for n in names)
    parsed = F.from_csv(F.col("_line").cast("string"), schema, {"sep": sep, "mode": "PERMISSIVE"})
    df = lines.filter(F.col("line") > 1).withColumn("_row", parsed)
    return df.withColumn("_key", F.col("_row").getField(spec.key_field)).withColumn(
        "_raw_value", F.col("_row").getField(spec.value_field)
    )


def _sql_str(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
