"""Where the lake lives: a root that names another file system is never taken for a local folder,
and the embedded S3-compatible store (``lake s3``) serves the S3 API its clients speak."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid

import pytest
from pyarrow import fs

from spark_jobs.seams.storage import work_folder


def lake(cwd, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spark_jobs.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


WITHOUT_AWS = {"AWS_ENDPOINT_URL": "", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}


@pytest.mark.parametrize(
    "root, said",
    [
        ("gs://lakebar/root", "lake root gs://lakebar/root: no file system for gs:// here; "),
        (
            "s3://lakebar/root",
            "lake root s3://lakebar/root: no file system for s3:// here (Hadoop's S3A connector: s3a://); ",
        ),
    ],
)
@pytest.mark.parametrize("command", [["status"], ["check"], ["demo", "--topics-only"]])
def test_a_root_on_a_file_system_without_a_connector_is_refused_in_one_line_and_no_local_folder_is_made(
    tmp_path, root, said, command
):
    done = lake(tmp_path, *command, env={"LAKE_ROOT": root})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"lake: error: {said}a lake root is a local folder or s3a://bucket/prefix"
    ]
    assert list(tmp_path.iterdir()) == []


def test_a_bucket_that_is_not_there_or_credentials_it_refuses_are_one_line_and_nothing_is_written(
    tmp_path, s3_store
):
    env = {"LAKE_WORK": str(tmp_path / "work")}
    missing = lake(tmp_path, "--root", "s3a://no-such-bucket/lake", "status", env=env)
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"lake: error: lake root s3a://no-such-bucket/lake: bucket no-such-bucket does not exist at {s3_store.address}"
    ]
    refused = lake(
        tmp_path, "--root", "s3a://lake-tests/refused", "status",
        env={**env, "AWS_SECRET_ACCESS_KEY": "not-it"},
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"lake: error: lake root s3a://lake-tests/refused: {s3_store.address} refused this machine's "
        "credentials for bucket lake-tests"
    ]
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").rglob("*.json"))


def test_a_file_uri_root_is_the_local_folder(tmp_path):
    assert work_folder(f"file://{tmp_path}/lake") == tmp_path / "lake"
    assert work_folder(str(tmp_path / "lake")) == tmp_path / "lake"


def test_a_uri_roots_work_folder_is_one_per_root_whatever_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("LAKE_WORK", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert work_folder("s3a://lakebar/root") == tmp_path / "state" / "lake" / "s3a-lakebar-root"
    monkeypatch.setenv("LAKE_WORK", str(tmp_path / "work"))
    assert work_folder("s3a://lakebar/root") == tmp_path / "work"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_embedded_s3_store_starts_serves_its_buckets_to_its_key_only_and_stops(tmp_path):
    root, port = tmp_path / "lake", _free_port()
    started = lake(tmp_path, "--root", str(root), "s3", "start", "--port", str(port), "--bucket", "lakebar")
    assert started.returncode == 0, started.stderr
    try:
        endpoint = f"http://127.0.0.1:{port}"
        assert started.stdout.startswith(f"embedded S3 store: running at {endpoint} (pid ")
        status = json.loads(lake(tmp_path, "--root", str(root), "s3", "status", "--json").stdout)
        assert status["running"] is True and status["endpoint"] == endpoint and status["access_key"] == "lake"
        assert "secret_key" not in status
        state = root / "_s3" / "s3.json"
        assert stat.S_IMODE(state.stat().st_mode) == 0o600
        secret = json.loads(state.read_text())["secret_key"]

        s3 = fs.S3FileSystem(
            access_key="lake", secret_key=secret, endpoint_override=endpoint, region="us-east-1"
        )
        with s3.open_output_stream("lakebar/root/hello.json") as out:
            out.write(b'{"hello": 1}')
        assert s3.open_input_stream("lakebar/root/hello.json").read() == b'{"hello": 1}'
        assert (root / "_s3" / "data" / "lakebar" / "root" / "hello.json").read_bytes() == b'{"hello": 1}'

        stranger = fs.S3FileSystem(
            access_key="lake", secret_key="not-it", endpoint_override=endpoint, region="us-east-1"
        )
        with pytest.raises(OSError, match="ACCESS_DENIED"):
            stranger.get_file_info("lakebar/root/hello.json")

        again = lake(tmp_path, "--root", str(root), "s3", "start", "--port", str(port))
        assert again.returncode == 0 and again.stdout == started.stdout  # the running store, not a second
    finally:
        stopped = lake(tmp_path, "--root", str(root), "s3", "stop")
    assert stopped.stdout == "embedded S3 store: stopped\n"
    assert lake(tmp_path, "--root", str(root), "s3", "status").stdout == "embedded S3 store: not running\n"


def test_a_root_in_the_embedded_store_is_found_through_its_work_folder_without_any_aws_setting(tmp_path):
    """``lake s3 start`` with an s3a:// root creates its bucket; every command on that root then finds
    the store (its endpoint and key) in the root's work folder, as the embedded broker is found."""
    env = {**WITHOUT_AWS, "LAKE_WORK": str(tmp_path / "work"), "LAKE_ROOT": "s3a://first-look/lake"}
    port = _free_port()
    started = lake(tmp_path, "s3", "start", "--port", str(port), env=env)
    assert started.returncode == 0, started.stderr
    try:
        status = lake(tmp_path, "status", env=env)
        assert status.returncode == 0, status.stderr
        assert (tmp_path / "work" / "_s3" / "data" / "first-look").is_dir()
    finally:
        lake(tmp_path, "s3", "stop", env=env)


