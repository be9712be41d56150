"""Continuous joins as detached processes: ``lake start`` / ``lake stop`` (no Spark in the caller).

``lake start JOIN`` launches ``lake run JOIN --continuous`` in its own session, with its output
appended to ``<root>/_jobs/<join>.log``, and returns once the job has registered itself (pid and
heartbeat in ``<root>/_jobs/<join>.json``). Starting a running join does nothing, and the job's lock
file means two starts at once still leave one copy. ``lake stop JOIN`` sends SIGTERM, so the job
finishes its current micro-batch, and waits for the process to exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from spark_jobs.config import JoinSpec, PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.lake import Lake
from spark_jobs.repair import running_jobs


@dataclass
class JobState:
    join: str
    pid: int | None
    started: bool  # False: it was running already (start) / was not running (stop)
    log: Path


def log_path(lake: Lake, spec: JoinSpec) -> Path:
    return lake.root / "_jobs" / f"{spec.name}.log"


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_detached(
    lake: Lake,
    config_path: str,
    spec: JoinSpec,
    trigger_seconds: float,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
) -> JobState:
    """Start the join's continuous job unless it runs; return once it has registered. ``env`` adds
    to the job's environment (e.g. ``LAKE_SPARK_MASTER``: on a cluster the job is a client-mode
    driver here and its executors run on the cluster)."""
    log = log_path(lake, spec)
    pid = running_jobs(lake).get(spec.job)
    if pid:
        return JobState(spec.name, pid, False, log)
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "spark_jobs.cli",
        "run",
        spec.name,
        "--continuous",
        "--trigger",
        f"{trigger_seconds:g}",
        "--root",
        str(lake.root),
        "--config",
        str(config_path),
    ]
    with open(log, "ab") as out:
        out.write(f"\n== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} lake start {spec.name}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = running_jobs(lake).get(spec.job)
        if pid:
            return JobState(spec.name, pid, pid == proc.pid, log)
        if proc.poll() is not None:
            raise UserError(f"join {spec.name} did not start (exit {proc.returncode}): {_tail(log)}")
        time.sleep(0.5)
    raise UserError(f"join {spec.name} has not registered after {timeout:g} s; see {log}")


def stop_job(lake: Lake, spec: JoinSpec, timeout: float = 120.0) -> JobState:
    """SIGTERM the join's job and wait until it has exited."""
    log = log_path(lake, spec)
    pid = running_jobs(lake).get(spec.job)
    if not pid:
        return JobState(spec.name, None, False, log)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return JobState(spec.name, pid, True, log)
        time.sleep(0.5)
    raise UserError(f"join {spec.name} (pid {pid}) has not stopped after {timeout:g} s; see {log}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own exited child) counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


STALE_AFTER_SECONDS = 60  # six missed heartbeats: the process lives but its query is stuck


def health(
    lake: Lake, config: PipelineConfig, max_versions_behind: int, joins: list[str] | None = None
) -> list[str]:
    """What is wrong with the pipeline's continuous joins, one plain sentence each (empty: healthy).

    A join is unhealthy when its job is not running, has not heartbeaten for a minute, or an input
    topic has more than ``max_versions_behind`` versions it has not read yet."""
    from spark_jobs.joins.runner import status

    problems = []
    now = datetime.now(UTC)
    for row in status(lake, config):
        name = row["join"]
        if joins is not None and name not in joins:
            continue
        spec = config.join(name)
        if not row["running"]:
            last = f"last batch {row['last_batch_at']}" if row["last_batch_at"] else "no batch yet"
            problems.append(f"join {name} is down ({last}); start it with 'lake start {name}'")
            continue
        if row["heartbeat_at"]:
            silent = (now - datetime.fromisoformat(row["heartbeat_at"])).total_seconds()
            if silent > STALE_AFTER_SECONDS:
                problems.append(
                    f"join {name} (pid {row['pid']}) has not heartbeaten for {silent:.0f} s; "
                    f"see {log_path(lake, spec)}"
                )
        for side, behind in row["versions_behind"].items():
            if behind is not None and behind > max_versions_behind:
                topic = dict(spec.sides)[side]
                problems.append(
                    f"join {name}: its {side} input {topic} is {behind} versions behind "
                    f"(limit {max_versions_behind})"
                )
    return problems
