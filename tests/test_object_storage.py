"""The consents story on a lake root in an S3 bucket, as a user runs it: ``LAKE_ROOT=s3a://...`` and
the ``lake`` CLI, the store reached through AWS_ENDPOINT_URL and the AWS_* credentials (the run's
embedded S3 store, conftest's ``s3_store``). Everything durable lands in the bucket; the local work
folder keeps only this machine's locks and logs.

The commands run through the CLI's entry point in the test's process, on its Spark session (as
test_stories.py does): the session was built before the root was known, so the root's settings
reach it the way they reach a session given to a lake."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from airflowkit import ALL_MAILS, mails
from conftest import S3_BUCKET, bucket_files
from test_stories import ACCOUNTS, CONSENTS, account, consent, ends, produce, referenced_once

from spark_jobs.cli import main
from spark_jobs.layout import JOIN_METRICS
from spark_jobs.seams.delta import Lake


@pytest.fixture
def lake(spark, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAKE_WORK", str(tmp_path / "work"))

    def run(root: str, *args: str) -> tuple[int, str, str]:
        code = main(["--root", root, *args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def machine(tmp_path: Path, name: str, script: str, *args: str) -> subprocess.Popen:
    """``script`` (Python) run as another machine would: its own process and work folder (locks,
    logs), the same store; its output in ``stdout``, a line on ``stdin`` when it waits for one."""
    path = tmp_path / f"{name}.py"
    path.write_text(script)
    return subprocess.Popen(
        [sys.executable, str(path), *args],
        env={**os.environ, "LAKE_WORK": str(tmp_path / name)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def said_until(proc: subprocess.Popen, last: str) -> list[str]:
    """The lines ``proc`` prints up to ``last`` (its whole output if it ends before saying it)."""
    assert proc.stdout is not None
    said = [proc.stdout.readline()]
    while said[-1] and said[-1].strip() != last:
        said.append(proc.stdout.readline())
    assert said[-1], "".join(said)[-3000:]
    return [line.rstrip("\n") for line in said]


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


def test_a_join_running_on_one_machine_is_refused_on_another_that_shares_the_root(tmp_path, monkeypatch):
    """Two machines on one s3a root (two work folders: two job registries): the join runs on the
    first; starting it on the second is refused in one line naming who runs it, and once the first
    stopped it, the second runs it, on from the first one's checkpoint in the bucket."""
    import socket

    root = f"s3a://{S3_BUCKET}/machines/{uuid.uuid4().hex[:12]}"
    cli = str(Path(sys.executable).with_name("lake"))

    def on(name: str, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "LAKE_WORK": str(tmp_path / name)}
        return subprocess.run(
            [cli, "--root", root, *args], env=env, capture_output=True, text=True, timeout=600
        )

    assert on("a", "demo", "--topics-only", "consents").returncode == 0
    started = on("a", "start", "consents_with_mail")
    assert started.returncode == 0, started.stderr
    try:
        second = on("b", "run", "consents_with_mail", "--once")
        assert second.returncode == 2, second.stdout + second.stderr
        line = second.stderr.strip().splitlines()[-1]
        assert line.startswith(
            f"lake: error: join consents_with_mail is already running on {socket.gethostname()} (pid "
        )
        assert line.endswith(f"): {root} is shared, one machine runs it")
    finally:
        assert on("a", "stop", "consents_with_mail").returncode == 0
    again = on("b", "run", "consents_with_mail", "--once")
    assert again.returncode == 0, again.stderr
    # it goes on from the checkpoint the first machine left in the bucket: nothing new to read
    assert again.stdout.startswith("join consents_with_mail: processed 0 micro-batch(es): 0 input records")
    monkeypatch.setenv("LAKE_WORK", str(tmp_path / "b"))
    assert mails(Lake(root), "consents_with_mail") == {**ALL_MAILS, "user_9": None, "user_10": None}


def test_the_list_pipeline_on_s3_runs_gated_and_audited_with_nothing_of_it_on_local_disk(lake, s3, tmp_path):
    """The people story (a list join, its persons in Protobuf) on an s3a root: the gate fails until the
    addresses are backfilled, the list join's element edits, and its audit identical."""
    prefix = f"people/{uuid.uuid4().hex[:12]}"
    root = f"s3a://{S3_BUCKET}/{prefix}"
    code, out, err = lake(root, "demo", "people")
    assert code == 0, out[-3000:] + err[-3000:]
    assert "FAIL  completeness:people_with_addresses:persons->addresses: " in out
    assert "elements joined 2, retracted 1, kept 3" in out.split("people 3.")[1]
    assert [line for line in out.splitlines() if line.startswith("audit ")] == [
        "audit people_with_addresses: 3 result rows, 3 expected by the batch join of persons up to offsets "
        "[9, 0], addresses up to offsets [6, 2, 4]: identical",
    ]
    kept = {path.removeprefix(f"{S3_BUCKET}/{prefix}/") for path in bucket_files(s3, prefix)}
    assert "tables/people_with_addresses/_delta_log/00000000000000000000.json" in kept
    assert "_checkpoints/lookups/addresses.json" in kept
    assert not any(p.startswith("_uploads/") for p in kept)
    work = tmp_path / "work"
    local = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    assert all(p.startswith(("_locks/", "_logs/", "_jobs/")) for p in local), local


