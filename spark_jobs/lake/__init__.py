"""The storage seam: every Delta table of the product is read and written through :class:`Lake`.

Tables live under a lake root (``--root`` / ``LAKE_ROOT``, default ``./lakehouse``) as
``<root>/tables/<name>``. Spark reads and streams them with Delta's own Spark source
(``format("delta")``, delta-spark), and the Kafka ingest writes the bronze tables with it.

Writes (append, overwrite, merge) are one atomic Delta commit each. Data given as a Spark DataFrame
is written by Delta's Spark integration on the executors (lookups, backfill quarantine, quality
runs); data given as an Arrow table is written by delta-rs from the driver. The join engine's
driver-side batches are the last Arrow writers; they go when its state moves to Spark's state store.
A write may carry an application id and a batch id (``txn=(app_id, batch_id)``) recorded as a Delta
``txn`` action; a write whose batch id is not newer than the recorded one is skipped, so a replayed
streaming batch changes nothing. Optimistic-concurrency conflicts are retried on a fresh snapshot.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.schema import Field as DeltaField

from spark_jobs.config import resolve_root
from spark_jobs.errors import UserError
from spark_jobs.layout import Layout

if TYPE_CHECKING:
    import pyarrow.dataset as pads
    from pyspark.sql import DataFrame, SparkSession

CDF = {"delta.enableChangeDataFeed": "true"}
# Delta's idempotent DML reads the transaction from these session settings: one writer at a time
_DML_TXN = threading.Lock()
TXN_APP, TXN_VERSION = "spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion"
CONFLICT_RETRIES = 8
KEY_LOOKUP_LIMIT = 20_000  # read_keys: above this many values a scan is cheaper than the IN list

Txn = tuple[str, int]  # (application id, batch id)


def table_arrow_schema(dt: DeltaTable) -> pa.Schema:
    return pa.schema(dt.schema().to_arrow())


def to_arrow_table(data: Any) -> pa.Table:
    """An Arrow table/batch/reader, or any object exporting the Arrow C stream interface, as a
    ``pyarrow.Table``."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "__arrow_c_stream__"):
        return pa.RecordBatchReader.from_stream(data).read_all()
    raise TypeError(f"cannot write {type(data).__name__} to a Delta table")


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


def without_views(table: pa.Table) -> pa.Table:
    """delta-rs returns string/binary *view* columns, which some Arrow kernels (take, sort) lack."""
    fields = []
    for f in table.schema:
        if pa.types.is_string_view(f.type):
            f = f.with_type(pa.large_string())
        elif pa.types.is_binary_view(f.type):
            f = f.with_type(pa.large_binary())
        fields.append(f)
    return table.cast(pa.schema(fields))


@dataclass(frozen=True)
class CommitInfo:
    """What one Delta commit did, read from its log entry."""

    version: int
    timestamp_ms: int
    operation: str
    added_files: int
    removed_data_files: int  # remove actions with dataChange=true (updates/deletes)
    cdc_files: int


