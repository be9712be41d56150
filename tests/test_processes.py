"""The services' process helpers: a zombie is not alive, a state file of a dead service reads as no
service, a service that exits while starting is one line naming its log."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from spark_jobs.errors import UserError
from spark_jobs.seams.processes import alive, await_answer, read_state, reap, write_state


def test_a_zombie_is_not_alive_until_reaped_and_then_not_at_all():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])  # not waited for: a zombie once it exits
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as fh:
            if fh.read().split(")")[-1].split()[0] == "Z":
                break
        time.sleep(0.01)
    assert alive(os.getpid())
    assert not alive(proc.pid)
    reap(proc.pid)
    assert not alive(proc.pid)


def test_a_state_file_counts_only_while_its_process_lives(tmp_path):
    state = tmp_path / "service.json"
    assert read_state(state) is None
    write_state(state, {"pid": os.getpid(), "url": "sc://127.0.0.1:1"})
    assert read_state(state) == {"pid": os.getpid(), "url": "sc://127.0.0.1:1"}
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    write_state(state, {"pid": int(dead.stdout)})
    assert read_state(state) is None
    state.write_text("{cut")
    assert read_state(state) is None
    write_state(state, {"url": "sc://127.0.0.1:1"})  # no pid: pid 0 would signal our own group
    assert read_state(state) is None
    assert [p.name for p in tmp_path.iterdir()] == ["service.json"]  # no temporary file left


def test_a_service_that_exits_while_starting_names_its_log(tmp_path):
    log = tmp_path / "service.log"
    log.write_text("starting\nERROR port 9092 is taken\nshutting down\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(UserError) as caught:
        await_answer(proc, lambda: False, "the test service", "127.0.0.1:9092", [log], timeout=30)
    assert str(caught.value) == (
        f"the test service exited during start-up (code 3): ERROR port 9092 is taken (log {log})"
    )
