"""The Kafka Streams peer (``tests/bench/peer``, built by ``infra/setup.sh`` into
``build/peer/lake-peer.jar``): run it beside the product on the same topics, read its output topic,
and compare final results per key with the product's (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from decimal import Decimal
from pathlib import Path

from spark_jobs.config import TopicSpec
from spark_jobs.join_kinds import KINDS
from spark_jobs.seams.delta import Lake
from spark_jobs.seams.kafka import Cluster, read

REPO = Path(__file__).resolve().parents[1]
PEER_JAR = REPO / "build" / "peer" / "lake-peer.jar"
PEER_LIBS = REPO / ".jvm" / "streams"


class Peer:
    """One Kafka Streams application of the peer, as a child process (``with Peer(...) as peer``).
    Entering waits until it runs; leaving closes it (SIGTERM: Kafka Streams' clean close)."""

    def __init__(
        self,
        topology: str,
        cluster: Cluster,
        left: str,
        right: str,
        out: str,
        workdir: Path,
        threads: int = 2,
        commit_ms: int = 100,
        heap: str = "2g",
    ):
        assert PEER_JAR.is_file(), f"{PEER_JAR} is missing: run infra/setup.sh (make setup)"
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        name = f"peer-{topology}-{os.getpid()}-{time.monotonic_ns()}"
        self.app_id = name  # its consumer group: where Kafka's tools see its position
        java = {k.removeprefix("kafka."): v for k, v in cluster.spark_options().items()}  # Java names
        java.pop("bootstrap.servers")
        java.pop("fetch.max.wait.ms")  # Spark's read of a known range; the peer keeps Kafka's default
        settings = [a for k, v in java.items() for a in ("-X", f"{k}={v}")]
        self.cmd = [
            shutil.which("java") or "java",
            f"-Xmx{heap}",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            f"{PEER_JAR}{os.pathsep}{PEER_LIBS}/*",
            "lake.peer.Peer",
            "--topology", topology,
            "--bootstrap", cluster.bootstrap_servers,
            "--app-id", name,
            "--left", cluster.topic(left),
            "--right", cluster.topic(right),
            "--out", cluster.topic(out),
            "--threads", str(threads),
            "--commit-ms", str(commit_ms),
            "--state-dir", str(workdir / "state"),
            *settings,
        ]  # fmt: skip
        self.proc: subprocess.Popen | None = None
        self.log = workdir / f"{topology}.log"

    def __enter__(self) -> Peer:
        self.started = time.monotonic()
        log = self.log.open("w")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        running = threading.Event()

        def watch() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.strip() == "peer: RUNNING":
                    running.set()

        threading.Thread(target=watch, daemon=True).start()
        deadline = time.monotonic() + 180
        while not running.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise AssertionError(f"the peer did not start; its log: {self.log.read_text()[-3000:]}")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def usage(self) -> tuple[float, int]:
        """(CPU seconds so far, peak resident bytes) of the peer's JVM."""
        assert self.proc is not None
        return process_usage(self.proc.pid)


def process_usage(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    peak = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
    return cpu, peak


def tree_usage(pids: list[int]) -> tuple[float, int]:
    """(CPU seconds, summed peak resident bytes) of live processes and all their descendants."""
    todo, seen = list(pids), set()
    cpu, peak = 0.0, 0
    while todo:
        pid = todo.pop()
        if pid in seen or not Path(f"/proc/{pid}").exists():
            continue
        seen.add(pid)
        c, m = process_usage(pid)
        cpu, peak = cpu + c, peak + m
        for task in Path(f"/proc/{pid}/task").iterdir():
            children = (task / "children").read_text().split()
            todo += [int(c) for c in children]
    return cpu, peak


def clean(value):
    """A result value as both systems mean it: null fields left out, numbers as Decimal."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, float):
        return Decimal(str(value))
    return value


def topic_results(cluster: Cluster, spec: TopicSpec) -> dict[str, dict]:
    """The latest value per key of a JSON topic (a tombstone deletes the key), read committed."""
    out: dict[str, dict] = {}
    for batch in read(cluster, spec):
        for message in batch:
            key, value = message.key().decode(), message.value()
            if value is None:
                out.pop(key, None)
            else:
                out[key] = clean(json.loads(value, parse_float=Decimal))
    return out


def table_results(lake: Lake, table: str) -> dict[str, dict]:
    """A join's result table keyed like the topics: its select columns (all but its meta columns:
    key, timestamp, provenance), as a dict."""
    if not lake.exists(table):
        return {}
    rows = lake.read_arrow(table).to_pylist()
    meta = {c for kind in KINDS.values() for c in kind.meta_columns}
    return {r["key"].decode(): clean({c: v for c, v in r.items() if c not in meta}) for r in rows}


def differences(ours: dict[str, dict], peer: dict[str, dict], limit: int = 5) -> list[str]:
    """The first keys whose final results differ, in words; empty when equal."""
    keys = sorted(set(ours) | set(peer))
    out = [
        f"{k}: product {ours.get(k, '(no row)')} / peer {peer.get(k, '(no row)')}"
        for k in keys
        if ours.get(k) != peer.get(k)
    ]
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


def wait_equal(ours, peer_results, timeout: float) -> list[str]:
    """Poll the peer's output until it equals ``ours`` (a dict) or ``timeout`` passes; returns the
    differences left (empty: equal)."""
    deadline = time.monotonic() + timeout
    while True:
        diff = differences(ours, peer_results())
        if not diff or time.monotonic() > deadline:
            return diff
        time.sleep(0.5)
