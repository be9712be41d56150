"""`lake backfill` as a user runs it when things go wrong: killed with SIGKILL at every step and run
again, and two of them started at once. Through the CLI only, on a fresh lake root."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.cli import main
from spark_jobs.faults import BACKFILL_POINTS

LAKE = str(Path(sys.executable).with_name("lake"))

PIPELINE = """\
pipeline: accs
topics:
  accounts:
    partitions: 4
    key: string
    value: json
lookups:
  acc:
    topic: accounts
    backfill:
      format: lines
      separator: ";"
      value_format: json
      value:
        customerId: key
        contactMailAddress: value
"""


@pytest.fixture
def where(tmp_path):
    """The CLI's ``--root ROOT --config FILE`` of a fresh lake root with the pipeline above."""
    config = tmp_path / "accs.yaml"
    config.write_text(PIPELINE)
    return ["--root", str(tmp_path / "lake"), "--config", str(config)]


def lake(capsys, where, *args: str) -> tuple[int, str, str]:
    """``lake ARGS`` through the CLI's entry point in the test's process (on its Spark session)."""
    capsys.readouterr()
    code = main([*args, *where])
    out, err = capsys.readouterr()
    return code, out, err


def lake_process(where, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``lake ARGS`` as a process of its own (its own Spark), as a user's shell starts it."""
    return subprocess.run(
        [LAKE, *args, *where],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "LAKE_SPARK_UI": "false", **env},
    )


def value(key: str, mail: str) -> str:
    return json.dumps({"customerId": key, "contactMailAddress": mail}, separators=(",", ":"))


def test_a_backfill_killed_at_every_step_and_run_again_writes_each_record_once_and_the_lookup_exact(
    spark, tmp_path, where, capsys
):
    """Round n kills a backfill with SIGKILL right after step n (the dump read; compared with the
    topic; its records on the broker, the transaction open; committed; mirrored into bronze; the
    lookup table refreshed), then runs the same backfill again. Each round's dump adds ten keys and
    changes the addresses of the previous round's. After each rerun the topic holds every record
    the dumps called for exactly once, and the lookup table is the dump, exactly, up to the topic's
    end offsets."""
    dump: dict[str, str] = {}
    wanted: list[tuple[str, str]] = []  # every record the topic must hold, in the order written
    for n, point in enumerate(BACKFILL_POINTS):
        changed = {k: value(k, f"{k}@round{n}.example.com") for k in dump if k.startswith(f"r{n - 1}_")}
        new = {f"r{n}_{i}": value(f"r{n}_{i}", f"r{n}_{i}@example.com") for i in range(10)}
        dump.update(changed)
        dump.update(new)
        wanted += [*changed.items(), *new.items()]
        path = tmp_path / f"round{n}.dump"
        path.write_text("".join(f'{k};"{json.loads(v)["contactMailAddress"]}"\n' for k, v in dump.items()))

        killed = lake_process(where, "backfill", "acc", "--from", str(path), LAKE_KILL_AT=point)
        assert killed.returncode == -signal.SIGKILL, f"{point}: {killed.stderr[-2000:]}"

        code, out, err = lake(capsys, where, "backfill", "acc", "--from", str(path))
        assert code == 0, f"after a kill at {point}: {err}"
        written = len(changed) + len(new) if point in ("backfill-read", "backfill-diff", "produce") else 0
        assert f"wrote {written} records to accounts" in out, f"after a kill at {point}: {out}"

        code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%k|%s\\n")
        assert code == 0
        records = [tuple(line.split("|", 1)) for line in out.splitlines()]
        assert sorted(records) == sorted(wanted), f"after a kill at {point}"

        code, out, _ = lake(capsys, where, "show", "lookup_acc", "--json")
        assert code == 0
        assert {r["key"]: r["value"] for r in map(json.loads, out.splitlines())} == dump, point

        code, out, _ = lake(capsys, where, "status", "--json")
        lookup = json.loads(out.splitlines()[0])["lookups"][0]
        assert (lookup["lookup"], lookup["up_to"], lookup["behind"]) == ("acc", lookup["ends"], 0), point


# A backfill's own lines (stderr and stdout); nothing else may reach the user
OWN_LINES = [
    r"starting Spark \.\.\.",
    r"reading \S+ \.\.\.",
    r"waiting for another process to finish backfill-accounts \.\.\.",
    r"comparing with accounts (up to offsets \[[\d, ]+\]|\(not on the cluster\)) \(taken [\dT:+-]+\)",
    r"producing 300 records to (t\d+\.)?accounts with murmur2 \.\.\.",
    r"ingest: accounts is being mirrored by another ingest; waiting for it \.\.\.",
    r"ingest: accounts \+\d+ in [\d.]+s",
    r"lookup acc: up to offsets \[[\d, ]+\]",
    r"backfill acc from \S+ \(murmur2\): 300 lines read, .* records to accounts .*",
]


def test_two_backfills_of_one_lookup_at_once_print_only_their_own_lines(tmp_path, where):
    """Two people backfill the same lookup at the same moment, three times over: both succeed, one
    writes the dump and the other nothing, and each prints the product's lines only, never a
    Java stack trace from Spark shutting down."""
    for n in range(3):
        path = tmp_path / f"accounts{n}.dump"
        path.write_text("".join(f'u{n}_{i};"u{i}@round{n}.example.com"\n' for i in range(300)))
        command = [LAKE, "backfill", "acc", "--from", str(path), *where]
        env = {**os.environ, "LAKE_SPARK_UI": "false"}
        procs = [
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        ]
        procs.append(
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        )
        outputs = [proc.communicate(timeout=600) for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], outputs
        written = sorted(re.search(r"wrote (\d+) records", out).group(1) for out, _ in outputs)  # type: ignore[union-attr]
        assert written == ["0", "300"], outputs
        for out, err in outputs:
            strays = [
                line
                for line in (err + out).splitlines()
                if not any(re.fullmatch(pattern, line) for pattern in OWN_LINES)
            ]
            assert strays == [], f"round {n}: lines that are not the backfill's own: {strays}"
    log = Path(where[1]) / "_logs" / "backfill.log"
    assert log.read_text().count(": lake backfill acc --from ") == 6  # each run's JVM wrote there
