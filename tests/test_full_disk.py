"""A lake root whose disk fills up while a command writes, through the ``lake`` command as a user runs
it: a backfill, an ingest, a join. Each is one line naming the root and the fix, exit 1; after space
is freed the same command completes, and nothing is lost or written twice (the topic, bronze, the
join's result and its changelog).

The root is a small tmpfs of its own (the broker's data lives elsewhere); filling it is writing a
file that takes every free block.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ACCOUNTS = [f"user_{n}" for n in range(1, 11)]


class SmallDisk:
    def __init__(self, mount: Path):
        self.mount = mount
        self.filler = mount / "filler"

    def free(self) -> int:
        s = os.statvfs(self.mount)
        return s.f_bavail * s.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Take all but ``leave`` bytes of the free space."""
        with open(self.filler, "ab") as f:
            f.write(b"\0" * max(self.free() - leave, 0))

    def clear(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    assert mounted.returncode == 0, f"this test mounts a tmpfs (as root): {mounted.stderr.strip()}"
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def lake(root: Path, *args: str) -> tuple[int, str, str]:
    """``lake`` in a process of its own, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), *args], capture_output=True, text=True
    )
    return proc.returncode, proc.stdout, proc.stderr


def full(root: Path, spark: bool = True) -> str:
    where = f"under {root} (a Spark write failed)" if spark else f"under {root}"
    return f"lake: error: cannot write {where}: no space left on the device; free space and run the command again"


def failed_on_full_disk(result: tuple[int, str, str], root: Path, java_lines: bool = False) -> bool:
    """Exit 1, no traceback, the last line naming the root and the fix. ``java_lines``: Spark may
    still log Java stack lines before it (a join's query stopping after the failure; docs/limits.md)."""
    code, out, err = result
    assert code == 1, out + err
    assert "Traceback" not in err and (java_lines or "\tat " not in err), err
    lines = [line for line in err.splitlines() if line.startswith("lake: ")]
    assert lines[-1] in (full(root), full(root, spark=False)), err
    return True


def keys_on(root: Path, topic: str) -> list[str]:
    code, out, err = lake(root, "consume", topic, "-f", "%k\\n")
    assert code == 0, err
    return sorted(out.split())


def offsets_on(root: Path, topic: str) -> list[list[str]]:
    code, out, err = lake(root, "consume", topic, "-f", "%p\\t%o\\n")
    assert code == 0, err
    return sorted(line.split("\t") for line in out.splitlines())


@pytest.mark.slow
@pytest.mark.integration
def test_a_full_disk_during_backfill_ingest_and_a_joins_write_loses_nothing(disk):
    root = disk.mount / "lake"
    code, _, err = lake(root, "demo", "--topics-only")  # consents of user_1..10, accounts of 1..8
    assert code == 0, err

    # a backfill: the disk fills as it writes; after space is freed, the same command writes what
    # is missing, and the topic holds every account once
    disk.fill(leave=48 * 1024)
    assert failed_on_full_disk(lake(root, "backfill", "accounts"), root)
    disk.clear()
    code, out, err = lake(root, "backfill", "accounts")
    assert code == 0, err
    assert keys_on(root, "customer_accounts") == sorted(ACCOUNTS)

    # the ingest
    disk.fill(leave=32 * 1024)
    assert failed_on_full_disk(lake(root, "ingest"), root)
    disk.clear()
    code, out, err = lake(root, "ingest")
    assert code == 0, err

    # a join
    disk.fill(leave=96 * 1024)
    assert failed_on_full_disk(lake(root, "run", "consents_with_mail", "--once"), root, java_lines=True)
    disk.clear()
    code, out, err = lake(root, "run", "consents_with_mail", "--once")
    assert code == 0, err

    # bronze holds each record of the topics once; the result is exact; its changelog has each key once
    code, out, err = lake(
        root,
        "sql",
        "SELECT partition, offset FROM lake.customer_consents",
        "SELECT partition, offset FROM lake.customer_accounts",
        "SELECT customerId, contactMailAddress FROM lake.consents_with_mail",
    )
    assert code == 0, err
    consents, accounts, result = (
        [line.split("\t") for line in b.splitlines()[1:]] for b in out.split("\n\n")
    )
    assert sorted(consents) == offsets_on(root, "customer_consents") and len(consents) == 10
    assert sorted(accounts) == offsets_on(root, "customer_accounts") and len(accounts) == 10
    assert sorted(result) == sorted([u, f"user{u.split('_')[1]}@example.com"] for u in ACCOUNTS)
    assert keys_on(root, "consents_with_mail_changelog") == sorted(ACCOUNTS)
