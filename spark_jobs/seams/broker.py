"""The embedded single-node KRaft broker: ``lake kafka start | stop | status | log``, a
:class:`~spark_jobs.seams.processes.Service`.

A real Kafka broker (``kafka.Kafka`` from the locked ``kafka`` jars, :mod:`spark_jobs.seams.jvm`) in its own
JVM, combined broker and controller, listening on loopback only. Its data, log and state live under
``<root>/_kafka/``:

- ``data/``: the log directories (formatted once with ``kafka-storage format --standalone``);
- ``server.properties``, ``log4j2.properties``: written on every start;
- ``broker.log``: the broker's own log;
- ``broker.json``: pid, ports and ``bootstrap_servers`` while it runs (what other commands read).

``start`` returns once the broker answers a metadata request (about 5 s), ``stop`` asks for a
controlled shutdown (SIGTERM) and waits. With ``sasl_users`` the broker opens a second listener,
SASL_PLAINTEXT with the PLAIN mechanism and those users, to try client settings against.
"""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_jobs.errors import UserError
from spark_jobs.seams.jvm import locked_jars
from spark_jobs.seams.processes import HOST, Launched, Service, check_port, free_port, last_line

DEFAULT_PORT = 9092
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30
HEAP = os.environ.get("LAKE_KAFKA_HEAP", "1g")

LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.kafka.additivity = false
logger.kafka.appenderRef.file.ref = file
"""


# What every broker this project starts (the embedded one, the fault suite's cluster) is set to
SHARED_SETTINGS = (
    # topics are created by the product with their declared partition counts, never by a client that
    # names an unknown topic
    "auto.create.topics.enable=false",
    # keep every record: demo and test data carry fixed old timestamps, which a time-based retention
    # (7 days by default) would delete at once
    "log.retention.ms=-1",
    "log.retention.bytes=-1",
    "group.initial.rebalance.delay.ms=0",
    "log.cleaner.dedupe.buffer.size=33554432",
)


def new_cluster_id() -> str:
    """A KRaft cluster id for a storage format: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _server_properties(
    data: Path, port: int, controller: int, sasl_port: int | None, sasl_users: dict[str, str]
) -> str:
    listeners = [f"PLAINTEXT://{HOST}:{port}", f"CONTROLLER://{HOST}:{controller}"]
    advertised = [f"PLAINTEXT://{HOST}:{port}"]
    protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
    lines = []
    if sasl_port is not None:
        listeners.append(f"SASL_PLAINTEXT://{HOST}:{sasl_port}")
        advertised.append(f"SASL_PLAINTEXT://{HOST}:{sasl_port}")
        protocols.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
        users = " ".join(f'user_{u}="{p}"' for u, p in sasl_users.items())
        lines += [
            "sasl.enabled.mechanisms=PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config="
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
        ]
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers={HOST}:{controller}",
            f"listeners={','.join(listeners)}",
            f"advertised.listeners={','.join(advertised)}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            f"listener.security.protocol.map={','.join(protocols)}",
            f"log.dirs={data}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            *SHARED_SETTINGS,
            *lines,
            "",
        ]
    )


class Broker(Service):
    """The embedded broker of a lake root (its files under ``<root>/_kafka/``)."""

    name = "kafka"
    title = "embedded Kafka broker"
    address_key = "bootstrap_servers"
    default_port = DEFAULT_PORT
    port_env = "LAKE_KAFKA_PORT"
    start_timeout = START_TIMEOUT_S
    stop_timeout = STOP_TIMEOUT_S

    @property
    def state_file(self) -> Path:
        return self.layout.broker_state

    @property
    def log_file(self) -> Path:
        return self.layout.broker_log

    def describe_also(self, info: dict[str, Any]) -> str:
        sasl = info.get("sasl_bootstrap_servers")
        return f", SASL_PLAINTEXT (PLAIN) at {sasl}" if sasl else ""

    def launch(
        self,
        port: int,
        log: Callable[[str], None],
        sasl_port: int | None = None,
        sasl_users: dict[str, str] | None = None,
        **_: Any,
    ) -> Launched:
        """With ``sasl_users``, a second listener (SASL_PLAINTEXT, PLAIN) on ``sasl_port`` (default:
        ``port`` + 2)."""
        sasl_users = sasl_users or {}
        if sasl_users and sasl_port is None:
            sasl_port = port + 2
        if sasl_port is not None:
            check_port(sasl_port, "--sasl-port", what="SASL port")
        jars = locked_jars("kafka")
        layout = self.layout
        data = layout.broker_data
        data.mkdir(parents=True, exist_ok=True)
        controller = free_port()
        props = layout.broker_config
        props.write_text(_server_properties(data, port, controller, sasl_port, sasl_users))
        log4j = layout.broker_log_config
        level = os.environ.get("LAKE_KAFKA_LOG_LEVEL", "WARN")
        log4j.write_text(LOG4J2.format(log=layout.broker_log, level=level))
        java = ["java", f"-Xmx{HEAP}", f"-Xms{HEAP}", "-XX:+UseParallelGC", "-Djava.awt.headless=true"]
        java += [f"-Dlog4j2.configurationFile={log4j}", "-cp", ":".join(str(j) for j in jars)]
        if not (data / "meta.properties").exists():
            _format_storage(java, data, props)
        log(f"starting the embedded Kafka broker on {HOST}:{port} (data {data}) ...")
        with open(layout.broker_output, "w") as out:
            proc = subprocess.Popen(
                [*java, "kafka.Kafka", str(props)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives the command that started it
            )
        bootstrap = f"{HOST}:{port}"
        state = {
            "bootstrap_servers": bootstrap,
            "sasl_bootstrap_servers": f"{HOST}:{sasl_port}" if sasl_port else None,
            "controller_port": controller,
            "data_dir": str(data),
        }
        # the broker's output: what a JVM that never got to log4j printed
        return Launched(
            proc, lambda: _answers(bootstrap), bootstrap, state, [layout.broker_log, layout.broker_output]
        )


def _format_storage(java: list[str], data: Path, props: Path) -> None:
    """Format the broker's log directories once (KRaft, standalone controller, a new cluster id)."""
    formatted = subprocess.run(
        [
            *java,
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            f"--cluster-id={new_cluster_id()}",
            "-c",
            str(props),
        ],
        capture_output=True,
        text=True,
    )
    if formatted.returncode != 0:
        raise UserError(f"formatting the broker's storage in {data} failed: {last_line(formatted.stderr)}")


def _answers(bootstrap: str) -> bool:
    """True when the broker serves metadata and has finished loading (a topic can be described)."""
    from spark_jobs.seams.kafka import broker_answers

    return broker_answers(bootstrap)
