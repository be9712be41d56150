"""``lake up`` / ``lake down``: the embedded broker and the Spark Connect server that quick commands
(``lake show``) use while it runs, with the same output as a local session's, and a local session
when it is down or does not answer (docs/kafka-and-topics.md, "The quick CLI")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from spark_jobs.errors import UserError
from spark_jobs.layout import Layout
from spark_jobs.seams.connect import ConnectServer
from spark_jobs.seams.processes import await_answer, free_port

SHOWN = "key\tname\tn\na\tAda\t1\nb\tBob\t2\n"


def lake_cli(root, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "spark_jobs.cli", "--root", str(root), *args], capture_output=True, text=True
    )
    return proc.returncode, proc.stdout, proc.stderr


def _spark_jobs(url: str) -> float:
    """The jobs the Connect server's driver has run, from a Prometheus scrape of its metrics (its
    heap in use checked on the way: the JVM's series are there too)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as answer:
        samples = {
            s.name: s.value
            for family in text_string_to_metric_families(answer.read().decode())
            for s in family.samples
        }
    assert samples["metrics_lake_connect_driver_jvm_heap_used_Value"] > 0
    return samples["metrics_lake_connect_driver_DAGScheduler_job_allJobs_Value"]


@pytest.mark.slow
@pytest.mark.integration
def test_lake_show_runs_on_the_connect_server_while_it_is_up_and_locally_otherwise(lake):
    schema = pa.schema([("key", pa.binary()), ("name", pa.string()), ("n", pa.int64())])
    lake.create("people", schema)
    lake.append("people", pa.table({"key": [b"b", b"a"], "name": ["Bob", "Ada"], "n": [2, 1]}, schema=schema))
    root = lake.root
    kafka_port, connect_port, registry_port = free_port(), free_port(), free_port()
    code, out, err = lake_cli(
        root, "up", "--port", str(kafka_port), "--connect-port", str(connect_port),
        "--registry-port", str(registry_port),
    )  # fmt: skip
    try:
        assert code == 0, err
        assert f"embedded Kafka broker: running at 127.0.0.1:{kafka_port}" in out
        assert f"embedded Schema Registry: running at http://127.0.0.1:{registry_port}/apis/ccompat/v7" in out
        assert f"Spark Connect server: running at sc://127.0.0.1:{connect_port}" in out
        code, out, err = lake_cli(root, "connect", "status", "--json")
        assert code == 0 and json.loads(out)["url"] == f"sc://127.0.0.1:{connect_port}"
        # its metrics: Spark's own, on loopback, where the status says
        metrics_url = json.loads(out)["metrics_url"]
        assert metrics_url.startswith("http://127.0.0.1:") and metrics_url.endswith("/metrics/prometheus/")
        jobs_before = _spark_jobs(metrics_url)
        # twice: the server keeps serving after a client leaves
        for _ in range(2):
            code, out, err = lake_cli(root, "show", "people")
            assert (code, out) == (0, SHOWN), err
            assert f"(on the Spark Connect server at sc://127.0.0.1:{connect_port})" in err
        assert _spark_jobs(metrics_url) > jobs_before  # the two reads ran there
        code, out, err = lake_cli(root, "show", "people", "--changes")
        assert (
            code == 0
            and out.splitlines()[0] == "_change_type\t_commit_version\t_commit_timestamp\tkey\tname\tn"
        )
        assert [line.split("\t")[0:2] for line in out.splitlines()[1:]] == [["insert", "1"], ["insert", "1"]]
        # a user mistake is the same one line on the server as locally
        code, out, err = lake_cli(root, "show", "nobody")
        assert code == 2 and err.startswith("lake: error: unknown table 'nobody'") and "Traceback" not in err
    finally:
        code, out, err = lake_cli(root, "down")
    assert code == 0 and out == (
        "Spark Connect server: stopped\nembedded Schema Registry: stopped\nembedded Kafka broker: stopped\n"
    ), err
    assert not ConnectServer(root).status().running
    code, out, err = lake_cli(root, "show", "people")  # down: a local session, the same rows
    assert (code, out) == (0, SHOWN) and "Spark Connect" not in err
    # a server that does not answer (its pid alive, nothing on its port): a local session, said so
    folder = Layout(root).connect
    (folder / "server.json").write_text(
        json.dumps({"pid": os.getpid(), "url": f"sc://127.0.0.1:{free_port()}"})
    )
    code, out, err = lake_cli(root, "show", "people")
    assert (code, out) == (0, SHOWN)
    assert "does not answer; starting a local Spark" in err and "Traceback" not in err


def test_a_service_that_dies_or_stays_silent_at_start_up_is_one_line_naming_its_log(tmp_path):
    log, out = tmp_path / "service.log", tmp_path / "service.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", "print('starting'); print('ERROR port taken'); raise SystemExit(3)"],
            stdout=sink,
        )
    with pytest.raises(UserError) as err:  # its own log is empty: the last error line of the other
        await_answer(proc, lambda: False, "the service", "127.0.0.1:1", [log, out], 30)
    assert str(err.value) == f"the service exited during start-up (code 3): ERROR port taken (log {log})"
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with pytest.raises(UserError) as err:
        await_answer(silent, lambda: False, "the service", "127.0.0.1:1", [log], 0.5)
    assert str(err.value) == f"the service did not answer on 127.0.0.1:1 within 0.5 s (log {log})"
    assert silent.wait(10) != 0  # killed
