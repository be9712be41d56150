"""The result table behind the topic (``lake run --continuous --table-every SECONDS``).

A keyed join's most expensive step is the ``MERGE`` into its result: on a 1M-row result it costs
1.5-2 s whatever the batch's size, and every micro-batch pays it. A join that publishes shows its
changes on its changelog topic first (``state_store``); with ``--table-every`` each micro-batch then
appends its result rows to ``<join>__parked`` (an append costs a few tenths of a second) and the
result table catches up with one ``MERGE`` of everything pending at most every SECONDS (and when the
job stops or idles). So micro-batches stay short and a burst pays one ``MERGE`` per interval, not per
batch; the result table lags the topic by up to SECONDS plus one ``MERGE``. A first load into an
empty result (nothing parked) is appended to the table at once: there is nothing to merge.

Nothing is lost on a crash: the pending rows are in Delta before the micro-batch commits, each
append carries the batch's transaction ``(query id, batch id)``, and the fold's ``MERGE`` carries the
last batch it folds in, under the same application id as the result's own commits, so a fold that
ran before a crash is not applied twice and a pending row of a folded batch is never folded again.

Readers who want the join as of its newest micro-batch, not its last fold, query the current view,
``lake.<join>__current`` in the catalog of ``lake sql`` and ``lake dbt`` (:func:`current_view`): the
result table with each key's newest pending row over it. A fold keeps the rows it folded in until the
next fold (it deletes those of the fold before), so a reader whose snapshot of the result predates a
fold still finds that fold's rows among the pending ones; every pending row is as new as the result's
row of its key or newer, since nothing else writes the result while rows are pending: a run without
``--table-every`` (and a batch written on the driver) folds them in and empties the table first.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs import faults
from spark_jobs.layout import OWNED, join_table
from spark_jobs.seams.delta import Lake

BATCH, DELETE = "__batch", "__delete"
CURRENT = f"{OWNED}current"  # a join's current view is <join>__current


def pending_schema(result: pa.Schema) -> pa.Schema:
    return result.append(pa.field(DELETE, pa.bool_())).append(pa.field(BATCH, pa.int64()))


def folded_up_to(lake: Lake, join: str) -> int | None:
    """The last micro-batch the result table holds (its writes' and folds' transactions; None: none)."""
    return lake.last_txn(join) if lake.exists(join) else None


def pending(lake: Lake, join: str) -> DataFrame | None:
    """The parked rows not in the result table yet (None: the join parks nothing)."""
    table = join_table(join, "parked")
    if not lake.exists(table):
        return None
    rows = lake.read(table)
    done = folded_up_to(lake, join)
    return rows if done is None else rows.filter(F.col(BATCH) > done)


def current_views(lake: Lake, schema: str) -> dict[str, str]:
    """The current view of each join that parks rows (``<join>__current``: its SQL), over the catalog
    tables of ``schema``."""
    parked = join_table("", "parked")
    joins = [t.removesuffix(parked) for t in lake.tables() if t.endswith(parked)]
    return {
        f"{join}{CURRENT}": current_view(
            f"{schema}.`{join}`", f"{schema}.`{join_table(join, 'parked')}`", lake.schema(join).names
        )
        for join in joins
        if lake.exists(join)
    }


def viewed_join(name: str) -> str | None:
    """The join whose current view ``name`` would be (None: not a current view's name)."""
    join = name.removesuffix(CURRENT)
    return join if join != name else None


def current_frame(lake: Lake, name: str) -> DataFrame | None:
    """The rows of the current view ``name`` (``<join>__current``, the SQL of :func:`current_view`) read
    straight from the join's tables, for readers without the catalog (``lake show``); None when
    ``name`` is no join's current view."""
    join = viewed_join(name)
    if join is None or lake.exists(name):
        return None
    parked = join_table(join, "parked")
    if not (lake.exists(join) and lake.exists(parked)):
        return None
    sql = current_view("{result}", "{parked}", lake.schema(join).names)
    return lake.spark.sql(sql, result=lake.read(join), parked=lake.read(parked))


def current_view(result: str, parked: str, columns: list[str]) -> str:
    """The SQL of a join's current view over its tables ``result`` and ``parked`` (references as a
    query names them): each key's newest pending row (a delete removes the key), the result's row for
    the other keys."""
    names = ", ".join(f"`{c}`" for c in columns)
    kept = ", ".join(f"r.`{c}`" for c in columns)
    return (
        f"SELECT {kept} FROM {result} r LEFT ANTI JOIN {parked} p ON r.key = p.key "
        f"UNION ALL SELECT {names} FROM (SELECT *, row_number() OVER "
        f"(PARTITION BY key ORDER BY `{BATCH}` DESC) AS `__n` FROM {parked}) "
        f"WHERE `__n` = 1 AND NOT `{DELETE}`"
    )


class TableBehind:
    """A join's pending result rows and their fold into the result table; ``parked`` counts the rows
    waiting (``lake status``: how far the table is behind the changelog topic), ``held`` says whether
    the pending table holds rows at all (also those of the last fold, kept for the current view)."""

    def __init__(self, lake: Lake, join: str, result: pa.Schema, log: Callable[[str], None]):
        self.lake, self.join, self.result, self.log = lake, join, result, log
        self.table = join_table(join, "parked")
        self.folded_at = time.monotonic()
        # rows may be waiting: from a run that wrote behind and crashed before its last fold
        waiting = pending(lake, join)
        self.parked = waiting.count() if waiting is not None else 0
        self.waiting = self.parked > 0
        self.held = self.waiting or (waiting is not None and not lake.read(self.table).isEmpty())

    def add(self, rows: DataFrame, txn: tuple[str, int]) -> None:
        """Append a micro-batch's result rows (the result's columns and ``__delete``)."""
        self.lake.create(self.table, pending_schema(self.result), change_feed=False, description=(
            f"result rows of join {self.join} waiting for its table, and those of its last catch-up "
            "(lake run --table-every; the view lake.<join>__current reads them)"
        ))  # fmt: skip
        # the batch id as data (a one-row broadcast), not a literal: Spark writes a literal into the
        # stage's generated code, and a new literal every batch would compile that code anew each time
        batch = F.broadcast(self.lake.frame(pa.table({BATCH: pa.array([txn[1]], pa.int64())})))
        version = self.lake.append(self.table, rows.crossJoin(batch), txn=txn)
        if version is not None:
            self.parked += int((self.lake.commit(self.table, version).metrics or {}).get("numOutputRows", 0))
        self.waiting = self.held = True
        faults.point("park")

    def due(self, every: float) -> bool:
        return self.waiting and time.monotonic() - self.folded_at >= every

    def _newest(self) -> DataFrame:
        """The newest parked row of each key (the one the table must end up with)."""
        order = Window.partitionBy("key").orderBy(F.col(BATCH).desc())
        rows = self.lake.read(self.table).withColumn("__n", F.row_number().over(order))
        return rows.filter("__n = 1").drop("__n")

    def latest(self, keys: pa.Array) -> tuple[pa.Array, pa.Array]:
        """Among ``keys``, those whose newest parked row is live and those whose is a delete."""
        empty = pa.array([], pa.binary())
        if not self.waiting or not len(keys):
            return empty, empty
        wanted = F.broadcast(self.lake.frame(pa.table({"key": keys})))
        newest = self._newest().join(wanted, "key", "left_semi").select("key", DELETE).toArrow()
        gone, keys_of = newest[DELETE].combine_chunks(), newest["key"].combine_chunks()
        return keys_of.filter(pc.invert(gone)), keys_of.filter(gone)

    def fold(self, app_id: str, empty_result: bool, keep: bool = True) -> int | None:
        """Merge the newest parked row of each key whose batch is not folded yet into the result, then
        delete the rows the fold before this one folded in (``keep``: the current view's readers may
        still need this fold's), or all of them (``keep`` false: the result is written directly
        next). Returns the result's new version (None: nothing to write)."""
        if not self.held or (keep and not self.waiting):
            return None
        started = time.perf_counter()
        done = self.lake.txn_version(self.join, app_id)
        version, n = None, 0
        if self.waiting:
            version, n = self._merge(app_id, done, empty_result)
        faults.point("fold")
        if not keep:
            self.lake.overwrite(self.table, pending_schema(self.result).empty_table())
            self.held = False
        elif done is not None:
            self.lake.delete(self.table, f"`{BATCH}` <= {done}")
        self.waiting, self.parked, self.folded_at = False, 0, time.monotonic()
        if n:
            ms = (time.perf_counter() - started) * 1000
            self.log(f"join {self.join}: result table caught up with {n} pending row(s) ({ms:.0f} ms)")
        return version

    def _merge(self, app_id: str, done: int | None, empty_result: bool) -> tuple[int | None, int]:
        """The fold's commit: the newest row of each key parked after batch ``done`` into the result;
        its version and how many rows it took."""
        rows = self._newest()
        if done is not None:  # a key's newest row is older only when all of its rows are folded
            rows = rows.filter(F.col(BATCH) > done)
        rows = rows.persist()
        try:
            last = rows.agg(F.max(BATCH), F.count("*")).first()
            if last is None or last[0] is None:
                return None, 0
            txn, source = (app_id, int(last[0])), rows.drop(BATCH)
            if empty_result:
                version = self.lake.append(self.join, source.filter(~F.col(DELETE)).drop(DELETE), txn=txn)
            else:
                version = self.lake.merge(
                    self.join, source, ["key"], delete_column=DELETE, txn=txn, skip_unchanged=True
                )
            return version, int(last[1])
        finally:
            rows.unpersist()
