"""``spark.read.format("delta")`` / ``spark.readStream.format("delta")`` over delta-rs.

A Spark Python data source with the options and output columns of Delta Lake's own Spark source where
they apply, so job code runs unchanged on a cluster that has Delta's jars:

batch
  ``versionAsOf``, ``timestampAsOf``; ``readChangeFeed`` with ``startingVersion`` / ``endingVersion``
  adds ``_change_type``, ``_commit_version``, ``_commit_timestamp``.
stream
  Offsets are table versions; each micro-batch delivers what was committed after the previous one, in
  commit order (``_commit_version`` increases). Without ``startingVersion`` the first batch is the
  table's snapshot at the start (for ``readChangeFeed`` as ``insert`` rows), like Delta.
  ``startingVersion`` (a number or ``latest``) starts from changes instead. Without ``readChangeFeed``
  only appended rows are delivered and a commit that updates or deletes rows fails the query, unless
  ``skipChangeCommits`` is true (then such commits are skipped), as in Delta.
  ``maxFilesPerTrigger`` caps the data files admitted per micro-batch (whole commits only; at least
  one commit per batch).

Each Spark task reads one data file (snapshots) or one commit (changes) through delta-rs and hands Arrow
record batches to Spark. Workers must run the project's interpreter (``PYSPARK_PYTHON``), which the
session factory sets.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from spark_jobs.lake import read_commit, without_views

CDF_COLUMNS = [
    StructField("_change_type", StringType()),
    StructField("_commit_version", LongType()),
    StructField("_commit_timestamp", TimestampType()),
]


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _spark_schema(dt: DeltaTable, change_feed: bool) -> StructType:
    schema = StructType.fromJson(json.loads(dt.schema().to_json()))
    if change_feed:
        for field in CDF_COLUMNS:
            schema = schema.add(field)
    return schema


@dataclass(frozen=True)
class _FileSplit:
    """One data file of a snapshot."""

    table: str
    path: str
    partition_values: dict[str, Any]
    version: int
    commit_ms: int | None  # set when the snapshot is delivered as change-feed inserts


@dataclass(frozen=True)
class _CommitSplit:
    """The change feed of one or more consecutive commits."""

    table: str
    first: int
    last: int


class _Part(InputPartition):
    def __init__(self, split: _FileSplit | _CommitSplit):
        super().__init__(split)


def _read_split(partition: Any, schema: StructType, change_feed: bool) -> Any:
    """Rows of one split. An empty plan (no files) still gets one read() call, without a split."""
    split = getattr(partition, "value", None)
    if split is None:
        return
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    if isinstance(split, _FileSplit):
        table = pq.read_table(os.path.join(split.table, split.path))
        n = table.num_rows
        for col, value in split.partition_values.items():
            if col not in table.column_names:
                typ = arrow_schema.field(col).type
                table = table.append_column(col, pa.array([value] * n).cast(typ))
        if change_feed:
            ts = datetime.fromtimestamp((split.commit_ms or 0) / 1000, tz=UTC)
            table = table.append_column("_change_type", pa.array(["insert"] * n, pa.string()))
            table = table.append_column("_commit_version", pa.array([split.version] * n, pa.int64()))
            table = table.append_column("_commit_timestamp", pa.array([ts] * n, pa.timestamp("us", tz="UTC")))
    else:
        reader = DeltaTable(split.table).load_cdf(starting_version=split.first, ending_version=split.last)
        table = without_views(pa.RecordBatchReader.from_stream(reader).read_all())
        if not change_feed:
            table = table.filter(pc.equal(table["_change_type"], "insert"))
        table = table.sort_by([("_commit_version", "ascending")])
    table = table.select(arrow_schema.names).cast(arrow_schema)
    yield from table.to_batches()


def _snapshot_splits(path: str, version: int, change_feed: bool) -> list[_Part]:
    dt = DeltaTable(path, version=version)
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    commit_ms = read_commit(path, version).timestamp_ms if change_feed else None
    parts = []
    for action in actions:
        values = {k[len("partition.") :]: v for k, v in action.items() if k.startswith("partition.")}
        parts.append(_Part(_FileSplit(path, action["path"], values, version, commit_ms)))
    return parts


class _BatchReader(DataSourceReader):
    def __init__(self, path: str, options: Mapping[str, str], schema: StructType):
        self.path = path
        self.schema = schema
        self.change_feed = _truthy(options.get("readChangeFeed"))
        self.options = options

    def partitions(self) -> list[_Part]:
        if self.change_feed:
            first = int(self.options.get("startingVersion", 0))
            last = self.options.get("endingVersion")
            last_v = int(last) if last is not None else DeltaTable(self.path).version()
            return [_Part(_CommitSplit(self.path, v, v)) for v in range(first, last_v + 1)]
        version = _as_of_version(self.path, self.options)
        return _snapshot_splits(self.path, version, change_feed=False)

    def read(self, partition: InputPartition):
        yield from _read_split(partition, self.schema, self.change_feed)


def _as_of_version(path: str, options: Mapping[str, str]) -> int:
    if options.get("versionAsOf") is not None:
        return int(options["versionAsOf"])
    dt = DeltaTable(path)
    if options.get("timestampAsOf") is not None:
        dt.load_as_version(datetime.fromisoformat(options["timestampAsOf"]))
    return dt.version()


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, path: str, options: Mapping[str, str], schema: StructType):
        self.path = path
        self.schema = schema
        self.change_feed = _truthy(options.get("readChangeFeed"))
        self.skip_change_commits = _truthy(options.get("skipChangeCommits"))
        self.starting = options.get("startingVersion")
        max_files = options.get("maxFilesPerTrigger")
        self.max_files = int(max_files) if max_files is not None else None
        self.target: int | None = None

    def _latest(self) -> int:
        latest = DeltaTable(self.path).version()
        return latest if self.target is None else min(latest, self.target)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = DeltaTable(self.path).version()

    def initialOffset(self) -> dict:
        if self.starting is None:
            return {"version": -1, "snapshot": True}
        if str(self.starting).lower() == "latest":
            return {"version": DeltaTable(self.path).version(), "snapshot": False}
        return {"version": int(self.starting) - 1, "snapshot": False}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_files is None else ReadMaxFiles(self.max_files)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = self._latest()
        begin = int(start["version"])
        if latest <= begin:
            return start
        if start.get("snapshot"):
            return {"version": latest, "snapshot": False}
        end = latest
        if isinstance(limit, ReadMaxFiles):
            files = 0
            for v in range(begin + 1, latest + 1):
                files += max(read_commit(self.path, v).added_files, 1)
                if files >= limit.max_files or v == latest:
                    end = v
                    break
        return {"version": end, "snapshot": False}

    def reportLatestOffset(self) -> dict:
        return {"version": DeltaTable(self.path).version(), "snapshot": False}

    def partitions(self, start: dict, end: dict) -> list[_Part]:
        begin, stop = int(start["version"]), int(end["version"])
        if start.get("snapshot"):
            return _snapshot_splits(self.path, stop, self.change_feed)
        parts = []
        for v in range(begin + 1, stop + 1):
            if not self.change_feed:
                commit = read_commit(self.path, v)
                if commit.removed_data_files:
                    if self.skip_change_commits:
                        continue
                    raise RuntimeError(
                        f"delta source: commit {v} of {self.path} ({commit.operation}) updates or "
                        "deletes rows; read it with readChangeFeed=true, or set "
                        "skipChangeCommits=true to ignore such commits"
                    )
                if commit.added_files == 0:
                    continue
            parts.append(_Part(_CommitSplit(self.path, v, v)))
        return parts

    def read(self, partition: InputPartition):
        yield from _read_split(partition, self.schema, self.change_feed)

    def commit(self, end: dict) -> None:
        return None


class DeltaDataSource(DataSource):
    """Registered under the name ``delta`` by :func:`register`."""

    @classmethod
    def name(cls) -> str:
        return "delta"

    def _path(self) -> str:
        path = self.options.get("path")
        if not path:
            raise ValueError("delta source: give the table path, e.g. .load('/lake/tables/name')")
        return path

    def schema(self) -> StructType:
        path = self._path()
        version = None
        if self.options.get("versionAsOf") is not None:
            version = int(self.options["versionAsOf"])
        return _spark_schema(DeltaTable(path, version=version), _truthy(self.options.get("readChangeFeed")))

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(self._path(), self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(self._path(), self.options, schema)


def register(spark) -> None:
    spark.dataSource.register(DeltaDataSource)
