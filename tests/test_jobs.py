"""The registry of long-running jobs under <root>/_jobs: one copy of a job at a time, its heartbeat,
its last micro-batch kept after it stops, and entries of dead processes not counted as running."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spark_jobs.errors import UserError
from spark_jobs.runtime.jobs import (
    Job,
    last_batch,
    record_batch,
    registered,
    registry,
    running_jobs,
    silent_for,
)
from spark_jobs.seams.delta import Lake

JOB = Job("join_j", "join:j", "join j")


def test_a_registered_job_refuses_a_second_copy_and_leaves_no_entry_behind(tmp_path):
    lake = Lake(tmp_path)
    with registered(lake, JOB, "continuous") as beat:
        entry = registry(lake, JOB)
        assert (entry["job"], entry["pid"], entry["mode"]) == ("join:j", os.getpid(), "continuous")
        assert running_jobs(lake) == {"join:j": os.getpid()}
        beat({"last_batch_id": 3})
        assert registry(lake, JOB)["last_batch_id"] == 3
        assert silent_for(lake, JOB) is not None and 0 <= silent_for(lake, JOB) < 5
        with pytest.raises(UserError, match=rf"^join j is already running \(pid {os.getpid()}\)$"):
            with registered(lake, JOB, "once"):
                pass
    assert registry(lake, JOB) == {}
    assert running_jobs(lake) == {}
    assert silent_for(lake, JOB) is None
    assert sorted(p.name for p in lake.layout.jobs.iterdir()) == ["join_j.lock"]


def test_an_entry_whose_process_is_gone_is_not_running(tmp_path):
    lake = Lake(tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    lake.layout.jobs.mkdir(parents=True)
    lake.layout.job_entry("join_k").write_text(json.dumps({"job": "join:k", "pid": int(dead.stdout)}))
    lake.layout.job_entry("broken").write_text("{not json")
    assert running_jobs(lake) == {}


def test_the_last_micro_batch_outlives_the_run(tmp_path):
    lake = Lake(tmp_path)
    assert last_batch(lake, JOB) is None
    with registered(lake, JOB, "once"):
        record_batch(lake, JOB, {"batch_id": 0, "in": 4, "out": 2})
        record_batch(lake, JOB, {"batch_id": 1, "in": 1, "out": 1})
    assert last_batch(lake, JOB) == {"batch_id": 1, "in": 1, "out": 1}
    lake.layout.job_last_batch(JOB.name).write_text("{cut off")
    assert last_batch(lake, JOB) is None
