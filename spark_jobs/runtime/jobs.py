"""Long-running jobs (continuous joins and the continuous ingest): their registry and detached runs.

A running job registers itself in ``<work>/_jobs/<name>.json`` (job id, pid, heartbeat, last batch)
and holds ``<work>/_jobs/<name>.lock`` for its lifetime, so a second copy refuses to start; on a root
on an object store it holds the root's lease ``job-<name>`` too, so a copy on another machine that
shares the root refuses to start as well. A join
keeps its last micro-batch's figures in ``<root>/_jobs/<name>.last.json`` after it stops.
``Launch`` starts a job's ``lake`` command in its own session, output appended to
``<root>/_jobs/<name>.log``; its ``wait`` returns once the job has registered, so several jobs can be
launched before waiting for any. Launching a running job does nothing. ``stop_job`` sends SIGTERM
(the job finishes its current micro-batch) and waits for the exit.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_jobs.config import JoinSpec, PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.processes import alive, read_state

HEARTBEAT_SECONDS = 10  # a running job rewrites its registry entry at least this often
STALE_AFTER_SECONDS = 60  # six missed heartbeats: the process lives but its query is stuck


@dataclass(frozen=True)
class Job:
    """What identifies a long-running job: ``name`` (its files under ``_jobs``), ``id`` (what
    ``running_jobs`` reports, e.g. ``join:consents_enriched``) and ``label`` (for messages)."""

    name: str
    id: str
    label: str


def join_job(spec: JoinSpec) -> Job:
    """A join's continuous (or ``--once``) run: ``lake run JOIN``."""
    return Job(spec.name, spec.job, f"join {spec.name}")


def ingest_job(config: PipelineConfig) -> Job:
    """The pipeline's continuous ingest: ``lake ingest --continuous`` (one per pipeline)."""
    return Job(f"ingest-{config.name}", f"ingest:{config.name}", f"the continuous ingest of {config.name}")


@dataclass
class JobState:
    label: str
    pid: int | None
    changed: bool  # start: this call started it; stop: this call stopped it
    log: Path


def log_path(lake: Lake, job: Job) -> Path:
    return lake.layout.job_log(job.name)


def running_jobs(lake: Lake) -> dict[str, int]:
    """Job id -> pid of the jobs registered under ``<root>/_jobs`` whose process is alive."""
    found: dict[str, int] = {}
    folder = lake.layout.jobs
    if not folder.is_dir():
        return found
    for entry in folder.glob("*.json"):  # a job's last batch (<job>.last.json) names no pid
        info = read_state(entry)
        if info is not None:
            found[info.get("job", entry.stem)] = int(info["pid"])
    return found


def registry(lake: Lake, job: Job) -> dict[str, Any]:
    """The job's registry entry (empty when it is not registered)."""
    try:
        return json.loads(lake.layout.job_entry(job.name).read_text())
    except (OSError, ValueError):
        return {}


