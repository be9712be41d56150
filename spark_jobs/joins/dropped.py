"""Why a join did not use a record: the reasons its metrics count dropped records by.

Every record a join does not use is quarantined (``quarantine`` table: its topic, partition, offset,
key and value, the join, a sentence saying why and the reason in one word, ``cause``); the metrics
count the same records by the same reasons (``lake_join_dropped_records_total{reason=}``), as Kafka
Streams' dropped-records sensor and KIP-1328 name them:

- ``undecodable``: its key or value is not what the topic's format says (not JSON, a Schema Registry
  frame naming an unknown schema, a payload its schema cannot read);
- ``null_key``: a table side's record without a key (it cannot be stored by key), or a stream
  join's event with a null key that its join type drops (KIP-962);
- ``null_foreign_key``: an inner fk join's left record whose foreign key is null (it joins nothing,
  though it still removes the key's earlier result; a left join keeps it with null right columns);
- ``null_derived_key``: a derive join's record whose derived key is null;
- ``no_list``: a list join's left record without a list at its ``list:`` path;
- ``null_value``: a tombstone on a stream join's stream (a record without a value is no event;
  Kafka Streams' stream joins drop it too);
- ``poison``: a record ``select`` fails on (its key's result stays as it was).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

REASONS = (
    "undecodable",
    "null_key",
    "null_foreign_key",
    "null_derived_key",
    "no_list",
    "null_value",
    "poison",
)
NOT_AN_EVENT = "a tombstone on a stream is not an event"
# the sentence a quarantine row's reason starts with, for each reason but undecodable
STARTS = {
    "null key": "null_key",
    "null foreign key": "null_foreign_key",
    "null derived key": "null_derived_key",
    "value has no list": "no_list",
    "null value": "null_value",
    "select failed": "poison",
}


def reason_of(text: str) -> str:
    """The reason of a quarantine row's sentence (``reason`` column)."""
    return next((reason for start, reason in STARTS.items() if text.startswith(start)), "undecodable")


def count(sentences: Iterable[str]) -> Counter[str]:
    """Quarantine sentences counted by reason."""
    return Counter(reason_of(text) for text in sentences)
