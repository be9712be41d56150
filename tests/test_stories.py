"""The documented user stories as a new user runs them: the `lake` CLI on a fresh lake root, nothing
else. Every answer about a topic is about the topic as Kafka holds it when the command starts, and
says which offsets it read.

The commands run through the CLI's entry point (``spark_jobs.cli.main``, what the ``lake`` script
calls) inside the test's process, on its Spark session: the same parsing, output and exit codes,
without a Spark start per command (test_cli.py runs ``lake`` as separate processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs.cli import main
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.partitioners import partition_for

CONSENTS = "customer_consents"
ACCOUNTS = "customer_accounts"


@pytest.fixture
def lake(spark, capsys):
    """``lake --root ROOT ARGS...`` -> (exit code, stdout, stderr)."""

    def run(root: Path, *args: str) -> tuple[int, str, str]:
        code = main(["--root", str(root), *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def consent(n: int) -> str:
    return json.dumps(
        {"customerId": f"user_{n}", "consents": {"retargeter1": True, "retargeter2": n % 2 == 1}}
    )


def account(n: int) -> str:
    return json.dumps({"customerId": f"user_{n}", "contactMailAddress": f"user{n}@example.com"})


def produce(lake, root: Path, tmp: Path, topic: str, lines: list[str]) -> None:
    path = tmp / f"{topic}.txt"
    path.write_text("".join(line + "\n" for line in lines))
    code, _, err = lake(root, "produce", topic, str(path), "-K", ";")
    assert code == 0, err


def placed(keys: list[str], partitions: int = 4) -> dict[str, tuple[int, int]]:
    """Where one transaction of ``keys`` (in order) puts each key: (partition, offset)."""
    nxt = [0] * partitions
    out = {}
    for key in keys:
        p = partition_for(key.encode(), partitions)
        out[key] = (p, nxt[p])
        nxt[p] += 1
    return out


def referenced_once(users: list[str], missing: list[str]) -> list[str]:
    """How `lake check` names each of ``missing``, referenced by one consent of one transaction of
    ``users`` (in order)."""
    at = placed(users)
    return [
        f"{u} (referenced by 1 record(s) of {CONSENTS}, first at partition {at[u][0]} offset {at[u][1]}, "
        f"last at partition {at[u][0]} offset {at[u][1]})"
        for u in missing
    ]


def ends(keys: list[str], partitions: int = 4) -> list[int]:
    """The end offsets after one transaction of ``keys``: its records and a commit marker in every
    partition it wrote."""
    counts = [0] * partitions
    for key in keys:
        counts[partition_for(key.encode(), partitions)] += 1
    return [n + 1 if n else 0 for n in counts]


def test_check_right_after_produce_answers_for_the_topics_on_kafka(lake, tmp_path):
    """No ingest, no other step: `lake check` reads the topics themselves, fails naming the two
    customers the accounts lookup lacks and where they are referenced, and passes after the backfill.
    The report says which offsets it checked."""
    root = tmp_path / "lake"
    users = [f"user_{n}" for n in range(1, 11)]
    produce(lake, root, tmp_path, CONSENTS, [f"{u};{consent(n)}" for n, u in enumerate(users, 1)])
    produce(lake, root, tmp_path, ACCOUNTS, [f"{u};{account(n)}" for n, u in enumerate(users[:8], 1)])

    code, out, err = lake(root, "check")
    assert code == 1, err
    where = referenced_once(users, ["user_10", "user_9"])
    assert (
        f"FAIL  consents_lookups / completeness:{CONSENTS}->accounts: Every key that {CONSENTS} "
        f"references exists in lookup accounts. FAILED: 2 keys missing in accounts: {'; '.join(where)}."
    ) in out
    checked = (
        f"checked: {CONSENTS} up to offsets {ends(users)}; {ACCOUNTS} up to offsets {ends(users[:8])} (taken "
    )
    assert checked in out
    assert (
        "PASS  consents_lookups / co_partitioning:" in out and "PASS  consents_lookups / key_format:" in out
    )

    code, out, err = lake(root, "backfill", "accounts")
    assert code == 0, err
    assert "2 new keys, 0 changed, 8 unchanged" in out
    assert f"compared with {ACCOUNTS} up to offsets {ends(users[:8])} (taken " in out

    code, out, err = lake(root, "check")
    assert code == 0, out + err
    assert out.count("PASS  ") == 6 and "FAIL" not in out  # with the framing census
    # the pipeline's report page names the offsets each check read
    page = (root / "reports" / "quality" / "consents.html").read_text()
    assert f"{CONSENTS} up to offsets {ends(users)}" in page


def test_run_once_right_after_produce_holds_every_produced_record(lake, tmp_path):
    """`lake run JOIN --once` reads the topics up to their end offsets as it starts: the consents
    produced a moment before are all in the result, and a backfill that follows completes them."""
    root = tmp_path / "lake"
    users = [f"user_{n}" for n in range(1, 11)]
    produce(lake, root, tmp_path, CONSENTS, [f"{u};{consent(n)}" for n, u in enumerate(users, 1)])

    code, out, err = lake(root, "run", "consents_with_mail", "--once")
    assert code == 0, err
    assert (
        f"join consents_with_mail: processed 1 micro-batch(es): 10 input records, 10 upserted, 0 deleted, "
        f"0 appended, 0 quarantined; read {CONSENTS} up to offsets {ends(users)}, {ACCOUNTS} up to offsets "
        "[0, 0, 0, 0]"
    ) in out
    assert result(root) == [(u, n % 2 == 1, None) for n, u in enumerate(users, 1)]

    code, out, err = lake(root, "backfill", "accounts")  # the bundled dump: user_1 .. user_10
    assert code == 0, err
    code, out, err = lake(root, "run", "consents_with_mail", "--once")
    assert code == 0, err
    assert "10 input records, 10 upserted, 0 deleted" in out
    assert result(root) == [(u, n % 2 == 1, f"user{n}@example.com") for n, u in enumerate(users, 1)]


def result(root: Path) -> list[tuple]:
    """The join's result table: (customer, retargeter2, e-mail) by customer number."""
    rows = Lake(root).read_arrow("consents_with_mail").to_pylist()
    rows.sort(key=lambda r: int(r["key"][5:]))
    return [(r["key"].decode(), r["retargeter2"], r["contactMailAddress"]) for r in rows]


