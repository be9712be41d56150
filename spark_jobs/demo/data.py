"""Demo data (the consent / e-mail story of docs/demo.md) and large synthetic inputs for benchmarks.

Only the demo command writes demo data: a new lake root starts empty.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.config import TopicSpec
from spark_jobs.formats import Formats
from spark_jobs.seams.kafka import Cluster, Delivered, ensure_topics, produce, read, watermarks

CUSTOMERS = 10  # user_1 .. user_10 give consents
ACCOUNTS = 8  # the accounts topic only knows user_1 .. user_8 until backfilled
CONSENTS_TOPIC = "customer_consents"
ACCOUNTS_TOPIC = "customer_accounts"
WITH_MAIL = "consents_with_mail"
AT_EVENT_TIME = "consents_enriched_at_event_time"
DEMO_TIMESTAMP_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: fixed, so demo output is stable


def demo_dump_path() -> Path:
    """The database dump of all ten accounts (``user_N;"userN@example.com"``): the backfill source."""
    return Path(__file__).with_name("dumps") / "customer_accounts.dump"


def consent_value(n: int) -> dict:
    customer = f"user_{n}"
    return {
        "customerId": customer,
        "hashedCustomerId": hashlib.sha256(customer.encode()).hexdigest()[:16],
        "consents": {"retargeter1": n % 3 != 0, "retargeter2": n % 2 == 1},
    }


def account_value(n: int) -> dict:
    return {"customerId": f"user_{n}", "contactMailAddress": f"user{n}@example.com"}


def encoded(formats: Formats, topic: str, items: Sequence[tuple[str, Any]]) -> tuple[pa.Array, pa.Array]:
    """Keys and values (None: a tombstone) as the topic's codecs write them (a JSON topic's compact
    JSON, an Avro topic's framed records with the topic's schema file, ...), as binary arrays."""
    key_codec, value_codec = formats.writing(topic, "key", None), formats.writing(topic, "value", None)
    keys = pa.array([key_codec.encode(k) for k, _ in items], pa.binary())
    values = pa.array([None if v is None else value_codec.encode(v) for _, v in items], pa.binary())
    return keys, values


def is_empty(cluster: Cluster, spec: TopicSpec) -> bool:
    """True when the Kafka topic has never been written to."""
    ensure_topics(cluster, [spec])
    return all(high == 0 for _, high in watermarks(cluster, spec))


def write_demo_topics(cluster: Cluster, formats: Formats) -> list[tuple[str, Delivered | None]]:
    """Produce the demo records into Kafka topics that are still empty (murmur2, like Java clients),
    in the topics' formats (``formats``: the pipeline's codecs; the consents in Avro). Returns, per
    topic, what was produced, or None where the topic already held records."""
    data = {
        CONSENTS_TOPIC: [(f"user_{n}", consent_value(n)) for n in range(1, CUSTOMERS + 1)],
        ACCOUNTS_TOPIC: [(f"user_{n}", account_value(n)) for n in range(1, ACCOUNTS + 1)],
    }
    results: list[tuple[str, Delivered | None]] = []
    for topic, items in data.items():
        spec = formats.config.topic(topic)
        if not is_empty(cluster, spec):
            results.append((topic, None))
            continue
        batch = encoded(formats, topic, items)
        result = produce(cluster, spec, [batch], "murmur2", timestamp_ms=DEMO_TIMESTAMP_MS)
        results.append((topic, result))
    return results


def write_late_consent(cluster: Cluster, formats: Formats) -> bool:
    """A new consent event of user_9, now (after the backfill); once per topic."""
    spec = formats.config.topic(CONSENTS_TOPIC)
    if sum(len(batch) for batch in read(cluster, spec)) > CUSTOMERS:
        return False
    produce(cluster, spec, [encoded(formats, CONSENTS_TOPIC, [("user_9", consent_value(9))])], "murmur2")
    return True


def synthetic_dump_chunks(keys: int, chunk: int = 1_000_000, prefix: str = "user_"):
    """Blocks of ``<prefix>N;"<prefix>N@example.com"`` lines for N = 1..keys, built with Arrow."""
    for start in range(1, keys + 1, chunk):
        ids = pc.cast(pa.array(np.arange(start, min(start + chunk, keys + 1))), pa.string())
        key = pc.binary_join_element_wise(prefix, ids, "")
        mail = pc.binary_join_element_wise('"', key, '@example.com"', "")
        lines = pc.binary_join_element_wise(key, mail, ";")
        whole = pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines)
        yield (pc.binary_join(whole, "\n")[0].as_py() + "\n").encode()


def write_synthetic_dump(path: str | Path, keys: int, prefix: str = "user_") -> int:
    """Write a large dump file for benchmarks; returns its size in bytes."""
    size = 0
    with open(path, "wb") as fh:
        for block in synthetic_dump_chunks(keys, prefix=prefix):
            fh.write(block)
            size += len(block)
    return size
