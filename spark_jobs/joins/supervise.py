"""The pipeline's long-running jobs, supervised: ``lake start`` / ``lake stop`` / ``lake health``.

Two kinds run continuously per pipeline: its joins (``lake run JOIN --continuous``, reading their
Kafka topics) and one ingest (``lake ingest --continuous``, mirroring every Kafka topic of the
pipeline into its bronze table, the lake's queryable copy). The joins do not need the ingest; starting
a join starts the pipeline's mirror beside it so the lake's tables keep up, and the health check
covers both. The processes are detached and
registered under ``<root>/_jobs`` (``spark_jobs.runtime.jobs``); no Spark runs in the caller.
"""

from __future__ import annotations

from spark_jobs.config import JoinSpec, PipelineConfig
from spark_jobs.runtime.jobs import (
    STALE_AFTER_SECONDS,
    JobState,
    Launch,
    ingest_job,
    join_job,
    log_path,
    registry,
    running_jobs,
    silent_for,
    stop_job,
)
from spark_jobs.seams.delta import Lake

INGEST_TRIGGER_SECONDS = 1.0  # the continuous ingest's micro-batch interval


def _where(lake: Lake, config_path: str) -> list[str]:
    return ["--root", str(lake.root), "--config", str(config_path)]


def launch_ingest(
    lake: Lake,
    config_path: str,
    config: PipelineConfig,
    trigger_seconds: float = INGEST_TRIGGER_SECONDS,
    env: dict[str, str] | None = None,
) -> Launch:
    """Launch the pipeline's continuous ingest unless it runs (``.wait()``: until it has registered)."""
    command = [
        "ingest",
        "--continuous",
        "--trigger",
        f"{trigger_seconds:g}",
        *_where(lake, config_path),
    ]
    return Launch(lake, ingest_job(config), command, env=env)


def launch_join(
    lake: Lake,
    config_path: str,
    spec: JoinSpec,
    trigger_seconds: float,
    env: dict[str, str] | None = None,
    table_every: float | None = None,
) -> Launch:
    """Launch the join's continuous job unless it runs (``.wait()``: until it has registered)."""
    command = ["run", spec.name, "--continuous", "--trigger", f"{trigger_seconds:g}"]
    command += _where(lake, config_path)
    if table_every:
        command += ["--table-every", f"{table_every:g}"]
    return Launch(lake, join_job(spec), command, env=env)


def start_jobs(launches: list[Launch]) -> list[JobState]:
    """Wait for jobs launched side by side (their Spark drivers start at once) to register."""
    return [launch.wait() for launch in launches]


def stop_join(lake: Lake, spec: JoinSpec, timeout: float = 120.0) -> JobState:
    return stop_job(lake, join_job(spec), timeout)


def stop_ingest(lake: Lake, config: PipelineConfig, timeout: float = 120.0) -> JobState:
    return stop_job(lake, ingest_job(config), timeout)


def ingest_status(lake: Lake, config: PipelineConfig) -> dict:
    """The pipeline's continuous ingest: running?, pid, last heartbeat, each topic's last batch."""
    job = ingest_job(config)
    pid = running_jobs(lake).get(job.id)
    entry = registry(lake, job) if pid else {}
    return {
        "job": job.id,
        "running": pid is not None,
        "pid": pid,
        "heartbeat_at": entry.get("heartbeat_at"),
        "metrics_url": entry.get("metrics_url"),
        "topics": entry.get("topics", {}),
    }


def health(
    lake: Lake, config: PipelineConfig, max_records_behind: int, joins: list[str] | None = None
) -> list[str]:
    """What is wrong with the pipeline's continuous jobs, one plain sentence each (empty: healthy).

    Unhealthy: the pipeline's ingest or a join is not running or has not heartbeaten for a minute,
    a join's input topic has more than ``max_records_behind`` records (Kafka offsets) it has not
    processed, or Kafka cannot be asked how far the topics go."""
    from spark_jobs.joins.runner import status

    problems = []
    ingest = ingest_job(config)
    if config.joins and ingest.id not in running_jobs(lake):
        problems.append(
            f"{ingest.label} is down, so the bronze tables fall behind the topics (the joins read Kafka "
            "and are not affected); start it with 'lake ingest --continuous --detach'"
        )
    elif (silent := silent_for(lake, ingest)) is not None and silent > STALE_AFTER_SECONDS:
        problems.append(
            f"{ingest.label} has not heartbeaten for {silent:.0f} s; see {log_path(lake, ingest)}"
        )
    rows = status(lake, config)
    if rows and rows[0]["kafka_error"]:
        problems.append(f"cannot tell how far behind the joins are: {rows[0]['kafka_error']}")
    for row in rows:
        name = row["join"]
        if joins is not None and name not in joins:
            continue
        spec = config.join(name)
        if not row["running"]:
            last = f"last batch {row['last_batch_at']}" if row["last_batch_at"] else "no batch yet"
            problems.append(f"join {name} is down ({last}); start it with 'lake start {name}'")
            continue
        silent = silent_for(lake, join_job(spec))
        if silent is not None and silent > STALE_AFTER_SECONDS:
            problems.append(
                f"join {name} (pid {row['pid']}) has not heartbeaten for {silent:.0f} s; "
                f"see {log_path(lake, join_job(spec))}"
            )
        if row["checkpoint_error"]:
            problems.append(row["checkpoint_error"])
        for side, behind in row["records_behind"].items():
            if behind is not None and behind > max_records_behind:
                topic = dict(spec.sides)[side]
                problems.append(
                    f"join {name}: its {side} input {topic} is {behind} records behind "
                    f"(limit {max_records_behind})"
                )
    return problems