def _root(monkeypatch, tmp_path, name: str):
    from conftest import S3_BUCKET

    from spark_jobs.seams.storage import resolve_root

    monkeypatch.setenv("LAKE_WORK", str(tmp_path / name))
    return resolve_root(f"s3a://{S3_BUCKET}/leases/{uuid.uuid4().hex[:12]}")


def test_a_lease_has_one_holder_among_machines_and_a_lapsed_one_is_taken_over(monkeypatch, tmp_path):
    """Leases are objects written with If-None-Match and renewed with If-Match: a second taker gets
    who holds it; a released lease is free; a holder that stopped renewing loses it to the next
    taker, and learns so at its next renewal."""
    from spark_jobs.runtime import leases
    from spark_jobs.seams.storage import put_if, read_tagged

    root = _root(monkeypatch, tmp_path, "work")
    first = leases.acquire(root, "job-orders", "join orders", on_lost=print)
    assert isinstance(first, leases.Lease)
    second = leases.acquire(root, "job-orders", "join orders", on_lost=print)
    assert isinstance(second, leases.Holder)
    assert (second.host, second.pid, second.what) == (socket.gethostname(), os.getpid(), "join orders")
    assert leases.holder(root, "job-orders") == second
    first.release()
    assert leases.holder(root, "job-orders") is None
    assert read_tagged(root.s3, leases.lease_path(root, "job-orders")) is None  # released: deleted

    # a holder cut off from the store: its lease lapses (on the store's clock, to the second), the
    # next taker replaces it (If-Match); the holder's own deadline passed MARGIN before
    monkeypatch.setattr(leases, "TTL", 3.0)
    monkeypatch.setattr(leases, "MARGIN", 1.0)
    lost: list[str] = []
    cut_off = leases.acquire(root, "lock-quality", "quality", on_lost=lost.append)
    assert isinstance(cut_off, leases.Lease)
    path = leases.lease_path(root, "lock-quality")
    lapsed = read_tagged(root.s3, path)
    cut_off._stop.set()  # it stops renewing
    cut_off._thread.join()
    assert cut_off.valid()
    time.sleep(2.1)
    assert not cut_off.valid()  # TTL - MARGIN after it sent its last renewal
    assert isinstance(leases.acquire(root, "lock-quality", "quality", on_lost=print), leases.Holder)
    time.sleep(3.0)  # the store's clock: older than TTL now
    taker = leases.acquire(root, "lock-quality", "quality", on_lost=print)
    assert isinstance(taker, leases.Lease)
    assert read_tagged(root.s3, path).etag != lapsed.etag
    # the cut-off holder does not renew a lease whose deadline passed: it is told, and writes nothing
    cut_off._stop.clear()
    cut_off._thread = threading.Thread(target=cut_off._renewing)
    cut_off._thread.start()
    cut_off._thread.join(timeout=5)
    assert lost == [
        f"lost the lease {path} (quality): the store did not answer its renewals for 2 s, and another "
        "machine may take it 1 s later; this process's commits under the root are refused"
    ]
    assert put_if(root.s3, path, b"{}", cut_off.etag) is None  # and could not have overwritten it
    taker.release()


def test_an_exclusive_lock_on_a_shared_root_waits_for_the_lease_of_another_machine(monkeypatch, tmp_path):
    """``Lake.lock`` orders one machine's processes with a lock file; on an object store's root it
    also takes the root's lease, so two machines (two work folders) take turns: without waiting the
    second is told at once, waiting it says who it waits for and goes on when the first is done."""
    from spark_jobs.runtime.leases import leased
    from spark_jobs.seams.delta import Lake

    root = _root(monkeypatch, tmp_path, "machine-a")
    lake = Lake(root)
    said: list[str] = []
    with lake.lock("lookup-accounts") as mine:
        assert mine is True
        # another machine: its own lock file (work folder), the same root's lease
        with leased(root, "lock-lookup-accounts", "lookup-accounts", wait=False) as other:
            assert other is None

    def hold_briefly() -> None:
        with lake.lock("lookup-accounts"):
            time.sleep(2.0)

    holder = threading.Thread(target=hold_briefly)
    holder.start()
    time.sleep(0.5)
    started = time.monotonic()
    with leased(root, "lock-lookup-accounts", "lookup-accounts", wait=True, log=said.append) as other:
        assert other is not None and time.monotonic() - started > 1.0
    holder.join()
    assert len(said) == 1 and said[0].startswith(
        f"waiting for {socket.gethostname()} (pid {os.getpid()}, since "
    )
    assert said[0].endswith(" to finish lookup-accounts ...")


@pytest.mark.parametrize("bucket", ["b1", "Lake_Bar", "lake-"])
def test_a_bucket_name_s3_would_refuse_is_refused_before_the_store_starts(tmp_path, bucket):
    work = tmp_path / "work"
    done = lake(
        tmp_path, "--root", "s3a://lakebar/r", "s3", "start", "--bucket", bucket, env={"LAKE_WORK": str(work)}
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"lake: error: bucket name {bucket!r}: S3 takes 3-63 lower-case letters, digits, dots and hyphens, "
        "starting and ending with a letter or digit"
    )
    assert not work.exists()
