"""The lineage seam: OpenLineage run events of the product's jobs (docs/operating.md, "Lineage").

A backfill, a quality run, a join's run and the continuous ingest each emit a START event and a
COMPLETE or FAIL event (with the error) through openlineage-python's client, configured the standard
OpenLineage way: ``OPENLINEAGE_URL`` (HTTP to Marquez or any receiver), ``OPENLINEAGE_CONFIG`` or an
``openlineage.yml`` (in the working folder or ``~/.openlineage``; file, console, Kafka, ...
transports) or ``OPENLINEAGE__TRANSPORT__*`` variables. With none of these nothing is sent (and
``OPENLINEAGE_DISABLED=true`` turns a configured client off). A receiver that does not answer costs
one log line; the job goes on.

Datasets are named by OpenLineage's naming spec: a Kafka topic ``kafka://<first bootstrap
host:port>`` + its name on Kafka, a Delta table its location (``file`` + the absolute path, or
``s3://<bucket>`` + the key), a dump file its path. A topic's dataset carries a schema facet from its
format (:meth:`spark_jobs.formats.Codec.fields`). Jobs are named ``<pipeline>.<what>`` in the namespace
``$OPENLINEAGE_NAMESPACE`` (default ``lake``).

The parent run: ``$OPENLINEAGE_PARENT_ID`` (``namespace/job/run id``, as dbt's and Airflow's
OpenLineage integrations pass it; ``$OPENLINEAGE_ROOT_PARENT_ID`` the same for the root run). The
Airflow tasks set them (``spark_jobs.orchestration``), so a DAG run is the root of its tasks' runs,
and each task the parent of the backfill, quality run or joins it started.
"""

from __future__ import annotations

import logging
import os
import traceback
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger("lake.lineage")

PARENT_ENV = "OPENLINEAGE_PARENT_ID"
ROOT_PARENT_ENV = "OPENLINEAGE_ROOT_PARENT_ID"
NAMESPACE_ENV = "OPENLINEAGE_NAMESPACE"
DEFAULT_NAMESPACE = "lake"
PRODUCER = "https://pypi.org/project/kafka-join-lakehouse/"


def configured() -> bool:
    """True when the environment configures an OpenLineage transport (and does not disable it)."""
    if os.environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OPENLINEAGE_URL") or os.environ.get("OPENLINEAGE_CONFIG"):
        return True
    if any(k.startswith("OPENLINEAGE__TRANSPORT") for k in os.environ):
        return True
    return any(
        p.is_file()
        for p in (Path.cwd() / "openlineage.yml", Path.home() / ".openlineage" / "openlineage.yml")
    )


@dataclass(frozen=True)
class Dataset:
    """A dataset as OpenLineage names it, with its schema's fields (name, type) when known."""

    namespace: str
    name: str
    fields: tuple[tuple[str, str], ...] = ()
    # quality assertions on it (name, passed) for the dataQualityAssertions facet of an input
    assertions: tuple[tuple[str, bool], ...] = ()


def kafka_dataset(bootstrap_servers: str, topic: str, fields: Sequence[tuple[str, str]] = ()) -> Dataset:
    """A Kafka topic (its name on Kafka) of the cluster whose first bootstrap server is given."""
    first = bootstrap_servers.split(",")[0].strip()
    first = first.split("://", 1)[-1]  # a listener's protocol prefix, e.g. SASL_SSL://host:port
    return Dataset(f"kafka://{first}", topic, tuple(fields))


def location_dataset(location: str, fields: Sequence[tuple[str, str]] = ()) -> Dataset:
    """A table or file at ``location``: a local path, or an ``s3a://`` / ``s3://`` URI."""
    for scheme in ("s3a://", "s3n://", "s3://"):
        if location.startswith(scheme):
            bucket, _, key = location.removeprefix(scheme).partition("/")
            return Dataset(f"s3://{bucket}", key.strip("/"), tuple(fields))
    path = location.removeprefix("file://")
    return Dataset("file", str(Path(path).resolve()) if not path.startswith("/") else path, tuple(fields))


@dataclass
class Run:
    """One run of a job: its inputs and outputs (which a job may add to while it runs)."""

    job: str
    inputs: list[Dataset] = field(default_factory=list)
    outputs: list[Dataset] = field(default_factory=list)


