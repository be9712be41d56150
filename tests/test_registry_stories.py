"""Schema Registry topics as a user meets them, through the CLI on a fresh lake root with the run's
embedded registry: a backfill into an Avro lookup topic, a schema change the registry refuses, a
registry that cannot be reached or refuses the credentials, the same key framed on one topic and
plain on the other, and v1 and v2 records of one topic joined."""

from __future__ import annotations

import base64
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from spark_jobs.cli import main
from spark_jobs.seams.delta import Lake

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


@pytest.fixture
def where(tmp_path):
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


def test_a_backfill_into_an_avro_lookup_writes_framed_records_and_quarantines_what_does_not_fit(
    spark, tmp_path, where, capsys
):
    dump = tmp_path / "accounts.jsonl"
    lines = [{"id": f"u{n}", "account": account(n)} for n in (1, 2)]
    lines.append({"id": "u3", "account": {"customerId": "u3"}})  # no address: the schema has no default
    dump.write_text("".join(json.dumps(line) + "\n" for line in lines))

    code, out, err = lake(capsys, where, "backfill", "accounts", "--from", str(dump), "--max-rejects", "1")
    assert code == 0, err
    assert (
        "3 lines read, 2 new keys, 0 changed, 0 unchanged, 0 superseded duplicates, 1 rejected; wrote 2"
        in out
    )
    code, out, _ = lake(capsys, where, "show", "quarantine", "--json")
    rejected = [json.loads(line) for line in out.splitlines()]
    assert [(r["line"], r["reason"]) for r in rejected] == [
        (3, f"value does not fit the Avro schema of {os.environ['LAKE_KAFKA_TOPIC_PREFIX']}accounts-value: field "
         "contactMailAddress is missing (it has no default)")
    ]  # fmt: skip
    # as any consumer with the registry's deserializer reads them: framed, with the schema's ids
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%I %i %k %s\\n")
    records = sorted(line.split(" ", 3) for line in out.splitlines())
    assert [(k, json.loads(v)) for _, _, k, v in records] == [('"u1"', account(1)), ('"u2"', account(2))]
    assert all(key_id != "-" and value_id != "-" and key_id != value_id for key_id, value_id, _, _ in records)
    # the same dump again: compared by the decoded values, nothing to write
    code, out, err = lake(capsys, where, "backfill", "accounts", "--from", str(dump), "--max-rejects", "1")
    assert code == 0, err
    assert "0 new keys, 0 changed, 2 unchanged" in out and "wrote 0 records" in out


def test_a_schema_change_the_registry_refuses_is_one_line_and_nothing_is_sent(tmp_path, where, capsys):
    line = tmp_path / "a.txt"
    line.write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "accounts", str(line), "-K", ";")[0] == 0
    incompatible = dict(ACCOUNT, fields=[{"name": "customerId", "type": "long"}])  # BACKWARD refuses it
    (tmp_path / "v2.avsc").write_text(json.dumps(incompatible))
    line.write_text('u2;{"customerId": 2}\n')
    code, out, err = lake(
        capsys,
        where,
        "produce",
        "accounts",
        str(line),
        "-K",
        ";",
        "--value-schema",
        str(tmp_path / "v2.avsc"),
    )
    assert code == 2 and out == ""
    assert (
        err.startswith("lake: error: the Schema Registry at http://127.0.0.1:")
        and "refused the avro schema for subject" in err
        and "accounts-value" in err
    )
    assert len(err.strip().splitlines()) == 1
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%k\\n")
    assert out.splitlines() == ['"u1"']


class _Guarded(BaseHTTPRequestHandler):
    """A registry behind a proxy that wants a user's basic credentials (what the product is told
    with kafka.schema_registry.basic.auth.user.info)."""

    def do_GET(self):  # noqa: N802 - the HTTP server's naming
        wanted = "Basic " + base64.b64encode(b"lake:s3cret").decode()
        if self.headers.get("Authorization") != wanted:
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error_code": 40101, "message": "Unauthorized"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"[]")

    def log_message(self, *args):
        pass


