"""The embedded Schema Registry: ``lake registry start | stop | status``.

A real, Confluent-compatible registry for the first look and the tests, as the embedded broker is a
real Kafka: Apicurio Registry's prebuilt application (from its locked archive,
:func:`spark_jobs.seams.jvm.registry_app`) in its own JVM, on loopback only, serving Confluent's API
under ``/apis/ccompat/v7`` (what every registry client of the product speaks). Its files live under
``<root>/_registry/``:

- ``data/``: its storage, an H2 database file, so the schemas outlive a restart (the records on the
  topics keep their schema ids);
- ``registry.log``: its own log;
- ``registry.json``: pid, port and ``url`` while it runs (what other commands read).

Apicurio's global compatibility rule is NONE; Confluent's default is BACKWARD, which every start sets,
so a schema change the embedded registry accepts is one a Confluent registry would accept too.
``start`` returns once the registry answers (about 8 s), ``stop`` sends SIGTERM and waits.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_jobs.layout import Layout
from spark_jobs.seams.jvm import registry_app
from spark_jobs.seams.processes import (
    HOST,
    await_answer,
    check_port,
    read_state,
    spawn,
    stop_service,
    write_state,
)
from spark_jobs.seams.storage import Root

DEFAULT_PORT = 8081  # Confluent's
API = "/apis/ccompat/v7"  # Apicurio's Confluent-compatible API
START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 30
HEAP = os.environ.get("LAKE_REGISTRY_HEAP", "384m")
COMPATIBILITY = "BACKWARD"


@dataclass(frozen=True)
class RegistryStatus:
    running: bool
    url: str | None = None
    pid: int | None = None
    started_at: str | None = None
    data_dir: str | None = None
    log: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def text(self) -> str:
        if not self.running:
            return "embedded Schema Registry: not running"
        return (
            f"embedded Schema Registry: running at {self.url} (pid {self.pid}, since {self.started_at}); "
            f"data {self.data_dir}, log {self.log}"
        )


def status(root: Root | Path) -> RegistryStatus:
    """The registry's state from ``registry.json``; a file left by a dead registry reads as not running."""
    info = read_state(Layout(root).registry_state)
    if info is None:
        return RegistryStatus(False)
    return RegistryStatus(
        True, info["url"], int(info["pid"]), info.get("started_at"), info.get("data_dir"), info.get("log")
    )


def start(root: Root | Path, port: int = DEFAULT_PORT, log=lambda _: None) -> RegistryStatus:
    """Start the registry unless it runs; returns once it answers, its compatibility set to BACKWARD."""
    current = status(root)
    if current.running:
        return current
    check_port(port, "--port")
    app = registry_app()
    layout = Layout(root)
    data = layout.registry_data
    data.mkdir(parents=True, exist_ok=True)
    url = f"http://{HOST}:{port}{API}"
    java = [
        "java",
        f"-Xmx{HEAP}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",  # a small service: C1 starts it faster and keeps it small
        f"-Dquarkus.http.host={HOST}",
        f"-Dquarkus.http.port={port}",
        f"-Dquarkus.datasource.jdbc.url=jdbc:h2:file:{data / 'registry'}",
        "-Dquarkus.log.level=WARN",
        "-jar",
        str(app),
    ]
    log(f"starting the embedded Schema Registry on {HOST}:{port} (data {data}) ...")
    proc = spawn(java, layout.registry_log, cwd=data)  # data: where Quarkus may write files of its own
    await_answer(
        proc,
        lambda: _answers(url),
        "the embedded Schema Registry",
        url,
        [layout.registry_log],
        START_TIMEOUT_S,
    )
    _request(url + "/config", "PUT", {"compatibility": COMPATIBILITY})
    write_state(
        layout.registry_state,
        {
            "pid": proc.pid,
            "port": port,
            "url": url,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "data_dir": str(data),
            "log": str(layout.registry_log),
        },
    )
    return status(root)


def stop(root: Root | Path, log=lambda _: None) -> bool:
    """Stop the registry (SIGTERM, then SIGKILL after 30 s); False when it was not running."""
    return stop_service(Layout(root).registry_state, "the embedded Schema Registry", STOP_TIMEOUT_S, log)


def _answers(url: str) -> bool:
    try:
        _request(url + "/subjects")
        return True
    except (OSError, ValueError):
        return False


def _request(url: str, method: str = "GET", body: dict | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/vnd.schemaregistry.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - loopback, our own URL
        return json.loads(response.read() or b"null")
