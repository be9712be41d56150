"""The storage seam: every Delta table of the product is read and written through :class:`Lake`,
and only through Delta's Spark integration (delta-spark).

Tables live under a lake root (``--root`` / ``LAKE_ROOT``, default ``./lakehouse``) as
``<root>/tables/<name>``. Spark reads and streams them with Delta's own source (``format("delta")``),
and the Kafka ingest writes the bronze tables with Delta's streaming sink.

Writes (append, overwrite, merge) are one atomic Delta commit each, made by delta-spark: data given as
a Spark DataFrame is written on the executors as it is; data given as an Arrow table (the join
engine's per-batch rows, small system rows) becomes a Spark DataFrame first. A write may carry an
application id and a batch id (``txn=(app_id, batch_id)``) recorded as a Delta ``txn`` action
(``txnAppId``/``txnVersion``; for a MERGE the ``spark.databricks.delta.write.txnAppId/txnVersion``
settings); a write whose batch id is not newer than the recorded one is skipped, so a replayed
streaming batch changes nothing. Optimistic-concurrency conflicts are retried on a fresh snapshot.

What needs no Spark reads the Delta log's file names only: whether a table exists, its version, and
one commit's actions (``lake status`` and the Airflow health check run without a Spark session).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_jobs.errors import UserError
from spark_jobs.layout import Layout
from spark_jobs.seams import fences
from spark_jobs.seams.storage import check_root, move_tree, remove_tree, resolve_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CDF = {"delta.enableChangeDataFeed": "true"}
# Delta's idempotent DML reads the transaction from these session settings: one writer at a time
_DML_TXN = threading.Lock()
TXN_APP, TXN_VERSION = "spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion"
CONFLICT_RETRIES = 8
KEY_LOOKUP_LIMIT = 1_000  # read_keys: up to this many values an IN list, above it a broadcast semi-join
# rows from the driver up to this many are written as one Spark partition: one data file per table
# partition and commit (as a topic's mirror writes a commit), not one per core
ONE_FILE_ROWS = 1_000_000
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet$")

Txn = tuple[str, int]  # (application id, batch id)


def conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """Select and cast ``table``'s columns to a Delta table's schema (extra columns are an error)."""
    missing = [f.name for f in schema if f.name not in table.column_names]
    extra = [c for c in table.column_names if c not in schema.names]
    if missing or extra:
        raise ValueError(
            f"{where}: columns do not match the table (missing: {missing or 'none'}, "
            f"unexpected: {extra or 'none'})"
        )
    return table.select(schema.names).cast(schema)


def arrow_schema(schema: Any) -> pa.Schema:
    """A Spark schema as Arrow (timestamps in UTC, as every session of the product runs)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def spark_ddl(schema: pa.Schema) -> str:
    """An Arrow schema as the column list of a ``CREATE TABLE`` (nullability kept)."""
    from pyspark.sql.pandas.types import from_arrow_type

    return ", ".join(
        f"`{f.name}` {from_arrow_type(f.type).simpleString()}{'' if f.nullable else ' NOT NULL'}"
        for f in schema
    )


@dataclass(frozen=True)
class CommitInfo:
    """What one Delta commit did, read from its log entry."""

    version: int
    timestamp_ms: int
    operation: str
    added_files: int
    removed_data_files: int  # remove actions with dataChange=true (updates/deletes)
    cdc_files: int
    txn: Txn | None = None  # the application transaction the commit recorded
    metrics: dict[str, str] | None = None  # the commit's operationMetrics (rows inserted, updated...)


def read_commit(table_path: Any, version: int) -> CommitInfo:
    """Summarize the actions of commit ``version`` of the table at ``table_path`` (a local path or an
    object store's, :mod:`spark_jobs.seams.storage`)."""
    log = table_path / "_delta_log" / f"{version:020d}.json"
    added = removed = cdc = 0
    ts = 0
    op = ""
    txn = None
    metrics: dict[str, str] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "add" in action:
            added += 1
        elif "remove" in action and action["remove"].get("dataChange", True):
            removed += 1
        elif "cdc" in action:
            cdc += 1
        elif "txn" in action:
            txn = (action["txn"]["appId"], int(action["txn"]["version"]))
        elif "commitInfo" in action:
            ts = int(action["commitInfo"].get("timestamp", 0))
            op = action["commitInfo"].get("operation", "")
            metrics = action["commitInfo"].get("operationMetrics", {})
    return CommitInfo(version, ts, op, added, removed, cdc, txn, metrics)


