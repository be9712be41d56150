"""A Schema Registry that has lost a topic's schemas, told apart from a subject nobody registered yet.

A registry format's codec refuses a subject with no version (:class:`MissingSubject`: "register
one"). When the topic already holds records framed with schema ids the registry does not know, the
advice is wrong: the records were written with schemas the registry had, and registering a schema
now gives it a new id, which no record names. :func:`explained` reads the tail of the topic (the
last :data:`TAIL` records of each partition) for the ids its records name and, when the registry
lacks some of them, says so in one line: the subject, the ids with where each was first seen, the
registry's URL.
"""

from __future__ import annotations

from collections import Counter
from typing import cast

from spark_jobs.config import PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.formats import framing
from spark_jobs.formats.registered import MissingSubject
from spark_jobs.seams.kafka import Cluster, read

TAIL = 100  # records read from the end of each partition


def explained(config: PipelineConfig, cluster: Cluster, missing: MissingSubject) -> UserError:
    """``missing`` as a lost registry when the topic's tail holds records framed with ids the
    registry does not have; else ``missing`` itself (also when Kafka cannot be read: the first
    error stays the one to fix)."""
    where = missing.topic_part
    if where is None or where[0] not in config.topics:
        return missing
    topic, part = where
    spec = config.topic(topic)
    first: dict[int, tuple[int, int]] = {}  # schema id -> (partition, offset) where first seen
    framed: Counter[int] = Counter()  # schema id -> records framed with it
    counted = 0
    try:
        for batch in read(cluster, spec, start=lambda low, high: high - TAIL):
            for message in batch:
                raw = message.key() if part == "key" else message.value()
                counted += 1
                try:
                    schema_id, _ = framing.split(raw or b"")
                except framing.NotFramed:
                    continue
                framed[schema_id] += 1
                first.setdefault(schema_id, (cast(int, message.partition()), cast(int, message.offset())))
        unknown = [i for i in sorted(first) if missing.registry.schema(i) is None]
    except UserError:
        return missing
    if not unknown:
        return missing
    ids = ", ".join(f"{i} (first at partition {first[i][0]} offset {first[i][1]})" for i in unknown)
    plural = "s" if len(unknown) > 1 else ""
    lost = sum(framed[i] for i in unknown)  # records that name an id the registry lacks
    return UserError(
        f"{missing.where}: the Schema Registry at {missing.registry.url} has lost this topic's schemas: "
        f"{lost} of the last {counted} records of Kafka topic {cluster.topic(topic)} are framed with "
        f"schema id{plural} {ids}, but the registry has no subject {missing.subject} and no schema with "
        f"{'those ids' if plural else 'that id'}; point kafka.schema_registry at the registry that holds "
        "them, or restore this registry's storage (a schema registered again gets a new id, which no "
        "record names)"
    )
