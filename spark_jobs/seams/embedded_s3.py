"""The embedded S3-compatible store: ``lake s3 start | stop | status``.

A real S3 API for the first look at a lake on object storage and for the tests, as the embedded
broker is a real Kafka: S3Proxy (its locked jars, :func:`spark_jobs.seams.jvm.locked_jars` ``s3``)
with its filesystem backend, in its own JVM, on loopback only, answering AWS signature v2 and v4
requests for one access key. Its files live under ``<work>/_s3/`` (the lake's local work folder):

- ``data/<bucket>/<key>``: the objects, as files;
- ``s3.properties``, ``logback.xml``: its settings, written at each start;
- ``s3.log``: its own log (warnings and errors only);
- ``s3.json``: pid, ``endpoint``, access key and secret while it runs (what other commands read:
  :mod:`spark_jobs.seams.storage` uses them when neither the pipeline nor ``AWS_*`` names a store).
  The file is readable by its owner only.

``start`` creates the bucket of an ``s3a://`` lake root and returns once the store answers (about
2.5 s); ``stop`` sends SIGTERM and waits.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spark_jobs.errors import UserError
from spark_jobs.layout import Layout
from spark_jobs.seams.jvm import locked_jars
from spark_jobs.seams.processes import (
    HOST,
    await_answer,
    check_port,
    read_state,
    spawn,
    stop_service,
    write_state,
)

DEFAULT_PORT = 9000  # MinIO's, which users' local set-ups often take: --port or LAKE_S3_PORT to move it
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20
HEAP = os.environ.get("LAKE_S3_HEAP", "256m")
ACCESS_KEY = "lake"
REGION = "us-east-1"  # S3Proxy signs and checks with any region; the clients need one

_LOGBACK = """<configuration>
  <appender name="out" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{ISO8601} %level %logger{30} %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="out"/></root>
</configuration>
"""


@dataclass(frozen=True)
class S3Status:
    running: bool
    endpoint: str | None = None
    pid: int | None = None
    started_at: str | None = None
    data_dir: str | None = None
    log: str | None = None
    access_key: str | None = None
    secret_key: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """What ``lake s3 status --json`` prints: everything but the secret."""
        return {k: v for k, v in self.__dict__.items() if k != "secret_key"}

    def text(self) -> str:
        if not self.running:
            return "embedded S3 store: not running"
        return (
            f"embedded S3 store: running at {self.endpoint} (pid {self.pid}, since {self.started_at}); "
            f"data {self.data_dir}, log {self.log}"
        )


def status(work: Path) -> S3Status:
    """The store's state from ``s3.json``; a file left by a dead store reads as not running."""
    info = read_state(Layout(work).s3_state)
    if info is None:
        return S3Status(False)
    return S3Status(
        True,
        info["endpoint"],
        int(info["pid"]),
        info.get("started_at"),
        info.get("data_dir"),
        info.get("log"),
        info.get("access_key"),
        info.get("secret_key"),
    )


BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def start(
    work: Path, port: int = DEFAULT_PORT, buckets: tuple[str, ...] = (), log=lambda _: None
) -> S3Status:
    """Start the store unless it runs, with ``buckets`` created; returns once it answers. A bucket
    name S3 would refuse is refused first, before anything starts."""
    for bucket in buckets:
        if not BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
            raise UserError(
                f"bucket name {bucket!r}: S3 takes 3-63 lower-case letters, digits, dots and hyphens, "
                "starting and ending with a letter or digit"
            )
    current = status(work)
    if not current.running:
        current = _launch(work, port, log)
    for bucket in buckets:
        create_bucket(current, bucket)
    return current


def _launch(work: Path, port: int, log) -> S3Status:
    check_port(port, "--port")
    jars = locked_jars("s3")
    layout = Layout(work)
    try:
        layout.s3_data.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"cannot create the embedded S3 store's folder {layout.s3_data}: {e.strerror}"
        ) from None
    endpoint = f"http://{HOST}:{port}"
    secret = secrets.token_hex(16)
    layout.s3_properties.write_text(
        "\n".join(
            [
                f"s3proxy.endpoint={endpoint}",
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={ACCESS_KEY}",
                f"s3proxy.credential={secret}",
                "jclouds.provider=filesystem",
                f"jclouds.filesystem.basedir={layout.s3_data}",
                "",
            ]
        )
    )
    layout.s3_properties.chmod(0o600)
    layout.s3_log_config.write_text(_LOGBACK)
    java = [
        "java",
        f"-Xmx{HEAP}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",  # a small service: C1 starts it faster and keeps it small
        f"-Dlogback.configurationFile={layout.s3_log_config}",
        "-cp",
        os.pathsep.join(str(j) for j in jars),
        "org.gaul.s3proxy.Main",
        "--properties",
        str(layout.s3_properties),
    ]
    log(f"starting the embedded S3 store on {endpoint} (data {layout.s3_data}) ...")
    proc = spawn(java, layout.s3_log, cwd=layout.s3)
    await_answer(
        proc, lambda: _answers(endpoint), "the embedded S3 store", endpoint, [layout.s3_log], START_TIMEOUT_S
    )
    write_state(
        layout.s3_state,
        {
            "pid": proc.pid,
            "port": port,
            "endpoint": endpoint,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "data_dir": str(layout.s3_data),
            "log": str(layout.s3_log),
            "access_key": ACCESS_KEY,
            "secret_key": secret,
        },
        private=True,
    )
    return status(work)


def stop(work: Path, log=lambda _: None) -> bool:
    """Stop the store (SIGTERM, then SIGKILL after 20 s); False when it was not running."""
    return stop_service(Layout(work).s3_state, "the embedded S3 store", STOP_TIMEOUT_S, log)


def create_bucket(store: S3Status, bucket: str) -> None:
    """Create ``bucket`` in the running store unless it exists."""
    from pyarrow import fs

    s3 = fs.S3FileSystem(
        access_key=store.access_key,
        secret_key=store.secret_key,
        endpoint_override=store.endpoint,
        region=REGION,
        allow_bucket_creation=True,
    )
    try:
        s3.create_dir(bucket)
    except OSError as e:
        raise UserError(
            f"the embedded S3 store at {store.endpoint} could not create bucket {bucket}: {e}"
        ) from None


def _answers(endpoint: str) -> bool:
    """Any HTTP answer (an anonymous request is refused with 403) means the store listens."""
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(endpoint + "/", timeout=2)  # noqa: S310 - loopback, our own URL
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