class Lineage:
    """Emits the run events of the product's jobs (see the module's doc)."""

    def __init__(self, client: Any):
        self.client = client
        self.namespace = os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE
        self.refused = False

    @classmethod
    def from_environment(cls) -> Lineage | None:
        """The configured client, or None (nothing configured, or the client refuses its settings:
        said once in the log)."""
        if not configured():
            return None
        from openlineage.client import OpenLineageClient

        try:
            return cls(OpenLineageClient())
        except Exception as exc:  # noqa: BLE001 - a bad transport setting must not stop the job
            log.warning("lineage: the OpenLineage settings were refused (%s); no events are sent", exc)
            return None

    @contextmanager
    def run(self, job: str, inputs: Sequence[Dataset] = (), outputs: Sequence[Dataset] = ()) -> Iterator[Run]:
        """START, then COMPLETE when the block ends, or FAIL with the error when it raises (a
        ``KeyboardInterrupt`` or a stop request is an ABORT)."""
        from openlineage.client.uuid import generate_new_uuid

        run = Run(job, list(inputs), list(outputs))
        run_id = str(generate_new_uuid())
        self._emit("START", run, run_id)
        try:
            yield run
        except (KeyboardInterrupt, SystemExit):
            self._emit("ABORT", run, run_id)
            raise
        except BaseException as exc:
            self._emit("FAIL", run, run_id, exc)
            raise
        self._emit("COMPLETE", run, run_id)

    def _emit(self, state: str, run: Run, run_id: str, error: BaseException | None = None) -> None:
        if self.refused:
            return
        try:
            self.client.emit(self._event(state, run, run_id, error))
        except Exception as exc:  # noqa: BLE001 - lineage is a side channel: the job goes on
            self.refused = True
            log.warning(
                "lineage: could not send the %s event of %s (%s); no more are sent", state, run.job, exc
            )

    def _event(self, state: str, run: Run, run_id: str, error: BaseException | None) -> Any:
        from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, RunEvent, RunState
        from openlineage.client.event_v2 import Run as OlRun
        from openlineage.client.facet_v2 import (
            data_quality_assertions_dataset,
            error_message_run,
            job_type_job,
            parent_run,
            schema_dataset,
        )

        def facets(d: Dataset) -> dict:
            if not d.fields:
                return {}
            fields = [schema_dataset.SchemaDatasetFacetFields(name=n, type=t) for n, t in d.fields]
            return {"schema": schema_dataset.SchemaDatasetFacet(fields=fields)}

        def input_facets(d: Dataset) -> dict:
            if not d.assertions:
                return {}
            assertions = [
                data_quality_assertions_dataset.Assertion(assertion=name, success=ok)
                for name, ok in d.assertions
            ]
            return {
                "dataQualityAssertions": data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(
                    assertions
                )
            }

        run_facets: dict[str, Any] = {}
        parent = _parent(os.environ.get(PARENT_ENV), os.environ.get(ROOT_PARENT_ENV))
        if parent is not None:
            run_facets["parent"] = parent_run.ParentRunFacet(
                run=parent_run.Run(runId=parent[2]),
                job=parent_run.Job(namespace=parent[0], name=parent[1]),
                root=None
                if parent[3] is None
                else parent_run.Root(
                    run=parent_run.RootRun(runId=parent[3][2]),
                    job=parent_run.RootJob(namespace=parent[3][0], name=parent[3][1]),
                ),
            )
        if error is not None:
            run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
                programmingLanguage="python",
                stackTrace="".join(traceback.format_exception(error))[-4000:],
            )
        job_facets: dict[str, Any] = {
            "jobType": job_type_job.JobTypeJobFacet(
                processingType=_processing(run.job), integration="LAKE", jobType="JOB"
            )
        }
        return RunEvent(
            eventType=getattr(RunState, state),
            eventTime=datetime.now(UTC).isoformat(),
            run=OlRun(runId=run_id, facets=run_facets),
            job=Job(namespace=self.namespace, name=run.job, facets=job_facets),
            inputs=[
                InputDataset(d.namespace, d.name, facets=facets(d), inputFacets=input_facets(d))
                for d in run.inputs
            ],
            outputs=[OutputDataset(d.namespace, d.name, facets=facets(d)) for d in run.outputs],
            producer=PRODUCER,
        )


def _processing(job: str) -> str:
    return "STREAMING" if ".join." in job or job.endswith(".ingest") else "BATCH"


def _parent(text: str | None, root: str | None) -> tuple[str, str, str, Any] | None:
    """``namespace/job/run id`` (a job name may hold slashes: the run id is the last part)."""
    if not text or text.count("/") < 2:
        return None
    namespace, rest = text.split("/", 1)
    job, run_id = rest.rsplit("/", 1)
    try:
        uuid.UUID(run_id)
    except ValueError:  # not a run id: no parent rather than no event
        log.warning("lineage: %s is not namespace/job/run id (a UUID); the run's parent is left out", text)
        return None
    return namespace, job, run_id, _parent(root, None) if root else None
