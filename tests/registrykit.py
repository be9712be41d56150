"""The Avro accounts pipeline of the Schema Registry stories, the CLI as a test calls it, and a proxy
that takes the run's registry away and brings it back."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
    back under a running job (its port closed in between: connections refused)."""

    target = ""

    def _forward(self) -> None:
        import urllib.error
        import urllib.request

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


class Switch:
    """The proxy, on or off, always on the same port."""

    def __init__(self, target: str):
        Forward.target = target.split("/apis/")[0]
        self.path = "/apis/" + target.split("/apis/", 1)[1] if "/apis/" in target else ""
        self.server: ThreadingHTTPServer | None = None
        self.port = 0
        self.on()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def on(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Forward)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def off(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
