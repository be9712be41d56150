"""Why a join did not use a record: the reasons its metrics count dropped records by.

A record a join cannot use is quarantined with a sentence saying why (``quarantine`` table); the
metrics count the same records by one of a few reasons (``lake_join_dropped_records_total{reason=}``),
as Kafka Streams' dropped-records sensor and KIP-1328 name them:

- ``undecodable``: its key or value is not what the topic's format says (not JSON, a Schema Registry
  frame naming an unknown schema, a payload its schema cannot read);
- ``null_key``: a table side's record without a key (it cannot be stored by key), or a stream
  join's event with a null key that its join type drops (KIP-962: counted, not quarantined);
- ``null_foreign_key``: an inner fk join's left record whose foreign key is null (it joins nothing;
  a left join keeps it with null right columns);
- ``null_derived_key``: a derive join's record whose derived key is null;
- ``poison``: a record ``select`` fails on (its key's result stays as it was).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

REASONS = ("undecodable", "null_key", "null_foreign_key", "null_derived_key", "poison")


def reason_of(text: str) -> str:
    """The reason of a quarantine row's sentence (``reason`` column)."""
    if text.startswith("null key"):
        return "null_key"
    if text.startswith("select failed"):
        return "poison"
    return "undecodable"


def count(sentences: Iterable[str]) -> Counter[str]:
    """Quarantine sentences counted by reason."""
    return Counter(reason_of(text) for text in sentences)
