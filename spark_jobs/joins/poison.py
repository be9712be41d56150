"""Poison pills: records on which a join's ``select`` fails at run time.

A ``select`` is checked against the topics' shapes when the job starts, but some expressions fail
only on some values: ``cast(left.n AS int)`` on ``"abc"``, a division by zero, ``assert_true``. Spark
fails the whole evaluation then, so the engine evaluates a batch's rows with :func:`guarded`: on a
data error it bisects the rows until the failing ones stand alone, evaluates the rest, and hands the
failing rows back with their errors. The engine quarantines them (naming the record, the join and the
error), leaves their keys' results as they were, and goes on.

Only data errors count (SQLSTATE class 22, and 'P0001' raised by ``raise_error``/``assert_true``):
an environmental failure (a lost executor, a full disk) is no record's fault and fails the batch as
before, so Spark retries it.

Each kind hands over rows that name the records they were computed from: ``left_partition`` /
``left_offset`` and ``right_partition`` / ``right_offset`` (null when there is none).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.errors.exceptions.captured import AnalysisException, CapturedException
from pyspark.logger import PySparkLogger
from pyspark.sql import DataFrame

from spark_jobs.errors import spark_error

# PySpark logs every error that carries a query context, with its JVM stack, before raising it
QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
MAX_CAUSES = 8  # how deep a wrapped JVM error's causes are searched for a data error


def is_data_error(exc: BaseException) -> bool:
    """True for an error a value causes (bad cast, overflow, division by zero, raise_error), also
    when a write wraps it (``TASK_WRITE_FAILED`` around the task's own error)."""
    if isinstance(exc, AnalysisException):
        return False
    if isinstance(exc, CapturedException) and _is_data_state(exc.getSqlState()):
        return True
    if not isinstance(exc, (CapturedException, Py4JJavaError)):
        return False
    cause = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    for _ in range(MAX_CAUSES):  # the JVM exception and its causes
        if cause is None:
            return False
        try:
            if _is_data_state(cause.getSqlState()):
                return True
        except Py4JError:  # not a SparkThrowable
            pass
        cause = cause.getCause()
    return False


def _is_data_state(state: str | None) -> bool:
    return bool(state) and (str(state).startswith("22") or state == "P0001")


@dataclass
class Guarded:
    """What :func:`guarded` returns: the output of the rows that evaluated, and the failing rows
    (with their errors, in the same order)."""

    output: pa.Table
    failed: pa.Table
    errors: list[str]


@contextmanager
def _quiet() -> Iterator[None]:
    """Without PySpark's stack dump of the errors handled here (they are quarantined instead)."""
    loggers = [PySparkLogger.getLogger(name) for name in QUERY_CONTEXT_LOGGERS]  # they take extra kwargs
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def guarded(evaluate: Callable[[pa.Table], pa.Table], rows: pa.Table) -> Guarded:
    """``evaluate(rows)``, leaving out the rows on which it fails with a data error. Costs one
    evaluation when nothing fails, about ``2·log2(n)`` more per failing row."""
    with _quiet():
        return _guarded(evaluate, rows)


def _guarded(evaluate: Callable[[pa.Table], pa.Table], rows: pa.Table) -> Guarded:
    try:
        return Guarded(evaluate(rows), rows.slice(0, 0), [])
    except Exception as exc:
        if not is_data_error(exc):
            raise
        if rows.num_rows <= 1:
            return Guarded(evaluate(rows.slice(0, 0)), rows, [spark_error(exc)])
    half = rows.num_rows // 2
    first, second = _guarded(evaluate, rows.slice(0, half)), _guarded(evaluate, rows.slice(half))
    return Guarded(
        pa.concat_tables([first.output, second.output]),
        pa.concat_tables([first.failed, second.failed]),
        first.errors + second.errors,
    )


def guarded_frame(project: Callable[[DataFrame], DataFrame], rows: DataFrame) -> Guarded:
    """``project(rows)`` collected, leaving out the rows on which it fails with a data error (the
    ``rows`` are collected and bisected only then; the failing ones come back as they were)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark_jobs.seams.session import arrow_frame

    with _quiet():
        try:
            return Guarded(
                project(rows).toArrow(), to_arrow_schema(rows.schema, timezone="UTC").empty_table(), []
            )
        except Exception as exc:
            if not is_data_error(exc):
                raise
        spark = rows.sparkSession
        return _guarded(lambda part: project(arrow_frame(spark, part)).toArrow(), rows.toArrow())


def fails(evaluate: Callable[[pa.Table], pa.Table], row: pa.Table) -> bool:
    """True when ``evaluate`` fails on ``row`` with a data error."""
    try:
        with _quiet():
            evaluate(row)
    except Exception as exc:
        if is_data_error(exc):
            return True
        raise
    return False
