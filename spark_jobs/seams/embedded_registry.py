"""The embedded Schema Registry: ``lake registry start | stop | status | log``, a
:class:`~spark_jobs.seams.processes.Service`.

A real, Confluent-compatible registry for the first look and the tests, as the embedded broker is a
real Kafka: Apicurio Registry's prebuilt application (from its locked archive,
:func:`spark_jobs.seams.jvm.registry_app`) in its own JVM, on loopback only, serving Confluent's API
under ``/apis/ccompat/v7`` (what every registry client of the product speaks). Its files live under
``<root>/_registry/``:

- ``data/``: its storage, an H2 database file, so the schemas outlive a restart, a ``kill -9`` and
  ``lake down`` (the records on the topics keep their schema ids): each registration is written to the
  file before the registry answers it (see ``H2_SETTINGS``);
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_jobs.seams.jvm import registry_app
from spark_jobs.seams.processes import HOST, Launched, Service, spawn

DEFAULT_PORT = 8081  # Confluent's
API = "/apis/ccompat/v7"  # Apicurio's Confluent-compatible API
START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 30
HEAP = os.environ.get("LAKE_REGISTRY_HEAP", "384m")
COMPATIBILITY = "BACKWARD"
# The registry's H2 database (2.3.230, the one Apicurio 2.6.13 ships) with its file compaction off and
# every commit written at once. H2 2.3.230 compacts the file when it closes (and in the background
# when the file is fragmented), and its compaction frees a moved chunk's old place before the move is
# recorded (fixed upstream in 2.3.232, "do not free file space prematurely"): after a few registrations
# minutes apart, a clean stop left a file whose newest readable chunk was the one written at start, and
# every subject, version and id registered since was gone (the demo's schemas, a second `make demo`).
# Without compaction the file keeps the space of old chunks it has not reused (a registry's few
# kilobytes of schemas); WRITE_DELAY=0 writes each commit to the file before the registry answers, so
# a kill -9 loses no schema it had acknowledged (H2's default writes them within half a second).
H2_SETTINGS = ";WRITE_DELAY=0;MAX_COMPACT_TIME=0;AUTO_COMPACT_FILL_RATE=0"


class Registry(Service):
    """The embedded Schema Registry of a lake root (its files under ``<root>/_registry/``)."""

    name = "registry"
    title = "embedded Schema Registry"
    address_key = "url"
    default_port = DEFAULT_PORT
    port_env = "LAKE_REGISTRY_PORT"
    start_timeout = START_TIMEOUT_S
    stop_timeout = STOP_TIMEOUT_S

    @property
    def state_file(self) -> Path:
        return self.layout.registry_state

    @property
    def log_file(self) -> Path:
        return self.layout.registry_log

    def launch(self, port: int, log: Callable[[str], None], **_: Any) -> Launched:
        app = registry_app()
        data = self.layout.registry_data
        data.mkdir(parents=True, exist_ok=True)
        url = f"http://{HOST}:{port}{API}"
        java = [
            "java",
            f"-Xmx{HEAP}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",  # a small service: C1 starts it faster and keeps it small
            f"-Dquarkus.http.host={HOST}",
            f"-Dquarkus.http.port={port}",
            f"-Dquarkus.datasource.jdbc.url=jdbc:h2:file:{data / 'registry'}{H2_SETTINGS}",
            "-Dquarkus.log.level=WARN",
            "-jar",
            str(app),
        ]
        log(f"starting the embedded Schema Registry on {HOST}:{port} (data {data}) ...")
        proc = spawn(java, self.log_file, cwd=data)  # data: where Quarkus may write files of its own
        return Launched(proc, lambda: _answers(url), url, {"url": url, "data_dir": str(data)})

    def ready(self, launched: Launched) -> None:
        """Confluent's default compatibility, BACKWARD (Apicurio's global rule is NONE)."""
        _request(launched.where + "/config", "PUT", {"compatibility": COMPATIBILITY})


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
