"""The lake's Spark Connect server: a long-lived Spark driver that quick commands talk to, ``lake up`` /
``lake down`` (with the embedded broker), ``lake connect start | stop | status | log``; a
:class:`~spark_jobs.seams.processes.Service`.

Starting a local Spark session costs a command about 10 s on a small machine (a JVM, the jars, the
session); a command that only reads (``lake show``) then does a fraction of a second of work. The
server is Spark's own ``SparkConnectServer`` (its jar ships in the pyspark wheel), started with
``spark-submit`` and the product's session settings (:func:`spark_jobs.seams.session.submit_conf`: the
locked jars, Delta, the state store), listening on loopback. A command that can run on it
(:func:`quick_session`) connects when the server of its lake root runs, and
builds a local session otherwise. The joins, the ingest and the catalog's commands (``lake sql``,
``lake dbt``: embedded Derby serves one process) always run their own session.

State under ``<root>/_connect/``: ``server.json`` (pid, port, while it runs), ``server.log``.

Its metrics: Spark's own (``PrometheusServlet``: the driver's JVM, block manager, DAG scheduler and
the Connect service's sources, names prefixed ``metrics_lake_connect_``; and the executors' at
``/metrics/executors/prometheus``), served in Prometheus' text format by Spark's UI on a port of its
own, ``metrics_url`` in ``server.json`` (``lake connect status``). Spark's UI binds every interface
unless ``SPARK_LOCAL_IP`` names one, which also moves the driver's own address: so on a local master
(the default) the server runs with ``SPARK_LOCAL_IP=127.0.0.1`` and serves on loopback; on a
cluster master it serves only when ``LAKE_CONNECT_METRICS_PORT`` asks for it (then on every
interface, as any Spark driver's UI there). ``LAKE_CONNECT_METRICS_PORT=off`` turns it off.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_jobs.errors import UserError
from spark_jobs.seams.processes import HOST, Launched, Service, free_port, spawn
from spark_jobs.seams.session import DEFAULT_MASTER, get_spark, submit_conf
from spark_jobs.seams.storage import Root, resolve_root

DEFAULT_PORT = 15002  # Spark Connect's own default
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30


class ConnectServer(Service):
    """The Spark Connect server of a lake root (its files under ``<root>/_connect/``)."""

    name = "connect"
    title = "Spark Connect server"
    address_key = "url"
    default_port = DEFAULT_PORT
    port_env = "LAKE_CONNECT_PORT"
    start_timeout = START_TIMEOUT_S
    stop_timeout = STOP_TIMEOUT_S

    @property
    def state_file(self) -> Path:
        return self.layout.connect_state

    @property
    def log_file(self) -> Path:
        return self.layout.connect_log

    def launch(self, port: int, log: Callable[[str], None], **_: Any) -> Launched:
        self.layout.connect.mkdir(parents=True, exist_ok=True)
        conf = submit_conf(self.layout.lake) | {
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(port),
        }
        master = os.environ.get("LAKE_SPARK_MASTER") or DEFAULT_MASTER
        metrics = metrics_port(master)
        state = {"url": f"sc://{HOST}:{port}"}
        env: dict[str, str] = {}
        if metrics is not None:
            conf |= metrics_conf(metrics)
            local = master.startswith("local")
            if local:
                env["SPARK_LOCAL_IP"] = HOST
            host = HOST if local else socket.getfqdn()
            state["metrics_url"] = f"http://{host}:{metrics}{METRICS_PATH}/"  # the servlet's own path
        cmd = [_spark_submit(), "--master", master, "--name", "lake-connect", "--class", SERVER_CLASS]
        cmd += [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
        log(f"starting the Spark Connect server on {HOST}:{port} ({master}) ...")
        proc = spawn(cmd, self.log_file, cwd=self.layout.connect, env=env)
        return Launched(proc, lambda: _answers(port), f"{HOST}:{port}", state)

    def describe_also(self, info: dict[str, Any]) -> str:
        url = info.get("metrics_url")
        return f", metrics at {url}" if url else ""

    def ready(self, launched: Launched) -> None:
        _warm_up(launched.state["url"], self.layout.connect_warm_up)


METRICS_PATH = "/metrics/prometheus"


def metrics_port(master: str) -> int | None:
    """The port the server's metrics are served on (None: not served): ``LAKE_CONNECT_METRICS_PORT``
    (a number, or ``off``), else a free one on a local master and none on a cluster's (module doc)."""
    asked = os.environ.get("LAKE_CONNECT_METRICS_PORT", "").strip()
    if asked.lower() in ("off", "false", "0"):
        return None
    if asked:
        if not asked.isdigit() or not 0 < int(asked) < 65536:
            raise UserError(f"LAKE_CONNECT_METRICS_PORT: a port number (1-65535) or off, not {asked!r}")
        return int(asked)
    return free_port() if master.startswith("local") else None


def metrics_conf(port: int) -> dict[str, str]:
    """Spark's UI on ``port`` serving its metrics system's PrometheusServlet (and the executors')."""
    sink = "spark.metrics.conf.*.sink.prometheusServlet"
    return {
        "spark.ui.enabled": "true",
        "spark.ui.port": str(port),
        "spark.port.maxRetries": "0",  # the port asked for, or a failed start: never a neighbour
        "spark.ui.prometheus.enabled": "true",
        "spark.metrics.namespace": "lake_connect",
        f"{sink}.class": "org.apache.spark.metrics.sink.PrometheusServlet",
        f"{sink}.path": METRICS_PATH,
        "spark.metrics.conf.driver.source.jvm.class": "org.apache.spark.metrics.source.JvmSource",
        "spark.metrics.staticSources.enabled": "true",
    }


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


def quick_session(root: Root | Path, app_name: str = "lake", log: Any = lambda _: None):
    """A session for a command that only reads the lake (``lake show``): the lake root's Spark Connect
    server when it runs (``lake up``), a second or two instead of a local
    Spark's start-up; else, or when the server does not answer, a local session (:func:`get_spark`)."""
    server = ConnectServer(root).status()
    url = server.address
    if server.running and not (url and _answers(int(url.rsplit(":", 1)[1]))):
        log(f"the Spark Connect server at {url} does not answer; starting a local Spark")
    elif server.running and url:
        from pyspark.sql import SparkSession

        try:
            spark = SparkSession.builder.remote(url).getOrCreate()
            _ = spark.version  # the first request: a server that does not answer fails here
            log(f"(on the Spark Connect server at {url})")
            return spark
        except Exception as exc:  # a stuck or dying server: the command still runs
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            log(f"the Spark Connect server at {url} did not answer ({first}); starting a local Spark")
    return get_spark(app_name=app_name, root=resolve_root(root))