APPENDER = """
import sys

import pyarrow as pa

from spark_jobs.layout import JOIN_METRICS
from spark_jobs.seams.delta import Lake
from spark_jobs.system_tables import JOIN_METRICS_SCHEMA, ensure_join_metrics

root, join, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
lake = Lake(root)
ensure_join_metrics(lake)
for batch in range(batches):
    row = {**{f.name: None for f in JOIN_METRICS_SCHEMA}, "join": join, "batch_id": batch}
    lake.append(JOIN_METRICS, pa.Table.from_pylist([row], JOIN_METRICS_SCHEMA))
"""


def test_two_machines_appending_to_one_system_table_on_s3_lose_no_commit(s3, tmp_path):
    """Every join appends its metrics to the one join_metrics table (and its rejects to the one
    quarantine), with no lease. On s3a with Delta's single-driver log store two writers (two work
    folders, as on two machines) appending at once both wrote a version's log entry, the later
    replacing the earlier's commit; the put-if-absent log store refuses the second, and Delta retries
    it at the next version: every row of both writers is there, each once, in one commit each."""
    root = f"s3a://{S3_BUCKET}/writers/{uuid.uuid4().hex[:12]}"
    batches = 60
    writers = [machine(tmp_path, join, APPENDER, root, join, str(batches)) for join in ("a", "b")]
    for writer in writers:
        out, _ = writer.communicate(timeout=600)
        assert writer.returncode == 0, out[-3000:]
    lake = Lake(root)
    rows = lake.read_arrow(JOIN_METRICS, columns=["join", "batch_id"]).to_pylist()
    assert sorted((r["join"], r["batch_id"]) for r in rows) == [
        (j, b) for j in ("a", "b") for b in range(batches)
    ]
    # the create, then one commit per append (a lost commit leaves a version whose rows are gone)
    assert lake.version(JOIN_METRICS) == 2 * batches


OUTSIDE_WRITER = """
import sys

from spark_jobs.seams.session import get_spark
from spark_jobs.seams.storage import resolve_root

root, writer, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
spark = get_spark(app_name=f"writer-{writer}", root=resolve_root(root))
print("ready", flush=True)
sys.stdin.readline()  # both sessions up: append at once
for batch in range(batches):
    rows = spark.createDataFrame([(writer, batch)], "writer string, batch int")
    rows.write.format("delta").mode("append").save(f"{root}/tables/shared")
"""


def test_two_spark_sessions_appending_to_one_table_on_s3_without_leases_lose_no_commit(spark, s3, tmp_path):
    """Delta's log on s3a goes through the product's put-if-absent log store, whatever the leases do:
    two drivers (two processes, outside the product's tables and leases) append to one table at the
    same moments. Each commit file is created only if absent, so when both commit a version one of
    them is refused and Delta retries it at the next; with Delta's S3SingleDriverLogStore both wrote
    the version and the later replaced the earlier (rows gone, versions short)."""
    from spark_jobs.seams.session import use_root
    from spark_jobs.seams.storage import resolve_root

    root = f"s3a://{S3_BUCKET}/outside/{uuid.uuid4().hex[:12]}"
    use_root(spark, resolve_root(root))
    spark.createDataFrame([], "writer string, batch int").write.format("delta").save(f"{root}/tables/shared")
    batches = 30
    writers = [machine(tmp_path, w, OUTSIDE_WRITER, root, w, str(batches)) for w in ("a", "b")]
    for writer in writers:  # both sessions started before either appends
        said_until(writer, "ready")
    for writer in writers:
        assert writer.stdin is not None
        writer.stdin.write("go\n")
        writer.stdin.flush()
    for writer in writers:
        out, _ = writer.communicate(timeout=600)
        assert writer.returncode == 0, out[-3000:]
    lake = Lake(root)
    rows = lake.read_arrow("shared", columns=["writer", "batch"]).to_pylist()
    assert sorted((r["writer"], r["batch"]) for r in rows) == [
        (w, b) for w in ("a", "b") for b in range(batches)
    ]
    assert lake.version("shared") == 2 * batches  # the create, then one commit per append
    # and the two did meet: commits made after another writer took the version they had read for
    history = spark.sql(f"DESCRIBE HISTORY delta.`{root}/tables/shared`").collect()
    retried = [h.version for h in history if h.readVersion is not None and h.readVersion < h.version - 1]
    print(f"{len(retried)} of {2 * batches} appends committed after a conflict")
    assert retried