def read_commit(table_path: str | os.PathLike[str], version: int) -> CommitInfo:
    """Summarize the actions of commit ``version`` of the table at ``table_path``."""
    log = Path(table_path) / "_delta_log" / f"{version:020d}.json"
    added = removed = cdc = 0
    ts = 0
    op = ""
    with open(log, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            action = json.loads(line)
            if "add" in action:
                added += 1
            elif "remove" in action and action["remove"].get("dataChange", True):
                removed += 1
            elif "cdc" in action:
                cdc += 1
            elif "commitInfo" in action:
                ts = int(action["commitInfo"].get("timestamp", 0))
                op = action["commitInfo"].get("operation", "")
    return CommitInfo(version, ts, op, added, removed, cdc)


class Lake:
    """All Delta tables of one lake root."""

    def __init__(self, root: str | os.PathLike[str] | None = None):
        self.root = resolve_root(root)

    # --- locations ------------------------------------------------------------------------------
    @property
    def tables_dir(self) -> Path:
        return Layout(self.root).tables

    def path(self, name: str) -> Path:
        return self.tables_dir / name

    def uri(self, name: str) -> str:
        return str(self.path(name))

    def exists(self, name: str) -> bool:
        return DeltaTable.is_deltatable(self.uri(name))

    @contextmanager
    def lock(
        self,
        name: str,
        log: Callable[[str], None] | None = None,
        *,
        shared: bool = False,
        wait: bool = True,
    ) -> Iterator[bool]:
        """Hold ``<root>/_locks/<name>.lock`` while the block runs: exclusively (work that several
        processes may start at once, such as overlapping Airflow DAGs, runs one at a time), or
        ``shared`` with other shared holders. Waits for a conflicting holder, or with ``wait=False``
        yields False at once instead of taking the lock (True when taken). The lock dies with its
        process, so a killed holder never leaves it taken."""
        folder = Layout(self.root).locks
        folder.mkdir(parents=True, exist_ok=True)
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        with open(folder / f"{name}.lock", "w") as handle:
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
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def tables(self) -> list[str]:
        if not self.tables_dir.is_dir():
            return []
        return sorted(p.name for p in self.tables_dir.iterdir() if DeltaTable.is_deltatable(str(p)))

    def table(self, name: str, version: int | None = None) -> DeltaTable:
        try:
            return DeltaTable(self.uri(name), version=version)
        except TableNotFoundError:
            known = ", ".join(self.tables()) or "none yet"
            raise UserError(f"unknown table '{name}' in lake {self.root} (tables: {known})") from None
        except Exception as exc:  # delta-rs raises a generic error for a missing version
            if version is not None and "version" in str(exc).lower():
                raise UserError(f"table '{name}' has no version {version}: {exc}") from None
            raise

    # --- creation -------------------------------------------------------------------------------
    def create(
        self,
        name: str,
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] | None = None,
        change_feed: bool = True,
        description: str | None = None,
    ) -> DeltaTable:
        """Create an empty table (version 0) unless it exists; returns it either way."""
        if self.exists(name):
            return self.table(name)
        self.tables_dir.mkdir(parents=True, exist_ok=True)
        try:
            return DeltaTable.create(
                self.uri(name),
                schema,
                mode="error",
                partition_by=list(partition_by) if partition_by else None,
                name=name,
                description=description,
                configuration=CDF if change_feed else None,
            )
        except Exception:
            if self.exists(name):  # created concurrently by another process
                return self.table(name)
            raise

    def add_missing_columns(self, name: str, schema: pa.Schema) -> list[str]:
        """Add the (nullable) columns of ``schema`` that the table lacks; returns their names."""
        have = set(table_arrow_schema(self.table(name)).names)
        missing = [f.with_nullable(True) for f in schema if f.name not in have]
        if missing:
            self.table(name).alter.add_columns([DeltaField.from_arrow(f) for f in missing])
        return [f.name for f in missing]

    def version(self, name: str) -> int:
        return self.table(name).version()

    def read_arrow(
        self,
        name: str,
        version: int | None = None,
        columns: list[str] | None = None,
        filter: pads.Expression | None = None,
    ) -> pa.Table:
        dataset = self.table(name, version).to_pyarrow_dataset()
        return dataset.to_table(columns=columns, filter=filter)

    def read_keys(
        self, name: str, column: str, values: pa.Array, columns: list[str] | None = None
    ) -> pa.Table:
        """Rows whose ``column`` is one of ``values``, reading only the files and row groups whose
        statistics can hold them (DataFusion through delta-rs: Arrow's own dataset filter fails on
        the binary-view statistics of files that delta-rs merges write). Large value sets scan."""
        dt = self.table(name)
        schema = table_arrow_schema(dt)
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        if len(values) == 0:
            return schema.empty_table()
        if len(values) > KEY_LOOKUP_LIMIT:
            table = self.read_arrow(name, columns=list(dict.fromkeys([*schema.names, column])))
            table = table.filter(pc.is_in(table[column], values.cast(table.schema.field(column).type)))
            return table.select(schema.names)
        literals = ",".join(_sql_literal(v) for v in values.to_pylist())
        projection = ", ".join(f'"{c}"' for c in schema.names)
        query = QueryBuilder().register("t", dt)
        result = query.execute(f'SELECT {projection} FROM t WHERE "{column}" IN ({literals})')
        return without_views(pa.table(result.read_all())).cast(schema)

    def changes_arrow(
        self, name: str, starting_version: int = 0, ending_version: int | None = None
    ) -> pa.Table:
        """The change data feed of versions [starting, ending] in commit order."""
        dt = self.table(name)
        reader = dt.load_cdf(starting_version=starting_version, ending_version=ending_version)
        table = without_views(pa.RecordBatchReader.from_stream(reader).read_all())
        return table.sort_by([("_commit_version", "ascending")])

    def add_actions(self, name: str, version: int | None = None) -> pa.Table:
        return pa.table(self.table(name, version).get_add_actions(flatten=True))

    def commit(self, name: str, version: int) -> CommitInfo:
        return read_commit(self.path(name), version)

    def rewrites(self, name: str, first: int, last: int) -> list[int]:
        """Versions in [first, last] that removed data files (overwrites, updates, deletes), read from
        the Delta log: an append-only log has none."""
        return [v for v in range(max(first, 0), last + 1) if self.commit(name, v).removed_data_files]

    def read(self, spark: SparkSession, name: str, version: int | None = None) -> DataFrame:
        """The table (current, or as of ``version``) as a Spark DataFrame."""
        self.table(name, version)  # clear error for unknown tables / versions
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.uri(name))

    def changes(
        self,
        spark: SparkSession,
        name: str,
        starting_version: int = 0,
        ending_version: int | None = None,
    ) -> DataFrame:
        """The change data feed as a Spark DataFrame (``_change_type``, ``_commit_version``,
        ``_commit_timestamp`` as in Delta's own Spark source)."""
        self.table(name)
        reader = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", starting_version)
        )
        if ending_version is not None:
            reader = reader.option("endingVersion", ending_version)
        return reader.load(self.uri(name))

    # --- writes ---------------------------------------------------------------------------------
    def committed(self, name: str, txn: Txn | None) -> bool:
        """True when ``txn``'s batch (or a later one) of that application is already in the table."""
        if txn is None:
            return False
        app_id, batch_id = txn
        last = self.table(name).transaction_version(app_id)
        return last is not None and last >= batch_id

    def append(self, name: str, data: Any, *, txn: Txn | None = None) -> int | None:
        """Append rows; returns the new version, or None when ``txn`` was already committed."""
        return self._write(name, data, "append", txn)

    def overwrite(self, name: str, data: Any, *, txn: Txn | None = None) -> int | None:
        """Replace all rows in one commit; returns the new version (None when skipped)."""
        return self._write(name, data, "overwrite", txn)

    def _write(self, name: str, data: Any, mode: str, txn: Txn | None) -> int | None:
        if _is_frame(data):
            return self._spark_write(name, data, mode, txn)
        dt = self.table(name)
        table = conform(to_arrow_table(data), table_arrow_schema(dt), f"{mode} into {name}")

        def attempt() -> None:
            write_deltalake(
                self.uri(name),
                table,
                mode=mode,  # type: ignore[arg-type, call-overload]
                commit_properties=_commit_properties(txn),
            )

        return self._commit_with_retries(name, txn, attempt)

    def merge(
        self,
        name: str,
        data: Any,
        keys: Sequence[str],
        *,
        delete_column: str | None = None,
        txn: Txn | None = None,
    ) -> int | None:
        """Upsert rows by primary key ``keys``; with ``delete_column`` (boolean), rows flagged true
        delete the matching target row instead. One atomic commit; returns the new version, or None
        when there was nothing to do or ``txn`` was already committed."""
        if _is_frame(data):
            return self._spark_merge(name, data, keys, delete_column, txn)
        dt = self.table(name)
        schema = table_arrow_schema(dt)
        source = to_arrow_table(data)
        if delete_column is not None:
            flags = source.column(delete_column).cast(pa.bool_()).fill_null(False)
            source = conform(source.drop_columns([delete_column]), schema, f"merge into {name}")
            source = source.append_column("__delete", flags)
        else:
            source = conform(source, schema, f"merge into {name}")
        if source.num_rows == 0:
            return None
        _check_unique(source, keys, name)
        predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        columns = {f"`{c}`": f"s.`{c}`" for c in schema.names}

        def attempt() -> None:
            merger = self.table(name).merge(
                source,
                predicate,
                source_alias="s",
                target_alias="t",
                commit_properties=_commit_properties(txn),
            )
            if delete_column is not None:
                merger = merger.when_matched_delete(predicate="s.`__delete` = true")
                merger = merger.when_matched_update(columns, predicate="s.`__delete` = false")
                merger = merger.when_not_matched_insert(columns, predicate="s.`__delete` = false")
            else:
                merger = merger.when_matched_update(columns).when_not_matched_insert(columns)
            merger.execute()

        return self._commit_with_retries(name, txn, attempt)

    # --- writes through Delta's Spark integration (the data stays on the executors) --------------
    def _conformed(
        self, name: str, frame: DataFrame, what: str, extra_column: str | None = None
    ) -> list[Any]:
        """``frame``'s columns in the table's order and types (a missing or extra column, besides
        ``extra_column``, is an error)."""
        from pyspark.sql import functions as F

        target = self.read(frame.sparkSession, name).schema
        missing = [f.name for f in target if f.name not in frame.columns]
        extra = [c for c in frame.columns if c not in target.names and c != extra_column]
        if missing or extra:
            raise ValueError(
                f"{what} into {name}: columns do not match the table (missing: {missing or 'none'}, "
                f"unexpected: {extra or 'none'})"
            )
        return [F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in target]

    def txn_version(self, spark: SparkSession, name: str, app_id: str) -> int | None:
        """The last batch id of application ``app_id`` committed to the table (None: none yet)."""
        jvm: Any = spark._jvm
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, self.uri(name))
        none = jvm.scala.Option.empty()
        found = log.update(False, none, none).transactions().get(app_id)
        return int(found.get()) if found.isDefined() else None

    def _spark_committed(self, spark: SparkSession, name: str, txn: Txn | None) -> bool:
        if txn is None:
            return False
        last = self.txn_version(spark, name, txn[0])
        return last is not None and last >= txn[1]

    def _spark_write(self, name: str, frame: DataFrame, mode: str, txn: Txn | None) -> int | None:
        rows = frame.select(*self._conformed(name, frame, mode))  # an unknown table: a clear error

        def attempt() -> None:
            writer = rows.write.format("delta").mode(mode)
            if txn is not None:
                writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
            writer.save(self.uri(name))

        spark = frame.sparkSession
        return self._commit_with_retries(name, txn, attempt, lambda: self._spark_committed(spark, name, txn))

    def _spark_merge(
        self, name: str, frame: DataFrame, keys: Sequence[str], delete_column: str | None, txn: Txn | None
    ) -> int | None:
        from pyspark.sql import functions as F

        spark = frame.sparkSession
        flag = F.lit(False)
        if delete_column:
            flag = F.coalesce(F.col(f"`{delete_column}`").cast("boolean"), F.lit(False))
        source = frame.select(*self._conformed(name, frame, "merge", delete_column), flag.alias("__delete"))
        columns = source.columns[:-1]
        view = f"lake_merge_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        assign = ", ".join(f"t.`{c}` = s.`{c}`" for c in columns)
        names = ", ".join(f"`{c}`" for c in columns)
        values = ", ".join(f"s.`{c}`" for c in columns)
        statement = (
            f"MERGE INTO delta.`{self.uri(name)}` t USING {view} s ON {on} "
            f"WHEN MATCHED AND s.__delete THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {assign} "
            f"WHEN NOT MATCHED AND NOT s.__delete THEN INSERT ({names}) VALUES ({values})"
        )

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
            return self._commit_with_retries(
                name, txn, attempt, lambda: self._spark_committed(spark, name, txn)
            )
        finally:
            spark.catalog.dropTempView(view)

    def _commit_with_retries(
        self,
        name: str,
        txn: Txn | None,
        attempt: Callable[[], None],
        committed: Callable[[], bool] | None = None,
    ) -> int | None:
        """Run ``attempt`` unless ``txn`` is committed already (``committed``: how to tell, by
        default from delta-rs), again on an optimistic-concurrency conflict (delta-rs's
        ``CommitFailedError``, Delta's Spark ``Concurrent...Exception`` family through py4j)."""
        done = committed or (lambda: self.committed(name, txn))
        for n in range(CONFLICT_RETRIES + 1):
            if done():
                return None
            try:
                attempt()
                return self.version(name)
            except Exception as exc:
                conflict = (
                    isinstance(exc, CommitFailedError) or "Concurrent" in type(exc).__name__ + str(exc)[:300]
                )
                if not conflict or n == CONFLICT_RETRIES:
                    raise
                time.sleep(min(0.05 * 2**n, 2.0))
        return None


def _is_frame(data: Any) -> bool:
    """A Spark DataFrame (written by Delta's Spark integration, not collected)."""
    return hasattr(data, "sparkSession") and hasattr(data, "write")


def _sql_literal(value: Any) -> str:
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"no SQL literal for {type(value).__name__}")
    return str(value)


def _commit_properties(txn: Txn | None) -> CommitProperties:
    if txn is None:
        return CommitProperties(max_commit_retries=CONFLICT_RETRIES)
    app_id, batch_id = txn
    return CommitProperties(
        max_commit_retries=CONFLICT_RETRIES,
        app_transactions=[Transaction(app_id, batch_id, int(time.time() * 1000))],
    )


def _check_unique(source: pa.Table, keys: Sequence[str], name: str) -> None:
    counts = source.group_by(list(keys)).aggregate([([], "count_all")])
    if counts.num_rows != source.num_rows:
        raise ValueError(f"merge into {name}: the source has several rows for one key {list(keys)}")