def process_started() -> float:
    """When this process started (epoch seconds): its start in clock ticks after boot, from
    ``/proc``; where there is no ``/proc``, now."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


@contextmanager
def registered(lake: Lake, job: Job, mode: str) -> Iterator[Callable[[dict], None]]:
    """Register a running job (refusing a second copy); yields ``beat(info)`` to record a heartbeat."""
    lake.layout.jobs.mkdir(parents=True, exist_ok=True)
    lock = open(lake.layout.job_lock(job.name), "w")  # noqa: SIM115 - held for the job's lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        pid = running_jobs(lake).get(job.id)
        raise UserError(f"{job.label} is already running{f' (pid {pid})' if pid else ''}") from None
    try:
        lease = _lease(lake, job) if lake.root.on_object_storage else None
    except BaseException:
        lock.close()
        raise
    entry = lake.layout.job_entry(job.name)
    info: dict[str, Any] = {
        "job": job.id,
        "pid": os.getpid(),
        "mode": mode,
        "started_at": datetime.now(UTC).isoformat(),
    }
    writing = threading.Lock()  # the query's batch thread and the main loop both beat

    def beat(extra: dict) -> None:
        with writing:
            info.update(extra, heartbeat_at=datetime.now(UTC).isoformat())
            tmp = entry.with_suffix(".tmp")
            tmp.write_text(json.dumps(info))
            tmp.replace(entry)

    beat({})
    try:
        yield beat
    finally:
        entry.unlink(missing_ok=True)
        if lease is not None:
            lease.release()
        lock.close()


def _lease(lake: Lake, job: Job) -> Any:
    """The root's lease of the job (``job-<name>``) for its lifetime: a copy on another machine
    sharing the root is refused in one line. A job whose lease lapsed (not renewed for a minute,
    and taken by another machine) stops after its current micro-batch, as on SIGTERM."""
    from spark_jobs.runtime.leases import Lease, acquire

    def lost(message: str) -> None:
        print(f"{job.label}: {message}; stopping", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    got = acquire(lake.root, f"job-{job.name}", job.label, lost)
    if not isinstance(got, Lease):
        raise UserError(
            f"{job.label} is already running on {got.says()}: {lake.root} is shared, one machine runs it"
        )
    return got


def last_batch_path(lake: Lake, job: Job) -> Path:
    return lake.layout.job_last_batch(job.name)


def record_batch(lake: Lake, job: Job, batch: dict[str, Any]) -> None:
    """Keep the job's last micro-batch (its figures) beside the registry, where ``lake status`` and
    the health check read it without Spark; it outlives the run, unlike the registry entry."""
    path = last_batch_path(lake, job)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(batch))
    tmp.replace(path)


def last_batch(lake: Lake, job: Job) -> dict[str, Any] | None:
    """The job's last recorded micro-batch (None: no batch yet)."""
    try:
        return json.loads(last_batch_path(lake, job).read_text())
    except (OSError, ValueError):
        return None


def silent_for(lake: Lake, job: Job) -> float | None:
    """Seconds since the running job's last heartbeat (None: not registered)."""
    beat = registry(lake, job).get("heartbeat_at")
    return (datetime.now(UTC) - datetime.fromisoformat(beat)).total_seconds() if beat else None


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Launch:
    """A job being started, unless it runs: :meth:`wait` returns once it has registered. ``env`` adds
    to the job's environment (e.g. ``LAKE_SPARK_MASTER``: on a cluster the job is a client-mode driver
    here and its executors run on the cluster). Launching several jobs before waiting for any lets
    their Spark drivers start side by side."""

    def __init__(self, lake: Lake, job: Job, command: list[str], env: dict[str, str] | None = None):
        self.lake, self.job, self.log = lake, job, log_path(lake, job)
        self.running = running_jobs(lake).get(job.id)  # already running: nothing is started
        self.proc: subprocess.Popen | None = None
        if self.running:
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            out.write(
                f"\n== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} start: lake {' '.join(command)}\n".encode()
            )
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spark_jobs.cli", *command],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env={**os.environ, **(env or {}), "LAKE_SPARK_LOG": str(self.log)},
            )

    def wait(self, timeout: float = 600.0) -> JobState:
        """Until the job has registered: its Spark session is up (on a busy machine or a cluster that
        gives it cores late, minutes; a job whose process exits first is an error at once)."""
        job, log = self.job, self.log
        if self.proc is None:
            return JobState(job.label, self.running, False, log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = running_jobs(self.lake).get(job.id)
            if pid:
                return JobState(job.label, pid, pid == self.proc.pid, log)
            if self.proc.poll() is not None:
                raise UserError(f"{job.label} did not start (exit {self.proc.returncode}): {_tail(log)}")
            time.sleep(0.5)
        raise UserError(f"{job.label} has not registered after {timeout:g} s; see {log}")


def stop_job(lake: Lake, job: Job, timeout: float = 120.0) -> JobState:
    """SIGTERM the job and wait until it has exited."""
    log = log_path(lake, job)
    pid = running_jobs(lake).get(job.id)
    if not pid:
        return JobState(job.label, None, False, log)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return JobState(job.label, pid, True, log)
        time.sleep(0.5)
    raise UserError(f"{job.label} (pid {pid}) has not stopped after {timeout:g} s; see {log}")
