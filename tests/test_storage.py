"""Where the lake lives: a root that names another file system is never taken for a local folder,
and the embedded S3-compatible store (``lake s3``) serves the S3 API its clients speak."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys

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


@pytest.mark.parametrize("command", [["status"], ["check"], ["demo", "--topics-only"]])
def test_a_root_on_another_file_system_is_refused_in_one_line_and_no_local_folder_is_made(tmp_path, command):
    done = lake(tmp_path, *command, env={"LAKE_ROOT": "s3a://lakebar/root"})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "lake: error: lake root s3a://lakebar/root: this version keeps the lake in a local folder only, "
        "not on a s3a:// file system; give a local folder (--root or LAKE_ROOT)"
    ]
    assert list(tmp_path.iterdir()) == []


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