def log_versions(table_path: Any) -> tuple[int, int] | None:
    """The oldest readable and the newest version of the Delta table at ``table_path`` (a local path
    or an object store's), from its log's file names (None: not a Delta table)."""
    try:
        names = [p.name for p in (table_path / "_delta_log").iterdir()]
    except OSError:
        return None
    commits = [int(m.group(1)) for n in names if (m := _COMMIT_FILE.match(n))]
    checkpoints = [int(m.group(1)) for n in names if (m := _CHECKPOINT_FILE.match(n))]
    if not commits and not checkpoints:
        return None
    newest = max(commits + checkpoints)
    oldest = min(checkpoints) if checkpoints and min(checkpoints) > min(commits, default=0) else min(commits)
    return oldest, newest


class Lake:
    """All Delta tables of one lake root. ``spark``: the session to read and write with (by default
    the process's, from :func:`spark_jobs.seams.session.get_spark`, built on first use)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        spark: SparkSession | None = None,
        *,
        quick: bool = False,
        log: Callable[[str], None] = lambda _: None,
    ):
        """``quick``: a lake that only reads takes the root's Spark Connect server when it runs
        (:func:`spark_jobs.seams.connect.quick_session`), built on first use like the local session."""
        self.root = resolve_root(root)
        check_root(self.root)
        self.layout = Layout(self.root)  # every path under the root
        self._spark = spark
        self._given_root = False
        self._quick, self._log = quick, log

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            from spark_jobs.seams.connect import quick_session
            from spark_jobs.seams.session import get_spark

            self._spark = (
                quick_session(self.root, log=self._log) if self._quick else get_spark(root=self.root)
            )
        elif self.root.on_object_storage and not self._given_root:
            from spark_jobs.seams.session import use_root

            use_root(self._spark, self.root)  # a session given to the lake, built without its root
        self._given_root = True
        return self._spark

    # --- locations ------------------------------------------------------------------------------
    @property
    def tables_dir(self) -> Any:
        return self.layout.tables

    def path(self, name: str) -> Any:
        """Where table ``name`` is: a local path, or an object store's (``str()``: what Spark reads)."""
        return self.tables_dir / name

    def uri(self, name: str) -> str:
        return str(self.path(name))

    def exists(self, name: str) -> bool:
        return log_versions(self.path(name)) is not None

    @contextmanager
    def lock(
        self,
        name: str,
        log: Callable[[str], None] | None = None,
        *,
        shared: bool = False,
        wait: bool = True,
    ) -> Iterator[bool]:
        """Hold ``<work>/_locks/<name>.lock`` while the block runs: exclusively (work that several
        processes may start at once, such as overlapping Airflow DAGs, runs one at a time), or
        ``shared`` with other shared holders. Waits for a conflicting holder, or with ``wait=False``
        yields False at once instead of taking the lock (True when taken). The lock dies with its
        process, so a killed holder never leaves it taken. On a root on an object store an exclusive
        lock is also the root's lease ``lock-<name>`` (:mod:`spark_jobs.runtime.leases`), so the
        machines sharing the root take turns too; a killed holder's lease lapses after a minute."""
        path = self.layout.lock(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        with open(path, "w") as handle:
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    yield False
                    return
                if log:
                    log(f"waiting for another process to finish {name} ...")
                fcntl.flock(handle, mode)
            try:
                if shared or not self.root.on_object_storage:
                    yield True
                    return
                from spark_jobs.runtime.leases import leased

                with leased(self.root, f"lock-{name}", name, wait=wait, log=log) as lease:
                    yield lease is not None
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def drop(self, name: str) -> bool:
        """Delete a table with its files (True: it existed)."""
        if not self.exists(name):
            return False
        remove_tree(self.path(name))
        return True

    def rename(self, name: str, new: str) -> None:
        """Give a table another name (its folder moves; a Delta log holds no absolute paths)."""
        self._known(name)
        if self.path(new).exists():
            raise UserError(f"cannot rename table '{name}' to '{new}': '{new}' exists in lake {self.root}")
        move_tree(self.path(name), self.path(new))

    def tables(self) -> list[str]:
        if not self.tables_dir.is_dir():
            return []
        return sorted(p.name for p in self.tables_dir.iterdir() if log_versions(p) is not None)

    def _known(self, name: str, version: int | None = None) -> None:
        """A clear error for an unknown table, or a version the table does not have."""
        versions = log_versions(self.path(name))
        if versions is None:
            known = ", ".join(self.tables()) or "none yet"
            raise UserError(f"unknown table '{name}' in lake {self.root} (tables: {known})")
        if version is not None and not versions[0] <= version <= versions[1]:
            raise UserError(
                f"table '{name}' has no version {version} (it has {versions[0]} to {versions[1]})"
            )

    # --- creation -------------------------------------------------------------------------------
    def create(
        self,
        name: str,
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] | None = None,
        change_feed: bool = True,
        description: str | None = None,
    ) -> None:
        """Create an empty table (version 0) unless it exists."""
        if self.exists(name):
            return
        self.tables_dir.mkdir(parents=True, exist_ok=True)
        statement = f"CREATE TABLE IF NOT EXISTS delta.`{self.uri(name)}` ({spark_ddl(schema)}) USING delta"
        if partition_by:
            statement += " PARTITIONED BY (" + ", ".join(f"`{c}`" for c in partition_by) + ")"
        if description:
            statement += " COMMENT '" + description.replace("\\", "\\\\").replace("'", "\\'") + "'"
        if change_feed:
            statement += " TBLPROPERTIES (" + ", ".join(f"'{k}' = '{v}'" for k, v in CDF.items()) + ")"
        try:
            self.spark.sql(statement)
        except Exception:
            # another process creating it at the same moment: its files are there (Delta refuses a
            # non-empty location) a little before its first commit is; wait for that commit
            deadline = time.monotonic() + 15
            while not self.exists(name):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def schema(self, name: str) -> pa.Schema:
        """The table's columns as an Arrow schema."""
        return arrow_schema(self.read(name).schema)

    def add_missing_columns(self, name: str, schema: pa.Schema) -> list[str]:
        """Add the (nullable) columns of ``schema`` that the table lacks; returns their names."""
        have = set(self.schema(name).names)
        if all(f.name in have for f in schema):
            return []
        missing = [f.with_nullable(True) for f in schema if f.name not in have]
        columns = spark_ddl(pa.schema(missing))
        try:
            self.spark.sql(f"ALTER TABLE delta.`{self.uri(name)}` ADD COLUMNS ({columns})")
        except Exception:
            if not set(schema.names) <= set(self.schema(name).names):
                raise  # else: another process added them at the same moment (its commit won)
        return [f.name for f in missing]

    def version(self, name: str) -> int:
        self._known(name)
        versions = log_versions(self.path(name))
        assert versions is not None
        return versions[1]

    # --- reads ----------------------------------------------------------------------------------
    def read(self, name: str, version: int | None = None) -> DataFrame:
        """The table (current, or as of ``version``) as a Spark DataFrame."""
        self._known(name, version)
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.uri(name))

    def read_arrow(self, name: str, version: int | None = None, columns: list[str] | None = None) -> pa.Table:
        """The table's rows collected to this process (for small tables, reports and tests)."""
        frame = self.read(name, version)
        if columns is not None:
            frame = frame.select(*[f"`{c}`" for c in columns])
        return arrow_rows(frame)

    def read_keys(
        self, name: str, column: str, values: pa.Array, columns: list[str] | None = None
    ) -> pa.Table:
        """Rows whose ``column`` is one of ``values``: an IN list for a few (Delta skips the files
        whose statistics cannot hold them), a broadcast semi-join for many."""
        from pyspark.sql import functions as F

        frame = self.read(name)
        wanted = columns if columns is not None else frame.columns
        if len(values) == 0:
            return arrow_schema(frame.select(*[f"`{c}`" for c in wanted]).schema).empty_table()
        if len(values) <= KEY_LOOKUP_LIMIT:
            frame = frame.filter(F.col(f"`{column}`").isin(values.to_pylist()))
        else:
            target = frame.schema[column].dataType
            keys = self.spark.createDataFrame(pa.table({column: values}).combine_chunks())
            keys = keys.select(F.col(f"`{column}`").cast(target).alias(column)).distinct()
            frame = frame.join(F.broadcast(keys), column, "left_semi")
        return arrow_rows(frame.select(*[f"`{c}`" for c in wanted]))

    def changes(self, name: str, starting_version: int = 0, ending_version: int | None = None) -> DataFrame:
        """The change data feed as a Spark DataFrame (``_change_type``, ``_commit_version``,
        ``_commit_timestamp`` as in Delta's own Spark source)."""
        self._known(name)
        reader = (
            self.spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", starting_version)
        )
        if ending_version is not None:
            reader = reader.option("endingVersion", ending_version)
        return reader.load(self.uri(name))

    def changes_arrow(
        self, name: str, starting_version: int = 0, ending_version: int | None = None
    ) -> pa.Table:
        """The change data feed of versions [starting, ending] in commit order."""
        table = arrow_rows(self.changes(name, starting_version, ending_version))
        return table.sort_by([("_commit_version", "ascending")])

    def files(self, name: str) -> DataFrame:
        """The table's current data files from the Delta log: ``partition`` values (a map), and per
        file ``num_records`` and the ``max_values`` of its statistics (a JSON object)."""
        from pyspark.sql import DataFrame as SparkFrame
        from pyspark.sql import functions as F

        self._known(name)
        jvm: Any = self.spark._jvm
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, self.uri(name))
        none = jvm.scala.Option.empty()
        files = SparkFrame(log.update(False, none, none).allFiles().toDF(), self.spark)
        stats = F.from_json("stats", "numRecords long, maxValues string")
        return files.select(
            F.col("partitionValues").alias("partition"),
            stats["numRecords"].alias("num_records"),
            stats["maxValues"].alias("max_values"),
        )

    def commit(self, name: str, version: int) -> CommitInfo:
        return read_commit(self.path(name), version)

    def rewrites(self, name: str, first: int, last: int) -> list[int]:
        """Versions in [first, last] that removed data files (overwrites, updates, deletes), read from
        the Delta log: an append-only log has none."""
        return [v for v in range(max(first, 0), last + 1) if self.commit(name, v).removed_data_files]

    # --- writes ---------------------------------------------------------------------------------
    def txn_version(self, name: str, app_id: str) -> int | None:
        """The last batch id of application ``app_id`` committed to the table (None: none yet)."""
        found = self._transactions(name).get(app_id)
        return int(found.get()) if found.isDefined() else None

    def last_txn(self, name: str) -> int | None:
        """The highest batch id any application has committed to the table (None: none)."""
        versions = self._transactions(name).values().toList()
        found = [int(versions.apply(i)) for i in range(versions.size())]
        return max(found) if found else None

    def _transactions(self, name: str) -> Any:
        """The table's application transactions as Delta's log holds them now (a Scala map of
        application id -> last batch id)."""
        self._known(name)
        jvm: Any = self.spark._jvm
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self.spark._jsparkSession, self.uri(name))
        none = jvm.scala.Option.empty()
        return log.update(False, none, none).transactions()

    def committed(self, name: str, txn: Txn | None) -> bool:
        """True when ``txn``'s batch (or a later one) of that application is already in the table."""
        if txn is None:
            return False
        last = self.txn_version(name, txn[0])
        return last is not None and last >= txn[1]

    def committed_version(self, name: str, txn: Txn, depth: int = 100) -> int | None:
        """The version that committed ``txn`` among the table's last ``depth`` commits (None: not
        among them): the version a replayed write skipped as already committed."""
        last = self.version(name)
        return self._commit_of(name, txn, range(last, max(last - depth, -1), -1))

    def _commit_of(self, name: str, txn: Txn, versions: Iterable[int]) -> int | None:
        """The first of ``versions`` whose commit carries ``txn`` (None: none of them; the search
        stops at a commit whose log entry is gone, kept in a checkpoint only)."""
        for version in versions:
            try:
                if self.commit(name, version).txn == txn:
                    return version
            except FileNotFoundError:
                break
        return None

    def never_written(self, name: str) -> bool:
        """True when the table is as created: its log holds the creating commit only, which added no
        file (from the log, no Spark)."""
        self._known(name)
        return self.version(name) == 0 and self.commit(name, 0).added_files == 0

    def append(self, name: str, data: Any, *, txn: Txn | None = None) -> int | None:
        """Append rows; returns the new version, or None when ``txn`` was already committed."""
        return self._write(name, data, "append", txn)

    def overwrite(self, name: str, data: Any, *, txn: Txn | None = None) -> int | None:
        """Replace all rows in one commit; returns the new version (None when skipped)."""
        return self._write(name, data, "overwrite", txn)

    def delete(self, name: str, condition: str) -> int | None:
        """Delete the rows matching the SQL ``condition`` in one commit; returns the new version (None:
        no row matched, nothing committed)."""
        self._known(name)
        statement = f"DELETE FROM delta.`{self.uri(name)}` WHERE {condition}"

        def attempt() -> None:
            self.spark.sql(statement).collect()

        return self._commit_with_retries(name, None, attempt)

    def frame(self, data: Any) -> DataFrame:
        """``data`` as a Spark DataFrame: a DataFrame as it is, an Arrow table (or anything exporting
        the Arrow C stream) created from the driver."""
        if _is_frame(data):
            return data
        from spark_jobs.seams.session import arrow_frame

        table = _to_arrow_table(data)
        frame = arrow_frame(self.spark, table)
        return frame.coalesce(1) if table.num_rows <= ONE_FILE_ROWS else frame

    def _conformed(
        self, name: str, frame: DataFrame, what: str, extra_column: str | None = None
    ) -> list[Any]:
        """``frame``'s columns in the table's order and types (a missing or extra column, besides
        ``extra_column``, is an error)."""
        from pyspark.sql import functions as F

        target = self.read(name).schema
        missing = [f.name for f in target if f.name not in frame.columns]
        extra = [c for c in frame.columns if c not in target.names and c != extra_column]
        if missing or extra:
            raise ValueError(
                f"{what} into {name}: columns do not match the table (missing: {missing or 'none'}, "
                f"unexpected: {extra or 'none'})"
            )
        return [F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in target]

    def _write(self, name: str, data: Any, mode: str, txn: Txn | None) -> int | None:
        frame = self.frame(data)
        rows = frame.select(*self._conformed(name, frame, mode))  # an unknown table: a clear error

        def attempt() -> None:
            writer = rows.write.format("delta").mode(mode)
            if txn is not None:
                writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
            writer.save(self.uri(name))

        return self._commit_with_retries(name, txn, attempt)

    def merge(
        self,
        name: str,
        data: Any,
        keys: Sequence[str],
        *,
        delete_column: str | None = None,
        txn: Txn | None = None,
        skip_unchanged: bool = False,
    ) -> int | None:
        """Upsert rows by primary key ``keys``; with ``delete_column`` (boolean), rows flagged true
        delete the matching target row instead; with ``skip_unchanged``, a row equal to the target's
        (null-safe, column by column) leaves it as it is (no update in the change feed). One atomic
        commit (a Spark SQL ``MERGE INTO``); returns the new version, or None when there was nothing
        to do or ``txn`` was already committed."""
        from pyspark.sql import functions as F

        if not _is_frame(data):
            table = _to_arrow_table(data)
            if table.num_rows == 0:
                return None
            _check_unique(table, keys, name)
        frame = self.frame(data)
        flag = F.lit(False)
        if delete_column:
            flag = F.coalesce(F.col(f"`{delete_column}`").cast("boolean"), F.lit(False))
        source = frame.select(*self._conformed(name, frame, "merge", delete_column), flag.alias("__delete"))
        columns = source.columns[:-1]
        update = "WHEN MATCHED THEN UPDATE"
        if skip_unchanged:
            types = {f.name: f.dataType.simpleString() for f in source.schema}
            same = " AND ".join(_same(c, types[c]) for c in columns if c not in keys)
            update = f"WHEN MATCHED AND NOT ({same or 'true'}) THEN UPDATE"
        view = f"lake_merge_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        assign = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
        names = ", ".join(f"`{c}`" for c in columns)
        values = ", ".join(f"s.`{c}`" for c in columns)
        statement = (
            f"MERGE INTO delta.`{self.uri(name)}` t USING {view} s ON {on} "
            f"WHEN MATCHED AND s.__delete THEN DELETE "
            f"{update} SET {assign} "
            f"WHEN NOT MATCHED AND NOT s.__delete THEN INSERT ({names}) VALUES ({values})"
        )
        spark = source.sparkSession  # foreachBatch's frames belong to the query's own session

        def attempt() -> None:
            with _DML_TXN:
                if txn is not None:
                    spark.conf.set(TXN_APP, txn[0])
                    spark.conf.set(TXN_VERSION, str(txn[1]))
                try:
                    spark.sql(statement)
                finally:
                    spark.conf.unset(TXN_APP)
                    spark.conf.unset(TXN_VERSION)

        try:
            return self._commit_with_retries(name, txn, attempt)
        finally:
            spark.catalog.dropTempView(view)

    def _commit_with_retries(self, name: str, txn: Txn | None, attempt: Callable[[], None]) -> int | None:
        """Run ``attempt``, again on an optimistic-concurrency conflict (Delta's
        ``Concurrent...Exception`` family, through py4j). Delta itself skips a write whose ``txn`` is
        committed already; which version (if any) the write made is read from the log's new commits."""
        for n in range(CONFLICT_RETRIES + 1):
            before = self.version(name)
            try:
                attempt()
            except Exception as exc:
                fenced = fences.refusal(str(exc))
                if fenced:  # a lease of this process may have lapsed: this write, and all after it
                    raise UserError(f"table {name}: {fenced}") from None
                conflict = "Concurrent" in type(exc).__name__ + str(exc)[:300]
                if not conflict or n == CONFLICT_RETRIES:
                    raise
                time.sleep(min(0.05 * 2**n, 2.0))
                continue
            return self._made_by(name, before, txn)
        return None

    def _made_by(self, name: str, before: int, txn: Txn | None) -> int | None:
        """The version after ``before`` that this write committed: for a ``txn`` the commit carrying it
        (None: Delta skipped the write as already committed), else the newest."""
        after = self.version(name)
        if txn is None:
            return after if after > before else None
        return self._commit_of(name, txn, range(before + 1, after + 1))


