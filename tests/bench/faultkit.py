"""A 3-broker Kafka cluster on loopback for the fault suite (``make faults``): KRaft, each node both
broker and controller (a static 3-voter quorum), from the locked ``kafka`` jars. Clients reach it on
a SASL_PLAINTEXT listener with SCRAM-SHA-512 (the user is created when the storage is formatted);
the brokers talk to each other on a plaintext listener. Topics get 3 replicas and need 2 in sync
(``min.insync.replicas=2``), the internal ones too, so any one broker can die without a write or a
committed transaction being lost.

``kill(node)`` is ``kill -9``; ``restart(node)`` starts the same node on its data again and returns
once it answers.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from spark_jobs.seams.broker import LOG4J2, SHARED_SETTINGS, new_cluster_id
from spark_jobs.seams.jvm import locked_jars
from spark_jobs.seams.processes import HOST, free_port

USER = "lake"
_QUIET = logging.getLogger("faultkit.kafka")  # librdkafka's lines while a node is down: expected
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False
MECHANISM = "SCRAM-SHA-512"


@dataclass
class Node:
    id: int
    client_port: int
    internal_port: int
    controller_port: int
    home: Path
    proc: subprocess.Popen | None = None

    @property
    def props(self) -> Path:
        return self.home / "server.properties"


@dataclass
class KafkaCluster:
    folder: Path
    password: str = field(default_factory=lambda: uuid.uuid4().hex)
    nodes: list[Node] = field(default_factory=list)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{HOST}:{n.client_port}" for n in self.nodes)

    def client_settings(self) -> dict[str, str]:
        """What a pipeline's ``kafka:`` section needs (librdkafka's names), besides the address."""
        return {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": MECHANISM,
            "sasl.username": USER,
            "sasl.password": self.password,
        }

    def start(self) -> None:
        self.nodes = [
            Node(i, free_port(), free_port(), free_port(), self.folder / f"node{i}") for i in (1, 2, 3)
        ]
        voters = ",".join(f"{n.id}@{HOST}:{n.controller_port}" for n in self.nodes)
        cluster_id = new_cluster_id()
        for n in self.nodes:
            (n.home / "data").mkdir(parents=True, exist_ok=True)
            n.props.write_text(_properties(n, voters))
            (n.home / "log4j2.properties").write_text(LOG4J2.format(log=n.home / "broker.log", level="WARN"))
            formatted = subprocess.run(
                [
                    *self._java(n),
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={cluster_id}",
                    "-c",
                    str(n.props),
                    "--add-scram",
                    f"{MECHANISM}=[name={USER},password={self.password}]",
                ],
                capture_output=True,
                text=True,
            )
            if formatted.returncode != 0:
                raise RuntimeError(f"formatting node {n.id} failed: {formatted.stderr or formatted.stdout}")
        for n in self.nodes:
            self._launch(n)
        for n in self.nodes:
            self._await(n)

    def _java(self, n: Node) -> list[str]:
        jars = ":".join(str(j) for j in locked_jars("kafka"))
        return [
            "java",
            "-Xmx512m",
            "-Xms512m",
            "-XX:+UseParallelGC",
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={n.home / 'log4j2.properties'}",
            "-cp",
            jars,
        ]

    def _launch(self, n: Node) -> None:
        with open(n.home / "broker.out", "a") as out:
            n.proc = subprocess.Popen(
                [*self._java(n), "kafka.Kafka", str(n.props)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _await(self, n: Node, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if n.proc is not None and n.proc.poll() is not None:
                raise RuntimeError(f"node {n.id} exited: see {n.home / 'broker.log'}")
            try:
                meta = self.admin(f"{HOST}:{n.client_port}").list_topics(timeout=2)
                if n.id in meta.brokers and len(meta.brokers) == len(self.nodes):
                    return
            except Exception:  # noqa: S110 - not answering yet
                pass
            time.sleep(0.5)
        raise RuntimeError(f"node {n.id} did not answer within {timeout:.0f} s: see {n.home / 'broker.log'}")

    def admin(self, bootstrap: str | None = None) -> AdminClient:
        conf = {"bootstrap.servers": bootstrap or self.bootstrap_servers, "logger": _QUIET}
        conf |= self.client_settings()
        return AdminClient(conf)

    def leader(self, topic: str, partition: int) -> int:
        meta = self.admin().list_topics(topic, timeout=10)
        return int(meta.topics[topic].partitions[partition].leader)

    def in_sync(self, topic: str) -> bool:
        """Every partition of ``topic`` has all 3 replicas in sync."""
        meta = self.admin().list_topics(topic, timeout=10)
        return all(len(p.isrs) == len(self.nodes) for p in meta.topics[topic].partitions.values())

    def kill(self, node_id: int) -> None:
        n = self.nodes[node_id - 1]
        assert n.proc is not None
        os.kill(n.proc.pid, signal.SIGKILL)
        n.proc.wait()

    def restart(self, node_id: int) -> float:
        """Start the node again on its data; seconds until the cluster sees it."""
        n = self.nodes[node_id - 1]
        started = time.monotonic()
        self._launch(n)
        self._await(n)
        return time.monotonic() - started

    def stop(self) -> None:
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.send_signal(signal.SIGTERM)
        for n in self.nodes:
            if n.proc is None:
                continue
            try:
                n.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait()


def _properties(n: Node, voters: str) -> str:
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={n.id}",
            f"controller.quorum.voters={voters}",
            f"listeners=CLIENT://{HOST}:{n.client_port},INTERNAL://{HOST}:{n.internal_port},"
            f"CONTROLLER://{HOST}:{n.controller_port}",
            f"advertised.listeners=CLIENT://{HOST}:{n.client_port},INTERNAL://{HOST}:{n.internal_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=INTERNAL",
            "listener.security.protocol.map=CLIENT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"sasl.enabled.mechanisms={MECHANISM}",
            f"listener.name.client.{MECHANISM.lower()}.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            f"log.dirs={n.home / 'data'}",
            "default.replication.factor=3",
            "min.insync.replicas=2",
            "offsets.topic.replication.factor=3",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=3",
            "transaction.state.log.min.isr=2",
            "transaction.state.log.num.partitions=4",
            "share.coordinator.state.topic.replication.factor=3",
            "share.coordinator.state.topic.min.isr=2",
            "unclean.leader.election.enable=false",
            *SHARED_SETTINGS,
            "",
        ]
    )
