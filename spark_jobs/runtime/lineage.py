"""The product's jobs and datasets as its lineage names them; the events go out through
:mod:`spark_jobs.seams.lineage` (nothing is computed or sent when no OpenLineage transport is set).

Jobs: ``<pipeline>.backfill.<lookup>``, ``<pipeline>.quality``, ``<pipeline>.join.<join>``,
``<pipeline>.ingest``. Datasets: the pipeline's Kafka topics (with their formats' fields), the lake's
Delta tables (their locations), a backfill's dump.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from spark_jobs.config import PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.seams.lineage import Dataset, Lineage, Run, kafka_dataset, location_dataset


@contextmanager
def job_run(
    config: PipelineConfig,
    what: str,
    inputs: Callable[[], list[Dataset]],
    outputs: Callable[[], list[Dataset]],
) -> Iterator[Run | None]:
    """The run of job ``<pipeline>.<what>`` (None when lineage is off): START now, COMPLETE or FAIL
    when the block ends. ``inputs`` and ``outputs`` are asked for only when events go out."""
    lineage = Lineage.from_environment()
    if lineage is None:
        yield None
        return
    with lineage.run(f"{config.name}.{what}", inputs(), outputs()) as run:
        yield run


def topic(cluster: Any, config: PipelineConfig, name: str, formats: Any = None) -> Dataset:
    """A declared topic on ``cluster``, its fields from its formats: the key, then the value's
    fields (its schema's, for a Schema Registry format; else one ``value`` field of its format)."""
    spec = config.topic(name)
    fields: list[tuple[str, str]] = []
    if formats is not None:
        try:
            fields = formats.codec(name, "value").fields()
        except UserError:  # the registry does not answer: the format's name stands for its fields
            fields = []
    fields = [("key", spec.key_format), *(fields or [("value", spec.value_format)])]
    return kafka_dataset(cluster.bootstrap_servers, cluster.topic(name), fields)


def table(lake: Any, name: str) -> Dataset:
    """A Delta table of the lake, named by its location."""
    return location_dataset(lake.uri(name))


def file(location: str) -> Dataset:
    """A file (a backfill's dump), named by its location."""
    return location_dataset(location)
