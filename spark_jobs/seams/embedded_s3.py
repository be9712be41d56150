"""The embedded S3-compatible store: ``lake s3 start | stop | status | log``, a
:class:`~spark_jobs.seams.processes.Service`.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_jobs.errors import UserError
from spark_jobs.seams.jvm import locked_jars
from spark_jobs.seams.processes import HOST, Launched, Service, ServiceStatus, spawn

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


BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class S3Store(Service):
    """The embedded S3 store of a lake's work folder (its files under ``<work>/_s3/``)."""

    name = "s3"
    title = "embedded S3 store"
    address_key = "endpoint"
    default_port = DEFAULT_PORT
    port_env = "LAKE_S3_PORT"
    start_timeout = START_TIMEOUT_S
    stop_timeout = STOP_TIMEOUT_S
    secrets = ("secret_key",)

    @property
    def state_file(self) -> Path:
        return self.layout.s3_state

    @property
    def log_file(self) -> Path:
        return self.layout.s3_log

    def start(
        self,
        port: int | None = None,
        log: Callable[[str], None] = lambda _: None,
        flag: str = "--port",
        buckets: tuple[str, ...] = (),
        **options: Any,
    ) -> ServiceStatus:
        """Start the store unless it runs, with ``buckets`` created; returns once it answers. A bucket
        name S3 would refuse is refused first, before anything starts."""
        for bucket in buckets:
            if not BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
                raise UserError(
                    f"bucket name {bucket!r}: S3 takes 3-63 lower-case letters, digits, dots and hyphens, "
                    "starting and ending with a letter or digit"
                )
        current = super().start(port, log, flag, **options)
        for bucket in buckets:
            create_bucket(current, bucket)
        return current

    def launch(self, port: int, log: Callable[[str], None], **_: Any) -> Launched:
        jars = locked_jars("s3")
        layout = self.layout
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
        proc = spawn(java, self.log_file, cwd=layout.s3)
        state = {
            "endpoint": endpoint,
            "data_dir": str(layout.s3_data),
            "access_key": ACCESS_KEY,
            "secret_key": secret,
        }
        return Launched(proc, lambda: _answers(endpoint), endpoint, state)


def create_bucket(store: ServiceStatus, bucket: str) -> None:
    """Create ``bucket`` in the running store unless it exists."""
    from pyarrow import fs

    s3 = fs.S3FileSystem(
        access_key=store.details["access_key"],
        secret_key=store.details["secret_key"],
        endpoint_override=store.address,
        region=REGION,
        allow_bucket_creation=True,
    )
    try:
        s3.create_dir(bucket)
    except OSError as e:
        raise UserError(
            f"the embedded S3 store at {store.address} could not create bucket {bucket}: {e}"
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
