"""``lake quarantine``: the records a pipeline's jobs did not use, in one place.

Every job writes the input it rejects to the lake's one ``quarantine`` table: a join every record it
does not use (its topic, partition, offset, key, value, the sentence saying why and the reason in one
word, :mod:`spark_jobs.joins.dropped`), a backfill the dump lines it could not read (``bad_line``).
This lists a pipeline's rows, newest first, and counts them by job and reason; what it covers is said
with the table's version and that commit's time.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spark_jobs.config import PipelineConfig
from spark_jobs.errors import UserError
from spark_jobs.seams.delta import Lake
from spark_jobs.system_tables import QUARANTINE


@dataclass
class Quarantined:
    """A pipeline's quarantined records (newest first), and what they were read from."""

    pipeline: str
    version: int | None  # the quarantine table's version read (None: the table does not exist yet)
    as_of: str | None  # that commit's time
    rows: list[dict[str, Any]] = field(default_factory=list)

    def counts(self) -> Counter[tuple[str, str]]:
        """(job, cause) -> records."""
        return Counter((r["job"], r["cause"] or "undecodable") for r in self.rows)

    def covers(self) -> str:
        if self.version is None:
            return f"quarantine of pipeline {self.pipeline}: nothing was ever quarantined in this lake"
        return f"quarantine of pipeline {self.pipeline} (table version {self.version}, as of {self.as_of})"


def jobs_of(config: PipelineConfig) -> list[str]:
    """The quarantine's ``job`` of each of the pipeline's jobs that writes it."""
    return [config.join(j).job for j in config.joins] + [f"backfill:{name}" for name in config.lookups]


def quarantined(
    lake: Lake, config: PipelineConfig, join: str | None = None, cause: str | None = None
) -> Quarantined:
    """The pipeline's rows (one join's, with ``join``; one reason's, with ``cause``), newest first."""
    jobs = jobs_of(config) if join is None else [config.join(join).job]
    if not lake.exists(QUARANTINE):
        return Quarantined(config.name, None, None)
    version = lake.version(QUARANTINE)
    commit = lake.commit(QUARANTINE, version)
    as_of = datetime.fromtimestamp(commit.timestamp_ms / 1000, UTC).isoformat(timespec="seconds")
    table = lake.read_arrow(QUARANTINE, version=version)
    rows = [r for r in table.to_pylist() if r["job"] in jobs]
    if cause is not None:
        rows = [r for r in rows if (r.get("cause") or "undecodable") == cause]
    rows.sort(
        key=lambda r: (r["run_time"], r.get("topic") or r["source"] or "", r["line"] or 0), reverse=True
    )
    return Quarantined(config.name, version, as_of, rows)


def check_cause(cause: str | None) -> None:
    from spark_jobs.joins.dropped import REASONS

    known = (*REASONS, "bad_line")
    if cause is not None and cause not in known:
        raise UserError(f"--reason: one of {', '.join(known)}, not {cause!r}")


def row_line(row: dict[str, Any]) -> str:
    """``2026-11-29T10:00:01Z join:t_left L[1] offset 5: value is not a JSON object (key 'z')``."""
    at = row["run_time"].astimezone(UTC).isoformat(timespec="seconds") if row["run_time"] else "?"
    where = f"{row['source']} {'offset' if row.get('topic') else 'line'} {row['line']}"
    return f"{at} {row['job']} {where} [{row.get('cause') or 'undecodable'}]: {row['reason']}"