def test_a_registry_that_cannot_be_reached_or_refuses_the_credentials_is_one_line(tmp_path, where, capsys):
    server = HTTPServer(("127.0.0.1", 0), _Guarded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    guarded = f"http://127.0.0.1:{server.server_port}"
    line = tmp_path / "a.txt"
    line.write_text(f"u1;{json.dumps(account(1))}\n")
    config = Path(where[3])
    try:
        for registry, said in (
            ("http://127.0.0.1:9", "cannot list its subjects"),  # nothing listens there
            (f"{guarded}\n    basic.auth.user.info: lake:wrong", "the credentials were refused (HTTP 401"),
        ):
            config.write_text(
                PIPELINE.replace("topics:", f"kafka:\n  schema_registry:\n    url: {registry}\ntopics:", 1)
            )
            code, out, err = lake(capsys, where, "produce", "accounts", str(line), "-K", ";")
            url = registry.split()[0]
            assert (code, out) == (2, "")
            assert err.startswith(f"lake: error: Schema Registry at {url} ({config}): ") and said in err, err
            assert len(err.strip().splitlines()) == 1
    finally:
        server.shutdown()
    code, out, _ = lake(capsys, where, "consume", "accounts", "--raw", "-f", "%k\\n")
    assert out == ""  # nothing was produced


def test_a_key_framed_on_one_topic_and_plain_on_the_other_joins_as_one_key(spark, tmp_path, where, capsys):
    """events has the plain key u1, accounts the Avro-framed "u1": other bytes (a Kafka Streams join
    of the two finds nothing), the same logical key (this product joins them)."""
    (tmp_path / "events.txt").write_text('u1;{"page":"home"}\nu2;{"page":"cart"}\n')
    (tmp_path / "accounts.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "accounts.txt"), "-K", ";")[0] == 0
    code, out, _ = lake(capsys, where, "consume", "accounts", "--raw", "-f", "%K\\n")
    assert out.splitlines() == ["8"]  # 5 bytes of frame, then Avro's string: its length (a byte) and "u1"
    code, out, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err
    rows = sorted(Lake(Path(where[1])).read_arrow("events_with_mail").to_pylist(), key=lambda r: r["key"])
    assert [(r["key"], r["page"], r["mail"]) for r in rows] == [
        (b"u1", "home", "u1@example.com"),
        (b"u2", "cart", None),
    ]
    code, out, err = lake(capsys, where, "audit", "events_with_mail")
    assert code == 0 and out.endswith(": identical\n"), out + err


def test_records_of_two_schema_versions_in_one_topic_are_both_joined(spark, tmp_path, where, capsys):
    (tmp_path / "events.txt").write_text('u1;{"page":"home"}\nu2;{"page":"cart"}\n')
    assert lake(capsys, where, "produce", "events", str(tmp_path / "events.txt"), "-K", ";")[0] == 0
    (tmp_path / "a.txt").write_text(f"u1;{json.dumps(account(1))}\n")
    assert lake(capsys, where, "produce", "accounts", str(tmp_path / "a.txt"), "-K", ";")[0] == 0
    code, _, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err
    v2 = dict(ACCOUNT, fields=[*ACCOUNT["fields"], {"name": "tier", "type": "string", "default": "basic"}])
    (tmp_path / "v2.avsc").write_text(json.dumps(v2))
    (tmp_path / "a.txt").write_text(f"u2;{json.dumps(dict(account(2), tier='gold'))}\n")
    code, _, err = lake(
        capsys,
        where,
        "produce",
        "accounts",
        str(tmp_path / "a.txt"),
        "-K",
        ";",
        "--value-schema",
        str(tmp_path / "v2.avsc"),
    )
    assert code == 0, err
    code, out, _ = lake(capsys, where, "consume", "accounts", "-f", "%i %s\\n")
    ids = sorted({line.split(" ", 1)[0] for line in out.splitlines()})
    assert len(ids) == 2  # a v1 record and a v2 record
    code, out, err = lake(capsys, where, "run", "events_with_mail", "--once")
    assert code == 0, err
    rows = sorted(Lake(Path(where[1])).read_arrow("events_with_mail").to_pylist(), key=lambda r: r["key"])
    assert [(r["key"], r["mail"]) for r in rows] == [(b"u1", "u1@example.com"), (b"u2", "u2@example.com")]
