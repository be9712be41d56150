"""The Avro accounts pipeline of the Schema Registry stories, the CLI as a test calls it, and a proxy
that takes the run's registry away and brings it back."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from spark_jobs.cli import main

ACCOUNT = {
    "type": "record",
    "name": "Account",
    "fields": [{"name": "customerId", "type": "string"}, {"name": "contactMailAddress", "type": "string"}],
}
PIPELINE = """\
pipeline: avro_accounts
topics:
  events: {partitions: 4, key: string, value: json}
  accounts: {partitions: 4, key: {format: avro, schema: key.avsc}, value: {format: avro, schema: account.avsc}}
lookups:
  accounts:
    topic: accounts
    joined_with: [events]
    backfill:
      format: jsonl
      key_field: id
      value_field: account
      value_format: json
joins:
  events_with_mail:
    kind: table
    left: events
    right: accounts
    type: left
    select:
      page: left.page
      mail: right.contactMailAddress
"""


def pipeline_in(tmp_path) -> list[str]:
    """The arguments naming a fresh lake root and the Avro accounts pipeline (its schema files beside it)."""
    (tmp_path / "account.avsc").write_text(json.dumps(ACCOUNT))
    (tmp_path / "key.avsc").write_text('"string"')
    (tmp_path / "p.yaml").write_text(PIPELINE)
    return ["--root", str(tmp_path / "lake"), "--config", str(tmp_path / "p.yaml")]


def lake(capsys, where, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([*args, *where])
    out, err = capsys.readouterr()
    return code, out, err


def account(n: int) -> dict:
    return {"customerId": f"u{n}", "contactMailAddress": f"u{n}@example.com"}


def publishing(fmt: str) -> str:
    """The pipeline with events_with_mail's changelog published in ``fmt``."""
    return PIPELINE.replace(
        "      mail: right.contactMailAddress\n",
        f"      mail: right.contactMailAddress\n    publish: {{format: {fmt}}}\n",
    )


class Forward(BaseHTTPRequestHandler):
    """A proxy in front of the run's registry, so that a test can take the registry away and bring it
    back under a running job (its port closed in between: connections refused), put it behind basic
    credentials (``Switch.credentials``: a request without them gets Confluent's 401) and behind TLS
    (``Switch(tls=...)``)."""

    target = ""

    def _forward(self) -> None:
        import urllib.error
        import urllib.request

        wanted = self.server.credentials  # type: ignore[attr-defined]
        if wanted is not None and self.headers.get("Authorization") != basic(wanted):
            payload = b'{"error_code": 40101, "message": "Unauthorized"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
        request = urllib.request.Request(self.target + self.path, body, headers, method=self.command)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                code, payload, kind = answer.status, answer.read(), answer.headers.get("Content-Type")
        except urllib.error.HTTPError as exc:
            code, payload, kind = exc.code, exc.read(), exc.headers.get("Content-Type")
        self.send_response(code)
        self.send_header("Content-Type", kind or "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, *args) -> None:
        pass


def basic(user_info: str) -> str:
    return "Basic " + base64.b64encode(user_info.encode()).decode()


class Switch:
    """The proxy, on or off, always on the same port; ``tls``: the paths of its certificate and key
    (it speaks HTTPS); ``credentials``: the ``user:password`` it wants (None: any request)."""

    def __init__(self, target: str, tls: tuple[Path, Path] | None = None, credentials: str | None = None):
        Forward.target = target.split("/apis/")[0]
        self.path = "/apis/" + target.split("/apis/", 1)[1] if "/apis/" in target else ""
        self.tls, self.credentials = tls, credentials
        self.server: ThreadingHTTPServer | None = None
        self.port = 0
        self.on()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{self.path}"

    def on(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Forward)
        self.server.credentials = self.credentials  # type: ignore[attr-defined]
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def want(self, credentials: str | None) -> None:
        """From now on, want these credentials."""
        self.credentials = credentials
        if self.server is not None:
            self.server.credentials = credentials  # type: ignore[attr-defined]

    def off(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def self_signed(folder: Path, name: str = "registry") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, as PEM files in ``folder``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"lake test {name}")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def committed(topic: str, partitions: int = 4) -> list[tuple[bytes, bytes | None]]:
    """The committed records of ``topic`` on the run's broker (key, value), partition by partition."""
    import os

    from confluent_kafka import Consumer, TopicPartition

    settings = {"bootstrap.servers": os.environ["LAKE_KAFKA_BOOTSTRAP"], "group.id": "t"}
    consumer = Consumer({**settings, "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        records = []
        while (message := consumer.poll(5)) is not None:
            records.append((message.key(), message.value()))
        return records
    finally:
        consumer.close()


class Running:
    """``lake run events_with_mail --continuous`` as a process of its own, and its result's mails."""

    def __init__(self, where: list[str]):
        import os
        import subprocess
        import sys

        from spark_jobs.seams.delta import Lake

        self.root = Lake(Path(where[1]))
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "lake"), "run", "events_with_mail", "--continuous"]
            + ["--trigger", "0.5", *where],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, LAKE_SPARK_UI="false"),
        )

    def mails(self) -> list[tuple[bytes, str | None]]:
        """The result's (key, mail) rows, sorted (none before the table is written)."""
        try:
            rows = self.root.read_arrow("events_with_mail").to_pylist()
        except Exception:  # noqa: BLE001 - not written yet
            return []
        return sorted((r["key"], r["mail"]) for r in rows)

    def until(self, predicate, seconds: float) -> None:
        """Wait until ``predicate()`` holds; the job ending first, or ``seconds`` passing, fails."""
        import time

        deadline = time.monotonic() + seconds
        while not predicate():
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended: {self.proc.stderr.read()[-2000:]}")
            assert time.monotonic() < deadline, f"waited {seconds} s; result: {self.mails()}"
            time.sleep(0.3)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
