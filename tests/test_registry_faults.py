"""Schema Registry faults as outside tests met them, through the CLI on a fresh lake root: a backfill
that registers a newer schema, a registry that never answers, JSON Schema's null and absent fields, a
check against an unreachable registry, and what a running join holds during a registry outage."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from registrykit import ACCOUNT, PIPELINE, account, lake, pipeline_in


@pytest.fixture
def where(tmp_path):
    return pipeline_in(tmp_path)


def test_a_backfill_that_registers_a_newer_schema_compares_and_writes_in_it(spark, tmp_path, where, capsys):
    """accounts holds ten records written with v1; the pipeline's schema file is now v2 (tier added
    with a default). A dump that changes only tier for two customers, mail and tier for four, and
    nothing for four: the comparison is made in v2, so six are changed and written, tier included."""
    v1 = tmp_path / "a.txt"
    v1.write_text("".join(f"u{n};{json.dumps(account(n))}\n" for n in range(10)))
    assert lake(capsys, where, "produce", "accounts", str(v1), "-K", ";")[0] == 0
    v2 = dict(ACCOUNT, fields=[*ACCOUNT["fields"], {"name": "tier", "type": "string", "default": "basic"}])
    (tmp_path / "account.avsc").write_text(json.dumps(v2))  # the pipeline's schema file, now v2

    def wanted(n: int) -> dict:
        if n < 2:  # only the new field changes
            return dict(account(n), tier="gold")
        if n < 6:  # the mail and the new field
            return dict(account(n), contactMailAddress=f"new{n}@example.com", tier="silver")
        return dict(account(n), tier="basic")  # what v1's records read as in v2: unchanged

    dump = tmp_path / "accounts.jsonl"
    dump.write_text("".join(json.dumps({"id": f"u{n}", "account": wanted(n)}) + "\n" for n in range(10)))
    code, out, err = lake(capsys, where, "backfill", "accounts", "--from", str(dump))
    assert code == 0, err
    assert (
        "10 lines read, 0 new keys, 6 changed, 4 unchanged, 0 superseded duplicates, 0 rejected; wrote 6"
        in out
    )
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%k %s\\n")
    latest: dict[str, dict] = {}
    for line in out.splitlines():
        key, value = line.split(" ", 1)
        latest[json.loads(key)] = json.loads(value)
    assert latest == {f"u{n}": wanted(n) for n in range(10)}
    code, out, _ = lake(capsys, where, "show", "lookup_accounts", "--json")
    assert code == 0 and {r["key"]: r["value"] for r in map(json.loads, out.splitlines())} == latest
    # the same dump again: all unchanged
    code, out, err = lake(capsys, where, "backfill", "accounts", "--from", str(dump))
    assert code == 0, err
    assert "0 new keys, 0 changed, 10 unchanged" in out and "wrote 0 records" in out


def test_a_registry_that_accepts_connections_and_never_answers_is_one_line_not_a_hang(tmp_path, where):
    """kafka.schema_registry.url names a socket that listens and never reads: lake produce ends with
    one line naming the URL and the wait (every request has a timeout by default), and sends
    nothing."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # connections complete in the kernel's backlog; nobody ever reads them
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    config = Path(where[3])
    config.write_text(PIPELINE.replace("topics:", f"kafka:\n  schema_registry:\n    url: {url}\ntopics:", 1))
    (tmp_path / "a.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    try:
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "lake"),
                "produce",
                "accounts",
                str(tmp_path / "a.txt"),
                "-K",
                ";",
            ]
            + where,
            capture_output=True,
            text=True,
            timeout=120,  # a hang fails here instead of holding the run
        )
    finally:
        silent.close()
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines() == [
        f"lake: error: Schema Registry at {url} ({config}): cannot list its subjects: no answer within 5 s "
        "(3 attempts; kafka.schema_registry.timeout sets the wait)"
    ]