LAPSED_HOLDER = """
import sys
import time

import pyarrow as pa

from spark_jobs.errors import UserError
from spark_jobs.runtime import leases
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.session import get_spark
from spark_jobs.seams.storage import resolve_root

leases.TTL, leases.MARGIN = 6.0, 2.0
root = resolve_root(sys.argv[1])
spark = get_spark(app_name="machine-a", root=root)
lake = Lake(root)
rows = pa.schema([("machine", pa.string()), ("n", pa.int64())])
lease = leases.acquire(root, "job-shared", "join shared", on_lost=lambda m: print("told:", m, flush=True))
lake.append("shared", pa.Table.from_pylist([{"machine": "a", "n": 0}], rows))
print("appended a0", flush=True)
lease._stop.set()  # cut off from the store: no renewal gets through
lease._thread.join()


def attempts(n: int) -> None:
    try:
        lake.append("shared", pa.Table.from_pylist([{"machine": "a", "n": n}], rows))
        print(f"appended a{n}", flush=True)
    except UserError as e:
        print(f"refused a{n}: {e}", flush=True)
    try:  # a write that is not the product's: Spark's own, to the same table
        frame = spark.createDataFrame([("a", n + 100)], "machine string, n long")
        frame.write.format("delta").mode("append").save(lake.uri("shared"))
        print(f"spark appended a{n + 100}", flush=True)
    except Exception as e:
        print(f"spark refused a{n + 100}: {'lake-lease-lapsed' in str(e)}", flush=True)


while lease.valid():
    time.sleep(0.1)
attempts(1)
print("waiting", flush=True)
sys.stdin.readline()  # the other machine took the lease over and wrote
attempts(2)
"""


def test_a_holder_whose_lease_may_have_lapsed_commits_nothing_more_under_the_root(
    spark, tmp_path, monkeypatch
):
    """Machine A holds a lease and writes; cut off from the store (its renewals stop), it refuses its
    own commits MARGIN before the lease can lapse on the store's clock: the product's writes in one
    line, Spark's own writes to the same table at the log store. Machine B takes the lease once it
    lapsed and writes; nothing A tries afterwards lands. The table holds A's one commit and B's."""
    import pyarrow as pa

    from spark_jobs.runtime import leases
    from spark_jobs.seams.session import use_root
    from spark_jobs.seams.storage import resolve_root

    monkeypatch.setattr(leases, "TTL", 6.0)  # as machine A's
    monkeypatch.setattr(leases, "MARGIN", 2.0)
    root = resolve_root(f"s3a://{S3_BUCKET}/fenced/{uuid.uuid4().hex[:12]}")
    use_root(spark, root)
    lake = Lake(root, spark=spark)
    lake.create("shared", pa.schema([("machine", pa.string()), ("n", pa.int64())]), change_feed=False)
    a = machine(tmp_path, "machine-a", LAPSED_HOLDER, str(root))
    told = [line for line in said_until(a, "waiting") if line.startswith(("appended", "refused", "spark"))]
    assert told == [
        "appended a0",
        f"refused a1: table shared: lake-lease-lapsed: commit to {root}/tables/shared/_delta_log/"
        f"00000000000000000002.json refused: this process's lease job-shared on {root} was not renewed "
        "in time, and another machine may hold it now",
        "spark refused a101: True",
    ]
    # machine B (this process, its own work folder): the lease lapses on the store's clock, B takes it
    deadline = time.monotonic() + 30
    while leases.holder(root, "job-shared") is not None:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    monkeypatch.setenv("LAKE_WORK", str(tmp_path / "machine-b"))
    taken = leases.acquire(root, "job-shared", "join shared", on_lost=print)
    assert isinstance(taken, leases.Lease)
    lake.append("shared", pa.Table.from_pylist([{"machine": "b", "n": 0}], lake.schema("shared")))
    assert a.stdin is not None
    a.stdin.write("go\n")
    a.stdin.flush()
    out, _ = a.communicate(timeout=120)
    assert a.returncode == 0, out[-3000:]
    assert [line for line in out.splitlines() if line.startswith(("appended", "refused", "spark"))] == [
        f"refused a2: table shared: lake-lease-lapsed: commit to {root}/tables/shared/_delta_log/"
        f"00000000000000000003.json refused: this process's lease job-shared on {root} was not renewed "
        "in time, and another machine may hold it now",
        "spark refused a102: True",
    ]
    taken.release()
    rows = lake.read_arrow("shared", columns=["machine", "n"]).to_pylist()
    assert sorted((r["machine"], r["n"]) for r in rows) == [("a", 0), ("b", 0)]
    assert lake.version("shared") == 2