def test_the_changelog_carries_each_results_event_time_read_back_from_kafka(lake, tmp_path):
    """A published table join sends each record with its result's event time, the latest of both
    sides' record timestamps, and a tombstone with its deleting record's: `lake produce --timestamp`,
    `lake run --once`, then `lake consume -f '%k %T'` of the changelog."""
    root = tmp_path / "lake"
    day = 86_400_000
    t0 = 1_767_225_600_000  # 2026-01-01, in the broker's accepted range (no limit into the past)

    def produce_at(topic: str, lines: list[str], at: int) -> None:
        path = tmp_path / f"{topic}-{at}.txt"
        path.write_text("".join(line + "\n" for line in lines))
        code, _, err = lake(root, "produce", topic, str(path), "-K", ";", "-Z", "--timestamp", str(at))
        assert code == 0, err

    produce_at(ACCOUNTS, [f"user_2;{account(2)}"], t0)  # older than the consents
    produce_at(CONSENTS, [f"user_{n};{consent(n)}" for n in (1, 2, 3)], t0 + day)
    produce_at(ACCOUNTS, [f"user_1;{account(1)}"], t0 + 2 * day)  # newer than the consents
    code, _, err = lake(root, "run", "consents_with_mail", "--once")
    assert code == 0, err

    def published() -> list[tuple[str, int, bool]]:
        code, out, err = lake(root, "consume", "consents_with_mail_changelog", "-f", "%k %T %S\n")
        assert code == 0, err
        rows = [line.split(" ") for line in out.splitlines() if line.startswith("user_")]
        return sorted((k, int(t), s == "-1") for k, t, s in rows)  # %S -1: a tombstone

    assert published() == [
        ("user_1", t0 + 2 * day, False),  # the account's time, the later of the two
        ("user_2", t0 + day, False),  # the consent's
        ("user_3", t0 + day, False),  # no account: the consent's
    ]
    times = {
        r["key"].decode(): r["timestamp"] for r in Lake(root).read_arrow("consents_with_mail").to_pylist()
    }
    assert {k: int(v.timestamp() * 1000) for k, v in times.items()} == {
        "user_1": t0 + 2 * day,
        "user_2": t0 + day,
        "user_3": t0 + day,
    }

    produce_at(CONSENTS, ["user_3;"], t0 + 3 * day)  # -Z: an empty value is a tombstone
    code, _, err = lake(root, "run", "consents_with_mail", "--once")
    assert code == 0, err
    assert published()[-1] == ("user_3", t0 + 3 * day, True)
