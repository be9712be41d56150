"""The consents story on a lake root in an S3 bucket, as a user runs it: ``LAKE_ROOT=s3a://...`` and
the ``lake`` CLI, the store reached through AWS_ENDPOINT_URL and the AWS_* credentials (the run's
embedded S3 store, conftest's ``s3_store``). Everything durable lands in the bucket; the local work
folder keeps only this machine's locks and logs.

The commands run through the CLI's entry point in the test's process, on its Spark session (as
test_stories.py does): the session was built before the root was known, so the root's settings
reach it the way they reach a session given to a lake."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from conftest import S3_BUCKET, bucket_files
from test_stories import ACCOUNTS, CONSENTS, account, consent, ends, produce, referenced_once

from spark_jobs.cli import main
from spark_jobs.seams.delta import Lake


@pytest.fixture
def lake(spark, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKE_WORK", str(tmp_path / "work"))

    def run(root: str, *args: str) -> tuple[int, str, str]:
        code = main(["--root", root, *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_the_consents_story_on_s3_keeps_every_table_checkpoint_and_report_in_the_bucket(lake, s3, tmp_path):
    prefix = f"stories/{uuid.uuid4().hex[:12]}"
    root = f"s3a://{S3_BUCKET}/{prefix}"
    users = [f"user_{n}" for n in range(1, 11)]
    produce(lake, root, tmp_path, CONSENTS, [f"{u};{consent(n)}" for n, u in enumerate(users, 1)])
    produce(lake, root, tmp_path, ACCOUNTS, [f"{u};{account(n)}" for n, u in enumerate(users[:8], 1)])

    code, out, err = lake(root, "check")
    assert code == 1, err
    where = referenced_once(users, ["user_10", "user_9"])
    assert f"FAILED: 2 keys missing in accounts: {'; '.join(where)}." in out
    assert f"summary: {root}/reports/quality/runs/" in out
    assert f"Data Docs: {root}/reports/quality/gx/uncommitted/data_docs/local_site/index.html" in out

    code, out, err = lake(root, "backfill", "accounts")
    assert code == 0, err
    assert f"to {root}/_uploads/" in out + err and " for the executors ..." in out + err
    assert "2 new keys, 0 changed, 8 unchanged" in out

    code, out, err = lake(root, "check")
    assert code == 0, out + err
    assert out.count("PASS  ") == 6 and "FAIL" not in out

    code, out, err = lake(root, "run", "consents_with_mail", "--once")
    assert code == 0, err
    assert (
        f"join consents_with_mail: processed 1 micro-batch(es): 20 input records, 10 upserted, 0 deleted, "
        f"0 appended, 0 quarantined; read {CONSENTS} up to offsets {ends(users)}, {ACCOUNTS} up to offsets "
    ) in out
    code, out, err = lake(root, "audit", "consents_with_mail")
    assert code == 0, out + err
    assert "10 result rows, 10 expected by the batch join" in out and out.rstrip().endswith("identical")

    rows = Lake(root).read_arrow("consents_with_mail", columns=["customerId", "contactMailAddress"])
    assert sorted(rows.to_pylist(), key=lambda r: int(r["customerId"][5:])) == [
        {"customerId": u, "contactMailAddress": f"user{n}@example.com"} for n, u in enumerate(users, 1)
    ]

    # in the bucket: the tables, the checkpoints, the lookup's position and the reports
    kept = {path.removeprefix(f"{S3_BUCKET}/{prefix}/") for path in bucket_files(s3, prefix)}
    for expected in (
        "tables/consents_with_mail/_delta_log/00000000000000000001.json",
        "tables/lookup_accounts/_delta_log/00000000000000000000.json",
        "tables/quality_runs/_delta_log/00000000000000000000.json",
        "_checkpoints/consents_with_mail/commits/0",
        "_checkpoints/consents_with_mail/lake-inputs.json",
        "_checkpoints/lookups/accounts.json",
        "reports/quality/index.html",
        "reports/quality/consents.html",
        "reports/quality/gx/uncommitted/data_docs/local_site/index.html",
    ):
        assert expected in kept, expected
    assert any(p.startswith("_checkpoints/consents_with_mail/state/0/") for p in kept)  # RocksDB's
    # the backfill's dump was copied up for the executors to read, and removed when it ended
    assert not any(p.startswith("_uploads/") for p in kept)
    page = s3.open_input_stream(f"{S3_BUCKET}/{prefix}/reports/quality/consents.html").read().decode()
    assert f"{CONSENTS} up to offsets {ends(users)}" in page

    # on this machine: locks and logs, nothing of the lake's data
    work = tmp_path / "work"
    local = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    assert local and all(p.startswith(("_locks/", "_logs/", "_jobs/")) for p in local), local
    assert not any(p.endswith((".parquet", ".html", ".crc")) or "_delta_log" in p for p in local)
    assert not Path("s3a:").exists()
