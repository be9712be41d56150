"""The lake's Spark Connect server: a long-lived Spark driver that quick commands talk to, ``lake up`` /
``lake down`` (with the embedded broker), ``lake connect start | stop | status``.

Starting a local Spark session costs a command about 10 s on a small machine (a JVM, the jars, the
session); a command that only reads (``lake show``) then does a fraction of a second of work. The
server is Spark's own ``SparkConnectServer`` (its jar ships in the pyspark wheel), started with
``spark-submit`` and the product's session settings (:func:`spark_jobs.seams.session.submit_conf`: the
locked jars, Delta, the state store), listening on loopback. A command that can run on it
(:func:`quick_session`) connects when the server of its lake root runs, and
builds a local session otherwise. The joins, the ingest and the catalog's commands (``lake sql``,
``lake dbt``: embedded Derby serves one process) always run their own session.

State under ``<root>/_connect/``: ``server.json`` (pid, port, while it runs), ``server.log``.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_jobs.layout import Layout
from spark_jobs.seams.processes import HOST, await_answer, check_port, read_state, stop_service, write_state
from spark_jobs.seams.session import DEFAULT_MASTER, get_spark, submit_conf
from spark_jobs.seams.storage import Root, resolve_root

DEFAULT_PORT = 15002  # Spark Connect's own default
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30


@dataclass(frozen=True)
class ConnectStatus:
    running: bool
    url: str | None = None
    pid: int | None = None
    started_at: str | None = None
    log: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def text(self) -> str:
        if not self.running:
            return "Spark Connect server: not running"
        return (
            f"Spark Connect server: running at {self.url} (pid {self.pid}, since {self.started_at}); "
            f"log {self.log}"
        )


def status(root: Root | Path) -> ConnectStatus:
    """The server's state from ``server.json``; a file left by a dead server reads as not running."""
    info = read_state(Layout(root).connect_state)
    if info is None:
        return ConnectStatus(False)
    return ConnectStatus(True, info["url"], int(info["pid"]), info.get("started_at"), info.get("log"))


def _spark_submit() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def _answers(port: int) -> bool:
    """True when something accepts connections on the port (a Connect client would otherwise retry
    for minutes before giving up)."""
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def answering(state: ConnectStatus) -> bool:
    """A running server that accepts connections now."""
    return state.running and state.url is not None and _answers(int(state.url.rsplit(":", 1)[1]))


def start(root: Root | Path, port: int = DEFAULT_PORT, log=lambda _: None) -> ConnectStatus:
    """Start the server unless it runs; returns once it accepts connections."""
    current = status(root)
    if current.running:
        return current
    check_port(port, "--connect-port")
    layout = Layout(root)
    layout.connect.mkdir(parents=True, exist_ok=True)
    server_log = layout.connect_log
    conf = submit_conf(resolve_root(root)) | {
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
    }
    master = os.environ.get("LAKE_SPARK_MASTER") or DEFAULT_MASTER
    cmd = [_spark_submit(), "--master", master, "--name", "lake-connect", "--class", SERVER_CLASS]
    cmd += [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
    log(f"starting the Spark Connect server on {HOST}:{port} ({master}) ...")
    with open(server_log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    url = f"sc://{HOST}:{port}"
    info = {
        "pid": proc.pid,
        "url": url,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "log": str(server_log),
    }
    await_answer(
        proc,
        lambda: _answers(port),
        "the Spark Connect server",
        f"{HOST}:{port}",
        [server_log],
        START_TIMEOUT_S,
    )
    _warm_up(url, layout.connect_warm_up)
    write_state(layout.connect_state, info)
    return status(root)


def _warm_up(url: str, table: Path) -> None:
    """The server's first query loads and compiles what every later one reuses (Delta's reader, Arrow
    batches to the client): about 7 s. Paid here, by ``lake up``, not by the user's first command."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        spark.range(3).write.format("delta").mode("overwrite").save(str(table))
        spark.read.format("delta").load(str(table)).orderBy("id").toArrow()
    finally:
        spark.stop()


def stop(root: Root | Path, log=lambda _: None) -> bool:
    """Stop the server (SIGTERM: Spark stops its context, then SIGKILL after 30 s); False when it was
    not running."""
    return stop_service(Layout(root).connect_state, "the Spark Connect server", STOP_TIMEOUT_S, log)


def quick_session(root: Root | Path, app_name: str = "lake", log: Any = lambda _: None):
    """A session for a command that only reads the lake (``lake show``): the lake root's Spark Connect
    server when it runs (``lake up``), a second or two instead of a local
    Spark's start-up; else, or when the server does not answer, a local session (:func:`get_spark`)."""
    server = status(root)
    if server.running and not answering(server):
        log(f"the Spark Connect server at {server.url} does not answer; starting a local Spark")
    elif server.running and server.url:
        from pyspark.sql import SparkSession

        try:
            spark = SparkSession.builder.remote(server.url).getOrCreate()
            _ = spark.version  # the first request: a server that does not answer fails here
            log(f"(on the Spark Connect server at {server.url})")
            return spark
        except Exception as exc:  # a stuck or dying server: the command still runs
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log(f"the Spark Connect server at {server.url} did not answer ({first}); starting a local Spark")
    return get_spark(app_name=app_name, root=resolve_root(root))
