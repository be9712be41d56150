"""The join kinds, described once: what a pipeline file may say for each, and what its result holds.

The config seam validates a join against its kind's entry, and the engine, the oracle and the test
driver ask the entry instead of comparing kind strings. The code that runs a kind is chosen by
``spark_jobs.joins.registry.job_for`` (one engine class per kind, one module each). Plain Python
only: the DAG files parse pipeline files at Airflow's parse time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JoinKind:
    name: str
    types: tuple[str, ...]  # the join types it takes; the first is the default
    settings: tuple[str, ...]  # the settings it takes besides kind, left, type, select and publish
    # columns every result carries besides select's (select may not use them): its key, its time, and
    # where it came from (the partition and offset of the input records it was computed from)
    meta_columns: tuple[str, ...]
    keyed_by: str | None = None  # the setting whose expression keys the left records (fk, derive, list)
    events: bool = False  # the result is an append-only log of events, not a table keyed by `key`
    # the meta columns whose values depend on how records fell into micro-batches when a key's records
    # arrive out of timestamp order (its value time and the record that began its value): a record
    # older than its key's accepted version changes nothing, so the run of equal values it would
    # split in a batch join is not split
    arrival_columns: tuple[str, ...] = ()
    # what ``lake explain`` asks of a row: the meta columns naming its input records (the left
    # record's partition and offset first), whether a row may lack its left record (a table join's
    # outer rows), and whether its right record is the one as of the left event's time
    provenance: tuple[str, ...] = ()
    left_may_be_missing: bool = False
    right_as_of_event: bool = False

    @property
    def has_right(self) -> bool:
        return "right" in self.settings

    @property
    def right_by_key(self) -> bool:
        """A row's right record has the row's own key (table, stream-table, stream-stream)."""
        return self.has_right and self.keyed_by is None

    @property
    def by_foreign_key(self) -> bool:
        """A row's right record is the one its left record's foreign key names (fk)."""
        return self.has_right and self.keyed_by == "foreign_key"

    @property
    def rekeyed(self) -> bool:
        """The result is keyed by a value of the left records, not by their keys (derive)."""
        return not self.has_right and self.keyed_by is not None

    @property
    def references(self) -> bool:
        """The left records reference right keys by a value inside them (fk, list): a Kafka Streams
        join of this kind sends its subscriptions to the right topic's partition of each key."""
        return self.has_right and self.keyed_by is not None

    @property
    def has_list(self) -> bool:
        """The left records hold a list of references (list), each of them joined."""
        return self.keyed_by == "list"


# a keyed result's provenance: the record each side's value came from (null: that side has no value)
SOURCES = ("left_partition", "left_offset", "right_partition", "right_offset")

TABLE = JoinKind(
    "table",
    ("inner", "left", "outer"),
    ("right", "table_every"),
    ("key", "timestamp", *SOURCES),
    arrival_columns=("timestamp", *SOURCES),
    provenance=SOURCES,
    left_may_be_missing=True,
)
STREAM_TABLE = JoinKind(
    "stream-table",
    ("inner", "left"),
    ("right", "grace"),
    ("key", "timestamp", "partition", "offset", "right_partition", "right_offset"),
    events=True,
    arrival_columns=("right_partition", "right_offset"),
    provenance=("partition", "offset", "right_partition", "right_offset"),
    right_as_of_event=True,
)
STREAM_STREAM = JoinKind(
    "stream-stream",
    ("inner", "left", "outer"),
    ("right", "window"),
    (
        "key",
        "left_timestamp",
        "left_partition",
        "left_offset",
        "right_timestamp",
        "right_partition",
        "right_offset",
    ),
    events=True,
    provenance=SOURCES,
)
FK = JoinKind(
    "fk",
    ("inner", "left"),
    ("right", "foreign_key", "table_every"),
    ("key", "timestamp", *SOURCES),
    keyed_by="foreign_key",
    arrival_columns=("timestamp", *SOURCES),
    provenance=SOURCES,
)
LIST = JoinKind(
    "list",
    ("left", "inner"),
    ("right", "list", "element_id", "elements", "as", "table_every"),
    # element_sources: per list position, its id and its right record's partition and offset
    ("key", "timestamp", "left_partition", "left_offset", "element_sources"),
    keyed_by="list",
    arrival_columns=("timestamp", "left_partition", "left_offset", "element_sources"),
    provenance=("left_partition", "left_offset", "element_sources"),
)
DERIVE = JoinKind(
    "derive",
    ("inner",),
    ("key", "table_every"),
    ("key", "timestamp", "master_key", "left_partition", "left_offset"),
    keyed_by="key",
    arrival_columns=("timestamp", "left_partition", "left_offset"),
    provenance=("left_partition", "left_offset"),
)

KINDS: dict[str, JoinKind] = {k.name: k for k in (TABLE, STREAM_TABLE, STREAM_STREAM, FK, LIST, DERIVE)}


def referencing(setting: str) -> JoinKind:
    """The kind whose left records reference right keys through ``setting`` (``foreign_key``: fk,
    ``list``: list)."""
    return next(k for k in KINDS.values() if k.references and k.keyed_by == setting)