def _same(column: str, spark_type: str) -> str:
    """SQL: target and source hold the same value in ``column`` (nulls equal); maps are compared as
    JSON, since Spark does not compare map values."""
    if "map<" in spark_type:
        return f"to_json(named_struct('v', t.`{column}`)) <=> to_json(named_struct('v', s.`{column}`))"
    return f"t.`{column}` <=> s.`{column}`"


def arrow_rows(frame: DataFrame) -> pa.Table:
    """A DataFrame's rows as an Arrow table (with its schema, also when empty)."""
    table = frame.toArrow()
    schema = arrow_schema(frame.schema)
    return table.cast(schema) if table.num_columns else schema.empty_table()


def _is_frame(data: Any) -> bool:
    """A Spark DataFrame (written by Delta's Spark integration as it is, not collected)."""
    return hasattr(data, "sparkSession") and hasattr(data, "write")


def _to_arrow_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "__arrow_c_stream__"):
        return pa.RecordBatchReader.from_stream(data).read_all()
    raise TypeError(f"cannot write {type(data).__name__} to a Delta table")


def _check_unique(source: pa.Table, keys: Sequence[str], name: str) -> None:
    counts = source.group_by(list(keys)).aggregate([([], "count_all")])
    if counts.num_rows != source.num_rows:
        raise ValueError(f"merge into {name}: the source has several rows for one key {list(keys)}")
